//! End to end: the real `shale serve` binary, driven by real NBD clients (nbdinfo,
//! qemu-io, qemu-img, nbdcopy, fio) over its unix socket, with data verified.
//! A missing client binary fails with a message naming the package (the README's
//! test command installs them).

mod daemon_common;

use std::process::Command;

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
    assert_eq!(second["block_size_minimum"], 512);
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

#[test]
fn qemu_img_convert_in_and_out_and_compare() {
    require("qemu-img", "qemu-utils");
    let d = Daemon::start();
    d.admin(&["volume", "create", "img", "32MiB"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let raw = dir.path().join("src.raw");
    let mut data = pattern(32 * MIB as usize, 7);
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
    let data = pattern(16 * MIB as usize, 3);
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
    let data = pattern(48 * MIB as usize, 11);
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
