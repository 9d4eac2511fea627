//! The admin socket: `shale volume ...` and `shale stats` talk to a running daemon.
//!
//! Protocol: one JSON object per line each way over a unix socket created with mode
//! 0600. A request is `{"op": "...", ...}`; the reply is `{"ok": true, "result": ...}`
//! or `{"ok": false, "error": "..."}`. A line longer than [`REQUEST_BYTES_MAX`] or
//! not valid JSON gets an error reply and the connection is closed; nothing else is
//! disturbed.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bound on one request line; volume names are short, so this is generous.
pub const REQUEST_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    VolumeCreate {
        name: String,
        size_bytes: u64,
    },
    VolumeList,
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

fn accept_loop(listener: UnixListener, handler: Arc<dyn AdminHandler>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let handler = handler.clone();
                // One short-lived thread per admin client: admin traffic is rare and a
                // slow client must not hold up the next one.
                let _ = std::thread::Builder::new()
                    .name("shale-admin-conn".into())
                    .spawn(move || serve_connection(stream, &*handler));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "admin socket accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn serve_connection(stream: UnixStream, handler: &dyn AdminHandler) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
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

fn reply(w: &mut UnixStream, result: Result<serde_json::Value, String>) -> std::io::Result<()> {
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
    w.write_all(&text).map_err(io)?;
    let mut line = String::new();
    BufReader::new(stream)
        .take(16 * 1024 * 1024)
        .read_line(&mut line)
        .map_err(io)?;
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
                AdminRequest::VolumeCreate { name, size_bytes } => {
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

    #[test]
    fn live_socket_is_not_stolen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.sock");
        let _a = AdminServer::start(&path, Arc::new(Volumes::default())).expect("start");
        assert!(AdminServer::start(&path, Arc::new(Volumes::default())).is_err());
    }
}
