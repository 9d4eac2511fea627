//! `shale-zns` over arrays: the engine over a [`ZoneArray`] of simulated ZNS drives,
//! and optionally a [`MirrorDevice`] of cache drives (ScalaAFA's two-phase write:
//! the mirrored cache is the replication phase, compaction the conversion into
//! stripes).
//!
//! The array has the single-drive configuration's data capacity and zones: an array
//! zone is one zone on each member, and a row (stripe) holds one 128-block group of
//! the engine in K units of ceil(128 / K) blocks (when K does not divide 128, as at
//! 3+1, 6+1 and 6+2, the last unit of a row ends in padding, so members hold a little
//! more than 1/K). Every member is the `zns-qlc` preset; every cache drive is
//! `optane` with the single cache's size (plus the mirror's label area).

use shale_array::{MirrorDevice, Redundancy, ZoneArray, LABEL_ZONES, MIRROR_RESERVED_BYTES};
use shale_device::{MemDevice, ZoneEmu};
use shale_flashsim::ZnsSim;

use crate::config::SetupError;
use crate::shale::{
    cache_bytes, cache_drive, Cache, ShaleConfig, ShaleMode, ShaleSystem, SimDevice, BLOCK_BYTES,
};
use crate::system::{DeviceRole, SystemUnderTest};

/// Most cache mirrors accepted.
pub const CACHE_DEVICES_MAX: u32 = 4;
/// Most capacity members accepted.
pub const CAPACITY_DEVICES_MAX: u32 = 32;

type Member = ZnsSim<ZoneEmu<MemDevice>>;

/// Checks the array options of `cfg` and returns (K, M) of the capacity array.
pub fn check_array_options(cfg: &ShaleConfig) -> Result<(u32, u32), SetupError> {
    let n = cfg.capacity_devices;
    if n == 0 || n > CAPACITY_DEVICES_MAX {
        return Err(SetupError::CapacityDevices {
            got: n,
            max: CAPACITY_DEVICES_MAX,
        });
    }
    if cfg.cache_devices == 0 || cfg.cache_devices > CACHE_DEVICES_MAX {
        return Err(SetupError::CacheDevices {
            got: cfg.cache_devices,
            max: CACHE_DEVICES_MAX,
        });
    }
    if (n > 1 || cfg.cache_devices > 1) && cfg.mode != ShaleMode::Zns {
        return Err(SetupError::ArrayNeedsZns);
    }
    if n == 1 {
        if cfg.capacity_redundancy != Redundancy::None {
            return Err(SetupError::RedundancyNeedsDevices {
                redundancy: cfg.capacity_redundancy.to_string(),
            });
        }
        return Ok((1, 0));
    }
    if cfg.mode != ShaleMode::Zns {
        return Err(SetupError::ArrayNeedsZns);
    }
    let (k, m) = cfg.capacity_redundancy.shards(n as usize)?;
    shale_array::StripeLayout::choose_unit(k, BLOCK_BYTES).map_err(|e| SetupError::Stripe {
        redundancy: cfg.capacity_redundancy.to_string(),
        reason: e.to_string(),
    })?;
    Ok((k, m))
}

/// Builds `shale-zns` over `cfg.capacity_devices` members and `cfg.cache_devices`
/// cache drives.
pub fn build_shale_array(cfg: &ShaleConfig) -> Result<Box<dyn SystemUnderTest + Send>, SetupError> {
    let (k, _) = check_array_options(cfg)?;
    let zone_bytes = cfg.zone_bytes();
    let zones = u32::try_from(cfg.capacity_bytes / zone_bytes).unwrap_or(u32::MAX);
    let mut devices = Vec::new();
    let capacity = capacity_array(cfg, k, zone_bytes, zones, &mut devices)?;
    let bytes = cache_bytes(cfg);
    if cfg.cache_devices == 1 {
        let cache = cache_drive(bytes, "cache")?;
        devices.push(cache_sim(&cache));
        if let Some(capacity) = capacity {
            return Ok(Box::new(ShaleSystem::new(
                "shale-zns",
                cfg,
                cache,
                capacity,
                devices,
                zone_bytes,
            )?));
        }
        return Err(SetupError::ArrayNeedsZns);
    }
    let mut mirrors = Vec::new();
    for i in 0..cfg.cache_devices {
        let c = cache_drive(bytes + MIRROR_RESERVED_BYTES, &format!("cache{i}"))?;
        devices.push(cache_sim(&c));
        mirrors.push((Some(c), format!("cache{i}")));
    }
    let cache = MirrorDevice::new(mirrors)?;
    match capacity {
        Some(capacity) => Ok(Box::new(ShaleSystem::new(
            "shale-zns",
            cfg,
            cache,
            capacity,
            devices,
            zone_bytes,
        )?)),
        None => {
            // One capacity drive under a mirrored cache.
            let zns = single_member(zone_bytes, zones, "zns")?;
            devices.insert(0, member_sim(&zns));
            Ok(Box::new(ShaleSystem::new(
                "shale-zns",
                cfg,
                cache,
                zns,
                devices,
                zone_bytes,
            )?))
        }
    }
}

fn cache_sim(c: &Cache) -> SimDevice {
    SimDevice {
        role: DeviceRole::Cache,
        preset: "optane",
        stats: c.stats_handle(),
    }
}

fn member_sim(m: &Member) -> SimDevice {
    SimDevice {
        role: DeviceRole::Capacity,
        preset: "zns-qlc",
        stats: m.stats_handle(),
    }
}

/// One `zns-qlc` drive of `zones` zones of `zone_bytes` over memory.
fn single_member(zone_bytes: u64, zones: u32, name: &str) -> Result<Member, SetupError> {
    let inner = MemDevice::new(
        crate::zone_emu_inner_bytes(zone_bytes, zones),
        BLOCK_BYTES as u32,
    )?
    .with_name(name);
    let emu = crate::zoned_over(inner, zone_bytes, zones)?;
    Ok(ZnsSim::from_preset(
        emu,
        &shale_flashsim::preset("zns-qlc")?,
    )?)
}

/// The capacity array (`None` for one drive), its members' simulations appended to
/// `devices`.
fn capacity_array(
    cfg: &ShaleConfig,
    k: u32,
    zone_bytes: u64,
    zones: u32,
    devices: &mut Vec<SimDevice>,
) -> Result<Option<ZoneArray<Member>>, SetupError> {
    if cfg.capacity_devices <= 1 {
        return Ok(None);
    }
    // Member zones of the array zone's rows: one unit per 512 KiB row.
    let unit =
        shale_array::StripeLayout::choose_unit(k, BLOCK_BYTES).map_err(|e| SetupError::Stripe {
            redundancy: cfg.capacity_redundancy.to_string(),
            reason: e.to_string(),
        })?;
    let member_zone = zone_bytes / shale_array::STRIPE_BYTES_MAX * unit;
    let mut members = Vec::new();
    for i in 0..cfg.capacity_devices {
        let m = single_member(member_zone, zones + LABEL_ZONES, &format!("m{i}"))?;
        devices.push(member_sim(&m));
        members.push((Some(m), format!("m{i}")));
    }
    Ok(Some(ZoneArray::new(
        members,
        cfg.capacity_redundancy,
        unit,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_workload::{IoKind, IoOp};

    fn cfg(n: u32, r: &str, cache: u32) -> ShaleConfig {
        ShaleConfig {
            capacity_devices: n,
            capacity_redundancy: r.parse().expect("redundancy"),
            cache_devices: cache,
            ..ShaleConfig::standard(ShaleMode::Zns, 128 << 20, 4)
        }
    }

    fn write_everything(s: &mut dyn SystemUnderTest, passes: u64) {
        let vol = s.volume_bytes();
        for pass in 0..passes {
            for off in (0..vol).step_by(65536) {
                for t in 0..4 {
                    let o = (off + pass * 4096 * u64::from(t)) % vol / 65536 * 65536;
                    s.submit(&IoOp {
                        tenant: t,
                        kind: IoKind::Write,
                        offset: o,
                        len: 65536,
                        not_before_ns: 0,
                    })
                    .expect("write");
                }
            }
        }
        s.drain().expect("drain");
    }

    #[test]
    fn arrays_keep_the_single_drive_volumes_and_report_every_device() {
        let single = build_shale(&cfg(1, "none", 1)).expect("single");
        for (n, r, cache, parity) in [
            (5, "4+1", 2, 1.25),
            (3, "2+1", 1, 1.5),
            (2, "mirror", 2, 2.0),
        ] {
            let mut s = build_shale(&cfg(n, r, cache)).expect(r);
            assert_eq!(s.volume_bytes(), single.volume_bytes(), "{r}");
            write_everything(s.as_mut(), 3);
            let d = s.devices();
            assert_eq!(d.len(), (n + cache) as usize, "{r}");
            let cap: Vec<_> = d
                .iter()
                .filter(|x| x.role == DeviceRole::Capacity)
                .collect();
            assert_eq!(cap.len(), n as usize);
            assert!(d[..n as usize]
                .iter()
                .all(|x| x.role == DeviceRole::Capacity));
            let written: u64 = cap.iter().map(|x| x.stats.host_bytes_written).sum();
            let compacted = s.traffic().iter().map(|t| t.bytes).sum::<u64>();
            assert!(compacted > 0, "{r}");
            // The members receive the engine's zone writes times the code's overhead
            // (plus the labels' padding).
            let ratio = written as f64 / compacted as f64;
            assert!((ratio - parity).abs() < 0.05, "{r}: {ratio}");
            // Parity rotates: every member writes.
            assert!(cap.iter().all(|x| x.stats.host_bytes_written > 0), "{r}");
            if cache > 1 {
                let caches: Vec<_> = d.iter().filter(|x| x.role == DeviceRole::Cache).collect();
                assert_eq!(
                    caches[0].stats.host_bytes_written,
                    caches[1].stats.host_bytes_written
                );
            }
        }
    }

    use crate::shale::build_shale;

    #[test]
    fn bad_array_options_are_typed_errors() {
        let err = |c: ShaleConfig| build_shale(&c).err().expect("refused");
        assert!(matches!(err(cfg(4, "4+1", 1)), SetupError::ArrayLayout(_)));
        assert!(matches!(
            err(cfg(1, "4+1", 1)),
            SetupError::RedundancyNeedsDevices { .. }
        ));
        assert!(matches!(
            err(cfg(5, "4+1", 0)),
            SetupError::CacheDevices { .. }
        ));
        assert!(matches!(
            err(cfg(0, "none", 1)),
            SetupError::CapacityDevices { .. }
        ));
        let blk = ShaleConfig {
            mode: ShaleMode::Blk,
            ..cfg(5, "4+1", 1)
        };
        assert!(matches!(err(blk), SetupError::ArrayNeedsZns));
    }
}
