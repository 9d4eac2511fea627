//! Volume rate limits through the real daemon: `shale volume create --iops-max`,
//! `shale volume set --mibps-max`, fio over NBD held to the limit while another
//! volume is not, the limits in `volume list` (text and JSON) and across a restart.

mod daemon_common;

use std::process::Command;

use daemon_common::*;

/// fio over NBD for `secs` seconds: (IOPS, MiB/s) written.
fn fio(d: &Daemon, export: &str, bs: &str, secs: u32) -> (f64, f64) {
    let out = stdout(Command::new("fio").args([
        "--name=limits",
        "--ioengine=nbd",
        "--uri",
        &d.uri(export),
        "--rw=randwrite",
        &format!("--bs={bs}"),
        "--iodepth=16",
        "--size=32m",
        "--time_based",
        &format!("--runtime={secs}"),
        "--output-format=json",
    ]));
    // fio's nbd engine prints a line of its own before the JSON.
    let json = &out[out.find('{').unwrap_or(0)..];
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {out}"));
    let w = &v["jobs"][0]["write"];
    let iops = w["iops"].as_f64().expect("iops");
    let mibps = w["bw_bytes"].as_f64().expect("bw_bytes") / MIB as f64;
    (iops, mibps)
}

fn volume<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list.as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("no volume {name} in {list}"))
}

fn list(d: &Daemon) -> serde_json::Value {
    let s = d.admin(&["volume", "list", "--json"]);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

#[test]
fn a_limited_volume_is_held_to_its_rates_across_a_restart() {
    require("fio", "fio");
    let mut d = Daemon::start();
    let made = d.admin(&["volume", "create", "slow", "64MiB", "--iops-max", "200"]);
    assert!(made.contains("at most 200 IOPS"), "{made}");

    // 3 s at 200 IOPS: 600 requests and the bucket's tenth of a second.
    let (iops, _) = fio(&d, "slow", "4k", 3);
    let (free, _) = fio(&d, "default", "4k", 3);
    eprintln!("limited {iops:.0} IOPS, unlimited {free:.0} IOPS");
    assert!(
        (120.0..=240.0).contains(&iops),
        "limited volume ran {iops:.0} IOPS"
    );
    assert!(
        free > 2.0 * iops,
        "unlimited {free:.0} vs limited {iops:.0}"
    );
    let s = d.stats();
    assert!(s["work"]["throttle_waits"].as_u64().unwrap_or(0) > 0, "{s}");
    let slow = volume(&s["volumes"], "slow");
    assert!(
        slow["throttle"]["delayed"].as_u64().unwrap_or(0) > 300,
        "{slow}"
    );
    assert!(
        slow["throttle"]["wait_ms"].as_u64().unwrap_or(0) > 0,
        "{slow}"
    );
    assert_eq!(
        volume(&s["volumes"], "default")["throttle"]["delayed"],
        0,
        "{s}"
    );

    // Another limit instead: 2 MiB/s of 64 KiB writes.
    let set = d.admin(&[
        "volume",
        "set",
        "slow",
        "--iops-max",
        "none",
        "--mibps-max",
        "2",
    ]);
    assert!(
        set.contains("at most 2 MiB/s") && !set.contains("IOPS"),
        "{set}"
    );
    let (_, mibps) = fio(&d, "slow", "64k", 3);
    eprintln!("limited to 2 MiB/s: {mibps:.2} MiB/s");
    assert!(
        (1.2..=2.6).contains(&mibps),
        "limited volume wrote {mibps:.2} MiB/s"
    );

    let l = list(&d);
    assert_eq!(volume(&l, "slow")["mibps_max"], 2, "{l}");
    assert!(volume(&l, "slow")["iops_max"].is_null(), "{l}");
    assert!(volume(&l, "default")["mibps_max"].is_null(), "{l}");
    let text = d.admin(&["volume", "list"]);
    assert!(
        text.lines().next().unwrap_or("").contains("MAX-MIB/S"),
        "{text}"
    );

    // A cache share and a GC policy beside the rate; each volume's data in the cache.
    let set = d.admin(&[
        "volume",
        "set",
        "slow",
        "--cache-share=30",
        "--gc=cost-benefit",
    ]);
    assert!(
        set.contains("2 MiB/s, 30% of the cache, cost-benefit GC"),
        "{set}"
    );
    let cached = d.stats()["volumes"][0]["cache_valid_bytes"].as_u64();
    assert!(cached.is_some(), "stats lack cache_valid_bytes");

    // Limits are part of the pool: a restart keeps them.
    d.stop();
    d.spawn();
    let l = list(&d);
    assert_eq!(volume(&l, "slow")["mibps_max"], 2, "{l}");
    assert_eq!(volume(&l, "slow")["cache_share_pct"], 30, "{l}");
    assert_eq!(volume(&l, "slow")["gc"], "cost-benefit", "{l}");
    assert!(volume(&l, "default")["cache_share_pct"].is_null(), "{l}");
    let text = d.admin(&["volume", "list"]);
    assert!(
        text.contains("CACHE-SHARE") && text.contains("30%"),
        "{text}"
    );
    d.admin(&[
        "volume",
        "set",
        "slow",
        "--mibps-max",
        "0",
        "--cache-share",
        "none",
    ]);
    let l = list(&d);
    assert!(volume(&l, "slow")["mibps_max"].is_null(), "{l}");
    assert!(volume(&l, "slow")["cache_share_pct"].is_null(), "{l}");

    refusals(&d);
    d.stop();
}

/// Refusals: nothing to set, no such volume, a rate or share that is not one.
fn refusals(d: &Daemon) {
    for args in [
        &["volume", "set", "slow"][..],
        &["volume", "set", "nope", "--iops-max", "5"],
        &["volume", "set", "slow", "--iops-max", "many"],
        &["volume", "set", "slow", "--cache-share", "101"],
        &["volume", "set", "slow", "--gc", "lru"],
    ] {
        let out = output(shale().args(args).arg("--data-dir").arg(d.data_dir()));
        assert!(!out.status.success(), "{args:?} succeeded");
    }
}

/// `[devices] volumes` in the config file: the first start creates them, limits and
/// all, instead of `default`.
#[test]
fn the_first_start_creates_the_configured_volumes_with_their_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("shale.toml");
    std::fs::write(
        &config,
        "[devices]\nvolumes = [\"db:64MiB,iops-max=300\", \"logs,mibps-max=5\"]\n",
    )
    .expect("write config");
    let mut args: Vec<String> = vec!["--config".into(), config.display().to_string()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    // The flag's default volume size and the config's volumes exclude each other.
    args.retain(|a| a != "--default-volume-size" && a != "512MiB");
    let mut d = Daemon::start_with(args);
    let l = list(&d);
    assert_eq!(l.as_array().map(Vec::len), Some(2), "{l}");
    assert_eq!(volume(&l, "db")["size_bytes"], 64 * MIB, "{l}");
    assert_eq!(volume(&l, "db")["iops_max"], 300, "{l}");
    assert_eq!(volume(&l, "logs")["mibps_max"], 5, "{l}");
    assert!(volume(&l, "logs")["size_bytes"].as_u64().unwrap_or(0) > 64 * MIB);
    d.stop();
}
