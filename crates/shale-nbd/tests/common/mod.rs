//! Test fixtures: an in-process server over a MemBackend on a temp unix
//! socket and an ephemeral TCP port, helpers to run real client binaries with
//! a deadline, and a minimal raw NBD client built on the crate's own codecs.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use shale_nbd::proto::consts::*;
use shale_nbd::proto::reply::{Chunk, ReplyHeader, CHUNK_HEADER_BYTES, SIMPLE_REPLY_HEADER_BYTES};
use shale_nbd::proto::{
    ClientFlags, ClientOption, Greeting, InfoReply, InfoRequest, MetaContextRequest, OptionReply,
    OptionReplyHeader, RequestHeader,
};
use shale_nbd::{MemBackend, MemBackendConfig, MemExportSpec, Server, ServerConfig};
pub use shale_testkit::pattern;

pub const INSTALL_HINT: &str =
    "install with: apt-get install -y fio libnbd-bin nbdfuse python3-libnbd qemu-utils";

pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("SHALE_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
    });
}

/// A running server with its backend and temp directory.
pub struct Fixture {
    pub server: Server,
    pub backend: Arc<MemBackend>,
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn start(specs: Vec<MemExportSpec>) -> Fixture {
        Fixture::start_with(specs, MemBackendConfig::default(), |_| {})
    }

    pub fn start_with(
        specs: Vec<MemExportSpec>,
        backend_config: MemBackendConfig,
        tweak: impl FnOnce(&mut ServerConfig),
    ) -> Fixture {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let backend = Arc::new(MemBackend::new(specs, backend_config));
        let mut config = ServerConfig {
            unix_socket: Some(dir.path().join("nbd.sock")),
            tcp: Some("127.0.0.1:0".parse().expect("addr")),
            ..ServerConfig::default()
        };
        tweak(&mut config);
        let server = Server::start(config, backend.clone()).expect("server starts");
        Fixture {
            server,
            backend,
            dir,
        }
    }

    pub fn socket(&self) -> &Path {
        self.server.unix_path().expect("unix socket")
    }

    pub fn tcp(&self) -> SocketAddr {
        self.server.tcp_addr().expect("tcp")
    }

    pub fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket().display())
    }

    pub fn tcp_uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.tcp())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Whether `bin` is on PATH.
pub fn have(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

/// The byte-granular libnbd script (see the file), run by [`nbdsh_script`].
pub const LIBNBD_BYTES_PY: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/libnbd_bytes.py");

/// `nbdsh -u uri -c <run the Python file at script>`, compiled under its own name
/// so a failure's traceback names its lines.
///
/// nbdsh is a shell script running the first `python3` on PATH, but the `nbd`
/// module python3-libnbd installs is built for the distribution's python3 next to
/// nbdsh; a pyenv or virtualenv `python3` earlier on PATH would not find it. So
/// nbdsh's own directory goes first.
pub fn nbdsh_script(uri: &str, script: &str) -> Command {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    if let Some(i) = dirs.iter().position(|d| d.join("nbdsh").is_file()) {
        let own = dirs.remove(i);
        dirs.insert(0, own);
    }
    let mut c = Command::new("nbdsh");
    c.env("PATH", std::env::join_paths(dirs).expect("PATH joins"))
        .args(["-u", uri, "-c"])
        .arg(format!(
            "exec(compile(open({script:?}).read(), {script:?}, 'exec'))"
        ));
    c
}

/// Fails the test when a client binary is missing: a test that cannot run must not
/// pass (`cargo xtask ci` installs the clients).
#[macro_export]
macro_rules! require {
    ($($bin:expr),+) => {
        $(
            assert!(
                common::have($bin),
                "`{}` is not installed; {}",
                $bin,
                common::INSTALL_HINT
            );
        )+
    };
}

/// Runs a command with a deadline, killing it if it hangs.
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {desc}: {e}"));
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{desc} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t1.join().expect("stdout thread"),
        stderr: t2.join().expect("stderr thread"),
    }
}

/// Runs and asserts success; returns stdout.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> String {
    let desc = format!("{cmd:?}");
    let out = run(cmd, timeout);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{desc} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

/// A deliberately small NBD client for protocol tests.
pub struct RawClient {
    pub s: Box<dyn ReadWriteSend>,
    pub structured: bool,
}

pub trait ReadWriteSend: Read + Write + Send {
    fn set_timeout(&self, t: Duration);
}

impl ReadWriteSend for UnixStream {
    fn set_timeout(&self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
    }
}

impl ReadWriteSend for TcpStream {
    fn set_timeout(&self, t: Duration) {
        let _ = self.set_read_timeout(Some(t));
    }
}

impl RawClient {
    pub fn unix(path: &Path) -> RawClient {
        let s = UnixStream::connect(path).expect("connect");
        s.set_timeout(Duration::from_secs(10));
        RawClient {
            s: Box::new(s),
            structured: false,
        }
    }

    pub fn tcp(addr: SocketAddr) -> RawClient {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_timeout(Duration::from_secs(10));
        RawClient {
            s: Box::new(s),
            structured: false,
        }
    }

    pub fn read_n(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.s.read_exact(&mut v)?;
        Ok(v)
    }

    /// True if the server closed the connection (EOF or reset) rather than
    /// sending something or leaving it open until the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }

    /// Reads and discards whatever arrives (e.g. a TLS alert) until EOF;
    /// false if the connection stays open until the read timeout.
    pub fn drained_to_close(&mut self) -> bool {
        let mut b = [0u8; 4096];
        for _ in 0..1024 {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    )
                }
            }
        }
        false
    }

    pub fn greeting(&mut self) -> Greeting {
        let g = self.read_n(18).expect("greeting");
        Greeting::decode(&g).expect("valid greeting")
    }

    /// Greeting plus fixed-newstyle + no-zeroes client flags.
    pub fn handshake(&mut self) -> Greeting {
        let g = self.greeting();
        self.s
            .write_all(
                &ClientFlags {
                    fixed_newstyle: true,
                    no_zeroes: true,
                }
                .encode(),
            )
            .expect("flags");
        g
    }

    pub fn send_option(&mut self, o: &ClientOption) {
        let mut b = Vec::new();
        o.encode(&mut b);
        self.s.write_all(&b).expect("send option");
    }

    pub fn option_reply(&mut self) -> (OptionReplyHeader, OptionReply) {
        let h = OptionReplyHeader::decode(&self.read_n(20).expect("reply header"))
            .expect("reply magic");
        let data = self.read_n(h.length as usize).expect("reply data");
        let r = OptionReply::decode(h.reply_type, &data).expect("reply decodes");
        (h, r)
    }

    /// Replies up to and including the final one (ACK or an error).
    pub fn option_replies(&mut self) -> Vec<OptionReply> {
        let mut out = Vec::new();
        loop {
            let (_, r) = self.option_reply();
            let last = matches!(r, OptionReply::Ack | OptionReply::Error { .. });
            out.push(r);
            if last {
                return out;
            }
        }
    }

    /// Full negotiation into transmission: optional structured replies and
    /// base:allocation, then GO. Returns (size, transmission flags).
    pub fn go(&mut self, export: &str, structured: bool) -> (u64, u16) {
        self.handshake();
        if structured {
            self.send_option(&ClientOption::StructuredReply);
            assert_eq!(self.option_replies(), vec![OptionReply::Ack]);
            self.send_option(&ClientOption::SetMetaContext(MetaContextRequest {
                export: export.into(),
                queries: vec![META_BASE_ALLOCATION.into()],
            }));
            let r = self.option_replies();
            assert!(matches!(r[0], OptionReply::MetaContext { .. }), "{r:?}");
            self.structured = true;
        }
        self.send_option(&ClientOption::Go(InfoRequest {
            name: export.into(),
            info_requests: vec![INFO_BLOCK_SIZE],
        }));
        let mut export_info = None;
        for r in self.option_replies() {
            match r {
                OptionReply::Info(InfoReply::Export {
                    size_bytes,
                    transmission_flags,
                }) => export_info = Some((size_bytes, transmission_flags)),
                OptionReply::Error {
                    reply_type,
                    message,
                } => panic!("GO failed: {reply_type:#x} {message}"),
                _ => {}
            }
        }
        export_info.expect("NBD_INFO_EXPORT")
    }

    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) {
        let h = RequestHeader {
            flags,
            kind,
            cookie,
            offset,
            length,
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b).expect("send request");
    }

    /// Reads one complete reply. `read_len` is the data length expected for a
    /// simple reply to a successful read. Returns (cookie, error, data, chunks).
    pub fn reply(&mut self, read_len: Option<u32>) -> std::io::Result<RawReply> {
        let magic = self.read_n(4)?;
        let m = u32::from_be_bytes([magic[0], magic[1], magic[2], magic[3]]);
        let hlen =
            ReplyHeader::bytes_for_magic(m).unwrap_or_else(|| panic!("bad reply magic {m:#x}"));
        let mut hb = magic;
        hb.extend(self.read_n(hlen - 4)?);
        match ReplyHeader::decode(&hb).expect("reply header") {
            ReplyHeader::Simple(s) => {
                assert_eq!(hlen, SIMPLE_REPLY_HEADER_BYTES);
                let data = match (s.error, read_len) {
                    (0, Some(n)) => self.read_n(n as usize)?,
                    _ => Vec::new(),
                };
                Ok(RawReply {
                    cookie: s.cookie,
                    error: s.error,
                    data,
                    chunks: Vec::new(),
                })
            }
            ReplyHeader::Chunk(first) => {
                assert_eq!(hlen, CHUNK_HEADER_BYTES);
                let mut chunks = Vec::new();
                let mut h = first;
                loop {
                    let payload = self.read_n(h.length as usize)?;
                    let c = Chunk::decode(&h, &payload).expect("chunk decodes");
                    chunks.push(c);
                    if h.done() {
                        break;
                    }
                    let hb = self.read_n(CHUNK_HEADER_BYTES)?;
                    let ReplyHeader::Chunk(next) = ReplyHeader::decode(&hb).expect("chunk header")
                    else {
                        panic!("simple reply inside a structured reply")
                    };
                    assert_eq!(
                        next.cookie, first.cookie,
                        "interleaved chunks in single-request test"
                    );
                    h = next;
                }
                let error = chunks
                    .iter()
                    .find_map(|c| match c {
                        Chunk::Error { error, .. } | Chunk::ErrorOffset { error, .. } => {
                            Some(*error)
                        }
                        _ => None,
                    })
                    .unwrap_or(0);
                let mut data = Vec::new();
                for c in &chunks {
                    match c {
                        Chunk::OffsetData { data: d, .. } => data.extend_from_slice(d),
                        Chunk::OffsetHole { size, .. } => {
                            data.extend(std::iter::repeat_n(0u8, *size as usize))
                        }
                        _ => {}
                    }
                }
                Ok(RawReply {
                    cookie: first.cookie,
                    error,
                    data,
                    chunks,
                })
            }
        }
    }
}

#[derive(Debug)]
pub struct RawReply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
    pub chunks: Vec<Chunk>,
}

pub fn mem_spec(name: &str, size: u64) -> MemExportSpec {
    MemExportSpec::new(name, size)
}

pub const MIB: u64 = 1 << 20;
