//! An in-memory block device for tests, simulations and benchmarks.
//!
//! Storage is a [`SparseImage`]: pages are allocated on first write, so a 4 GiB
//! simulated drive costs only what is written. Asynchronous requests complete
//! during `submit` and wait in a queue for `poll`, in submission order.
//!
//! Invariants: every request is validated exactly as a real device validates it
//! (see `check.rs`); a failed request changes nothing; discarded ranges read as zeros.

use std::collections::VecDeque;

use crate::check::{check_async_io, check_geometry, check_range};
use crate::sparse::SparseImage;
use crate::{BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoOpKind, IoRequest};

/// Largest single asynchronous I/O a memory device accepts.
pub const MEM_MAX_IO_BYTES: u32 = 64 * 1024 * 1024;
/// Queue depth a memory device reports (it has no real limit).
pub const MEM_QUEUE_DEPTH: u32 = 1024;

/// A sparse in-memory [`BlockDevice`].
#[derive(Debug)]
pub struct MemDevice {
    info: DeviceInfo,
    image: SparseImage,
    done: VecDeque<IoCompletion>,
}

impl MemDevice {
    /// A zero-filled device of `size_bytes` with the given logical block size
    /// (a power of two in 512..=4096; `size_bytes` a non-zero multiple of it).
    pub fn new(size_bytes: u64, logical_block_size: u32) -> Result<MemDevice, DeviceError> {
        check_geometry(size_bytes, logical_block_size)?;
        Ok(MemDevice {
            info: DeviceInfo {
                name: "mem".to_string(),
                size_bytes,
                logical_block_size,
                max_io_bytes: MEM_MAX_IO_BYTES,
                queue_depth: MEM_QUEUE_DEPTH,
            },
            image: SparseImage::new(size_bytes),
            done: VecDeque::new(),
        })
    }

    /// Sets the name reported in [`DeviceInfo`] (useful when a test has several).
    pub fn with_name(mut self, name: impl Into<String>) -> MemDevice {
        self.info.name = name.into();
        self
    }

    /// Bytes of memory currently holding written data.
    pub fn allocated_bytes(&self) -> u64 {
        self.image.allocated_bytes()
    }

    fn execute(&mut self, op: IoOp) -> (Option<crate::IoBuf>, Result<(), DeviceError>) {
        match op {
            IoOp::Read { offset, mut buf } => {
                let r = check_async_io(&self.info, IoOpKind::Read, offset, buf.as_ptr(), buf.len());
                if r.is_ok() {
                    self.image.read(offset, &mut buf);
                }
                (Some(buf), r)
            }
            IoOp::Write { offset, buf, .. } => {
                // Memory is always durable with respect to itself: FUA needs nothing more.
                let r =
                    check_async_io(&self.info, IoOpKind::Write, offset, buf.as_ptr(), buf.len());
                if r.is_ok() {
                    self.image.write(offset, &buf);
                }
                (Some(buf), r)
            }
            IoOp::Flush => (None, Ok(())),
            IoOp::Discard { offset, len } => (None, self.discard(offset, len)),
        }
    }
}

impl BlockDevice for MemDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        let (buf, result) = self.execute(req.op);
        self.done.push_back(IoCompletion {
            tag: req.tag,
            buf,
            result,
        });
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        _min_complete: usize,
    ) -> Result<usize, DeviceError> {
        // Everything submitted is already complete, so any `min_complete` (capped at
        // the number in flight) is met by draining the queue.
        let n = self.done.len();
        out.extend(self.done.drain(..));
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Read, offset, buf.len() as u64)?;
        self.image.read(offset, buf);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Write, offset, buf.len() as u64)?;
        self.image.write(offset, buf);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Discard, offset, len)?;
        self.image.zero(offset, len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;
    use shale_testkit::pattern;

    #[test]
    fn constructor_validates_geometry() {
        assert!(matches!(
            MemDevice::new(0, 4096),
            Err(DeviceError::TooSmall { .. })
        ));
        assert!(matches!(
            MemDevice::new(4096 * 3 + 512, 4096),
            Err(DeviceError::InvalidGeometry { .. })
        ));
        for lbs in [0u32, 100, 256, 768, 8192] {
            assert!(matches!(
                MemDevice::new(1 << 20, lbs),
                Err(DeviceError::InvalidGeometry { .. })
            ));
        }
        let d = MemDevice::new(1 << 20, 512).expect("valid");
        assert_eq!(d.info().logical_block_size, 512);
        assert_eq!(d.size_bytes(), 1 << 20);
    }

    #[test]
    fn sync_roundtrip_and_discard_reads_zero() {
        let mut d = MemDevice::new(1 << 20, 512).expect("valid");
        let data = pattern(9, 3 * 512);
        d.write_at(1024, &data).expect("write");
        let mut back = vec![0u8; data.len()];
        d.read_at(1024, &mut back).expect("read");
        assert_eq!(back, data);
        d.discard(1536, 512).expect("discard");
        d.read_at(1024, &mut back).expect("read");
        assert_eq!(&back[..512], &data[..512]);
        assert!(back[512..1024].iter().all(|&b| b == 0));
        assert_eq!(&back[1024..], &data[1024..]);
        d.flush().expect("flush");
    }

    #[test]
    fn sync_errors_change_nothing() {
        let mut d = MemDevice::new(1 << 20, 4096).expect("valid");
        assert!(matches!(
            d.write_at(512, &[1u8; 4096]),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            d.write_at(0, &[1u8; 100]),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            d.write_at(1 << 20, &[1u8; 4096]),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.read_at(0, &mut []),
            Err(DeviceError::ZeroLength { .. })
        ));
        assert!(matches!(
            d.discard(0, 0),
            Err(DeviceError::ZeroLength { .. })
        ));
        assert_eq!(d.allocated_bytes(), 0);
    }

    #[test]
    fn async_completions_carry_tags_and_buffers() {
        let mut d = MemDevice::new(1 << 20, 4096).expect("valid");
        let data = pattern(3, 8192);
        d.submit(IoRequest {
            tag: 1,
            op: IoOp::Write {
                offset: 4096,
                buf: IoBuf::from_slice(&data),
                fua: true,
            },
        });
        d.submit(IoRequest {
            tag: 2,
            op: IoOp::Flush,
        });
        d.submit(IoRequest {
            tag: 3,
            op: IoOp::Read {
                offset: 4096,
                buf: IoBuf::zeroed(8192),
            },
        });
        d.submit(IoRequest {
            tag: 4,
            op: IoOp::Read {
                offset: (1 << 20) - 4096,
                buf: IoBuf::zeroed(8192),
            },
        });
        d.submit(IoRequest {
            tag: 5,
            op: IoOp::Discard {
                offset: 4096,
                len: 4096,
            },
        });
        assert_eq!(d.in_flight(), 5);
        let mut out = Vec::new();
        assert_eq!(d.poll(&mut out, 5).expect("poll"), 5);
        assert_eq!(d.in_flight(), 0);
        let tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
        assert_eq!(tags, vec![1, 2, 3, 4, 5]);
        assert!(out[0].result.is_ok() && out[0].buf.is_some());
        assert!(out[1].result.is_ok() && out[1].buf.is_none());
        assert_eq!(out[2].buf.as_deref(), Some(&data[..]));
        assert!(matches!(out[3].result, Err(DeviceError::OutOfRange { .. })));
        assert_eq!(out[3].buf.as_ref().map(|b| b.len()), Some(8192));
        assert!(out[4].result.is_ok());
        let mut back = vec![0u8; 8192];
        d.read_at(4096, &mut back).expect("read");
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert_eq!(&back[4096..], &data[4096..]);
    }

    #[test]
    fn oversized_async_io_is_rejected() {
        let mut d = MemDevice::new(u64::from(MEM_MAX_IO_BYTES) * 2, 4096).expect("valid");
        d.submit(IoRequest {
            tag: 7,
            op: IoOp::Write {
                offset: 0,
                buf: IoBuf::zeroed(MEM_MAX_IO_BYTES as usize + 4096),
                fua: false,
            },
        });
        let mut out = Vec::new();
        d.poll(&mut out, 1).expect("poll");
        assert!(matches!(out[0].result, Err(DeviceError::TooLarge { .. })));
    }

    #[test]
    fn four_gib_drive_costs_only_what_is_written() {
        let mut d = MemDevice::new(4 << 30, 4096).expect("valid");
        for i in 0..16u64 {
            d.write_at(i * (256 << 20), &pattern(i, 4096))
                .expect("write");
        }
        assert_eq!(d.allocated_bytes(), 16 * 64 * 1024);
        let mut back = vec![0u8; 4096];
        d.read_at(15 * (256 << 20), &mut back).expect("read");
        assert_eq!(back, pattern(15, 4096));
        d.discard(0, 4 << 30).expect("discard all");
        assert_eq!(d.allocated_bytes(), 0);
    }
}
