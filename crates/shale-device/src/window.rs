//! A byte range of a block device as a block device of its own: the conventional
//! zones at the start of a zoned drive, under zone emulation.

use std::collections::VecDeque;

use crate::check::check_range;
use crate::{BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoOpKind, IoRequest};

/// `len` bytes of `inner` from `offset` on, addressed from 0.
#[derive(Debug)]
pub struct Window<D: BlockDevice> {
    inner: D,
    offset: u64,
    info: DeviceInfo,
    /// Completions of requests refused (or answered) before reaching the inner device.
    early: VecDeque<IoCompletion>,
    /// Discards reach the inner device (see [`Window::without_discard`]).
    discard: bool,
}

impl<D: BlockDevice> Window<D> {
    /// `offset` and `len` must be multiples of the inner device's logical block size
    /// and lie inside it.
    pub fn new(inner: D, offset: u64, len: u64) -> Result<Window<D>, DeviceError> {
        let i = inner.info();
        let lbs = u64::from(i.logical_block_size);
        if len == 0
            || !offset.is_multiple_of(lbs)
            || !len.is_multiple_of(lbs)
            || offset.checked_add(len).is_none_or(|e| e > i.size_bytes)
        {
            return Err(DeviceError::InvalidGeometry {
                reason: format!(
                    "window {offset}+{len} is not aligned to {lbs} or not inside {} bytes",
                    i.size_bytes
                ),
            });
        }
        let info = DeviceInfo {
            name: format!("{}[{offset}+{len}]", i.name),
            size_bytes: len,
            ..i.clone()
        };
        Ok(Window {
            inner,
            offset,
            info,
            early: VecDeque::new(),
            discard: true,
        })
    }

    /// Discards succeed without reaching the inner device: for a range where they
    /// are only a hint and the device may refuse them (the conventional zones of a
    /// zoned drive); nothing reads what a discard would have zeroed.
    pub fn without_discard(mut self) -> Window<D> {
        self.discard = false;
        self
    }

    fn check(&self, op: IoOpKind, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(&self.info, op, offset, len)
    }
}

impl<D: BlockDevice> BlockDevice for Window<D> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        let tag = req.tag;
        let (checked, op) = match req.op {
            IoOp::Read { offset, buf } => (
                self.check(IoOpKind::Read, offset, buf.len() as u64),
                IoOp::Read {
                    offset: offset + self.offset,
                    buf,
                },
            ),
            IoOp::Write { offset, buf, fua } => (
                self.check(IoOpKind::Write, offset, buf.len() as u64),
                IoOp::Write {
                    offset: offset + self.offset,
                    buf,
                    fua,
                },
            ),
            IoOp::Discard { offset, len } => (
                self.check(IoOpKind::Discard, offset, len),
                IoOp::Discard {
                    offset: offset + self.offset,
                    len,
                },
            ),
            IoOp::Flush => (Ok(()), IoOp::Flush),
        };
        match checked {
            Ok(()) if !self.discard && matches!(op, IoOp::Discard { .. }) => {
                self.early.push_back(IoCompletion {
                    tag,
                    buf: None,
                    result: Ok(()),
                });
            }
            Ok(()) => self.inner.submit(IoRequest { tag, op }),
            Err(e) => {
                let buf = match op {
                    IoOp::Read { buf, .. } | IoOp::Write { buf, .. } => Some(buf),
                    _ => None,
                };
                self.early.push_back(IoCompletion {
                    tag,
                    buf,
                    result: Err(e),
                });
            }
        }
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let early = self.early.len();
        out.extend(self.early.drain(..));
        let n = self.inner.poll(out, min_complete.saturating_sub(early))?;
        Ok(early + n)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.early.len()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.check(IoOpKind::Read, offset, buf.len() as u64)?;
        self.inner.read_at(offset + self.offset, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        self.check(IoOpKind::Write, offset, buf.len() as u64)?;
        self.inner.write_at(offset + self.offset, buf)
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        self.inner.flush()
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.check(IoOpKind::Discard, offset, len)?;
        if !self.discard {
            return Ok(());
        }
        self.inner.discard(offset + self.offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, MemDevice};

    #[test]
    fn a_window_reaches_only_its_range() {
        let mut w =
            Window::new(MemDevice::new(1 << 20, 4096).expect("mem"), 8192, 16384).expect("window");
        assert_eq!(w.info().size_bytes, 16384);
        w.write_at(4096, &[7u8; 4096]).expect("write");
        assert!(matches!(
            w.write_at(16384, &[1u8; 4096]),
            Err(DeviceError::OutOfRange { .. })
        ));
        w.submit(IoRequest {
            tag: 1,
            op: IoOp::Read {
                offset: 16384,
                buf: IoBuf::zeroed(4096),
            },
        });
        w.submit(IoRequest {
            tag: 2,
            op: IoOp::Read {
                offset: 4096,
                buf: IoBuf::zeroed(4096),
            },
        });
        let mut out = Vec::new();
        while out.len() < 2 {
            w.poll(&mut out, 1).expect("poll");
        }
        out.sort_by_key(|c| c.tag);
        assert!(out[0].result.is_err());
        assert!(out[1].result.is_ok());
        assert!(out[1].buf.as_ref().expect("buf").iter().all(|&x| x == 7));
        let mut inner = w.inner;
        let mut raw = [0u8; 4096];
        inner.read_at(8192 + 4096, &mut raw).expect("read");
        assert!(raw.iter().all(|&x| x == 7));
        assert!(Window::new(MemDevice::new(1 << 20, 4096).expect("mem"), 0, 2 << 20).is_err());
    }
}
