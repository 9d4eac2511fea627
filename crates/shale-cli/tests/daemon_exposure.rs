//! End to end, exposure: what `shale serve` listens on and who can reach it
//! (docs/security.md). By default only the data directory's owner can: the unix
//! sockets are 0600, the data directory 0700, the device files 0600, and there is
//! no TCP listener at all. TCP on a non-loopback address without required TLS is
//! refused at start unless `--insecure-tcp`. Every client here connects through
//! the unix socket or 127.0.0.1; nothing is sent to any other address.

mod daemon_common;

use std::process::Command;

use daemon_common::*;

/// `0100007F` and `00000000` in `/proc/net/tcp`: 127.0.0.1 and 0.0.0.0.
const HEX_LOOPBACK: &str = "0100007F";
const HEX_ANY: &str = "00000000";

/// The port of the address the daemon logged (`0.0.0.0:40123` → 40123).
fn port(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"))
}

/// `nbdinfo` over 127.0.0.1 at `port`, whatever address the daemon bound.
fn nbdinfo_loopback(port: u16) -> String {
    stdout(Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/default")))
}

#[test]
fn the_default_daemon_serves_the_unix_socket_only() {
    require("nbdinfo", "libnbd-bin");
    let mut d = Daemon::start();
    let pid = d.pid().expect("running");
    let log = d.log();
    assert!(log.contains("serving NBD on unix socket"), "{log}");
    assert!(!log.contains("serving NBD on TCP"), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("NBD over TCP")),
        "{log}"
    );
    // Not a TCP port of its own, NBD or metrics, on any address.
    assert_eq!(tcp_listeners(pid), Vec::new(), "{log}");
    // The sockets admit the owner only, and the owner gets in.
    for name in ["nbd.sock", "admin.sock"] {
        assert_eq!(mode(&d.data_dir().join(name)), 0o600, "{name}");
    }
    let info = stdout(Command::new("nbdinfo").arg(d.uri("default")));
    assert!(info.contains("export-size: 536870912"), "{info}");

    // The effective configuration says so.
    let printed = stdout(
        shale()
            .args(["serve", "--print-config", "--data-dir"])
            .arg(d.dir.path().join("elsewhere")),
    );
    assert!(printed.contains("tcp = \"\"\n"), "{printed}");
    assert!(printed.contains("insecure_tcp = false\n"), "{printed}");
    d.stop();
}

#[test]
fn non_loopback_tcp_without_tls_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.display().to_string();
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let err = serve_refused(&["--data-dir", &data_arg, "--tcp", addr]);
        for want in [
            "is not a loopback address",
            "--tls-required",
            "--insecure-tcp",
        ] {
            assert!(err.contains(want), "{addr}: {err:?} lacks {want:?}");
        }
        // Refused before anything was created.
        assert!(!data.exists(), "{addr}: the data directory was created");
    }

    // The config file form, and the opt-in there.
    let config = dir.path().join("shale.toml");
    std::fs::write(&config, "[nbd]\ntcp = \"0.0.0.0:0\"\n").expect("write config");
    let config_arg = config.display().to_string();
    let err = serve_refused(&["--config", &config_arg, "--data-dir", &data_arg]);
    assert!(err.contains("--insecure-tcp"), "{err}");
    let printed = stdout(shale().args([
        "serve",
        "--config",
        &config_arg,
        "--insecure-tcp",
        "--print-config",
    ]));
    assert!(printed.contains("insecure_tcp = true\n"), "{printed}");
    std::fs::write(&config, "[nbd]\ntcp = \"0.0.0.0:0\"\ninsecure_tcp = true\n")
        .expect("write config");
    let printed = stdout(shale().args(["serve", "--config", &config_arg, "--print-config"]));
    assert!(printed.contains("tcp = \"0.0.0.0:0\"\n"), "{printed}");
    assert!(printed.contains("insecure_tcp = true\n"), "{printed}");
    assert!(!data.exists());
}

#[test]
fn insecure_tcp_opts_in_to_a_non_loopback_listener_with_a_warning() {
    require("nbdinfo", "libnbd-bin");
    let mut args: Vec<String> = ["--tcp", "0.0.0.0:0", "--insecure-tcp"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    let mut d = Daemon::start_with(args);
    let addr = d.tcp_addr();
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");
    let log = d.log();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("NBD over TCP"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(warning.contains("anyone who can reach it"), "{warning}");
    assert!(warning.contains("--insecure-tcp"), "{warning}");
    // The listener is the daemon's, on the wildcard address; a client reaches it
    // over loopback only.
    let port = port(&addr);
    assert_eq!(
        tcp_listeners(d.pid().expect("running")),
        vec![(HEX_ANY.to_string(), port)]
    );
    let info = nbdinfo_loopback(port);
    assert!(info.contains("export-size: 536870912"), "{info}");
    d.stop();
}

#[test]
fn loopback_tcp_when_asked_for_is_served_with_a_warning() {
    require("nbdinfo", "libnbd-bin");
    let mut args: Vec<String> = vec!["--tcp".into(), "127.0.0.1:0".into()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    let mut d = Daemon::start_with(args);
    let port = port(&d.tcp_addr());
    let log = d.log();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("NBD over TCP"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(warning.contains("on loopback without TLS"), "{warning}");
    assert!(warning.contains("any local user"), "{warning}");
    assert_eq!(
        tcp_listeners(d.pid().expect("running")),
        vec![(HEX_LOOPBACK.to_string(), port)]
    );
    let info = nbdinfo_loopback(port);
    assert!(info.contains("export-size: 536870912"), "{info}");
    d.stop();
}

/// Whoever reads a device file reads every volume, so the daemon creates the data
/// directory 0700 and the device files 0600, and warns about one others can read.
#[test]
fn the_data_directory_and_device_files_are_the_owners_only() {
    let mut d = Daemon::start();
    let data = d.data_dir();
    assert_eq!(mode(&data), 0o700, "data directory");
    for name in ["cache.img", "capacity.img"] {
        assert_eq!(mode(&data.join(name)), 0o600, "{name}");
    }
    assert!(
        !d.log().contains("accessible to other users"),
        "{}",
        d.log()
    );
    d.stop();

    // A device file others can read (made before files were created 0600) is
    // served, with a warning naming it.
    use std::os::unix::fs::PermissionsExt;
    let cache = data.join("cache.img");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    d.spawn();
    let log = d.last_log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("accessible to other users")
            && l.contains("cache.img")),
        "{log}"
    );
    d.stop();
}
