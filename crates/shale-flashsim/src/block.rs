//! [`FlashSim`]: a conventional drive's FTL wrapped around any block device.
//!
//! Data goes to the inner device unchanged; after the inner device completes a
//! request successfully, the model accounts for it. Asynchronous requests are
//! re-tagged with a slot of a small slab (the caller's tag is kept there) so the
//! completion can be matched to the request without a hash map.

use shale_device::{BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoOpKind, IoRequest};

use crate::config::FtlConfig;
use crate::error::ModelOp;
use crate::ftl::Ftl;
use crate::preset::{Preset, PresetKind};
use crate::stats::{Counters, FlashStats, Publisher, StatsHandle};
use crate::timing::TimingModel;
use crate::FlashSimError;

/// A drive that writes in place (Optane / 3D XPoint): no IU, no GC.
#[derive(Debug)]
pub struct InPlace {
    capacity_bytes: u64,
    timing: TimingModel,
    counters: Counters,
}

impl InPlace {
    pub fn new(capacity_bytes: u64, timing: TimingModel) -> Result<InPlace, FlashSimError> {
        timing.validate()?;
        Ok(InPlace {
            capacity_bytes,
            timing,
            counters: Counters::default(),
        })
    }

    fn check_range(&self, op: ModelOp, offset: u64, len: u64) -> Result<(), FlashSimError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity_bytes => Ok(()),
            _ => Err(FlashSimError::OutOfRange {
                op,
                offset,
                len,
                capacity_bytes: self.capacity_bytes,
            }),
        }
    }

    pub fn write(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        self.check_range(ModelOp::Write, offset, len)?;
        let c = &mut self.counters;
        c.host_write_ops += 1;
        c.host_bytes_written += len;
        c.nand_bytes_written_host += len;
        c.interface_busy_ps += self.timing.command_ps(len);
        Ok(())
    }

    pub fn read(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        self.check_range(ModelOp::Read, offset, len)?;
        let c = &mut self.counters;
        c.host_read_ops += 1;
        c.host_bytes_read += len;
        c.nand_bytes_read_host += len;
        c.interface_busy_ps += self.timing.command_ps(len);
        Ok(())
    }

    pub fn discard(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        self.check_range(ModelOp::Discard, offset, len)?;
        let c = &mut self.counters;
        c.host_discard_ops += 1;
        c.host_bytes_discarded += len;
        c.interface_busy_ps += self.timing.command_ps(0);
        Ok(())
    }

    pub fn flush(&mut self) {
        self.counters.host_flush_ops += 1;
        self.counters.interface_busy_ps += self.timing.command_ps(0);
    }
}

/// The media model behind a [`FlashSim`].
#[derive(Debug)]
pub enum DriveModel {
    Ftl(Box<Ftl>),
    InPlace(InPlace),
}

impl DriveModel {
    fn write(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        match self {
            DriveModel::Ftl(f) => f.write(offset, len),
            DriveModel::InPlace(m) => m.write(offset, len),
        }
    }

    fn read(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        match self {
            DriveModel::Ftl(f) => f.read(offset, len),
            DriveModel::InPlace(m) => m.read(offset, len),
        }
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        match self {
            DriveModel::Ftl(f) => f.discard(offset, len),
            DriveModel::InPlace(m) => m.discard(offset, len),
        }
    }

    fn flush(&mut self) {
        match self {
            DriveModel::Ftl(f) => f.flush(),
            DriveModel::InPlace(m) => m.flush(),
        }
    }

    fn counters(&self) -> &Counters {
        match self {
            DriveModel::Ftl(f) => f.counters(),
            DriveModel::InPlace(m) => &m.counters,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Pending {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64 },
    Discard { offset: u64, len: u64 },
    Flush,
}

/// In-flight requests by internal tag (the slot index); grows to the deepest queue the
/// caller used and is reused after that.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Option<(u64, T)>>,
    free: Vec<usize>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, tag: u64, item: T) -> u64 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some((tag, item));
                i as u64
            }
            None => {
                self.slots.push(Some((tag, item)));
                (self.slots.len() - 1) as u64
            }
        }
    }

    pub(crate) fn take(&mut self, internal: u64) -> Option<(u64, T)> {
        let i = usize::try_from(internal).ok()?;
        let entry = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        Some(entry)
    }
}

/// A conventional block device with a modelled drive FTL in front of it.
#[derive(Debug)]
pub struct FlashSim<D: BlockDevice> {
    inner: D,
    info: DeviceInfo,
    model: DriveModel,
    publisher: Publisher,
    pending: Slab<Pending>,
    scratch: Vec<IoCompletion>,
}

impl<D: BlockDevice> FlashSim<D> {
    /// Models a drive with `config` whose logical capacity is the inner device's size.
    pub fn new(inner: D, config: &FtlConfig, timing: TimingModel) -> Result<Self, FlashSimError> {
        let ftl = Ftl::new(config, inner.size_bytes(), timing)?;
        Ok(Self::with_model(
            inner,
            DriveModel::Ftl(Box::new(ftl)),
            timing,
            "flash",
        ))
    }

    /// Models a drive that writes in place (NAND bytes == host bytes).
    pub fn in_place(inner: D, timing: TimingModel) -> Result<Self, FlashSimError> {
        let m = InPlace::new(inner.size_bytes(), timing)?;
        Ok(Self::with_model(
            inner,
            DriveModel::InPlace(m),
            timing,
            "in-place",
        ))
    }

    /// Models the drive `preset` describes (conventional or in-place presets).
    pub fn from_preset(inner: D, preset: &Preset) -> Result<Self, FlashSimError> {
        let mut sim = match preset.kind {
            PresetKind::Conventional(c) => Self::new(inner, &c, preset.timing)?,
            PresetKind::InPlace => Self::in_place(inner, preset.timing)?,
            PresetKind::Zoned { .. } => {
                return Err(FlashSimError::PresetKind {
                    name: preset.name.to_string(),
                    kind: preset.kind.describe(),
                    wanted: "a block device",
                })
            }
        };
        sim.info.name = format!("{}({})", preset.name, sim.inner.info().name);
        Ok(sim)
    }

    fn with_model(inner: D, model: DriveModel, timing: TimingModel, label: &str) -> Self {
        let mut info = inner.info().clone();
        info.name = format!("{label}({})", info.name);
        FlashSim {
            inner,
            info,
            model,
            publisher: Publisher::new(timing),
            pending: Slab::default(),
            scratch: Vec::new(),
        }
    }

    /// Statistics since creation or the last [`Self::reset_stats`].
    pub fn stats(&self) -> FlashStats {
        self.publisher.handle().stats()
    }

    /// A handle that keeps reading this device's statistics after it has moved.
    pub fn stats_handle(&self) -> StatsHandle {
        self.publisher.handle()
    }

    /// Counts from zero again (e.g. after preconditioning); the drive's state stays.
    pub fn reset_stats(&self) {
        self.publisher.handle().reset()
    }

    pub fn model(&self) -> &DriveModel {
        &self.model
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Accounts for a request the inner device completed. The model's capacity is the
    /// inner device's size, so it refuses only what the inner device should have.
    fn account(&mut self, p: Pending) -> Result<(), DeviceError> {
        let (op, offset, len, r) = match p {
            Pending::Read { offset, len } => {
                (IoOpKind::Read, offset, len, self.model.read(offset, len))
            }
            Pending::Write { offset, len } => {
                (IoOpKind::Write, offset, len, self.model.write(offset, len))
            }
            Pending::Discard { offset, len } => (
                IoOpKind::Discard,
                offset,
                len,
                self.model.discard(offset, len),
            ),
            Pending::Flush => {
                self.model.flush();
                (IoOpKind::Flush, 0, 0, Ok(()))
            }
        };
        self.publisher.publish(self.model.counters());
        r.map_err(|_| DeviceError::OutOfRange {
            op,
            offset,
            len,
            size: self.info.size_bytes,
        })
    }
}

impl<D: BlockDevice> BlockDevice for FlashSim<D> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        let pending = match &req.op {
            IoOp::Read { offset, buf } => Pending::Read {
                offset: *offset,
                len: buf.len() as u64,
            },
            IoOp::Write { offset, buf, .. } => Pending::Write {
                offset: *offset,
                len: buf.len() as u64,
            },
            IoOp::Discard { offset, len } => Pending::Discard {
                offset: *offset,
                len: *len,
            },
            IoOp::Flush => Pending::Flush,
        };
        let tag = self.pending.insert(req.tag, pending);
        self.inner.submit(IoRequest { tag, op: req.op });
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = self.inner.poll(&mut scratch, min_complete);
        let n = scratch.len();
        for mut c in scratch.drain(..) {
            if let Some((tag, p)) = self.pending.take(c.tag) {
                c.tag = tag;
                if c.result.is_ok() {
                    c.result = self.account(p);
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

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read_at(offset, buf)?;
        self.account(Pending::Read {
            offset,
            len: buf.len() as u64,
        })
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        self.inner.write_at(offset, buf)?;
        self.account(Pending::Write {
            offset,
            len: buf.len() as u64,
        })
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        self.inner.flush()?;
        self.account(Pending::Flush)
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.inner.discard(offset, len)?;
        self.account(Pending::Discard { offset, len })
    }
}
