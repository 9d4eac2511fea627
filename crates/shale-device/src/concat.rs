//! Two zoned devices with the same zones as one: the first's zones, then the
//! second's. A zoned drive with conventional zones first is zone emulation over
//! those (its metadata may be rewritten in place there) followed by the drive's
//! sequential zones.

use crate::tags::Tags;
use crate::{
    DeviceError, IoOpKind, ZoneAction, ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp,
    ZoneRequest, ZonedDevice,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    First,
    Second,
}

#[derive(Debug)]
enum Slot {
    /// A read or write on one side.
    One { user_tag: u64 },
    /// A flush sent to both sides; done when both are.
    Flush {
        user_tag: u64,
        left: u8,
        error: Option<ZoneError>,
    },
}

/// `first`'s zones, then `second`'s, as one zoned device.
#[derive(Debug)]
pub struct ZonedConcat<A: ZonedDevice, B: ZonedDevice> {
    first: A,
    second: B,
    geo: ZoneGeometry,
    /// Zones of `first`.
    split: u32,
    slots: Tags<Slot>,
    user_in_flight: usize,
    scratch: Vec<ZoneCompletion>,
}

impl<A: ZonedDevice, B: ZonedDevice> ZonedConcat<A, B> {
    /// Both devices must have the same zone size, capacity and block size. The
    /// zone limits are the second's (the first is meant to have none): the caller
    /// keeps all of its open zones within them.
    pub fn new(first: A, second: B) -> Result<ZonedConcat<A, B>, DeviceError> {
        let (a, b) = (first.geometry(), second.geometry());
        if a.zone_size != b.zone_size
            || a.zone_capacity != b.zone_capacity
            || a.logical_block_size != b.logical_block_size
        {
            return Err(DeviceError::InvalidGeometry {
                reason: format!(
                    "zones differ: {} ({} of {} bytes, {} writable) and {} ({} of {}, {})",
                    a.name,
                    a.zone_count,
                    a.zone_size,
                    a.zone_capacity,
                    b.name,
                    b.zone_count,
                    b.zone_size,
                    b.zone_capacity
                ),
            });
        }
        let zone_count =
            a.zone_count
                .checked_add(b.zone_count)
                .ok_or_else(|| DeviceError::InvalidGeometry {
                    reason: "too many zones".into(),
                })?;
        let geo = ZoneGeometry {
            name: format!("{}+{}", a.name, b.name),
            zone_count,
            max_io_bytes: a.max_io_bytes.min(b.max_io_bytes),
            write_unit: a.write_unit.max(b.write_unit),
            ..b.clone()
        };
        let split = a.zone_count;
        Ok(ZonedConcat {
            first,
            second,
            geo,
            split,
            slots: Tags::new(),
            user_in_flight: 0,
            scratch: Vec::new(),
        })
    }

    /// A fast tier (`fast`) and a cold one (`cold`, a slower device) as one device,
    /// the cold zones last: the zone limits are the fast device's, as the engine
    /// keeps at most one cold zone open (GC's), which the cold device must allow.
    pub fn tiers(fast: A, cold: B) -> Result<ZonedConcat<A, B>, DeviceError> {
        let (f, c) = (fast.geometry(), cold.geometry());
        let (open, active) = (f.max_open_zones, f.max_active_zones);
        if [c.max_open_zones, c.max_active_zones]
            .iter()
            .any(|&l| l > 0 && l < 2)
        {
            return Err(DeviceError::InvalidGeometry {
                reason: format!(
                    "the cold tier {} allows {} open and {} active zones: at least 2 are needed",
                    c.name, c.max_open_zones, c.max_active_zones
                ),
            });
        }
        let mut t = ZonedConcat::new(fast, cold)?;
        t.geo.max_open_zones = open;
        t.geo.max_active_zones = active;
        Ok(t)
    }

    /// The two devices back, `first` then `second`.
    pub fn into_parts(self) -> (A, B) {
        (self.first, self.second)
    }

    pub fn first(&self) -> &A {
        &self.first
    }

    pub fn second(&self) -> &B {
        &self.second
    }

    /// The side holding `zone`, and the zone's index there.
    fn side_of_zone(&self, zone: u32) -> Result<(Side, u32), ZoneError> {
        if zone < self.split {
            Ok((Side::First, zone))
        } else if zone < self.geo.zone_count {
            Ok((Side::Second, zone - self.split))
        } else {
            Err(ZoneError::NoSuchZone {
                zone,
                count: self.geo.zone_count,
            })
        }
    }

    /// The side holding byte `offset`, and the offset there.
    fn side_of(&self, op: IoOpKind, offset: u64, len: u64) -> Result<(Side, u64), ZoneError> {
        let zone = offset / self.geo.zone_size;
        let size = u64::from(self.geo.zone_count) * self.geo.zone_size;
        if zone >= u64::from(self.geo.zone_count) {
            return Err(DeviceError::OutOfRange {
                op,
                offset,
                len,
                size,
            }
            .into());
        }
        let base = u64::from(self.split) * self.geo.zone_size;
        if zone < u64::from(self.split) {
            Ok((Side::First, offset))
        } else {
            Ok((Side::Second, offset - base))
        }
    }

    fn base(&self, side: Side) -> u64 {
        match side {
            Side::First => 0,
            Side::Second => u64::from(self.split) * self.geo.zone_size,
        }
    }

    fn send(&mut self, side: Side, tag: u64, op: ZoneOp) {
        let req = ZoneRequest { tag, op };
        match side {
            Side::First => self.first.submit(req),
            Side::Second => self.second.submit(req),
        }
    }

    /// Turns inner completions into the caller's.
    fn finish(
        &mut self,
        inner: &mut Vec<ZoneCompletion>,
        side: Side,
        out: &mut Vec<ZoneCompletion>,
    ) {
        let base = self.base(side);
        for ZoneCompletion { tag, buf, result } in inner.drain(..) {
            if let Some(Slot::Flush { left, error, .. }) = self.slots.get_mut(tag) {
                if let Err(e) = result {
                    error.get_or_insert(e);
                }
                *left -= 1;
                if *left > 0 {
                    continue;
                }
                if let Some(Slot::Flush {
                    user_tag, error, ..
                }) = self.slots.take(tag)
                {
                    out.push(ZoneCompletion {
                        tag: user_tag,
                        buf: None,
                        result: error.map_or(Ok(None), Err),
                    });
                }
                continue;
            }
            let Some(Slot::One { user_tag }) = self.slots.take(tag) else {
                panic!("zoned concat: a member completed unknown tag {tag}");
            };
            out.push(ZoneCompletion {
                tag: user_tag,
                buf,
                result: result.map(|at| at.map(|a| a + base)),
            });
        }
    }

    fn on(&mut self, side: Side) -> &mut dyn ZonedDevice {
        match side {
            Side::First => &mut self.first,
            Side::Second => &mut self.second,
        }
    }
}

impl<A: ZonedDevice, B: ZonedDevice> ZonedDevice for ZonedConcat<A, B> {
    fn geometry(&self) -> &ZoneGeometry {
        &self.geo
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        let (side, z) = self.side_of_zone(zone)?;
        let mut info = match side {
            Side::First => self.first.zone_info(z)?,
            Side::Second => self.second.zone_info(z)?,
        };
        let base = self.base(side);
        info.index = zone;
        info.start += base;
        info.write_pointer += base;
        Ok(info)
    }

    fn submit(&mut self, req: ZoneRequest) {
        self.user_in_flight += 1;
        let user_tag = req.tag;
        let fail = |this: &mut Self, buf, e| {
            // Refused here: completed through the first side's next poll would need a
            // request there, so it is kept as a slot that the next poll returns.
            this.scratch.push(ZoneCompletion {
                tag: user_tag,
                buf,
                result: Err(e),
            });
        };
        match req.op {
            ZoneOp::Read { offset, buf } => {
                match self.side_of(IoOpKind::Read, offset, buf.len() as u64) {
                    Ok((side, off)) => {
                        let t = self.slots.insert(Slot::One { user_tag });
                        self.send(side, t, ZoneOp::Read { offset: off, buf });
                    }
                    Err(e) => fail(self, Some(buf), e),
                }
            }
            ZoneOp::Write { offset, buf, fua } => {
                match self.side_of(IoOpKind::Write, offset, buf.len() as u64) {
                    Ok((side, off)) => {
                        let t = self.slots.insert(Slot::One { user_tag });
                        self.send(
                            side,
                            t,
                            ZoneOp::Write {
                                offset: off,
                                buf,
                                fua,
                            },
                        );
                    }
                    Err(e) => fail(self, Some(buf), e),
                }
            }
            ZoneOp::Append { zone, buf, fua } => match self.side_of_zone(zone) {
                Ok((side, z)) => {
                    let t = self.slots.insert(Slot::One { user_tag });
                    self.send(side, t, ZoneOp::Append { zone: z, buf, fua });
                }
                Err(e) => fail(self, Some(buf), e),
            },
            ZoneOp::Flush => {
                let t = self.slots.insert(Slot::Flush {
                    user_tag,
                    left: 2,
                    error: None,
                });
                self.send(Side::First, t, ZoneOp::Flush);
                self.send(Side::Second, t, ZoneOp::Flush);
            }
        }
    }

    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let target = min_complete.min(self.user_in_flight);
        let start = out.len();
        out.append(&mut self.scratch);
        let mut inner = Vec::new();
        loop {
            // Whatever either side has finished, without waiting.
            self.first.poll(&mut inner, 0)?;
            self.finish(&mut inner, Side::First, out);
            self.second.poll(&mut inner, 0)?;
            self.finish(&mut inner, Side::Second, out);
            if out.len() - start >= target {
                break;
            }
            // Then wait on a side with work: the drive first, it is the busy one.
            let side = if self.second.in_flight() > 0 {
                Side::Second
            } else if self.first.in_flight() > 0 {
                Side::First
            } else {
                break;
            };
            self.on(side).poll(&mut inner, 1)?;
            self.finish(&mut inner, side, out);
            if out.len() - start >= target {
                break;
            }
        }
        let added = out.len() - start;
        self.user_in_flight -= added;
        Ok(added)
    }

    fn in_flight(&self) -> usize {
        self.user_in_flight
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        let (side, off) = self.side_of(IoOpKind::Read, offset, buf.len() as u64)?;
        self.on(side).read_at(off, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let (side, off) = self.side_of(IoOpKind::Write, offset, buf.len() as u64)?;
        let base = self.base(side);
        Ok(self.on(side).write_at(off, buf)? + base)
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        let (side, z) = self.side_of_zone(zone)?;
        let base = self.base(side);
        Ok(self.on(side).append(z, buf)? + base)
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        let (side, z) = self.side_of_zone(zone)?;
        self.on(side).manage(z, action)
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        self.first.flush()?;
        self.second.flush()
    }

    fn maintain(&mut self) -> u64 {
        self.first.maintain().min(self.second.maintain())
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
        let bytes = c.device_bytes_for(zones).expect("size");
        ZoneEmu::format(MemDevice::new(bytes, 4096).expect("mem"), &c).expect("format")
    }

    #[test]
    fn zones_of_both_sides_in_one_address_space() {
        let mut c = ZonedConcat::new(emu(2), emu(3)).expect("concat");
        assert_eq!(c.geometry().zone_count, 5);
        c.write_at(0, &[1u8; 4096]).expect("zone 0");
        let at = c.write_at(3 << 20, &[3u8; 8192]).expect("zone 3");
        assert_eq!(at, 3 << 20);
        assert_eq!(c.append(4, &[4u8; 4096]).expect("append"), 4 << 20);
        let info = c.zone_info(3).expect("info");
        assert_eq!(
            (info.index, info.start, info.write_pointer),
            (3, 3 << 20, (3 << 20) + 8192)
        );
        assert_eq!(
            c.second().zone_info(1).expect("inner").write_pointer,
            (1 << 20) + 8192
        );
        let mut b = [0u8; 8192];
        c.read_at(3 << 20, &mut b).expect("read");
        assert!(b.iter().all(|&x| x == 3));
        c.manage(3, ZoneAction::Finish).expect("finish");
        assert_eq!(c.zone_info(3).expect("info").state, ZoneState::Full);
        assert!(matches!(c.zone_info(5), Err(ZoneError::NoSuchZone { .. })));
        assert!(matches!(
            c.write_at(5 << 20, &[0u8; 4096]),
            Err(ZoneError::Device(DeviceError::OutOfRange { .. }))
        ));
    }

    /// Tiers take the fast device's zone limits; a cold device that cannot keep two
    /// zones open is refused by name.
    #[test]
    fn tiers_take_the_fast_limits() {
        let mut fast = ZoneEmuConfig::new(1 << 20);
        fast.zone_count_max = 4;
        fast.max_open_zones = 6;
        let bytes = fast.device_bytes_for(4).expect("size");
        let fast = ZoneEmu::format(MemDevice::new(bytes, 4096).expect("mem"), &fast).expect("fmt");
        let mut cold = ZoneEmuConfig::new(1 << 20);
        cold.zone_count_max = 3;
        cold.max_open_zones = 128;
        let bytes = cold.device_bytes_for(3).expect("size");
        let c = ZoneEmu::format(MemDevice::new(bytes, 4096).expect("mem"), &cold).expect("fmt");
        let t = ZonedConcat::tiers(fast, c).expect("tiers");
        assert_eq!(t.geometry().zone_count, 7);
        assert_eq!(t.geometry().max_open_zones, 6);
        cold.max_open_zones = 1;
        let c = ZoneEmu::format(MemDevice::new(bytes, 4096).expect("mem"), &cold).expect("fmt");
        let err = ZonedConcat::tiers(emu(2), c).expect_err("one open zone");
        assert!(err.to_string().contains("at least 2"), "{err}");
    }

    #[test]
    fn asynchronous_requests_and_a_flush_across_both_sides() {
        let mut c = ZonedConcat::new(emu(1), emu(2)).expect("concat");
        for (tag, offset) in [(1u64, 0u64), (2, 1 << 20), (3, 2 << 20)] {
            c.submit(ZoneRequest {
                tag,
                op: ZoneOp::Write {
                    offset,
                    buf: IoBuf::zeroed(4096),
                    fua: false,
                },
            });
        }
        c.submit(ZoneRequest {
            tag: 9,
            op: ZoneOp::Flush,
        });
        c.submit(ZoneRequest {
            tag: 10,
            op: ZoneOp::Read {
                offset: 9 << 20,
                buf: IoBuf::zeroed(4096),
            },
        });
        let mut out = Vec::new();
        while out.len() < 5 {
            c.poll(&mut out, 5).expect("poll");
        }
        assert_eq!(c.in_flight(), 0);
        out.sort_by_key(|x| x.tag);
        let landed: Vec<Option<u64>> = out[..3]
            .iter()
            .map(|x| *x.result.as_ref().expect("write"))
            .collect();
        assert_eq!(landed, [Some(0), Some(1 << 20), Some(2 << 20)]);
        assert!(matches!(out[3].result, Ok(None)), "the flush");
        assert!(out[4].result.is_err(), "a read past the end");
    }

    #[test]
    fn sides_with_other_zones_are_refused() {
        let mut other = ZoneEmuConfig::new(1 << 20);
        other.zone_count_max = 2;
        let b = ZoneEmu::format(
            MemDevice::new(other.device_bytes_for(2).expect("size"), 4096).expect("mem"),
            &other,
        )
        .expect("format");
        assert!(ZonedConcat::new(emu(1), b).is_err());
    }
}
