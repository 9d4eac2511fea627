//! What the shard tests share: tiny devices and a configuration on which compaction
//! and GC run constantly.
#![allow(dead_code, clippy::unwrap_used)]

use shale_device::{MemDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::Config;

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

/// Tiny chunks and tight thresholds: compaction and GC run constantly.
pub fn tiny_config() -> Config {
    Config {
        chunk_blocks: 256,
        volumes_max: 4,
        spare_factor: 0.05,
        journal_blocks: 16,
        compaction_free_chunks_pct: 50,
        gc_free_zones_min: 8,
        l2p_cache_bytes_max: Some(16 * 4096),
        l2p_reserved_pages: 2,
        md_cache_bytes_max: 8 * 4096,
        write_buffers_max: 4,
        request_bytes_max: 64 * 1024,
        streams_max: 1,
        requests_per_poll_max: 8,
        background_steps_per_poll_max: 4,
        ..Config::default()
    }
}
