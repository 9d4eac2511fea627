//! Shale's vhost-user-blk back-end, as a library that knows nothing of the engine.
//!
//! A VM's virtio-blk disk served from user space over a unix socket: QEMU or
//! cloud-hypervisor maps the guest's memory into this process and hands over
//! the virtqueues; this crate turns descriptor chains into requests for one
//! [`BlockTarget`] and completes them asynchronously, so a queue's thread never
//! waits for the target.
//!
//! - [`target`]: the seam ([`BlockTarget`], [`TargetRequest`]) the engine plugs into.
//! - [`mem_target`]: [`MemTarget`], an in-memory reference target.
//! - [`request`]: virtio-blk request parsing, pure and fuzzed.
//! - [`config`]: options, feature bits and the config space.
//! - [`backend`]: the device ([`BlkBackend`]): vring threads, completions, used rings.
//! - [`serve`](mod@serve): the accept loop, one frontend at a time, reconnects, stop.
//! - [`fuzzing`]: the entry point the fuzz target and the stand-in test share.

#![forbid(unsafe_code)]

pub mod backend;
pub mod config;
pub mod fuzzing;
pub mod mem_target;
pub mod request;
pub mod serve;
pub mod target;

pub use backend::BlkBackend;
pub use config::{OptionsError, VhostOptions};
pub use mem_target::{MemTarget, MemTargetStats};
pub use serve::{serve, ServeError, ServeHandle, Stopper};
pub use target::{BlockTarget, TargetDone, TargetError, TargetReply, TargetRequest};
