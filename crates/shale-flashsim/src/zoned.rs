//! [`ZnsSim`]: a zoned drive's NAND accounting wrapped around any zoned device.
//!
//! On ZNS each zone owns its erase units: the host writes a zone sequentially and
//! resets it to reuse it, so the drive never copies data and NAND programs equal host
//! writes. A reset erases the erase units the zone's written part occupies (an empty
//! zone's reset erases nothing). Finishing a zone is free here: the model does not pad
//! the rest of the zone with programs (drives differ; docs/flash-model.md).

use shale_device::{
    DeviceError, ZoneAction, ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp,
    ZoneRequest, ZonedDevice,
};

use crate::block::Slab;
use crate::preset::{Preset, PresetKind};
use crate::stats::{Counters, FlashStats, Publisher, StatsHandle};
use crate::timing::TimingModel;
use crate::FlashSimError;

#[derive(Debug, Clone, Copy)]
enum Pending {
    Read { len: u64 },
    Write { len: u64 },
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

    fn account(&mut self, p: Pending) {
        let c = &mut self.counters;
        match p {
            Pending::Read { len } => {
                c.host_read_ops += 1;
                c.host_bytes_read += len;
                c.nand_bytes_read_host += len;
                c.interface_busy_ps += self.timing.command_ps(len);
            }
            Pending::Write { len } => {
                c.host_write_ops += 1;
                c.host_bytes_written += len;
                c.nand_bytes_written_host += len;
                c.interface_busy_ps += self.timing.command_ps(len);
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
            ZoneOp::Read { buf, .. } => Pending::Read {
                len: buf.len() as u64,
            },
            ZoneOp::Write { buf, .. } | ZoneOp::Append { buf, .. } => Pending::Write {
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
                if c.result.is_ok() {
                    self.account(p);
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
        self.account(Pending::Read {
            len: buf.len() as u64,
        });
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let landed = self.inner.write_at(offset, buf)?;
        self.account(Pending::Write {
            len: buf.len() as u64,
        });
        Ok(landed)
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        let landed = self.inner.append(zone, buf)?;
        self.account(Pending::Write {
            len: buf.len() as u64,
        });
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
        self.account(Pending::Flush);
        Ok(())
    }
}
