//! 4 KiB uniform random writes at queue depth 128 on one core, cache in memory and
//! capacity a zone-emulated memory device. Prints IOPS per phase and the WAF figures.
//!
//! cargo run --release -p shale-engine --example write_iops -- [capacity_MiB] [seconds] [l2p_MiB]
//! (l2p_MiB: the L2P page cache budget; default 12.5% of the table)
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use shale_device::{MemDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{Config, Engine, MonotonicClock, Reply, Request};

/// A formatted engine over memory devices (capacity `cap_mib`, cache 5% of it) with
/// one volume over the whole user capacity: (engine, volume, its blocks).
fn setup(
    cap_mib: u64,
    l2p_mib: Option<u64>,
) -> (
    Engine<MemDevice, ZoneEmu<MemDevice>, MonotonicClock>,
    shale_engine::VolumeUid,
    u64,
) {
    let zone = 4u64 << 20;
    let zones = cap_mib * (1 << 20) / zone;
    let inner = MemDevice::new((zones + 2) * zone, 4096).unwrap();
    let mut zc = ZoneEmuConfig::new(zone);
    zc.zone_count_max = zones as u32;
    let cap = ZoneEmu::format(inner, &zc).unwrap();
    // Cache 5% of capacity plus metadata.
    let cache =
        MemDevice::new((cap_mib * (1 << 20) / 20 + (16 << 20)) / 4096 * 4096, 4096).unwrap();
    let config = Config {
        chunk_blocks: 1024,
        volumes_max: 8,
        l2p_cache_bytes_max: l2p_mib.map(|m| m << 20),
        l2p_cache_divisor: 8,
        l2p_cache_floor_bytes: 0,
        ..Config::default()
    };
    let mut e = Engine::format(cache, cap, MonotonicClock::new(), config).unwrap();
    let blocks = e.user_capacity_bytes() / 4096;
    let slot = Arc::new(std::sync::Mutex::new(None));
    let s2 = slot.clone();
    e.submit(
        Request::CreateVolume {
            name: "v".into(),
            size_bytes: blocks * 4096,
        },
        Box::new(move |r| *s2.lock().unwrap() = Some(r)),
    );
    e.run_until_idle().unwrap();
    let v = match slot.lock().unwrap().take().unwrap().unwrap() {
        Reply::Volume(v) => v.uid,
        _ => unreachable!(),
    };
    (e, v, blocks)
}

fn main() {
    // Built with the tests' `paranoid` feature (a dev-dependency): not timed here.
    shale_engine::disable_paranoid_checks();
    let args: Vec<String> = std::env::args().collect();
    let cap_mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let l2p_mib: Option<u64> = args.get(3).and_then(|s| s.parse().ok());
    let (mut e, v, blocks) = setup(cap_mib, l2p_mib);
    let done = Arc::new(AtomicU64::new(0));
    println!(
        "capacity {cap_mib} MiB, user {} MiB, chunks {}, streams {}",
        (blocks * 4096) >> 20,
        e.stats().chunk_count,
        e.streams()
    );
    let data = vec![0x5Au8; 4096];
    let mut x = 0x1234_5678u64;
    let qd = 128u64;
    let start = Instant::now();
    let mut submitted = 0u64;
    let mut phase_start = Instant::now();
    let mut phase_done = 0u64;
    let mut worst_gap = std::time::Duration::ZERO;
    let mut last_done_at = Instant::now();
    let mut last_done = 0;
    while start.elapsed().as_secs() < secs {
        while submitted - done.load(Ordering::Relaxed) < qd {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let lba = x % blocks;
            let d = done.clone();
            e.submit(
                Request::Write {
                    volume: v,
                    offset: lba * 4096,
                    data: data.clone(),
                    fua: false,
                },
                Box::new(move |r| {
                    r.unwrap();
                    d.fetch_add(1, Ordering::Relaxed);
                }),
            );
            submitted += 1;
        }
        e.poll();
        let n = done.load(Ordering::Relaxed);
        if n != last_done {
            worst_gap = worst_gap.max(last_done_at.elapsed());
            last_done_at = Instant::now();
            last_done = n;
        }
        if phase_start.elapsed().as_secs() >= 2 {
            let s = e.stats();
            println!(
                "t={:>3}s  {:>8.0} IOPS  written {:>6} MiB ({:.2}x user cap)  layer WAF {:.2}  cache WAF {:.2}  free chunks {} zones {}  gc {}  worst gap {:?}  buf allocs {}",
                start.elapsed().as_secs(),
                (n - phase_done) as f64 / phase_start.elapsed().as_secs_f64(),
                s.user_write_bytes >> 20,
                s.user_write_bytes as f64 / (blocks * 4096) as f64,
                s.layer_waf(),
                s.cache_waf(),
                s.free_chunks,
                s.free_zones,
                s.gc_victims,
                worst_gap,
                s.io_buffer_allocs
            );
            phase_start = Instant::now();
            phase_done = n;
            worst_gap = std::time::Duration::ZERO;
        }
    }
    e.run_until_idle().unwrap();
    e.self_check().unwrap();
    println!("{:#?}", e.stats());
}
