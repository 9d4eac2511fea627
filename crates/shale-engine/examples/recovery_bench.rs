//! Recovery time and bytes read against capacity, against writes since the last
//! checkpoint, and against mapped metadata (L2P pages), on sparse files; also the
//! engine's resident memory and the longest loop-iteration stall under checkpoints.
//!
//! Each row: sparse cache (5% of capacity) and capacity files; format (16 MiB chunks,
//! 64 MiB zones, default settings); map data (`mapped`: sequential 1 MiB writes, or
//! with `pages` one 4 KiB block per L2P page); take a checkpoint; write `recent` bytes
//! of random 64 KiB writes; flush; stop without shutting down (what kill -9 leaves:
//! everything written is in the files); time the open, which recovers. Then a clean
//! shutdown and a clean open for comparison.
//!
//! cargo run --release -p shale-engine --example recovery_bench -- [table|rss|stall] [dir]
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shale_device::{FileDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{Config, Engine, MonotonicClock, OpenReport, Reply, Request, VolumeId};

type E = Engine<FileDevice, ZoneEmu<FileDevice>, MonotonicClock>;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const ZONE: u64 = 64 * MIB;

fn config() -> Config {
    Config {
        chunk_blocks: (16 * MIB / 4096) as u32,
        // Rows control when checkpoints happen.
        checkpoint_interval_bytes: Some(1 << 50),
        ..Config::default()
    }
}

fn paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("cache.img"), dir.join("capacity.img"))
}

fn create(dir: &Path, cap_bytes: u64, config: Config) -> E {
    let (c, z) = paths(dir);
    let _ = std::fs::remove_file(&c);
    let _ = std::fs::remove_file(&z);
    let zones = cap_bytes / ZONE;
    let mut zc = ZoneEmuConfig::new(ZONE);
    zc.zone_count_max = zones as u32;
    FileDevice::create_sparse(&z, zc.device_bytes_for(zones as u32).unwrap()).unwrap();
    FileDevice::create_sparse(&c, cap_bytes / 20 / MIB * MIB).unwrap();
    let cap = ZoneEmu::format(FileDevice::open(&z).unwrap(), &zc).unwrap();
    let cache = FileDevice::open(&c).unwrap();
    let mut e = Engine::format(cache, cap, MonotonicClock::new(), config).unwrap();
    let user = e.user_capacity_bytes();
    call(
        &mut e,
        Request::CreateVolume {
            name: "v".into(),
            size_bytes: user,
        },
    );
    e
}

fn open(dir: &Path, config: Config) -> (E, Duration) {
    let (c, z) = paths(dir);
    let t = Instant::now();
    let cap = ZoneEmu::open(FileDevice::open(&z).unwrap()).unwrap();
    let e = Engine::open(
        FileDevice::open(&c).unwrap(),
        cap,
        MonotonicClock::new(),
        config,
    )
    .unwrap();
    (e, t.elapsed())
}

fn call(e: &mut E, req: Request) -> Reply {
    let slot = Arc::new(std::sync::Mutex::new(None));
    let s2 = slot.clone();
    e.submit(req, Box::new(move |r| *s2.lock().unwrap() = Some(r)));
    loop {
        if let Some(r) = slot.lock().unwrap().take() {
            return r.unwrap();
        }
        if !e.poll() {
            e.wait_io();
        }
    }
}

/// Writes at queue depth 32; `lba(i)` gives the i-th write's first block. Returns the
/// longest single `poll` call.
fn write_many(e: &mut E, n: u64, len: usize, mut lba: impl FnMut(u64) -> u64) -> Duration {
    let done = Arc::new(AtomicU64::new(0));
    let data = vec![0xA5u8; len];
    let mut submitted = 0;
    let mut worst = Duration::ZERO;
    while done.load(Ordering::Relaxed) < n {
        while submitted < n && submitted - done.load(Ordering::Relaxed) < 32 {
            let d = done.clone();
            e.submit(
                Request::Write {
                    volume: VolumeId(0),
                    offset: lba(submitted) * 4096,
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
        let t = Instant::now();
        let progress = e.poll();
        worst = worst.max(t.elapsed());
        if !progress {
            e.wait_io();
        }
    }
    worst
}

fn rng(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

struct Row {
    cap: u64,
    mapped: u64,
    pages: u64,
    recent: u64,
}

fn step_ms(r: &OpenReport, name: &str) -> f64 {
    r.steps
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.duration_ns as f64 / 1e6)
        .sum()
}

fn run_row(dir: &Path, row: &Row) {
    let mut e = create(dir, row.cap, config());
    let blocks = e.user_capacity_bytes() / 4096;
    if row.mapped > 0 {
        let per = MIB as usize;
        write_many(&mut e, row.mapped / MIB, per, |i| i * 256 % blocks);
    }
    if let Some(stride) = blocks.checked_div(row.pages) {
        let stride = stride.max(1024);
        write_many(&mut e, row.pages, 4096, |i| (i * stride) % blocks);
    }
    // A checkpoint now: what follows is what recovery replays.
    call(
        &mut e,
        Request::CreateVolume {
            name: "ckpt".into(),
            size_bytes: 4096,
        },
    );
    let mut x = 0x9E37_79B9u64;
    if row.recent > 0 {
        write_many(&mut e, row.recent / (64 * 1024), 64 * 1024, |_| {
            (rng(&mut x) % (blocks - 16)) & !15
        });
    }
    call(&mut e, Request::Flush);
    drop(e.abandon());
    let (e, recover) = open(dir, config());
    let rep = e.open_report().clone();
    assert!(!rep.clean);
    let (c, z) = e.shutdown().unwrap();
    drop((c, z));
    let (e, clean) = open(dir, config());
    assert!(e.open_report().clean);
    drop(e.shutdown().unwrap());
    println!(
        "{:>7} {:>8} {:>8} {:>8} | {:>9.1} {:>10.1} | {:>8.1} {:>7.1} {:>7.1} {:>7.1} {:>8.1} {:>8.1} | {:>9.1}",
        format!("{}G", row.cap / GIB),
        if row.mapped > 0 { format!("{}M", row.mapped / MIB) } else { "-".into() },
        if row.pages > 0 { format!("{}", row.pages) } else { "-".into() },
        format!("{}M", row.recent / MIB),
        recover.as_secs_f64() * 1e3,
        rep.bytes_read() as f64 / MIB as f64,
        ["superblock", "capacity label", "checkpoint", "volume table", "journal", "L2P directories"]
            .iter()
            .map(|n| step_ms(&rep, n))
            .sum::<f64>(),
        step_ms(&rep, "md scan"),
        step_ms(&rep, "resolve"),
        step_ms(&rep, "census") + step_ms(&rep, "regions"),
        step_ms(&rep, "new checkpoint"),
        step_ms(&rep, "self-check"),
        clean.as_secs_f64() * 1e3,
    );
}

fn table(dir: &Path) {
    println!("recovery after a crash (kill -9 equivalent): sparse files, cache = 5% of capacity, O_DIRECT where supported");
    println!("mapped = data written before the checkpoint (1 MiB writes); L2P pages = one 4 KiB block per L2P page; recent = random 64 KiB writes after it");
    println!(
        "{:>7} {:>8} {:>8} {:>8} | {:>9} {:>10} | {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} | {:>9}",
        "cap",
        "mapped",
        "L2Ppages",
        "recent",
        "recov ms",
        "read MiB",
        "load ms",
        "md ms",
        "res ms",
        "cens ms",
        "ckpt ms",
        "self ms",
        "clean ms"
    );
    let rows = [
        Row {
            cap: 64 * GIB,
            mapped: GIB,
            pages: 0,
            recent: 512 * MIB,
        },
        Row {
            cap: 256 * GIB,
            mapped: GIB,
            pages: 0,
            recent: 512 * MIB,
        },
        Row {
            cap: 1024 * GIB,
            mapped: GIB,
            pages: 0,
            recent: 512 * MIB,
        },
        Row {
            cap: 1024 * GIB,
            mapped: GIB,
            pages: 0,
            recent: 0,
        },
        Row {
            cap: 1024 * GIB,
            mapped: GIB,
            pages: 0,
            recent: 2 * GIB,
        },
        Row {
            cap: 1024 * GIB,
            mapped: GIB,
            pages: 0,
            recent: 4 * GIB,
        },
        Row {
            cap: 1024 * GIB,
            mapped: 0,
            pages: 16 * 1024,
            recent: 256 * MIB,
        },
        Row {
            cap: 1024 * GIB,
            mapped: 0,
            pages: 64 * 1024,
            recent: 256 * MIB,
        },
        Row {
            cap: 1024 * GIB,
            mapped: 0,
            pages: 200 * 1024,
            recent: 256 * MIB,
        },
    ];
    for row in &rows {
        run_row(dir, row);
    }
}

fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn rss(dir: &Path) {
    let base = rss_mib();
    let cap = 1024 * GIB;
    let e = create(dir, cap, Config::default());
    drop(e.shutdown().unwrap());
    let (mut e, _) = open(dir, Config::default());
    let after_open = rss_mib();
    let s = e.stats();
    println!(
        "1 TiB capacity, 5% cache, default settings: L2P budget {} pages ({} MiB)",
        s.l2p_cache_pages_max,
        s.l2p_cache_pages_max * 4096 / MIB
    );
    println!(
        "RSS before {base:.1} MiB, after format + open {after_open:.1} MiB (engine {:.1} MiB)",
        after_open - base
    );
    let blocks = e.user_capacity_bytes() / 4096;
    let mut x = 7u64;
    for (label, n) in [("256 MiB", 64 * 1024u64), ("1 GiB more", 256 * 1024)] {
        write_many(&mut e, n, 4096, |_| rng(&mut x) % blocks);
        let s = e.stats();
        println!(
            "after {label} of random 4 KiB writes: RSS {:.1} MiB (engine {:.1} MiB), L2P pages cached {} of {}",
            rss_mib(),
            rss_mib() - base,
            s.l2p_cached_pages,
            s.l2p_cache_pages_max
        );
    }
    drop(e.shutdown().unwrap());
}

fn stall(dir: &Path) {
    println!("longest single loop iteration (poll) during 4 KiB random writes at QD 32, 256 GiB capacity, 5% cache");
    for pages_per_poll in [0u32, 16] {
        let config = Config {
            chunk_blocks: (16 * MIB / 4096) as u32,
            checkpoint_pages_per_poll: pages_per_poll,
            checkpoint_interval_bytes: Some(256 * MIB),
            ..Config::default()
        };
        let mut e = create(dir, 256 * GIB, config);
        let blocks = e.user_capacity_bytes() / 4096;
        let mut x = 11u64;
        // Warm up: dirty many L2P pages.
        write_many(&mut e, 128 * 1024, 4096, |_| rng(&mut x) % blocks);
        let before = e.stats().checkpoints;
        let t = Instant::now();
        let worst = write_many(&mut e, 256 * 1024, 4096, |_| rng(&mut x) % blocks);
        let s = e.stats();
        println!(
            "{:<34} checkpoints {:>3}  pages written in the background {:>7}  worst poll {:>8.2} ms  ({:.0} writes/s)",
            if pages_per_poll == 0 { "synchronous checkpoints" } else { "incremental, 16 pages per iteration" },
            s.checkpoints - before,
            s.checkpoint_page_writes,
            worst.as_secs_f64() * 1e3,
            (256 * 1024) as f64 / t.elapsed().as_secs_f64()
        );
        drop(e.shutdown().unwrap());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("table", String::as_str);
    let dir = args
        .get(2)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("shale-recovery-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    match what {
        "table" => table(&dir),
        "rss" => rss(&dir),
        "stall" => stall(&dir),
        other => eprintln!("unknown mode {other}: table, rss or stall"),
    }
    let (c, z) = paths(&dir);
    let _ = std::fs::remove_file(c);
    let _ = std::fs::remove_file(z);
}
