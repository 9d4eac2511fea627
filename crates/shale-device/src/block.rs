//! The conventional block device capability.

use crate::{DeviceError, IoBuf, IoOpKind};

/// Static facts about a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Human-readable name for logs and errors (a path, "mem", a preset name...).
    pub name: String,
    /// Size in bytes; a multiple of `logical_block_size`.
    pub size_bytes: u64,
    /// Alignment and granularity of every I/O, a power of two in 512..=4096.
    pub logical_block_size: u32,
    /// Largest single I/O in bytes the device accepts (larger requests are a typed error).
    pub max_io_bytes: u32,
    /// Requests the device can hold in flight; `submit` beyond this still succeeds but
    /// the device queues internally.
    pub queue_depth: u32,
}

/// One asynchronous request. `tag` is the caller's and comes back in the completion.
#[derive(Debug)]
pub struct IoRequest {
    pub tag: u64,
    pub op: IoOp,
}

/// What a request does. Read and write move exactly `buf.len()` bytes.
#[derive(Debug)]
pub enum IoOp {
    Read {
        offset: u64,
        buf: IoBuf,
    },
    /// `fua`: durable when the completion arrives, as if followed by a flush of this range.
    Write {
        offset: u64,
        buf: IoBuf,
        fua: bool,
    },
    /// Makes every write completed before this flush was submitted durable.
    Flush,
    /// Trim: the range reads back as zeros afterwards (our devices guarantee zeros).
    Discard {
        offset: u64,
        len: u64,
    },
}

/// The completion of one [`IoRequest`]. Read and write return their buffer.
#[derive(Debug)]
pub struct IoCompletion {
    pub tag: u64,
    pub buf: Option<IoBuf>,
    pub result: Result<(), DeviceError>,
}

/// A conventional, LBA-addressed device.
///
/// The asynchronous pair (`submit`, `poll`) lets one thread keep many I/Os in flight;
/// the synchronous helpers exist for format, open and recovery, and may be mixed with
/// asynchronous I/O (they never steal its completions).
pub trait BlockDevice {
    fn info(&self) -> &DeviceInfo;

    /// Queues a request. Never blocks on I/O; errors (including argument errors)
    /// arrive in the request's completion.
    fn submit(&mut self, req: IoRequest);

    /// Moves finished completions into `out`, waiting until at least `min_complete`
    /// have arrived (capped at the number in flight). Returns how many were added.
    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError>;

    /// Requests submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError>;
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError>;
    fn flush(&mut self) -> Result<(), DeviceError>;
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError>;

    /// Convenience: size in bytes.
    fn size_bytes(&self) -> u64 {
        self.info().size_bytes
    }

    /// Background work the device does on its owner's thread (an array's rebuild,
    /// an operator's command), a step per call. Returns how soon it wants the next
    /// call, in nanoseconds: 0 at once, [`MAINTAIN_IDLE`] only when there is other
    /// work anyway.
    fn maintain(&mut self) -> u64 {
        MAINTAIN_IDLE
    }

    /// Reads `buf` at `offset` again from the device's redundancy, for a caller whose
    /// check of a plain read failed: attempt `a` reads the `a`-th copy (a mirror
    /// reads its members in turn), so a caller tries until one checks or the device
    /// says there are no more (an error). A device without redundancy: `Unsupported`.
    fn read_rebuilt(
        &mut self,
        _offset: u64,
        _buf: &mut [u8],
        _attempt: u32,
    ) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported { op: IoOpKind::Read })
    }
}

/// [`BlockDevice::maintain`] / [`crate::ZonedDevice::maintain`]: nothing pending.
pub const MAINTAIN_IDLE: u64 = u64::MAX;

impl<T: BlockDevice + ?Sized> BlockDevice for Box<T> {
    fn info(&self) -> &DeviceInfo {
        (**self).info()
    }
    fn submit(&mut self, req: IoRequest) {
        (**self).submit(req)
    }
    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        (**self).poll(out, min_complete)
    }
    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        (**self).write_at(offset, buf)
    }
    fn flush(&mut self) -> Result<(), DeviceError> {
        (**self).flush()
    }
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        (**self).discard(offset, len)
    }
    fn maintain(&mut self) -> u64 {
        (**self).maintain()
    }
    fn read_rebuilt(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        attempt: u32,
    ) -> Result<(), DeviceError> {
        (**self).read_rebuilt(offset, buf, attempt)
    }
}

/// Lets a caller lend a device to a wrapper (e.g. `ZoneEmu<&mut MemDevice>` in tests)
/// and take it back afterwards.
impl<T: BlockDevice + ?Sized> BlockDevice for &mut T {
    fn info(&self) -> &DeviceInfo {
        (**self).info()
    }
    fn submit(&mut self, req: IoRequest) {
        (**self).submit(req)
    }
    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        (**self).poll(out, min_complete)
    }
    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        (**self).write_at(offset, buf)
    }
    fn flush(&mut self) -> Result<(), DeviceError> {
        (**self).flush()
    }
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        (**self).discard(offset, len)
    }
    fn maintain(&mut self) -> u64 {
        (**self).maintain()
    }
    fn read_rebuilt(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        attempt: u32,
    ) -> Result<(), DeviceError> {
        (**self).read_rebuilt(offset, buf, attempt)
    }
}
