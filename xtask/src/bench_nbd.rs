//! `cargo xtask bench-nbd`: the same fio jobs, in one run, against Shale's NBD export
//! and against a baseline: `qemu-nbd` exporting a plain file on the same disk (the
//! default), or with `--baseline shale-no-handoff` a second Shale without its
//! hand-off store (what storing the image before each acknowledgement costs), or with
//! `--baseline shale-one-shard` a second Shale on one engine shard while the first
//! runs `--shards N` (what the shards buy through the whole daemon), or with
//! `--baseline shale-no-direct` a second Shale without direct writes while the first
//! runs `--direct-write-min SIZE` and `--direct-write-policy P` (`[engine]
//! direct_write_min`, `direct_write_policy`; the daemon's defaults otherwise), or with
//! `--baseline shale-windows` a second Shale whose `--shards N` each have a fixed
//! window of the capacity file while the first's share it (`[engine]
//! shared_capacity = true`, or with `--shared-cache` `shared_cache = true`: the
//! cache's chunks shared too; what sharing and the space manager cost or buy). Prints
//! each job's median IOPS and bandwidth over the repetitions, and Shale's ratio to
//! the baseline.
//!
//! Both targets use sparse files under one directory (same filesystem, same disk) and
//! unix sockets; jobs alternate between the two targets so drift on a noisy machine
//! hits both alike.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Job {
    name: &'static str,
    args: &'static [&'static str],
}

const JOBS: &[Job] = &[
    Job {
        name: "randwrite-4k",
        args: &["--rw=randwrite", "--bs=4k"],
    },
    Job {
        name: "randwrite-64k",
        args: &["--rw=randwrite", "--bs=64k"],
    },
    Job {
        name: "zipf1.2-4k",
        args: &[
            "--rw=randwrite",
            "--bs=4k",
            "--random_distribution=zipf:1.2",
        ],
    },
    Job {
        name: "write-1m",
        args: &["--rw=write", "--bs=1m"],
    },
    Job {
        name: "randread-4k",
        args: &["--rw=randread", "--bs=4k"],
    },
    Job {
        name: "randread-64k",
        args: &["--rw=randread", "--bs=64k"],
    },
];

pub struct Options {
    pub dir: PathBuf,
    pub size: String,
    pub runtime_secs: u32,
    pub repeat: u32,
    pub jobs: u32,
    pub iodepth: u32,
    /// The other target: `qemu-nbd`, `shale-no-handoff` or `shale-one-shard`.
    pub baseline: String,
    /// Engine shards of the Shale under test (`[engine] shards`).
    pub shards: u32,
    /// `[engine] direct_write_min` of the Shale under test (the daemon's default
    /// when not given).
    pub direct_write_min: Option<String>,
    /// `[engine] direct_write_policy` of the Shale under test.
    pub direct_write_policy: Option<String>,
    /// `[engine] shared_cache` of the Shale under test.
    pub shared_cache: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            dir: std::env::temp_dir().join("shale-bench-nbd"),
            size: "4GiB".into(),
            runtime_secs: 10,
            repeat: 3,
            jobs: 4,
            iodepth: 32,
            baseline: "qemu-nbd".into(),
            shards: 1,
            direct_write_min: None,
            direct_write_policy: None,
            shared_cache: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
            match a.as_str() {
                "--dir" => o.dir = PathBuf::from(val()?),
                "--size" => o.size = val()?,
                "--runtime" => {
                    o.runtime_secs = val()?.parse().map_err(|e| format!("--runtime: {e}"))?
                }
                "--repeat" => o.repeat = val()?.parse().map_err(|e| format!("--repeat: {e}"))?,
                "--jobs" => o.jobs = val()?.parse().map_err(|e| format!("--jobs: {e}"))?,
                "--iodepth" => o.iodepth = val()?.parse().map_err(|e| format!("--iodepth: {e}"))?,
                "--shards" => o.shards = val()?.parse().map_err(|e| format!("--shards: {e}"))?,
                "--direct-write-min" => o.direct_write_min = Some(val()?),
                "--direct-write-policy" => o.direct_write_policy = Some(val()?),
                "--shared-cache" => o.shared_cache = true,
                "--baseline" => {
                    o.baseline = val()?;
                    if ![
                        "qemu-nbd",
                        "shale-no-handoff",
                        "shale-one-shard",
                        "shale-no-direct",
                        "shale-windows",
                    ]
                    .contains(&o.baseline.as_str())
                    {
                        return Err(format!(
                            "--baseline {}: qemu-nbd, shale-no-handoff, shale-one-shard, shale-no-direct or shale-windows",
                            o.baseline
                        ));
                    }
                }
                other => {
                    return Err(format!(
                        "unknown option {other}; see the top of xtask/src/bench_nbd.rs"
                    ))
                }
            }
        }
        if o.repeat == 0 || o.jobs == 0 || o.iodepth == 0 || o.runtime_secs == 0 || o.shards == 0 {
            return Err(
                "--repeat, --jobs, --iodepth, --runtime and --shards must be positive".into(),
            );
        }
        Ok(o)
    }
}

struct Target {
    name: &'static str,
    uri: String,
    child: Child,
    /// A Shale target's data directory (its counters are read from there).
    data: Option<PathBuf>,
}

impl Target {
    /// A Shale target's hand-off stores and their bytes so far (`shale stats`).
    fn handoff(&self) -> Option<(u64, u64)> {
        let out = Command::new("target/release/shale")
            .args(["stats", "--json", "--data-dir"])
            .arg(self.data.as_ref()?)
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let w = &v["work"];
        Some((w["handoff_stores"].as_u64()?, w["handoff_bytes"].as_u64()?))
    }
}

/// Hand-off stores per second and their mean size over a job's runs, from the
/// counters before and after.
fn handoff_rate(before: Option<(u64, u64)>, after: Option<(u64, u64)>, secs: f64) -> String {
    match (before, after) {
        (Some((s0, b0)), Some((s1, b1))) if s1 > s0 => format!(
            "{:.0}/s of {:.1} KiB",
            (s1 - s0) as f64 / secs.max(1e-9),
            (b1 - b0) as f64 / (s1 - s0) as f64 / 1024.0
        ),
        (Some(_), Some(_)) => "none".into(),
        _ => "-".into(),
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(path: &Path, child: &mut Child, what: &str) -> Result<(), String> {
    let start = Instant::now();
    while !path.exists() {
        if let Ok(Some(s)) = child.try_wait() {
            return Err(format!("{what} exited early: {s}"));
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("{what} did not create {}", path.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Shale on its own data directory `sub`, with `extra` flags.
fn start_shale(
    o: &Options,
    volume_bytes: u64,
    name: &'static str,
    sub: &str,
    extra: &[&str],
) -> Result<Target, String> {
    let data = o.dir.join(sub);
    let _ = std::fs::remove_dir_all(&data);
    // Capacity sized so the volume fits beside the default 18% spare and the zones
    // the engine keeps in reserve (GC threshold plus two open zones per stream);
    // cache 5% of it, as in the paper configuration.
    let capacity = (volume_bytes as f64 / 0.80) as u64 / (16 << 20) * (16 << 20) + (1 << 30);
    let cache = (capacity / 20).max(256 << 20) / (16 << 20) * (16 << 20);
    let bin = PathBuf::from("target/release/shale");
    let mut child = Command::new(&bin)
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .args(["--tcp", "", "--log-level", "warn"])
        .args(["--cache-size", &format!("{cache}")])
        .args(["--capacity-size", &format!("{capacity}")])
        .args(["--zone-size", "16MiB", "--chunk-size", "16MiB"])
        .args(["--default-volume-size", &format!("{volume_bytes}")])
        .args([
            "--handoff-dir",
            &o.dir.join(format!("{sub}-handoff")).display().to_string(),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", bin.display()))?;
    wait_for(&data.join("admin.sock"), &mut child, "shale serve")?;
    Ok(Target {
        name,
        uri: format!(
            "nbd+unix:///default?socket={}",
            data.join("nbd.sock").display()
        ),
        child,
        data: Some(data),
    })
}

fn start_qemu_nbd(o: &Options, volume_bytes: u64) -> Result<Target, String> {
    let file = o.dir.join("plain.img");
    let sock = o.dir.join("qemu-nbd.sock");
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&sock);
    let f = std::fs::File::create(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    f.set_len(volume_bytes)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let mut child = Command::new("qemu-nbd")
        .args([
            "--format=raw",
            "--cache=none",
            "--aio=io_uring",
            "--shared=16",
            "--persistent",
            "--discard=unmap",
        ])
        .arg(format!("--socket={}", sock.display()))
        .args(["--export-name=default"])
        .arg(&file)
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting qemu-nbd: {e}"))?;
    wait_for(&sock, &mut child, "qemu-nbd")?;
    Ok(Target {
        name: "qemu-nbd",
        uri: format!("nbd+unix:///default?socket={}", sock.display()),
        child,
        data: None,
    })
}

/// Runs one fio job; returns (IOPS, MiB/s) summed over reads and writes.
fn fio(o: &Options, t: &Target, job: &Job, volume_bytes: u64) -> Result<(f64, f64), String> {
    let per_job = volume_bytes / u64::from(o.jobs) / (1 << 20) * (1 << 20);
    let out = Command::new("fio")
        .args(["--name", job.name, "--ioengine=nbd", "--uri", &t.uri])
        .args(job.args)
        .arg(format!("--numjobs={}", o.jobs))
        .arg(format!("--iodepth={}", o.iodepth))
        .arg(format!("--size={per_job}"))
        .arg(format!("--offset_increment={per_job}"))
        .arg(format!("--runtime={}", o.runtime_secs))
        .args(["--time_based", "--group_reporting", "--output-format=json"])
        .output()
        .map_err(|e| format!("running fio: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "fio {} on {} failed: {}",
            job.name,
            t.name,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // fio may print notes before its JSON object.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.find("\n{").map(|i| &text[i + 1..]).unwrap_or(&text);
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("fio json: {e}: {text}"))?;
    let j = &v["jobs"][0];
    let iops =
        j["read"]["iops"].as_f64().unwrap_or(0.0) + j["write"]["iops"].as_f64().unwrap_or(0.0);
    let kib = j["read"]["bw"].as_f64().unwrap_or(0.0) + j["write"]["bw"].as_f64().unwrap_or(0.0);
    Ok((iops, kib / 1024.0))
}

/// Fills the whole volume once sequentially so reads hit data and writes overwrite.
fn precondition(t: &Target, volume_bytes: u64) -> Result<(), String> {
    let out = Command::new("fio")
        .args(["--name=fill", "--ioengine=nbd", "--uri", &t.uri])
        .args(["--rw=write", "--bs=1m", "--iodepth=16"])
        .arg(format!("--size={volume_bytes}"))
        .output()
        .map_err(|e| format!("running fio: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "precondition on {}: {}",
            t.name,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, shift) = match t.trim_end_matches("ib").trim_end_matches('b') {
        x if x.ends_with('g') => (&x[..x.len() - 1], 30),
        x if x.ends_with('m') => (&x[..x.len() - 1], 20),
        x => (x, 0),
    };
    num.parse::<u64>()
        .map(|n| n << shift)
        .map_err(|e| format!("size {s:?}: {e}"))
}

/// The config files of the Shale under test, of one without direct writes, and of one
/// whose shards have fixed windows of the capacity.
fn write_configs(o: &Options) -> Result<(String, String, String), String> {
    let write = |name: &str, text: String| {
        let path = o.dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok::<String, String>(path.display().to_string())
    };
    // The engine's shards come from a config file (`[engine] shards`).
    let mut text = format!("[engine]\nshards = {}\n", o.shards);
    for (key, value) in [
        ("direct_write_min", &o.direct_write_min),
        ("direct_write_policy", &o.direct_write_policy),
    ] {
        if let Some(v) = value {
            text += &format!("{key} = \"{v}\"\n");
        }
    }
    let windows = write("windows.toml", text.clone() + "shared_capacity = false\n")?;
    // Against windows, the Shale under test shares its capacity.
    if o.baseline == "shale-windows" {
        text += "shared_capacity = true\n";
    }
    if o.shared_cache {
        text += "shared_cache = true\n";
    }
    let conf = write("shards.toml", text)?;
    let plain = write(
        "no-direct.toml",
        format!(
            "[engine]\nshards = {}\ndirect_write_min = \"off\"\n",
            o.shards
        ),
    )?;
    Ok((conf, plain, windows))
}

pub fn run(o: &Options) -> Result<(), String> {
    let volume_bytes = parse_size(&o.size)?;
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let (conf, plain, windows) = write_configs(o)?;
    let shale = start_shale(o, volume_bytes, "shale", "shale-data", &["--config", &conf])?;
    let qemu = match o.baseline.as_str() {
        "shale-no-handoff" => start_shale(
            o,
            volume_bytes,
            "shale-no-handoff",
            "shale-data-no-handoff",
            &["--config", &conf, "--handoff-dir", "off"],
        )?,
        "shale-no-direct" => start_shale(
            o,
            volume_bytes,
            "shale-no-direct",
            "shale-data-no-direct",
            &["--config", &plain],
        )?,
        "shale-windows" => start_shale(
            o,
            volume_bytes,
            "shale-windows",
            "shale-data-windows",
            &["--config", &windows],
        )?,
        "shale-one-shard" => start_shale(
            o,
            volume_bytes,
            "shale-one-shard",
            "shale-data-one-shard",
            &[],
        )?,
        _ => start_qemu_nbd(o, volume_bytes)?,
    };
    eprintln!("bench-nbd: preconditioning both targets ({})", o.size);
    precondition(&shale, volume_bytes)?;
    precondition(&qemu, volume_bytes)?;
    println!(
        "{:<14} {:>12} {:>12} {:>10} {:>10} {:>12} {:>12}  hand-off stores (shale; base)",
        "job", "shale IOPS", "base IOPS", "shale MiB/s", "base MiB/s", "IOPS ratio", "MiB/s ratio"
    );
    for job in JOBS {
        let (mut si, mut sb, mut qi, mut qb) = (vec![], vec![], vec![], vec![]);
        let (s0, q0) = (shale.handoff(), qemu.handoff());
        for r in 0..o.repeat {
            eprintln!("bench-nbd: {} repetition {}/{}", job.name, r + 1, o.repeat);
            let (i, b) = fio(o, &shale, job, volume_bytes)?;
            si.push(i);
            sb.push(b);
            let (i, b) = fio(o, &qemu, job, volume_bytes)?;
            qi.push(i);
            qb.push(b);
        }
        let secs = f64::from(o.repeat) * o.runtime_secs as f64;
        let stores = format!(
            "{}; {}",
            handoff_rate(s0, shale.handoff(), secs),
            handoff_rate(q0, qemu.handoff(), secs)
        );
        let (si, sb, qi, qb) = (
            median(&mut si),
            median(&mut sb),
            median(&mut qi),
            median(&mut qb),
        );
        println!(
            "{:<14} {:>12.0} {:>12.0} {:>10.1} {:>10.1} {:>12.2} {:>12.2}  {stores}",
            job.name,
            si,
            qi,
            sb,
            qb,
            si / qi.max(f64::MIN_POSITIVE),
            sb / qb.max(f64::MIN_POSITIVE)
        );
    }
    println!(
        "(medians of {} runs of {} s, {} jobs x QD {}, volume {}; ratio = shale / {})",
        o.repeat, o.runtime_secs, o.jobs, o.iodepth, o.size, o.baseline
    );
    drop(shale);
    drop(qemu);
    Ok(())
}
