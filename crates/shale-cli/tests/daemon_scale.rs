//! A pool past the 32-bit PBA space: a 64 TiB capacity file (sparse, on tmpfs: ext4
//! caps files at 16 TiB) formatted by `shale format`, served by `shale serve`, and
//! fio's checksummed random writes spread over the whole 52 TiB volume, verified
//! after a kill -9 and its recovery, and after a clean restart.

mod daemon_common;

use std::path::Path;
use std::process::Command;

use daemon_common::*;

const TIB: u64 = 1 << 40;

/// fio over half of the volume (`half` 0 or 1): 64 KiB random writes, verified or
/// only written, 256 MiB in all, so the blocks land all over the PBA space.
fn fio_span(uri: &str, volume: u64, half: u64, verify_only: bool) {
    let mut cmd = Command::new("fio");
    let size = volume / 2 / (1 << 20) * (1 << 20);
    cmd.args([
        "--name=span",
        "--ioengine=nbd",
        "--uri",
        uri,
        "--rw=randwrite",
        "--bs=64k",
        &format!("--offset={}", half * size),
        &format!("--size={size}"),
        "--io_size=256m",
        "--iodepth=16",
        &format!("--randseed={}", 7 + half),
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

fn shm_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "this test needs /dev/shm (tmpfs) for a 64 TiB sparse file"
    );
    tempfile::tempdir_in(shm).expect("tempdir in /dev/shm")
}

#[test]
fn a_64_tib_pool_formats_serves_and_recovers() {
    require("fio", "fio");
    let dir = shm_dir();
    let cache = dir.path().join("cache.img");
    let capacity = dir.path().join("capacity.img");
    let devices = [
        "--cache".to_string(),
        cache.display().to_string(),
        "--capacity".to_string(),
        capacity.display().to_string(),
    ];
    let mut format = shale();
    format.args(["format", "--json", "--data-dir"]);
    format.arg(dir.path().join("data"));
    format.args(&devices).args([
        "--cache-size",
        "160GiB",
        "--capacity-size",
        "64TiB",
        "--zone-size",
        "1GiB",
    ]);
    let out = stdout(&mut format);
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("format json");
    let volume = report["volumes"][0]["size_bytes"].as_u64().expect("volume");
    assert!(volume > 32 * TIB, "{report}");
    // Sparse: the whole format wrote a few hundred MiB at most.
    let used: u64 = [&cache, &capacity]
        .iter()
        .map(|p| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).expect("metadata").blocks() * 512
        })
        .sum();
    assert!(used < 1 << 30, "format wrote {used} bytes");

    let mut d = Daemon::start_with(devices.to_vec());
    let info = d.stats();
    assert_eq!(info["l2p"]["entry_bytes"].as_u64(), Some(5), "{info}");
    fio_span(&d.uri("default"), volume, 0, false);
    d.kill9();
    d.spawn();
    assert!(d.last_log().contains("dirty recovery"), "{}", d.last_log());
    fio_span(&d.uri("default"), volume, 0, true);
    fio_span(&d.uri("default"), volume, 1, false);
    d.stop();
    d.spawn();
    for half in [0, 1] {
        fio_span(&d.uri("default"), volume, half, true);
    }
    d.stop();
}
