//! A device that stores nothing: writes are dropped and reads return zeros.
//!
//! For count-only simulations of drives far larger than memory (wrap it in
//! `StatsDevice` or the flash simulator to count what would have been written).
//! Requests are validated exactly like on a real device, so a simulation that runs
//! against it cleanly issues only requests a real device would accept.

use std::collections::VecDeque;

use crate::check::{check_async_io, check_geometry, check_range};
use crate::mem::{MEM_MAX_IO_BYTES, MEM_QUEUE_DEPTH};
use crate::{BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoOpKind, IoRequest};

/// A [`BlockDevice`] that discards writes and reads zeros.
#[derive(Debug)]
pub struct NullDevice {
    info: DeviceInfo,
    done: VecDeque<IoCompletion>,
}

impl NullDevice {
    /// Same geometry rules as [`crate::MemDevice::new`].
    pub fn new(size_bytes: u64, logical_block_size: u32) -> Result<NullDevice, DeviceError> {
        check_geometry(size_bytes, logical_block_size)?;
        Ok(NullDevice {
            info: DeviceInfo {
                name: "null".to_string(),
                size_bytes,
                logical_block_size,
                max_io_bytes: MEM_MAX_IO_BYTES,
                queue_depth: MEM_QUEUE_DEPTH,
            },
            done: VecDeque::new(),
        })
    }
}

impl BlockDevice for NullDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        let (buf, result) = match req.op {
            IoOp::Read { offset, mut buf } => {
                let r = check_async_io(&self.info, IoOpKind::Read, offset, buf.as_ptr(), buf.len());
                if r.is_ok() {
                    buf.fill(0);
                }
                (Some(buf), r)
            }
            IoOp::Write { offset, buf, .. } => {
                let r =
                    check_async_io(&self.info, IoOpKind::Write, offset, buf.as_ptr(), buf.len());
                (Some(buf), r)
            }
            IoOp::Flush => (None, Ok(())),
            IoOp::Discard { offset, len } => (
                None,
                check_range(&self.info, IoOpKind::Discard, offset, len),
            ),
        };
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
        let n = self.done.len();
        out.extend(self.done.drain(..));
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Read, offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Write, offset, buf.len() as u64)
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Discard, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;

    #[test]
    fn validates_like_a_real_device() {
        assert!(matches!(
            NullDevice::new(0, 512),
            Err(DeviceError::TooSmall { .. })
        ));
        assert!(matches!(
            NullDevice::new(1 << 20, 1024 + 512),
            Err(DeviceError::InvalidGeometry { .. })
        ));
        let mut d = NullDevice::new(1 << 50, 4096).expect("1 PiB null device");
        assert!(matches!(
            d.write_at(100, &[0u8; 4096]),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            d.read_at(1 << 50, &mut [0u8; 4096]),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.discard(0, 0),
            Err(DeviceError::ZeroLength { .. })
        ));
    }

    #[test]
    fn drops_writes_and_reads_zeros() {
        let mut d = NullDevice::new(1 << 50, 4096).expect("valid");
        d.write_at(1 << 40, &[0xFFu8; 8192]).expect("write");
        let mut b = [0xAAu8; 8192];
        d.read_at(1 << 40, &mut b).expect("read");
        assert!(b.iter().all(|&x| x == 0));

        let mut buf = IoBuf::zeroed(4096);
        buf.fill(0x55);
        d.submit(IoRequest {
            tag: 1,
            op: IoOp::Read { offset: 0, buf },
        });
        d.submit(IoRequest {
            tag: 2,
            op: IoOp::Write {
                offset: 4095,
                buf: IoBuf::zeroed(4096),
                fua: false,
            },
        });
        d.submit(IoRequest {
            tag: 3,
            op: IoOp::Flush,
        });
        let mut out = Vec::new();
        assert_eq!(d.poll(&mut out, 3).expect("poll"), 3);
        assert!(out[0]
            .buf
            .as_ref()
            .is_some_and(|b| b.iter().all(|&x| x == 0)));
        assert!(matches!(out[1].result, Err(DeviceError::Misaligned { .. })));
        assert!(out[2].result.is_ok());
        assert_eq!(d.in_flight(), 0);
    }
}
