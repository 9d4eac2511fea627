//! The NBD server: listeners on a unix socket and/or TCP, one thread per
//! connection for the handshake and the reader side of transmission, plus one
//! writer thread per connection.
//!
//! A slow or dead client only ever blocks its own threads: reads during the
//! handshake time out, writes time out, and in-flight requests are bounded per
//! connection. Server shutdown closes every socket and waits for the
//! connection threads.

mod negotiation;
#[cfg(feature = "tls")]
pub mod tls;
mod transmission;
pub mod transport;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, info, info_span, warn};

use crate::backend::{Backend, ExportId};
use crate::proto::consts::PAYLOAD_BYTES_DEFAULT;
use crate::proto::handshake::HandshakeError;
use crate::proto::negotiate::{CloseReason, TlsMode};
use crate::proto::option::OptionLimits;
use crate::proto::request::{FatalRequest, RequestHeaderError};
use negotiation::Negotiated;
use transport::{Closer, Socket, Transport};

/// Limits of one server. Every queue and buffer is bounded by one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; more are accepted and closed at once.
    pub connections_max: usize,
    /// Requests between "header read" and "reply written", per connection.
    pub inflight_requests_max: usize,
    /// Read and write payload bytes in flight, per connection.
    pub inflight_bytes_max: u64,
    /// Largest READ/WRITE payload; larger writes close the connection.
    pub payload_bytes_max: u32,
    /// Largest option data parsed.
    pub option_bytes_max: u32,
    /// Larger option data is read and refused with NBD_REP_ERR_TOO_BIG up to
    /// this size; beyond it the connection is closed.
    pub option_discard_bytes_max: u32,
    /// Options per connection before the client is deemed abusive.
    pub options_max: u32,
    pub info_requests_max: u16,
    pub meta_queries_max: u32,
    /// Read timeout during the handshake: a client silent this long while
    /// negotiating is dropped.
    pub handshake_timeout: Duration,
    /// A reply write blocked this long (client not reading) ends the connection.
    pub write_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        let o = OptionLimits::default();
        ServerLimits {
            connections_max: 64,
            inflight_requests_max: 128,
            inflight_bytes_max: 64 << 20,
            payload_bytes_max: PAYLOAD_BYTES_DEFAULT,
            option_bytes_max: o.option_bytes_max,
            option_discard_bytes_max: 1 << 20,
            options_max: 1024,
            info_requests_max: o.info_requests_max,
            meta_queries_max: o.meta_queries_max,
            handshake_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
        }
    }
}

impl ServerLimits {
    fn option_limits(&self) -> OptionLimits {
        OptionLimits {
            option_bytes_max: self.option_bytes_max,
            info_requests_max: self.info_requests_max,
            meta_queries_max: self.meta_queries_max,
        }
    }
}

/// Access rules for one export, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExportAccess {
    /// Only over TLS.
    pub tls_only: bool,
    /// Only for TLS clients whose certificate subject CN or a SAN DNS name is
    /// one of these (implies TLS).
    pub allowed_identities: Option<Vec<String>>,
}

/// TLS material (PEM files) for `NBD_OPT_STARTTLS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert_chain_pem: PathBuf,
    pub private_key_pem: PathBuf,
    /// CA bundle used to verify client certificates. Without it clients are
    /// not asked for certificates and have no identity.
    pub client_ca_pem: Option<PathBuf>,
    /// Refuse the TLS handshake without a valid client certificate.
    pub client_cert_required: bool,
}

/// Everything a server needs besides its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Unix socket path, created with mode 0600.
    pub unix_socket: Option<PathBuf>,
    /// TCP listen address; port 0 picks a free port. None by default: even on
    /// loopback every local user could connect, where the unix socket admits only
    /// its owner.
    pub tcp: Option<SocketAddr>,
    pub tls: Option<TlsSettings>,
    /// `Required` refuses every option but STARTTLS/ABORT before TLS.
    pub tls_mode: TlsMode,
    pub export_access: BTreeMap<String, ExportAccess>,
    /// Export chosen by the empty name; none if unset.
    pub default_export: Option<String>,
    pub limits: ServerLimits,
    /// Answer all-zero reads with NBD_REPLY_TYPE_OFFSET_HOLE (structured replies only).
    pub read_holes: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            unix_socket: None,
            tcp: None,
            tls: None,
            tls_mode: TlsMode::Off,
            export_access: BTreeMap::new(),
            default_export: None,
            limits: ServerLimits::default(),
            read_holes: true,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("no listener configured (neither unix socket nor TCP)")]
    NoListener,
    #[error("binding unix socket {path}: {source}")]
    BindUnix { path: PathBuf, source: io::Error },
    #[error("unix socket {path} is in use by a live server")]
    UnixSocketInUse { path: PathBuf },
    #[error("{path} exists and is not a socket")]
    NotASocket { path: PathBuf },
    #[error("binding TCP {addr}: {source}")]
    BindTcp { addr: SocketAddr, source: io::Error },
    #[error("TLS mode {mode:?} needs TLS settings")]
    TlsNotConfigured { mode: TlsMode },
    #[error("TLS support was not compiled in (feature \"tls\")")]
    TlsUnavailable,
    #[cfg(feature = "tls")]
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("spawning {what} thread: {source}")]
    Spawn {
        what: &'static str,
        source: io::Error,
    },
    #[error("limit {name} = {value} is invalid: {why}")]
    BadLimit {
        name: &'static str,
        value: u64,
        why: &'static str,
    },
}

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("{step}: {source}")]
    Io {
        step: &'static str,
        source: io::Error,
    },
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("option {option} with {length} bytes of data is too large; closing")]
    OptionTooLarge { option: u32, length: u32 },
    #[error(transparent)]
    Refused(CloseReason),
    #[error(transparent)]
    RequestHeader(#[from] RequestHeaderError),
    #[error(transparent)]
    Fatal(#[from] FatalRequest),
    #[error("export {name:?} vanished from the backend during negotiation")]
    ExportVanished { name: String },
    #[cfg(feature = "tls")]
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
}

/// State shared by the accept loops and every connection.
pub(crate) struct Shared {
    config: ServerConfig,
    backend: Arc<dyn Backend>,
    #[cfg(feature = "tls")]
    tls: Option<tls::TlsAcceptor>,
    stopping: AtomicBool,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Conn>>,
    idle: Condvar,
}

/// One open connection: how to end it, and the export it transmits on (none while
/// it negotiates).
struct Conn {
    closer: Arc<Closer>,
    export: Option<ExportId>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn tls_mode(&self) -> TlsMode {
        self.config.tls_mode
    }

    fn tls_available(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            self.tls.is_some()
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }

    /// Upgrades the transport after the STARTTLS ACK; returns the client's
    /// certificate identities.
    fn start_tls(&self, t: Transport) -> Result<(Transport, Vec<String>), ConnError> {
        #[cfg(feature = "tls")]
        {
            let Transport::Plain(socket) = t else {
                // Negotiation refuses a second STARTTLS before we get here.
                return Err(ConnError::Tls(tls::TlsError::AlreadyActive));
            };
            let acceptor = self
                .tls
                .as_ref()
                .ok_or(ConnError::Tls(tls::TlsError::NotConfigured))?;
            let (stream, ids) = acceptor.accept(socket)?;
            Ok((Transport::Tls(stream), ids))
        }
        #[cfg(not(feature = "tls"))]
        {
            drop(t);
            Err(ConnError::Io {
                step: "starttls",
                source: io::Error::new(io::ErrorKind::Unsupported, "TLS not compiled in"),
            })
        }
    }

    fn lock_conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Binds connection `id` to `export` for [`ServerHandle`]'s counts and disconnects.
    fn bind(&self, id: u64, export: ExportId) {
        if let Some(c) = self.lock_conns().get_mut(&id) {
            c.export = Some(export);
        }
    }
}

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener, SocketAddr),
}

/// A running server. Dropping it shuts it down.
pub struct Server {
    shared: Arc<Shared>,
    unix_path: Option<PathBuf>,
    tcp_addr: Option<SocketAddr>,
    acceptors: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("unix_path", &self.unix_path)
            .field("tcp_addr", &self.tcp_addr)
            .finish_non_exhaustive()
    }
}

fn check_limits(l: &ServerLimits) -> Result<(), ServerError> {
    let bad = |name, value: u64, why| Err(ServerError::BadLimit { name, value, why });
    if l.payload_bytes_max < 4096 || l.payload_bytes_max > 1 << 31 {
        return bad(
            "payload_bytes_max",
            u64::from(l.payload_bytes_max),
            "must be within 4 KiB..=2 GiB",
        );
    }
    if l.inflight_requests_max == 0 {
        return bad("inflight_requests_max", 0, "must be at least 1");
    }
    if l.connections_max == 0 {
        return bad("connections_max", 0, "must be at least 1");
    }
    if l.option_discard_bytes_max < l.option_bytes_max {
        return bad(
            "option_discard_bytes_max",
            u64::from(l.option_discard_bytes_max),
            "must be at least option_bytes_max",
        );
    }
    Ok(())
}

/// Binds a unix socket at `path` with mode 0600 and no window in which it
/// has wider permissions: bind inside a fresh 0700 directory, chmod, then
/// rename into place. A stale socket is replaced; a live one is an error. Also used
/// for the daemon's admin socket.
pub fn bind_unix(path: &Path) -> Result<UnixListener, ServerError> {
    let err = |source| ServerError::BindUnix {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ServerError::UnixSocketInUse {
                    path: path.to_owned(),
                })
            }
            Err(_) => {
                info!(path = %path.display(), "removing stale unix socket");
                std::fs::remove_file(path).map_err(err)?;
            }
        },
        Ok(_) => {
            return Err(ServerError::NotASocket {
                path: path.to_owned(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = tempfile::Builder::new()
        .prefix(".shale-nbd-")
        .tempdir_in(parent)
        .map_err(err)?;
    let tmp = dir.path().join("s");
    let listener = UnixListener::bind(&tmp).map_err(err)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(listener)
}

impl Server {
    /// Binds the listeners and starts accepting.
    pub fn start(config: ServerConfig, backend: Arc<dyn Backend>) -> Result<Server, ServerError> {
        check_limits(&config.limits)?;
        if config.unix_socket.is_none() && config.tcp.is_none() {
            return Err(ServerError::NoListener);
        }
        #[cfg(feature = "tls")]
        let tls = match &config.tls {
            Some(s) => Some(tls::TlsAcceptor::new(s)?),
            None => None,
        };
        #[cfg(not(feature = "tls"))]
        if config.tls.is_some() {
            return Err(ServerError::TlsUnavailable);
        }
        if config.tls_mode != TlsMode::Off && config.tls.is_none() {
            return Err(ServerError::TlsNotConfigured {
                mode: config.tls_mode,
            });
        }
        let mut listeners = Vec::new();
        if let Some(path) = &config.unix_socket {
            let l =
                unix_accept_timeout(bind_unix(path)?, ACCEPT_WAKE_INTERVAL).map_err(|source| {
                    ServerError::BindUnix {
                        path: path.clone(),
                        source,
                    }
                })?;
            listeners.push(Listener::Unix(l, path.clone()));
        }
        if let Some(addr) = config.tcp {
            let l = TcpListener::bind(addr)
                .and_then(|l| tcp_accept_timeout(l, ACCEPT_WAKE_INTERVAL))
                .map_err(|source| ServerError::BindTcp { addr, source })?;
            let bound = l
                .local_addr()
                .map_err(|source| ServerError::BindTcp { addr, source })?;
            listeners.push(Listener::Tcp(l, bound));
        }
        let shared = Arc::new(Shared {
            config,
            backend,
            #[cfg(feature = "tls")]
            tls,
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            conns: Mutex::new(HashMap::new()),
            idle: Condvar::new(),
        });
        let mut server = Server {
            shared: Arc::clone(&shared),
            unix_path: None,
            tcp_addr: None,
            acceptors: Vec::new(),
        };
        for l in listeners {
            let shared = Arc::clone(&shared);
            let (name, handle) = match l {
                Listener::Unix(l, path) => {
                    info!(path = %path.display(), "NBD server listening on unix socket");
                    server.unix_path = Some(path);
                    (
                        "nbd-accept-unix",
                        std::thread::Builder::new()
                            .name("nbd-accept-unix".into())
                            .spawn(move || {
                                accept_loop(&shared, || l.accept().map(|(s, _)| Socket::Unix(s)))
                            }),
                    )
                }
                Listener::Tcp(l, addr) => {
                    info!(%addr, "NBD server listening on TCP");
                    server.tcp_addr = Some(addr);
                    (
                        "nbd-accept-tcp",
                        std::thread::Builder::new()
                            .name("nbd-accept-tcp".into())
                            .spawn(move || {
                                accept_loop(&shared, || {
                                    let (s, _) = l.accept()?;
                                    // Small replies must not wait for Nagle.
                                    s.set_nodelay(true)?;
                                    Ok(Socket::Tcp(s))
                                })
                            }),
                    )
                }
            };
            match handle {
                Ok(h) => server.acceptors.push(h),
                Err(source) => {
                    server.stop();
                    return Err(ServerError::Spawn { what: name, source });
                }
            }
        }
        Ok(server)
    }

    /// The unix socket path, if listening on one.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// The bound TCP address (the real port when 0 was asked for).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        self.shared.lock_conns().len()
    }

    /// A handle for counting and closing connections by export, usable after the
    /// server is stopped (it then finds none).
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops accepting, closes every connection and waits (bounded) for
    /// their threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocking accept calls by connecting to ourselves.
        if let Some(p) = &self.unix_path {
            let _ = UnixStream::connect(p);
        }
        if let Some(a) = self.tcp_addr {
            let ip = match a.ip() {
                IpAddr::V4(v) if v.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(v) if v.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
                ip => ip,
            };
            let _ =
                TcpStream::connect_timeout(&SocketAddr::new(ip, a.port()), Duration::from_secs(1));
        }
        for h in self.acceptors.drain(..) {
            let _ = h.join();
        }
        if let Some(p) = &self.unix_path {
            let _ = std::fs::remove_file(p);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut conns = self.shared.lock_conns();
        for c in conns.values() {
            c.closer.close();
        }
        while !conns.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!(
                    open = conns.len(),
                    "connections still open after shutdown deadline"
                );
                break;
            }
            conns = self
                .shared
                .idle
                .wait_timeout(conns, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        info!("NBD server stopped");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Counts and closes a server's connections by export (see [`Server::handle`]).
#[derive(Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle").finish_non_exhaustive()
    }
}

impl ServerHandle {
    /// Connections transmitting on `export`.
    pub fn connections_to(&self, export: ExportId) -> usize {
        self.shared
            .lock_conns()
            .values()
            .filter(|c| c.export == Some(export))
            .count()
    }

    /// Connections transmitting, per export.
    pub fn connections_by_export(&self) -> HashMap<ExportId, usize> {
        let mut out = HashMap::new();
        for e in self.shared.lock_conns().values().filter_map(|c| c.export) {
            *out.entry(e).or_insert(0) += 1;
        }
        out
    }

    /// Ends every connection transmitting on `export` (hard disconnect: requests in
    /// flight complete, their replies are dropped). Returns how many were closed.
    pub fn disconnect(&self, export: ExportId) -> usize {
        let conns = self.shared.lock_conns();
        let mut n = 0;
        for c in conns.values().filter(|c| c.export == Some(export)) {
            c.closer.close();
            n += 1;
        }
        if n > 0 {
            info!(
                export = export.0,
                connections = n,
                "disconnected clients of an export"
            );
        }
        n
    }
}

/// How often a blocked `accept` returns to look for a shutdown. Shutdown wakes the
/// acceptors by connecting to them, but that cannot reach a unix listener whose
/// socket file was removed or replaced; without this bound its thread (and the
/// daemon's stop) would wait forever.
const ACCEPT_WAKE_INTERVAL: Duration = Duration::from_millis(200);

/// Bounds `accept` with SO_RCVTIMEO, which Linux applies to listening sockets.
/// std offers no listener timeouts, so the option is set through a stream view of
/// the same descriptor.
fn unix_accept_timeout(l: UnixListener, t: Duration) -> io::Result<UnixListener> {
    let s = UnixStream::from(OwnedFd::from(l));
    s.set_read_timeout(Some(t))?;
    Ok(UnixListener::from(OwnedFd::from(s)))
}

fn tcp_accept_timeout(l: TcpListener, t: Duration) -> io::Result<TcpListener> {
    let s = TcpStream::from(OwnedFd::from(l));
    s.set_read_timeout(Some(t))?;
    Ok(TcpListener::from(OwnedFd::from(s)))
}

fn accept_loop(shared: &Arc<Shared>, mut accept: impl FnMut() -> io::Result<Socket>) {
    loop {
        let socket = accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let socket = match socket {
            // The wake-up interval passed with no client.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // An accepted TCP socket inherits the listener's timeout; clear it
            // (negotiation sets its own).
            Ok(s) => match s.set_read_timeout(None) {
                Ok(()) => s,
                Err(e) => {
                    debug!(error = %e, "accepted socket unusable");
                    continue;
                }
            },
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let closer = match Closer::new(&socket) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                warn!(error = %e, "cannot clone accepted socket");
                continue;
            }
        };
        {
            let mut conns = shared.lock_conns();
            if conns.len() >= shared.config.limits.connections_max {
                warn!(
                    max = shared.config.limits.connections_max,
                    "connection limit reached; closing new connection"
                );
                closer.close();
                continue;
            }
            conns.insert(
                id,
                Conn {
                    closer: Arc::clone(&closer),
                    export: None,
                },
            );
        }
        let shared2 = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-{id}-rx"))
            .spawn(move || {
                serve(socket, &shared2, Arc::clone(&closer), id);
                closer.close();
                let mut conns = shared2.lock_conns();
                conns.remove(&id);
                shared2.idle.notify_all();
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot spawn connection thread");
            if let Some(c) = shared.lock_conns().remove(&id) {
                c.closer.close();
            }
        }
    }
}

fn serve(socket: Socket, shared: &Arc<Shared>, closer: Arc<Closer>, id: u64) {
    let peer = socket.peer();
    let span = info_span!("nbd_conn", id, peer = %peer);
    let _enter = span.enter();
    debug!("connection accepted");
    let limits = &shared.config.limits;
    if let Err(e) = socket
        .set_read_timeout(Some(limits.handshake_timeout))
        .and_then(|()| socket.set_write_timeout(Some(limits.write_timeout)))
    {
        warn!(error = %e, "cannot set socket timeouts");
        return;
    }
    let result =
        negotiation::negotiate(Transport::Plain(socket), shared).and_then(|(t, outcome)| {
            match outcome {
                Negotiated::Aborted => {
                    debug!("client aborted negotiation");
                    Ok(())
                }
                Negotiated::Transmit(session) => {
                    // Bound before the export is looked up again, so whoever removes
                    // it (hiding it first) either counts this connection or makes the
                    // lookup fail. The export negotiated, not whatever holds its name
                    // now: one deleted and created again meanwhile is another export.
                    shared.bind(id, session.export.id);
                    let export = shared
                        .backend
                        .export(&session.export.name)
                        .filter(|e| e.id == session.export.id)
                        .ok_or_else(|| ConnError::ExportVanished {
                            name: session.export.name.clone(),
                        })?;
                    info!(
                        export = %export.name,
                        structured = session.structured_replies,
                        block_status = session.base_allocation.is_some(),
                        tls = session.tls,
                        flags = format_args!("{:#x}", session.transmission_flags),
                        "transmission started"
                    );
                    transmission::run(t, *session, export, shared, closer, id)
                }
            }
        });
    match result {
        Ok(()) => debug!("connection closed"),
        Err(ConnError::Io { step, source })
            if matches!(
                source.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::NotConnected
            ) =>
        {
            debug!(step, error = %source, "client went away");
        }
        Err(e) => warn!(error = %e, "connection closed on error"),
    }
}
