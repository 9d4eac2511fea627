//! What the shard tests share: tiny devices and a configuration on which compaction
//! and GC run constantly.
#![allow(dead_code, clippy::unwrap_used)]

use shale_device::{MemDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{Config, Reply, Request, VolumeUid};

pub const BS: u64 = 4096;
/// Zones of one 128-block group each.
pub const ZONE_BLOCKS: u64 = 128;

pub type MemCap = ZoneEmu<MemDevice>;

/// Zone emulation of `zones` zones of [`ZONE_BLOCKS`] blocks.
pub fn zone_config(zones: u32) -> ZoneEmuConfig {
    let mut zc = ZoneEmuConfig::new(ZONE_BLOCKS * BS);
    zc.zone_count_max = zones;
    zc.max_open_zones = 8;
    zc.max_active_zones = 8;
    zc
}

/// One shard's devices in memory: a cache of `chunks` chunks of 256 blocks (and its
/// metadata) and `zones` zones (and the emulation's metadata).
pub fn mem_devices(chunks: u64, zones: u32) -> (MemDevice, MemCap) {
    let cache = MemDevice::new((128 + chunks * 256) * BS, 4096).unwrap();
    let inner = MemDevice::new((u64::from(zones) + 2) * ZONE_BLOCKS * BS, 4096).unwrap();
    (cache, ZoneEmu::format(inner, &zone_config(zones)).unwrap())
}

/// Tiny chunks and tight thresholds (compaction and GC run constantly), one stream.
pub fn tiny_config() -> Config {
    Config {
        streams_max: 1,
        ..shale_testkit::tiny_config()
    }
}

/// Creates volume "v" of `size` bytes through `call`; returns its uid.
pub fn create(
    size: u64,
    mut call: impl FnMut(Request) -> Result<Reply, shale_engine::EngineError>,
) -> VolumeUid {
    let r = Request::CreateVolume {
        name: "v".into(),
        size_bytes: size,
    };
    match call(r).unwrap() {
        Reply::Volume(i) => i.uid,
        r => panic!("{r:?}"),
    }
}

/// Every block of `v` reads as the model says (`0`: never written; otherwise the
/// pattern of that id).
pub fn check_blocks(
    v: VolumeUid,
    model: &[u64],
    ctx: &str,
    mut call: impl FnMut(Request) -> Result<Reply, shale_engine::EngineError>,
) {
    for (b, &id) in model.iter().enumerate() {
        let r = Request::Read {
            volume: v,
            offset: b as u64 * BS,
            len: BS,
        };
        let got = match call(r).unwrap() {
            Reply::Read(d) => d,
            r => panic!("{r:?}"),
        };
        let want = if id == 0 {
            vec![0; BS as usize]
        } else {
            shale_testkit::pattern(id, BS as usize)
        };
        assert!(got == want, "{ctx}block {b}");
    }
}
