//! A crash rig: the engine over fault devices on a power rail that trips at a
//! chosen write (by the bytes it touches), a model of what each block may read after a
//! crash, and helpers to drive the engine to the dangerous moments.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shale_device::{CrashMode, FaultController, FaultDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{
    Config, Engine, EngineError, ManualClock, NoProgress, OpenError, OpenProgress, Reply, Request,
    VolumeUid,
};
use shale_format::{CacheLayout, Superblock};

pub use shale_testkit::power::{Phase, PowerRail, Powered, Side, Target, Trigger};

use super::{pattern, tiny_config};

pub const BS: u64 = 4096;

/// Cuts the power right after the `skip + 1`-th write (or discard) overlapping
/// `lo..hi` on `side` reaches the device (it stays pending: a crash may keep, drop or
/// tear it).
pub fn after_write(side: Side, lo: u64, hi: u64, skip: u32) -> Trigger {
    Trigger {
        target: Target::Bytes { side, lo, hi },
        nth: skip + 1,
        phase: Phase::After,
        observe_only: false,
    }
}

pub type Cap = ZoneEmu<Powered>;
pub type REng = Engine<Powered, Cap, ManualClock>;

/// Versions a block may read as: `[0]` is the floor (known durable), the rest newer.
/// A version is the pattern seed (0 = zeros).
#[derive(Debug, Default, Clone)]
pub struct Model {
    blocks: HashMap<(u64, u64), Vec<u64>>,
    /// Versions written since the last completed flush, per block.
    dirty: Vec<(u64, u64)>,
}

pub fn block_of(seed: u64) -> Vec<u8> {
    if seed == 0 {
        vec![0u8; BS as usize]
    } else {
        pattern(seed, BS as usize)
    }
}

impl Model {
    pub fn wrote(&mut self, v: VolumeUid, lba: u64, seed: u64) {
        self.blocks
            .entry((v.0, lba))
            .or_insert_with(|| vec![0])
            .push(seed);
        self.dirty.push((v.0, lba));
    }
    /// A flush completed: everything written so far is the floor.
    pub fn flushed(&mut self) {
        for k in std::mem::take(&mut self.dirty) {
            if let Some(vs) = self.blocks.get_mut(&k) {
                let last = *vs.last().unwrap();
                *vs = vec![last];
            }
        }
    }
    pub fn allowed(&self, v: VolumeUid, lba: u64) -> Vec<u64> {
        self.blocks
            .get(&(v.0, lba))
            .cloned()
            .unwrap_or_else(|| vec![0])
    }
    /// After a crash: what was read becomes the floor.
    pub fn observed(&mut self, v: VolumeUid, lba: u64, seed: u64) {
        self.blocks.insert((v.0, lba), vec![seed]);
    }
    pub fn touched(&self) -> Vec<(VolumeUid, u64)> {
        let mut k: Vec<_> = self
            .blocks
            .keys()
            .map(|&(v, l)| (VolumeUid(v), l))
            .collect();
        k.sort_unstable();
        k
    }
}

/// The rig: engine, devices, power rail, model.
pub struct Rig {
    pub e: Option<REng>,
    pub cache_ctl: FaultController,
    pub cap_ctl: FaultController,
    pub sw: PowerRail,
    pub model: Model,
    pub config: Config,
    pub seq: u64,
    pub layout: CacheLayout,
    pub zone_data_offset: u64,
    pub zone_bytes: u64,
    /// Devices taken out for surgery between a crash and the next open.
    pub parked: Option<(FaultDevice, FaultDevice)>,
}

pub const CACHE_BLOCKS: u64 = 128 + 8 * 256;
pub const ZONE_BLOCKS: u64 = 256;
pub const ZONES: u64 = 28;
/// Blocks of the rig's volume: most of the user capacity, so GC works hard.
pub const VOLUME_BLOCKS: u64 = 3072;

impl Rig {
    pub fn new(seed: u64) -> Rig {
        Self::with_config(seed, tiny_config())
    }

    pub fn with_config(seed: u64, config: Config) -> Rig {
        Self::build(seed, config, ZONES, VOLUME_BLOCKS)
    }

    /// A rig with `zones` zones of 256 blocks and one volume of `volume_blocks`.
    pub fn build(seed: u64, config: Config, zones: u64, volume_blocks: u64) -> Rig {
        let sw = PowerRail::new();
        let cache = FaultDevice::new(CACHE_BLOCKS * BS, 4096, seed).unwrap();
        let inner = FaultDevice::new((zones + 2) * ZONE_BLOCKS * BS, 4096, seed + 1).unwrap();
        let (cache_ctl, cap_ctl) = (cache.controller(), inner.controller());
        let mut zc = ZoneEmuConfig::new(ZONE_BLOCKS * BS);
        zc.zone_count_max = zones as u32;
        zc.max_open_zones = 8;
        zc.max_active_zones = 8;
        let cap = ZoneEmu::format(Powered::new(inner, Side::Capacity, sw.clone()), &zc).unwrap();
        let zone_data_offset = cap.data_offset();
        let cache = Powered::new(cache, Side::Cache, sw.clone());
        let e = Engine::format(cache, cap, ManualClock::new(), config.clone()).unwrap();
        let layout = cache_layout(&cache_ctl);
        let mut rig = Rig {
            e: Some(e),
            cache_ctl,
            cap_ctl,
            sw,
            model: Model::default(),
            config,
            seq: 1000,
            layout,
            zone_data_offset,
            zone_bytes: ZONE_BLOCKS * BS,
            parked: None,
        };
        rig.call(Request::CreateVolume {
            name: "a".into(),
            size_bytes: volume_blocks * BS,
        })
        .unwrap();
        rig
    }

    pub fn e(&mut self) -> &mut REng {
        self.e.as_mut().expect("engine running")
    }

    /// Submits and polls until done; `None` if the power went off first.
    pub fn try_call(&mut self, req: Request) -> Option<Result<Reply, EngineError>> {
        let slot: Arc<Mutex<Option<Result<Reply, EngineError>>>> = Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        let e = self.e.as_mut()?;
        e.submit(req, Box::new(move |r| *s2.lock().unwrap() = Some(r)));
        for _ in 0..400_000 {
            if let Some(r) = slot.lock().unwrap().take() {
                if !self.sw.is_on() {
                    return None;
                }
                return Some(r);
            }
            if !self.sw.is_on() {
                return None;
            }
            if !e.poll() {
                e.wait_io();
            }
        }
        panic!("request never completed");
    }

    pub fn call(&mut self, req: Request) -> Result<Reply, EngineError> {
        self.try_call(req).expect("power cut during a call")
    }

    /// Writes a fresh version of `lba` (volume 0); returns false if the power went off.
    pub fn write(&mut self, lba: u64) -> bool {
        self.seq += 1;
        let seed = self.seq;
        self.model.wrote(VolumeUid(1), lba, seed);
        let r = self.try_call(Request::Write {
            volume: VolumeUid(1),
            offset: lba * BS,
            data: block_of(seed),
            fua: false,
        });
        match r {
            Some(r) => {
                r.unwrap();
                true
            }
            None => false,
        }
    }

    pub fn trim(&mut self, lba: u64, count: u64) -> bool {
        for l in lba..lba + count {
            self.model.wrote(VolumeUid(1), l, 0);
        }
        match self.try_call(Request::Trim {
            volume: VolumeUid(1),
            offset: lba * BS,
            len: count * BS,
        }) {
            Some(r) => {
                r.unwrap();
                true
            }
            None => false,
        }
    }

    pub fn flush(&mut self) -> bool {
        match self.try_call(Request::Flush) {
            Some(r) => {
                r.unwrap();
                self.model.flushed();
                true
            }
            None => false,
        }
    }

    /// Random overwrites of blocks `lo..lo + span` until `until` holds (or `max`).
    pub fn churn_until(
        &mut self,
        rng: &mut u64,
        lo: u64,
        span: u64,
        max: u32,
        mut until: impl FnMut(&mut REng) -> bool,
    ) -> bool {
        for _ in 0..max {
            if until(self.e()) {
                return true;
            }
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            if !self.write(lo + *rng % span) {
                return false;
            }
        }
        until(self.e())
    }

    /// Polls the engine (background work) up to `n` times or until `until` holds.
    pub fn poll_until(&mut self, n: u32, mut until: impl FnMut(&mut REng) -> bool) -> bool {
        for _ in 0..n {
            if !self.sw.is_on() {
                return false;
            }
            if until(self.e()) {
                return true;
            }
            let e = self.e();
            if !e.poll() && e.is_idle() {
                break;
            }
        }
        until(self.e())
    }

    /// Crashes both devices (power off first), reopens; the open must succeed.
    pub fn crash(
        &mut self,
        cache_mode: CrashMode,
        cap_mode: CrashMode,
    ) -> &shale_engine::OpenReport {
        self.crash_open(cache_mode, cap_mode).unwrap();
        self.e.as_ref().unwrap().open_report()
    }

    pub fn crash_open(
        &mut self,
        cache_mode: CrashMode,
        cap_mode: CrashMode,
    ) -> Result<(), OpenError> {
        let (cache, inner) = self.crash_devices(cache_mode, cap_mode);
        self.reopen(cache, inner)
    }

    pub fn reopen(&mut self, cache: FaultDevice, inner: FaultDevice) -> Result<(), OpenError> {
        self.reopen_with_progress(cache, inner, &mut NoProgress)
    }

    /// [`Rig::reopen`], reporting the open's steps to `progress`.
    pub fn reopen_with_progress(
        &mut self,
        cache: FaultDevice,
        inner: FaultDevice,
        progress: &mut dyn OpenProgress,
    ) -> Result<(), OpenError> {
        let cap = ZoneEmu::open(Powered::new(inner, Side::Capacity, self.sw.clone())).unwrap();
        let cache = Powered::new(cache, Side::Cache, self.sw.clone());
        let e = Engine::open_with_progress(
            cache,
            cap,
            ManualClock::new(),
            self.config.clone(),
            progress,
        )?;
        self.e = Some(e);
        Ok(())
    }

    /// Takes the devices as they are after a crash (power off first), for a reopen.
    pub fn crash_devices(
        &mut self,
        cache_mode: CrashMode,
        cap_mode: CrashMode,
    ) -> (FaultDevice, FaultDevice) {
        self.sw.cut();
        if let Some(e) = self.e.take() {
            drop(e.abandon());
        }
        let (_, cache) = self.cache_ctl.crash(&cache_mode).unwrap();
        let (_, inner) = self.cap_ctl.crash(&cap_mode).unwrap();
        self.sw.restore();
        (cache, inner)
    }

    /// Opens the devices parked by a test.
    pub fn reopen_parts(&mut self) -> Result<(), OpenError> {
        let (c, z) = self.parked.take().expect("no parked devices");
        self.reopen(c, z)
    }

    /// Reads one block of volume 0.
    pub fn e_read(&mut self, lba: u64) -> Vec<u8> {
        match self.call(Request::Read {
            volume: VolumeUid(1),
            offset: lba * BS,
            len: BS,
        }) {
            Ok(Reply::Read(d)) => d,
            r => panic!("read {lba}: {r:?}"),
        }
    }

    /// Reads every block the model knows; each must be an allowed version, which
    /// becomes the floor.
    pub fn verify(&mut self) {
        for (v, lba) in self.model.touched() {
            let got = match self.call(Request::Read {
                volume: v,
                offset: lba * BS,
                len: BS,
            }) {
                Ok(Reply::Read(d)) => d,
                r => panic!("{v} {lba}: read failed after recovery: {r:?}"),
            };
            let allowed = self.model.allowed(v, lba);
            let Some(&seed) = allowed.iter().find(|&&s| block_of(s) == got) else {
                panic!(
                    "{v} {lba}: read content is none of the allowed versions {allowed:?} (floor {})",
                    allowed[0]
                );
            };
            self.model.observed(v, lba, seed);
        }
        self.e().self_check().unwrap();
    }

    /// Byte range of the cache's metadata structures.
    pub fn superblock_range(&self) -> (u64, u64) {
        (0, 2 * BS)
    }
    pub fn checkpoint_range(&self) -> (u64, u64) {
        let l = &self.layout;
        (
            l.checkpoint_a_start * BS,
            (l.checkpoint_b_start + u64::from(l.checkpoint_blocks)) * BS,
        )
    }
    pub fn journal_range(&self) -> (u64, u64) {
        let l = &self.layout;
        (
            l.journal_start * BS,
            (l.journal_start + u64::from(l.journal_blocks)) * BS,
        )
    }
    pub fn l2p_range(&self) -> (u64, u64) {
        let l = &self.layout;
        (
            l.l2p_area_start * BS,
            (l.l2p_area_start + 2 * u64::from(l.l2p_pool_pages)) * BS,
        )
    }
    pub fn chunk_data_range(&self) -> (u64, u64) {
        let l = &self.layout;
        (l.data_start * BS, l.end() * BS)
    }
    pub fn volume_table_range(&self) -> (u64, u64) {
        let l = &self.layout;
        (
            l.volume_table_start * BS,
            (l.volume_table_start + 2 * l.volume_table_copy_blocks()) * BS,
        )
    }
    /// Byte range of the data zones on the capacity's inner device.
    pub fn zones_range(&self) -> (u64, u64) {
        (self.zone_data_offset + self.zone_bytes, u64::MAX / 2)
    }
}

fn cache_layout(ctl: &FaultController) -> CacheLayout {
    let mut b = vec![0u8; 8192];
    ctl.read_durable(0, &mut b).unwrap();
    let a = Superblock::decode(&b[..4096], 0);
    let bb = Superblock::decode(&b[4096..8192], 4096);
    match (a, bb) {
        (Ok(x), _) | (_, Ok(x)) => x.layout,
        _ => panic!("no superblock after format"),
    }
}
