//! `shale serve`: the daemon that runs one engine and exports its volumes.
//!
//! - [`config`]: the TOML configuration file and its defaults; every flag of
//!   `shale serve` maps onto a field here, so the file can say everything the flags can.
#![forbid(unsafe_code)]

pub mod config;
