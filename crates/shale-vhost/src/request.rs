//! virtio-blk requests as pure code over a descriptor chain (virtio 1.2, 5.2.6).
//!
//! A request is a 16-byte header (type, reserved, sector) in device-readable
//! memory, then data, then one status byte: the last byte of the last,
//! device-writable descriptor. Everything here is written by the guest and
//! trusted for nothing: the chain's shape (readable before writable, the status
//! last and writable, no loop), every buffer inside guest memory, the data
//! direction matching the type, lengths and sectors aligned to the block size,
//! ranges inside the device (overflow-checked), segment and descriptor counts,
//! and the discard/write-zeroes limits advertised in the config space. The
//! header may share descriptors with data (the spec forbids assuming a
//! framing); data segments are cut out of the descriptors by byte position.
//!
//! [`parse`] returns either a [`Request`] to carry out or a [`Rejected`] with
//! the status to report (`IOERR`, or `UNSUPP` for unknown types and flags) and
//! where to write it, if anywhere: a chain without a usable status byte is
//! only returned to the used ring. Nothing here panics on guest input (the
//! `fuzzing` module and `tests/fuzz_corpus.rs` hold it to that).

use thiserror::Error;
use virtio_bindings::bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

/// virtio-blk addresses the device in 512-byte sectors, whatever the block size.
pub const SECTOR_BYTES: u64 = 512;
/// `struct virtio_blk_outhdr`: le32 type, le32 reserved, le64 sector.
pub const HEADER_BYTES: u64 = 16;
/// `struct virtio_blk_discard_write_zeroes`: le64 sector, le32 num_sectors, le32 flags.
pub const DWZ_SEGMENT_BYTES: u64 = 16;
/// The GET_ID answer: a serial of up to 20 bytes, NUL-padded.
pub const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;

pub const STATUS_OK: u8 = VIRTIO_BLK_S_OK as u8;
pub const STATUS_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
pub const STATUS_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// What the device advertised and the driver negotiated: everything a request
/// is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// The device's size in bytes: a whole number of blocks.
    pub capacity_bytes: u64,
    /// Logical block size (`blk_size`): offsets and lengths are multiples of it.
    pub block_bytes: u32,
    /// `seg_max`: data segments per request at most.
    pub seg_max: u32,
    /// `size_max`: bytes per descriptor at most.
    pub size_max: u32,
    pub discard_sectors_max: u32,
    pub write_zeroes_sectors_max: u32,
    pub read_only: bool,
    /// VIRTIO_BLK_F_DISCARD was negotiated.
    pub discard: bool,
    /// VIRTIO_BLK_F_WRITE_ZEROES was negotiated.
    pub write_zeroes: bool,
}

impl RequestLimits {
    /// Descriptors per chain at most: the data segments, the header and the status.
    pub fn descriptors_max(&self) -> usize {
        (self.seg_max as usize).saturating_add(2)
    }

    /// Data bytes per read or write at most.
    pub fn data_bytes_max(&self) -> u64 {
        u64::from(self.seg_max) * u64::from(self.size_max)
    }
}

/// A piece of guest memory holding request data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// What the guest asked for, in bytes, checked against [`RequestLimits`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Data goes to `segments` (device-writable), `len` bytes in all.
    Read {
        offset: u64,
        len: u64,
        segments: Vec<Segment>,
    },
    /// Data comes from `segments` (device-readable), `len` bytes in all.
    Write {
        offset: u64,
        len: u64,
        segments: Vec<Segment>,
    },
    Flush,
    /// The serial goes to `segments` (at most [`ID_BYTES`]).
    GetId {
        segments: Vec<Segment>,
    },
    Discard {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        unmap: bool,
    },
}

/// A request to carry out; the outcome goes to the byte at `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub head: u16,
    pub op: Op,
    pub status: GuestAddress,
}

/// A request refused while parsing: `code` goes to `status` if there is one;
/// either way the chain goes back to the used ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub head: u16,
    pub status: Option<GuestAddress>,
    pub code: u8,
    pub error: RequestError,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("empty descriptor chain")]
    EmptyChain,
    #[error("descriptor chain broken after {descriptors} descriptors (a loop, a bad next index or an unreadable table)")]
    BrokenChain { descriptors: usize },
    #[error("the last descriptor is not a device-writable byte in guest memory")]
    NoStatus,
    #[error("chain of {descriptors} descriptors, over {max}")]
    TooManyDescriptors { descriptors: usize, max: usize },
    #[error("descriptor {index} ({addr:#x}+{len}) is outside guest memory")]
    OutsideMemory { index: usize, addr: u64, len: u32 },
    #[error("descriptor {index} is {len} bytes, over size_max {max}")]
    DescriptorTooLarge { index: usize, len: u32, max: u32 },
    #[error("device-readable descriptor {index} after a device-writable one")]
    ReadableAfterWritable { index: usize },
    #[error("the header needs {HEADER_BYTES} device-readable bytes, the chain has {readable}")]
    ShortHeader { readable: u64 },
    #[error("reading guest memory at {addr:#x}")]
    GuestMemory { addr: u64 },
    #[error("request type {kind} is not supported")]
    UnsupportedType { kind: u32 },
    #[error("{kind} request carries {bytes} device-readable data bytes")]
    UnexpectedReadable { kind: &'static str, bytes: u64 },
    #[error("{kind} request carries {bytes} device-writable data bytes")]
    UnexpectedWritable { kind: &'static str, bytes: u64 },
    #[error("length {bytes} is not a multiple of the block size {block_bytes}")]
    UnalignedLength { bytes: u64, block_bytes: u32 },
    #[error("sector {sector} is not aligned to the block size {block_bytes}")]
    UnalignedSector { sector: u64, block_bytes: u32 },
    #[error("{bytes} data bytes, over {max}")]
    TooLarge { bytes: u64, max: u64 },
    #[error("{segments} data segments, over seg_max {max}")]
    TooManySegments { segments: usize, max: u32 },
    #[error("sector {sector} + {bytes} bytes is outside the device ({capacity_bytes} bytes)")]
    OutOfRange {
        sector: u64,
        bytes: u64,
        capacity_bytes: u64,
    },
    #[error("the device is read-only")]
    ReadOnly,
    #[error("{kind} payload of {bytes} bytes: exactly one 16-byte segment is supported")]
    SegmentPayload { kind: &'static str, bytes: u64 },
    #[error("{kind} flags {flags:#x} not supported")]
    UnsupportedFlags { kind: &'static str, flags: u32 },
    #[error("{kind} of {sectors} sectors, over {max}")]
    TooManySectors {
        kind: &'static str,
        sectors: u32,
        max: u32,
    },
    #[error("GET_ID without a buffer")]
    EmptyIdBuffer,
}

/// Parses the chain headed by `head`. `descriptors` is the chain in order (a
/// `virtio_queue::DescriptorChain`, which follows indirect tables and stops
/// after as many descriptors as the table holds).
pub fn parse<M, I>(
    head: u16,
    descriptors: I,
    mem: &M,
    limits: &RequestLimits,
) -> Result<Request, Rejected>
where
    M: GuestMemory + ?Sized,
    I: IntoIterator<Item = Descriptor>,
{
    let max = limits.descriptors_max();
    let mut descs: Vec<Descriptor> = Vec::with_capacity(max.min(8));
    let mut count = 0usize;
    let mut last: Option<Descriptor> = None;
    // The iterator is bounded by the descriptor table's size; past `max` only
    // the last descriptor (the status) is still of interest.
    for d in descriptors {
        count += 1;
        if descs.len() < max {
            descs.push(d);
        }
        last = Some(d);
    }
    let reject = |status, code, error| Rejected {
        head,
        status,
        code,
        error,
    };
    let Some(last) = last else {
        return Err(reject(None, STATUS_IOERR, RequestError::EmptyChain));
    };
    if last.has_next() {
        // The iterator stopped early: the rest of the chain cannot be trusted,
        // and neither can a status byte found in it.
        let error = RequestError::BrokenChain { descriptors: count };
        return Err(reject(None, STATUS_IOERR, error));
    }
    let Some(status) = status_byte(&last, mem) else {
        return Err(reject(None, STATUS_IOERR, RequestError::NoStatus));
    };
    let fail = |error: RequestError| {
        let code = match error {
            RequestError::UnsupportedType { .. } | RequestError::UnsupportedFlags { .. } => {
                STATUS_UNSUPP
            }
            _ => STATUS_IOERR,
        };
        reject(Some(status), code, error)
    };
    if count > max {
        return Err(fail(RequestError::TooManyDescriptors {
            descriptors: count,
            max,
        }));
    }
    let shape = check_shape(&descs, mem, limits).map_err(fail)?;
    let op = parse_op(&descs, &shape, mem, limits).map_err(fail)?;
    Ok(Request { head, op, status })
}

/// The status byte: the last byte of the last descriptor, which must be
/// device-writable and inside guest memory.
fn status_byte<M: GuestMemory + ?Sized>(last: &Descriptor, mem: &M) -> Option<GuestAddress> {
    if !last.is_write_only() || last.len() == 0 {
        return None;
    }
    let addr = last.addr().checked_add(u64::from(last.len()) - 1)?;
    mem.check_range(addr, 1, Permissions::Write).then_some(addr)
}

/// Byte counts of the two halves of a chain.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Descriptors `[0, readable_descs)` are device-readable, the rest writable.
    readable_descs: usize,
    readable_bytes: u64,
    writable_bytes: u64,
}

fn check_shape<M: GuestMemory + ?Sized>(
    descs: &[Descriptor],
    mem: &M,
    limits: &RequestLimits,
) -> Result<Shape, RequestError> {
    let mut shape = Shape {
        readable_descs: 0,
        readable_bytes: 0,
        writable_bytes: 0,
    };
    let mut seen_writable = false;
    for (index, d) in descs.iter().enumerate() {
        if d.len() > limits.size_max.max(HEADER_BYTES as u32) {
            return Err(RequestError::DescriptorTooLarge {
                index,
                len: d.len(),
                max: limits.size_max,
            });
        }
        let perm = if d.is_write_only() {
            Permissions::Write
        } else {
            Permissions::Read
        };
        if d.len() > 0 && !mem.check_range(d.addr(), d.len() as usize, perm) {
            return Err(RequestError::OutsideMemory {
                index,
                addr: d.addr().raw_value(),
                len: d.len(),
            });
        }
        if d.is_write_only() {
            seen_writable = true;
            shape.writable_bytes += u64::from(d.len());
        } else {
            if seen_writable {
                return Err(RequestError::ReadableAfterWritable { index });
            }
            shape.readable_descs = index + 1;
            shape.readable_bytes += u64::from(d.len());
        }
    }
    if shape.readable_bytes < HEADER_BYTES {
        return Err(RequestError::ShortHeader {
            readable: shape.readable_bytes,
        });
    }
    Ok(shape)
}

/// The segments covering bytes `[skip, skip + take)` of `descs` taken end to end.
fn carve(descs: &[Descriptor], mut skip: u64, mut take: u64) -> Vec<Segment> {
    let mut out = Vec::new();
    for d in descs {
        if take == 0 {
            break;
        }
        let len = u64::from(d.len());
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(take);
        // `skip < len <= u32::MAX`, so the sum stays inside the checked
        // descriptor; `n <= len` fits a u32.
        if let Some(addr) = d.addr().checked_add(skip) {
            out.push(Segment {
                addr,
                len: n as u32,
            });
        }
        take -= n;
        skip = 0;
    }
    out
}

/// Copies guest memory from `segments` into `out` (which has their total length).
pub fn gather<M: GuestMemory + ?Sized>(
    mem: &M,
    segments: &[Segment],
    out: &mut [u8],
) -> Result<(), RequestError> {
    let mut at = 0usize;
    for s in segments {
        let end = at + s.len as usize;
        let dst = out.get_mut(at..end).ok_or(RequestError::GuestMemory {
            addr: s.addr.raw_value(),
        })?;
        mem.read_slice(dst, s.addr)
            .map_err(|_| RequestError::GuestMemory {
                addr: s.addr.raw_value(),
            })?;
        at = end;
    }
    Ok(())
}

/// Copies `data` into guest memory across `segments`, as far as both go.
pub fn scatter<M: GuestMemory + ?Sized>(
    mem: &M,
    segments: &[Segment],
    data: &[u8],
) -> Result<(), RequestError> {
    let mut at = 0usize;
    for s in segments {
        let end = (at + s.len as usize).min(data.len());
        let Some(src) = data.get(at..end) else {
            break;
        };
        mem.write_slice(src, s.addr)
            .map_err(|_| RequestError::GuestMemory {
                addr: s.addr.raw_value(),
            })?;
        at = end;
    }
    Ok(())
}

/// Writes the status byte; false if guest memory refused it.
pub fn write_status<M: GuestMemory + ?Sized>(mem: &M, status: GuestAddress, code: u8) -> bool {
    mem.write_obj(code, status).is_ok()
}

fn read_array<M: GuestMemory + ?Sized, const N: usize>(
    mem: &M,
    descs: &[Descriptor],
    skip: u64,
) -> Result<[u8; N], RequestError> {
    let mut buf = [0u8; N];
    gather(mem, &carve(descs, skip, N as u64), &mut buf)?;
    Ok(buf)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        v.copy_from_slice(s);
    }
    u32::from_le_bytes(v)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        v.copy_from_slice(s);
    }
    u64::from_le_bytes(v)
}

/// The byte offset of `bytes` at `sector`, checked for alignment and range.
fn byte_range(sector: u64, bytes: u64, limits: &RequestLimits) -> Result<u64, RequestError> {
    let block = u64::from(limits.block_bytes);
    let out_of_range = RequestError::OutOfRange {
        sector,
        bytes,
        capacity_bytes: limits.capacity_bytes,
    };
    let offset = sector
        .checked_mul(SECTOR_BYTES)
        .ok_or(out_of_range.clone())?;
    if block == 0 || offset % block != 0 {
        return Err(RequestError::UnalignedSector {
            sector,
            block_bytes: limits.block_bytes,
        });
    }
    if !bytes.is_multiple_of(block) {
        return Err(RequestError::UnalignedLength {
            bytes,
            block_bytes: limits.block_bytes,
        });
    }
    match offset.checked_add(bytes) {
        Some(end) if end <= limits.capacity_bytes => Ok(offset),
        _ => Err(out_of_range),
    }
}

fn parse_op<M: GuestMemory + ?Sized>(
    descs: &[Descriptor],
    shape: &Shape,
    mem: &M,
    limits: &RequestLimits,
) -> Result<Op, RequestError> {
    let (readable, writable) = descs.split_at(shape.readable_descs.min(descs.len()));
    let header: [u8; HEADER_BYTES as usize] = read_array(mem, readable, 0)?;
    let kind = le_u32(&header, 0);
    let sector = le_u64(&header, 8);
    let data_in = shape.readable_bytes - HEADER_BYTES;
    // The status byte is the last writable byte (checked by the caller).
    let data_out = shape.writable_bytes.saturating_sub(1);
    let only = |name: &'static str, want_in: bool, want_out: bool| {
        if !want_in && data_in != 0 {
            return Err(RequestError::UnexpectedReadable {
                kind: name,
                bytes: data_in,
            });
        }
        if !want_out && data_out != 0 {
            return Err(RequestError::UnexpectedWritable {
                kind: name,
                bytes: data_out,
            });
        }
        Ok(())
    };
    let segments_checked = |segments: Vec<Segment>| {
        if segments.len() > limits.seg_max as usize {
            return Err(RequestError::TooManySegments {
                segments: segments.len(),
                max: limits.seg_max,
            });
        }
        Ok(segments)
    };
    let size_checked = |len: u64| {
        if len > limits.data_bytes_max() {
            return Err(RequestError::TooLarge {
                bytes: len,
                max: limits.data_bytes_max(),
            });
        }
        Ok(len)
    };
    match kind {
        VIRTIO_BLK_T_IN => {
            only("read", false, true)?;
            let len = size_checked(data_out)?;
            let offset = byte_range(sector, len, limits)?;
            let segments = segments_checked(carve(writable, 0, len))?;
            Ok(Op::Read {
                offset,
                len,
                segments,
            })
        }
        VIRTIO_BLK_T_OUT => {
            only("write", true, false)?;
            if limits.read_only {
                return Err(RequestError::ReadOnly);
            }
            let len = size_checked(data_in)?;
            let offset = byte_range(sector, len, limits)?;
            let segments = segments_checked(carve(readable, HEADER_BYTES, len))?;
            Ok(Op::Write {
                offset,
                len,
                segments,
            })
        }
        VIRTIO_BLK_T_FLUSH => {
            only("flush", false, false)?;
            Ok(Op::Flush)
        }
        VIRTIO_BLK_T_GET_ID => {
            only("get-id", false, true)?;
            if data_out == 0 {
                return Err(RequestError::EmptyIdBuffer);
            }
            let segments = carve(writable, 0, data_out.min(ID_BYTES as u64));
            Ok(Op::GetId { segments })
        }
        VIRTIO_BLK_T_DISCARD if limits.discard => {
            let (offset, len, _) = parse_dwz("discard", readable, data_in, mem, limits)?;
            Ok(Op::Discard { offset, len })
        }
        VIRTIO_BLK_T_WRITE_ZEROES if limits.write_zeroes => {
            let (offset, len, unmap) = parse_dwz("write-zeroes", readable, data_in, mem, limits)?;
            Ok(Op::WriteZeroes { offset, len, unmap })
        }
        _ => Err(RequestError::UnsupportedType { kind }),
    }
    .and_then(|op| {
        if matches!(op, Op::Discard { .. } | Op::WriteZeroes { .. }) && data_out != 0 {
            return Err(RequestError::UnexpectedWritable {
                kind: "discard/write-zeroes",
                bytes: data_out,
            });
        }
        Ok(op)
    })
}

/// One discard/write-zeroes segment: (offset, len, unmap).
fn parse_dwz<M: GuestMemory + ?Sized>(
    kind: &'static str,
    readable: &[Descriptor],
    data_in: u64,
    mem: &M,
    limits: &RequestLimits,
) -> Result<(u64, u64, bool), RequestError> {
    if limits.read_only {
        return Err(RequestError::ReadOnly);
    }
    // max_discard_seg = max_write_zeroes_seg = 1.
    if data_in != DWZ_SEGMENT_BYTES {
        return Err(RequestError::SegmentPayload {
            kind,
            bytes: data_in,
        });
    }
    let seg: [u8; DWZ_SEGMENT_BYTES as usize] = read_array(mem, readable, HEADER_BYTES)?;
    let sector = le_u64(&seg, 0);
    let sectors = le_u32(&seg, 8);
    let flags = le_u32(&seg, 12);
    let is_discard = kind == "discard";
    // Discard takes no flags; write-zeroes takes only UNMAP (spec 5.2.6.2).
    let allowed = if is_discard {
        0
    } else {
        VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
    };
    if flags & !allowed != 0 {
        return Err(RequestError::UnsupportedFlags { kind, flags });
    }
    let max = if is_discard {
        limits.discard_sectors_max
    } else {
        limits.write_zeroes_sectors_max
    };
    if sectors > max {
        return Err(RequestError::TooManySectors { kind, sectors, max });
    }
    let len = u64::from(sectors) * SECTOR_BYTES;
    let offset = byte_range(sector, len, limits)?;
    Ok((offset, len, flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0))
}

#[cfg(test)]
mod tests;
