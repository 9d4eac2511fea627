//! `shale bench run` end to end: the binary on the `tiny` configuration.

use std::process::{Command, Output};

fn shale(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(args)
        .output()
        .expect("run the shale binary")
}

fn bench_json(workload: &str, bs: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "run",
        "--system",
        "raw",
        "--drive",
        "qlc-p5316",
        "--config",
        "tiny",
        "--workload",
        workload,
        "--bs",
        bs,
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = shale(&args);
    assert!(
        out.status.success(),
        "shale {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "one JSON object: {stdout}"
    );
    serde_json::from_str(stdout.trim()).expect("valid JSON")
}

fn num(v: &serde_json::Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or_else(|| panic!("missing number at {path} in {v}"))
}

#[test]
fn json_report_has_the_documented_keys() {
    let v = bench_json("uniform", "4k", &[]);
    assert_eq!(v["system"], "raw");
    assert_eq!(v["workload"], "uniform");
    assert_eq!(num(&v, "/bs"), 4096.0);
    for path in [
        "/waf/layer",
        "/waf/device",
        "/waf/total",
        "/bytes/user_written",
        "/bytes/capacity_written",
        "/bytes/capacity_nand",
        "/emulated_mib_s",
    ] {
        num(&v, path);
    }
    // Raw: the tenants write straight to the drive.
    assert_eq!(num(&v, "/waf/layer"), 1.0);
    assert_eq!(
        num(&v, "/bytes/capacity_written"),
        num(&v, "/bytes/user_written")
    );
    let product = num(&v, "/waf/layer") * num(&v, "/waf/device");
    assert!((product - num(&v, "/waf/total")).abs() < 1e-9);
    assert!(num(&v, "/bytes/user_written") >= 2.0 * num(&v, "/capacity_bytes"));
}

#[test]
fn random_small_writes_amplify_far_more_than_sequential_ones() {
    let uniform = bench_json("uniform", "4k", &[]);
    let random = bench_json("random", "4k", &[]);
    let seq = bench_json("seq", "1m", &[]);
    let total = |v: &serde_json::Value| num(v, "/waf/total");
    assert!(total(&seq) <= 1.1, "seq {}", total(&seq));
    assert!(
        total(&uniform) > 10.0 * total(&seq),
        "uniform {}",
        total(&uniform)
    );
    assert!(
        total(&random) > 10.0 * total(&seq),
        "random {}",
        total(&random)
    );
    let mibs = |v: &serde_json::Value| num(v, "/emulated_mib_s");
    assert!(mibs(&seq) > mibs(&uniform));
}

#[test]
fn equal_seeds_give_equal_figures() {
    let a = bench_json("zipf:1.2", "4k", &["--seed", "3"]);
    let b = bench_json("zipf:1.2", "4k", &["--seed", "3"]);
    assert_eq!(a["bytes"], b["bytes"]);
    assert_eq!(a["waf"], b["waf"]);
}

/// `--ramp` and `--measure` set the phases' lengths in capacities; the config's
/// name says so, and the measured bytes follow.
#[test]
fn ramp_and_measure_set_the_phases() {
    let std = bench_json("uniform", "4k", &[]);
    let long = bench_json("uniform", "4k", &["--ramp", "0", "--measure", "4"]);
    assert_eq!(long["config"], "tiny+ramp0x,measure4x", "{long}");
    let user = |v: &serde_json::Value| num(v, "/bytes/user_written");
    assert!(
        user(&long) >= 1.9 * user(&std),
        "{} vs {}",
        user(&long),
        user(&std)
    );
    assert!(user(&long) >= 4.0 * num(&long, "/capacity_bytes"));
    // `--measure 0` is refused: `bad_input_is_a_clear_error_not_a_panic`.
}

#[test]
fn default_output_is_a_table() {
    let out = shale(&[
        "bench",
        "run",
        "--system",
        "raw",
        "--config",
        "tiny",
        "--workload",
        "seq",
        "--bs",
        "1m",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for label in [
        "total WAF",
        "device WAF",
        "layer WAF",
        "emulated MiB/s",
        "capacity NAND bytes",
    ] {
        assert!(text.contains(label), "missing {label:?} in\n{text}");
    }
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let base = ["bench", "run", "--system", "raw", "--config", "tiny"];
    let cases: [(&[&str], &str); 13] = [
        (
            &["--drive", "nope", "--workload", "uniform", "--bs", "4k"],
            "unknown flash preset",
        ),
        (&["--workload", "uniform", "--bs", "4x"], "unknown unit"),
        (&["--workload", "uniform", "--bs", "0"], "must be positive"),
        (
            &["--workload", "uniform", "--bs", "1g"],
            "larger than a volume",
        ),
        (&["--workload", "uniform", "--bs", "1000"], "not a multiple"),
        (
            &["--workload", "uniform", "--bs", "4k", "--read-pct", "101"],
            "101",
        ),
        (&["--workload", "zipf:1", "--bs", "4k"], "theta"),
        (&["--workload", "zipf:x", "--bs", "4k"], "theta"),
        (&["--workload", "zoned:50/50", "--bs", "4k"], "100"),
        (&["--workload", "fast", "--bs", "4k"], "unknown workload"),
        (&["--workload", "drift:0", "--bs", "4k"], "theta"),
        (
            &["--workload", "uniform", "--bs", "4k", "--gc", "lru"],
            "unknown GC policy",
        ),
        (
            &["--workload", "seq", "--bs", "1m", "--measure", "0"],
            "--measure",
        ),
    ];
    for (extra, needle) in cases {
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(extra);
        let out = shale(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {stderr:?} lacks {needle:?}"
        );
    }
    let out = shale(&[
        "bench",
        "run",
        "--system",
        "nosuch",
        "--workload",
        "seq",
        "--bs",
        "4k",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown system"));
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        &["--help"][..],
        &["bench", "--help"],
        &["bench", "run", "--help"],
        &["bench", "controllers", "--help"],
        &["bench", "hybrid", "--help"],
    ] {
        let out = shale(args);
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{args:?}"
        );
    }
}

/// `args` run and print one JSON object.
fn run_json(args: &[&str]) -> serde_json::Value {
    let out = shale(args);
    assert!(
        out.status.success(),
        "shale {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("valid JSON")
}

#[test]
fn arrays_report_every_device_with_its_waf() {
    let v = run_json(&[
        "bench",
        "run",
        "--system",
        "raid-model",
        "--config",
        "tiny",
        "--workload",
        "uniform",
        "--bs",
        "4k",
        "--capacity-devices",
        "4",
        "--capacity-redundancy",
        "3+1",
        "--json",
    ]);
    assert_eq!(v["system"], "raid-model");
    let devices = v["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 4);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["role"], "capacity");
        assert_eq!(d["index"], i as u64);
        assert!(d["waf"].as_f64().is_some_and(|w| w >= 1.0), "{d}");
    }
    // md's read-modify-write: two pages read and two written per 4 KiB write, or
    // close to it.
    assert!(num(&v, "/io_amp/capacity") > 3.0, "{v}");
    assert!(num(&v, "/io_amp/capacity_read_per_write") > 1.0, "{v}");
}

#[test]
fn bad_array_flags_are_refused_with_a_reason() {
    for (system, n, r, cache, want) in [
        ("shale-zns", "3", "3+1", "1", "needs exactly 4"),
        ("shale-zns", "4", "4+1", "1", "needs"),
        ("shale-blk", "5", "4+1", "1", "shale-zns"),
        ("raw", "5", "4+1", "1", "shale-zns"),
        ("raid-model", "2", "mirror", "1", "K+1 or K+2"),
        ("shale-zns", "5", "4+1", "9", "cache devices"),
    ] {
        let out = shale(&[
            "bench",
            "run",
            "--system",
            system,
            "--config",
            "tiny",
            "--workload",
            "uniform",
            "--bs",
            "4k",
            "--capacity-devices",
            n,
            "--capacity-redundancy",
            r,
            "--cache-devices",
            cache,
        ]);
        assert!(!out.status.success(), "{system} {n} {r} {cache} ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{system} {n} {r}: {err}");
    }
    let out = shale(&[
        "bench",
        "run",
        "--system",
        "shale-zns",
        "--workload",
        "uniform",
        "--bs",
        "4k",
        "--capacity-redundancy",
        "4+0",
    ]);
    assert!(!out.status.success());
}

/// A moving hot set under cost-benefit GC: the run completes and reports a WAF.
#[test]
fn drift_workload_with_cost_benefit_gc() {
    let out = shale(&[
        "bench",
        "run",
        "--system",
        "shale-zns",
        "--config",
        "tiny",
        "--workload",
        "drift:1",
        "--bs",
        "4k",
        "--gc",
        "cost-benefit",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let waf = v["waf"]["layer"].as_f64().expect("layer WAF");
    assert!(waf > 0.0, "{v}");
    assert_eq!(
        v["workload"]["name"]
            .as_str()
            .or(v["workload"].as_str())
            .map(|w| w.contains("drift")),
        Some(true),
        "{v}"
    );
}

/// `trace:FILE` replays a block trace in every tenant; its format is told by its
/// fields, and a file that is none of them is refused, naming the ways to say it.
#[test]
fn trace_workloads_replay_and_bad_traces_are_refused() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/traces");
    for file in ["alibaba_small.csv", "msr_small.csv"] {
        let w = format!("trace:{}", fixtures.join(file).display());
        let out = shale(&[
            "bench",
            "run",
            "--system",
            "shale-zns",
            "--config",
            "tiny",
            "--workload",
            &w,
            "--bs",
            "4k",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(
            v["workload"].as_str(),
            Some(format!("trace:{file}").as_str()),
            "{v}"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let odd = dir.path().join("odd.csv");
    std::fs::write(&odd, "1,2,3,4\n").expect("write");
    let w = format!("trace:{}", odd.display());
    let out = shale(&[
        "bench",
        "run",
        "--system",
        "raw",
        "--config",
        "tiny",
        "--workload",
        &w,
        "--bs",
        "4k",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("trace:alibaba:DEVICE:FILE"),
        "{stderr}"
    );
}

/// `--direct-write-min`: large sequential writes skip the cache (most of their bytes
/// are never written to it), and the run reports the same user bytes; a size that is
/// not whole blocks is refused.
#[test]
fn direct_writes_skip_the_cache() {
    let args = |min: &'static str| {
        [
            "bench",
            "run",
            "--system",
            "shale-zns",
            "--config",
            "tiny",
            "--workload",
            "seq",
            "--bs",
            "1m",
            "--direct-write-min",
            min,
            "--json",
        ]
    };
    let (off, on) = (run_json(&args("0")), run_json(&args("256k")));
    assert_eq!(
        num(&off, "/bytes/user_written"),
        num(&on, "/bytes/user_written")
    );
    let (c_off, c_on) = (
        num(&off, "/bytes/cache_written"),
        num(&on, "/bytes/cache_written"),
    );
    assert!(
        c_on < c_off / 2.0,
        "cache written {c_on} with, {c_off} without"
    );
    let out = shale(&args("6k"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("direct_write_min_bytes"));
}

/// `shale bench run` of `shale-zns` on the tiny configuration, 256 KiB uniform writes,
/// with `extra` options, JSON out.
fn tiny_uniform_256k<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "bench",
        "run",
        "--system",
        "shale-zns",
        "--config",
        "tiny",
        "--workload",
        "uniform",
        "--bs",
        "256k",
    ];
    args.extend_from_slice(extra);
    args.push("--json");
    args
}

/// `--direct-write-policy`: under `sequential` (the default) large writes at random
/// places go through the cache as without direct writes, under `any` most skip it.
#[test]
fn the_sequential_policy_leaves_random_writes_to_the_cache() {
    let args = |min: &'static str, policy: &'static str| {
        tiny_uniform_256k(&["--direct-write-min", min, "--direct-write-policy", policy])
    };
    let cache = |v: &serde_json::Value| num(v, "/bytes/cache_written");
    let off = cache(&run_json(&args("0", "sequential")));
    let sequential = cache(&run_json(&args("256k", "sequential")));
    let any = cache(&run_json(&args("256k", "any")));
    assert!(
        sequential > off * 0.8,
        "sequential: cache written {sequential}, {off} without direct writes"
    );
    assert!(any < off / 2.0, "any: cache written {any}, {off} without");
    let out = shale(&args("256k", "sometimes"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sometimes"));
}

/// `--map-unit`: whole-unit writes on volumes mapped in 16 KiB units take at most half
/// the map (whole pages at this size) and write the same bytes to the cache; a unit
/// that is not one is refused by name.
#[test]
fn mapping_units_shrink_the_map() {
    let args = |unit: &'static str| tiny_uniform_256k(&["--map-unit", unit]);
    let table = |v: &serde_json::Value| num(v, "/l2p/table_bytes");
    let cache = |v: &serde_json::Value| num(v, "/bytes/cache_written");
    let (blocks, units) = (run_json(&args("4k")), run_json(&args("16k")));
    assert!(
        table(&units) > 0.0 && table(&units) <= table(&blocks) / 2.0,
        "map {} with 16 KiB units, {} with 4 KiB",
        table(&units),
        table(&blocks)
    );
    assert!(
        cache(&units) < cache(&blocks) * 1.1,
        "whole units: cache {} vs {}",
        cache(&units),
        cache(&blocks)
    );
    let out = shale(&args("24k"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}

/// `--dual-map`: written in whole units, a dual-mapped volume keeps the unit map's
/// size (its sparse map stays empty); without a unit above 4 KiB it is refused.
#[test]
fn dual_maps_written_in_units_keep_the_small_map() {
    let table = |v: &serde_json::Value| num(v, "/l2p/table_bytes");
    let blocks = run_json(&tiny_uniform_256k(&[]));
    let dual = run_json(&tiny_uniform_256k(&["--dual-map", "--map-unit", "16k"]));
    assert!(
        table(&dual) > 0.0 && table(&dual) <= table(&blocks) / 2.0,
        "map {} dual with 16 KiB units, {} with 4 KiB",
        table(&dual),
        table(&blocks)
    );
    let out = shale(&tiny_uniform_256k(&["--dual-map", "--map-unit", "4k"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("above 4KiB"));
}

/// `--drive` picks Shale's capacity drive: the SMR disk under `shale-zns` reports its
/// preset and its seeks and runs far slower than the flash it replaces; a drive of
/// the wrong kind is refused by name.
#[test]
fn shale_runs_on_the_drive_asked_for() {
    let args = |system: &'static str, drive: &'static str| {
        [
            "bench",
            "run",
            "--system",
            system,
            "--config",
            "tiny",
            "--workload",
            "uniform",
            "--bs",
            "4k",
            "--drive",
            drive,
            "--json",
        ]
    };
    let flash = run_json(&args("shale-zns", "zns-qlc"));
    let disk = run_json(&args("shale-zns", "smr-hm"));
    assert_eq!(disk["drive"], "smr-hm", "{disk}");
    assert_eq!(disk["devices"][0]["role"], "capacity");
    assert!(num(&disk, "/devices/0/head_moves") > 0.0, "{disk}");
    // The same engine, so the same bytes; the disk takes them far slower.
    assert_eq!(
        num(&flash, "/bytes/capacity_written"),
        num(&disk, "/bytes/capacity_written")
    );
    assert!(num(&disk, "/emulated_mib_s") * 10.0 < num(&flash, "/emulated_mib_s"));
    let blk = run_json(&args("shale-blk", "hdd"));
    assert_eq!(blk["drive"], "hdd", "{blk}");
    for (system, drive) in [("shale-zns", "qlc-p5316"), ("shale-blk", "smr-hm")] {
        let out = shale(&args(system, drive));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(drive) && err.contains("capacity drive"),
            "{err}"
        );
    }
}

/// SALSA's two-controller experiment: three setups over the same volumes and
/// workload, the dual one's maps the smallest; bad input refused by name.
#[test]
fn the_controllers_experiment_compares_three_setups() {
    let v = run_json(&[
        "bench",
        "controllers",
        "--config",
        "quick",
        "--capacity",
        "256MiB",
        "--json",
    ]);
    let setups = v["setups"].as_array().expect("setups");
    let names: Vec<&str> = setups.iter().filter_map(|s| s["setup"].as_str()).collect();
    assert_eq!(names, ["single", "streams", "dual"]);
    let bytes = |i: usize, k: &str| setups[i][k].as_u64().expect(k);
    assert!(bytes(2, "l2p_table_bytes") < bytes(0, "l2p_table_bytes"));
    assert_eq!(bytes(0, "user_written"), bytes(2, "user_written"));
    assert!(v["dram_cut"].as_f64().expect("dram_cut") > 0.4, "{v}");
    assert!(v["relocation_cut"].is_number(), "{v}");
    for (args, want) in [
        (&["--objects", "sideways"][..], "objects"),
        (&["--config", "tiny"], "quick or paper"),
    ] {
        let mut a = vec!["bench", "controllers"];
        a.extend_from_slice(args);
        let out = shale(&a);
        assert!(!out.status.success(), "{a:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{a:?}: {err}");
    }
}

/// `--cold`: a cold tier behind the capacity drive reports both drives, and GC writes
/// the cold one; a system without tiers, an unknown preset and a share past 90% are
/// refused by name.
#[test]
fn a_cold_tier_goes_behind_the_capacity_drive() {
    let v = run_json(&tiny_uniform_256k(&[
        "--cold",
        "smr-hm",
        "--cold-pct",
        "50",
    ]));
    let devices = v["devices"].as_array().expect("devices");
    let preset = |p: &str| devices.iter().find(|d| d["preset"] == p);
    let cold = preset("smr-hm").expect("the cold drive is reported");
    assert!(preset("zns-qlc").is_some(), "{devices:?}");
    assert!(cold["host_written"].as_u64().unwrap_or(0) > 0, "{cold}");
    let traffic = v["traffic"].as_array().expect("traffic");
    assert!(
        traffic.iter().any(|t| t["name"] == "promoted"),
        "{traffic:?}"
    );
    for (args, want) in [
        (
            &[
                "bench",
                "run",
                "--system",
                "raw",
                "--config",
                "tiny",
                "--workload",
                "uniform",
                "--bs",
                "256k",
                "--cold",
                "hdd",
            ][..],
            "no tiers",
        ),
        (&tiny_uniform_256k(&["--cold", "tape"])[..], "tape"),
        (
            &tiny_uniform_256k(&["--cold", "hdd", "--cold-pct", "95"])[..],
            "95",
        ),
    ] {
        let out = shale(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// SALSA's video server: three setups read the same bytes; with half the zones on
/// flash the hybrid pool brings blocks back and reads less from the disk than the
/// disk alone (with a fifth on flash it thrashes at this size: docs/benchmarks.md).
#[test]
fn the_hybrid_experiment_reads_less_from_the_disk() {
    let v = run_json(&[
        "bench",
        "hybrid",
        "--config",
        "quick",
        "--capacity",
        "256MiB",
        "--cold-pct",
        "50",
        "--json",
    ]);
    let setups = v["setups"].as_array().expect("setups");
    let names: Vec<&str> = setups.iter().filter_map(|s| s["setup"].as_str()).collect();
    assert_eq!(names, ["smr", "tier-only", "hybrid"]);
    let get = |i: usize, k: &str| setups[i][k].as_u64().expect(k);
    assert!(get(2, "promoted_bytes") > 0, "{v}");
    assert_eq!(get(1, "promoted_bytes"), 0, "{v}");
    assert!(get(2, "smr_read_bytes") < get(0, "smr_read_bytes"), "{v}");
    assert!(v["read_speedup"].as_f64().expect("speedup") > 1.0, "{v}");
}
