//! End to end, simulated drive: `shale serve --drive PRESET` reports the drive's
//! counters in `shale stats` (JSON and text) and on the metrics endpoint. 4 KiB random
//! writes through NBD, past the start of compaction, reach a `qlc-p5316` drive (64 KiB
//! indirection unit) as the engine's zone writes: large, IU-aligned appends, which the
//! drive programs one for one. Its device WAF is still above 1, since the zone
//! emulation's table updates are smaller than an IU and each is a read-modify-write.

mod daemon_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use daemon_common::*;

fn small_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["--tcp".into(), String::new()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A loopback port free a moment ago: the metrics listener does not log the address
/// it bound, so the test cannot ask it for port 0.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").expect("send request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read metrics");
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    out
}

/// The value of the one sample `series` (name and labels) in a Prometheus text body.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("{series}: {e}"))
}

fn num(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{} is not a number: {v}", path.join(".")))
}

#[test]
#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
fn qlc_drive_counters_in_stats_and_metrics() {
    require("fio", "fio");
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let mut d = Daemon::start_with(small_args(&["--drive", "qlc-p5316", "--metrics", &metrics]));

    let s = d.stats();
    assert_eq!(s["drive"]["preset"], "qlc-p5316", "{s}");
    assert_eq!(s["drive"]["since"], "daemon start", "{s}");

    // 320 MiB of 4 KiB random writes into a 256 MiB cache: compaction must run.
    let out = stdout(Command::new("fio").args([
        "--name=rand4k",
        "--ioengine=nbd",
        "--uri",
        &d.uri("default"),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--size=512m",
        "--io_size=320m",
        "--norandommap",
        "--group_reporting",
    ]));
    assert!(out.contains("err= 0"), "{out}");
    let start = Instant::now();
    let s = loop {
        let s = d.stats();
        if num(&s, &["work", "compaction_victims"]) > 0.0
            && num(&s, &["drive", "bytes", "host_written"]) > 0.0
        {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no compaction reached the drive: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };

    let drive = &s["drive"];
    let host = num(drive, &["bytes", "host_written"]);
    let nand = num(drive, &["bytes", "nand_written"]);
    let user = num(&s, &["bytes", "user_written"]);
    let device = num(drive, &["waf", "device"]);
    let total = num(drive, &["waf", "total"]);
    println!(
        "user {:.0} MiB, layer WAF {:.3}; drive received {host} B, programmed {nand} B \
         (GC {} B, RMW {} B), erases {}; device WAF {device:.4}, total WAF {total:.3}",
        user / MIB as f64,
        num(&s, &["waf", "layer"]),
        drive["bytes"]["nand_written_gc"],
        drive["bytes"]["nand_written_rmw"],
        drive["erases"],
    );
    assert!(nand >= host, "NAND programmed less than it received: {s}");
    assert!(device > 1.0, "device WAF {device}: {s}");
    assert!(num(drive, &["bytes", "nand_written_rmw"]) > 0.0, "{s}");
    assert!((device - nand / host).abs() < 1e-9, "{s}");
    // The drive's snapshot follows the engine's, so background work between the two
    // can only add NAND bytes.
    assert!(total >= nand / user * 0.999 && total > 0.0, "{s}");
    assert!(num(drive, &["busy_s"]) > 0.0, "{s}");

    let text = scrape(port);
    let preset = "{preset=\"qlc-p5316\"}";
    let m_host = sample(
        &text,
        &format!("shale_drive_host_written_bytes_total{preset}"),
    );
    let m_nand = sample(
        &text,
        &format!("shale_drive_nand_written_bytes_total{preset}"),
    );
    let m_waf = sample(&text, &format!("shale_drive_waf{preset}"));
    assert!(m_host >= host && m_nand >= m_host, "{text}");
    assert!(m_waf > 1.0, "{text}");
    for name in [
        "shale_drive_host_read_bytes_total",
        "shale_drive_nand_read_bytes_total",
        "shale_drive_erases_total",
        "shale_drive_total_waf",
    ] {
        sample(&text, &format!("{name}{preset}"));
    }

    // Per-volume series, labelled `volume`, agree with the `volumes` array.
    assert_eq!(sample(&text, "shale_engine_up"), 1.0, "{text}");
    let vol = "{volume=\"default\"}";
    let written = sample(
        &text,
        &format!("shale_volume_user_written_bytes_total{vol}"),
    );
    let v = &s["volumes"][0];
    assert_eq!(v["name"], "default", "{s}");
    assert!(
        written >= num(v, &["bytes", "user_written"]) && written > 0.0,
        "{text}"
    );
    assert!(num(v, &["bytes", "capacity_written"]) > 0.0, "{s}");
    assert!(num(v, &["waf", "layer"]) > 0.0, "{s}");
    assert!(num(v, &["latency_us", "write", "count"]) > 0.0, "{s}");
    assert!(
        text.contains(
            "shale_volume_latency_seconds{volume=\"default\",op=\"write\",quantile=\"0.99\"}"
        ),
        "{text}"
    );

    // The human form prints the nested section readably.
    let human = d.admin(&["stats"]);
    assert!(human.contains("\ndrive:\n"), "{human}");
    assert!(
        human
            .lines()
            .any(|l| l.starts_with("  preset ") && l.ends_with(" qlc-p5316")),
        "{human}"
    );
    assert!(human.contains("\n  waf:\n    device "), "{human}");
    assert_eq!(s["work"]["crc_errors"], 0);
    d.stop();
}

#[test]
fn drive_section_absent_without_a_drive_and_present_for_zns_and_smr() {
    let mut plain = Daemon::start_with(small_args(&[]));
    let s = plain.stats();
    assert!(s.get("drive").is_none(), "{s}");
    assert!(!plain.admin(&["stats"]).contains("drive:"));
    plain.stop();

    // A zoned preset sits on top of the zone emulation; the open read the label.
    let mut zns = Daemon::start_with(small_args(&["--drive", "zns-qlc"]));
    let s = zns.stats();
    assert_eq!(s["drive"]["preset"], "zns-qlc", "{s}");
    assert!(num(&s["drive"], &["bytes", "host_read"]) > 0.0, "{s}");
    assert!(num(&s["drive"], &["head_moves"]) > 0.0, "{s}");
    zns.stop();

    // A host-managed SMR disk, zoned too: the same reads cost it seeks (5.9 ms each).
    let mut smr = Daemon::start_with(small_args(&["--drive", "smr-hm"]));
    let s = smr.stats();
    assert_eq!(s["drive"]["preset"], "smr-hm", "{s}");
    assert!(num(&s["drive"], &["head_moves"]) > 0.0, "{s}");
    assert!(num(&s["drive"], &["busy_s"]) > 0.005, "{s}");
    smr.stop();
}
