//! Test harness: tiny devices and synchronous calls over the engine.
#![allow(dead_code, clippy::unwrap_used)]

pub mod rig;

use shale_device::{BlockDevice, MemDevice, ZoneEmu, ZoneEmuConfig, ZonedDevice};
use shale_engine::{Clock, Config, Engine, EngineError, ManualClock, Reply, Request, VolumeUid};
pub use shale_testkit::{call, pattern};

pub type Cap = ZoneEmu<MemDevice>;
pub type Eng = Engine<MemDevice, Cap, ManualClock>;

pub const ZONE_BLOCKS: u64 = 256;

/// A cache of `cache_blocks` and `zones` zones of 256 blocks over memory.
pub fn devices(cache_blocks: u64, zones: u64) -> (MemDevice, Cap) {
    devices_with(cache_blocks, zones, ZONE_BLOCKS)
}

pub fn devices_with(cache_blocks: u64, zones: u64, zone_blocks: u64) -> (MemDevice, Cap) {
    let cache = MemDevice::new(cache_blocks * 4096, 4096)
        .unwrap()
        .with_name("cache");
    // Room for the emulator's metadata.
    let inner = MemDevice::new((zones + 2) * zone_blocks * 4096, 4096)
        .unwrap()
        .with_name("capacity");
    let mut zc = ZoneEmuConfig::new(zone_blocks * 4096);
    zc.zone_count_max = zones as u32;
    zc.max_open_zones = 8;
    zc.max_active_zones = 8;
    let cap = ZoneEmu::format(inner, &zc).unwrap();
    (cache, cap)
}

/// Tiny chunks and tight thresholds (compaction and GC run constantly), with more
/// spare than the crash simulator's so the tests' fill levels leave GC room.
pub fn tiny_config() -> Config {
    Config {
        spare_factor: 0.2,
        compaction_free_chunks_pct: 40,
        gc_free_zones_min: 4,
        ..shale_testkit::tiny_config()
    }
}

pub fn tiny_engine() -> Eng {
    let (c, z) = devices(128 + 8 * 256, 28);
    Engine::format(c, z, ManualClock::new(), tiny_config()).unwrap()
}

pub fn create<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    e: &mut Engine<C, Z, K>,
    name: &str,
    bytes: u64,
) -> VolumeUid {
    match call(
        e,
        Request::CreateVolume {
            name: name.into(),
            size_bytes: bytes,
        },
    )
    .unwrap()
    {
        Reply::Volume(v) => v.uid,
        r => panic!("unexpected {r:?}"),
    }
}

pub fn write<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    e: &mut Engine<C, Z, K>,
    volume: VolumeUid,
    offset: u64,
    data: &[u8],
) -> Result<(), EngineError> {
    call(
        e,
        Request::Write {
            volume,
            offset,
            data: data.to_vec(),
            fua: false,
        },
    )
    .map(|_| ())
}

pub fn read<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    e: &mut Engine<C, Z, K>,
    volume: VolumeUid,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, EngineError> {
    match call(
        e,
        Request::Read {
            volume,
            offset,
            len,
        },
    )? {
        Reply::Read(d) => Ok(d),
        r => panic!("unexpected {r:?}"),
    }
}

/// Clean shutdown and reopen, the capacity device reopened from its own metadata.
pub fn reopen(e: Eng, config: Config) -> Eng {
    let (c, z) = e.shutdown().unwrap();
    let z = ZoneEmu::open(z.into_inner()).unwrap();
    Engine::open(c, z, ManualClock::new(), config).unwrap()
}

/// A copy of a memory device (for opening the same image twice).
pub fn copy_mem(d: &mut MemDevice) -> MemDevice {
    let size = d.info().size_bytes;
    let mut out = MemDevice::new(size, d.info().logical_block_size)
        .unwrap()
        .with_name(d.info().name.clone());
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        d.read_at(at, &mut buf[..n]).unwrap();
        if buf[..n].iter().any(|&b| b != 0) {
            out.write_at(at, &buf[..n]).unwrap();
        }
        at += n as u64;
    }
    out
}
