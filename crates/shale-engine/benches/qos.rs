//! Per-volume limits beside a noisy neighbour: does a volume get what its limits say,
//! no more and no less, while another volume writes as fast as the engine goes?
//!
//! The engine runs on its own thread (`EngineThread`, as in the daemon, so the rate
//! limits sleep and wake as they do there) over a cache and a capacity in memory. Two
//! volumes split the user capacity; a client thread per volume keeps its queue full of
//! random writes. Three phases of `--secs` each, on one engine, every figure measured:
//!
//! - `iops`: `quiet` limited to `--iops` requests per second (4 KiB writes, queue depth
//!   16), `noisy` unlimited (4 KiB writes, queue depth 64);
//! - `mibps`: `quiet` limited to `--mibps` MiB/s (64 KiB writes), `noisy` as above;
//! - `share`: `noisy` with a cache share of `--share` percent, `quiet` unlimited at a
//!   quarter of the writes; the cache's valid blocks of each volume sampled every
//!   50 ms. The same phase without the share, on a fresh engine, shows what the noisy
//!   volume takes otherwise.
//!
//! Each rate is measured over the phase after its first second (the token bucket
//! starts full). `--repeat N` runs everything N times and prints the medians.
//!
//! ```text
//! cargo bench -p shale-engine --bench qos -- [--secs 10] [--iops 5000] [--mibps 50]
//!     [--share 20] [--capacity-mib 4096] [--repeat 1]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use shale_device::{MemDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{
    Config, Engine, EngineThread, MonotonicClock, Reply, Request, VolumeLimits, VolumeUid,
};

const BLOCK: u64 = 4096;
const ZONE_BYTES: u64 = 4 << 20;

type Thread = EngineThread<MemDevice, ZoneEmu<MemDevice>>;

#[derive(Debug, Clone)]
struct Args {
    secs: u64,
    iops: u64,
    mibps: u64,
    share: u8,
    capacity_mib: u64,
    repeat: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        secs: 10,
        iops: 5000,
        mibps: 50,
        share: 20,
        capacity_mib: 4096,
        repeat: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--bench" {
            continue; // cargo bench passes it
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let n = v.parse::<u64>().map_err(|e| format!("{flag}: {e}"))?;
        match flag.as_str() {
            "--secs" => a.secs = n.max(2),
            "--iops" => a.iops = n.max(1),
            "--mibps" => a.mibps = n.max(1),
            "--share" => a.share = n.clamp(1, 100) as u8,
            "--capacity-mib" => a.capacity_mib = n.max(512),
            "--repeat" => a.repeat = n.clamp(1, 99) as usize,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// A fresh engine on its thread with volumes `noisy` and `quiet`, and the cache's
/// data bytes (what a share is a percentage of).
fn build(a: &Args) -> (Arc<Thread>, VolumeUid, VolumeUid, u64, u64) {
    let mut zc = ZoneEmuConfig::new(ZONE_BYTES);
    let zones = a.capacity_mib * (1 << 20) / ZONE_BYTES;
    zc.zone_count_max = zones as u32;
    let bytes = zc.device_bytes_for(zones as u32).expect("capacity size");
    let cap = ZoneEmu::format(MemDevice::new(bytes, 4096).expect("capacity"), &zc).expect("zones");
    // Cache: 5% of the capacity plus room for the metadata, in 1 MiB chunks so a
    // share is many chunks.
    let cache_bytes = (a.capacity_mib * (1 << 20) / 20 + (16 << 20)) / BLOCK * BLOCK;
    let cache = MemDevice::new(cache_bytes, 4096).expect("cache");
    let config = Config {
        chunk_blocks: 256,
        volumes_max: 8,
        ..Config::default()
    };
    let e = Engine::format(cache, cap, MonotonicClock::new(), config).expect("format");
    let half = e.user_capacity_bytes() / 2 / BLOCK * BLOCK;
    let cache_data = e.cache_data_bytes();
    let t = Arc::new(EngineThread::spawn(e, 1024).expect("engine thread"));
    let create = |name: &str| match t.call(Request::CreateVolume {
        name: name.into(),
        size_bytes: half,
    }) {
        Ok(Reply::Volume(v)) => v.uid,
        other => panic!("create {name}: {other:?}"),
    };
    let noisy = create("noisy");
    let quiet = create("quiet");
    (t, noisy, quiet, half / BLOCK, cache_data)
}

fn set_limits(t: &Thread, volume: VolumeUid, limits: VolumeLimits) {
    t.call(Request::SetVolumeLimits { volume, limits })
        .expect("set limits");
}

/// Requests completed and bytes written by one client, and whether any failed.
#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    bytes: AtomicU64,
    failed: AtomicU64,
}

/// What one client sends: random writes of `len` bytes to `volume`, `qd` in flight.
#[derive(Debug, Clone, Copy)]
struct Load {
    volume: VolumeUid,
    len: u64,
    qd: u64,
}

/// A client thread keeping its load in flight until `stop`.
fn client(
    t: Arc<Thread>,
    load: Load,
    blocks: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
) -> std::thread::JoinHandle<()> {
    let Load { volume, len, qd } = load;
    std::thread::spawn(move || {
        let (tx, rx) = mpsc::channel::<()>();
        let mut x = seed | 1;
        let span = blocks - len / BLOCK;
        let data = vec![0x3cu8; len as usize];
        let mut in_flight = 0u64;
        while !stop.load(Ordering::Relaxed) {
            while in_flight < qd {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Aligned to the request size, as fio's random writes are.
                let offset = (x % span) / (len / BLOCK) * len;
                let (tx, c) = (tx.clone(), Arc::clone(&counters));
                let done = Box::new(move |r: Result<Reply, _>| {
                    if r.is_ok() {
                        c.ops.fetch_add(1, Ordering::Relaxed);
                        c.bytes.fetch_add(len, Ordering::Relaxed);
                    } else {
                        c.failed.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = tx.send(());
                });
                let req = Request::Write {
                    volume,
                    offset,
                    data: data.clone(),
                    fua: false,
                };
                t.submit(req, done).expect("submit");
                in_flight += 1;
            }
            if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                in_flight -= 1;
            }
        }
        while in_flight > 0 {
            rx.recv().expect("completion");
            in_flight -= 1;
        }
    })
}

/// One client per load for `secs`; returns each one's rate (requests/s, bytes/s) over the phase after its first second, and calls
/// `sample` every 50 ms meanwhile.
fn run(
    t: &Arc<Thread>,
    blocks: u64,
    secs: u64,
    clients: &[Load],
    mut sample: impl FnMut(&Thread, bool),
) -> Vec<(f64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<Arc<Counters>> = clients.iter().map(|_| Arc::default()).collect();
    let handles: Vec<_> = clients
        .iter()
        .zip(&counters)
        .enumerate()
        .map(|(i, (&load, c))| {
            let seed = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1);
            client(
                Arc::clone(t),
                load,
                blocks,
                seed,
                Arc::clone(&stop),
                Arc::clone(c),
            )
        })
        .collect();
    let t0 = Instant::now();
    let warm = Duration::from_secs(1);
    let mut at_warm: Option<(Instant, Vec<(u64, u64)>)> = None;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(50));
        let warmed = t0.elapsed() >= warm;
        if warmed && at_warm.is_none() {
            let snap = counters
                .iter()
                .map(|c| {
                    (
                        c.ops.load(Ordering::Relaxed),
                        c.bytes.load(Ordering::Relaxed),
                    )
                })
                .collect();
            at_warm = Some((Instant::now(), snap));
        }
        sample(t, warmed);
    }
    let (t1, base) = at_warm.expect("a phase lasts more than a second");
    let wall = t1.elapsed().as_secs_f64();
    let rates = counters
        .iter()
        .zip(&base)
        .map(|(c, &(ops, bytes))| {
            (
                (c.ops.load(Ordering::Relaxed) - ops) as f64 / wall,
                (c.bytes.load(Ordering::Relaxed) - bytes) as f64 / wall,
            )
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("client thread");
    }
    for c in &counters {
        assert_eq!(c.failed.load(Ordering::Relaxed), 0, "a write failed");
    }
    rates
}

/// The cache's valid bytes of each volume (noisy, quiet), as percentages of `cache`.
fn shares(t: &Thread, noisy: VolumeUid, quiet: VolumeUid, cache: u64) -> (f64, f64) {
    let Ok(Reply::Stats(s)) = t.call(Request::Stats) else {
        panic!("stats")
    };
    let pct = |v: VolumeUid| {
        s.volumes
            .iter()
            .find(|x| x.uid == v)
            .map_or(0.0, |x| x.cache_valid_bytes as f64 * 100.0 / cache as f64)
    };
    (pct(noisy), pct(quiet))
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    iops_quiet: f64,
    iops_noisy: f64,
    mibps_quiet: f64,
    mibps_noisy_iops: f64,
    share_max: f64,
    share_mean: f64,
    quiet_min: f64,
    free_max: f64,
    free_mean: f64,
}

/// The share phase on a fresh engine: `noisy` (share `pct`, 0 for none) and `quiet`
/// (a quarter of the writes); (noisy's most and mean share, quiet's least) after the
/// first second.
fn share_phase(a: &Args, pct: u8) -> (f64, f64, f64) {
    let (t, noisy, quiet, blocks, cache) = build(a);
    if pct > 0 {
        let l = VolumeLimits {
            cache_share_pct: pct,
            ..VolumeLimits::NONE
        };
        set_limits(&t, noisy, l);
    }
    let (mut most, mut sum, mut n, mut least) = (0f64, 0f64, 0u64, f64::MAX);
    run(
        &t,
        blocks,
        a.secs,
        &[load(noisy, BLOCK, 48), load(quiet, BLOCK, 16)],
        |t, warmed| {
            if warmed {
                let (s, q) = shares(t, noisy, quiet, cache);
                most = most.max(s);
                least = least.min(q);
                sum += s;
                n += 1;
            }
        },
    );
    shut(t);
    (most, sum / n.max(1) as f64, least)
}

fn load(volume: VolumeUid, len: u64, qd: u64) -> Load {
    Load { volume, len, qd }
}

fn shut(t: Arc<Thread>) {
    let t = Arc::try_unwrap(t).unwrap_or_else(|_| panic!("clients still hold the engine"));
    t.shutdown().expect("shutdown");
}

fn one_run(a: &Args) -> Figures {
    let mut f = Figures::default();
    let (t, noisy, quiet, blocks, _) = build(a);
    let limit = |iops: u64, bytes: u64| VolumeLimits {
        iops_max: iops,
        bytes_per_sec_max: bytes,
        ..VolumeLimits::NONE
    };
    set_limits(&t, quiet, limit(a.iops, 0));
    let r = run(
        &t,
        blocks,
        a.secs,
        &[load(noisy, BLOCK, 64), load(quiet, BLOCK, 16)],
        |_, _| {},
    );
    (f.iops_noisy, f.iops_quiet) = (r[0].0, r[1].0);
    set_limits(&t, quiet, limit(0, a.mibps << 20));
    let r = run(
        &t,
        blocks,
        a.secs,
        &[load(noisy, BLOCK, 64), load(quiet, 64 << 10, 16)],
        |_, _| {},
    );
    (f.mibps_noisy_iops, f.mibps_quiet) = (r[0].0, r[1].1 / f64::from(1 << 20));
    shut(t);
    (f.share_max, f.share_mean, f.quiet_min) = share_phase(a, a.share);
    (f.free_max, f.free_mean, _) = share_phase(a, 0);
    f
}

fn print(a: &Args, f: &Figures) {
    println!(
        "iops   quiet limited to {}: {:.0} IOPS ({:.3} of the limit) beside noisy {:.0} IOPS",
        a.iops,
        f.iops_quiet,
        f.iops_quiet / a.iops as f64,
        f.iops_noisy
    );
    println!(
        "mibps  quiet limited to {} MiB/s: {:.2} MiB/s ({:.3} of the limit) beside noisy {:.0} IOPS",
        a.mibps,
        f.mibps_quiet,
        f.mibps_quiet / a.mibps as f64,
        f.mibps_noisy_iops
    );
    println!(
        "share  noisy with a {}% cache share: at most {:.2}% of the cache ({:.3} of the share), \
         mean {:.2}%; quiet at least {:.2}%; without the share noisy held at most {:.2}% (mean {:.2}%)",
        a.share,
        f.share_max,
        f.share_max / f64::from(a.share),
        f.share_mean,
        f.quiet_min,
        f.free_max,
        f.free_mean
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("qos: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "capacity {} MiB in memory, cache 5% in memory (1 MiB chunks), two volumes of half \
         the user capacity, {} s a phase (rates after its first second)",
        a.capacity_mib, a.secs
    );
    let mut runs = Vec::new();
    for i in 0..a.repeat {
        println!("run {}:", i + 1);
        let f = one_run(&a);
        print(&a, &f);
        runs.push(f);
    }
    if a.repeat > 1 {
        let m = |g: fn(&Figures) -> f64| median(runs.iter().map(g).collect());
        let f = Figures {
            iops_quiet: m(|f| f.iops_quiet),
            iops_noisy: m(|f| f.iops_noisy),
            mibps_quiet: m(|f| f.mibps_quiet),
            mibps_noisy_iops: m(|f| f.mibps_noisy_iops),
            share_max: m(|f| f.share_max),
            share_mean: m(|f| f.share_mean),
            quiet_min: m(|f| f.quiet_min),
            free_max: m(|f| f.free_max),
            free_mean: m(|f| f.free_mean),
        };
        println!("medians of {} runs:", a.repeat);
        print(&a, &f);
    }
}
