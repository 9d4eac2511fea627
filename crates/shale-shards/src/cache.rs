//! One cache device divided between the shards of a pool (`SharedCache`): each
//! shard's metadata in a window of its own, every chunk in one area the shards share
//! and lend (docs/engine.md, "Chunks lent between shards").
//!
//! The window is the metadata a format would lay out on the whole device, rounded up
//! to 1 MiB: no shard's view is larger than the device, so none needs more. Each
//! shard is formatted with its chunks beginning right at the window's end
//! (`Config::cache_data_start_min`), so shard 0's superblock alone tells an open
//! where everything is: the window is its `data_start`.

use shale_device::{BlockDevice, CacheSplit, DeviceInfo, ZoneGeometry, ZonedDevice};
use shale_engine::Config;
use shale_format::Superblock;

use crate::ShardsError;

const WINDOW_ALIGN: u64 = 1 << 20;

/// Each shard's views of a shared cache and a shared capacity device.
pub type PooledDevices<C, Z> = Vec<(shale_device::SharedCache<C>, shale_device::SharedZones<Z>)>;

fn space(reason: String) -> ShardsError {
    ShardsError::Space { reason }
}

/// How a format divides `cache` between `shards` shards, each formatted with
/// `config` over a capacity of `capacity` (its view of a shared device).
pub fn cache_split(
    cache: &DeviceInfo,
    capacity: &ZoneGeometry,
    config: &Config,
    shards: usize,
) -> Result<CacheSplit, ShardsError> {
    let n = u32::try_from(shards)
        .ok()
        .filter(|&n| n >= 2)
        .ok_or_else(|| space(format!("{shards} shards cannot share a cache")))?;
    let format = |source| ShardsError::Format { shard: 0, source };
    let whole = shale_engine::format_layout(cache, capacity, config).map_err(format)?;
    let meta = (whole.data_start * 4096).next_multiple_of(WINDOW_ALIGN);
    let view_bytes = cache
        .size_bytes
        .checked_sub(u64::from(n - 1) * meta)
        .filter(|&v| v > meta)
        .ok_or_else(|| {
            space(format!(
                "a cache of {} bytes holds no chunks after {n} metadata windows of {meta}",
                cache.size_bytes
            ))
        })?;
    let view = DeviceInfo {
        size_bytes: view_bytes,
        ..cache.clone()
    };
    let cfg = Config {
        cache_data_start_min: Some(meta),
        ..config.clone()
    };
    let l = shale_engine::format_layout(&view, capacity, &cfg).map_err(format)?;
    let split = CacheSplit {
        shards: n,
        meta_bytes: l.data_start * 4096,
        chunk_bytes: u64::from(l.chunk_blocks) * 4096,
        chunks: l.chunk_count,
        view_bytes,
    };
    if split.meta_bytes != meta || split.chunks < 2 * n {
        return Err(space(format!(
            "{split:?}: {n} shards need a metadata window of {meta} bytes and 2 chunks each"
        )));
    }
    Ok(split)
}

/// How a format divided `cache` between shards, from shard 0's superblock; `None`
/// when shard 1's superblock is not where the split puts it (each shard has its own
/// cache, or the cache was divided otherwise).
pub fn recorded_cache_split<C: BlockDevice>(
    cache: &mut C,
) -> Result<Option<CacheSplit>, ShardsError> {
    let Some(sb0) = superblock_at(cache, 0)? else {
        return Ok(None);
    };
    let n = u32::from(sb0.shard.count);
    if n < 2 {
        return Ok(None);
    }
    let split = CacheSplit {
        shards: n,
        meta_bytes: sb0.layout.data_start * 4096,
        chunk_bytes: u64::from(sb0.layout.chunk_blocks) * 4096,
        chunks: sb0.layout.chunk_count,
        view_bytes: sb0.cache_size_blocks * 4096,
    };
    if split.device_bytes() > cache.info().size_bytes {
        return Ok(None);
    }
    let shard1 = superblock_at(cache, split.meta_bytes)?;
    Ok(shard1
        .filter(|sb| sb.shard.index == 1 && sb.shard.pool == sb0.shard.pool)
        .map(|_| split))
}

/// The devices of a pool of `shards` shards over one cache and one capacity device,
/// and the configuration to format them with: shard `i` starts with the run of
/// zones and the run of chunks from its views' 0, and the space manager hands out
/// the remainders.
pub fn pooled_devices<C: BlockDevice, Z: shale_device::ZonedDevice>(
    cache: C,
    capacity: Z,
    config: &Config,
    shards: usize,
) -> Result<(PooledDevices<C, Z>, Config), ShardsError> {
    let n = shards.max(1);
    let per = capacity.geometry().zone_count / n as u32;
    let zones = shale_device::SharedZones::split(capacity, n).map_err(space)?;
    let mut config = Config {
        zones_owned: Some(per),
        ..config.clone()
    };
    let split = cache_split(cache.info(), zones[0].geometry(), &config, n)?;
    config.chunks_owned = Some(split.per());
    config.cache_data_start_min = Some(split.meta_bytes);
    let caches = shale_device::SharedCache::split(cache, split).map_err(space)?;
    Ok((caches.into_iter().zip(zones).collect(), config))
}

/// The devices of a pool [`pooled_devices`] formatted, found again from shard 0's
/// superblock.
pub fn pooled_devices_recorded<C: BlockDevice, Z: shale_device::ZonedDevice>(
    mut cache: C,
    capacity: Z,
) -> Result<PooledDevices<C, Z>, ShardsError> {
    let split = recorded_cache_split(&mut cache)?.ok_or_else(|| {
        space(
            "the cache holds no pool of shards sharing it (shard 1 is not where shard 0 puts it)"
                .into(),
        )
    })?;
    let zones = shale_device::SharedZones::split(capacity, split.shards as usize).map_err(space)?;
    let caches = shale_device::SharedCache::split(cache, split).map_err(space)?;
    Ok(caches.into_iter().zip(zones).collect())
}

/// The superblock of a shard whose metadata begins at `at`: copy A, else copy B.
fn superblock_at<C: BlockDevice>(
    cache: &mut C,
    at: u64,
) -> Result<Option<Superblock>, ShardsError> {
    let mut buf = vec![0u8; 4096];
    for copy in 0..2 {
        let off = at + copy * 4096;
        if off + 4096 > cache.info().size_bytes {
            return Ok(None);
        }
        cache
            .read_at(off, &mut buf)
            .map_err(|e| space(format!("reading a superblock at {off}: {e}")))?;
        if let Ok(sb) = Superblock::decode(&buf, off) {
            return Ok(Some(sb));
        }
    }
    Ok(None)
}
