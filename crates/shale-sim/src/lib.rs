//! Shale's crash simulator.
//!
//! A deterministic, single-threaded simulation: the engine runs over fault-injecting
//! devices (a [`shale_device::FaultDevice`] as the cache, zone emulation over another
//! as the capacity) on one power rail, under a seeded workload over several volumes,
//! with tiny chunks and zones so compaction and GC never stop. At a crash point chosen
//! per cycle, biased toward compaction, GC, metadata writes, region closes and clean
//! shutdowns, the power is cut, the devices lose, keep or tear their unflushed writes,
//! the engine is reopened on what is left, and every block of every volume is checked
//! against a model of what may legally be read. Then the workload carries on with the
//! recovered engine, for several generations. A seed replays a run exactly. With
//! `SimConfig::shards` above 1 the engine is a pool of shards stepped on the same
//! thread, each with devices of its own on the one rail.
//!
//! - `power`: the power rail ([`PowerRail`], [`Powered`]) and crash triggers (from
//!   `shale-testkit`, shared with the engine's crash tests).
//! - `model`: the oracle ([`Model`]).
//! - `workload`: the seeded request generator.
//! - `plan`: crash points and crash modes, and their bias.
//! - `sim`: the run loop ([`run`], [`SimConfig`], [`Mode`]).
//! - `report`: outcomes, violations, the trace hash.
//! - `array_sim`: device loss as a fault: a mirrored cache and a 4+2 capacity array,
//!   members lost, failing, missing or returning garbage, replaced and rebuilt, with
//!   power cuts throughout ([`array_sim::run`]).
//!
//! docs/crash-simulator.md describes the oracle's rules and how to replay a seed.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod array_sim;
pub mod model;
pub mod plan;
pub use shale_testkit::power;
pub mod report;
pub mod sim;
pub mod workload;

pub use model::{Mismatch, Model};
pub use power::{PowerRail, Powered, Side};
pub use report::{Counts, RunReport, Trace, Violation, ViolationKind};
pub use sim::{run, Geometry, Mode, SimConfig};
