//! Shale's NBD front-end.
//!
//! - [`proto`]: the protocol as pure functions over bytes (fuzzed).
//!
//! The crate does not depend on the engine: the engine plugs in later through
//! the backend trait.

#![forbid(unsafe_code)]

pub mod proto;
