//! One zoned device shared by the engine shards of a pool, each through a view of
//! its own: every view addresses all the zones, rotated so that shard `i`'s zone 0
//! (its label) is the device's zone `i * (zones / n)`, and owns a run of them from
//! there. Which zones a shard may write is the engine's business (region state
//! Foreign for the others: `shale-engine`'s `space/lend.rs`); the view only
//! translates addresses and routes each completion to the view that submitted it.
//!
//! The views share the device behind a mutex, held for one submission, one poll or
//! one synchronous call. A view that must wait for its completions first polls
//! without blocking a while (yielding between; through the daemon, one bench run
//! each, 4 KiB random writes reached 0.92× of shards in windows with 8 tries and
//! 1.02× with 256, reads 0.87× and 0.86×), then waits at the device for the
//! next completion, whoever's it is, with the lock held: the device then holds a
//! request of this view, so the wait ends, and other views' submissions wait at most
//! one device completion. Zone I/O comes in zone-group batches, so the lock is taken
//! a few times per 512 KiB, not per block.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::tags::Tags;
use crate::{
    BlockDevice, DeviceError, IoOp, IoOpKind, IoRequest, ZoneAction, ZoneCompletion, ZoneError,
    ZoneGeometry, ZoneInfo, ZoneOp, ZoneRequest, ZoneState, ZonedDevice,
};

/// A zone's readable bytes in `Readers::marks` when it is offline.
const OFFLINE: u64 = u64::MAX;

/// Reads of a view served by a handle of its own on the device below a zone
/// emulation (`SharedZones::split_with_readers`): no lock. A read needs no zone state
/// but the write pointer, which every view keeps in `marks` after each change it
/// makes under the lock (a zone's writes are its holder's alone, and a zone moves
/// between shards only empty).
struct Reader {
    dev: Box<dyn BlockDevice + Send>,
    /// Where zone 0 begins on `dev`.
    data_offset: u64,
    /// Each device zone's bytes readable from its start (its write pointer), or
    /// `OFFLINE`; shared by the views.
    marks: Arc<Vec<AtomicU64>>,
    in_flight: usize,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("data_offset", &self.data_offset)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

fn mark_of(info: &ZoneInfo) -> u64 {
    if info.state == ZoneState::Offline {
        OFFLINE
    } else {
        info.write_pointer - info.start
    }
}

/// Non-blocking polls a waiting view makes before it blocks at the device.
const SPINS: u32 = 256;

#[derive(Debug)]
struct Shared<Z> {
    inner: Z,
    /// The inner tag of each request in flight: its view and the view's own tag.
    tags: Tags<(usize, u64)>,
    /// Completions polled from the device, waiting for their view's next poll.
    done: Vec<VecDeque<ZoneCompletion>>,
}

/// One shard's view of a shared zoned device (see the module docs).
#[derive(Debug)]
pub struct SharedZones<Z: ZonedDevice> {
    shared: Arc<Mutex<Shared<Z>>>,
    view: usize,
    /// The device zone this view calls zone 0.
    rotate: u32,
    geo: ZoneGeometry,
    /// Requests refused before reaching the device, answered by the next poll.
    early: VecDeque<ZoneCompletion>,
    /// This view's requests at the device.
    in_flight: usize,
    /// Reads on a handle of the view's own, if it has one.
    reader: Option<Reader>,
}

impl<Z: ZonedDevice> SharedZones<Z> {
    /// `n` views of `inner`, view `i` rotated by `i * (zones / n)` zones, with an
    /// equal share of the open and active zone limits (at least 2 each).
    pub fn split(inner: Z, n: usize) -> Result<Vec<SharedZones<Z>>, String> {
        let g = inner.geometry().clone();
        let count = u32::try_from(n)
            .ok()
            .filter(|&c| c > 0 && c <= g.zone_count)
            .ok_or_else(|| format!("{n} views of {} zones", g.zone_count))?;
        let limit = |l: u32, what: &str| match l {
            0 => Ok(0),
            l if l / count >= 2 => Ok(l / count),
            l => Err(format!(
                "{n} shards share {l} {what} zones (at least 2 each: a compaction and a GC zone)"
            )),
        };
        let geo = ZoneGeometry {
            max_open_zones: limit(g.max_open_zones, "open")?,
            max_active_zones: limit(g.max_active_zones, "active")?,
            ..g.clone()
        };
        let shared = Arc::new(Mutex::new(Shared {
            inner,
            tags: Tags::new(),
            done: (0..n).map(|_| VecDeque::new()).collect(),
        }));
        let per = g.zone_count / count;
        Ok((0..n)
            .map(|view| SharedZones {
                shared: Arc::clone(&shared),
                view,
                rotate: view as u32 * per,
                geo: geo.clone(),
                early: VecDeque::new(),
                in_flight: 0,
                reader: None,
            })
            .collect())
    }

    /// As [`SharedZones::split`], each view also reading zones straight from a
    /// handle of its own on the device below the zone emulation (`readers[i]` for
    /// view `i`, each opened on the same device; zone 0 at `data_offset` on it, as
    /// `ZoneEmu::data_offset` says): reads take no lock. Only for a zone emulation
    /// over a plain device, whose reads are reads of that device.
    pub fn split_with_readers(
        inner: Z,
        readers: Vec<Box<dyn BlockDevice + Send>>,
        data_offset: u64,
    ) -> Result<Vec<SharedZones<Z>>, String> {
        let n = readers.len();
        let mut infos = Vec::new();
        inner
            .report_zones(0, inner.geometry().zone_count, &mut infos)
            .map_err(|e| format!("zone report: {e}"))?;
        let marks: Arc<Vec<AtomicU64>> =
            Arc::new(infos.iter().map(|i| AtomicU64::new(mark_of(i))).collect());
        let mut views = Self::split(inner, n)?;
        for (v, dev) in views.iter_mut().zip(readers) {
            v.reader = Some(Reader {
                dev,
                data_offset,
                marks: Arc::clone(&marks),
                in_flight: 0,
            });
        }
        Ok(views)
    }

    /// After a change to device zone `zone` made under the lock: its readable bytes
    /// for the views' readers.
    fn remark(&self, s: &Shared<Z>, zone: u32) {
        if let Some(r) = &self.reader {
            if let (Ok(info), Some(m)) = (s.inner.zone_info(zone), r.marks.get(zone as usize)) {
                m.store(mark_of(&info), Ordering::Release);
            }
        }
    }

    /// The device offset of a read of `offset..offset + len` by this view's reader,
    /// checked against the zone's write pointer as the device would.
    fn reader_offset(&self, offset: u64, len: u64) -> Result<u64, ZoneError> {
        let at = self.offset(IoOpKind::Read, offset, len)?;
        self.geo.check_io_size(IoOpKind::Read, offset, len)?;
        let zs = self.geo.zone_size;
        let zone = (at / zs) as u32;
        let Some(r) = &self.reader else {
            return Ok(at);
        };
        let mark = r
            .marks
            .get(zone as usize)
            .map_or(0, |m| m.load(Ordering::Acquire));
        let local = self.view_zone(zone);
        if mark == OFFLINE {
            return Err(ZoneError::Offline { zone: local });
        }
        if at % zs + len > mark {
            return Err(ZoneError::ReadPastWritePointer {
                zone: local,
                offset,
                len,
                write_pointer: u64::from(local) * zs + mark,
            });
        }
        Ok(r.data_offset + at)
    }

    /// Moves the reader's completions into `out`, waiting for at least `wait`.
    fn collect_reads(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        wait: usize,
    ) -> Result<usize, DeviceError> {
        let Some(r) = &mut self.reader else {
            return Ok(0);
        };
        if r.in_flight == 0 {
            return Ok(0);
        }
        let mut done = Vec::new();
        r.dev.poll(&mut done, wait.min(r.in_flight))?;
        let n = done.len();
        r.in_flight -= n;
        out.extend(done.into_iter().map(|c| ZoneCompletion {
            tag: c.tag,
            buf: c.buf,
            result: c.result.map(|()| None).map_err(ZoneError::from),
        }));
        Ok(n)
    }

    fn reads_in_flight(&self) -> usize {
        self.reader.as_ref().map_or(0, |r| r.in_flight)
    }

    /// The device zone this view's zone `zone` is.
    pub fn device_zone(&self, zone: u32) -> u32 {
        ((u64::from(zone) + u64::from(self.rotate)) % u64::from(self.geo.zone_count)) as u32
    }

    /// This view's zone for device zone `zone`.
    pub fn view_zone(&self, zone: u32) -> u32 {
        let n = u64::from(self.geo.zone_count);
        ((u64::from(zone) + n - u64::from(self.rotate)) % n) as u32
    }

    /// The device back, once every other view is dropped (this view back if not).
    pub fn into_inner(self) -> Result<Z, Box<SharedZones<Z>>> {
        match Arc::try_unwrap(self.shared) {
            Ok(m) => Ok(m.into_inner().unwrap_or_else(PoisonError::into_inner).inner),
            Err(shared) => Err(Box::new(SharedZones { shared, ..self })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared<Z>> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn zone(&self, zone: u32) -> Result<u32, ZoneError> {
        if zone < self.geo.zone_count {
            Ok(self.device_zone(zone))
        } else {
            Err(ZoneError::NoSuchZone {
                zone,
                count: self.geo.zone_count,
            })
        }
    }

    /// The device offset of `offset..offset + len`, which must lie in one zone of
    /// this view (its zones are contiguous on the device only up to the wrap).
    fn offset(&self, op: IoOpKind, offset: u64, len: u64) -> Result<u64, ZoneError> {
        let zs = self.geo.zone_size;
        let size = u64::from(self.geo.zone_count) * zs;
        let out = || DeviceError::OutOfRange {
            op,
            offset,
            len,
            size,
        };
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= size)
            .ok_or_else(out)?;
        let first = offset / zs;
        if len > 0 && (end - 1) / zs != first {
            return Err(out().into());
        }
        Ok(u64::from(self.device_zone(first as u32)) * zs + offset % zs)
    }

    /// A device offset as this view's.
    fn local_offset(&self, at: u64) -> u64 {
        let zs = self.geo.zone_size;
        u64::from(self.view_zone((at / zs) as u32)) * zs + at % zs
    }

    fn local(&self, mut info: ZoneInfo) -> ZoneInfo {
        let base = u64::from(info.index) * self.geo.zone_size;
        let wp = info.write_pointer - base;
        info.index = self.view_zone(info.index);
        info.start = u64::from(info.index) * self.geo.zone_size;
        info.write_pointer = info.start + wp;
        info
    }

    fn refuse(&mut self, tag: u64, buf: Option<crate::IoBuf>, e: ZoneError) {
        self.early.push_back(ZoneCompletion {
            tag,
            buf,
            result: Err(e),
        });
    }

    /// Moves this view's routed completions into `out`, after one poll of the device
    /// for at least `wait` completions (0: without blocking); completions of other
    /// views wait in their queues.
    fn collect(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        wait: usize,
    ) -> Result<usize, DeviceError> {
        let mut polled = Vec::new();
        let mine: Vec<ZoneCompletion> = {
            let mut s = self.lock();
            // Only wait when this view's own completions are not already routed.
            let wait = if s.done[self.view].is_empty() {
                wait
            } else {
                0
            };
            s.inner.poll(&mut polled, wait)?;
            for mut c in polled {
                let Some((view, tag)) = s.tags.take(c.tag) else {
                    continue;
                };
                c.tag = tag;
                s.done[view].push_back(c);
            }
            s.done[self.view].drain(..).collect()
        };
        let n = mine.len();
        for mut c in mine {
            if let Ok(Some(at)) = &mut c.result {
                *at = self.local_offset(*at);
            }
            out.push(c);
        }
        self.in_flight -= n;
        Ok(n)
    }
}

impl<Z: ZonedDevice> ZonedDevice for SharedZones<Z> {
    fn geometry(&self) -> &ZoneGeometry {
        &self.geo
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        let z = self.zone(zone)?;
        let info = self.lock().inner.zone_info(z)?;
        Ok(self.local(info))
    }

    fn submit(&mut self, req: ZoneRequest) {
        let tag = req.tag;
        let req = match req.op {
            ZoneOp::Read { offset, buf } if self.reader.is_some() => {
                let at = match self.reader_offset(offset, buf.len() as u64) {
                    Ok(at) => at,
                    Err(e) => return self.refuse(tag, Some(buf), e),
                };
                if let Some(r) = &mut self.reader {
                    r.dev.submit(IoRequest {
                        tag,
                        op: IoOp::Read { offset: at, buf },
                    });
                    r.in_flight += 1;
                }
                return;
            }
            op => ZoneRequest { tag, op },
        };
        let op = match crate::zone_range::translate(
            req.op,
            |op, offset, len| self.offset(op, offset, len),
            |zone| self.zone(zone),
        ) {
            Ok(op) => op,
            Err((buf, e)) => return self.refuse(tag, buf, e),
        };
        let view = self.view;
        let zone = zone_of_op(&op, self.geo.zone_size);
        let mut s = self.lock();
        let inner_tag = s.tags.insert((view, tag));
        s.inner.submit(ZoneRequest { tag: inner_tag, op });
        if let Some(z) = zone {
            self.remark(&s, z);
        }
        drop(s);
        self.in_flight += 1;
    }

    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let early = self.early.len();
        out.extend(self.early.drain(..));
        let want = min_complete
            .saturating_sub(early)
            .min(self.in_flight + self.reads_in_flight());
        let mut n = self.collect_reads(out, 0)? + self.collect(out, 0)?;
        let mut tries = 0;
        while n < want {
            // Only reads outstanding: wait at the view's own handle.
            if self.in_flight == 0 {
                n += self.collect_reads(out, 1)?;
                continue;
            }
            // A fast device answers within a few yields; a slow one is waited on.
            tries += 1;
            let wait = if tries > SPINS && self.reads_in_flight() == 0 {
                1
            } else {
                0
            };
            if wait == 0 {
                std::thread::yield_now();
            }
            n += self.collect_reads(out, 0)? + self.collect(out, wait)?;
        }
        Ok(early + n)
    }

    fn in_flight(&self) -> usize {
        self.in_flight + self.reads_in_flight() + self.early.len()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        if self.reader.is_some() {
            let at = self.reader_offset(offset, buf.len() as u64)?;
            if let Some(r) = &mut self.reader {
                return Ok(r.dev.read_at(at, buf)?);
            }
        }
        let at = self.offset(IoOpKind::Read, offset, buf.len() as u64)?;
        self.lock().inner.read_at(at, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let at = self.offset(IoOpKind::Write, offset, buf.len() as u64)?;
        let s = &mut *self.lock();
        let landed = s.inner.write_at(at, buf);
        self.remark(s, (at / self.geo.zone_size) as u32);
        Ok(self.local_offset(landed?))
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        let z = self.zone(zone)?;
        let s = &mut *self.lock();
        let landed = s.inner.append(z, buf);
        self.remark(s, z);
        Ok(self.local_offset(landed?))
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        let z = self.zone(zone)?;
        let s = &mut *self.lock();
        let r = s.inner.manage(z, action);
        self.remark(s, z);
        r
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        self.lock().inner.flush()
    }

    fn maintain(&mut self) -> u64 {
        self.lock().inner.maintain()
    }

    fn read_rebuilt(&mut self, offset: u64, buf: &mut [u8], attempt: u32) -> Result<(), ZoneError> {
        let at = self.offset(IoOpKind::Read, offset, buf.len() as u64)?;
        self.lock().inner.read_rebuilt(at, buf, attempt)
    }
}

/// The device zone a translated request changes (writes, appends, zone actions);
/// `None` for a read.
fn zone_of_op(op: &ZoneOp, zone_size: u64) -> Option<u32> {
    match op {
        ZoneOp::Read { .. } | ZoneOp::Flush => None,
        ZoneOp::Write { offset, .. } => Some((offset / zone_size) as u32),
        ZoneOp::Append { zone, .. } => Some(*zone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, MemDevice, ZoneEmu, ZoneEmuConfig, ZoneOp, ZoneState};

    fn emu(zones: u32) -> ZoneEmu<MemDevice> {
        let inner = MemDevice::new(u64::from(zones + 2) * 65536, 4096).expect("test setup");
        let mut c = ZoneEmuConfig::new(65536);
        c.zone_count_max = zones;
        c.max_open_zones = 8;
        c.max_active_zones = 8;
        ZoneEmu::format(inner, &c).expect("test setup")
    }

    #[test]
    fn views_are_rotated_and_share_the_zones_state() {
        let mut v = SharedZones::split(emu(12), 3).expect("test setup");
        assert_eq!(v[1].geometry().zone_count, 12);
        assert_eq!(v[1].geometry().max_open_zones, 2);
        assert_eq!((v[1].device_zone(0), v[2].device_zone(5)), (4, 1));
        assert_eq!(v[2].view_zone(1), 5);
        // View 1 writes its zone 0 (the device's zone 4); view 0 sees it as its zone 4.
        let landed = v[1].append(0, &[7u8; 4096]).expect("test setup");
        assert_eq!(landed, 0);
        let info = v[0].zone_info(4).expect("test setup");
        assert_eq!((info.index, info.start), (4, 4 * 65536));
        assert_eq!(info.write_pointer, 4 * 65536 + 4096);
        assert_eq!(info.state, ZoneState::ImplicitlyOpen);
        let mut buf = [0u8; 4096];
        v[0].read_at(4 * 65536, &mut buf).expect("test setup");
        assert_eq!(buf, [7u8; 4096]);
        // View 2 calls device zone 4 its zone 8 ((8 + 8) % 12).
        v[2].manage(8, ZoneAction::Reset).expect("test setup");
        assert_eq!(
            v[1].zone_info(0).expect("test setup").state,
            ZoneState::Empty
        );
        let mut all = Vec::new();
        v[2].report_zones(0, 12, &mut all).expect("test setup");
        assert!(all.iter().enumerate().all(|(i, z)| z.index == i as u32));
    }

    #[test]
    fn completions_go_to_the_view_that_submitted_them() {
        let mut v = SharedZones::split(emu(8), 2).expect("test setup");
        for (i, view) in v.iter_mut().enumerate() {
            view.submit(ZoneRequest {
                tag: 100 + i as u64,
                op: ZoneOp::Append {
                    zone: 1,
                    buf: IoBuf::from_slice(&[i as u8; 4096]),
                    fua: false,
                },
            });
        }
        let mut out = Vec::new();
        assert_eq!(v[1].poll(&mut out, 1).expect("test setup"), 1);
        assert_eq!(out[0].tag, 101);
        // View 1's zone 1 is the device's zone 5, its offset in view 1's terms.
        assert_eq!(out[0].result.as_ref().expect("test setup"), &Some(65536));
        assert_eq!((v[0].in_flight(), v[1].in_flight()), (1, 0));
        out.clear();
        assert_eq!(v[0].poll(&mut out, 1).expect("test setup"), 1);
        assert_eq!(out[0].tag, 100);
        assert_eq!(out[0].result.as_ref().expect("test setup"), &Some(65536));
    }

    #[test]
    fn views_read_on_their_own_handles_below_the_write_pointer_only() {
        let dir = tempfile::tempdir().expect("test setup");
        let path = dir.path().join("cap");
        std::fs::write(&path, vec![0u8; 10 * 65536]).expect("test setup");
        let open = || crate::FileDevice::open(&path).expect("test setup");
        let mut c = ZoneEmuConfig::new(65536);
        c.zone_count_max = 8;
        c.max_open_zones = 8;
        c.max_active_zones = 8;
        let emu = ZoneEmu::format(open(), &c).expect("test setup");
        let off = emu.data_offset();
        let readers: Vec<Box<dyn crate::BlockDevice + Send>> =
            vec![Box::new(open()), Box::new(open())];
        let mut v = SharedZones::split_with_readers(emu, readers, off).expect("test setup");
        // View 1 writes its zone 1 (the device's zone 5) and reads it back, on its own
        // handle, asynchronously and synchronously.
        v[1].append(1, &[7u8; 8192]).expect("test setup");
        let mut b = [0u8; 8192];
        v[1].read_at(65536, &mut b).expect("test setup");
        assert_eq!(b, [7u8; 8192]);
        v[1].submit(ZoneRequest {
            tag: 3,
            op: ZoneOp::Read {
                offset: 65536 + 4096,
                buf: IoBuf::zeroed(4096),
            },
        });
        assert_eq!(v[1].in_flight(), 1);
        let mut out = Vec::new();
        assert_eq!(v[1].poll(&mut out, 1).expect("test setup"), 1);
        assert_eq!((out[0].tag, out[0].result.as_ref().ok()), (3, Some(&None)));
        assert_eq!(
            &out[0].buf.as_ref().expect("test setup")[..],
            &[7u8; 4096][..]
        );
        // Past the write pointer: refused, as the device refuses it.
        let r = v[1].read_at(65536 + 8192, &mut b[..4096]);
        assert!(
            matches!(r, Err(ZoneError::ReadPastWritePointer { zone: 1, .. })),
            "{r:?}"
        );
        // View 0 sees the device's zone 5 as its zone 5, written by the other view.
        v[0].read_at(5 * 65536, &mut b).expect("test setup");
        assert_eq!(b, [7u8; 8192]);
        // Reset by its holder: nothing is readable there any more, for any view.
        v[1].manage(1, ZoneAction::Reset).expect("test setup");
        assert!(v[0].read_at(5 * 65536, &mut b[..4096]).is_err());
        assert!(v[1].read_at(65536, &mut b[..4096]).is_err());
    }

    #[test]
    fn io_across_a_zone_edge_or_past_the_device_is_refused() {
        let mut v = SharedZones::split(emu(8), 2).expect("test setup");
        let mut buf = vec![0u8; 8192];
        assert!(v[1].read_at(65536 - 4096, &mut buf).is_err());
        assert!(v[1].read_at(8 * 65536, &mut buf[..4096]).is_err());
        assert!(v[1].manage(8, ZoneAction::Reset).is_err());
        v[1].submit(ZoneRequest {
            tag: 9,
            op: ZoneOp::Read {
                offset: 8 * 65536,
                buf: IoBuf::zeroed(4096),
            },
        });
        let mut out = Vec::new();
        assert_eq!(v[1].poll(&mut out, 1).expect("test setup"), 1);
        assert!(out[0].result.is_err());
        assert!(
            SharedZones::split(emu(8), 5).is_err(),
            "8 open zones over 5"
        );
        drop(v.pop());
        assert!(v.pop().expect("test setup").into_inner().is_ok());
    }
}
