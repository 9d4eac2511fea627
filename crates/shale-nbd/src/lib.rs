//! Shale's NBD front-end, as a library that knows nothing of the engine.
//!
//! - [`proto`]: the protocol as pure functions over bytes (fuzzed).
//! - [`backend`]: the small asynchronous seam the engine plugs into.
//! - [`mem`]: [`MemBackend`], an in-memory reference backend.
//! - [`server`]: listeners, handshake and pipelined transmission over std
//!   threads and blocking sockets.
//!
//! See `docs/nbd.md` for what is supported and how to connect clients.

#![forbid(unsafe_code)]

pub mod backend;
pub mod fuzzing;
pub mod mem;
pub mod proto;
pub mod server;

pub use backend::{
    Backend, BackendError, BackendReply, BackendRequest, BlockSizes, Completion, ExportCaps,
    ExportId, ExportInfo,
};
pub use mem::{MemBackend, MemBackendConfig, MemExportSpec};
pub use proto::negotiate::TlsMode;
pub use server::{
    bind_unix, ExportAccess, Server, ServerConfig, ServerError, ServerHandle, ServerLimits,
    TlsSettings,
};
