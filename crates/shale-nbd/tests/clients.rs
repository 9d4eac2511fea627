//! End-to-end tests against real NBD clients (nbdinfo, qemu-io, qemu-img,
//! nbdcopy, nbdsh, fio) talking to an in-process server over MemBackend, on a
//! temp unix socket and an ephemeral TCP port. A missing client binary fails
//! its test with the packages to install.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{mem_spec, nbdsh_script, pattern, run, run_ok, Fixture, LIBNBD_BYTES_PY, MIB};
use shale_nbd::MemExportSpec;

const T: Duration = Duration::from_secs(60);

fn volumes() -> Vec<MemExportSpec> {
    vec![
        MemExportSpec {
            description: "first volume".into(),
            ..mem_spec("vol0", 64 * MIB)
        },
        mem_spec("vol1", 16 * MIB),
        // Not a multiple of 4 KiB: clients must see the exact size.
        mem_spec("odd", 10 * MIB + 512),
    ]
}

#[test]
fn nbdinfo_lists_every_volume_with_sizes_and_block_sizes() {
    require!("nbdinfo");
    let f = Fixture::start(volumes());
    for uri in [f.unix_uri(""), f.tcp_uri("")] {
        let out = run_ok(Command::new("nbdinfo").args(["--list", "--json", &uri]), T);
        let v: serde_json::Value = serde_json::from_str(&out).expect("nbdinfo json");
        let exports = v["exports"].as_array().expect("exports array");
        let names: Vec<&str> = exports
            .iter()
            .filter_map(|e| e["export-name"].as_str())
            .collect();
        assert_eq!(names, ["vol0", "vol1", "odd"], "{out}");
        let size = |n: &str| {
            exports
                .iter()
                .find(|e| e["export-name"] == n)
                .and_then(|e| e["export-size"].as_u64())
        };
        assert_eq!(size("vol0"), Some(64 * MIB));
        assert_eq!(size("vol1"), Some(16 * MIB));
        assert_eq!(size("odd"), Some(10 * MIB + 512));
        let vol0 = exports
            .iter()
            .find(|e| e["export-name"] == "vol0")
            .expect("vol0");
        assert_eq!(vol0["description"], "first volume");
        assert_eq!(vol0["block_size_minimum"], 1);
        assert_eq!(vol0["block_size_preferred"], 4096);
        assert_eq!(vol0["block_size_maximum"], 32 * 1024 * 1024);
        assert_eq!(vol0["can_flush"], true);
        assert_eq!(vol0["can_trim"], true);
        assert_eq!(vol0["can_zero"], true);
        assert_eq!(vol0["can_fua"], true);
        assert_eq!(vol0["can_multi_conn"], true);
        assert_eq!(vol0["can_cache"], true);
        assert_eq!(vol0["is_read_only"], false);
        assert_eq!(v["protocol"], "newstyle-fixed");
    }
    // Single export over TCP, with the base:allocation context.
    let out = run_ok(Command::new("nbdinfo").arg(f.tcp_uri("vol1")), T);
    assert!(out.contains("export-size: 16777216"), "{out}");
    assert!(out.contains("base:allocation"), "{out}");
}

/// libnbd in its default strict mode (STRICT_ALIGN enforces the advertised minimum
/// block size) doing 1-byte and unaligned reads, writes, write-zeroes and trims, every
/// byte checked against a model (`tests/scripts/libnbd_bytes.py`). A 4 KiB-multiple
/// export over unix, and one ending 512 bytes into a block over TCP.
#[test]
fn nbdsh_strict_byte_granular_io_matches_a_model() {
    require!("nbdsh");
    let f = Fixture::start(volumes());
    for (uri, export, size) in [
        (f.unix_uri("vol1"), "vol1", 16 * MIB),
        (f.tcp_uri("odd"), "odd", 10 * MIB + 512),
    ] {
        let model = f.path(&format!("{export}.model"));
        let out = run_ok(
            nbdsh_script(&uri, LIBNBD_BYTES_PY).env("LIBNBD_BYTES_MODEL", &model),
            T,
        );
        assert!(
            out.contains("libnbd-bytes: ok ops=") && out.contains(&format!("size={size}\n")),
            "{export}: {out}"
        );
        // The script's model and the backend's store, read directly, agree.
        let store = f
            .backend
            .read_direct(export, 0, u32::try_from(size).expect("size fits"))
            .expect("export");
        assert!(
            std::fs::read(&model).expect("model file") == store,
            "{export}: the store differs from the script's model"
        );
    }
}

fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(uri);
    let out = run(&mut c, T);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success()
            && !stdout.contains("Pattern verification failed")
            && !stdout.contains("failed:"),
        "qemu-io {cmds:?} on {uri}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn qemu_io_aligned_and_unaligned_patterns_discard_flush() {
    require!("qemu-io");
    let f = Fixture::start(volumes());
    for uri in [f.unix_uri("vol0"), f.tcp_uri("vol1")] {
        qemu_io(
            &uri,
            &[
                "write -P 0xab 512 1536",
                "read -P 0xab 512 1536",
                "write -P 0xcd 0 8192",
                "read -P 0xcd 0 8192",
                // Unaligned: qemu does its own read-modify-write around it.
                "write -P 0x11 1000 3333",
                "read -P 0x11 1000 3333",
                "read -P 0xcd 0 1000",
                "read -P 0xcd 4333 3859",
                // Large, multi-request.
                "write -P 0x5a 1M 4M",
                "read -P 0x5a 1M 4M",
                "flush",
                "discard 1M 1M",
                "read -P 0 1M 1M",
                "read -P 0x5a 2M 3M",
                "write -z 2M 64k",
                "read -P 0 2M 64k",
                "aio_write -P 0x77 8M 64k",
                "aio_write -P 0x78 9M 64k",
                "aio_flush",
                "read -P 0x77 8M 64k",
                "read -P 0x78 9M 64k",
            ],
        );
    }
    // Data written over one transport is visible through the other.
    qemu_io(
        &f.tcp_uri("vol0"),
        &["read -P 0x11 1024 512", "read -P 0x5a 3M 1M"],
    );
    // Writing past the end fails cleanly; the connection stays usable.
    let out = run(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write 16M 4096", &f.unix_uri("vol1")]),
        T,
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("failed") || text.contains("out of"), "{text}");
    let direct = f.backend.read_direct("vol0", 1000, 3333).expect("vol0");
    assert!(direct.iter().all(|&b| b == 0x11));
}

#[test]
fn qemu_img_convert_in_and_out_and_compare() {
    require!("qemu-img");
    let f = Fixture::start(volumes());
    let src = f.path("src.img");
    // Sparse image: data islands and holes.
    let mut img = vec![0u8; 16 * MIB as usize];
    for (i, at) in [0usize, 3 << 20, (7 << 20) + 4096, (15 << 20) + 8192]
        .iter()
        .enumerate()
    {
        img[*at..*at + 300_000].copy_from_slice(&pattern(i as u64 + 1, 300_000));
    }
    std::fs::write(&src, &img).expect("write src");
    for uri in [f.unix_uri("vol1"), f.tcp_uri("vol1")] {
        run_ok(
            Command::new("qemu-img")
                .args(["convert", "-n", "-f", "raw", "-O", "raw"])
                .arg(&src)
                .arg(&uri),
            T,
        );
        run_ok(
            Command::new("qemu-img")
                .args(["compare", "-f", "raw", "-F", "raw"])
                .arg(&src)
                .arg(&uri),
            T,
        );
        let back = f.path("back.img");
        let _ = std::fs::remove_file(&back);
        run_ok(
            Command::new("qemu-img")
                .args(["convert", "-f", "raw", "-O", "raw"])
                .arg(&uri)
                .arg(&back),
            T,
        );
        assert!(
            std::fs::read(&back).expect("read back") == img,
            "round trip through {uri}"
        );
    }
    // Compare must notice a difference.
    img[5 << 20] ^= 1;
    std::fs::write(&src, &img).expect("rewrite src");
    let out = run(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(f.unix_uri("vol1")),
        T,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "compare should report a difference"
    );
}

#[test]
fn nbdcopy_in_and_out() {
    require!("nbdcopy");
    let f = Fixture::start(volumes());
    let src = f.path("src.img");
    let mut img = pattern(42, (10 * MIB + 512) as usize);
    img[(2 * MIB) as usize..(5 * MIB) as usize].fill(0);
    std::fs::write(&src, &img).expect("write");
    run_ok(Command::new("nbdcopy").arg(&src).arg(f.unix_uri("odd")), T);
    let dst = f.path("dst.img");
    run_ok(Command::new("nbdcopy").arg(f.tcp_uri("odd")).arg(&dst), T);
    assert!(std::fs::read(&dst).expect("dst") == img);
    // NBD to NBD with several connections (CAN_MULTI_CONN is advertised).
    run_ok(
        Command::new("nbdcopy")
            .args(["--connections=4", "--requests=32"])
            .arg(f.unix_uri("odd"))
            .arg(f.tcp_uri("vol0")),
        T,
    );
    let copied = f
        .backend
        .read_direct("vol0", 0, (10 * MIB + 512) as u32)
        .expect("vol0");
    assert!(copied == img);
}

/// fio's nbd engine (libnbd) at queue depth 128, several jobs each on its own
/// connection and region, with crc32c verification and serialized overlaps.
fn fio(f: &Fixture, uri: &str, name: &str, extra: &[&str]) {
    let mut c = Command::new("fio");
    // fio drops verify state files in its working directory.
    c.current_dir(f.dir.path());
    c.args([
        "--verify_state_save=0",
        &format!("--name={name}"),
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--iodepth=128",
        "--numjobs=4",
        "--size=8M",
        "--offset_increment=8M",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--serialize_overlap=1",
        "--group_reporting",
        "--output-format=json",
    ]);
    c.args(extra);
    let out = run_ok(&mut c, Duration::from_secs(120));
    let json_start = out.find('{').expect("fio json output");
    let v: serde_json::Value = serde_json::from_str(&out[json_start..]).expect("fio json");
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{name}: {out}");
    let written = job["write"]["io_bytes"].as_u64().unwrap_or(0);
    let read = job["read"]["io_bytes"].as_u64().unwrap_or(0);
    assert!(
        written > 0 && read > 0,
        "{name}: wrote {written} read {read}"
    );
}

#[test]
fn fio_random_4k_64k_zipf_verified_at_qd128() {
    require!("fio");
    let f = Fixture::start(vec![mem_spec("fio", 32 * MIB)]);
    fio(
        &f,
        &f.unix_uri("fio"),
        "rand4k",
        &["--rw=randwrite", "--bs=4k"],
    );
    fio(
        &f,
        &f.tcp_uri("fio"),
        "rand64k",
        &["--rw=randwrite", "--bs=64k"],
    );
    fio(
        &f,
        &f.unix_uri("fio"),
        "zipf4k",
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--random_distribution=zipf:1.2",
            "--number_ios=1024",
        ],
    );
    fio(&f, &f.tcp_uri("fio"), "seq1m", &["--rw=write", "--bs=1M"]);
}
