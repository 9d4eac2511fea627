//! `shale check` on real files: a freshly formatted pair, the same pair after data
//! and a crash (no clean shutdown), and one-byte flips in each kind of metadata block
//! at a fixed place (superblocks, volume table, checkpoint, journal, capacity label,
//! zone emulation geometry and table). Each flip must be reported, with a clear line
//! and a non-zero exit status, never a panic. Every block of every structure is
//! flipped by the engine's own corruption tests (crates/shale-engine/tests/engine/corruption.rs)
//! against the checker library; this test covers the binary around it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use shale_device::{BlockDevice, FileDevice, ZoneEmu};
use shale_engine::{Config, Engine, MonotonicClock, Reply, Request, VolumeUid};
use shale_format::Superblock;

const BS: u64 = 4096;

fn shale() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shale"))
}

struct Pair {
    _dir: tempfile::TempDir,
    cache: PathBuf,
    capacity: PathBuf,
}

fn format() -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.img");
    let capacity = dir.path().join("capacity.img");
    let out = shale()
        .arg("format")
        .arg("--cache")
        .arg(&cache)
        .arg("--capacity")
        .arg(&capacity)
        .args([
            "--cache-size",
            "128MiB",
            "--capacity-size",
            "1GiB",
            "--chunk-size",
            "4MiB",
            "--zone-size",
            "16MiB",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "format: {}", text(&out));
    Pair {
        _dir: dir,
        cache,
        capacity,
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn check(p: &Pair, json: bool) -> Output {
    let mut c = shale();
    c.arg("check")
        .arg("--cache")
        .arg(&p.cache)
        .arg("--capacity")
        .arg(&p.capacity)
        .arg("--data");
    if json {
        c.arg("--json");
    }
    c.output().unwrap()
}

/// Runs one request to completion on a single-threaded engine.
fn call<C: BlockDevice, Z: shale_device::ZonedDevice>(
    e: &mut Engine<C, Z, MonotonicClock>,
    req: Request,
) -> Reply {
    shale_testkit::call(e, req).expect("request")
}

/// Writes 48 MiB over the first 64 MiB of the volume (the cache fills and compaction moves data to
/// zones), flushes, writes a little more, and stops without a clean shutdown.
fn write_and_crash(p: &Pair) {
    let cache = FileDevice::open(&p.cache).unwrap();
    let cap = ZoneEmu::open(FileDevice::open(&p.capacity).unwrap()).unwrap();
    let mut e = Engine::open(cache, cap, MonotonicClock::new(), Config::default()).unwrap();
    // `shale format` made the default volume over the whole user capacity.
    let Reply::Volumes(vols) = call(&mut e, Request::ListVolumes) else {
        panic!("list returned something else");
    };
    let v = vols.first().expect("the default volume").clone();
    assert!(v.size_bytes >= 64 << 20, "{v:?}");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..48u64 {
        let data: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        // Overwrite the first 16 MiB again and again so chunks hold stale blocks.
        let offset = ((i * 7) % 64) << 20;
        write(&mut e, v.uid, offset, data);
    }
    call(&mut e, Request::Flush);
    write(&mut e, v.uid, 3 << 20, vec![7u8; 1 << 20]);
    // A crash: no shutdown, nothing more reaches the files.
    std::mem::forget(e);
}

fn write<C: BlockDevice, Z: shale_device::ZonedDevice>(
    e: &mut Engine<C, Z, MonotonicClock>,
    volume: VolumeUid,
    offset: u64,
    data: Vec<u8>,
) {
    call(
        e,
        Request::Write {
            volume,
            offset,
            data,
            fua: false,
        },
    );
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

#[test]
fn a_clean_and_a_crashed_image_pass() {
    let p = format();
    let o = check(&p, false);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("no problems found"));
    write_and_crash(&p);
    let o = check(&p, true);
    assert!(o.status.success(), "{}", text(&o));
    let j = json(&o);
    assert_eq!(j["ok"], true);
    assert_eq!(j["clean_flag"], false, "the crash left the clean flag off");
    assert!(j["counts"]["mapped_blocks"].as_u64().unwrap() > 0);
    assert!(j["counts"]["data_blocks_verified"].as_u64().unwrap() > 0);
    let steps: Vec<&str> = j["open"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(steps.len() >= 5, "recovery steps: {steps:?}");
    // The checker never writes: the image is still dirty and checks the same.
    let again = check(&p, true);
    assert_eq!(json(&again)["clean_flag"], false);
}

fn flip(path: &Path, at: u64) {
    let mut d = FileDevice::open(path).unwrap();
    let base = at / BS * BS;
    let mut b = vec![0u8; BS as usize];
    d.read_at(base, &mut b).unwrap();
    b[(at - base) as usize] ^= 0x04;
    d.write_at(base, &b).unwrap();
    d.flush().unwrap();
}

#[test]
fn a_flipped_byte_in_each_kind_of_metadata_is_reported() {
    let p = format();
    write_and_crash(&p);
    let mut first = vec![0u8; 2 * BS as usize];
    FileDevice::open(&p.cache)
        .unwrap()
        .read_at(0, &mut first)
        .unwrap();
    let sb = [
        Superblock::decode(&first[..BS as usize], 0),
        Superblock::decode(&first[BS as usize..], BS),
    ]
    .into_iter()
    .flatten()
    .max_by_key(|s| s.generation)
    .unwrap();
    let l = sb.layout;
    let zone_data = ZoneEmu::open(FileDevice::open(&p.capacity).unwrap())
        .unwrap()
        .data_offset();
    let targets: Vec<(&str, &Path, u64)> = vec![
        ("superblock A", &p.cache, 40),
        ("superblock B", &p.cache, BS + 48),
        (
            "volume table copy 0",
            &p.cache,
            l.volume_table_start * BS + 70,
        ),
        (
            "checkpoint header in force",
            &p.cache,
            l.checkpoint_start(sb.active_checkpoint) * BS + 20,
        ),
        (
            "checkpoint region table in force",
            &p.cache,
            (l.checkpoint_start(sb.active_checkpoint) + 1) * BS + 90,
        ),
        ("journal, first entry", &p.cache, l.journal_start * BS + 30),
        ("capacity label", &p.capacity, zone_data + 24),
        ("zone emulation geometry", &p.capacity, 36),
        ("zone emulation table slot 0", &p.capacity, 2 * BS + 64 + 8),
    ];
    for (name, path, at) in targets {
        flip(path, at);
        let o = check(&p, false);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: not reported\n{out}");
        assert!(
            out.contains("ERROR") || out.contains("WARNING"),
            "{name}: no finding line\n{out}"
        );
        assert!(!out.contains("panicked"), "{name}: panic\n{out}");
        let o = check(&p, true);
        let j = json(&o);
        assert_eq!(j["ok"], false, "{name}: JSON says ok");
        assert!(!j["findings"].as_array().unwrap().is_empty(), "{name}");
        flip(path, at);
        let o = check(&p, false);
        assert!(o.status.success(), "{name}: restored image\n{}", text(&o));
    }
}

#[test]
fn missing_or_foreign_devices_are_a_clear_error() {
    let p = format();
    let o = shale()
        .args(["check", "--cache", "/nonexistent/cache.img", "--capacity"])
        .arg(&p.capacity)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cache"));
    // Cache and capacity swapped: nothing panics, and it says what is wrong.
    let o = shale()
        .arg("check")
        .arg("--cache")
        .arg(&p.capacity)
        .arg("--capacity")
        .arg(&p.cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

#[test]
fn devices_in_use_are_refused() {
    let p = format();
    // What `shale serve` holds while it runs.
    let held = std::fs::File::open(&p.cache).unwrap();
    held.try_lock().unwrap();
    let o = check(&p, false);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("in use"),
        "{}",
        text(&o)
    );
    drop(held);
    assert!(check(&p, false).status.success());
}
