//! The seam between the virtio-blk device and whatever stores the blocks.
//!
//! The back-end never waits for a target: it submits a request with a
//! completion callback and moves on to the next descriptor chain. The shapes
//! follow the engine's own requests (`Read`/`Write`/`Trim`/`WriteZeroes`/
//! `Flush`, `data: Vec<u8>`, a callback from the engine thread), so the daemon's
//! adapter is a field-for-field translation.
//!
//! Contract, checked by the back-end before a request gets here: offsets and
//! lengths are multiples of the device block size (`VhostOptions::block_bytes`),
//! every range lies inside `size_bytes()`, lengths are non-zero, and a
//! read-only target is only sent `Read` and `Flush`.

use thiserror::Error;

/// One request for the target. Offsets and lengths are in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetRequest {
    /// Answered with [`TargetReply::Data`] of exactly `len` bytes.
    Read { offset: u64, len: u64 },
    /// `fua`: durable when it completes (the guest runs the device write-through).
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    /// Everything completed before the flush was submitted is durable when it completes.
    Flush,
    /// The range may be deallocated; it reads back as zeroes or as the old data.
    /// `fua` as for writes (the device is write-through).
    Discard { offset: u64, len: u64, fua: bool },
    /// The range reads back as zeroes. `unmap`: the guest allows deallocation.
    WriteZeroes {
        offset: u64,
        len: u64,
        unmap: bool,
        fua: bool,
    },
}

impl TargetRequest {
    /// The request's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            TargetRequest::Read { .. } => "read",
            TargetRequest::Write { .. } => "write",
            TargetRequest::Flush => "flush",
            TargetRequest::Discard { .. } => "discard",
            TargetRequest::WriteZeroes { .. } => "write-zeroes",
        }
    }
}

/// A successful completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetReply {
    /// Read data: exactly the requested length.
    Data(Vec<u8>),
    Done,
}

/// A failed completion. [`TargetError::Unsupported`] becomes
/// `VIRTIO_BLK_S_UNSUPP`; everything else `VIRTIO_BLK_S_IOERR`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TargetError {
    #[error("I/O error at offset {offset}: {message}")]
    Io { offset: u64, message: String },
    #[error("no space left writing at offset {offset}")]
    NoSpace { offset: u64 },
    #[error("target is read-only")]
    ReadOnly,
    #[error("range {offset}+{len} is outside the target")]
    OutOfRange { offset: u64, len: u64 },
    #[error("the target does not support {what}")]
    Unsupported { what: &'static str },
    #[error("target is shutting down")]
    ShuttingDown,
}

/// Called exactly once with the request's outcome, from any thread (also from
/// inside `submit`).
pub type TargetDone = Box<dyn FnOnce(Result<TargetReply, TargetError>) + Send + 'static>;

/// A block device the back-end serves.
pub trait BlockTarget: Send + Sync + 'static {
    /// Size in bytes; the device's capacity is this in 512-byte sectors, rounded down.
    fn size_bytes(&self) -> u64;
    /// A read-only target gets the virtio `RO` feature and no writes.
    fn read_only(&self) -> bool;
    /// Starts `req`. Must not block the caller (it is a virtqueue's thread);
    /// `done` may be called later from any thread.
    fn submit(&self, req: TargetRequest, done: TargetDone);
}
