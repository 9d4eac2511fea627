//! The zoned device capability, following the NVMe ZNS model.
//!
//! A zone is written only at its write pointer (or by zone append, which returns
//! where the data landed), read only below it, and reused only after a reset.
//! Open zones (implicitly or explicitly) count against `max_open_zones`; open and
//! closed zones count against `max_active_zones`.

use crate::{DeviceError, IoBuf, ZoneError};

/// Zone geometry. All sizes in bytes; zones are laid out back to back, zone `i`
/// starting at `i * zone_size`. `zone_capacity <= zone_size` is the writable part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneGeometry {
    pub name: String,
    pub logical_block_size: u32,
    pub zone_size: u64,
    pub zone_capacity: u64,
    pub zone_count: u32,
    /// 0 means no limit.
    pub max_open_zones: u32,
    /// 0 means no limit.
    pub max_active_zones: u32,
    pub max_io_bytes: u32,
    /// Writes start at a multiple of this and are a multiple of it long (bytes; the
    /// logical block size for a single drive, a whole stripe for an array).
    pub write_unit: u32,
}

impl ZoneGeometry {
    pub fn zone_start(&self, zone: u32) -> u64 {
        u64::from(zone) * self.zone_size
    }

    /// An asynchronous request no larger than the device's largest I/O.
    pub(crate) fn check_io_size(
        &self,
        op: crate::IoOpKind,
        offset: u64,
        len: u64,
    ) -> Result<(), ZoneError> {
        let max = u64::from(self.max_io_bytes);
        if len > max {
            return Err(DeviceError::TooLarge {
                op,
                offset,
                len,
                max,
            }
            .into());
        }
        Ok(())
    }
}

/// ZNS zone states (NVMe ZNS 1.0, Figure 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZoneState {
    Empty,
    ImplicitlyOpen,
    ExplicitlyOpen,
    Closed,
    Full,
    ReadOnly,
    Offline,
}

/// Zone management actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZoneAction {
    Open,
    Close,
    Finish,
    Reset,
}

/// One zone as reported by `report_zones`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneInfo {
    pub index: u32,
    pub start: u64,
    pub capacity: u64,
    /// Absolute byte offset of the write pointer (start <= wp <= start + capacity).
    pub write_pointer: u64,
    pub state: ZoneState,
}

#[derive(Debug)]
pub struct ZoneRequest {
    pub tag: u64,
    pub op: ZoneOp,
}

#[derive(Debug)]
pub enum ZoneOp {
    /// Read below the write pointer (or of a full zone).
    Read {
        offset: u64,
        buf: IoBuf,
    },
    /// Write exactly at the zone's write pointer.
    Write {
        offset: u64,
        buf: IoBuf,
        fua: bool,
    },
    /// Write at the write pointer of `zone`, wherever it is; the completion says where.
    Append {
        zone: u32,
        buf: IoBuf,
        fua: bool,
    },
    Flush,
}

/// Completion of a [`ZoneRequest`]. `landed_at` is the absolute byte offset where a
/// write or append was placed.
#[derive(Debug)]
pub struct ZoneCompletion {
    pub tag: u64,
    pub buf: Option<IoBuf>,
    pub result: Result<Option<u64>, ZoneError>,
}

/// A zoned device. Rule violations are [`ZoneError`]s, checked at submission time
/// (so a write pointer advances when the write is accepted, as on ZNS).
pub trait ZonedDevice {
    fn geometry(&self) -> &ZoneGeometry;

    /// Appends to `out` the state of zones `first..first+count` (clamped to the device).
    fn report_zones(
        &self,
        first: u32,
        count: u32,
        out: &mut Vec<ZoneInfo>,
    ) -> Result<(), ZoneError> {
        let end = first.saturating_add(count).min(self.geometry().zone_count);
        for zone in first..end {
            out.push(self.zone_info(zone)?);
        }
        Ok(())
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError>;

    fn submit(&mut self, req: ZoneRequest);

    /// Moves finished completions into `out`, waiting until at least `min_complete`
    /// have arrived (capped at the number in flight); returns how many were added.
    /// A device made of others (an array) may return fewer once it has waited for
    /// one of its members: a request needs every member's part, and the caller may
    /// have other devices to serve before the next wait. Callers wait in a loop.
    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError>;

    fn in_flight(&self) -> usize;

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError>;
    /// Synchronous write at the write pointer; returns where it landed.
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError>;
    /// Synchronous zone append; returns where it landed.
    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError>;
    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError>;
    fn flush(&mut self) -> Result<(), ZoneError>;

    fn open_zone(&mut self, zone: u32) -> Result<(), ZoneError> {
        self.manage(zone, ZoneAction::Open)
    }
    fn close_zone(&mut self, zone: u32) -> Result<(), ZoneError> {
        self.manage(zone, ZoneAction::Close)
    }
    fn finish_zone(&mut self, zone: u32) -> Result<(), ZoneError> {
        self.manage(zone, ZoneAction::Finish)
    }
    fn reset_zone(&mut self, zone: u32) -> Result<(), ZoneError> {
        self.manage(zone, ZoneAction::Reset)
    }

    /// As [`crate::BlockDevice::maintain`].
    fn maintain(&mut self) -> u64 {
        crate::MAINTAIN_IDLE
    }

    /// Reads a range without trusting the copy a plain read returns: rebuilt from
    /// the device's redundancy (an array decodes it from its other members). For
    /// data that failed its checksum. `attempt` 0, 1, 2, ... picks other sources in
    /// turn (an array leaves out one more member each time), so a caller that can
    /// check the result tries until one checks or the device says there are no
    /// more (an error). A device without redundancy: `Unsupported`.
    fn read_rebuilt(
        &mut self,
        _offset: u64,
        _buf: &mut [u8],
        _attempt: u32,
    ) -> Result<(), ZoneError> {
        Err(ZoneError::Device(crate::DeviceError::Unsupported {
            op: crate::IoOpKind::Read,
        }))
    }
}

impl<T: ZonedDevice + ?Sized> ZonedDevice for Box<T> {
    fn geometry(&self) -> &ZoneGeometry {
        (**self).geometry()
    }
    fn report_zones(
        &self,
        first: u32,
        count: u32,
        out: &mut Vec<ZoneInfo>,
    ) -> Result<(), ZoneError> {
        (**self).report_zones(first, count, out)
    }
    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        (**self).zone_info(zone)
    }
    fn submit(&mut self, req: ZoneRequest) {
        (**self).submit(req)
    }
    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        (**self).poll(out, min_complete)
    }
    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        (**self).write_at(offset, buf)
    }
    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        (**self).append(zone, buf)
    }
    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        (**self).manage(zone, action)
    }
    fn flush(&mut self) -> Result<(), ZoneError> {
        (**self).flush()
    }
    fn maintain(&mut self) -> u64 {
        (**self).maintain()
    }
    fn read_rebuilt(&mut self, offset: u64, buf: &mut [u8], attempt: u32) -> Result<(), ZoneError> {
        (**self).read_rebuilt(offset, buf, attempt)
    }
}

/// Lets a caller lend a zoned device to a wrapper and take it back afterwards.
impl<T: ZonedDevice + ?Sized> ZonedDevice for &mut T {
    fn geometry(&self) -> &ZoneGeometry {
        (**self).geometry()
    }
    fn report_zones(
        &self,
        first: u32,
        count: u32,
        out: &mut Vec<ZoneInfo>,
    ) -> Result<(), ZoneError> {
        (**self).report_zones(first, count, out)
    }
    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        (**self).zone_info(zone)
    }
    fn submit(&mut self, req: ZoneRequest) {
        (**self).submit(req)
    }
    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        (**self).poll(out, min_complete)
    }
    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        (**self).write_at(offset, buf)
    }
    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        (**self).append(zone, buf)
    }
    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        (**self).manage(zone, action)
    }
    fn flush(&mut self) -> Result<(), ZoneError> {
        (**self).flush()
    }
    fn maintain(&mut self) -> u64 {
        (**self).maintain()
    }
    fn read_rebuilt(&mut self, offset: u64, buf: &mut [u8], attempt: u32) -> Result<(), ZoneError> {
        (**self).read_rebuilt(offset, buf, attempt)
    }
}
