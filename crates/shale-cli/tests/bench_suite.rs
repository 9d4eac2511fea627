//! `shale bench suite quick` end to end: the orderings the seeds report hold on its
//! JSON, and the report, JSON and charts land in `--out`.
//!
//! The orderings are recomputed here from the measured figures, not read from the
//! suite's own `checks`, so a wrong check in the library cannot hide a regression.

use std::process::Command;
use std::time::Instant;

use serde_json::Value;

fn total_waf(v: &Value, system: &str, variant: &str, point: &str) -> f64 {
    v["run"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["system"] == system && r["variant"] == variant && r["point"] == point)
        .and_then(|r| r["report"]["waf"]["total"].as_f64())
        .unwrap_or_else(|| panic!("no total WAF for {system} {variant} {point}"))
}

fn mib_s(v: &Value, system: &str, point: &str) -> f64 {
    v["run"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["system"] == system && r["variant"] == "standard" && r["point"] == point)
        .and_then(|r| r["report"]["emulated_mib_s"].as_f64())
        .unwrap_or_else(|| panic!("no MiB/s for {system} {point}"))
}

#[test]
fn quick_suite_reproduces_the_seeds_orderings() {
    let out = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(["bench", "suite", "quick", "--json", "--seed", "0", "--out"])
        .arg(out.path())
        .output()
        .expect("run shale");
    let wall = started.elapsed();
    assert!(
        o.status.success(),
        "shale bench suite quick failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("shale bench suite quick took {wall:.1?}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");

    // CSAL-ZNS, Shale on the drive it is built for. (shale-blk's figures and checks are
    // in the report; the conventional drive's own GC costs it the 64 KiB cases.)
    let cases = ["uniform", "zipf0.8", "zipf1.2"];
    for bs in ["4k", "64k"] {
        for d in cases {
            let p = format!("{d}-{bs}");
            let (ours, raw) = (
                total_waf(&v, "shale-zns", "standard", &p),
                total_waf(&v, "raw-qlc", "standard", &p),
            );
            assert!(
                ours < raw,
                "shale-zns {p}: total WAF {ours} not below raw QLC's {raw}"
            );
        }
        let w: Vec<f64> = cases
            .iter()
            .map(|d| total_waf(&v, "shale-zns", "standard", &format!("{d}-{bs}")))
            .collect();
        assert!(
            w[2] < w[1] && w[2] < w[0],
            "shale-zns {bs}: more skew must lower WAF: uniform, zipf 0.8, zipf 1.2 = {w:?}"
        );
    }
    for s in ["shale-zns", "shale-blk"] {
        let (a, b) = (
            total_waf(&v, s, "standard", "uniform-4k"),
            total_waf(&v, "opencas-model", "standard", "uniform-4k"),
        );
        assert!(
            a < b,
            "{s}: 4 KiB random WAF {a} not below opencas-model's {b}"
        );
        let (a, b) = (
            mib_s(&v, s, "uniform-4k"),
            mib_s(&v, "opencas-model", "uniform-4k"),
        );
        assert!(
            a > b,
            "{s}: 4 KiB random MiB/s {a} not above opencas-model's {b}"
        );
    }
    for p in ["mix-seq-rand-4k", "mix-seq-rand-64k"] {
        let (on, off) = (
            total_waf(&v, "shale-zns", "standard", p),
            total_waf(&v, "shale-zns", "isolation-off", p),
        );
        assert!(on < off, "{p}: isolation on {on} not below off {off}");
    }
    // SALSA's two controllers: the dual setup's maps and GC traffic below the single's.
    let c = &v["run"]["controllers"];
    let cut = |k: &str| c[k].as_f64().unwrap_or_else(|| panic!("{k}: {c}"));
    assert!(cut("dram_cut") > 0.4, "{c}");
    assert!(cut("relocation_cut") > 0.0, "{c}");
    // SALSA's video server: the hybrid pool reads faster than the SMR disk alone.
    let h = &v["run"]["hybrid"];
    assert!(h["read_speedup"].as_f64().unwrap_or(0.0) > 1.0, "{h}");
    let checks = v["checks"].as_array().expect("checks");
    assert!(checks.len() >= 15, "{checks:?}");

    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(
        md.contains("seed WAF")
            && md.contains("Figure 16")
            && md.contains("Table III")
            && md.contains("Table IV")
    );
    for png in [
        "fig10-random.png",
        "fig10-seq.png",
        "fig16-shale-zns.png",
        "fig19.png",
    ] {
        let bytes = std::fs::read(out.path().join(png)).unwrap_or_else(|e| panic!("{png}: {e}"));
        assert_eq!(&bytes[1..4], b"PNG", "{png}");
        assert!(md.contains(png), "report.md does not show {png}");
    }
    let js: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("suite.json")).expect("suite.json"),
    )
    .expect("suite.json parses");
    assert_eq!(js["run"]["results"], v["run"]["results"].clone());
}
