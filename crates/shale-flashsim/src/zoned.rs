//! [`ZnsSim`]: a zoned drive's NAND accounting wrapped around any zoned device.
//!
//! On ZNS each zone owns its erase units: the host writes a zone sequentially and
//! resets it to reuse it, so the drive never copies data and NAND programs equal host
//! writes. A reset erases the erase units the zone's written part occupies (an empty
//! zone's reset erases nothing). Finishing a zone is free here: the model does not pad
//! the rest of the zone with programs (drives differ; docs/flash-model.md).

use shale_device::{
    DeviceError, IoOpKind, ZoneAction, ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp,
    ZoneRequest, ZonedDevice,
};

use crate::block::Slab;
use crate::preset::{Preset, PresetKind};
use crate::stats::{Counters, FlashStats, Publisher, StatsHandle};
use crate::timing::{Head, TimingModel};
use crate::FlashSimError;

#[derive(Debug, Clone, Copy)]
enum Pending {
    Read {
        offset: u64,
        len: u64,
    },
    /// `offset` is `None` for an append: its completion says where it landed.
    Write {
        offset: Option<u64>,
        len: u64,
    },
    Flush,
}

/// A zoned device whose NAND work is counted and timed.
#[derive(Debug)]
pub struct ZnsSim<Z: ZonedDevice> {
    inner: Z,
    geometry: ZoneGeometry,
    /// `None`: one erase unit per zone.
    erase_unit_bytes: Option<u64>,
    timing: TimingModel,
    counters: Counters,
    /// A disk's head (`smr-hm`): commands that jump, such as writes alternating
    /// between open zones, cost a seek.
    head: Head,
    publisher: Publisher,
    pending: Slab<Pending>,
    scratch: Vec<ZoneCompletion>,
}

impl<Z: ZonedDevice> ZnsSim<Z> {
    /// `erase_unit_bytes`: the size of one erase unit, `None` for one unit per zone.
    pub fn new(
        inner: Z,
        erase_unit_bytes: Option<u64>,
        timing: TimingModel,
    ) -> Result<Self, FlashSimError> {
        timing.validate()?;
        if erase_unit_bytes == Some(0) {
            return Err(FlashSimError::EraseUnit {
                erase_unit_bytes: 0,
            });
        }
        let mut geometry = inner.geometry().clone();
        geometry.name = format!("zns-flash({})", geometry.name);
        Ok(ZnsSim {
            inner,
            geometry,
            erase_unit_bytes,
            timing,
            counters: Counters::default(),
            head: Head::default(),
            publisher: Publisher::new(timing),
            pending: Slab::default(),
            scratch: Vec::new(),
        })
    }

    /// Models the zoned drive `preset` describes.
    pub fn from_preset(inner: Z, preset: &Preset) -> Result<Self, FlashSimError> {
        match preset.kind {
            PresetKind::Zoned { erase_unit_bytes } => {
                let mut sim = Self::new(inner, erase_unit_bytes, preset.timing)?;
                sim.geometry.name = format!("{}({})", preset.name, sim.inner.geometry().name);
                Ok(sim)
            }
            other => Err(FlashSimError::PresetKind {
                name: preset.name.to_string(),
                kind: other.describe(),
                wanted: "a zoned drive",
            }),
        }
    }

    pub fn stats(&self) -> FlashStats {
        self.publisher.handle().stats()
    }

    pub fn stats_handle(&self) -> StatsHandle {
        self.publisher.handle()
    }

    pub fn reset_stats(&self) {
        self.publisher.handle().reset()
    }

    pub fn inner(&self) -> &Z {
        &self.inner
    }

    pub fn into_inner(self) -> Z {
        self.inner
    }

    /// Counts a read of `len` bytes at `offset` without moving data through the inner
    /// device: for models that need the drive's counts, not its bytes (see
    /// [`crate::FlashSim::count_read`]).
    pub fn count_read(&mut self, offset: u64, len: u64) -> Result<(), ZoneError> {
        let size = u64::from(self.geometry.zone_count) * self.geometry.zone_size;
        if len == 0 {
            return Err(DeviceError::ZeroLength {
                op: IoOpKind::Read,
                offset,
            }
            .into());
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DeviceError::OutOfRange {
                op: IoOpKind::Read,
                offset,
                len,
                size,
            }
            .into());
        }
        self.account(Pending::Read { offset, len }, None);
        Ok(())
    }

    /// Counts a completed command; `landed` is where a write or append went.
    fn account(&mut self, p: Pending, landed: Option<u64>) {
        let c = &mut self.counters;
        match p {
            Pending::Read { offset, len } => {
                c.host_read_ops += 1;
                c.host_bytes_read += len;
                c.nand_bytes_read_host += len;
                c.interface_busy_ps += self.timing.command_ps(len);
                c.head_moves += u64::from(self.head.moves_to(offset, len));
            }
            Pending::Write { offset, len } => {
                c.host_write_ops += 1;
                c.host_bytes_written += len;
                c.nand_bytes_written_host += len;
                c.interface_busy_ps += self.timing.command_ps(len);
                if let Some(at) = offset.or(landed) {
                    c.head_moves += u64::from(self.head.moves_to(at, len));
                }
            }
            Pending::Flush => {
                c.host_flush_ops += 1;
                c.interface_busy_ps += self.timing.command_ps(0);
            }
        }
        self.publisher.publish(&self.counters);
    }

    fn account_reset(&mut self, written: u64, zone_capacity: u64) {
        let (units, bytes) = match self.erase_unit_bytes {
            _ if written == 0 => (0, 0),
            None => (1, zone_capacity),
            Some(eu) => {
                let units = written.div_ceil(eu);
                (units, units * eu)
            }
        };
        let c = &mut self.counters;
        c.zone_resets += 1;
        c.erases += units;
        c.nand_bytes_erased += bytes;
        c.interface_busy_ps += self.timing.command_ps(0);
        self.publisher.publish(&self.counters);
    }
}

impl<Z: ZonedDevice> ZonedDevice for ZnsSim<Z> {
    fn geometry(&self) -> &ZoneGeometry {
        &self.geometry
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
        let pending = match &req.op {
            ZoneOp::Read { offset, buf } => Pending::Read {
                offset: *offset,
                len: buf.len() as u64,
            },
            ZoneOp::Write { offset, buf, .. } => Pending::Write {
                offset: Some(*offset),
                len: buf.len() as u64,
            },
            ZoneOp::Append { buf, .. } => Pending::Write {
                offset: None,
                len: buf.len() as u64,
            },
            ZoneOp::Flush => Pending::Flush,
        };
        let tag = self.pending.insert(req.tag, pending);
        self.inner.submit(ZoneRequest { tag, op: req.op });
    }

    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = self.inner.poll(&mut scratch, min_complete);
        let n = scratch.len();
        for mut c in scratch.drain(..) {
            if let Some((tag, p)) = self.pending.take(c.tag) {
                c.tag = tag;
                if let Ok(landed) = c.result {
                    self.account(p, landed);
                }
            }
            out.push(c);
        }
        self.scratch = scratch;
        r.map(|_| n)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        self.inner.read_at(offset, buf)?;
        self.account(
            Pending::Read {
                offset,
                len: buf.len() as u64,
            },
            None,
        );
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let landed = self.inner.write_at(offset, buf)?;
        self.account(
            Pending::Write {
                offset: Some(offset),
                len: buf.len() as u64,
            },
            None,
        );
        Ok(landed)
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        let landed = self.inner.append(zone, buf)?;
        self.account(
            Pending::Write {
                offset: None,
                len: buf.len() as u64,
            },
            Some(landed),
        );
        Ok(landed)
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        if action != ZoneAction::Reset {
            self.inner.manage(zone, action)?;
            self.counters.interface_busy_ps += self.timing.command_ps(0);
            self.publisher.publish(&self.counters);
            return Ok(());
        }
        let before = self.inner.zone_info(zone)?;
        self.inner.manage(zone, action)?;
        self.account_reset(
            before.write_pointer.saturating_sub(before.start),
            before.capacity,
        );
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        self.inner.flush()?;
        self.account(Pending::Flush, None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;
    use proptest::prelude::*;
    use shale_device::{IoBuf, MemDevice, ZoneEmu, ZoneEmuConfig};

    const ZONE: u64 = 64 * 1024;
    const ZONES: u32 = 8;

    fn emu() -> ZoneEmu<MemDevice> {
        let mem = MemDevice::new(ZONE * u64::from(ZONES) + (64 << 10), 4096).expect("mem");
        let cfg = ZoneEmuConfig {
            zone_count_max: ZONES,
            ..ZoneEmuConfig::new(ZONE)
        };
        ZoneEmu::format(mem, &cfg).expect("format")
    }

    fn timing() -> TimingModel {
        preset("zns-qlc").expect("preset").timing
    }

    #[test]
    fn nand_equals_host_and_resets_erase_what_was_written() {
        let mut z = ZnsSim::new(emu(), Some(16 * 1024), timing()).expect("sim");
        z.write_at(0, &[1u8; 8192]).expect("write");
        z.append(0, &[2u8; 12288]).expect("append");
        z.append(1, &[3u8; 4096]).expect("append");
        let mut buf = [0u8; 4096];
        z.read_at(8192, &mut buf).expect("read");
        assert!(buf.iter().all(|&b| b == 2));
        let s = z.stats();
        assert_eq!(s.host_bytes_written, 24576);
        assert_eq!(s.nand_bytes_written, s.host_bytes_written);
        assert_eq!(s.nand_bytes_read, 4096);
        assert_eq!(s.erases, 0);
        // 20 KiB written in zone 0: two 16 KiB erase units.
        z.reset_zone(0).expect("reset");
        // An empty zone's reset erases nothing.
        z.reset_zone(5).expect("reset");
        let s = z.stats();
        assert_eq!(s.zone_resets, 2);
        assert_eq!(s.erases, 2);
        assert_eq!(s.nand_bytes_erased, 32 * 1024);
        assert_eq!(s.nand_bytes_written, s.host_bytes_written);
    }

    #[test]
    fn count_read_counts_what_read_at_counts() {
        let mut a = ZnsSim::new(emu(), None, timing()).expect("sim");
        let mut b = ZnsSim::new(emu(), None, timing()).expect("sim");
        for z in [&mut a, &mut b] {
            z.append(1, &[5u8; 16384]).expect("append");
        }
        let mut buf = [0u8; 8192];
        a.read_at(ZONE + 4096, &mut buf).expect("read");
        b.count_read(ZONE + 4096, 8192).expect("count");
        assert_eq!(a.stats(), b.stats());
        assert!(b.count_read(ZONE * u64::from(ZONES), 4096).is_err());
        assert!(b.count_read(u64::MAX - 100, 4096).is_err());
        assert!(b.count_read(0, 0).is_err());
        assert_eq!(a.stats(), b.stats(), "refused reads count nothing");
    }

    /// A host-managed SMR disk: one zone written in order streams at the media rate;
    /// two zones written in turn pay a seek per write, as do reads elsewhere.
    #[test]
    fn an_smr_disk_seeks_between_zones() {
        let p = preset("smr-hm").expect("preset");
        let mut z = ZnsSim::from_preset(emu(), &p).expect("sim");
        for _ in 0..8 {
            z.append(0, &[1u8; 4096]).expect("append");
        }
        assert_eq!(z.stats().head_moves, 1, "one stream: the first write only");
        let one = z.stats().nand_busy_ns;
        for _ in 0..4 {
            z.append(1, &[2u8; 4096]).expect("append");
            z.append(2, &[3u8; 4096]).expect("append");
        }
        let s = z.stats();
        assert_eq!(s.head_moves, 9);
        // Each seek ~5.9 ms, against 15 us to move 4 KiB.
        assert!(s.nand_busy_ns > 8 * one, "{} vs {one}", s.nand_busy_ns);
        let mut buf = [0u8; 4096];
        z.read_at(0, &mut buf).expect("read");
        z.read_at(4096, &mut buf).expect("read");
        assert_eq!(z.stats().head_moves, 10, "a sequential read continues");
        // A reset rewrites nothing: it costs no media time.
        let before = z.stats().nand_busy_ns;
        z.reset_zone(1).expect("reset");
        assert!(z.stats().nand_busy_ns - before < 1000);
    }

    #[test]
    fn one_erase_unit_per_zone_by_default() {
        let p = preset("zns-qlc").expect("preset");
        let mut z = ZnsSim::from_preset(emu(), &p).expect("sim");
        z.append(2, &[1u8; 4096]).expect("append");
        z.finish_zone(2).expect("finish");
        z.reset_zone(2).expect("reset");
        let s = z.stats();
        assert_eq!(s.erases, 1);
        assert_eq!(s.nand_bytes_erased, ZONE);
        assert_eq!(s.nand_bytes_written, 4096, "finish pads nothing");
        assert!(z.geometry().name.starts_with("zns-qlc"));
    }

    #[test]
    fn rule_violations_pass_through_uncounted() {
        let mut z = ZnsSim::new(emu(), None, timing()).expect("sim");
        assert!(matches!(
            z.write_at(4096, &[0u8; 4096]),
            Err(ZoneError::NotAtWritePointer { .. })
        ));
        z.submit(ZoneRequest {
            tag: 77,
            op: ZoneOp::Write {
                offset: 8192,
                buf: IoBuf::zeroed(4096),
                fua: false,
            },
        });
        let mut out = Vec::new();
        z.poll(&mut out, 1).expect("poll");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tag, 77);
        assert!(out[0].result.is_err());
        assert_eq!(z.stats(), FlashStats::default());
        assert!(matches!(
            ZnsSim::new(emu(), Some(0), timing()),
            Err(FlashSimError::EraseUnit { .. })
        ));
        let qlc = preset("qlc-p5316").expect("preset");
        assert!(matches!(
            ZnsSim::from_preset(emu(), &qlc),
            Err(FlashSimError::PresetKind { .. })
        ));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append {
            zone: u32,
            blocks: u64,
            asynchronous: bool,
        },
        Reset {
            zone: u32,
        },
        Read {
            zone: u32,
            block: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        (0u8..10, 0..ZONES, 1u64..=6, any::<bool>()).prop_map(
            |(k, zone, n, asynchronous)| match k {
                0 => Op::Reset { zone },
                1..=3 => Op::Read { zone, block: n },
                _ => Op::Append {
                    zone,
                    blocks: n,
                    asynchronous,
                },
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// NAND programs equal host writes at every step, erases count exactly the
        /// erase units of the written part of each reset zone, and data reads back.
        #[test]
        fn zoned_accounting_and_data_hold(ops in proptest::collection::vec(op(), 1..200)) {
            let eu = 8192u64;
            let mut z = ZnsSim::new(emu(), Some(eu), timing()).expect("sim");
            let mut wp = vec![0u64; ZONES as usize];
            let mut data = vec![vec![0u8; ZONE as usize]; ZONES as usize];
            let mut erases = 0u64;
            let mut out = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    Op::Append { zone, blocks, asynchronous } => {
                        let len = blocks * 4096;
                        let z_i = zone as usize;
                        if wp[z_i] + len > ZONE {
                            continue;
                        }
                        let buf: Vec<u8> = (0..len).map(|j| (i as u8) ^ (j as u8)).collect();
                        let at = if asynchronous {
                            z.submit(ZoneRequest {
                                tag: i as u64,
                                op: ZoneOp::Append { zone, buf: IoBuf::from_slice(&buf), fua: false },
                            });
                            out.clear();
                            z.poll(&mut out, 1).expect("poll");
                            prop_assert_eq!(out[0].tag, i as u64);
                            out[0].result.as_ref().expect("append").expect("landed")
                        } else {
                            z.append(zone, &buf).expect("append")
                        };
                        let rel = (at - u64::from(zone) * ZONE) as usize;
                        prop_assert_eq!(rel as u64, wp[z_i]);
                        data[z_i][rel..rel + len as usize].copy_from_slice(&buf);
                        wp[z_i] += len;
                    }
                    Op::Reset { zone } => {
                        erases += wp[zone as usize].div_ceil(eu);
                        wp[zone as usize] = 0;
                        z.reset_zone(zone).expect("reset");
                    }
                    Op::Read { zone, block } => {
                        let off = block * 4096;
                        if off + 4096 > wp[zone as usize] {
                            continue;
                        }
                        let mut buf = vec![0u8; 4096];
                        z.read_at(u64::from(zone) * ZONE + off, &mut buf).expect("read");
                        let o = off as usize;
                        prop_assert!(buf == data[zone as usize][o..o + 4096]);
                    }
                }
                let s = z.stats();
                prop_assert_eq!(s.nand_bytes_written, s.host_bytes_written);
                prop_assert_eq!(s.erases, erases);
            }
        }
    }
}
