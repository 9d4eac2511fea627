use std::fmt;

/// Which operation failed; carried by every error so a log line names the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOpKind {
    Read,
    Write,
    Flush,
    Discard,
    Append,
    ZoneManagement,
    Open,
    /// Handing queued requests to the kernel or waiting for their completions.
    Submit,
}

impl fmt::Display for IoOpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            IoOpKind::Read => "read",
            IoOpKind::Write => "write",
            IoOpKind::Flush => "flush",
            IoOpKind::Discard => "discard",
            IoOpKind::Append => "zone append",
            IoOpKind::ZoneManagement => "zone management",
            IoOpKind::Open => "open",
            IoOpKind::Submit => "submit",
        };
        f.write_str(s)
    }
}

/// Errors of a conventional block device. Bad arguments and bad media are values,
/// never panics.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{op} at offset {offset} length {len}: not aligned to {align} bytes")]
    Misaligned {
        op: IoOpKind,
        offset: u64,
        len: u64,
        align: u64,
    },
    #[error("{op} at offset {offset} length {len}: beyond device end {size}")]
    OutOfRange {
        op: IoOpKind,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{op} of zero length at offset {offset}")]
    ZeroLength { op: IoOpKind, offset: u64 },
    #[error("{op} at offset {offset} length {len}: larger than the device's largest I/O {max}")]
    TooLarge {
        op: IoOpKind,
        offset: u64,
        len: u64,
        max: u64,
    },
    #[error("device too small: {size} bytes, need at least {min}")]
    TooSmall { size: u64, min: u64 },
    #[error("invalid device geometry: {reason}")]
    InvalidGeometry { reason: String },
    #[error("{op} at offset {offset}: I/O error: {source}")]
    Io {
        op: IoOpKind,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} at offset {offset}: injected I/O error")]
    Injected { op: IoOpKind, offset: u64 },
    #[error("{op}: not supported by this device")]
    Unsupported { op: IoOpKind },
    #[error("{op}: device has been crashed (simulated power loss); reopen it")]
    Crashed { op: IoOpKind },
    #[error("{path}: {source}")]
    OpenFailed {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("zone metadata on device is corrupt: {reason}")]
    CorruptMetadata { reason: String },
    /// An array cannot serve the request: too many of its members are failed.
    #[error("{op} at offset {offset}: {reason}")]
    Unavailable {
        op: IoOpKind,
        offset: u64,
        reason: String,
    },
}

/// Errors of a zoned device: every ZNS rule violation has its own variant.
#[derive(Debug, thiserror::Error)]
pub enum ZoneError {
    #[error("zone {zone}: write at offset {offset} is not at the write pointer {write_pointer}")]
    NotAtWritePointer {
        zone: u32,
        offset: u64,
        write_pointer: u64,
    },
    #[error("zone {zone}: write of {len} bytes at offset {offset} does not fit (zone is full at {zone_end})")]
    ZoneFull {
        zone: u32,
        offset: u64,
        len: u64,
        zone_end: u64,
    },
    #[error("zone {zone}: would exceed the open-zone limit of {limit}")]
    TooManyOpen { zone: u32, limit: u32 },
    #[error("zone {zone}: would exceed the active-zone limit of {limit}")]
    TooManyActive { zone: u32, limit: u32 },
    #[error("zone {zone}: read at offset {offset} length {len} goes past the write pointer {write_pointer}")]
    ReadPastWritePointer {
        zone: u32,
        offset: u64,
        len: u64,
        write_pointer: u64,
    },
    #[error("I/O at offset {offset} length {len} crosses a zone boundary")]
    CrossesZoneBoundary { offset: u64, len: u64 },
    #[error("zone {zone} does not exist (device has {count} zones)")]
    NoSuchZone { zone: u32, count: u32 },
    #[error("zone {zone} is read-only")]
    ReadOnly { zone: u32 },
    #[error("zone {zone} is offline")]
    Offline { zone: u32 },
    #[error("zone {zone}: cannot {action:?} a zone in state {state:?}")]
    InvalidTransition {
        zone: u32,
        state: crate::ZoneState,
        action: crate::ZoneAction,
    },
    #[error(transparent)]
    Device(#[from] DeviceError),
}
