//! The engine's integration tests, one binary of one module per subject: the
//! shared helpers (`common`) and the engine's generic code are built and linked
//! once, and the subjects' tests share the test threads.
#![allow(clippy::unwrap_used)]

mod common;

mod array;
mod basic;
mod corruption;
mod direct;
mod dual;
mod faults;
mod golden;
mod handoff;
mod lending;
mod lending_chunks;
mod limits;
mod model;
mod recovery;
mod robustness;
mod tiers;
mod units;
