//! End to end, TLS: `shale serve` with a certificate generated here (a throwaway CA,
//! a server certificate for 127.0.0.1/localhost, client certificates for alice and
//! bob), real clients over `nbds://` (libnbd) and qemu's `tls-creds-x509`, data
//! written and read back through TLS, plaintext clients refused where TLS is required,
//! and an export restricted to one client identity by the config file.

mod daemon_common;

use std::path::Path;
use std::process::Command;

use daemon_common::*;
use shale_testkit::tls::Pki;

fn tls_uri(d: &Daemon, export: &str, certs: &Path) -> String {
    format!(
        "nbds://{}/{export}?tls-certificates={}",
        d.tcp_addr(),
        certs.display()
    )
}

/// qemu-io over TLS with the client certificates in `certs`.
fn qemu_io_tls(d: &Daemon, export: &str, certs: &Path, cmds: &[&str]) -> Command {
    let addr = d.tcp_addr();
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let mut cmd = Command::new("qemu-io");
    cmd.arg("--object")
        .arg(format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            certs.display()
        ))
        .arg("--image-opts")
        .arg(format!(
            "driver=nbd,server.type=inet,server.host={host},server.port={port},export={export},tls-creds=tls0"
        ));
    for c in cmds {
        cmd.args(["-c", c]);
    }
    cmd
}

fn fails(cmd: &mut Command, why: &str) -> String {
    let out = output(cmd);
    assert!(
        !out.status.success(),
        "{why}: {cmd:?} succeeded\nstdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `--tcp addr` with the server certificate and the client CA, then `extra`.
fn tls_args(pki: &Pki, addr: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["--tcp".into(), addr.into()];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    for (flag, file) in [
        ("--tls-cert", "server-cert.pem"),
        ("--tls-key", "server-key.pem"),
        ("--tls-client-ca", "ca-cert.pem"),
    ] {
        args.push(flag.into());
        args.push(pki.path(file).display().to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn tls_daemon(pki: &Pki, extra: &[&str]) -> Daemon {
    Daemon::start_with(tls_args(pki, "127.0.0.1:0", extra))
}

#[test]
fn required_tls_carries_data_and_refuses_plaintext() {
    require("nbdcopy", "libnbd-bin");
    require("nbdinfo", "libnbd-bin");
    require("qemu-io", "qemu-utils");
    let pki = Pki::new();
    let mut d = tls_daemon(&pki, &["--tls-required"]);
    d.admin(&["volume", "create", "tls", "16MiB"]);
    let alice = pki.path("alice");
    let scratch = tempfile::tempdir().expect("tempdir");

    // libnbd: list, then copy in with two connections and back out.
    let out = stdout(Command::new("nbdinfo").args(["--list", "--json", &tls_uri(&d, "", &alice)]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let names: Vec<&str> = v["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .filter_map(|e| e["export-name"].as_str())
        .collect();
    assert_eq!(names, ["default", "tls"], "{out}");
    let mut data = pattern(17, 16 * MIB as usize);
    data[2 * MIB as usize..3 * MIB as usize].fill(0);
    let src = scratch.path().join("src");
    write_file(&src, &data);
    let uri = tls_uri(&d, "tls", &alice);
    run(Command::new("nbdcopy")
        .args(["--connections=2", "--flush"])
        .arg(&src)
        .arg(&uri));
    let back = read_export(&uri, &scratch.path().join("back"));
    if let Some(b) = first_difference(&back, &data) {
        panic!("block {b} differs after a round trip over TLS");
    }

    // qemu: write, flush and verify patterns through tls-creds-x509.
    let out = stdout(&mut qemu_io_tls(
        &d,
        "tls",
        &alice,
        &[
            "write -P 0x6b 1M 256k",
            "write -P 0x6c 4095 2",
            "flush",
            "read -P 0x6b 1M 256k",
            "read -P 0x6c 4095 2",
        ],
    ));
    assert!(!out.contains("failed"), "{out}");
    data[MIB as usize..MIB as usize + 256 * 1024].fill(0x6b);
    data[4095..4097].fill(0x6c);
    // Both clients see the same bytes.
    let back = read_export(&uri, &scratch.path().join("back2"));
    if let Some(b) = first_difference(&back, &data) {
        panic!("block {b} differs between qemu's writes and libnbd's reads");
    }

    // Plaintext is refused on TCP and on the unix socket alike.
    let plain = format!("nbd://{}/tls", d.tcp_addr());
    let err = fails(
        Command::new("nbdinfo").arg(&plain),
        "plaintext over TCP with TLS required",
    );
    assert!(err.to_lowercase().contains("tls"), "{err}");
    fails(
        Command::new("nbdinfo").arg(d.uri("tls")),
        "plaintext over the unix socket with TLS required",
    );
    fails(
        Command::new("qemu-io").args(["-f", "raw", "-c", "read 0 4k", &plain]),
        "qemu-io without TLS",
    );
    // A client that does not trust the server's CA gives up in the handshake.
    let stranger = Pki::new();
    fails(
        Command::new("nbdinfo").arg(tls_uri(&d, "tls", &stranger.path("alice"))),
        "a client trusting another CA",
    );
    // With a client CA, required TLS admits only clients with a certificate it
    // signed: one that trusts the server but has none is refused.
    fails(
        Command::new("nbdinfo").arg(tls_uri(&d, "tls", &pki.path("anon"))),
        "a TLS client without a certificate",
    );
    let log = d.log();
    assert!(log.contains("tls=true"), "{log}");
    // Loopback, TLS required, client certificates: nothing to warn about.
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("NBD over TCP")),
        "{log}"
    );
    d.stop();
}

#[test]
fn a_non_loopback_address_needs_required_tls() {
    require("nbdinfo", "libnbd-bin");
    let pki = Pki::new();
    // TLS optional would serve plaintext clients on every interface: refused.
    let args = tls_args(&pki, "0.0.0.0:0", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let scratch = tempfile::tempdir().expect("tempdir");
    let data = scratch.path().join("data").display().to_string();
    let err = serve_refused(&[&["--data-dir", data.as_str()], &args[..]].concat());
    assert!(err.contains("is not a loopback address"), "{err}");
    assert!(err.contains("--tls-required"), "{err}");

    // Required: it starts, without a warning. Clients connect over 127.0.0.1 only
    // (the server certificate names it), never another address.
    let mut d = Daemon::start_with(tls_args(&pki, "0.0.0.0:0", &["--tls-required"]));
    let addr = d.tcp_addr();
    let port = addr
        .strip_prefix("0.0.0.0:")
        .unwrap_or_else(|| panic!("bound {addr}"));
    let uri = |export: &str, certs: &str| {
        format!(
            "nbds://127.0.0.1:{port}/{export}?tls-certificates={}",
            pki.path(certs).display()
        )
    };
    let info = stdout(Command::new("nbdinfo").arg(uri("default", "alice")));
    assert!(info.contains("export-size: 536870912"), "{info}");
    fails(
        Command::new("nbdinfo").arg(uri("default", "anon")),
        "a TLS client without a certificate",
    );
    fails(
        Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/default")),
        "a plaintext client",
    );
    let log = d.log();
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("NBD over TCP")),
        "{log}"
    );
    d.stop();
}

#[test]
fn config_file_restricts_an_export_to_one_identity() {
    require("nbdinfo", "libnbd-bin");
    require("qemu-io", "qemu-utils");
    let pki = Pki::new();
    let config = pki.path("shale.toml");
    std::fs::write(
        &config,
        format!(
            r#"[nbd.tls]
cert = "{cert}"
key = "{key}"
client_ca = "{ca}"
required = false

[[nbd.tls.exports]]
name = "secret"
allowed_identities = ["alice"]
"#,
            cert = pki.path("server-cert.pem").display(),
            key = pki.path("server-key.pem").display(),
            ca = pki.path("ca-cert.pem").display(),
        ),
    )
    .expect("write config");
    let mut args: Vec<String> = vec![
        "--config".into(),
        config.display().to_string(),
        "--tcp".into(),
        "127.0.0.1:0".into(),
    ];
    args.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    let mut d = Daemon::start_with(args);
    d.admin(&["volume", "create", "secret", "8MiB"]);

    // Alice reaches the secret volume over TLS and writes to it.
    let out = stdout(&mut qemu_io_tls(
        &d,
        "secret",
        &pki.path("alice"),
        &["write -P 0x5e 0 64k", "flush", "read -P 0x5e 0 64k"],
    ));
    assert!(!out.contains("failed"), "{out}");
    // Bob holds a valid certificate of the same CA but not the identity.
    fails(
        Command::new("nbdinfo").arg(tls_uri(&d, "secret", &pki.path("bob"))),
        "bob opening alice's export",
    );
    fails(
        &mut qemu_io_tls(&d, "secret", &pki.path("bob"), &["read 0 4k"]),
        "bob opening alice's export with qemu",
    );
    // Plaintext: the default volume is open to all (TLS optional), the secret one is not,
    // and it is not even listed.
    let plain = |export: &str| format!("nbd://{}/{export}", d.tcp_addr());
    let out = stdout(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x01 0 4k",
        "-c",
        "read -P 0x01 0 4k",
        &plain("default"),
    ]));
    assert!(!out.contains("failed"), "{out}");
    fails(
        Command::new("nbdinfo").arg(plain("secret")),
        "plaintext client opening a TLS-only export",
    );
    let listed = stdout(Command::new("nbdinfo").args(["--list", "--json", &plain("")]));
    assert!(!listed.contains("secret"), "{listed}");
    assert!(listed.contains("default"), "{listed}");
    // TLS optional does not demand certificates: a TLS client without one opens the
    // default volume, as a plaintext client may, but not the secret one.
    let anon = pki.path("anon");
    let info = stdout(Command::new("nbdinfo").arg(tls_uri(&d, "default", &anon)));
    assert!(info.contains("export-size"), "{info}");
    fails(
        Command::new("nbdinfo").arg(tls_uri(&d, "secret", &anon)),
        "a TLS client without a certificate opening alice's export",
    );
    // Loopback with TLS optional is allowed, and logged as reachable in plaintext.
    let log = d.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("with TLS optional")),
        "{log}"
    );
    d.stop();
}
