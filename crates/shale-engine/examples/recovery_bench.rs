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
//! `kill`: a real kill -9 of a process writing randomly to a 6 GiB cache and a 24 GiB
//! capacity, then the recovery timed (`SECS`, `RUNS` in the environment).
//!
//! `row`: one configuration given by flags, printed as one JSON object (with `--json`
//! on one line): `--capacity SIZE` (`64G`, `1T`, ...), `--mapped FRACTION` of the
//! volume's L2P pages that exist (one 4 KiB block written in each; 1.0: every page),
//! `--recent SIZE` of random 64 KiB writes after the checkpoint, `--dir DIR`; optional
//! `--cache SIZE` (default 5% of the capacity) and `--capacity-dir DIR` (default `--dir`).
//! The files are synced before the timed open.
//! Fields:
//! `recovery_ms`, `clean_open_ms`, their bytes read and steps (`recovery_steps_detail`:
//! what each step of the recovery reports),
//! `census_after_recovery_ms` (the counts' and bits' rebuild a recovery leaves to the
//! background, polled to its end with no other I/O),
//! `census_after_clean_open_ms` (the validity bits' rebuild the clean open leaves to
//! the background, polled to its end with no other I/O), `rss_peak_bytes` (the
//! process's peak resident memory over the whole row: format, writes, both opens) and
//! `rss_open_peak_bytes` (from the recovery open on).
//!
//! cargo run --release -p shale-engine --example recovery_bench -- [table|rss|stall|kill] [dir]
//! cargo run --release -p shale-engine --example recovery_bench -- row --capacity 1T
//!     --mapped 1.0 --recent 1G --dir /dev/shm/rb [--json]
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shale_device::{FileDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{Config, Engine, MonotonicClock, OpenReport, Reply, Request, VolumeUid};

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
    create_at(&c, &z, cap_bytes, cap_bytes / 20 / MIB * MIB, config)
}

/// The files named, the cache `cache_bytes` long.
fn create_at(c: &Path, z: &Path, cap_bytes: u64, cache_bytes: u64, config: Config) -> E {
    let _ = std::fs::remove_file(c);
    let _ = std::fs::remove_file(z);
    let zones = cap_bytes / ZONE;
    let mut zc = ZoneEmuConfig::new(ZONE);
    zc.zone_count_max = zones as u32;
    FileDevice::create_sparse(z, zc.device_bytes_for(zones as u32).unwrap()).unwrap();
    FileDevice::create_sparse(c, cache_bytes).unwrap();
    let cap = ZoneEmu::format(FileDevice::open(z).unwrap(), &zc).unwrap();
    let cache = FileDevice::open(c).unwrap();
    let mut e = Engine::format(cache, cap, MonotonicClock::new(), config).unwrap();
    // Room is left for the small volumes whose creation takes a checkpoint.
    let user = e.user_capacity_bytes() - 16 * MIB;
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
    open_at(&c, &z, config)
}

fn open_at(c: &Path, z: &Path, config: Config) -> (E, Duration) {
    let t = Instant::now();
    let cap = ZoneEmu::open(FileDevice::open(z).unwrap()).unwrap();
    let e = Engine::open(
        FileDevice::open(c).unwrap(),
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
                    volume: VolumeUid(1),
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

/// Takes a checkpoint (a volume creation does), writes `recent` bytes of random 64 KiB
/// writes over the first `blocks`, flushes and stops without a shutdown: what kill -9
/// leaves, with `recent` for the recovery to replay.
fn checkpoint_then_stop(mut e: E, recent: u64, blocks: u64) {
    call(
        &mut e,
        Request::CreateVolume {
            name: "ckpt".into(),
            size_bytes: 4096,
        },
    );
    let mut x = 0x9E37_79B9u64;
    if recent > 0 {
        write_many(&mut e, recent / (64 * 1024), 64 * 1024, |_| {
            (rng(&mut x) % (blocks - 16)) & !15
        });
    }
    call(&mut e, Request::Flush);
    drop(e.abandon());
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
    let blocks = (e.user_capacity_bytes() - 16 * MIB) / 4096;
    if row.mapped > 0 {
        let per = MIB as usize;
        write_many(&mut e, row.mapped / MIB, per, |i| i * 256 % blocks);
    }
    if let Some(stride) = blocks.checked_div(row.pages) {
        let stride = stride.max(1024);
        write_many(&mut e, row.pages, 4096, |i| (i * stride) % blocks);
    }
    checkpoint_then_stop(e, row.recent, blocks);
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
    // ROWS=3,5 runs only those rows (1-based), e.g. to compare two builds.
    let only: Option<Vec<usize>> = std::env::var("ROWS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect());
    for (i, row) in rows.iter().enumerate() {
        if only.as_ref().is_none_or(|o| o.contains(&(i + 1))) {
            run_row(dir, row);
        }
    }
}

/// `row`: one configuration, the contract: `--capacity SIZE --mapped FRACTION
/// --recent SIZE --dir DIR [--json]`. `mapped` is the fraction of the volume's L2P
/// pages that exist (one 4 KiB block written in each; 1.0: every page), then a
/// checkpoint, `recent` bytes of random 64 KiB writes, a flush and a stop without
/// shutdown; the recovery open is timed, then a clean shutdown and a clean open.
struct RowArgs {
    capacity: u64,
    mapped: f64,
    recent: u64,
    dir: PathBuf,
    /// Where the capacity file goes (default `dir`): a fully mapped 16 TiB row
    /// needs its 13 GiB of L2P pages on tmpfs and its data elsewhere.
    capacity_dir: Option<PathBuf>,
    /// The cache file's size (default 5% of the capacity).
    cache: Option<u64>,
    json: bool,
}

/// `64G`, `1T`, `512M`, or bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    let (num, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: f64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        "P" => 1 << 50,
        _ => return Err(format!("bad size unit in {s:?}")),
    };
    Ok((n * mult as f64) as u64)
}

fn parse_row(args: &[String]) -> Result<RowArgs, String> {
    let mut r = RowArgs {
        capacity: 0,
        mapped: 0.0,
        recent: 0,
        dir: std::env::temp_dir().join("shale-recovery-bench"),
        capacity_dir: None,
        cache: None,
        json: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--capacity" => r.capacity = parse_size(&val()?)?,
            "--mapped" => {
                r.mapped = val()?
                    .parse()
                    .map_err(|_| "--mapped takes a fraction 0..=1".to_string())?
            }
            "--recent" => r.recent = parse_size(&val()?)?,
            "--dir" => r.dir = PathBuf::from(val()?),
            "--capacity-dir" => r.capacity_dir = Some(PathBuf::from(val()?)),
            "--cache" => r.cache = Some(parse_size(&val()?)? / MIB * MIB),
            "--json" => r.json = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if r.capacity < GIB || !(0.0..=1.0).contains(&r.mapped) {
        return Err("--capacity of at least 1G and --mapped in 0..=1 are needed".into());
    }
    Ok(r)
}

/// A field of /proc/self/status in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn steps_ms(r: &OpenReport) -> serde_json::Value {
    serde_json::Value::Object(
        r.steps
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    serde_json::json!(s.duration_ns as f64 / 1e6),
                )
            })
            .collect(),
    )
}

fn steps_detail(r: &OpenReport) -> serde_json::Value {
    serde_json::Value::Object(
        r.steps
            .iter()
            .map(|s| (s.name.to_string(), serde_json::json!(s.detail)))
            .collect(),
    )
}

fn row(a: &RowArgs) {
    std::fs::create_dir_all(&a.dir).unwrap();
    let (c, mut z) = paths(&a.dir);
    if let Some(d) = &a.capacity_dir {
        std::fs::create_dir_all(d).unwrap();
        z = d.join("capacity.img");
    }
    let cache_bytes = a.cache.unwrap_or(a.capacity / 20 / MIB * MIB);
    let t = Instant::now();
    let mut e = create_at(&c, &z, a.capacity, cache_bytes, config());
    let blocks = (e.user_capacity_bytes() - 16 * MIB) / 4096;
    // LBAs per L2P page: 816 with the 5-byte entries of pools past 16 TiB.
    let per_page = if e.stats().l2p_entry_bytes == 5 {
        816
    } else {
        1024
    };
    let total_pages = blocks.div_ceil(per_page);
    let pages = ((a.mapped * total_pages as f64).round() as u64).min(total_pages);
    if pages > 0 {
        // One block at the start of every (total / pages)-th page.
        write_many(&mut e, pages, 4096, |i| {
            (i * total_pages / pages * per_page).min(blocks - 1)
        });
    }
    checkpoint_then_stop(e, a.recent, blocks);
    // What the stopped engine wrote is in the files but maybe not yet on the disk
    // under them: written back now, or the recovery's first flush would pay for the
    // whole fill (a real device holds what it acknowledged).
    for f in [&c, &z] {
        std::fs::File::open(f).unwrap().sync_all().unwrap();
    }
    let fill_s = t.elapsed().as_secs_f64();
    let peak_fill = status_bytes("VmHWM");
    // From here on: the open's own peak.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (mut e, recover) = open_at(&c, &z, config());
    let rep = e.open_report().clone();
    assert!(!rep.clean);
    // After a crash too the census (counts and bits) runs after the open returns.
    let t = Instant::now();
    while e.stats().census_pending {
        e.poll();
    }
    let census_after_recovery = t.elapsed();
    let peak_open = status_bytes("VmHWM");
    drop(e.shutdown().unwrap());
    let (mut e, clean) = open_at(&c, &z, config());
    let clean_rep = e.open_report().clone();
    assert!(clean_rep.clean);
    // The validity bits are rebuilt after the open returns, while I/O is served.
    let t = Instant::now();
    while e.stats().census_pending {
        e.poll();
    }
    let census_after_open = t.elapsed();
    drop(e.shutdown().unwrap());
    let peak_all = peak_fill.max(status_bytes("VmHWM"));
    let out = serde_json::json!({
        "capacity_bytes": a.capacity,
        "cache_bytes": cache_bytes,
        "mapped_fraction": a.mapped,
        "l2p_pages_total": total_pages,
        "l2p_pages_written": pages,
        "recent_bytes": a.recent,
        "fill_s": fill_s,
        "recovery_ms": recover.as_secs_f64() * 1e3,
        "recovery_read_bytes": rep.bytes_read(),
        "recovery_steps_ms": steps_ms(&rep),
        "recovery_steps_detail": steps_detail(&rep),
        "census_after_recovery_ms": census_after_recovery.as_secs_f64() * 1e3,
        "clean_open_ms": clean.as_secs_f64() * 1e3,
        "clean_open_read_bytes": clean_rep.bytes_read(),
        "clean_open_steps_ms": steps_ms(&clean_rep),
        "census_after_clean_open_ms": census_after_open.as_secs_f64() * 1e3,
        "rss_peak_bytes": peak_all,
        "rss_open_peak_bytes": peak_open,
    });
    if a.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
    // After the figures: removing tens of GiB from a disk that discards takes minutes.
    let _ = std::fs::remove_file(&c);
    let _ = std::fs::remove_file(&z);
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
    let blocks = (e.user_capacity_bytes() - 16 * MIB) / 4096;
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
        let blocks = (e.user_capacity_bytes() - 16 * MIB) / 4096;
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

/// The kill -9 case: a child process formats a 6 GiB cache and a 24 GiB capacity
/// (sparse files, default settings), then writes random 4 KiB blocks at queue depth 32
/// (a flush every 64 MiB, as a file system would) until this process kills it with
/// SIGKILL after `secs` seconds; then the recovery is timed. Repeated `runs` times.
fn kill(dir: &Path, secs: u64, runs: u32) {
    println!("kill -9 during random 4 KiB writes (QD 32, a flush per 64 MiB): 6 GiB cache, 24 GiB capacity, sparse files, default settings");
    println!(
        "{:>3} {:>9} {:>9} {:>10} | {:>9} {:>10} {:>8} {:>8} {:>8} | steps",
        "run", "written", "ckpts", "MiB/s", "recov ms", "read MiB", "regions", "md grps", "entries"
    );
    for run in 0..runs {
        let exe = std::env::current_exe().unwrap();
        let status = dir.join("child.status");
        let _ = std::fs::remove_file(&status);
        let mut child = std::process::Command::new(exe)
            .arg("kill-child")
            .arg(dir)
            .spawn()
            .unwrap();
        // Let it format and write; it reports its progress through a file.
        std::thread::sleep(Duration::from_secs(secs));
        let progress = std::fs::read_to_string(&status).unwrap_or_default();
        // Child::kill sends SIGKILL on Unix: no shutdown, no flush.
        child.kill().unwrap();
        child.wait().unwrap();
        let (mut e, took) = open(dir, Config::default());
        let rep = e.open_report().clone();
        assert!(!rep.clean, "the killed run left a clean image");
        let steps: Vec<String> = rep
            .steps
            .iter()
            .map(|s| format!("{} {:.1}", s.name, s.duration_ns as f64 / 1e6))
            .collect();
        let mut f = progress.split_whitespace();
        let written: u64 = f.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let ckpts: u64 = f.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let rate: f64 = f.next().and_then(|x| x.parse().ok()).unwrap_or(0.0);
        println!(
            "{:>3} {:>8}M {:>9} {:>10.1} | {:>9.1} {:>10.1} {:>8} {:>8} {:>8} | {}",
            run,
            written >> 20,
            ckpts,
            rate,
            took.as_secs_f64() * 1e3,
            rep.bytes_read() as f64 / MIB as f64,
            rep.replay.regions_scanned,
            rep.replay.md_groups_read,
            rep.replay.entries_applied,
            steps.join(", ")
        );
        e.self_check().unwrap();
        drop(e.shutdown().unwrap());
    }
}

/// The child of `kill`: writes until killed, reporting progress once a second.
fn kill_child(dir: &Path) {
    let (c, z) = paths(dir);
    let _ = std::fs::remove_file(&c);
    let _ = std::fs::remove_file(&z);
    let mut zc = ZoneEmuConfig::new(ZONE);
    let zones = (24 * GIB / ZONE) as u32;
    zc.zone_count_max = zones;
    FileDevice::create_sparse(&z, zc.device_bytes_for(zones).unwrap()).unwrap();
    FileDevice::create_sparse(&c, 6 * GIB).unwrap();
    let cap = ZoneEmu::format(FileDevice::open(&z).unwrap(), &zc).unwrap();
    let mut e = Engine::format(
        FileDevice::open(&c).unwrap(),
        cap,
        MonotonicClock::new(),
        Config::default(),
    )
    .unwrap();
    let user = e.user_capacity_bytes();
    call(
        &mut e,
        Request::CreateVolume {
            name: "v".into(),
            size_bytes: user,
        },
    );
    let blocks = user / 4096;
    let status = dir.join("child.status");
    let t = Instant::now();
    let mut last = Instant::now();
    let mut x = 0x5DEE_CE66u64;
    let mut written = 0u64;
    loop {
        // 64 MiB of random 4 KiB writes, then a flush.
        write_many(&mut e, 16 * 1024, 4096, |_| rng(&mut x) % blocks);
        call(&mut e, Request::Flush);
        written += 64 * MIB;
        if last.elapsed() >= Duration::from_millis(500) {
            last = Instant::now();
            let rate = written as f64 / MIB as f64 / t.elapsed().as_secs_f64();
            let line = format!("{written} {} {rate:.1}\n", e.stats().checkpoints);
            let tmp = dir.join("child.status.tmp");
            std::fs::write(&tmp, line).unwrap();
            std::fs::rename(&tmp, &status).unwrap();
        }
    }
}

fn main() {
    // Built with the tests' `paranoid` feature (a dev-dependency): not timed here.
    shale_engine::disable_paranoid_checks();
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map_or("table", String::as_str);
    if what == "row" {
        match parse_row(&args[2..]) {
            Ok(a) => row(&a),
            Err(e) => {
                eprintln!("recovery_bench row: {e}\nusage: row --capacity SIZE --mapped FRACTION --recent SIZE --dir DIR [--cache SIZE] [--capacity-dir DIR] [--json]");
                std::process::exit(2);
            }
        }
        return;
    }
    let dir = args
        .get(2)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("shale-recovery-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    match what {
        "table" => table(&dir),
        "rss" => rss(&dir),
        "stall" => stall(&dir),
        "kill" => {
            let secs = std::env::var("SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30);
            let runs = std::env::var("RUNS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(3);
            kill(&dir, secs, runs);
        }
        "kill-child" => kill_child(&dir),
        other => eprintln!("unknown mode {other}: table, rss, stall or kill"),
    }
    let (c, z) = paths(&dir);
    let _ = std::fs::remove_file(c);
    let _ = std::fs::remove_file(z);
}
