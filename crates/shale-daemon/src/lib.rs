//! `shale serve`: the daemon that runs one engine and exports its volumes.
//!
//! - [`admin`]: the admin unix socket (JSON lines) used by `shale volume` and `shale stats`.
//! - [`config`]: the TOML configuration file and its defaults; every flag of
//!   `shale serve` maps onto a field here, so the file can say everything the flags can.
#![forbid(unsafe_code)]

pub mod admin;
pub mod config;
pub mod metrics;
