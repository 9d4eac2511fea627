//! The engine's 4 KiB random-write and random-read throughput on one core.
//!
//! The engine, the client loop and the completions all run on this one thread (queue
//! depth 128, independent uniform draws over one volume spanning the user capacity).
//! The cache is in memory (or a file in `--cache-dir`); the capacity is zone emulation
//! over a file (io_uring, O_DIRECT where the filesystem allows it), or over memory with
//! `--capacity-mem` (every device copy then runs on this thread, as the cache's do,
//! and no kernel worker is involved). A zone reset only
//! moves the write pointer, as a drive's reset costs the host nothing; with
//! `--discard-on-reset` it also punches a hole in the file, which on tmpfs costs the
//! kernel ~2 µs of CPU per user write in the steady state (freeing the zone's pages,
//! then allocating them again as it is rewritten). Phases, each reported on its own line:
//!
//! - `write first`: the first `--first-secs` of random writes on a fresh engine (the
//!   cache absorbs them; compaction starts once it fills);
//! - `write steady`: `--steady-secs` of random writes once GC has been running for a
//!   while (after `--warm-multiple` × the user capacity has been written and GC has
//!   reset zones), the figure that matters;
//! - `read`: `--read-secs` of random reads of the written data (every read verifies
//!   its CRC32C).
//!
//! Each line gives IOPS (wall clock), CPU per I/O (this thread's user+system time,
//! and the whole process's, which adds io_uring's kernel workers: buffered files use
//! them), p50/p99/max latency, the load average (the machine is shared: read IOPS
//! against it), and in brackets the layer WAF, capacity bytes read per user byte
//! written (read, in the read phase), GC victims, durability points, the L2P hit
//! rate and page reads and writes (of which asynchronous, ahead of need). `--repeat N`
//! runs the whole sequence N times on fresh devices and prints the medians.
//!
//! With `--shards N` the engine is N shards, each on its own thread with 1/N of the
//! devices, the queue depth and the user capacity (see `sharded_run`).
//!
//! With `--array K+M` the capacity is a Reed–Solomon array of K+M such files (each
//! 1/K of the capacity, zones 1/K as large, so the array has the single file's zones),
//! and a fourth phase, `read degraded`, reads again with member 0 failed (a quarter
//! to a fifth of the reads are rebuilt from K other members).
//!
//! ```text
//! cargo bench -p shale-engine --bench iops -- [--capacity-mib 4096] [--dir /tmp]
//!     [--first-secs 30] [--steady-secs 30] [--read-secs 10] [--warm-multiple 2]
//!     [--qd 128] [--l2p-mib N] [--repeat 1] [--cache-dir DIR] [--discard-on-reset]
//!     [--array K+M] [--capacity-mem] [--shards N]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shale_array::{ArrayHandle, Command, Redundancy, ZoneArray};
use shale_device::{BlockDevice, FileDevice, MemDevice, ZoneEmu, ZoneEmuConfig, ZonedDevice};
use shale_engine::{Config, Engine, MonotonicClock, Reply, Request, Stats, VolumeUid};

const BLOCK: u64 = 4096;
const ZONE_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone)]
struct Args {
    capacity_mib: u64,
    dir: PathBuf,
    first_secs: u64,
    steady_secs: u64,
    read_secs: u64,
    warm_multiple: f64,
    qd: u64,
    l2p_mib: Option<u64>,
    repeat: usize,
    cache_dir: Option<PathBuf>,
    discard_on_reset: bool,
    array: Option<Redundancy>,
    capacity_mem: bool,
    shards: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        capacity_mib: 4096,
        dir: std::env::temp_dir(),
        first_secs: 30,
        steady_secs: 30,
        read_secs: 10,
        warm_multiple: 2.0,
        qd: 128,
        l2p_mib: None,
        repeat: 1,
        cache_dir: None,
        discard_on_reset: false,
        array: None,
        capacity_mem: false,
        shards: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--bench" {
            continue; // cargo bench passes it
        }
        if flag == "--discard-on-reset" {
            a.discard_on_reset = true;
            continue;
        }
        if flag == "--capacity-mem" {
            a.capacity_mem = true;
            continue;
        }
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--capacity-mib" => a.capacity_mib = num(val()?)?,
            "--dir" => a.dir = PathBuf::from(val()?),
            "--cache-dir" => a.cache_dir = Some(PathBuf::from(val()?)),
            "--first-secs" => a.first_secs = num(val()?)?,
            "--steady-secs" => a.steady_secs = num(val()?)?,
            "--read-secs" => a.read_secs = num(val()?)?,
            "--warm-multiple" => {
                a.warm_multiple = val()?.parse().map_err(|e| format!("{flag}: {e}"))?
            }
            "--qd" => a.qd = num(val()?)?.clamp(1, 4096),
            "--l2p-mib" => a.l2p_mib = Some(num(val()?)?),
            "--repeat" => a.repeat = num(val()?)?.clamp(1, 99) as usize,
            "--shards" => a.shards = num(val()?)?.clamp(1, 64) as usize,
            "--array" => {
                let r: Redundancy = val()?.parse().map_err(|e| format!("{flag}: {e}"))?;
                if !matches!(r, Redundancy::Parity { .. }) {
                    return Err(format!("{flag}: K+M"));
                }
                a.array = Some(r);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.capacity_mib < 256 * a.shards as u64 {
        return Err("--capacity-mib must be at least 256 per shard".into());
    }
    if a.shards > 1 && a.array.is_some() {
        return Err("--shards and --array: one at a time".into());
    }
    Ok(a)
}

/// Latencies in a log-linear histogram: 64 buckets per power of two (< 1.6% error).
#[derive(Debug, Clone)]
struct Hist {
    counts: Vec<u64>,
    max_ns: u64,
    n: u64,
}

const SUB: u64 = 64;

impl Hist {
    fn new() -> Hist {
        Hist {
            counts: vec![0; 64 * SUB as usize],
            max_ns: 0,
            n: 0,
        }
    }

    fn bucket(ns: u64) -> usize {
        if ns < SUB {
            return ns as usize;
        }
        let p = 63 - u64::from(ns.leading_zeros()); // ns in [2^p, 2^(p+1))
        let shift = p - 6;
        ((p - 5) * SUB + ((ns >> shift) - SUB)) as usize
    }

    fn lower(b: usize) -> u64 {
        let b = b as u64;
        if b < SUB {
            return b;
        }
        let p = b / SUB + 5;
        (SUB + b % SUB) << (p - 6)
    }

    fn record(&mut self, ns: u64) {
        let b = Self::bucket(ns).min(self.counts.len() - 1);
        self.counts[b] += 1;
        self.max_ns = self.max_ns.max(ns);
        self.n += 1;
    }

    fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let want = ((self.n as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::lower(b + 1).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

/// Process CPU time (user + system, all threads) from /proc/self/stat.
fn cpu_time() -> Duration {
    stat_cpu("/proc/self/stat")
}

/// CPU time of this thread (the engine, the client loop and the completions).
fn thread_cpu_time() -> Duration {
    stat_cpu("/proc/thread-self/stat")
}

fn stat_cpu(path: &str) -> Duration {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after ')'.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 (1-based); `rest` starts at field 3.
    let t = ticks(11) + ticks(12);
    Duration::from_millis(t * 1000 / clock_ticks_per_sec())
}

fn clock_ticks_per_sec() -> u64 {
    // USER_HZ is 100 on every Linux architecture Rust supports.
    100
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let v: Vec<&str> = s.split_whitespace().take(3).collect();
            (v.len() == 3).then(|| v.join(" "))
        })
        .unwrap_or_else(|| "?".into())
}

type Eng = Engine<Box<dyn BlockDevice>, Box<dyn ZonedDevice>, MonotonicClock>;
type Member = ZoneEmu<Box<dyn BlockDevice>>;

struct Rig {
    e: Eng,
    volume: VolumeUid,
    blocks: u64,
    paths: Vec<PathBuf>,
    array: Option<ArrayHandle<Member>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A zone-emulated capacity file of `zones` zones of `zone_bytes` (plus `extra`).
/// One capacity device (or array member): zone emulation over a file, or over memory
/// (no path then).
fn capacity_file(a: &Args, name: &str, zones: u64, zone_bytes: u64) -> (Member, Option<PathBuf>) {
    let mut zc = ZoneEmuConfig::new(zone_bytes);
    zc.zone_count_max = zones as u32;
    let bytes = zc
        .device_bytes_for(zones as u32)
        .expect("capacity size overflows");
    let (dev, path): (Box<dyn BlockDevice>, _) = if a.capacity_mem {
        let mut dev = MemDevice::new(bytes, 4096).expect("capacity in memory");
        // Every page touched now (with bytes that are not zeros, which a sparse image
        // would not store), so no phase pays the kernel for first touches.
        let fill = vec![0xa5u8; 4 << 20];
        let mut at = 0;
        while at < bytes {
            let n = (bytes - at).min(fill.len() as u64) as usize;
            dev.write_at(at, &fill[..n]).expect("prefault the capacity");
            at += n as u64;
        }
        (Box::new(dev), None)
    } else {
        let path = a
            .dir
            .join(format!("shale-iops-{}-{name}.capacity", std::process::id()));
        FileDevice::create_sparse(&path, bytes).expect("create the capacity file");
        let file = FileDevice::open(&path).expect("open the capacity file");
        (Box::new(file), Some(path))
    };
    let mut cap = ZoneEmu::format(dev, &zc).expect("zone emulation");
    cap.set_discard_on_reset(a.discard_on_reset);
    (cap, path)
}

type Capacity = (
    Box<dyn ZonedDevice>,
    Vec<PathBuf>,
    Option<ArrayHandle<Member>>,
);

/// The capacity: one file, or a K+M array of files with the same zones in all.
fn capacity(a: &Args, run: usize) -> Capacity {
    let zones = a.capacity_mib * (1 << 20) / ZONE_BYTES;
    let Some(r) = a.array else {
        let (cap, path) = capacity_file(a, &run.to_string(), zones, ZONE_BYTES);
        return (Box::new(cap), path.into_iter().collect(), None);
    };
    let Redundancy::Parity { k, m } = r else {
        unreachable!("parse_args takes K+M only")
    };
    let n = usize::from(k + m);
    // A row is one 512 KiB group in K units (the last partly padding when K does not
    // divide it); member zones hold the rows of one array zone.
    let unit = shale_array::StripeLayout::choose_unit(u32::from(k), 4096).expect("unit");
    let member_zone = ZONE_BYTES / shale_array::STRIPE_BYTES_MAX * unit;
    let mut paths = Vec::new();
    let members: Vec<(Option<Member>, String)> = (0..n)
        .map(|i| {
            // More zones for the member's labels.
            let zones = zones + shale_array::LABEL_ZONES as u64;
            let (z, p) = capacity_file(a, &format!("{run}-m{i}"), zones, member_zone);
            paths.extend(p);
            (Some(z), format!("m{i}"))
        })
        .collect();
    let mut arr = ZoneArray::new(members, r, unit).expect("array");
    let h = arr.handle();
    (Box::new(arr), paths, Some(h))
}

fn build(a: &Args, run: usize) -> Rig {
    let (cap, mut paths, array) = capacity(a, run);
    // Cache: 5% of the capacity plus room for the metadata.
    let cache_bytes = (a.capacity_mib * (1 << 20) / 20 + (16 << 20)) / BLOCK * BLOCK;
    let cache: Box<dyn BlockDevice> = match &a.cache_dir {
        None => Box::new(MemDevice::new(cache_bytes, 4096).expect("cache")),
        Some(dir) => {
            let p = dir.join(format!("shale-iops-{}-{run}.cache", std::process::id()));
            FileDevice::create_sparse(&p, cache_bytes).expect("create the cache file");
            paths.push(p.clone());
            Box::new(FileDevice::open(&p).expect("open the cache file"))
        }
    };
    let config = Config {
        chunk_blocks: 1024,
        volumes_max: 8,
        l2p_cache_bytes_max: a.l2p_mib.map(|m| m << 20),
        // Without --l2p-mib, 12.5% of the table as in the figures measured so far
        // (and enough L2P faults to exercise them).
        l2p_cache_divisor: 8,
        l2p_cache_floor_bytes: 0,
        ..Config::default()
    };
    let mut e = Engine::format(cache, cap, MonotonicClock::new(), config).expect("format");
    let blocks = e.user_capacity_bytes() / BLOCK;
    let slot = Arc::new(Mutex::new(None));
    let s2 = Arc::clone(&slot);
    e.submit(
        Request::CreateVolume {
            name: "bench".into(),
            size_bytes: blocks * BLOCK,
        },
        Box::new(move |r| *s2.lock().unwrap() = Some(r)),
    );
    e.run_until_idle().expect("create the volume");
    let volume = match slot.lock().unwrap().take() {
        Some(Ok(Reply::Volume(v))) => v.uid,
        other => panic!("volume create: {other:?}"),
    };
    Rig {
        e,
        volume,
        blocks,
        paths,
        array,
    }
}

/// Figures of one phase.
#[derive(Debug, Clone, Default)]
struct Phase {
    ios: u64,
    wall: Duration,
    cpu: Duration,
    thread_cpu: Duration,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    load: String,
    stats_before: Stats,
    stats_after: Stats,
}

impl Phase {
    fn iops(&self) -> f64 {
        self.ios as f64 / self.wall.as_secs_f64().max(1e-9)
    }
    fn cpu_us_per_io(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.ios.max(1) as f64
    }
    fn thread_cpu_us_per_io(&self) -> f64 {
        self.thread_cpu.as_secs_f64() * 1e6 / self.ios.max(1) as f64
    }
}

/// What completions share with the client loop.
struct Shared {
    done: AtomicU64,
    failed: AtomicU64,
    hist: Mutex<Hist>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Read,
}

/// Runs `kind` at queue depth `qd` until `stop` says so; returns the phase figures.
fn run_phase(
    rig: &mut Rig,
    kind: Kind,
    qd: u64,
    rng: &mut u64,
    mut stop: impl FnMut(&Eng, Duration) -> bool,
) -> Phase {
    let shared = Arc::new(Shared {
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        hist: Mutex::new(Hist::new()),
    });
    let data = vec![0x5Au8; BLOCK as usize];
    let stats_before = rig.e.stats();
    let cpu0 = cpu_time();
    let tcpu0 = thread_cpu_time();
    let t0 = Instant::now();
    let mut submitted = 0u64;
    loop {
        let elapsed = t0.elapsed();
        if submitted.is_multiple_of(1024) && stop(&rig.e, elapsed) {
            break;
        }
        while submitted - shared.done.load(Ordering::Relaxed) < qd {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            let offset = (*rng % rig.blocks) * BLOCK;
            let req = match kind {
                Kind::Write => Request::Write {
                    volume: rig.volume,
                    offset,
                    data: data.clone(),
                    fua: false,
                },
                Kind::Read => Request::Read {
                    volume: rig.volume,
                    offset,
                    len: BLOCK,
                },
            };
            let sh = Arc::clone(&shared);
            let at = Instant::now();
            rig.e.submit(
                req,
                Box::new(move |r| {
                    let ns = at.elapsed().as_nanos() as u64;
                    if r.is_err() {
                        sh.failed.fetch_add(1, Ordering::Relaxed);
                    }
                    sh.hist.lock().unwrap().record(ns);
                    sh.done.fetch_add(1, Ordering::Relaxed);
                }),
            );
            submitted += 1;
            if submitted.is_multiple_of(1024) {
                break;
            }
        }
        if !rig.e.poll() {
            rig.e.wait_io();
        }
    }
    // Drain what is in flight so the next phase starts clean (not counted).
    let ios = shared.done.load(Ordering::Relaxed);
    let wall = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let thread_cpu = thread_cpu_time().saturating_sub(tcpu0);
    let load = loadavg();
    let stats_after = rig.e.stats();
    while shared.done.load(Ordering::Relaxed) < submitted {
        if !rig.e.poll() {
            rig.e.wait_io();
        }
    }
    assert_eq!(shared.failed.load(Ordering::Relaxed), 0, "requests failed");
    let h = shared.hist.lock().unwrap().clone();
    Phase {
        ios,
        wall,
        cpu,
        thread_cpu,
        p50_ns: h.quantile(0.50),
        p99_ns: h.quantile(0.99),
        max_ns: h.max_ns,
        load,
        stats_before,
        stats_after,
    }
}

fn us(ns: u64) -> String {
    if ns >= 10_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{:.0} µs", ns as f64 / 1e3)
    }
}

fn print_phase(name: &str, p: &Phase) {
    let (b, a) = (&p.stats_before, &p.stats_after);
    let user = a.user_write_bytes - b.user_write_bytes;
    let cap = a.capacity_write_bytes() - b.capacity_write_bytes();
    let hits = a.l2p_hits - b.l2p_hits;
    let misses = a.l2p_misses - b.l2p_misses;
    println!(
        "{name:<13} {:>9.0} IOPS  CPU/IO {:>5.2} µs thread, {:>5.2} µs process  p50 {:>8}  p99 {:>8}  max {:>8}  load {}  [{:.1} s, layer WAF {:.2}, capacity reads {:.2}, GC victims {}, durability points {}, L2P hit {:.1}%, page reads {} ({} ahead), writes {} ({} ahead)]",
        p.iops(),
        p.thread_cpu_us_per_io(),
        p.cpu_us_per_io(),
        us(p.p50_ns),
        us(p.p99_ns),
        us(p.max_ns),
        p.load,
        p.wall.as_secs_f64(),
        if user > 0 { cap as f64 / user as f64 } else { 0.0 },
        // Per user byte written, or read in the read phase.
        (a.capacity_read_bytes - b.capacity_read_bytes) as f64
            / (if user > 0 {
                user
            } else {
                a.user_read_bytes - b.user_read_bytes
            })
            .max(1) as f64,
        a.gc_victims - b.gc_victims,
        a.durability_points - b.durability_points,
        100.0 * hits as f64 / (hits + misses).max(1) as f64,
        a.l2p_page_reads - b.l2p_page_reads,
        a.l2p_page_reads_ahead - b.l2p_page_reads_ahead,
        a.l2p_page_writes - b.l2p_page_writes,
        a.l2p_page_writes_ahead - b.l2p_page_writes_ahead,
    );
}

fn one_run(a: &Args, run: usize) -> [Phase; 4] {
    let mut rig = build(a, run);
    let mut rng = 0x1234_5678_9abc_def1u64 ^ (run as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    println!(
        "run {}: capacity {} MiB{} on {} (zone resets {}), cache {}, user {} MiB, chunks {}, streams {}, L2P budget {} pages",
        run + 1,
        a.capacity_mib,
        a.array.map_or(String::new(), |r| format!(" as a {r} array")),
        if a.capacity_mem {
            "memory".to_string()
        } else {
            a.dir.display().to_string()
        },
        if a.discard_on_reset {
            "punch holes"
        } else {
            "move the write pointer only"
        },
        a.cache_dir
            .as_ref()
            .map_or("in memory".to_string(), |d| format!("on {}", d.display())),
        (rig.blocks * BLOCK) >> 20,
        rig.e.stats().chunk_count,
        rig.e.streams(),
        rig.e.stats().l2p_cache_pages_max
    );
    let first_secs = Duration::from_secs(a.first_secs);
    let first = run_phase(&mut rig, Kind::Write, a.qd, &mut rng, |_, t| {
        t >= first_secs
    });
    print_phase("write first", &first);
    // Warm up until GC has been resetting zones for a while.
    let user_cap = rig.blocks * BLOCK;
    let warm_bytes = (a.warm_multiple * user_cap as f64) as u64;
    let t = Instant::now();
    let warm = run_phase(&mut rig, Kind::Write, a.qd, &mut rng, |e, _| {
        let s = e.stats();
        s.user_write_bytes >= warm_bytes && s.gc_victims >= 16
    });
    println!(
        "  (warm-up: {:.0} s, {} MiB more written, {:.0} IOPS)",
        t.elapsed().as_secs_f64(),
        (warm.stats_after.user_write_bytes - warm.stats_before.user_write_bytes) >> 20,
        warm.iops()
    );
    let steady_secs = Duration::from_secs(a.steady_secs);
    let steady = run_phase(&mut rig, Kind::Write, a.qd, &mut rng, |_, t| {
        t >= steady_secs
    });
    print_phase("write steady", &steady);
    let read_secs = Duration::from_secs(a.read_secs);
    let read = run_phase(&mut rig, Kind::Read, a.qd, &mut rng, |_, t| t >= read_secs);
    print_phase("read", &read);
    let mut degraded = Phase::default();
    if let Some(h) = rig.array.clone() {
        let reply = h.submit(Command::Fail {
            member: "m0".into(),
        });
        while reply.try_recv().is_err() {
            rig.e.poll();
        }
        degraded = run_phase(&mut rig, Kind::Read, a.qd, &mut rng, |_, t| t >= read_secs);
        print_phase("read degraded", &degraded);
    }
    rig.e.run_until_idle().expect("drain");
    [first, steady, read, degraded]
}

/// `--shards N`: N engines, each on its own thread with 1/N of the devices and of
/// the queue depth and its own client loop over its slice (what a pool of N shards
/// runs; a 4 KiB request lies in one granule, so the router only forwards it). The
/// phases start together (a barrier); the figures are the shards' together: IOPS
/// summed over the longest shard's wall time, CPU per I/O summed over the threads,
/// latency quantiles the worst shard's.
fn sharded_run(a: &Args, run: usize) -> [Phase; 4] {
    let n = a.shards;
    let per = Args {
        capacity_mib: a.capacity_mib / n as u64,
        qd: (a.qd / n as u64).max(1),
        ..a.clone()
    };
    let barrier = std::sync::Barrier::new(n);
    let results: Vec<[Phase; 3]> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (per, barrier) = (&per, &barrier);
                scope.spawn(move || {
                    let mut rig = build(per, run * 64 + i);
                    let mut rng = 0x1234_5678_9abc_def1u64
                        ^ ((run * 64 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    barrier.wait();
                    let first_secs = Duration::from_secs(per.first_secs);
                    let first = run_phase(&mut rig, Kind::Write, per.qd, &mut rng, |_, t| {
                        t >= first_secs
                    });
                    let warm_bytes = (per.warm_multiple * (rig.blocks * BLOCK) as f64) as u64;
                    run_phase(&mut rig, Kind::Write, per.qd, &mut rng, |e, _| {
                        let s = e.stats();
                        s.user_write_bytes >= warm_bytes && s.gc_victims >= 16
                    });
                    barrier.wait();
                    let steady_secs = Duration::from_secs(per.steady_secs);
                    let steady = run_phase(&mut rig, Kind::Write, per.qd, &mut rng, |_, t| {
                        t >= steady_secs
                    });
                    barrier.wait();
                    let read_secs = Duration::from_secs(per.read_secs);
                    let read = run_phase(&mut rig, Kind::Read, per.qd, &mut rng, |_, t| {
                        t >= read_secs
                    });
                    rig.e.run_until_idle().expect("drain");
                    [first, steady, read]
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("shard thread"))
            .collect()
    });
    println!(
        "run {}: {n} shards, each capacity {} MiB in {}, queue depth {}",
        run + 1,
        per.capacity_mib,
        if a.capacity_mem { "memory" } else { "files" },
        per.qd
    );
    let mut out: [Phase; 4] = Default::default();
    for (i, name) in ["write first", "write steady", "read"].iter().enumerate() {
        let mut p = results[0][i].clone();
        for r in &results[1..] {
            let q = &r[i];
            p.ios += q.ios;
            p.wall = p.wall.max(q.wall);
            p.cpu = p.cpu.max(q.cpu);
            p.thread_cpu += q.thread_cpu;
            p.p50_ns = p.p50_ns.max(q.p50_ns);
            p.p99_ns = p.p99_ns.max(q.p99_ns);
            p.max_ns = p.max_ns.max(q.max_ns);
            p.stats_before.absorb(&q.stats_before);
            p.stats_after.absorb(&q.stats_after);
        }
        print_phase(name, &p);
        out[i] = p;
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn main() {
    // Built with the tests' `paranoid` feature (a dev-dependency): not timed here.
    shale_engine::disable_paranoid_checks();
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("iops: {e}");
            std::process::exit(2);
        }
    };
    if !Path::new(&a.dir).is_dir() {
        eprintln!("iops: {} is not a directory", a.dir.display());
        std::process::exit(2);
    }
    println!(
        "4 KiB random I/O, queue depth {}, {}; load average at start {}",
        a.qd,
        if a.shards > 1 {
            format!("{} shards on their own threads", a.shards)
        } else {
            "one thread".to_string()
        },
        loadavg()
    );
    let runs: Vec<[Phase; 4]> = (0..a.repeat)
        .map(|r| {
            if a.shards > 1 {
                sharded_run(&a, r)
            } else {
                one_run(&a, r)
            }
        })
        .collect();
    if a.repeat > 1 {
        println!("medians of {} runs:", a.repeat);
        let phases = if a.array.is_some() { 4 } else { 3 };
        for (i, name) in ["write first", "write steady", "read", "read degraded"]
            .iter()
            .enumerate()
            .take(phases)
        {
            let col = |f: &dyn Fn(&Phase) -> f64| median(runs.iter().map(|r| f(&r[i])).collect());
            println!(
                "{name:<13} {:>9.0} IOPS  CPU/IO {:>5.2} µs thread, {:>5.2} µs process  p99 {:>8}  max {:>8}",
                col(&|p| p.iops()),
                col(&|p| p.thread_cpu_us_per_io()),
                col(&|p| p.cpu_us_per_io()),
                us(col(&|p| p.p99_ns as f64) as u64),
                us(col(&|p| p.max_ns as f64) as u64),
            );
        }
    }
}
