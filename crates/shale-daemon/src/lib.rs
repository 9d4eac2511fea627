//! `shale serve`: the daemon that runs one engine and exports its volumes.
//!
//! - [`config`]: the TOML configuration file and its defaults; every flag of
//!   `shale serve` maps onto a field here, so the file can say everything the flags can.
//! - [`serve`]: open or create the devices, start the engine thread and the listeners,
//!   stop cleanly.
//! - [`backend`]: every volume as an NBD export, requests into the engine's queue.
//! - [`admin`]: the admin unix socket (JSON lines) used by `shale volume` and `shale stats`.
//! - [`handler`]: admin requests and metrics answered from the engine.
//! - [`devices`]: `shale device list|fail|replace` over the arrays' handles.
//! - [`drive`]: the simulated capacity drive's counters (`--drive`), for both.
//! - [`metrics`]: the Prometheus text endpoint.
//! - [`latency`]: per-volume request latency histograms.
//! - [`notify`]: the systemd readiness protocol (`READY=1`, `STOPPING=1`, watchdog).
#![forbid(unsafe_code)]

pub mod admin;
pub mod backend;
mod cold;
pub mod config;
pub mod devices;
pub mod drive;
pub mod fuzzing;
pub mod handler;
pub mod handoff;
pub mod latency;
pub mod metrics;
pub mod notify;
pub mod serve;
pub mod vhost;
