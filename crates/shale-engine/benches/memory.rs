//! The engine's resident memory over a large sparse capacity file.
//!
//! Formats a sparse cache file (`--cache-pct` of the capacity) and a sparse capacity
//! file with zone emulation (64 MiB zones, as `shale serve` uses), with the engine's
//! default settings, and prints the process's VmRSS and VmHWM (from /proc/self/status)
//! after format, after a clean reopen, and after random 4 KiB writes spread over the
//! whole volume (enough to fill the L2P page cache to its budget), with the L2P and md
//! cache figures. Sparse files cost no disk until written; both files are deleted at
//! the end (the writes put `--write-mib` MiB on disk meanwhile).
//!
//! ```text
//! cargo bench -p shale-engine --bench memory -- [--capacity-gib 1024] [--cache-pct 5]
//!     [--dir DIR] [--write-mib 1024] [--zone-mib 64]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use shale_device::{FileDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{Config, Engine, MonotonicClock, Reply, Request};

const BLOCK: u64 = 4096;

struct Args {
    capacity_gib: u64,
    cache_pct: u64,
    dir: PathBuf,
    write_mib: u64,
    zone_mib: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        capacity_gib: 1024,
        cache_pct: 5,
        dir: std::env::temp_dir(),
        write_mib: 1024,
        zone_mib: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--bench" {
            continue;
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--capacity-gib" => a.capacity_gib = num()?.max(1),
            "--cache-pct" => a.cache_pct = num()?.clamp(1, 50),
            "--dir" => a.dir = PathBuf::from(&v),
            "--write-mib" => a.write_mib = num()?,
            "--zone-mib" => a.zone_mib = num()?.max(1),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// (VmRSS, VmHWM) in KiB.
fn rss() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn report(step: &str, capacity_gib: u64) {
    let (rss, hwm) = rss();
    let per_tib = |kib: u64| kib as f64 / 1024.0 / (capacity_gib as f64 / 1024.0);
    println!(
        "{step:<28} VmRSS {:>7.1} MiB  VmHWM {:>7.1} MiB  ({:.1} / {:.1} MiB per TiB of capacity)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        per_tib(rss),
        per_tib(hwm)
    );
}

type Eng = Engine<FileDevice, ZoneEmu<FileDevice>, MonotonicClock>;

fn call(e: &mut Eng, req: Request) -> Reply {
    let slot = Arc::new(Mutex::new(None));
    let s2 = Arc::clone(&slot);
    e.submit(req, Box::new(move |r| *s2.lock().unwrap() = Some(r)));
    e.run_until_idle().expect("engine");
    let r = slot.lock().unwrap().take();
    r.expect("completed").expect("request")
}

/// `writes` random 4 KiB writes over the volume's `blocks`, 128 in flight.
fn random_writes(e: &mut Eng, volume: shale_engine::VolumeUid, blocks: u64, writes: u64) {
    let done = Arc::new(AtomicU64::new(0));
    let data = vec![0xA5u8; BLOCK as usize];
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut submitted = 0u64;
    while submitted < writes {
        while submitted < writes && submitted - done.load(Ordering::Relaxed) < 128 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = Arc::clone(&done);
            e.submit(
                Request::Write {
                    volume,
                    offset: (x % blocks) * BLOCK,
                    data: data.clone(),
                    fua: false,
                },
                Box::new(move |r| {
                    r.expect("write");
                    d.fetch_add(1, Ordering::Relaxed);
                }),
            );
            submitted += 1;
        }
        if !e.poll() {
            e.wait_io();
        }
    }
}

fn main() {
    // Built with the tests' `paranoid` feature (a dev-dependency): not timed here.
    shale_engine::disable_paranoid_checks();
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("memory: {e}");
            std::process::exit(2);
        }
    };
    let cap_bytes = a.capacity_gib << 30;
    let zone = a.zone_mib << 20;
    let zones = (cap_bytes / zone) as u32;
    let mut zc = ZoneEmuConfig::new(zone);
    zc.zone_count_max = zones;
    let id = std::process::id();
    let cache_path = a.dir.join(format!("shale-memory-{id}.cache"));
    let cap_path = a.dir.join(format!("shale-memory-{id}.capacity"));
    let cache_bytes = cap_bytes / 100 * a.cache_pct / BLOCK * BLOCK;
    println!(
        "capacity {} GiB ({zones} zones of {} MiB), cache {} GiB ({}%), default engine settings",
        a.capacity_gib,
        a.zone_mib,
        cache_bytes >> 30,
        a.cache_pct
    );
    report("start", a.capacity_gib);
    let run = || {
        FileDevice::create_sparse(&cache_path, cache_bytes).expect("cache file");
        FileDevice::create_sparse(&cap_path, zc.device_bytes_for(zones).expect("size"))
            .expect("capacity file");
        let cache = FileDevice::open(&cache_path).expect("open cache");
        let cap = ZoneEmu::format(FileDevice::open(&cap_path).expect("open capacity"), &zc)
            .expect("zone emulation");
        let t = Instant::now();
        let mut e: Eng =
            Engine::format(cache, cap, MonotonicClock::new(), Config::default()).expect("format");
        let user = e.user_capacity_bytes();
        println!(
            "formatted in {:.1} s: user capacity {} GiB, {} chunks, L2P budget {} pages ({} MiB)",
            t.elapsed().as_secs_f64(),
            user >> 30,
            e.stats().chunk_count,
            e.stats().l2p_cache_pages_max,
            (e.stats().l2p_cache_pages_max * 4096) >> 20
        );
        report("after format", a.capacity_gib);
        let volume = match call(
            &mut e,
            Request::CreateVolume {
                name: "v".into(),
                size_bytes: user,
            },
        ) {
            Reply::Volume(v) => v.uid,
            other => panic!("create: {other:?}"),
        };
        let (cache, cap) = e.shutdown().expect("shutdown");
        drop((cache, cap));
        let cache = FileDevice::open(&cache_path).expect("reopen cache");
        let cap = ZoneEmu::open(FileDevice::open(&cap_path).expect("reopen capacity"))
            .expect("reopen zones");
        let t = Instant::now();
        let mut e: Eng =
            Engine::open(cache, cap, MonotonicClock::new(), Config::default()).expect("open");
        println!("reopened in {:.1} s", t.elapsed().as_secs_f64());
        report("after open", a.capacity_gib);
        // Random 4 KiB writes over the whole volume: each touches a random L2P page, so
        // the page cache fills to its budget.
        let blocks = user / BLOCK;
        let writes = (a.write_mib << 20) / BLOCK;
        let t = Instant::now();
        random_writes(&mut e, volume, blocks, writes);
        e.run_until_idle().expect("drain");
        let s = e.stats();
        println!(
            "wrote {} MiB in {} random 4 KiB writes in {:.1} s: L2P {} of {} pages cached, md cache {} MiB, idle I/O buffers {} MiB",
            a.write_mib,
            writes,
            t.elapsed().as_secs_f64(),
            s.l2p_cached_pages,
            s.l2p_cache_pages_max,
            s.md_cache_bytes >> 20,
            s.io_buffer_pool_bytes >> 20
        );
        report("after writing", a.capacity_gib);
        let (cache, cap) = e.shutdown().expect("shutdown");
        drop((cache, cap));
        report("after shutdown", a.capacity_gib);
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
    let _ = std::fs::remove_file(&cache_path);
    let _ = std::fs::remove_file(&cap_path);
    if r.is_err() {
        std::process::exit(1);
    }
}
