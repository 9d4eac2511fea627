//! Counting what goes through a device, readable from outside.
//!
//! [`StatsDevice`] wraps a block or zoned device and counts completed requests and
//! bytes per kind of operation. The counters live behind an `Arc`, so a benchmark
//! keeps a [`StatsHandle`] and reads them after moving the device into an engine.
//!
//! A request is counted when it completes successfully (a refused or failed
//! request moved no bytes); failures are counted apart in `errors`. Zone appends
//! are writes: they count in `writes`/`write_bytes` and again in
//! `appends`/`append_bytes`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{
    BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoRequest, ZoneAction,
    ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp, ZoneRequest, ZonedDevice,
};

/// A snapshot of a device's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub reads: u64,
    pub read_bytes: u64,
    /// Writes and zone appends.
    pub writes: u64,
    pub write_bytes: u64,
    pub fua_writes: u64,
    pub appends: u64,
    pub append_bytes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub discard_bytes: u64,
    pub zone_opens: u64,
    pub zone_closes: u64,
    pub zone_finishes: u64,
    pub zone_resets: u64,
    /// Requests that completed with an error (counted nowhere else).
    pub errors: u64,
}

impl DeviceStats {
    /// Counter-wise difference `self - earlier` (for per-phase figures).
    pub fn since(&self, earlier: &DeviceStats) -> DeviceStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        DeviceStats {
            reads: d(self.reads, earlier.reads),
            read_bytes: d(self.read_bytes, earlier.read_bytes),
            writes: d(self.writes, earlier.writes),
            write_bytes: d(self.write_bytes, earlier.write_bytes),
            fua_writes: d(self.fua_writes, earlier.fua_writes),
            appends: d(self.appends, earlier.appends),
            append_bytes: d(self.append_bytes, earlier.append_bytes),
            flushes: d(self.flushes, earlier.flushes),
            discards: d(self.discards, earlier.discards),
            discard_bytes: d(self.discard_bytes, earlier.discard_bytes),
            zone_opens: d(self.zone_opens, earlier.zone_opens),
            zone_closes: d(self.zone_closes, earlier.zone_closes),
            zone_finishes: d(self.zone_finishes, earlier.zone_finishes),
            zone_resets: d(self.zone_resets, earlier.zone_resets),
            errors: d(self.errors, earlier.errors),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    fua_writes: AtomicU64,
    appends: AtomicU64,
    append_bytes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    discard_bytes: AtomicU64,
    zone_opens: AtomicU64,
    zone_closes: AtomicU64,
    zone_finishes: AtomicU64,
    zone_resets: AtomicU64,
    errors: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    // Counters are independent totals; no ordering with other memory is needed.
    c.fetch_add(n, Ordering::Relaxed);
}

/// A cloneable, thread-safe view of a [`StatsDevice`]'s counters.
#[derive(Debug, Clone)]
pub struct StatsHandle(Arc<Counters>);

impl StatsHandle {
    pub fn snapshot(&self) -> DeviceStats {
        let c = &self.0;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeviceStats {
            reads: g(&c.reads),
            read_bytes: g(&c.read_bytes),
            writes: g(&c.writes),
            write_bytes: g(&c.write_bytes),
            fua_writes: g(&c.fua_writes),
            appends: g(&c.appends),
            append_bytes: g(&c.append_bytes),
            flushes: g(&c.flushes),
            discards: g(&c.discards),
            discard_bytes: g(&c.discard_bytes),
            zone_opens: g(&c.zone_opens),
            zone_closes: g(&c.zone_closes),
            zone_finishes: g(&c.zone_finishes),
            zone_resets: g(&c.zone_resets),
            errors: g(&c.errors),
        }
    }
}

/// What a request in flight will count when it completes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Read(u64),
    Write { bytes: u64, fua: bool, append: bool },
    Flush,
    Discard(u64),
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    user_tag: u64,
    kind: Kind,
}

/// Counts completed requests and bytes of the device it wraps.
#[derive(Debug)]
pub struct StatsDevice<D> {
    inner: D,
    counters: Arc<Counters>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    scratch_block: Vec<IoCompletion>,
    scratch_zone: Vec<ZoneCompletion>,
}

impl<D> StatsDevice<D> {
    pub fn new(inner: D) -> StatsDevice<D> {
        StatsDevice {
            inner,
            counters: Arc::new(Counters::default()),
            slots: Vec::new(),
            free: Vec::new(),
            scratch_block: Vec::new(),
            scratch_zone: Vec::new(),
        }
    }

    pub fn handle(&self) -> StatsHandle {
        StatsHandle(Arc::clone(&self.counters))
    }

    pub fn stats(&self) -> DeviceStats {
        self.handle().snapshot()
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Gives back the wrapped device; requests in flight are forgotten.
    pub fn into_inner(self) -> D {
        self.inner
    }

    fn count(&self, kind: Kind, ok: bool) {
        let c = &self.counters;
        if !ok {
            add(&c.errors, 1);
            return;
        }
        match kind {
            Kind::Read(b) => {
                add(&c.reads, 1);
                add(&c.read_bytes, b);
            }
            Kind::Write { bytes, fua, append } => {
                add(&c.writes, 1);
                add(&c.write_bytes, bytes);
                if fua {
                    add(&c.fua_writes, 1);
                }
                if append {
                    add(&c.appends, 1);
                    add(&c.append_bytes, bytes);
                }
            }
            Kind::Flush => add(&c.flushes, 1),
            Kind::Discard(b) => {
                add(&c.discards, 1);
                add(&c.discard_bytes, b);
            }
        }
    }

    fn track(&mut self, user_tag: u64, kind: Kind) -> u64 {
        let slot = Some(Slot { user_tag, kind });
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i as u64
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u64
            }
        }
    }

    fn untrack(&mut self, tag: u64) -> Slot {
        let i = tag as usize;
        let Some(slot) = self.slots.get_mut(i).and_then(Option::take) else {
            panic!("stats device: inner device completed unknown tag {tag}");
        };
        self.free.push(i);
        slot
    }

    fn count_sync<T, E>(&self, kind: Kind, r: Result<T, E>) -> Result<T, E> {
        self.count(kind, r.is_ok());
        r
    }
}

impl<D: BlockDevice> BlockDevice for StatsDevice<D> {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn submit(&mut self, req: IoRequest) {
        let kind = match &req.op {
            IoOp::Read { buf, .. } => Kind::Read(buf.len() as u64),
            IoOp::Write { buf, fua, .. } => Kind::Write {
                bytes: buf.len() as u64,
                fua: *fua,
                append: false,
            },
            IoOp::Flush => Kind::Flush,
            IoOp::Discard { len, .. } => Kind::Discard(*len),
        };
        let tag = self.track(req.tag, kind);
        self.inner.submit(IoRequest { tag, op: req.op });
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let mut got = std::mem::take(&mut self.scratch_block);
        let r = self.inner.poll(&mut got, min_complete);
        let n = got.len();
        for mut c in got.drain(..) {
            let slot = self.untrack(c.tag);
            self.count(slot.kind, c.result.is_ok());
            c.tag = slot.user_tag;
            out.push(c);
        }
        self.scratch_block = got;
        r.map(|_| n)
    }

    fn in_flight(&self) -> usize {
        BlockDevice::in_flight(&self.inner)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let r = BlockDevice::read_at(&mut self.inner, offset, buf);
        self.count_sync(Kind::Read(buf.len() as u64), r)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        let r = BlockDevice::write_at(&mut self.inner, offset, buf);
        let kind = Kind::Write {
            bytes: buf.len() as u64,
            fua: false,
            append: false,
        };
        self.count_sync(kind, r)
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        let r = BlockDevice::flush(&mut self.inner);
        self.count_sync(Kind::Flush, r)
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let r = self.inner.discard(offset, len);
        self.count_sync(Kind::Discard(len), r)
    }

    fn maintain(&mut self) -> u64 {
        BlockDevice::maintain(&mut self.inner)
    }

    fn read_rebuilt(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        attempt: u32,
    ) -> Result<(), DeviceError> {
        let r = BlockDevice::read_rebuilt(&mut self.inner, offset, buf, attempt);
        self.count_sync(Kind::Read(buf.len() as u64), r)
    }
}

impl<D: ZonedDevice> ZonedDevice for StatsDevice<D> {
    fn geometry(&self) -> &ZoneGeometry {
        self.inner.geometry()
    }

    fn report_zones(
        &self,
        first: u32,
        count: u32,
        out: &mut Vec<ZoneInfo>,
    ) -> Result<(), ZoneError> {
        self.inner.report_zones(first, count, out)
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        self.inner.zone_info(zone)
    }

    fn submit(&mut self, req: ZoneRequest) {
        let kind = match &req.op {
            ZoneOp::Read { buf, .. } => Kind::Read(buf.len() as u64),
            ZoneOp::Write { buf, fua, .. } => Kind::Write {
                bytes: buf.len() as u64,
                fua: *fua,
                append: false,
            },
            ZoneOp::Append { buf, fua, .. } => Kind::Write {
                bytes: buf.len() as u64,
                fua: *fua,
                append: true,
            },
            ZoneOp::Flush => Kind::Flush,
        };
        let tag = self.track(req.tag, kind);
        self.inner.submit(ZoneRequest { tag, op: req.op });
    }

    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let mut got = std::mem::take(&mut self.scratch_zone);
        let r = self.inner.poll(&mut got, min_complete);
        let n = got.len();
        for mut c in got.drain(..) {
            let slot = self.untrack(c.tag);
            self.count(slot.kind, c.result.is_ok());
            c.tag = slot.user_tag;
            out.push(c);
        }
        self.scratch_zone = got;
        r.map(|_| n)
    }

    fn in_flight(&self) -> usize {
        ZonedDevice::in_flight(&self.inner)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        let r = ZonedDevice::read_at(&mut self.inner, offset, buf);
        self.count_sync(Kind::Read(buf.len() as u64), r)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let r = ZonedDevice::write_at(&mut self.inner, offset, buf);
        let kind = Kind::Write {
            bytes: buf.len() as u64,
            fua: false,
            append: false,
        };
        self.count_sync(kind, r)
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        let r = self.inner.append(zone, buf);
        let kind = Kind::Write {
            bytes: buf.len() as u64,
            fua: false,
            append: true,
        };
        self.count_sync(kind, r)
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        let r = self.inner.manage(zone, action);
        let c = &self.counters;
        match (&r, action) {
            (Err(_), _) => add(&c.errors, 1),
            (Ok(()), ZoneAction::Open) => add(&c.zone_opens, 1),
            (Ok(()), ZoneAction::Close) => add(&c.zone_closes, 1),
            (Ok(()), ZoneAction::Finish) => add(&c.zone_finishes, 1),
            (Ok(()), ZoneAction::Reset) => add(&c.zone_resets, 1),
        }
        r
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        let r = ZonedDevice::flush(&mut self.inner);
        self.count_sync(Kind::Flush, r)
    }

    fn maintain(&mut self) -> u64 {
        ZonedDevice::maintain(&mut self.inner)
    }

    fn read_rebuilt(&mut self, offset: u64, buf: &mut [u8], attempt: u32) -> Result<(), ZoneError> {
        self.inner.read_rebuilt(offset, buf, attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, MemDevice, ZoneEmu, ZoneEmuConfig};

    /// A device with a second copy, which `read_rebuilt` reads (as a mirror does).
    struct TwoCopies(MemDevice, MemDevice);

    impl BlockDevice for TwoCopies {
        fn info(&self) -> &crate::DeviceInfo {
            self.0.info()
        }
        fn submit(&mut self, req: crate::IoRequest) {
            self.0.submit(req)
        }
        fn poll(
            &mut self,
            out: &mut Vec<crate::IoCompletion>,
            min_complete: usize,
        ) -> Result<usize, DeviceError> {
            self.0.poll(out, min_complete)
        }
        fn in_flight(&self) -> usize {
            self.0.in_flight()
        }
        fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
            self.0.read_at(offset, buf)
        }
        fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
            self.0.write_at(offset, buf)
        }
        fn flush(&mut self) -> Result<(), DeviceError> {
            self.0.flush()
        }
        fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
            self.0.discard(offset, len)
        }
        fn read_rebuilt(
            &mut self,
            offset: u64,
            buf: &mut [u8],
            attempt: u32,
        ) -> Result<(), DeviceError> {
            match attempt {
                0 => self.1.read_at(offset, buf),
                _ => Err(DeviceError::Unsupported {
                    op: crate::IoOpKind::Read,
                }),
            }
        }
    }

    #[test]
    fn passes_rebuilt_reads_through_and_counts_them() {
        let mut other = MemDevice::new(1 << 20, 4096).expect("mem");
        other.write_at(4096, &[7u8; 4096]).expect("write");
        let mut d = StatsDevice::new(TwoCopies(
            MemDevice::new(1 << 20, 4096).expect("mem"),
            other,
        ));
        let mut b = [0u8; 4096];
        BlockDevice::read_rebuilt(&mut d, 4096, &mut b, 0).expect("the other copy");
        assert_eq!(b, [7u8; 4096]);
        assert!(BlockDevice::read_rebuilt(&mut d, 4096, &mut b, 1).is_err());
        // The copy read counts; the attempt with no copy left moved nothing.
        assert_eq!(d.stats().read_bytes, 4096);
    }

    #[test]
    fn counts_block_io_through_a_handle_after_the_device_moved() {
        let d = StatsDevice::new(MemDevice::new(1 << 20, 4096).expect("mem"));
        let h = d.handle();
        // The device moves away (as into an engine); the handle still reads.
        let mut moved: Box<dyn BlockDevice + Send> = Box::new(d);
        moved.write_at(0, &[1u8; 8192]).expect("write");
        moved.read_at(0, &mut [0u8; 4096]).expect("read");
        moved.discard(0, 4096).expect("discard");
        moved.flush().expect("flush");
        assert!(moved.write_at(1, &[0u8; 4096]).is_err());
        moved.submit(IoRequest {
            tag: 77,
            op: IoOp::Write {
                offset: 8192,
                buf: IoBuf::zeroed(4096),
                fua: true,
            },
        });
        moved.submit(IoRequest {
            tag: 78,
            op: IoOp::Read {
                offset: 1 << 20,
                buf: IoBuf::zeroed(4096),
            },
        });
        let mut out = Vec::new();
        assert_eq!(moved.poll(&mut out, 2).expect("poll"), 2);
        let tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
        assert_eq!(tags, vec![77, 78], "caller tags come back");
        let s = h.snapshot();
        assert_eq!((s.writes, s.write_bytes, s.fua_writes), (2, 12288, 1));
        assert_eq!((s.reads, s.read_bytes), (1, 4096));
        assert_eq!((s.discards, s.discard_bytes, s.flushes), (1, 4096, 1));
        assert_eq!(s.errors, 2);
        let before = s;
        moved.write_at(0, &[1u8; 4096]).expect("write");
        let delta = h.snapshot().since(&before);
        assert_eq!((delta.writes, delta.write_bytes, delta.reads), (1, 4096, 0));
    }

    #[test]
    fn counts_zoned_io_and_management() {
        let mem = MemDevice::new(16384 + 4 * 65536, 4096).expect("mem");
        let emu = ZoneEmu::format(mem, &ZoneEmuConfig::new(65536)).expect("format");
        let mut d = StatsDevice::new(emu);
        let h = d.handle();
        d.append(0, &[1u8; 8192]).expect("append");
        d.write_at(8192, &[1u8; 4096]).expect("write");
        ZonedDevice::submit(
            &mut d,
            ZoneRequest {
                tag: 5,
                op: ZoneOp::Append {
                    zone: 1,
                    buf: IoBuf::zeroed(4096),
                    fua: false,
                },
            },
        );
        let mut out = Vec::new();
        ZonedDevice::poll(&mut d, &mut out, 1).expect("poll");
        assert_eq!(out[0].tag, 5);
        assert_eq!(out[0].result.as_ref().ok().copied().flatten(), Some(65536));
        d.finish_zone(0).expect("finish");
        d.reset_zone(0).expect("reset");
        assert!(d.close_zone(0).is_err());
        let s = h.snapshot();
        assert_eq!((s.writes, s.write_bytes), (3, 16384));
        assert_eq!((s.appends, s.append_bytes), (2, 12288));
        assert_eq!((s.zone_finishes, s.zone_resets, s.errors), (1, 1, 1));
    }
}
