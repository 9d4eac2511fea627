//! Volumes mapped in units through the real daemon: `shale volume create --map-unit`,
//! the unit in `volume list` (text and JSON) and as the export's preferred block size
//! (nbdinfo), writes smaller than a unit (qemu-io) read back before and after a
//! restart, and sizes or units that are not whole refused.

mod daemon_common;

use std::process::Command;

use daemon_common::*;

fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(uri);
    stdout(&mut c)
}

#[test]
fn a_volume_mapped_in_64k_units_keeps_partial_writes_across_a_restart() {
    require("qemu-io", "qemu-utils");
    require("nbdinfo", "libnbd-bin");
    let mut d = Daemon::start();
    let made = d.admin(&["volume", "create", "media", "64MiB", "--map-unit", "64KiB"]);
    assert!(made.contains("mapped in units of 64"), "{made}");

    let list: serde_json::Value =
        serde_json::from_str(&d.admin(&["volume", "list", "--json"])).expect("json");
    let media = list
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "media"))
        .unwrap_or_else(|| panic!("no media in {list}"));
    assert_eq!(media["map_unit_bytes"], 65536, "{list}");
    let text = d.admin(&["volume", "list"]);
    assert!(text.contains("MAP-UNIT"), "{text}");

    let info = stdout(Command::new("nbdinfo").args(["--json", &d.uri("media")]));
    let v: serde_json::Value = serde_json::from_str(&info).expect("json");
    assert_eq!(v["exports"][0]["block_size_preferred"], 65536, "{info}");

    // A whole unit, a block inside another, bytes across two units, a discard of a
    // whole unit and of part of one (which keeps its data: trims are advisory).
    let uri = d.uri("media");
    let out = qemu_io(
        &uri,
        &[
            "write -P 0x11 0 64k",
            "write -P 0x22 128k 64k",
            "write -P 0x33 136k 4k",
            "write -P 0x44 65000 1000",
            "write -P 0x55 1M 128k",
            "discard 1M 64k",
            "discard 128k 4k",
            "flush",
        ],
    );
    assert!(!out.contains("failed"), "{out}");
    let checks = [
        "read -P 0x11 0 65000",
        "read -P 0x22 128k 8k",
        "read -P 0x33 136k 4k",
        "read -P 0x22 140k 52k",
        "read -P 0x44 65000 1000",
        "read -P 0x00 66000 1000",
        "read -P 0x00 1M 64k",
        "read -P 0x55 1088k 64k",
    ];
    let out = qemu_io(&uri, &checks);
    assert!(!out.contains("Pattern verification failed"), "{out}");

    d.stop();
    d.spawn();
    let out = qemu_io(&uri, &checks);
    assert!(
        !out.contains("Pattern verification failed"),
        "after restart: {out}"
    );

    // Sizes that are not whole units, and units that are not one.
    for args in [
        &["volume", "create", "odd", "100KiB", "--map-unit", "64KiB"][..],
        &["volume", "create", "odd", "1MiB", "--map-unit", "128KiB"],
        &["volume", "create", "odd", "1MiB", "--map-unit", "12KiB"],
        &["volume", "resize", "media", "65MiB-4KiB"],
    ] {
        let out = output(shale().args(args).arg("--data-dir").arg(d.data_dir()));
        assert!(!out.status.success(), "{args:?} succeeded");
    }
    d.stop();
}

#[test]
fn a_dual_mapped_volume_takes_small_writes_without_read_modify_write() {
    require("qemu-io", "qemu-utils");
    require("nbdinfo", "libnbd-bin");
    let mut d = Daemon::start();
    let made = d.admin(&["volume", "create", "objects", "64MiB", "--dual-map"]);
    assert!(made.contains("(dual)"), "{made}");
    let list: serde_json::Value =
        serde_json::from_str(&d.admin(&["volume", "list", "--json"])).expect("json");
    let v = list
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == "objects"))
        .unwrap_or_else(|| panic!("no objects in {list}"));
    assert_eq!(
        (v["map_unit_bytes"].clone(), v["dual_map"].clone()),
        (65536.into(), true.into()),
        "{list}"
    );
    assert!(d.admin(&["volume", "list"]).contains("64KiB+4KiB"));
    // Small writes are what it takes as they come: a 4 KiB preferred size.
    let info = stdout(Command::new("nbdinfo").args(["--json", &d.uri("objects")]));
    let j: serde_json::Value = serde_json::from_str(&info).expect("json");
    assert_eq!(j["exports"][0]["block_size_preferred"], 4096, "{info}");

    // Whole units, blocks over them, bytes across two units, and a unit over blocks.
    let uri = d.uri("objects");
    let out = qemu_io(
        &uri,
        &[
            "write -P 0x11 0 1M",
            "write -P 0x22 68k 4k",
            "write -P 0x33 130000 1000",
            "write -P 0x44 256k 64k",
            "write -P 0x55 260k 4k",
            "flush",
        ],
    );
    assert!(!out.contains("failed"), "{out}");
    let checks = [
        "read -P 0x11 0 68k",
        "read -P 0x22 68k 4k",
        "read -P 0x11 72k 56272",
        "read -P 0x33 130000 1000",
        "read -P 0x11 131000 131144",
        "read -P 0x44 256k 4k",
        "read -P 0x55 260k 4k",
        "read -P 0x44 264k 56k",
        "read -P 0x11 320k 704k",
    ];
    let out = qemu_io(&uri, &checks);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    d.stop();
    d.spawn();
    let out = qemu_io(&uri, &checks);
    assert!(
        !out.contains("Pattern verification failed"),
        "after restart: {out}"
    );
    // A dual volume needs a unit larger than a block.
    let out = output(
        shale()
            .args([
                "volume",
                "create",
                "x",
                "1MiB",
                "--dual-map",
                "--map-unit",
                "4KiB",
            ])
            .arg("--data-dir")
            .arg(d.data_dir()),
    );
    assert!(!out.status.success());
    d.stop();
}

/// `--cold`: a cold tier behind the capacity device, made by the first start, listed
/// among the devices; GC moves what it relocates there, and data written through
/// NBD reads back before and after a restart. Started without its cold device, or
/// with another pool's, the pool is refused; so is a second cold device.
#[test]
fn a_cold_tier_behind_the_capacity_device_keeps_its_data() {
    require("qemu-io", "qemu-utils");
    let mut args: Vec<String> = SMALL_DEVICES.iter().map(|s| s.to_string()).collect();
    // A small capacity device: the 512 MiB volume's writes pass through it into the
    // cold tier.
    let cap = args
        .iter()
        .position(|a| a == "--capacity-size")
        .expect("flag")
        + 1;
    args[cap] = "512MiB".into();
    for a in [
        "--cold",
        "{data_dir}/cold.img",
        "--cold-size",
        "1GiB",
        "--cold-drive",
        "hdd",
    ] {
        args.push(a.into());
    }
    let mut d = Daemon::start_with(args);
    let devices = d.admin(&["device", "list", "--json"]);
    assert!(devices.contains("\"cold\""), "{devices}");
    let s = d.stats();
    assert!(s["space"]["cold_zones"].as_u64().unwrap_or(0) > 0, "{s}");

    let uri = d.uri("default");
    let mut writes = Vec::new();
    for pass in 0..3u8 {
        for mib in (0..512u32).step_by(64) {
            writes.push(format!("write -P {} {mib}M 64M", 0x10 + pass));
        }
    }
    writes.push("write -P 0x77 100M 4k".into());
    writes.push("flush".into());
    let cmds: Vec<&str> = writes.iter().map(String::as_str).collect();
    let out = qemu_io(&uri, &cmds);
    assert!(!out.contains("failed"), "{out}");
    let s = d.stats();
    let cold = s["space"]["cold_zones"].as_u64().unwrap_or(0);
    let free_cold = s["space"]["free_cold_zones"].as_u64().unwrap_or(0);
    assert!(free_cold < cold, "GC moved blocks into the cold tier: {s}");
    let checks = [
        "read -P 0x12 0 100M",
        "read -P 0x77 100M 4k",
        "read -P 0x12 400M 100M",
    ];
    let out = qemu_io(&uri, &checks);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    d.stop();
    d.spawn();
    let out = qemu_io(&uri, &checks);
    assert!(
        !out.contains("Pattern verification failed"),
        "after restart: {out}"
    );
    d.stop();
    a_tiered_pool_is_refused_without_its_cold_device(&d);
}

/// A stopped tiered pool (`d`, 512 MiB capacity, 1 GiB `hdd` cold file) started
/// without its cold device, or with another pool's, is refused; so is a format with
/// two cold devices.
fn a_tiered_pool_is_refused_without_its_cold_device(d: &Daemon) {
    let without: Vec<&str> = SMALL_DEVICES.to_vec();
    // `shale serve` of the pool with these cold flags: its error.
    let serve_refused = |cold: &[&std::ffi::OsStr]| {
        let out = output(
            std::process::Command::new("timeout")
                .arg("60")
                .arg(env!("CARGO_BIN_EXE_shale"))
                .args(["serve", "--handoff-dir", "off", "--capacity-size", "512MiB"])
                .arg("--data-dir")
                .arg(d.data_dir())
                .args(&without[..2])
                .args(&without[4..])
                .args(cold),
        );
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Started without its cold device, the pool is refused, the tier named.
    let err = serve_refused(&[]);
    assert!(err.contains("cold tier"), "{err}");
    // Started with another pool's cold device (same size), it is refused by its label.
    let other = tempfile::tempdir().expect("tempdir");
    let other_cold = other.path().join("cold.img");
    let cold: Vec<&std::ffi::OsStr> = ["--cold".as_ref(), other_cold.as_os_str()]
        .into_iter()
        .chain(["--cold-size", "1GiB", "--cold-drive", "hdd"].map(std::ffi::OsStr::new))
        .collect();
    let formatted = output(
        shale()
            .args(["format", "--data-dir"])
            .arg(other.path())
            .args(&without[..2])
            .args(["--capacity-size", "512MiB"])
            .args(&without[4..])
            .args(&cold),
    );
    assert!(
        formatted.status.success(),
        "{}",
        String::from_utf8_lossy(&formatted.stderr)
    );
    let err = serve_refused(&cold);
    assert!(err.contains("belongs to another pool"), "{err}");
    let refused = output(
        shale()
            .args(["format", "--data-dir"])
            .arg(d.data_dir())
            .args(["--cold", "/tmp/a.img", "--cold", "/tmp/b.img", "--force"]),
    );
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("cold"), "{err}");
}
