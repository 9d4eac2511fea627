//! The seam between the NBD front-end and whatever stores the bytes.
//!
//! The server calls [`Backend::submit`] from a connection's reader thread and
//! must never be blocked by it: a backend queues the request and calls the
//! [`Completion`] later, from any thread. The completion may be called after
//! the client has gone; its reply then goes nowhere.

use crate::proto::consts::{
    NBD_EINVAL, NBD_EIO, NBD_ENOSPC, NBD_EPERM, NBD_ESHUTDOWN, PAYLOAD_BYTES_DEFAULT,
};
use crate::proto::reply::Extent;

/// A backend's handle for one export. A backend never gives it to another export,
/// even one created later under the same name: a connection is bound to the id it
/// negotiated, so it can never reach a newer export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExportId(pub u64);

/// What an export can do. Each `true` becomes a transmission flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportCaps {
    pub read_only: bool,
    pub flush: bool,
    pub fua: bool,
    pub trim: bool,
    pub write_zeroes: bool,
    /// Set only if a flush (or FUA write) completed on one connection makes
    /// every write completed on any connection to this export durable and
    /// visible: then clients may spread I/O over several connections.
    pub multi_conn: bool,
}

impl Default for ExportCaps {
    fn default() -> Self {
        ExportCaps {
            read_only: false,
            flush: true,
            fua: true,
            trim: true,
            write_zeroes: true,
            multi_conn: false,
        }
    }
}

/// Size constraints advertised in `NBD_INFO_BLOCK_SIZE`.
///
/// The server accepts any offset and length inside the export, whatever
/// `minimum` says: it never refuses a request for its alignment. `minimum` is
/// what clients that asked for block sizes must obey (libnbd enforces it in
/// its default strict mode), so it should be the smallest alignment the
/// backend serves: a larger one makes strict clients refuse I/O the backend
/// would do. `preferred` is the size below which I/O gets slower
/// (read-modify-write). Per the spec `minimum` and `preferred` are powers of
/// two, `minimum` at most 64 KiB, `preferred` at least `max(minimum, 512)`,
/// `payload_max` at least `preferred`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub minimum: u32,
    pub preferred: u32,
    pub payload_max: u32,
}

impl Default for BlockSizes {
    /// The spec's defaults for a server without constraints: byte-granular
    /// access (backends do read-modify-write of partial blocks), 4 KiB
    /// preferred, 32 MiB payload.
    fn default() -> Self {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            payload_max: PAYLOAD_BYTES_DEFAULT,
        }
    }
}

/// One export as the backend describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub id: ExportId,
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub caps: ExportCaps,
    pub block_sizes: BlockSizes,
}

/// One request for the backend. Offsets and lengths have been checked against
/// the export size by the server; backends still reject out-of-range requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendRequest {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    /// Everything completed before this flush was submitted must be durable
    /// when it completes.
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    /// Afterwards the range reads as zeroes; `no_hole` asks that it stays
    /// allocated.
    WriteZeroes {
        offset: u64,
        len: u32,
        no_hole: bool,
        fua: bool,
    },
    /// `base:allocation` status of the range (NBD_STATE_HOLE / NBD_STATE_ZERO).
    BlockStatus {
        offset: u64,
        len: u32,
    },
}

/// A successful completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendReply {
    /// Read data: exactly the requested length.
    Data(Vec<u8>),
    Done,
    /// Consecutive extents from the request offset. The server drops
    /// zero-length entries and trims the list to the protocol's rules.
    Extents(Vec<Extent>),
}

/// A failed completion; each maps to one NBD error value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("I/O error at offset {offset}: {message}")]
    Io { offset: u64, message: String },
    #[error("no space left writing at offset {offset}")]
    NoSpace { offset: u64 },
    #[error("export is read-only")]
    ReadOnly,
    #[error("invalid request: {message}")]
    Invalid { message: String },
    #[error("export {id:?} does not exist")]
    UnknownExport { id: ExportId },
    #[error("backend is shutting down")]
    ShuttingDown,
}

impl BackendError {
    /// The NBD error value sent to the client.
    pub fn nbd_error(&self) -> u32 {
        match self {
            BackendError::Io { .. } => NBD_EIO,
            BackendError::NoSpace { .. } => NBD_ENOSPC,
            BackendError::ReadOnly => NBD_EPERM,
            BackendError::Invalid { .. } | BackendError::UnknownExport { .. } => NBD_EINVAL,
            BackendError::ShuttingDown => NBD_ESHUTDOWN,
        }
    }

    /// The byte offset the error is about, if the backend knows it.
    pub fn offset(&self) -> Option<u64> {
        match self {
            BackendError::Io { offset, .. } | BackendError::NoSpace { offset } => Some(*offset),
            _ => None,
        }
    }
}

/// Called exactly once with the request's outcome, from any thread.
pub type Completion = Box<dyn FnOnce(Result<BackendReply, BackendError>) + Send + 'static>;

/// Where NBD requests go. Implementations must be cheap to call from many
/// connection threads at once and must not block in `submit`.
pub trait Backend: Send + Sync + 'static {
    /// Every export, in listing order.
    fn exports(&self) -> Vec<ExportInfo>;
    /// One export by name.
    fn export(&self, name: &str) -> Option<ExportInfo>;
    /// Queues `req` for `export`; `done` is called when it finishes.
    fn submit(&self, export: ExportId, req: BackendRequest, done: Completion);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_block_sizes_are_the_specs_unconstrained_defaults() {
        let b = BlockSizes::default();
        assert_eq!((b.minimum, b.preferred), (1, 4096));
        assert!(b.minimum.is_power_of_two() && b.minimum <= 1 << 16);
        assert!(b.preferred.is_power_of_two() && b.preferred >= b.minimum.max(512));
        assert!(b.payload_max >= b.preferred && b.payload_max >= 1 << 25);
    }
}
