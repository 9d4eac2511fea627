//! Shared harness of the `daemon_*` end-to-end tests: the real `shale serve` binary on a
//! temp data directory, and the real client tools. A missing client binary fails the
//! test with the package to install (`cargo xtask ci` installs them); nothing is skipped.
#![allow(dead_code)] // each test binary uses a different part of the harness

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

// Not every test binary including this module writes test data.
#[allow(unused_imports)]
pub use shale_testkit::pattern;

pub const MIB: u64 = 1 << 20;
pub const BLOCK: usize = 4096;

/// Log line the daemon prints once every listener is up.
const READY: &str = "shale_daemon::serve: ready";

pub fn shale() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shale"))
}

/// Fails (never skips) when a client tool is missing.
pub fn require(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is missing: install the {package} package (cargo xtask ci does)"
    );
}

/// The byte-granular libnbd script shared with shale-nbd's client tests.
pub const LIBNBD_BYTES_PY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shale-nbd/tests/scripts/libnbd_bytes.py"
);

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

pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

pub fn run(cmd: &mut Command) -> Output {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

pub fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).expect("write file");
}

/// Small sparse devices: a 256 MiB cache of 4 MiB chunks in front of 2 GiB of 16 MiB
/// zones, so compaction starts after ~200 MiB of writes.
pub const SMALL_DEVICES: &[&str] = &[
    "--cache-size",
    "256MiB",
    "--capacity-size",
    "2GiB",
    "--chunk-size",
    "4MiB",
    "--zone-size",
    "16MiB",
    "--default-volume-size",
    "512MiB",
];

/// A daemon on a temp data directory, started and restarted with the same flags.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    args: Vec<String>,
    /// Extra environment of the daemon process.
    env: Vec<(String, OsString)>,
    /// Starts so far; the n-th start is ready when the log holds n ready lines.
    starts: usize,
    /// Wall time of the last start, from spawn to ready.
    pub last_start: Duration,
}

impl Daemon {
    /// The default listeners (the unix socket only), small devices.
    pub fn start() -> Daemon {
        Daemon::start_with(SMALL_DEVICES.iter().map(|s| s.to_string()).collect())
    }

    pub fn start_with(args: Vec<String>) -> Daemon {
        Daemon::start_with_env(args, Vec::new())
    }

    /// Like [`Daemon::start_with`], with extra environment variables for every start.
    pub fn start_with_env(args: Vec<String>, env: Vec<(String, OsString)>) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut d = Daemon {
            dir,
            child: None,
            args,
            env,
            starts: 0,
            last_start: Duration::ZERO,
        };
        d.spawn();
        d
    }

    /// The flags of the next start (after a device was replaced, say).
    pub fn set_args(&mut self, args: Vec<String>) {
        self.args = args;
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the daemon and waits for its ready line (stale sockets of a killed
    /// daemon may still be on disk, so their presence proves nothing).
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        let data = self.data_dir();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("serve.log"))
            .expect("log file");
        let started = Instant::now();
        let child = shale()
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            // Hand-off files beside the test's own (not in /dev/shm, where a killed
            // test daemon would leave them); a test's flags may override it.
            .arg("--handoff-dir")
            .arg(self.dir.path().join("handoff"))
            .args(&self.args)
            // A test run under a service manager must not announce its daemons to it.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn shale serve");
        self.child = Some(child);
        self.starts += 1;
        while self.log().matches(READY).count() < self.starts {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("shale serve exited early ({status}): {}", self.log());
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "daemon did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.last_start = started.elapsed();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// The log from the end of the previous start's ready line: everything the
    /// current start printed (and the previous run's shutdown lines).
    pub fn last_log(&self) -> String {
        let log = self.log();
        let cut = log
            .match_indices(READY)
            .nth(self.starts.saturating_sub(2))
            .filter(|_| self.starts >= 2)
            .map_or(0, |(pos, _)| pos + READY.len());
        log[cut..].to_string()
    }

    /// The TCP address the current start listens on (the daemon logs the bound
    /// address, so `127.0.0.1:0` works).
    pub fn tcp_addr(&self) -> String {
        let log = self.last_log();
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("serving NBD on TCP"))
            .unwrap_or_else(|| panic!("no TCP listener in the log: {log}"));
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .unwrap_or_else(|| panic!("no addr= in {line:?}"));
        addr.to_string()
    }

    pub fn socket(&self) -> PathBuf {
        self.data_dir().join("nbd.sock")
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket().display())
    }

    pub fn admin(&self, args: &[&str]) -> String {
        stdout(shale().args(args).arg("--data-dir").arg(self.data_dir()))
    }

    pub fn stats(&self) -> serde_json::Value {
        let s = self.admin(&["stats", "--json"]);
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("stats json {e}: {s}"))
    }

    /// SIGTERM and wait: the daemon must exit 0 after a clean shutdown.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = c.id().to_string();
        run(Command::new("kill").args(["-TERM", &pid]));
        let start = Instant::now();
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                assert!(status.success(), "exit {status}: {}", self.log());
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "daemon did not stop: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(self.log().contains("clean shutdown"), "{}", self.log());
    }

    /// True once the daemon process has exited (its status is kept for `wait_exit`).
    pub fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Waits (bounded) for the daemon to exit on its own, and returns how it exited.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("daemon not running");
        let start = Instant::now();
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                return status;
            }
            if start.elapsed() > limit {
                let _ = c.kill();
                let _ = c.wait();
                panic!("daemon still running after {limit:?}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no drain, no checkpoint, no clean flag.
    pub fn kill9(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        c.kill().expect("SIGKILL");
        let status = c.wait().expect("wait");
        assert!(!status.success(), "daemon survived SIGKILL: {status}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `shale serve ARGS` that must refuse to start: its stderr. A daemon that starts
/// instead is killed and the test fails.
pub fn serve_refused(args: &[&str]) -> String {
    let mut child = shale()
        .arg("serve")
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shale serve");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "shale serve {args:?} started instead of refusing: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait");
    assert!(!out.status.success(), "shale serve {args:?} exited 0");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The TCP ports process `pid` listens on, with their local addresses as
/// `/proc/net/tcp{,6}` print them (hex, e.g. `0100007F` for 127.0.0.1): its socket
/// descriptors' inodes matched against listening (state `0A`) entries of its own
/// network namespace. No `ss` or connection attempt needed, so another process on
/// the same port cannot confuse it.
pub fn tcp_listeners(pid: u32) -> Vec<(String, u16)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("read the daemon's fds");
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut found = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            let (ip, port) = f[1].rsplit_once(':').expect("address:port");
            found.push((
                ip.to_string(),
                u16::from_str_radix(port, 16).expect("hex port"),
            ));
        }
    }
    found
}

/// Permission bits of a file, directory or socket.
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// A client process running in the background, killed when dropped.
pub struct Background {
    pub child: Child,
}

impl Background {
    pub fn spawn(cmd: &mut Command) -> Background {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        Background { child }
    }

    pub fn still_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a whole export into memory with nbdcopy.
pub fn read_export(uri: &str, scratch: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(scratch);
    run(Command::new("nbdcopy").arg(uri).arg(scratch));
    std::fs::read(scratch).expect("read copy")
}

/// The first 4 KiB block where `got` and `want` differ, if any.
pub fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()) / BLOCK);
    }
    got.chunks(BLOCK)
        .zip(want.chunks(BLOCK))
        .position(|(a, b)| a != b)
}
