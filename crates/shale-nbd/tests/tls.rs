//! TLS via NBD_OPT_STARTTLS: certificates generated in the test (rcgen),
//! forced and selective TLS modes, client-certificate identities restricting
//! exports, and real clients (nbdinfo, nbdcopy through libnbd/GnuTLS).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{mem_spec, pattern, run, run_ok, Fixture, RawClient, MIB};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use shale_nbd::proto::consts::*;
use shale_nbd::proto::{ClientOption, InfoRequest, OptionHeader};
use shale_nbd::{ExportAccess, MemBackendConfig, TlsMode, TlsSettings};

const T: Duration = Duration::from_secs(60);

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA, a server certificate for localhost/127.0.0.1, and client
    /// certificates for alice and bob, each in a libnbd-style directory
    /// (ca-cert.pem, client-cert.pem, client-key.pem).
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Shale test CA");
        let ca = ca_params.self_signed(&ca_key).expect("ca cert");
        std::fs::write(dir.path().join("ca-cert.pem"), ca.pem()).expect("write ca");

        let skey = KeyPair::generate().expect("server key");
        let mut sp = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("sp");
        sp.distinguished_name
            .push(DnType::CommonName, "shale-nbd test server");
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let scert = sp.signed_by(&skey, &ca, &ca_key).expect("server cert");
        std::fs::write(dir.path().join("server-cert.pem"), scert.pem()).expect("write");
        std::fs::write(dir.path().join("server-key.pem"), skey.serialize_pem()).expect("write");

        for who in ["alice", "bob"] {
            let d = dir.path().join(who);
            std::fs::create_dir(&d).expect("mkdir");
            let key = KeyPair::generate().expect("client key");
            let mut p = CertificateParams::new(vec![format!("{who}.clients.example")]).expect("cp");
            p.distinguished_name.push(DnType::CommonName, who);
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = p.signed_by(&key, &ca, &ca_key).expect("client cert");
            std::fs::write(d.join("client-cert.pem"), cert.pem()).expect("write");
            std::fs::write(d.join("client-key.pem"), key.serialize_pem()).expect("write");
            std::fs::write(d.join("ca-cert.pem"), ca.pem()).expect("write");
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn settings(&self) -> TlsSettings {
        TlsSettings {
            cert_chain_pem: self.path("server-cert.pem"),
            private_key_pem: self.path("server-key.pem"),
            client_ca_pem: Some(self.path("ca-cert.pem")),
            client_cert_required: false,
        }
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
            cfg.tls = Some(pki.settings());
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
