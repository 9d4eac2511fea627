//! A daemon whose pool is several engine shards (`[engine] shards = 2`): real clients
//! (nbdcopy, qemu-io) write and read across shard boundaries, volumes are created,
//! resized and deleted through the admin socket, and the data survives a clean
//! restart and a kill -9 (each shard's hand-off store and recovery).

mod daemon_common;

use std::process::Command;

use daemon_common::*;

/// How the shards divide the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    /// Each shard a window of the cache and of the capacity file.
    Windows,
    /// Each a window of the cache; the capacity's zones shared.
    Capacity,
    /// The cache's chunks shared too (each shard's metadata in a window).
    Cache,
}

impl Sharing {
    fn config(self, shards: u32) -> String {
        format!(
            "[engine]\nshards = {shards}\nshared_capacity = {}\nshared_cache = {}\n",
            self == Sharing::Capacity,
            self == Sharing::Cache
        )
    }

    /// Another way, for a restart that must open the pool as formatted.
    fn other(self) -> Sharing {
        match self {
            Sharing::Windows => Sharing::Capacity,
            Sharing::Capacity | Sharing::Cache => Sharing::Windows,
        }
    }
}

fn sharded(shards: u32, sharing: Sharing) -> (Daemon, tempfile::NamedTempFile) {
    let conf = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(conf.path(), sharing.config(shards)).expect("write config");
    let mut args = vec!["--config".to_string(), conf.path().display().to_string()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    (Daemon::start_with(args), conf)
}

fn volume_sizes(d: &Daemon) -> Vec<(String, u64)> {
    let v: serde_json::Value =
        serde_json::from_str(&d.admin(&["volume", "list", "--json"])).expect("list json");
    v.as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_string(),
                v["size_bytes"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Shards sharing the capacity file: its zones move between them.
#[test]
fn a_sharded_pool_serves_restarts_and_recovers() {
    serves_restarts_and_recovers(Sharing::Capacity);
}

/// Shards each in a fixed window of the capacity file (the default).
#[test]
fn a_pool_of_shards_in_windows_serves_restarts_and_recovers() {
    serves_restarts_and_recovers(Sharing::Windows);
}

/// Shards sharing the cache file's chunks and the capacity file's zones.
#[test]
fn a_pool_of_shards_sharing_the_cache_serves_restarts_and_recovers() {
    serves_restarts_and_recovers(Sharing::Cache);
}

/// What the daemon's log says of the sharing, as `sharing` would have it.
fn says(log: &str, sharing: Sharing) {
    let zones = log.contains("space manager: shards share the capacity");
    let chunks = log.contains("space manager: shards share the cache");
    assert_eq!(zones, sharing != Sharing::Windows, "{log}");
    assert_eq!(chunks, sharing == Sharing::Cache, "{log}");
}

fn serves_restarts_and_recovers(sharing: Sharing) {
    require("nbdcopy", "libnbd-bin");
    require("qemu-io", "qemu-utils");
    let (mut d, conf) = sharded(2, sharing);
    assert!(d.log().contains("shards=2"), "{}", d.log());
    says(&d.log(), sharing);
    let uri = d.uri("default");
    // 24 MiB of distinct blocks at the start of the volume, copied in by nbdcopy's
    // large requests (each spans both shards).
    let size = 24usize << 20;
    let mut want: Vec<u8> = (0..size / 8)
        .flat_map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes())
        .collect();
    let src = d.dir.path().join("src.img");
    write_file(&src, &want);
    run(Command::new("nbdcopy")
        .arg("--destination-is-zero")
        .arg(&src)
        .arg(&uri));
    // Unaligned writes straddling a granule (64 KiB) boundary, then a flush.
    let out = stdout(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x3c 60k 200k",
        "-c",
        "write -P 0x7e 1000k 4k",
        "-c",
        "flush",
        &uri,
    ]));
    assert!(!out.contains("failed"), "{out}");
    want[60 << 10..260 << 10].fill(0x3c);
    want[1000 << 10..1004 << 10].fill(0x7e);
    let check = |d: &Daemon, want: &[u8], when: &str| {
        let got = read_export(&d.uri("default"), &d.dir.path().join("copy.img"));
        assert_eq!(
            first_difference(&got[..size], want),
            None,
            "{when}: the volume differs"
        );
        assert!(
            got[size..].iter().all(|&b| b == 0),
            "{when}: unwritten tail"
        );
    };
    check(&d, &want, "served");
    let st = d.stats();
    assert!(
        st["bytes"]["user_written"].as_u64().unwrap_or(0) >= size as u64,
        "{st}"
    );
    // What the space manager moved is counted (given once, taken once per move).
    let (given, taken) = (&st["space"]["zones_given"], &st["space"]["zones_taken"]);
    assert!(given.is_u64() && taken.as_u64() >= given.as_u64(), "{st}");

    volumes_across_shards(&d);

    d.stop();
    // The windows come from what shard 0 recorded: another zone size given at the
    // next start (a format-time setting) does not move them.
    let mut args: Vec<String> = vec!["--config".into(), conf.path().display().to_string()];
    args.extend(SMALL_DEVICES.iter().map(|s| {
        if *s == "16MiB" {
            "32MiB".to_string()
        } else {
            s.to_string()
        }
    }));
    // So is the configuration's way of sharing the devices.
    std::fs::write(conf.path(), sharing.other().config(2)).expect("write config");
    d.set_args(args);
    d.spawn();
    assert!(!d.log().contains("dirty recovery"), "{}", d.log());
    // Found as formatted, whatever the configuration says now.
    says(&d.last_log(), sharing);
    check(&d, &want, "after a clean restart");

    // Acknowledged writes survive a kill of the daemon (each shard's hand-off).
    let out = stdout(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x11 128k 512k",
        &d.uri("default"),
    ]));
    assert!(!out.contains("failed"), "{out}");
    want[128 << 10..640 << 10].fill(0x11);
    d.kill9();
    d.spawn();
    check(&d, &want, "after kill -9");
    d.stop();

    offline_check(&d, size as u64, sharing);
    d.spawn();
    assert!(d.last_log().contains("shard{index=1}"), "{}", d.last_log());
    d.stop();
}

/// Waits (up to 10 s) until the daemon has seen the last client of `name` go: a
/// client that exited may still count until its connection's thread notices.
fn wait_no_clients(d: &Daemon, name: &str) {
    for _ in 0..200 {
        let v: serde_json::Value =
            serde_json::from_str(&d.admin(&["volume", "list", "--json"])).expect("list json");
        let clients = v
            .as_array()
            .and_then(|a| a.iter().find(|v| v["name"] == name))
            .map_or(0, |v| v["clients"].as_u64().unwrap_or(0));
        if clients == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("volume {name} still has clients after 10 s");
}

/// `volume create`, `resize` and `delete` on a pool of shards.
fn volumes_across_shards(d: &Daemon) {
    // Volumes across the shards: a size that is not a multiple of the shards'
    // granules still reads back whole; shrink and delete.
    d.admin(&["volume", "create", "b", "10244KiB"]);
    assert!(
        volume_sizes(d).contains(&("b".to_string(), 10244 << 10)),
        "{:?}",
        volume_sizes(d)
    );
    let out = stdout(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x55 10240k 4k",
        "-c",
        "read -P 0x55 10240k 4k",
        &d.uri("b"),
    ]));
    assert!(
        !out.contains("failed") && !out.contains("Pattern verification"),
        "{out}"
    );
    wait_no_clients(d, "b");
    d.admin(&["volume", "resize", "b", "8MiB"]);
    assert!(
        volume_sizes(d).contains(&("b".to_string(), 8 << 20)),
        "{:?}",
        volume_sizes(d)
    );
    d.admin(&["volume", "delete", "b", "--force"]);
    assert!(!volume_sizes(d).iter().any(|(n, _)| n == "b"));
}

/// `shale check` on the stopped daemon's devices: both shards found and checked,
/// data included; `size` bytes were written.
fn offline_check(d: &Daemon, size: u64, sharing: Sharing) {
    // The offline checker finds both shards and checks each, data included.
    let out = output(
        shale()
            .arg("check")
            .arg("--cache")
            .arg(d.data_dir().join("cache.img"))
            .arg("--capacity")
            .arg(d.data_dir().join("capacity.img"))
            .args(["--data", "--json"]),
    );
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("check --json output");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["clean_flag"], true, "{report}");
    // Every block written is mapped in one shard or the other (24 MiB and more).
    assert!(
        report["counts"]["mapped_blocks"].as_u64().unwrap_or(0) >= size / 4096,
        "{report}"
    );
    // Every zone, and every chunk of a shared cache, held by one shard (found by
    // reading each shard's view: the cache as shard 0's superblock divides it).
    let text = report.to_string();
    assert!(!text.contains("held by"), "{sharing:?}: {report}");
}

/// Three capacity files at 2+1 and a cache file, as flags.
fn array_flags(dir: &std::path::Path, config: &std::path::Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--config".into(),
        config.display().to_string(),
        "--cache".into(),
        dir.join("cache.img").display().to_string(),
    ];
    for i in 0..3 {
        args.push("--capacity".into());
        args.push(dir.join(format!("cap{i}.img")).display().to_string());
    }
    args.extend(
        [
            "--capacity-redundancy",
            "2+1",
            "--cache-size",
            "96MiB",
            "--capacity-size",
            "512MiB",
            "--chunk-size",
            "4MiB",
            "--zone-size",
            "4MiB",
            "--default-volume-size",
            "128MiB",
        ]
        .map(String::from),
    );
    args
}

/// Two shards over a capacity array share it (an array is one device, not cut in
/// windows): data written across both shards reads back after a restart and after
/// a kill -9.
#[test]
fn shards_share_a_capacity_array() {
    require("qemu-io", "qemu-utils");
    let conf = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(conf.path(), "[engine]\nshards = 2\n").expect("write config");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut d = Daemon::start_with(array_flags(dir.path(), conf.path()));
    assert!(
        d.log().contains("space manager: shards share"),
        "{}",
        d.log()
    );
    let io = |d: &Daemon, cmds: &[&str]| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "raw"]);
        for x in cmds {
            c.args(["-c", x]);
        }
        let out = stdout(c.arg(d.uri("default")));
        assert!(
            !out.contains("failed") && !out.contains("Pattern verification"),
            "{out}"
        );
    };
    io(
        &d,
        &["write -P 0x21 0 8M", "write -P 0x42 60k 200k", "flush"],
    );
    let verify = |d: &Daemon| {
        io(
            d,
            &[
                "read -P 0x21 0 60k",
                "read -P 0x42 60k 200k",
                "read -P 0x21 260k 7932k",
            ],
        )
    };
    verify(&d);
    d.stop();
    d.spawn();
    verify(&d);
    io(&d, &["write -P 0x21 60k 200k"]);
    d.kill9();
    d.spawn();
    io(&d, &["read -P 0x21 0 8M"]);
    d.stop();
    // The offline checker finds both shards over the array, every zone held once.
    let mut check = shale();
    check.args(["check", "--data", "--json", "--cache"]);
    check.arg(dir.path().join("cache.img"));
    for i in 0..3 {
        check
            .arg("--capacity")
            .arg(dir.path().join(format!("cap{i}.img")));
    }
    let out = output(&mut check);
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("check --json output");
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        report["counts"]["mapped_blocks"].as_u64().unwrap_or(0) >= 2048,
        "{report}"
    );
    assert!(!report.to_string().contains("held by"), "{report}");
}

/// A count outside 1..=64 is refused by name; a configuration that cannot be cut
/// into shards (a cache mirror) is refused at format with the reason.
#[test]
fn bad_shard_settings_are_refused() {
    let conf = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(conf.path(), "[engine]\nshards = 65\n").expect("write config");
    let err = serve_refused(&["--config", &conf.path().display().to_string()]);
    assert!(err.contains("engine.shards"), "{err}");

    // Two shards over a cache mirror: refused with the reason.
    std::fs::write(conf.path(), "[engine]\nshards = 2\n").expect("write config");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = array_flags(dir.path(), conf.path());
    args.extend([
        "--cache".into(),
        dir.path().join("cache-b.img").display().to_string(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = serve_refused(&refs);
    assert!(err.contains("not a mirror"), "{err}");
}
