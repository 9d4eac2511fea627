//! `shale serve --vhost-user-blk VOLUME=SOCKET`: a virtual machine's disk. A
//! vhost-user frontend playing QEMU and the guest's virtio-blk driver (the one
//! shale-vhost's own tests use) writes, flushes, discards and reads through the
//! daemon; NBD reads the same volume; the data survives a kill -9 and the guest
//! reconnects; a deleted volume's device fails instead of reaching the next volume.

mod daemon_common;

#[allow(clippy::unwrap_used)]
#[path = "../../shale-vhost/tests/common/mod.rs"]
mod guest;

use std::path::{Path, PathBuf};

use daemon_common::*;
use guest::{Guest, Setup, S_IOERR, S_OK, T_DISCARD, T_FLUSH};

fn socket(d: &Daemon) -> PathBuf {
    d.data_dir().join("vm.sock")
}

fn start() -> Daemon {
    let mut args: Vec<String> = SMALL_DEVICES.iter().map(|s| s.to_string()).collect();
    args.extend([
        "--vhost-user-blk".to_string(),
        "default={data_dir}/vm.sock".to_string(),
        "--vhost-queues".to_string(),
        "2".to_string(),
    ]);
    Daemon::start_with(args)
}

/// `len` bytes at `offset` of `export`, read over NBD.
fn nbd_read(d: &Daemon, export: &str, offset: u64, len: usize) -> Vec<u8> {
    let out = d.dir.path().join("nbd-read.bin");
    let script = d.dir.path().join("read.py");
    write_file(
        &script,
        format!(
            "open({:?}, 'wb').write(h.pread({len}, {offset}))\n",
            out.display().to_string()
        )
        .as_bytes(),
    );
    run(&mut nbdsh_script(
        &d.uri(export),
        &script.display().to_string(),
    ));
    std::fs::read(&out).expect("nbdsh output")
}

fn connect(path: &Path) -> Guest {
    Guest::connect(
        path,
        Setup {
            queues: 2,
            ..Setup::default()
        },
    )
}

#[test]
fn a_guest_writes_reads_and_survives_a_kill() {
    require("nbdsh", "libnbd-bin");
    let mut d = start();
    let mut g = connect(&socket(&d));
    let big = guest::pattern(1, 1 << 20);
    let small = guest::pattern(2, 4096);
    // 1 MiB in 16 segments at 0 on queue 0; 4 KiB at 8 MiB on queue 1.
    assert_eq!(g.write(0, 0, &big, 16), S_OK);
    assert_eq!(g.write(1, (8 << 20) / 512, &small, 1), S_OK);
    assert_eq!(g.simple(0, T_FLUSH, None), S_OK);
    // Segments of at most 128 KiB (the device's size_max).
    let (st, data) = g.read(1, 0, 1 << 20, 8);
    assert_eq!(st, S_OK);
    assert!(data == big, "1 MiB read back through the guest");
    // The same volume over NBD.
    assert!(
        nbd_read(&d, "default", 0, 1 << 20) == big,
        "NBD reads the guest's write"
    );
    assert!(nbd_read(&d, "default", 8 << 20, 4096) == small);
    // A discard reaches the engine and the range reads as zeros.
    let trims = d.stats()["bytes"]["user_trimmed"].as_u64().unwrap_or(0);
    assert_eq!(g.simple(0, T_DISCARD, Some((0, 256, 0))), S_OK);
    let (st, data) = g.read(0, 0, 128 << 10, 1);
    assert_eq!(st, S_OK);
    assert!(data.iter().all(|&b| b == 0), "discarded range reads zeros");
    let (st, data) = g.read(0, 256, 4096, 1);
    assert!(
        st == S_OK && data == big[128 << 10..(128 << 10) + 4096],
        "past the discard"
    );
    let after = d.stats()["bytes"]["user_trimmed"].as_u64().unwrap_or(0);
    assert!(
        after > trims,
        "the discard reached the engine: {trims} -> {after}"
    );
    assert_eq!(g.simple(0, T_FLUSH, None), S_OK);
    // kill -9 with the guest attached: the flushed data is there after recovery and
    // a new connection (QEMU's reconnect) reads it.
    drop(g);
    d.kill9();
    d.spawn();
    let mut g = connect(&socket(&d));
    let (st, data) = g.read(0, (8 << 20) / 512, 4096, 1);
    assert!(
        st == S_OK && data == small,
        "flushed data after kill -9 ({st})"
    );
    let (st, data) = g.read(1, 256, 64 << 10, 2);
    assert!(
        st == S_OK && data == big[128 << 10..192 << 10],
        "after kill -9 ({st})"
    );
    d.stop();
    assert!(
        !socket(&d).exists(),
        "the socket is removed on a clean stop"
    );
}

#[test]
fn a_deleted_volume_fails_its_guest_and_never_reaches_the_next_one() {
    require("nbdsh", "libnbd-bin");
    let mut d = start();
    let mut g = connect(&socket(&d));
    assert_eq!(g.write(0, 0, &guest::pattern(3, 4096), 1), S_OK);
    d.admin(&["volume", "delete", "default", "--force"]);
    d.admin(&["volume", "create", "default", "64MiB"]);
    // The new volume is written over NBD; the old device must not see it.
    let secret = guest::pattern(4, 4096);
    let script = d.dir.path().join("write.py");
    let src = d.dir.path().join("secret.bin");
    write_file(&src, &secret);
    write_file(
        &script,
        format!(
            "h.pwrite(open({:?}, 'rb').read(), 0)\nh.flush()\n",
            src.display().to_string()
        )
        .as_bytes(),
    );
    run(&mut nbdsh_script(
        &d.uri("default"),
        &script.display().to_string(),
    ));
    let (st, data) = g.read(0, 0, 4096, 1);
    assert_eq!(st, S_IOERR, "a read of the deleted volume fails");
    assert_ne!(data, secret);
    assert_eq!(g.write(0, 0, &guest::pattern(5, 4096), 1), S_IOERR);
    assert!(nbd_read(&d, "default", 0, 4096) == secret);
    d.stop();
}

#[test]
fn an_unknown_volume_or_a_bad_entry_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data").display().to_string();
    let mut args: Vec<String> = vec!["--data-dir".into(), data.clone()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    args.extend([
        "--vhost-user-blk".to_string(),
        "nosuch={data_dir}/x.sock".to_string(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = serve_refused(&refs);
    assert!(err.contains("no volume named \"nosuch\""), "{err}");
    let mut args: Vec<String> = vec!["--data-dir".into(), data];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    args.extend(["--vhost-user-blk".to_string(), "justaname".to_string()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = serve_refused(&refs);
    assert!(err.contains("VOLUME=SOCKET"), "{err}");
}
