//! Arrays through the real daemon: two cache mirrors and five capacity files at 4+1.
//! fio writes with checksums; members go missing (a cache mirror and a capacity
//! member), come back stale, the daemon is killed -9; every flushed byte verifies
//! through all of it, and `shale check` names what is degraded.

mod daemon_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use daemon_common::*;

fn fio_region(uri: &str, offset: &str, verify_only: bool) {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=array",
        "--ioengine=nbd",
        "--uri",
        uri,
        "--rw=randwrite",
        "--bs=64k",
        &format!("--offset={offset}"),
        "--size=48m",
        "--iodepth=16",
        "--randseed=11",
        "--verify=crc32c",
        "--serialize_overlap=1",
        "--verify_state_save=0",
        "--end_fsync=1",
    ]);
    if verify_only {
        cmd.arg("--verify_only");
    } else {
        cmd.arg("--do_verify=0");
    }
    let out = stdout(&mut cmd);
    assert!(out.contains("err= 0"), "{out}");
    assert!(!out.contains("verify:"), "{out}");
}

struct Devices {
    cache: Vec<PathBuf>,
    capacity: Vec<PathBuf>,
}

impl Devices {
    fn new(dir: &Path) -> Devices {
        Devices {
            cache: (0..2).map(|i| dir.join(format!("cache{i}.img"))).collect(),
            capacity: (0..5).map(|i| dir.join(format!("cap{i}.img"))).collect(),
        }
    }

    fn flags(&self) -> Vec<String> {
        let mut v = Vec::new();
        for c in &self.cache {
            v.push("--cache".to_string());
            v.push(c.display().to_string());
        }
        for c in &self.capacity {
            v.push("--capacity".to_string());
            v.push(c.display().to_string());
        }
        v
    }

    fn serve_flags(&self) -> Vec<String> {
        let mut v = self.flags();
        v.extend(
            [
                "--capacity-redundancy",
                "4+1",
                "--cache-size",
                "48MiB",
                "--capacity-size",
                "256MiB",
                "--chunk-size",
                "4MiB",
                "--zone-size",
                "4MiB",
                "--default-volume-size",
                "256MiB",
                "--rebuild-speed-min",
                "8MiB",
                "--rebuild-speed-max",
                "8MiB",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        v
    }

    /// `shale check` over the devices that exist; its report.
    fn check(&self) -> serde_json::Value {
        let mut cmd = shale();
        cmd.args(["check", "--json"]);
        for (flag, paths) in [("--cache", &self.cache), ("--capacity", &self.capacity)] {
            for p in paths.iter().filter(|p| p.exists()) {
                cmd.arg(flag).arg(p);
            }
        }
        let out = output(&mut cmd);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("check json {e}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn away(p: &Path) -> PathBuf {
    let to = p.with_extension("away");
    std::fs::rename(p, &to).expect("move away");
    to
}

#[test]
fn an_array_daemon_loses_nothing_when_members_go_missing() {
    require("fio", "fio");
    let root = tempfile::tempdir().expect("tempdir");
    let devs = Devices::new(root.path());
    let mut d = Daemon::start_with(devs.serve_flags());
    assert!(d.log().contains("(4+1)") || devs.capacity.iter().all(|p| p.exists()));
    fio_region(&d.uri("default"), "0", false);
    fio_region(&d.uri("default"), "64m", false);
    let s = d.stats();
    let moved = s["bytes"]["capacity_compaction_written"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        moved > 32 << 20,
        "the data never reached the capacity array: {s}"
    );
    d.stop();
    let clean = devs.check();
    assert_eq!(clean["ok"], true, "{clean}");

    // A capacity member and a cache mirror go missing: served degraded.
    let cap_away = away(&devs.capacity[2]);
    let cache_away = away(&devs.cache[0]);
    d.spawn();
    let log = d.last_log();
    assert!(log.contains("capacity array member missing"), "{log}");
    assert!(log.contains("cache mirror missing"), "{log}");
    fio_region(&d.uri("default"), "0", true);
    fio_region(&d.uri("default"), "64m", true);
    fio_region(&d.uri("default"), "128m", false);
    // Killed without a shutdown: recovery runs over the degraded arrays.
    d.kill9();
    d.spawn();
    assert!(d.last_log().contains("dirty recovery"), "{}", d.last_log());
    for offset in ["0", "64m", "128m"] {
        fio_region(&d.uri("default"), offset, true);
    }
    d.stop();
    let degraded = devs.check();
    assert_eq!(degraded["errors"], 0, "{degraded}");
    let text = degraded["findings"].to_string();
    assert!(text.contains("capacity array member 2"), "{degraded}");
    assert!(text.contains("cache mirror member 0"), "{degraded}");

    // They come back, stale: recorded failed, never read.
    std::fs::rename(&cap_away, &devs.capacity[2]).expect("back");
    std::fs::rename(&cache_away, &devs.cache[0]).expect("back");
    d.spawn();
    for offset in ["0", "64m", "128m"] {
        fio_region(&d.uri("default"), offset, true);
    }
    d.stop();
    let back = devs.check();
    assert_eq!(back["errors"], 0, "{back}");
    assert!(back["findings"].to_string().contains("is failed"), "{back}");
}

#[test]
fn array_flags_are_checked_before_anything_is_written() {
    let root = tempfile::tempdir().expect("tempdir");
    let devs = Devices::new(root.path());
    let data = root.path().join("data");
    let data = data.display().to_string();
    let flags = devs.flags();
    let mut args: Vec<&str> = vec!["--data-dir", &data];
    args.extend(flags.iter().map(String::as_str));
    let e = serve_refused(&args);
    assert!(e.contains("say how they keep the data"), "{e}");
    let mut bad = args.clone();
    bad.extend(["--capacity-redundancy", "3+1"]);
    let e = serve_refused(&bad);
    assert!(e.contains("needs exactly 4 members"), "{e}");
    assert!(
        devs.capacity.iter().all(|p| !p.exists()),
        "files were created"
    );
    let mut bad = args.clone();
    bad.extend(["--capacity-redundancy", "5+0"]);
    let e = serve_refused(&bad);
    assert!(e.contains("expected none, mirror or K+M"), "{e}");
}

/// `shale device ARGS --json` against a running daemon.
fn device(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["device"];
    all.extend_from_slice(args);
    all.push("--json");
    let s = d.admin(&all);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("device json {e}: {s}"))
}

fn state_of(list: &serde_json::Value, path: &Path) -> String {
    let p = path.display().to_string();
    list.as_array()
        .into_iter()
        .flatten()
        .find(|m| m["path"] == p.as_str())
        .map(|m| m["state"].as_str().unwrap_or("?").to_string())
        .unwrap_or_else(|| format!("{p} not listed: {list}"))
}

/// Waits (bounded) until no member is rebuilding; returns the last listing.
fn rebuilt(d: &Daemon) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let l = device(d, &["list"]);
        if !l.to_string().contains("\"rebuilding\"") {
            return l;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "rebuild never ended: {l}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn fail_replace_and_rebuild_online_even_across_a_kill() {
    require("fio", "fio");
    let root = tempfile::tempdir().expect("tempdir");
    let devs = Devices::new(root.path());
    let mut d = Daemon::start_with(devs.serve_flags());
    let uri = d.uri("default");
    for offset in ["0", "64m", "128m"] {
        fio_region(&uri, offset, false);
    }
    let list = device(&d, &["list"]);
    assert_eq!(list.as_array().map(Vec::len), Some(7), "{list}");
    assert_eq!(state_of(&list, &devs.capacity[1]), "ok");

    // A capacity member failed by the operator: everything still verifies.
    let failed = devs.capacity[1].display().to_string();
    device(&d, &["fail", &failed]);
    assert_eq!(
        state_of(&device(&d, &["list"]), &devs.capacity[1]),
        "failed"
    );
    fio_region(&uri, "0", true);

    // Replaced online by a new file; the rebuild is killed -9 half way, resumes
    // after the restart, and completes.
    let new_cap = root.path().join("cap1-new.img");
    device(&d, &["replace", &failed, &new_cap.display().to_string()]);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let mid = device(&d, &["list"]);
    assert_eq!(state_of(&mid, &new_cap), "rebuilding", "{mid}");
    d.kill9();
    let mut flags = devs.serve_flags();
    for f in flags.iter_mut() {
        if *f == failed {
            *f = new_cap.display().to_string();
        }
    }
    // Restarted without the sizes the files were made with: replacements below are
    // still sized as the members are.
    for size in ["--capacity-size", "--cache-size"] {
        if let Some(i) = flags.iter().position(|f| f == size) {
            flags.drain(i..i + 2);
        }
    }
    d.set_args(flags);
    d.spawn();
    assert!(d.last_log().contains("rebuild resumes"), "{}", d.last_log());
    let after = rebuilt(&d);
    assert_eq!(state_of(&after, &new_cap), "ok", "{after}");
    for offset in ["0", "64m", "128m"] {
        fio_region(&d.uri("default"), offset, true);
    }

    // A cache mirror lost and replaced the same way.
    let old_cache = devs.cache[0].display().to_string();
    let new_cache = root.path().join("cache0-new.img");
    device(&d, &["fail", &old_cache]);
    device(
        &d,
        &["replace", &old_cache, &new_cache.display().to_string()],
    );
    let after = rebuilt(&d);
    assert_eq!(state_of(&after, &new_cache), "ok", "{after}");
    fio_region(&d.uri("default"), "0", true);

    // Random bytes straight into another member's file under the running daemon:
    // reads rebuild the corrupt blocks from the other members and stay correct.
    corrupt(&devs.capacity[3], 4 << 20, 16 << 20);
    for offset in ["0", "64m", "128m"] {
        fio_region(&d.uri("default"), offset, true);
    }
    let s = d.stats();
    assert!(
        s["work"]["crc_rebuilt_fixes"].as_u64().unwrap_or(0) > 0,
        "no corrupt block was met: {s}"
    );

    // The corrupted member replaced by a new file (created as the members are, though
    // this daemon was not told their size): rebuilt, everything verifies.
    let bad = devs.capacity[3].display().to_string();
    let new3 = root.path().join("cap3-new.img");
    device(&d, &["replace", &bad, &new3.display().to_string()]);
    let after = rebuilt(&d);
    assert_eq!(state_of(&after, &new3), "ok", "{after}");
    for offset in ["0", "64m", "128m"] {
        fio_region(&d.uri("default"), offset, true);
    }
    d.stop();
}

/// `len` random bytes written into `path` at `at`, behind the daemon's back.
fn corrupt(path: &Path, at: u64, len: usize) {
    use std::io::{Seek, SeekFrom, Write};
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let junk: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open member file");
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.write_all(&junk).expect("write junk");
    f.sync_all().expect("sync");
}
