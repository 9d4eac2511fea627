//! The admin socket: `shale volume ...` and `shale stats` talk to a running daemon.
//!
//! Protocol: one JSON object per line each way over a unix socket created with mode
//! 0600. A request is `{"op": "...", ...}`; the reply is `{"ok": true, "result": ...}`
//! or `{"ok": false, "error": "..."}`. A line longer than [`REQUEST_BYTES_MAX`] or
//! not valid JSON gets an error reply and the connection is closed; nothing else is
//! disturbed.
//!
//! Each client has a thread, at most [`ADMIN_CONNECTIONS_MAX`] at once; one more
//! gets the error reply `too many admin connections` and is closed. A client silent
//! for [`IDLE_TIMEOUT`] is disconnected. Dropping the [`AdminServer`] shuts every
//! connection's socket down (shutdown(2): a blocked read returns end-of-file at
//! once) and joins the threads, so when it returns no connection still holds the
//! handler, and through it the engine, which the daemon's stop waits to own.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bound on one request line; volume names are short, so this is generous.
pub const REQUEST_BYTES_MAX: usize = 64 * 1024;
/// Admin clients served at once. Admin traffic is a person or a script, and each
/// client costs a thread, so a handful is plenty.
pub const ADMIN_CONNECTIONS_MAX: usize = 8;
/// A client that sends nothing (or reads nothing) for this long is disconnected.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the acceptor sleeps when no client is waiting; a stop is seen this fast.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    /// `iops_max` / `mibps_max`: the volume's rate limits; `cache_share_pct`: its
    /// share of the cache (absent or 0: none); `gc`: its GC policy.
    VolumeCreate {
        name: String,
        size_bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iops_max: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mibps_max: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_share_pct: Option<u8>,
        /// `greedy`, `cost-benefit` or `pool`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gc: Option<String>,
        /// The mapping unit in bytes, 4096 (the default) to 65536.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map_unit_bytes: Option<u64>,
        /// Dual mapped: the unit map (64 KiB units unless `map_unit_bytes` says)
        /// with a sparse map of 4 KiB blocks over it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dual_map: Option<bool>,
    },
    VolumeList,
    /// Changes a volume's rate limits, cache share and GC policy: each given one is
    /// set (0 or `pool` removes it), the others stay. Applies at once.
    VolumeSet {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iops_max: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mibps_max: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cache_share_pct: Option<u8>,
        /// `greedy`, `cost-benefit` or `pool`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gc: Option<String>,
    },
    /// Shrinking a volume with connected clients is refused unless `force`, which
    /// disconnects them first (a client's view of the size is fixed at connect).
    VolumeResize {
        name: String,
        size_bytes: u64,
        #[serde(default)]
        force: bool,
    },
    /// Refused while clients are connected unless `force`, which disconnects them.
    VolumeDelete {
        name: String,
        #[serde(default)]
        force: bool,
    },
    Stats,
    Checkpoint,
    DeviceList,
    /// Takes an array member out of service (`device`: its path, or its slot).
    DeviceFail {
        device: String,
    },
    /// Puts `new` in `old`'s place and rebuilds it.
    DeviceReplace {
        old: String,
        new: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdminReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the daemon does with admin requests.
pub trait AdminHandler: Send + Sync + 'static {
    fn handle(&self, req: AdminRequest) -> Result<serde_json::Value, String>;
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("admin socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("admin socket {path}: is shale serve running? ({source})")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("admin socket {path}: {reason}")]
    Bind { path: PathBuf, reason: String },
    #[error("admin reply: {0}")]
    BadReply(String),
    #[error("{0}")]
    Remote(String),
}

/// A listening admin socket; dropping it stops accepting and removes the socket file.
#[derive(Debug)]
pub struct AdminServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AdminServer {
    pub fn start(path: &Path, handler: Arc<dyn AdminHandler>) -> Result<AdminServer, AdminError> {
        let err = |source| AdminError::Socket {
            path: path.to_path_buf(),
            source,
        };
        // Mode 0600 from the first moment, stale sockets replaced, live ones refused.
        let listener = shale_nbd::bind_unix(path).map_err(|e| AdminError::Bind {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        listener.set_nonblocking(true).map_err(err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("shale-admin".into())
            .spawn(move || accept_loop(listener, handler, stop2))
            .map_err(err)?;
        Ok(AdminServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A connection's thread and a handle on its socket to shut it down with.
struct Connection {
    stream: UnixStream,
    thread: JoinHandle<()>,
}

fn accept_loop(listener: UnixListener, handler: Arc<dyn AdminHandler>, stop: Arc<AtomicBool>) {
    let mut connections: Vec<Connection> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                // A finished thread has already dropped its handler; forget it.
                connections.retain(|c| !c.thread.is_finished());
                if connections.len() >= ADMIN_CONNECTIONS_MAX {
                    tracing::warn!(
                        connections_max = ADMIN_CONNECTIONS_MAX,
                        "admin connection refused: too many admin connections"
                    );
                    refuse(&stream);
                    continue;
                }
                match spawn_connection(stream, Arc::clone(&handler)) {
                    Ok(c) => connections.push(c),
                    Err(e) => tracing::warn!(error = %e, "admin connection dropped"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL);
            }
            Err(e) => {
                tracing::warn!(error = %e, "admin socket accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // An idle client would otherwise keep its thread, and the engine, for up to the
    // idle timeout: end-of-file wakes its read now. A request being handled finishes.
    for c in &connections {
        let _ = c.stream.shutdown(Shutdown::Both);
    }
    for c in connections {
        let _ = c.thread.join();
    }
}

fn spawn_connection(
    stream: UnixStream,
    handler: Arc<dyn AdminHandler>,
) -> std::io::Result<Connection> {
    let ours = stream.try_clone()?;
    let thread = std::thread::Builder::new()
        .name("shale-admin-conn".into())
        .spawn(move || {
            serve_connection(&stream, &*handler);
            // The acceptor's clone keeps the socket open until it is reaped; the
            // client must see the end of the connection now.
            let _ = stream.shutdown(Shutdown::Both);
        })?;
    Ok(Connection {
        stream: ours,
        thread,
    })
}

/// Tells a client over the limit why, and closes it.
fn refuse(stream: &UnixStream) {
    // The reply is one short line into an empty socket buffer; the timeout only
    // guards the acceptor against the impossible.
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let mut w = stream;
    let _ = reply(
        &mut w,
        Err(format!(
            "too many admin connections (at most {ADMIN_CONNECTIONS_MAX}); try again later"
        )),
    );
    let _ = stream.shutdown(Shutdown::Both);
}

fn serve_connection(stream: &UnixStream, handler: &dyn AdminHandler) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IDLE_TIMEOUT));
    let mut writer = stream;
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        // `Take` over the BufReader keeps read-ahead bytes for the next request.
        let mut limited = (&mut reader).take(REQUEST_BYTES_MAX as u64 + 1);
        match limited.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(_) => return,
        }
        if line.len() > REQUEST_BYTES_MAX {
            let _ = reply(&mut writer, Err("request line too long".into()));
            return;
        }
        let parsed: Result<AdminRequest, _> = serde_json::from_slice(&line);
        match parsed {
            Ok(req) => {
                tracing::info!(?req, "admin request");
                let result = handler.handle(req);
                if reply(&mut writer, result).is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "malformed admin request");
                let _ = reply(&mut writer, Err(format!("malformed request: {e}")));
                return;
            }
        }
    }
}

fn reply(w: &mut impl Write, result: Result<serde_json::Value, String>) -> std::io::Result<()> {
    let r = match result {
        Ok(v) => AdminReply {
            ok: true,
            result: Some(v),
            error: None,
        },
        Err(e) => AdminReply {
            ok: false,
            result: None,
            error: Some(e),
        },
    };
    let mut text = serde_json::to_vec(&r).map_err(std::io::Error::other)?;
    text.push(b'\n');
    w.write_all(&text)
}

/// Sends one request to the daemon at `path` and returns its result.
pub fn call(path: &Path, req: &AdminRequest) -> Result<serde_json::Value, AdminError> {
    let stream = UnixStream::connect(path).map_err(|source| AdminError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    let io = |source| AdminError::Socket {
        path: path.to_path_buf(),
        source,
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(600)))
        .map_err(io)?;
    let mut w = stream.try_clone().map_err(io)?;
    let mut text = serde_json::to_vec(req).map_err(|e| AdminError::BadReply(e.to_string()))?;
    text.push(b'\n');
    // A daemon refusing the connection (too many clients) replies and closes without
    // reading, so a failed write may still have a reply waiting behind it.
    let written = w.write_all(&text);
    let mut line = String::new();
    let read = BufReader::new(stream)
        .take(16 * 1024 * 1024)
        .read_line(&mut line);
    if line.is_empty() {
        written.map_err(io)?;
        read.map_err(io)?;
    }
    let reply: AdminReply =
        serde_json::from_str(&line).map_err(|e| AdminError::BadReply(e.to_string()))?;
    if reply.ok {
        Ok(reply.result.unwrap_or(serde_json::Value::Null))
    } else {
        Err(AdminError::Remote(
            reply.error.unwrap_or_else(|| "unknown error".into()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Volumes(Mutex<Vec<(String, u64)>>);

    impl AdminHandler for Volumes {
        fn handle(&self, req: AdminRequest) -> Result<serde_json::Value, String> {
            let mut v = self.0.lock().map_err(|e| e.to_string())?;
            match req {
                AdminRequest::VolumeCreate {
                    name, size_bytes, ..
                } => {
                    if v.iter().any(|(n, _)| *n == name) {
                        return Err(format!("volume {name:?} exists"));
                    }
                    v.push((name, size_bytes));
                    Ok(serde_json::Value::Null)
                }
                AdminRequest::VolumeList => Ok(serde_json::json!(*v)),
                _ => Err("unsupported".into()),
            }
        }
    }

    #[test]
    fn request_reply_and_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.sock");
        let server = AdminServer::start(&path, Arc::new(Volumes::default())).expect("start");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let create = AdminRequest::VolumeCreate {
            name: "a".into(),
            size_bytes: 4096,
            iops_max: None,
            mibps_max: None,
            cache_share_pct: None,
            gc: None,
            map_unit_bytes: None,
            dual_map: None,
        };
        call(&path, &create).expect("create");
        assert!(matches!(call(&path, &create), Err(AdminError::Remote(_))));
        let list = call(&path, &AdminRequest::VolumeList).expect("list");
        assert_eq!(list, serde_json::json!([["a", 4096]]));

        // Garbage gets an error reply, and the server keeps serving.
        let mut s = UnixStream::connect(&path).expect("connect");
        s.write_all(b"{not json}\n").expect("write");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).expect("read");
        let r: AdminReply = serde_json::from_str(&line).expect("reply");
        assert!(!r.ok);
        call(&path, &AdminRequest::VolumeList).expect("still serving");

        // Two pipelined requests on one connection both get replies.
        let mut s = UnixStream::connect(&path).expect("connect");
        s.write_all(b"{\"op\":\"volume_list\"}\n{\"op\":\"volume_list\"}\n")
            .expect("write");
        let mut r = BufReader::new(s);
        for _ in 0..2 {
            let mut line = String::new();
            r.read_line(&mut line).expect("read");
            let reply: AdminReply = serde_json::from_str(&line).expect("reply");
            assert!(reply.ok, "{line}");
        }
        drop(server);
        assert!(!path.exists());
        assert!(matches!(
            call(&path, &AdminRequest::VolumeList),
            Err(AdminError::Connect { .. })
        ));
    }

    /// A client that has had one reply (so its connection thread exists) and then
    /// says nothing.
    fn served_idle_client(path: &Path) -> UnixStream {
        let s = UnixStream::connect(path).expect("connect");
        (&s).write_all(b"{\"op\":\"volume_list\"}\n")
            .expect("write");
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).expect("read");
        let r: AdminReply = serde_json::from_str(&line).expect("reply");
        assert!(r.ok, "{line}");
        s
    }

    #[test]
    fn connections_beyond_the_bound_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.sock");
        let _server = AdminServer::start(&path, Arc::new(Volumes::default())).expect("start");
        let mut idle: Vec<UnixStream> = (0..ADMIN_CONNECTIONS_MAX)
            .map(|_| served_idle_client(&path))
            .collect();
        match call(&path, &AdminRequest::VolumeList) {
            Err(AdminError::Remote(m)) => assert!(m.contains("too many admin connections"), "{m}"),
            other => panic!("one client over the bound was served: {other:?}"),
        }
        // A client leaving frees its slot.
        drop(idle.pop());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match call(&path, &AdminRequest::VolumeList) {
                Ok(_) => break,
                Err(AdminError::Remote(m))
                    if m.contains("too many") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("freed slot not reused: {e}"),
            }
        }
    }

    #[test]
    fn drop_returns_promptly_and_releases_the_handler_with_idle_clients() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.sock");
        let handler = Arc::new(Volumes::default());
        let server = AdminServer::start(&path, handler.clone()).expect("start");
        let served = served_idle_client(&path);
        let half = UnixStream::connect(&path).expect("connect");
        (&half).write_all(b"{\"op\":").expect("write");
        let _silent = UnixStream::connect(&path).expect("connect");
        // The acceptor takes clients in order: once a later one is served, the three
        // above have their threads, each holding the handler.
        call(&path, &AdminRequest::VolumeList).expect("list");
        assert!(Arc::strong_count(&handler) >= 5, "connections not running");

        let started = std::time::Instant::now();
        drop(server);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "drop took {took:?}");
        assert_eq!(
            Arc::strong_count(&handler),
            1,
            "a connection thread outlived the server"
        );
        // The idle client sees the end of its connection.
        served
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut rest = Vec::new();
        assert_eq!((&served).read_to_end(&mut rest).expect("eof"), 0);
    }

    #[test]
    fn a_closed_connection_reaches_the_client() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.sock");
        let _server = AdminServer::start(&path, Arc::new(Volumes::default())).expect("start");
        let s = UnixStream::connect(&path).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        (&s).write_all(b"{not json}\n").expect("write");
        // The server closes after the error reply while its acceptor still holds the
        // socket: the client reads the reply, then end-of-file (not a timeout).
        let mut all = String::new();
        (&s).read_to_string(&mut all)
            .expect("reply then end of file");
        assert!(all.contains("malformed request"), "{all}");
    }

    #[test]
    fn live_socket_is_not_stolen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.sock");
        let _a = AdminServer::start(&path, Arc::new(Volumes::default())).expect("start");
        assert!(AdminServer::start(&path, Arc::new(Volumes::default())).is_err());
    }
}
