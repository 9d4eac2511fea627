//! TLS for `NBD_OPT_STARTTLS`, with rustls (ring provider).
//!
//! The handshake runs synchronously on the connection thread right after the
//! ACK. For transmission the stream splits in two: the reader thread pulls
//! ciphertext from the socket without holding any lock and feeds it to the
//! shared rustls state; whoever has TLS records to send (normally the writer,
//! sometimes the reader after a key update) takes the socket write lock first
//! and the state lock second, so records leave in the order rustls made them.
//!
//! Identities of a client are its certificate's subject common names and
//! DNS subject-alternative names; exports can be restricted to them.
//!
//! rustls has no TLS 1.3 external pre-shared keys (only resumption PSKs), so
//! TLS-PSK clients (e.g. libnbd's `tls-psk-file`) are not supported:
//! certificates only.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use super::transport::Socket;
use super::TlsSettings;

/// TLS setup and handshake failures.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading certificates from {path}: {message}")]
    Certificates { path: PathBuf, message: String },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("reading private key from {path}: {message}")]
    PrivateKey { path: PathBuf, message: String },
    #[error("client CA {path}: {message}")]
    ClientCa { path: PathBuf, message: String },
    #[error("client_cert_required needs client_ca_pem")]
    ClientCaMissing,
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("TLS handshake: {0}")]
    Handshake(io::Error),
    #[error("TLS is already active")]
    AlreadyActive,
    #[error("TLS is not configured")]
    NotConfigured,
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certificates {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// A ready TLS server configuration.
#[derive(Debug, Clone)]
pub struct TlsAcceptor {
    config: Arc<ServerConfig>,
}

impl TlsAcceptor {
    pub fn new(s: &TlsSettings) -> Result<TlsAcceptor, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(&s.cert_chain_pem)?;
        let key =
            PrivateKeyDer::from_pem_file(&s.private_key_pem).map_err(|e| TlsError::PrivateKey {
                path: s.private_key_pem.clone(),
                message: e.to_string(),
            })?;
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &s.client_ca_pem {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca)? {
                    roots.add(c).map_err(|e| TlsError::ClientCa {
                        path: ca.clone(),
                        message: e.to_string(),
                    })?;
                }
                let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let v = if s.client_cert_required {
                    v
                } else {
                    v.allow_unauthenticated()
                };
                builder.with_client_cert_verifier(v.build().map_err(|e| TlsError::ClientCa {
                    path: ca.clone(),
                    message: e.to_string(),
                })?)
            }
            None if s.client_cert_required => return Err(TlsError::ClientCaMissing),
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(TlsAcceptor {
            config: Arc::new(config),
        })
    }

    /// Runs the server side of the TLS handshake on `socket` and returns the
    /// stream plus the client's identities.
    pub(crate) fn accept(&self, mut socket: Socket) -> Result<(TlsStream, Vec<String>), TlsError> {
        let mut conn = ServerConnection::new(Arc::clone(&self.config))
            .map_err(|e| TlsError::Config(e.to_string()))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut socket).map_err(TlsError::Handshake)?;
        }
        // Post-handshake messages (session tickets) go out now.
        while conn.wants_write() {
            conn.write_tls(&mut socket).map_err(TlsError::Handshake)?;
        }
        let identities = conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| identities(c.as_ref()))
            .unwrap_or_default();
        let wsock = socket.try_clone().map_err(TlsError::Handshake)?;
        Ok((
            TlsStream {
                shared: Arc::new(Shared {
                    conn: Mutex::new(conn),
                    wsock: Mutex::new(wsock),
                }),
                rd: ReadState {
                    rsock: socket,
                    pending: Vec::new(),
                    eof: false,
                },
            },
            identities,
        ))
    }
}

/// Subject CNs and SAN DNS names of a DER certificate.
fn identities(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut out: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let GeneralName::DNSName(d) = n {
                out.push((*d).to_owned());
            }
        }
    }
    out.dedup();
    out
}

#[derive(Debug)]
struct Shared {
    conn: Mutex<ServerConnection>,
    /// Held while TLS records are taken from `conn` and written, so they
    /// reach the socket in order. Lock order: `wsock`, then `conn`.
    wsock: Mutex<Socket>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn flush_tls(&self) -> io::Result<()> {
        let mut sock = lock(&self.wsock);
        let mut out = Vec::new();
        {
            let mut conn = lock(&self.conn);
            while conn.wants_write() {
                conn.write_tls(&mut out)?;
            }
        }
        sock.write_all(&out)
    }

    /// Returns plaintext, feeding rustls ciphertext one record batch at a
    /// time: rustls refuses more input while decrypted data is unread.
    fn read_plain(&self, rd: &mut ReadState, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut need_flush = false;
            let result = {
                let mut conn = lock(&self.conn);
                loop {
                    match conn.reader().read(buf) {
                        Ok(n) => break Some(Ok(n)),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => break Some(Err(e)),
                    }
                    if rd.pending.is_empty() {
                        break None;
                    }
                    let mut slice = &rd.pending[..];
                    match conn.read_tls(&mut slice) {
                        Ok(0) => {
                            break Some(Err(io::Error::other(
                                "TLS input stalled with data pending",
                            )));
                        }
                        Ok(n) => {
                            rd.pending.drain(..n);
                        }
                        Err(e) => break Some(Err(e)),
                    }
                    let processed = conn.process_new_packets();
                    need_flush |= conn.wants_write();
                    if let Err(e) = processed {
                        break Some(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                }
            };
            if need_flush {
                // Alerts and key-update answers; a failure here only matters
                // if nothing else went wrong.
                let flushed = self.flush_tls();
                if result.is_none() {
                    flushed?;
                }
            }
            if let Some(r) = result {
                return r;
            }
            if rd.eof {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            // Block on the socket without holding the state lock, so the
            // writer can keep sending.
            let mut cipher = [0u8; 16 * 1024];
            let n = rd.rsock.read(&mut cipher)?;
            if n == 0 {
                rd.eof = true;
                let mut conn = lock(&self.conn);
                // Tells rustls about the EOF; the next reader().read then
                // says whether close_notify came first.
                let _ = conn.read_tls(&mut &[][..]);
                let _ = conn.process_new_packets();
            } else {
                rd.pending.extend_from_slice(&cipher[..n]);
            }
        }
    }

    fn write_plain(&self, buf: &[u8]) -> io::Result<usize> {
        let n = lock(&self.conn).writer().write(buf)?;
        self.flush_tls()?;
        Ok(n)
    }

    fn close_notify(&self) {
        lock(&self.conn).send_close_notify();
        let _ = self.flush_tls();
    }
}

/// The reading side's own state: its socket handle and ciphertext received
/// but not yet accepted by rustls.
#[derive(Debug)]
struct ReadState {
    rsock: Socket,
    pending: Vec<u8>,
    eof: bool,
}

/// A TLS stream over a socket; splits for transmission.
#[derive(Debug)]
pub struct TlsStream {
    shared: Arc<Shared>,
    rd: ReadState,
}

impl TlsStream {
    pub(crate) fn socket(&self) -> &Socket {
        &self.rd.rsock
    }

    pub(crate) fn split(self) -> io::Result<(TlsReadHalf, TlsWriteHalf)> {
        Ok((
            TlsReadHalf {
                shared: Arc::clone(&self.shared),
                rd: self.rd,
            },
            TlsWriteHalf {
                shared: self.shared,
            },
        ))
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.shared.read_plain(&mut self.rd, buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.shared.write_plain(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.flush_tls()
    }
}

#[derive(Debug)]
pub struct TlsReadHalf {
    shared: Arc<Shared>,
    rd: ReadState,
}

impl Read for TlsReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.shared.read_plain(&mut self.rd, buf)
    }
}

/// Sends close_notify when dropped: the writer thread drops it after the
/// last reply, before the socket is shut down.
#[derive(Debug)]
pub struct TlsWriteHalf {
    shared: Arc<Shared>,
}

impl Write for TlsWriteHalf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.shared.write_plain(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.flush_tls()
    }
}

impl Drop for TlsWriteHalf {
    fn drop(&mut self) {
        self.shared.close_notify();
    }
}
