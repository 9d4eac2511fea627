//! A run of a zoned device's zones as a zoned device of its own: one engine shard's
//! part of a zoned drive. Each shard opens the drive on its own (its own file, its
//! own io_uring) and sees only its zones, addressed from 0; the drive keeps the
//! zones' state, so the handles share nothing. The open and active zone limits are
//! the share the caller gives, so the shards together stay within the drive's.

use std::collections::VecDeque;

use crate::{
    DeviceError, IoOpKind, ZoneAction, ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp,
    ZoneRequest, ZonedDevice,
};

/// Zones `first..first + count` of `inner`, as zones `0..count`.
#[derive(Debug)]
pub struct ZoneRange<Z: ZonedDevice> {
    inner: Z,
    first: u32,
    /// Byte offset of zone `first` on `inner`.
    base: u64,
    geo: ZoneGeometry,
    /// Requests refused before reaching `inner`, answered by the next poll.
    early: VecDeque<ZoneCompletion>,
}

impl<Z: ZonedDevice> ZoneRange<Z> {
    /// `count` zones from `first`, with at most `max_open` open and `max_active`
    /// active zones (0: as the inner device). The zones must lie inside `inner`, and
    /// a limit may not exceed the inner device's.
    pub fn new(
        inner: Z,
        first: u32,
        count: u32,
        max_open: u32,
        max_active: u32,
    ) -> Result<ZoneRange<Z>, DeviceError> {
        let g = inner.geometry();
        if count == 0
            || first
                .checked_add(count)
                .is_none_or(|end| end > g.zone_count)
        {
            return Err(DeviceError::InvalidGeometry {
                reason: format!(
                    "zones {first}..{} are not inside {}'s {} zones",
                    u64::from(first) + u64::from(count),
                    g.name,
                    g.zone_count
                ),
            });
        }
        let limit = |share: u32, all: u32| match (share, all) {
            (0, all) => Ok(all),
            (share, 0) => Ok(share),
            (share, all) if share <= all => Ok(share),
            (share, all) => Err(DeviceError::InvalidGeometry {
                reason: format!("a share of {share} zones of a limit of {all}"),
            }),
        };
        let geo = ZoneGeometry {
            name: format!("{}[zones {first}+{count}]", g.name),
            zone_count: count,
            max_open_zones: limit(max_open, g.max_open_zones)?,
            max_active_zones: limit(max_active, g.max_active_zones)?,
            ..g.clone()
        };
        let base = g.zone_start(first);
        Ok(ZoneRange {
            inner,
            first,
            base,
            geo,
            early: VecDeque::new(),
        })
    }

    /// Shard `shard`'s equal share of `inner` among `shards`: zones `shard × per ..
    /// (shard + 1) × per` with `per` = zones / shards (the rest unused), and each
    /// zone limit divided alike (none stays none). Refused with the reason when a
    /// shard would get no zone or fewer than 2 open or active zones (a compaction and
    /// a GC zone).
    pub fn share_of(inner: Z, shard: usize, shards: usize) -> Result<ZoneRange<Z>, String> {
        let (first, count, open, active) = share(inner.geometry(), shard, shards)?;
        ZoneRange::new(inner, first, count, open, active).map_err(|e| e.to_string())
    }

    pub fn inner(&self) -> &Z {
        &self.inner
    }

    fn zone(&self, zone: u32) -> Result<u32, ZoneError> {
        if zone < self.geo.zone_count {
            Ok(zone + self.first)
        } else {
            Err(ZoneError::NoSuchZone {
                zone,
                count: self.geo.zone_count,
            })
        }
    }

    /// The inner offset of `offset..offset + len`, which must lie in the range.
    fn offset(&self, op: IoOpKind, offset: u64, len: u64) -> Result<u64, ZoneError> {
        let size = u64::from(self.geo.zone_count) * self.geo.zone_size;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DeviceError::OutOfRange {
                op,
                offset,
                len,
                size,
            }
            .into());
        }
        Ok(offset + self.base)
    }

    fn local(&self, mut info: ZoneInfo) -> ZoneInfo {
        info.index -= self.first;
        info.start -= self.base;
        info.write_pointer -= self.base;
        info
    }

    fn refuse(&mut self, tag: u64, buf: Option<crate::IoBuf>, e: ZoneError) {
        self.early.push_back(ZoneCompletion {
            tag,
            buf,
            result: Err(e),
        });
    }
}

/// A request's addresses in the device below (`offset` for reads and writes,
/// `zone` for appends), or why it cannot reach it, with its buffer back.
pub(crate) type Refused = (Option<crate::IoBuf>, ZoneError);

pub(crate) fn translate(
    op: ZoneOp,
    offset: impl Fn(IoOpKind, u64, u64) -> Result<u64, ZoneError>,
    zone: impl Fn(u32) -> Result<u32, ZoneError>,
) -> Result<ZoneOp, Refused> {
    Ok(match op {
        ZoneOp::Read { offset: at, buf } => match offset(IoOpKind::Read, at, buf.len() as u64) {
            Ok(at) => ZoneOp::Read { offset: at, buf },
            Err(e) => return Err((Some(buf), e)),
        },
        ZoneOp::Write {
            offset: at,
            buf,
            fua,
        } => match offset(IoOpKind::Write, at, buf.len() as u64) {
            Ok(at) => ZoneOp::Write {
                offset: at,
                buf,
                fua,
            },
            Err(e) => return Err((Some(buf), e)),
        },
        ZoneOp::Append { zone: z, buf, fua } => match zone(z) {
            Ok(z) => ZoneOp::Append { zone: z, buf, fua },
            Err(e) => return Err((Some(buf), e)),
        },
        ZoneOp::Flush => ZoneOp::Flush,
    })
}

/// `(first zone, zones, open limit, active limit)` of shard `shard` of `shards`
/// (see [`ZoneRange::share_of`]).
fn share(g: &ZoneGeometry, shard: usize, shards: usize) -> Result<(u32, u32, u32, u32), String> {
    let n = u32::try_from(shards)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{shards} shards"))?;
    let index = u32::try_from(shard)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| format!("shard {shard} of {shards}"))?;
    let per = g.zone_count / n;
    if per == 0 {
        return Err(format!("{shards} shards on {} zones", g.zone_count));
    }
    let limit = |l: u32, what: &str| match l {
        0 => Ok(0),
        l if l / n >= 2 => Ok(l / n),
        l => Err(format!(
            "{shards} shards share {l} {what} zones (at least 2 each: a compaction and a GC zone)"
        )),
    };
    Ok((
        index * per,
        per,
        limit(g.max_open_zones, "open")?,
        limit(g.max_active_zones, "active")?,
    ))
}

impl<Z: ZonedDevice> ZonedDevice for ZoneRange<Z> {
    fn geometry(&self) -> &ZoneGeometry {
        &self.geo
    }

    fn report_zones(
        &self,
        first: u32,
        count: u32,
        out: &mut Vec<ZoneInfo>,
    ) -> Result<(), ZoneError> {
        let end = first.saturating_add(count).min(self.geo.zone_count);
        if first >= end {
            return Ok(());
        }
        let start = out.len();
        self.inner
            .report_zones(first + self.first, end - first, out)?;
        for info in &mut out[start..] {
            *info = self.local(info.clone());
        }
        Ok(())
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        let z = self.zone(zone)?;
        Ok(self.local(self.inner.zone_info(z)?))
    }

    fn submit(&mut self, req: ZoneRequest) {
        let tag = req.tag;
        let op = match translate(
            req.op,
            |op, offset, len| self.offset(op, offset, len),
            |zone| self.zone(zone),
        ) {
            Ok(op) => op,
            Err((buf, e)) => return self.refuse(tag, buf, e),
        };
        self.inner.submit(ZoneRequest { tag, op });
    }

    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let early = self.early.len();
        out.extend(self.early.drain(..));
        let start = out.len();
        let n = self.inner.poll(out, min_complete.saturating_sub(early))?;
        let base = self.base;
        for c in &mut out[start..] {
            if let Ok(Some(at)) = &mut c.result {
                *at -= base;
            }
        }
        Ok(early + n)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.early.len()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        let at = self.offset(IoOpKind::Read, offset, buf.len() as u64)?;
        self.inner.read_at(at, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let at = self.offset(IoOpKind::Write, offset, buf.len() as u64)?;
        Ok(self.inner.write_at(at, buf)? - self.base)
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        let z = self.zone(zone)?;
        Ok(self.inner.append(z, buf)? - self.base)
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        let z = self.zone(zone)?;
        self.inner.manage(z, action)
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        self.inner.flush()
    }

    fn maintain(&mut self) -> u64 {
        self.inner.maintain()
    }

    fn read_rebuilt(&mut self, offset: u64, buf: &mut [u8], attempt: u32) -> Result<(), ZoneError> {
        let at = self.offset(IoOpKind::Read, offset, buf.len() as u64)?;
        self.inner.read_rebuilt(at, buf, attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, MemDevice, ZoneEmu, ZoneEmuConfig, ZoneState};

    fn emu(zones: u32) -> ZoneEmu<MemDevice> {
        let mut c = ZoneEmuConfig::new(1 << 20);
        c.zone_capacity = 768 << 10;
        c.zone_count_max = zones;
        c.max_open_zones = 6;
        c.max_active_zones = 8;
        let bytes = c.device_bytes_for(zones).expect("size");
        ZoneEmu::format(MemDevice::new(bytes, 4096).expect("mem"), &c).expect("format")
    }

    #[test]
    fn zones_of_the_range_addressed_from_zero() {
        let mut r = ZoneRange::new(emu(8), 3, 4, 3, 4).expect("range");
        let g = r.geometry().clone();
        assert_eq!(
            (g.zone_count, g.max_open_zones, g.max_active_zones),
            (4, 3, 4)
        );
        assert_eq!(r.write_at(1 << 20, &[7u8; 8192]).expect("zone 1"), 1 << 20);
        assert_eq!(r.append(1, &[8u8; 4096]).expect("append"), (1 << 20) + 8192);
        let inner = r.inner().zone_info(4).expect("inner zone 4");
        assert_eq!(inner.write_pointer, (4 << 20) + 12288);
        let info = r.zone_info(1).expect("info");
        assert_eq!(
            (info.index, info.start, info.write_pointer),
            (1, 1 << 20, (1 << 20) + 12288)
        );
        let mut zones = Vec::new();
        r.report_zones(0, 99, &mut zones).expect("report");
        let idx: Vec<u32> = zones.iter().map(|z| z.index).collect();
        assert_eq!(idx, [0, 1, 2, 3]);
        let mut b = [0u8; 8192];
        r.read_at(1 << 20, &mut b).expect("read");
        assert!(b.iter().all(|&x| x == 7));
        r.manage(1, ZoneAction::Finish).expect("finish");
        assert_eq!(r.zone_info(1).expect("info").state, ZoneState::Full);
        assert_eq!(
            r.inner().zone_info(4).expect("inner").state,
            ZoneState::Full
        );
        assert!(matches!(r.zone_info(4), Err(ZoneError::NoSuchZone { .. })));
        assert!(matches!(
            r.write_at(4 << 20, &[0u8; 4096]),
            Err(ZoneError::Device(DeviceError::OutOfRange { .. }))
        ));
        assert!(matches!(
            r.manage(4, ZoneAction::Reset),
            Err(ZoneError::NoSuchZone { .. })
        ));
    }

    #[test]
    fn asynchronous_requests_land_at_local_offsets() {
        let mut r = ZoneRange::new(emu(6), 2, 2, 0, 0).expect("range");
        assert_eq!(r.geometry().max_open_zones, 6, "the inner limit");
        for (tag, op) in [
            (
                1u64,
                ZoneOp::Write {
                    offset: 0,
                    buf: IoBuf::zeroed(4096),
                    fua: false,
                },
            ),
            (
                2,
                ZoneOp::Append {
                    zone: 1,
                    buf: IoBuf::zeroed(4096),
                    fua: true,
                },
            ),
            (3, ZoneOp::Flush),
            (
                4,
                ZoneOp::Read {
                    offset: 2 << 20,
                    buf: IoBuf::zeroed(4096),
                },
            ),
            (
                5,
                ZoneOp::Append {
                    zone: 2,
                    buf: IoBuf::zeroed(4096),
                    fua: false,
                },
            ),
        ] {
            r.submit(ZoneRequest { tag, op });
        }
        let mut out = Vec::new();
        while r.in_flight() > 0 {
            r.poll(&mut out, 1).expect("poll");
        }
        out.sort_by_key(|c| c.tag);
        let results: Vec<_> = out
            .iter()
            .map(|c| c.result.as_ref().ok().copied())
            .collect();
        assert_eq!(
            results,
            [Some(Some(0)), Some(Some(1 << 20)), Some(None), None, None],
            "a write, an append, the flush; a read past the range and an append to a \
             zone outside it are refused"
        );
        assert_eq!(
            r.inner().zone_info(3).expect("inner").write_pointer,
            (3 << 20) + 4096
        );
    }

    #[test]
    fn shards_get_equal_runs_and_limits() {
        let g = emu(10).geometry().clone();
        assert_eq!(
            share(&g, 0, 3),
            Ok((0, 3, 2, 2)),
            "open 6 / 3, active 8 / 3"
        );
        assert_eq!(share(&g, 2, 3), Ok((6, 3, 2, 2)), "zone 9 left unused");
        assert_eq!(share(&g, 1, 2), Ok((5, 5, 3, 4)));
        assert_eq!(share(&g, 0, 1), Ok((0, 10, 6, 8)));
        assert!(share(&g, 0, 4).is_err(), "6 open zones for 4 shards");
        assert!(share(&g, 3, 3).is_err());
        assert!(share(&g, 0, 0).is_err());
        let mut unlimited = g.clone();
        (unlimited.max_open_zones, unlimited.max_active_zones) = (0, 0);
        assert_eq!(share(&unlimited, 9, 10), Ok((9, 1, 0, 0)));
        assert!(share(&unlimited, 0, 11).is_err(), "no zone for a shard");
        let r = ZoneRange::share_of(emu(10), 1, 2).expect("share");
        assert_eq!(r.zone_info(0).expect("zone").start, 0);
        assert_eq!(r.inner().zone_info(5).expect("inner").index, 5);
        assert!(ZoneRange::share_of(emu(10), 0, 4)
            .expect_err("too few open zones")
            .contains("at least 2 each"));
    }

    #[test]
    fn ranges_outside_the_device_or_above_its_limits_are_refused() {
        assert!(ZoneRange::new(emu(4), 2, 3, 0, 0).is_err());
        assert!(ZoneRange::new(emu(4), 0, 0, 0, 0).is_err());
        assert!(ZoneRange::new(emu(4), u32::MAX, 2, 0, 0).is_err());
        assert!(ZoneRange::new(emu(4), 0, 2, 7, 0).is_err(), "open above 6");
        assert!(
            ZoneRange::new(emu(4), 0, 2, 0, 9).is_err(),
            "active above 8"
        );
    }
}
