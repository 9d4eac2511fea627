//! End to end: the real `shale serve` binary, driven by real NBD clients (nbdinfo,
//! qemu-io, qemu-img, nbdcopy, nbdsh, fio) over its unix socket, with data verified.
//! A missing client binary fails with a message naming the package (the README's
//! test command installs them).

mod daemon_common;

use std::process::Command;
use std::time::{Duration, Instant};

use daemon_common::*;

#[test]
fn nbdinfo_sees_each_volume_with_sizes_and_block_sizes() {
    require("nbdinfo", "libnbd-bin");
    let d = Daemon::start();
    d.admin(&["volume", "create", "second", "64MiB"]);
    let out = stdout(Command::new("nbdinfo").args(["--list", "--json", &d.uri("")]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let exports = v["exports"].as_array().expect("exports");
    let names: Vec<&str> = exports
        .iter()
        .filter_map(|e| e["export-name"].as_str())
        .collect();
    assert_eq!(names, ["default", "second"], "{out}");
    let second = &exports[1];
    assert_eq!(second["export-size"], 64 * MIB);
    assert_eq!(second["block_size_minimum"], 1);
    assert_eq!(second["block_size_preferred"], 4096);
    assert_eq!(second["block_size_maximum"], 4 * MIB);
    assert_eq!(second["can_multi_conn"], true);
    assert_eq!(second["can_trim"], true);
    let list = d.admin(&["volume", "list", "--json"]);
    let vols: serde_json::Value = serde_json::from_str(&list).expect("json");
    assert_eq!(vols.as_array().map(Vec::len), Some(2), "{list}");
    assert_eq!(exports[0]["export-size"], vols[0]["size_bytes"]);
}

#[test]
fn qemu_io_patterns_aligned_and_unaligned_discard_and_flush() {
    require("qemu-io", "qemu-utils");
    let d = Daemon::start();
    let uri = d.uri("default");
    let out = stdout(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0xab 0 1M",
        "-c",
        "write -P 0xcd 512 1536",
        "-c",
        "write -P 0x5a 4095 3",
        "-c",
        "flush",
        "-c",
        "read -P 0xab 0 512",
        "-c",
        "read -P 0xcd 512 1536",
        "-c",
        "read -P 0xab 2048 2047",
        "-c",
        "read -P 0x5a 4095 3",
        "-c",
        "read -P 0xab 4098 1044478",
        "-c",
        "discard 64k 128k",
        "-c",
        "read -P 0 64k 128k",
        "-c",
        "read -P 0xab 192k 64k",
        "-c",
        "write -z 300k 8k",
        "-c",
        "read -P 0 300k 8k",
        "-c",
        "write -P 0x77 -f 8M 64k",
        "-c",
        "read -P 0x77 8M 64k",
        "-c",
        "flush",
        &uri,
    ]));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.contains("failed"), "{out}");
}

/// libnbd in its default strict mode (STRICT_ALIGN enforces the advertised minimum
/// block size) doing 1-byte and unaligned reads, writes, write-zeroes and trims through
/// the engine's read-modify-write, every byte checked against a model
/// (`shale-nbd/tests/scripts/libnbd_bytes.py`); the model survives a restart.
#[test]
fn nbdsh_strict_byte_granular_io_matches_a_model_across_a_restart() {
    require("nbdsh", "python3-libnbd");
    require("nbdcopy", "libnbd-bin");
    let mut d = Daemon::start();
    d.admin(&["volume", "create", "bytes", "16MiB"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let model_path = dir.path().join("model");
    let out = stdout(
        nbdsh_script(&d.uri("bytes"), LIBNBD_BYTES_PY).env("LIBNBD_BYTES_MODEL", &model_path),
    );
    assert!(
        out.contains("libnbd-bytes: ok ops=") && out.contains(&format!("size={}\n", 16 * MIB)),
        "{out}"
    );
    let model = std::fs::read(&model_path).expect("model file");
    d.stop();
    d.spawn();
    let back = read_export(&d.uri("bytes"), &dir.path().join("back"));
    assert_eq!(
        first_difference(&back, &model),
        None,
        "the volume differs from the model after a restart"
    );
    assert_eq!(d.stats()["work"]["crc_errors"], 0);
    d.stop();
}

#[test]
fn qemu_img_convert_in_and_out_and_compare() {
    require("qemu-img", "qemu-utils");
    let d = Daemon::start();
    d.admin(&["volume", "create", "img", "32MiB"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let raw = dir.path().join("src.raw");
    let mut data = pattern(7, 32 * MIB as usize);
    // Holes and zero runs, as a real image has.
    data[MIB as usize..3 * MIB as usize].fill(0);
    write_file(&raw, &data);
    let qcow = dir.path().join("src.qcow2");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow));
    let uri = d.uri("img");
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "qcow2", "-O", "raw"])
        .arg(&qcow)
        .arg(&uri));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "qcow2", "-F", "raw"])
        .arg(&qcow)
        .arg(&uri));
    let back = dir.path().join("back.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&uri)
        .arg(&back));
    assert!(
        std::fs::read(&back).expect("read back") == data,
        "image differs after the round trip"
    );
    let info = stdout(Command::new("qemu-img").args(["info", "-f", "raw", &uri]));
    assert!(info.contains("32 MiB"), "{info}");
}

#[test]
fn nbdcopy_in_and_out() {
    require("nbdcopy", "libnbd-bin");
    let d = Daemon::start();
    d.admin(&["volume", "create", "copy", "16MiB"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let data = pattern(3, 16 * MIB as usize);
    write_file(&src, &data);
    let uri = d.uri("copy");
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    let dst = dir.path().join("dst");
    run(Command::new("nbdcopy").arg(&uri).arg(&dst));
    assert!(
        std::fs::read(&dst).expect("read") == data,
        "nbdcopy round trip differs"
    );
}

fn fio_verify(d: &Daemon, name: &str, extra: &[&str]) {
    let uri = d.uri("default");
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name",
        name,
        "--ioengine=nbd",
        "--uri",
        &uri,
        "--iodepth=32",
        "--numjobs=4",
        "--size=48m",
        "--offset_increment=48m",
        "--verify=crc32c",
        "--serialize_overlap=1",
        "--do_verify=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]);
    cmd.args(extra);
    let out = stdout(&mut cmd);
    assert!(out.contains("err= 0"), "{out}");
    assert!(!out.contains("verify:"), "{out}");
}

#[test]
fn fio_verify_random_4k_64k_and_zipf_with_several_jobs() {
    require("fio", "fio");
    let d = Daemon::start();
    fio_verify(&d, "rand4k", &["--rw=randwrite", "--bs=4k"]);
    fio_verify(&d, "rand64k", &["--rw=randwrite", "--bs=64k"]);
    fio_verify(
        &d,
        "zipf",
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--random_distribution=zipf:1.2",
            "--number_ios=8192",
        ],
    );
    let stats = d.admin(&["stats", "--json"]);
    let s: serde_json::Value = serde_json::from_str(&stats).expect("json");
    assert_eq!(s["work"]["crc_errors"], 0, "{stats}");
}

#[test]
fn sigterm_restart_keeps_every_byte() {
    require("nbdcopy", "libnbd-bin");
    let mut d = Daemon::start();
    d.admin(&["volume", "create", "keep", "48MiB"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let data = pattern(11, 48 * MIB as usize);
    write_file(&src, &data);
    let uri = d.uri("keep");
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    // Overwrite a few ranges so the cache holds newer versions than the zones.
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x42 5M 3M", &uri]));
    let mut expect = data;
    expect[5 * MIB as usize..8 * MIB as usize].fill(0x42);
    d.stop();
    d.spawn();
    let dst = dir.path().join("dst");
    run(Command::new("nbdcopy").arg(d.uri("keep")).arg(&dst));
    assert!(
        std::fs::read(&dst).expect("read") == expect,
        "data differs after restart"
    );
    let list = d.admin(&["volume", "list", "--json"]);
    assert!(list.contains("\"keep\""), "{list}");
    d.stop();
}

/// Merges `(offset, length, mapped)` runs of equal state, checking they tile
/// `[0, size)` in order.
fn merged_runs(runs: &[(u64, u64, bool)], size: u64, tool: &str) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    let mut next = 0;
    for &(off, len, mapped) in runs {
        assert_eq!(
            off, next,
            "{tool}: extents not contiguous at {off}: {runs:?}"
        );
        assert!(len > 0, "{tool}: empty extent at {off}");
        next = off + len;
        match out.last_mut() {
            Some(last) if last.2 == mapped => last.1 += len,
            _ => out.push((off, len, mapped)),
        }
    }
    assert_eq!(next, size, "{tool}: extents end at {next}, not {size}");
    out
}

#[test]
fn block_status_reports_written_trimmed_zeroed_and_never_written_ranges() {
    require("nbdinfo", "libnbd-bin");
    require("qemu-img", "qemu-utils");
    require("qemu-io", "qemu-utils");
    let d = Daemon::start();
    d.admin(&["volume", "create", "map", "16MiB"]);
    let uri = d.uri("map");
    let k = 1024u64;
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x11 0 1M",
        "-c",
        "write -P 0x22 4M 2M",
        "-c",
        "discard 4608k 512k",
        "-c",
        "write -P 0x33 8M 2M",
        "-c",
        "write -z 9M 1M",
        // One unaligned sector: its whole 4 KiB block becomes mapped.
        "-c",
        "write -P 0x44 12583424 512",
        "-c",
        "flush",
        &uri,
    ]));
    let m = MIB;
    let want = vec![
        (0, m, true),
        (m, 3 * m, false),
        (4 * m, 512 * k, true),
        (4608 * k, 512 * k, false),
        (5 * m, m, true),
        (6 * m, 2 * m, false),
        (8 * m, m, true),
        (9 * m, 3 * m, false),
        (12 * m, 4 * k, true),
        (12 * m + 4 * k, 4 * m - 4 * k, false),
    ];

    // libnbd asks for the whole export at once (no REQ_ONE).
    let out = stdout(Command::new("nbdinfo").args(["--map", "--json", &uri]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("nbdinfo json");
    let runs: Vec<(u64, u64, bool)> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|e| {
            let kind = e["type"].as_u64().expect("type");
            assert!(kind == 0 || kind == 3, "unexpected state {kind}: {out}");
            (
                e["offset"].as_u64().expect("offset"),
                e["length"].as_u64().expect("length"),
                kind == 0,
            )
        })
        .collect();
    assert_eq!(merged_runs(&runs, 16 * m, "nbdinfo"), want, "{out}");

    // qemu asks one extent at a time (REQ_ONE).
    let out = stdout(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &uri]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("qemu-img json");
    let runs: Vec<(u64, u64, bool)> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|e| {
            let data = e["data"].as_bool().expect("data");
            let zero = e["zero"].as_bool().expect("zero");
            assert!(data != zero, "data and zero flags agree: {out}");
            (
                e["start"].as_u64().expect("start"),
                e["length"].as_u64().expect("length"),
                data,
            )
        })
        .collect();
    assert_eq!(merged_runs(&runs, 16 * m, "qemu-img map"), want, "{out}");

    // Holes read as zeros and data reads back.
    let out = stdout(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0 1M 3M",
        "-c",
        "read -P 0 4608k 512k",
        "-c",
        "read -P 0 9M 1M",
        "-c",
        "read -P 0x22 5M 1M",
        "-c",
        "read -P 0x44 12583424 512",
        "-c",
        "read -P 0 12M 512",
        &uri,
    ]));
    assert!(!out.contains("failed"), "{out}");
}

#[test]
fn format_logs_its_steps_and_refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().expect("tempdir");
    let format = |extra: &[&str]| {
        let mut cmd = shale();
        cmd.args(["format", "--data-dir"])
            .arg(dir.path())
            .args(["--cache-size", "128MiB", "--capacity-size", "1GiB"])
            .args(["--chunk-size", "4MiB", "--zone-size", "16MiB"])
            .args([
                "--volume",
                "a:64MiB,iops-max=500",
                "--volume",
                "b,mibps-max=10",
            ])
            .arg("--json")
            .args(extra);
        output(&mut cmd)
    };
    let first = format(&[]);
    assert!(first.status.success(), "{first:?}");
    let v: serde_json::Value = serde_json::from_slice(&first.stdout).expect("json");
    assert_eq!(v["volumes"][0]["name"], "a");
    assert_eq!(v["volumes"][0]["size_bytes"], 64 * MIB);
    assert_eq!(v["volumes"][1]["name"], "b");
    assert_eq!(v["volumes"][0]["iops_max"], 500, "{v}");
    assert!(v["volumes"][0]["mibps_max"].is_null(), "{v}");
    assert_eq!(v["volumes"][1]["mibps_max"], 10, "{v}");
    // Off a terminal, one log line per step instead of a bar.
    let log = String::from_utf8_lossy(&first.stderr);
    for step in [
        "create sparse files",
        "capacity: zone emulation, discard",
        "cache: superblock, journal, checkpoint",
        "volumes",
        "checkpoint, clean flag",
    ] {
        assert!(log.contains(&format!("step=\"{step}\"")), "{step}: {log}");
    }
    let again = format(&[]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("--force"),
        "{again:?}"
    );
    // An option no volume has is refused before anything is touched.
    let mut cmd = shale();
    cmd.args(["format", "--force", "--data-dir"])
        .arg(dir.path())
        .args(["--volume", "a,speed=max"]);
    let bad = output(&mut cmd);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("known: iops-max, mibps-max, cache-share, gc, map-unit"),
        "{bad:?}"
    );
    let forced = format(&["--force"]);
    assert!(forced.status.success(), "{forced:?}");
    let log = String::from_utf8_lossy(&forced.stderr);
    assert!(!log.contains("create sparse files"), "{log}");
}

/// A format that fails (devices too small for a pool) takes away the files it
/// created, so it can be run again with other sizes, without --force.
#[test]
fn a_failed_format_leaves_no_files_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let format = |capacity: &str| {
        let mut cmd = shale();
        cmd.args(["format", "--data-dir"])
            .arg(dir.path())
            .args(["--cache-size", "128MiB", "--capacity-size", capacity])
            .args(["--chunk-size", "4MiB", "--zone-size", "16MiB"]);
        output(&mut cmd)
    };
    let small = format("64MiB");
    assert!(!small.status.success(), "{small:?}");
    let err = String::from_utf8_lossy(&small.stderr);
    assert!(err.contains("too small"), "{small:?}");
    // Names the flag to change, and says its cause once.
    assert!(err.contains("--capacity-size (now 64MiB)"), "{err}");
    assert_eq!(err.matches("too small").count(), 1, "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "img"))
        .collect();
    assert!(left.is_empty(), "files left: {left:?}");
    let ok = format("1GiB");
    assert!(ok.status.success(), "{ok:?}");
}

#[test]
fn a_second_daemon_or_format_on_devices_in_use_is_refused() {
    require("qemu-io", "qemu-utils");
    let mut d = Daemon::start();
    let uri = d.uri("default");
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x3c 0 64k", &uri]));
    // Other sockets, same devices: it must not open (and "recover") them.
    let second = output(
        shale()
            .args(["serve", "--data-dir"])
            .arg(d.data_dir())
            .args(["--tcp", "", "--unix-socket"])
            .arg(d.dir.path().join("other.sock"))
            .args(["--admin-socket"])
            .arg(d.dir.path().join("other-admin.sock")),
    );
    assert!(!second.status.success(), "{second:?}");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("in use by another shale process"), "{err}");
    let format = output(
        shale()
            .args(["format", "--force", "--data-dir"])
            .arg(d.data_dir()),
    );
    assert!(!format.status.success(), "{format:?}");
    assert!(
        String::from_utf8_lossy(&format.stderr).contains("in use"),
        "{format:?}"
    );
    // The first daemon is undisturbed and still stops cleanly.
    let out = stdout(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x3c 0 64k", &uri]));
    assert!(!out.contains("failed"), "{out}");
    d.stop();
    assert!(!d.log().contains("dirty recovery"), "{}", d.log());
}

/// `[engine]` in the config file reaches the engine: with compaction asked to keep
/// 90% of the cache free, 64 MiB written to a 256 MiB cache is moved to the
/// capacity device; with the default 20% it stays in the cache, but for the
/// sequential run past its first MiB, which goes straight to zones (direct writes,
/// on by default); with them off, all of it stays.
#[test]
fn engine_section_of_the_config_file_sets_the_policies() {
    require("qemu-io", "qemu-utils");
    let write_64m = |d: &Daemon| {
        stdout(Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -P 0x3c 0 64M",
            "-c",
            "flush",
            &d.uri("default"),
        ]));
    };
    // Bytes compaction wrote to zones (with direct writes' blocks, whose groups it
    // shares), chunks it emptied, and bytes of writes that went straight to zones.
    let moved = |d: &Daemon| {
        let s = d.stats();
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        (
            n(&s["bytes"]["capacity_compaction_written"]),
            n(&s["work"]["compaction_victims"]),
            n(&s["bytes"]["user_direct_written"]),
        )
    };
    let mut plain = Daemon::start();
    // Zones emulated on a file: GC's `auto` policy resets them in the order written.
    assert!(plain.log().contains("gc_policy=Fifo"), "{}", plain.log());
    write_64m(&plain);
    std::thread::sleep(Duration::from_millis(500));
    let (_, victims, direct) = moved(&plain);
    assert_eq!(victims, 0, "compaction ran at the default threshold");
    assert!(direct >= 32 << 20, "direct writes: {direct} bytes");
    plain.stop();

    let off = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(off.path(), "[engine]\ndirect_write_min = \"off\"\n").expect("write config");
    let mut args = vec!["--config".to_string(), off.path().display().to_string()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    let mut d = Daemon::start_with(args);
    write_64m(&d);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(moved(&d), (0, 0, 0), "direct writes off");
    d.stop();

    let conf = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(
        conf.path(),
        "[engine]\ngc_policy = \"cost-benefit\"\ncompaction_free_chunks_pct = 90\n\
         direct_write_min = \"off\"\n",
    )
    .expect("write config");
    let mut args = vec!["--config".to_string(), conf.path().display().to_string()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    let mut eager = Daemon::start_with(args);
    assert!(
        eager.log().contains("gc_policy=CostBenefit")
            && eager.log().contains("compaction_free_chunks_pct=90"),
        "{}",
        eager.log()
    );
    write_64m(&eager);
    let deadline = Instant::now() + Duration::from_secs(20);
    while moved(&eager).0 < 32 << 20 {
        assert!(
            Instant::now() < deadline,
            "compaction did not run at 90%: {}",
            eager.stats()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eager.stop();

    // A bad value is refused at start, by name.
    std::fs::write(conf.path(), "[engine]\ngc_policy = \"lru\"\n").expect("write config");
    let err = serve_refused(&["--config", &conf.path().display().to_string()]);
    assert!(err.contains("gc_policy") || err.contains("lru"), "{err}");
}
