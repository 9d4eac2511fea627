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
use crate::timing::{Head, TimingModel};
use crate::FlashSimError;

/// A drive that writes in place (Optane / 3D XPoint, or a disk): no IU, no GC.
#[derive(Debug)]
pub struct InPlace {
    capacity_bytes: u64,
    timing: TimingModel,
    counters: Counters,
    /// A disk's head (`hdd`): commands that jump cost a seek.
    head: Head,
}

impl InPlace {
    pub fn new(capacity_bytes: u64, timing: TimingModel) -> Result<InPlace, FlashSimError> {
        timing.validate()?;
        Ok(InPlace {
            capacity_bytes,
            timing,
            counters: Counters::default(),
            head: Head::default(),
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
        c.head_moves += u64::from(self.head.moves_to(offset, len));
        Ok(())
    }

    pub fn read(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        self.check_range(ModelOp::Read, offset, len)?;
        let c = &mut self.counters;
        c.host_read_ops += 1;
        c.host_bytes_read += len;
        c.nand_bytes_read_host += len;
        c.interface_busy_ps += self.timing.command_ps(len);
        c.head_moves += u64::from(self.head.moves_to(offset, len));
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
    InPlace(Box<InPlace>),
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
            DriveModel::InPlace(Box::new(m)),
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

    /// The FTL model (geometry, `self_check`), unless the drive writes in place.
    pub fn ftl(&self) -> Option<&Ftl> {
        match &self.model {
            DriveModel::Ftl(f) => Some(f),
            DriveModel::InPlace(_) => None,
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Counts a read of `len` bytes at `offset` without moving data through the inner
    /// device: for models that need the drive's counts, not its bytes (shale-bench's
    /// dm-zoned model reads terabytes during reclaim; zero-filling those buffers was
    /// nearly all of its run time).
    pub fn count_read(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let size = self.info.size_bytes;
        if len == 0 {
            return Err(DeviceError::ZeroLength {
                op: IoOpKind::Read,
                offset,
            });
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DeviceError::OutOfRange {
                op: IoOpKind::Read,
                offset,
                len,
                size,
            });
        }
        self.account(Pending::Read { offset, len })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Superblock;
    use crate::preset;
    use proptest::prelude::*;
    use shale_device::{IoBuf, MemDevice};

    const KIB: u64 = 1024;

    fn small_config(iu: u64) -> FtlConfig {
        FtlConfig::new(iu, Superblock::Bytes(iu * 4), 0.25)
    }

    fn timing() -> TimingModel {
        preset("qlc-p5316").expect("preset").timing
    }

    #[test]
    fn stats_handle_keeps_counting_after_the_device_moves() {
        let mem = MemDevice::new(8 << 20, 4096).expect("mem");
        let sim = FlashSim::new(mem, &small_config(16 * KIB), timing()).expect("sim");
        let handle = sim.stats_handle();
        let mut boxed: Box<dyn BlockDevice> = Box::new(sim);
        boxed.write_at(0, &[1u8; 4096]).expect("write");
        let s = handle.stats();
        assert_eq!(s.host_bytes_written, 4096);
        assert_eq!(s.nand_bytes_written, 16 * KIB);
        assert!(s.busy_ns > 0);
        handle.reset();
        assert_eq!(handle.stats(), FlashStats::default());
        boxed.write_at(16 * KIB, &[1u8; 16 * 1024]).expect("write");
        assert_eq!(handle.stats().waf(), 1.0);
    }

    /// A disk (`hdd`): sequential commands stream, jumps cost a seek, so random 4 KiB
    /// reads run at the datasheet's ~170 a second and sequential ones at its MB/s.
    #[test]
    fn a_disk_pays_a_seek_for_each_jump() {
        let p = preset("hdd").expect("preset");
        let mut sim =
            FlashSim::from_preset(MemDevice::new(64 << 20, 4096).expect("mem"), &p).expect("sim");
        let mut buf = vec![0u8; 4096];
        // 16 MiB in order: one seek, then 270 MB/s.
        for i in 0..4096u64 {
            sim.read_at(i * 4096, &mut buf).expect("read");
        }
        let seq = sim.stats();
        assert_eq!(seq.head_moves, 1);
        let mb_s = (4096.0 * 4096.0) / (seq.busy_ns as f64 * 1e-9) / 1e6;
        assert!((240.0..270.0).contains(&mb_s), "sequential {mb_s} MB/s");
        sim.reset_stats();
        for i in 0..256u64 {
            // A stride of 1 MiB + 4 KiB: never where the last command ended.
            sim.read_at((i * (257 * 4096)) % (63 << 20), &mut buf)
                .expect("read");
        }
        let rnd = sim.stats();
        assert_eq!(rnd.head_moves, 256);
        let iops = 256.0 / (rnd.busy_ns as f64 * 1e-9);
        assert!((150.0..180.0).contains(&iops), "random {iops} IOPS");
        // Writes in place: no amplification.
        sim.write_at(0, &[1u8; 8192]).expect("write");
        assert_eq!(sim.stats().waf(), 1.0);
    }

    #[test]
    fn failed_requests_change_no_counter() {
        let mem = MemDevice::new(1 << 20, 4096).expect("mem");
        let mut sim = FlashSim::new(mem, &small_config(4 * KIB), timing()).expect("sim");
        assert!(sim.write_at(1 << 20, &[0u8; 4096]).is_err());
        assert!(sim.write_at(512, &[0u8; 4096]).is_err());
        let mut buf = [0u8; 4096];
        assert!(sim.read_at(1 << 20, &mut buf).is_err());
        sim.submit(IoRequest {
            tag: 9,
            op: IoOp::Write {
                offset: 1 << 20,
                buf: IoBuf::zeroed(4096),
                fua: false,
            },
        });
        let mut out = Vec::new();
        sim.poll(&mut out, 1).expect("poll");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tag, 9);
        assert!(out[0].result.is_err());
        assert_eq!(sim.stats(), FlashStats::default());
    }

    #[test]
    fn count_read_counts_what_read_at_counts() {
        let sim = || {
            let mem = MemDevice::new(1 << 20, 4096).expect("mem");
            FlashSim::new(mem, &small_config(16 * KIB), timing()).expect("sim")
        };
        let (mut a, mut b) = (sim(), sim());
        for s in [&mut a, &mut b] {
            s.write_at(0, &[7u8; 65536]).expect("write");
        }
        let mut buf = vec![0u8; 20480];
        a.read_at(4096, &mut buf).expect("read");
        b.count_read(4096, 20480).expect("count");
        assert_eq!(a.stats(), b.stats());
        assert!(b.count_read(1 << 20, 4096).is_err());
        assert!(b.count_read(u64::MAX - 100, 4096).is_err());
        assert!(b.count_read(0, 0).is_err());
        assert_eq!(a.stats(), b.stats(), "refused reads count nothing");
    }

    #[test]
    fn in_place_drive_programs_exactly_what_the_host_writes() {
        let p = preset("optane").expect("preset");
        let mem = MemDevice::new(1 << 20, 512).expect("mem");
        let mut sim = FlashSim::from_preset(mem, &p).expect("sim");
        sim.write_at(512, &[3u8; 512]).expect("write");
        sim.write_at(4096, &[3u8; 8192]).expect("write");
        sim.discard(0, 4096).expect("discard");
        let s = sim.stats();
        assert_eq!(s.nand_bytes_written, s.host_bytes_written);
        assert_eq!(s.nand_bytes_written, 512 + 8192);
        assert_eq!(s.erases, 0);
    }

    #[test]
    fn zoned_presets_are_refused_for_block_devices() {
        let mem = MemDevice::new(1 << 20, 4096).expect("mem");
        let p = preset("zns-qlc").expect("preset");
        assert!(matches!(
            FlashSim::from_preset(mem, &p),
            Err(FlashSimError::PresetKind { .. })
        ));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write {
            sector: u64,
            sectors: u64,
            fill: u8,
            asynchronous: bool,
        },
        Discard {
            sector: u64,
            sectors: u64,
        },
        Read {
            sector: u64,
            sectors: u64,
            asynchronous: bool,
        },
        Flush,
    }

    const SECTORS: u64 = 2048;

    fn op() -> impl Strategy<Value = Op> {
        (0u8..12, 0..SECTORS, 1u64..=40, any::<u8>(), any::<bool>()).prop_map(
            |(k, sector, n, fill, asynchronous)| {
                let sectors = n.min(SECTORS - sector);
                match k {
                    0 => Op::Discard { sector, sectors },
                    1 => Op::Flush,
                    2..=4 => Op::Read {
                        sector,
                        sectors,
                        asynchronous,
                    },
                    _ => Op::Write {
                        sector,
                        sectors,
                        fill,
                        asynchronous,
                    },
                }
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Whatever the FTL model does (GC, read-modify-write, partial trims), data read
        /// through the wrapper is what was written, through both the synchronous and
        /// the asynchronous paths; and the counters add up.
        #[test]
        fn the_wrapper_never_corrupts_data_and_counters_add_up(
            iu_shift in 12u32..=15,
            ops in proptest::collection::vec(op(), 1..400),
        ) {
            let iu = 1u64 << iu_shift;
            let mem = MemDevice::new(SECTORS * 512, 512).expect("mem");
            let mut sim = FlashSim::new(mem, &small_config(iu), timing()).expect("sim");
            let handle = sim.stats_handle();
            let mut reference = vec![0u8; (SECTORS * 512) as usize];
            let mut out = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let tag = i as u64;
                match *op {
                    Op::Write { sector, sectors, fill, asynchronous } => {
                        let (off, len) = (sector * 512, (sectors * 512) as usize);
                        let data: Vec<u8> = (0..len).map(|j| fill ^ (j as u8)).collect();
                        reference[off as usize..off as usize + len].copy_from_slice(&data);
                        if asynchronous {
                            sim.submit(IoRequest {
                                tag,
                                op: IoOp::Write { offset: off, buf: IoBuf::from_slice(&data), fua: false },
                            });
                            out.clear();
                            sim.poll(&mut out, 1).expect("poll");
                            prop_assert_eq!(out.len(), 1);
                            prop_assert_eq!(out[0].tag, tag);
                            prop_assert!(out[0].result.is_ok());
                        } else {
                            sim.write_at(off, &data).expect("write");
                        }
                    }
                    Op::Discard { sector, sectors } => {
                        let (off, len) = (sector * 512, sectors * 512);
                        reference[off as usize..(off + len) as usize].fill(0);
                        sim.discard(off, len).expect("discard");
                    }
                    Op::Read { sector, sectors, asynchronous } => {
                        let (off, len) = (sector * 512, (sectors * 512) as usize);
                        let got = if asynchronous {
                            sim.submit(IoRequest {
                                tag,
                                op: IoOp::Read { offset: off, buf: IoBuf::zeroed(len) },
                            });
                            out.clear();
                            sim.poll(&mut out, 1).expect("poll");
                            prop_assert_eq!(out.len(), 1);
                            prop_assert_eq!(out[0].tag, tag);
                            prop_assert!(out[0].result.is_ok());
                            out[0].buf.take().expect("buffer back").to_vec()
                        } else {
                            let mut buf = vec![0u8; len];
                            sim.read_at(off, &mut buf).expect("read");
                            buf
                        };
                        prop_assert!(
                            got == reference[off as usize..off as usize + len],
                            "op {} read at {} len {} differs", i, off, len
                        );
                    }
                    Op::Flush => sim.flush().expect("flush"),
                }
            }
            let s = sim.stats();
            prop_assert_eq!(s, handle.stats());
            prop_assert_eq!(
                s.nand_bytes_written,
                s.nand_bytes_written_host + s.nand_bytes_written_gc + s.nand_bytes_written_rmw
            );
            prop_assert_eq!(
                s.nand_bytes_read,
                s.nand_bytes_read_host + s.nand_bytes_read_gc + s.nand_bytes_read_rmw
            );
            prop_assert!(s.nand_bytes_written >= s.host_bytes_written);
            prop_assert_eq!(s.nand_bytes_written % iu, 0);
            prop_assert_eq!(sim.ftl().expect("FTL model").self_check(), Ok(()));
        }
    }
}
