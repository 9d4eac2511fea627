//! TLS via NBD_OPT_STARTTLS: certificates generated in the test (shale-testkit),
//! forced and selective TLS modes, client-certificate identities restricting
//! exports, and real clients (nbdinfo, nbdcopy through libnbd/GnuTLS).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{mem_spec, pattern, run, run_ok, Fixture, RawClient, MIB};
use shale_nbd::proto::consts::*;
use shale_nbd::proto::{ClientOption, InfoRequest, OptionHeader};
use shale_nbd::{ExportAccess, MemBackendConfig, TlsMode, TlsSettings};
use shale_testkit::tls::Pki;

const T: Duration = Duration::from_secs(60);

/// The server side of the test PKI.
fn settings(pki: &Pki) -> TlsSettings {
    TlsSettings {
        cert_chain_pem: pki.path("server-cert.pem"),
        private_key_pem: pki.path("server-key.pem"),
        client_ca_pem: Some(pki.path("ca-cert.pem")),
        client_cert_required: false,
    }
}

fn server(pki: &Pki, mode: TlsMode) -> Fixture {
    Fixture::start_with(
        vec![
            mem_spec("pub", 16 * MIB),
            mem_spec("alice-only", 4 * MIB),
            mem_spec("secret", 4 * MIB),
        ],
        MemBackendConfig::default(),
        |cfg| {
            cfg.tls = Some(settings(pki));
            cfg.tls_mode = mode;
            let mut access = BTreeMap::new();
            access.insert(
                "alice-only".to_string(),
                ExportAccess {
                    tls_only: true,
                    allowed_identities: Some(vec!["alice".into()]),
                },
            );
            access.insert(
                "secret".to_string(),
                ExportAccess {
                    tls_only: true,
                    allowed_identities: None,
                },
            );
            cfg.export_access = access;
        },
    )
}

fn tls_uri(f: &Fixture, export: &str, certs: &Path) -> String {
    format!(
        "nbds://{}/{export}?tls-certificates={}",
        f.tcp(),
        certs.display()
    )
}

fn listed(f: &Fixture, uri: &str) -> Vec<String> {
    let _ = f;
    let out = run_ok(Command::new("nbdinfo").args(["--list", "--json", uri]), T);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    v["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .filter_map(|e| e["export-name"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn forced_tls_refuses_plain_negotiation() {
    let pki = Pki::new();
    let f = server(&pki, TlsMode::Required);
    let mut c = RawClient::tcp(f.tcp());
    c.handshake();
    c.send_option(&ClientOption::List);
    assert_eq!(c.option_reply().0.reply_type, REP_ERR_TLS_REQD);
    c.send_option(&ClientOption::Go(InfoRequest {
        name: "pub".into(),
        info_requests: vec![],
    }));
    assert_eq!(c.option_reply().0.reply_type, REP_ERR_TLS_REQD);
    c.send_option(&ClientOption::Unknown { option: 99 });
    assert_eq!(c.option_reply().0.reply_type, REP_ERR_TLS_REQD);
    // STARTTLS with data is invalid, not an upgrade.
    use std::io::Write;
    c.s.write_all(
        &OptionHeader {
            option: OPT_STARTTLS,
            length: 1,
        }
        .encode(),
    )
    .expect("hdr");
    c.s.write_all(&[0]).expect("data");
    assert_eq!(c.option_reply().0.reply_type, REP_ERR_INVALID);
    // EXPORT_NAME cannot be refused with an error: the session ends.
    c.send_option(&ClientOption::ExportName { name: "pub".into() });
    assert!(c.closed());
    // A client that upgrades and then sends garbage instead of a TLS
    // handshake is dropped, and the server keeps going.
    let mut c = RawClient::tcp(f.tcp());
    c.handshake();
    c.send_option(&ClientOption::StartTls);
    assert_eq!(c.option_reply().0.reply_type, REP_ACK);
    c.s.write_all(&[0x55; 64]).expect("garbage");
    assert!(
        c.drained_to_close(),
        "a failed TLS handshake must end the session"
    );
}

#[test]
fn nbdinfo_over_tls_sees_exports_by_identity() {
    require!("nbdinfo");
    let pki = Pki::new();
    let f = server(&pki, TlsMode::Required);
    let alice = pki.path("alice");
    let bob = pki.path("bob");
    assert_eq!(
        listed(&f, &tls_uri(&f, "", &alice)),
        ["pub", "alice-only", "secret"]
    );
    assert_eq!(listed(&f, &tls_uri(&f, "", &bob)), ["pub", "secret"]);
    let out = run_ok(
        Command::new("nbdinfo").arg(tls_uri(&f, "alice-only", &alice)),
        T,
    );
    assert!(out.contains("export-size: 4194304"), "{out}");
    // Bob may not open alice's export.
    let denied = run(
        Command::new("nbdinfo").arg(tls_uri(&f, "alice-only", &bob)),
        T,
    );
    assert!(!denied.status.success());
    // Without TLS the server refuses.
    let plain = run(
        Command::new("nbdinfo").arg(format!("nbd://{}/pub", f.tcp())),
        T,
    );
    assert!(!plain.status.success());
    // A client certificate from another CA is rejected in the handshake.
    let other = Pki::new();
    let mixed = tempfile::tempdir().expect("tmp");
    std::fs::copy(pki.path("ca-cert.pem"), mixed.path().join("ca-cert.pem")).expect("copy");
    for name in ["client-cert.pem", "client-key.pem"] {
        std::fs::copy(other.path("alice").join(name), mixed.path().join(name)).expect("copy");
    }
    let bad = run(
        Command::new("nbdinfo").arg(tls_uri(&f, "pub", mixed.path())),
        T,
    );
    assert!(
        !bad.status.success(),
        "certificate from an unknown CA must fail"
    );
}

#[test]
fn selective_tls_hides_tls_only_exports_from_plain_clients() {
    require!("nbdinfo");
    let pki = Pki::new();
    let f = server(&pki, TlsMode::Optional);
    assert_eq!(listed(&f, &format!("nbd://{}/", f.tcp())), ["pub"]);
    assert_eq!(
        listed(&f, &tls_uri(&f, "", &pki.path("bob"))),
        ["pub", "secret"]
    );
    let plain_secret = run(
        Command::new("nbdinfo").arg(format!("nbd://{}/secret", f.tcp())),
        T,
    );
    assert!(!plain_secret.status.success());
}

#[test]
fn nbdcopy_round_trip_over_tls() {
    require!("nbdcopy");
    let pki = Pki::new();
    let f = server(&pki, TlsMode::Required);
    let src = f.path("src.img");
    let mut img = pattern(7, (16 * MIB) as usize);
    img[(4 * MIB) as usize..(6 * MIB) as usize].fill(0);
    std::fs::write(&src, &img).expect("write");
    let uri = tls_uri(&f, "pub", &pki.path("alice"));
    run_ok(
        Command::new("nbdcopy")
            .args(["--connections=2"])
            .arg(&src)
            .arg(&uri),
        T,
    );
    let dst = f.path("dst.img");
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&dst), T);
    assert!(
        std::fs::read(&dst).expect("dst") == img,
        "data through TLS differs"
    );
    assert!(f.backend.read_direct("pub", 0, 4096).expect("pub") == img[..4096]);
}
