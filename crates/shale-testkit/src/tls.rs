//! A throwaway PKI for TLS tests: a CA, a server certificate for
//! localhost/127.0.0.1, and client certificates for alice and bob, in the directory
//! layout libnbd and qemu's `tls-creds-x509` expect of a client.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// The client identities [`Pki::new`] issues certificates for.
pub const CLIENTS: [&str; 2] = ["alice", "bob"];

/// Certificates in a temporary directory, removed on drop:
///
/// - `ca-cert.pem`, `server-cert.pem`, `server-key.pem` (subject alternative names
///   `localhost` and `127.0.0.1`);
/// - for each of [`CLIENTS`], a directory `<who>/` with `ca-cert.pem`,
///   `client-cert.pem` and `client-key.pem`; the certificate's common name is `<who>`
///   and its DNS name `<who>.clients.example` (both are identities);
/// - `anon/ca-cert.pem`: a client that trusts the server but has no certificate.
#[derive(Debug)]
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let put = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write pem");
        };
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Shale test CA");
        let ca = ca_params.self_signed(&ca_key).expect("ca cert");
        put("ca-cert.pem", ca.pem());

        let server_key = KeyPair::generate().expect("server key");
        let mut sp = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("server params");
        sp.distinguished_name
            .push(DnType::CommonName, "shale test server");
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = sp
            .signed_by(&server_key, &ca, &ca_key)
            .expect("server cert");
        put("server-cert.pem", server.pem());
        put("server-key.pem", server_key.serialize_pem());

        for who in CLIENTS {
            let key = KeyPair::generate().expect("client key");
            let mut p = CertificateParams::new(vec![format!("{who}.clients.example")])
                .expect("client params");
            p.distinguished_name.push(DnType::CommonName, who);
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = p.signed_by(&key, &ca, &ca_key).expect("client cert");
            std::fs::create_dir(dir.path().join(who)).expect("mkdir");
            put(&format!("{who}/ca-cert.pem"), ca.pem());
            put(&format!("{who}/client-cert.pem"), cert.pem());
            put(&format!("{who}/client-key.pem"), key.serialize_pem());
        }
        std::fs::create_dir(dir.path().join("anon")).expect("mkdir");
        put("anon/ca-cert.pem", ca.pem());
        Pki { dir }
    }

    /// The directory holding everything.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A file or client directory in the PKI (`"server-cert.pem"`, `"alice"`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
