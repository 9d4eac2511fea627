//! The systemd readiness protocol (`sd_notify(3)`), by hand: newline-separated
//! `KEY=value` assignments in one datagram to the unix socket named by
//! `NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace).
//!
//! The daemon says `READY=1` once its devices are open (cleanly or by recovery) and
//! its listeners are up, with a `STATUS=` summary of the open and its `MAINPID=`;
//! `STOPPING=1` when a stop request starts the drain; and `WATCHDOG=1` at half the
//! interval systemd passes in `WATCHDOG_USEC`.
//!
//! Notifications are best effort: without `NOTIFY_SOCKET` they are off, and a
//! socket that cannot be reached is logged once at warn level and never fails the
//! daemon (it is serving either way; systemd's start timeout is the judge).

use std::ffi::{OsStr, OsString};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

/// Longest a notification may wait for room in the receiver's queue: systemd reads
/// its socket promptly, and a wedged receiver must not stall the daemon's stop.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET={addr:?}: neither an absolute path nor @abstract name")]
    Unsupported { addr: OsString },
    #[error("NOTIFY_SOCKET={addr:?}: {source}")]
    Address {
        addr: OsString,
        #[source]
        source: std::io::Error,
    },
    #[error("notify socket {addr:?}: creating a datagram socket: {source}")]
    Socket {
        addr: OsString,
        #[source]
        source: std::io::Error,
    },
    #[error("notify socket {addr:?}: sending: {source}")]
    Send {
        addr: OsString,
        #[source]
        source: std::io::Error,
    },
}

/// The protocol's environment variables, read once at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyEnv {
    /// `NOTIFY_SOCKET`: where to send notifications.
    pub socket: Option<OsString>,
    /// `WATCHDOG_USEC`: the watchdog timeout in microseconds.
    pub watchdog_usec: Option<OsString>,
    /// `WATCHDOG_PID`: the process the watchdog is meant for.
    pub watchdog_pid: Option<OsString>,
}

impl NotifyEnv {
    pub fn read() -> NotifyEnv {
        NotifyEnv {
            socket: std::env::var_os("NOTIFY_SOCKET"),
            watchdog_usec: std::env::var_os("WATCHDOG_USEC"),
            watchdog_pid: std::env::var_os("WATCHDOG_PID"),
        }
    }
}

/// Sends notifications to the service manager, if there is one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<Target>,
    pid: u32,
    /// Half of `WATCHDOG_USEC`, when the watchdog is for this process.
    watchdog_interval: Option<Duration>,
    last_watchdog: Option<Instant>,
    /// A failure has been logged; later ones are not (a daemon run outside systemd
    /// with a stale NOTIFY_SOCKET would otherwise warn on every watchdog tick).
    warned: bool,
}

#[derive(Debug)]
struct Target {
    text: OsString,
    addr: SocketAddr,
    /// Created on first use.
    socket: Option<UnixDatagram>,
}

impl Notifier {
    /// A notifier configured from this process's environment (nothing is unset:
    /// children of the daemon, if it ever has any, are not systemd's business).
    pub fn from_env() -> Notifier {
        Notifier::new(&NotifyEnv::read(), std::process::id())
    }

    /// A notifier for the process `pid` (the `MAINPID` it announces and the
    /// `WATCHDOG_PID` it accepts).
    pub fn new(env: &NotifyEnv, pid: u32) -> Notifier {
        let mut n = Notifier {
            target: None,
            pid,
            watchdog_interval: None,
            last_watchdog: None,
            warned: false,
        };
        let Some(text) = env.socket.as_deref().filter(|s| !s.is_empty()) else {
            return n;
        };
        match parse_addr(text) {
            Ok(addr) => {
                n.target = Some(Target {
                    text: text.to_os_string(),
                    addr,
                    socket: None,
                })
            }
            Err(e) => n.warn(&e),
        }
        n.watchdog_interval = watchdog_interval(env, pid);
        n
    }

    /// True if notifications go somewhere.
    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// The interval `WATCHDOG=1` is sent at, if the watchdog is on.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog_interval.filter(|_| self.is_enabled())
    }

    /// Startup is complete: the devices are open and every listener is up.
    pub fn ready(&mut self, status: &str) {
        let msg = format!("READY=1\nSTATUS={}\nMAINPID={}", one_line(status), self.pid);
        self.send(&msg);
    }

    /// A stop request was taken: draining and checkpointing from here on.
    pub fn stopping(&mut self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    /// The free-form status line `systemctl status` shows.
    pub fn status(&mut self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    /// Sends `WATCHDOG=1` when the interval has passed since the last one; call it
    /// from the loop that proves the daemon alive, more often than the interval.
    pub fn watchdog(&mut self) {
        self.watchdog_at(Instant::now());
    }

    fn watchdog_at(&mut self, now: Instant) {
        let Some(interval) = self.watchdog_interval() else {
            return;
        };
        let due = self
            .last_watchdog
            .is_none_or(|last| now.saturating_duration_since(last) >= interval);
        if due {
            self.last_watchdog = Some(now);
            self.send("WATCHDOG=1");
        }
    }

    fn send(&mut self, msg: &str) {
        let Some(target) = self.target.as_mut() else {
            return;
        };
        if let Err(e) = target.send(msg.as_bytes()) {
            self.warn(&e);
        }
    }

    fn warn(&mut self, e: &NotifyError) {
        if self.warned {
            tracing::debug!(error = %e, "systemd notification not sent");
        } else {
            self.warned = true;
            tracing::warn!(error = %e, "systemd notification not sent (reported once)");
        }
    }
}

impl Target {
    fn send(&mut self, msg: &[u8]) -> Result<(), NotifyError> {
        let socket = match &mut self.socket {
            Some(s) => s,
            None => {
                let err = |source| NotifyError::Socket {
                    addr: self.text.clone(),
                    source,
                };
                let s = UnixDatagram::unbound().map_err(err)?;
                s.set_write_timeout(Some(SEND_TIMEOUT)).map_err(err)?;
                self.socket.insert(s)
            }
        };
        socket
            .send_to_addr(msg, &self.addr)
            .map(drop)
            .map_err(|source| NotifyError::Send {
                addr: self.text.clone(),
                source,
            })
    }
}

/// `/path` or `@abstract-name`, as `sd_notify` takes them.
fn parse_addr(text: &OsStr) -> Result<SocketAddr, NotifyError> {
    let bytes = text.as_bytes();
    let made = match bytes.first() {
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]),
        Some(b'/') => SocketAddr::from_pathname(text),
        _ => {
            return Err(NotifyError::Unsupported {
                addr: text.to_os_string(),
            })
        }
    };
    made.map_err(|source| NotifyError::Address {
        addr: text.to_os_string(),
        source,
    })
}

/// Half of `WATCHDOG_USEC` (systemd's advice), unless `WATCHDOG_PID` names another
/// process or the timeout is missing, zero or not a number.
fn watchdog_interval(env: &NotifyEnv, pid: u32) -> Option<Duration> {
    if let Some(p) = &env.watchdog_pid {
        if p.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(pid) {
            return None;
        }
    }
    let usec: u64 = env.watchdog_usec.as_ref()?.to_str()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// A newline would end the assignment and start another (an error message could
/// otherwise say `READY=1`), so a status is kept to one line.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The `STATUS=` text after an open: clean or dirty recovery, how long it took,
/// what it read and what recovery replayed.
pub fn open_status(r: &shale_engine::OpenReport, wall: Duration) -> String {
    let ms = wall.as_secs_f64() * 1e3;
    let mib = r.bytes_read() as f64 / f64::from(1u32 << 20);
    let mut s = if r.clean {
        format!("serving; opened after a clean shutdown in {ms:.0} ms (read {mib:.1} MiB)")
    } else {
        let c = &r.replay;
        format!(
            "serving; dirty recovery in {ms:.0} ms (read {mib:.1} MiB): replayed {} journal \
             entries, scanned {} regions ({} md groups), mapped {} versions ({} superseded), \
             {} trims, {} stray zones reset",
            c.journal_entries,
            c.regions_scanned,
            c.md_groups_read,
            c.entries_applied,
            c.entries_superseded,
            c.trims,
            c.stray_zones_reset
        )
    };
    if !r.warnings.is_empty() {
        s.push_str(&format!("; warnings: {} (see the log)", r.warnings.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn env(socket: &str) -> NotifyEnv {
        NotifyEnv {
            socket: Some(socket.into()),
            ..NotifyEnv::default()
        }
    }

    fn listener(dir: &Path) -> (UnixDatagram, String) {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind");
        sock.set_nonblocking(true).expect("nonblocking");
        (sock, path.to_string_lossy().into_owned())
    }

    fn recv(sock: &UnixDatagram) -> Option<String> {
        let mut buf = [0u8; 4096];
        match sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => panic!("recv: {e}"),
        }
    }

    #[test]
    fn sends_the_exact_datagrams() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sock, path) = listener(dir.path());
        let mut n = Notifier::new(&env(&path), 4242);
        assert!(n.is_enabled());
        assert_eq!(n.watchdog_interval(), None);
        n.ready("serving; opened after a clean shutdown in 3 ms");
        assert_eq!(
            recv(&sock).as_deref(),
            Some("READY=1\nSTATUS=serving; opened after a clean shutdown in 3 ms\nMAINPID=4242")
        );
        n.status("checkpointing");
        assert_eq!(recv(&sock).as_deref(), Some("STATUS=checkpointing"));
        n.stopping("draining");
        assert_eq!(recv(&sock).as_deref(), Some("STOPPING=1\nSTATUS=draining"));
        // No watchdog was asked for, so none is sent.
        n.watchdog();
        assert_eq!(recv(&sock), None);
        assert!(!n.warned);
    }

    #[test]
    fn a_status_cannot_smuggle_assignments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sock, path) = listener(dir.path());
        let mut n = Notifier::new(&env(&path), 1);
        n.status("bad device\nREADY=1\r\nMAINPID=9");
        assert_eq!(
            recv(&sock).as_deref(),
            Some("STATUS=bad device READY=1  MAINPID=9")
        );
    }

    #[test]
    fn abstract_socket() {
        let name = format!("shale-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let sock = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        sock.set_nonblocking(true).expect("nonblocking");
        let mut n = Notifier::new(&env(&format!("@{name}")), 7);
        n.ready("up");
        assert_eq!(
            recv(&sock).as_deref(),
            Some("READY=1\nSTATUS=up\nMAINPID=7")
        );
        assert!(!n.warned);
    }

    #[test]
    fn watchdog_at_half_the_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sock, path) = listener(dir.path());
        let e = NotifyEnv {
            watchdog_usec: Some("1000000".into()),
            ..env(&path)
        };
        let mut n = Notifier::new(&e, 5);
        assert_eq!(n.watchdog_interval(), Some(Duration::from_millis(500)));
        let t0 = Instant::now();
        n.watchdog_at(t0);
        assert_eq!(recv(&sock).as_deref(), Some("WATCHDOG=1"));
        n.watchdog_at(t0 + Duration::from_millis(499));
        assert_eq!(recv(&sock), None);
        n.watchdog_at(t0 + Duration::from_millis(500));
        assert_eq!(recv(&sock).as_deref(), Some("WATCHDOG=1"));
        n.watchdog_at(t0 + Duration::from_millis(900));
        assert_eq!(recv(&sock), None);
        n.watchdog_at(t0 + Duration::from_millis(1000));
        assert_eq!(recv(&sock).as_deref(), Some("WATCHDOG=1"));
    }

    #[test]
    fn watchdog_only_for_its_pid_and_a_valid_timeout() {
        let with = |usec: Option<&str>, pid: Option<&str>| NotifyEnv {
            watchdog_usec: usec.map(Into::into),
            watchdog_pid: pid.map(Into::into),
            ..env("/nonexistent/notify.sock")
        };
        let interval = |e: &NotifyEnv| Notifier::new(e, 100).watchdog_interval();
        let half = Some(Duration::from_secs(3));
        assert_eq!(interval(&with(Some("6000000"), None)), half);
        assert_eq!(interval(&with(Some("6000000"), Some("100"))), half);
        assert_eq!(interval(&with(Some("6000000"), Some("101"))), None);
        assert_eq!(interval(&with(Some("6000000"), Some("x"))), None);
        assert_eq!(interval(&with(Some("0"), None)), None);
        assert_eq!(interval(&with(Some("soon"), None)), None);
        assert_eq!(interval(&with(None, Some("100"))), None);
        // Without a socket there is nobody to ping.
        let mut e = with(Some("6000000"), None);
        e.socket = None;
        assert_eq!(interval(&e), None);
    }

    #[test]
    fn off_without_a_socket_and_quiet_when_unreachable() {
        let mut off = Notifier::new(&NotifyEnv::default(), 1);
        assert!(!off.is_enabled());
        off.ready("up");
        assert!(!off.warned);
        assert!(!Notifier::new(&env(""), 1).is_enabled());

        for bad in ["relative/notify.sock", "vsock:2:1234"] {
            let n = Notifier::new(&env(bad), 1);
            assert!(!n.is_enabled(), "{bad}");
            assert!(n.warned, "{bad}");
        }

        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("gone.sock");
        let mut n = Notifier::new(&env(&missing.to_string_lossy()), 1);
        assert!(n.is_enabled());
        n.ready("up");
        assert!(n.warned);
        // Later failures are not errors either; the socket may yet appear.
        n.stopping("down");
        let sock = UnixDatagram::bind(&missing).expect("bind");
        n.status("back");
        let mut buf = [0u8; 64];
        let got = sock.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..got], b"STATUS=back");
    }

    #[test]
    fn open_status_says_clean_or_dirty_and_what_was_replayed() {
        let mut r = shale_engine::OpenReport {
            clean: true,
            ..Default::default()
        };
        let s = open_status(&r, Duration::from_millis(12));
        assert_eq!(
            s,
            "serving; opened after a clean shutdown in 12 ms (read 0.0 MiB)"
        );
        r.clean = false;
        r.replay.journal_entries = 17;
        r.replay.regions_scanned = 3;
        r.replay.md_groups_read = 40;
        r.replay.entries_applied = 5000;
        r.replay.entries_superseded = 9;
        r.replay.trims = 2;
        r.replay.stray_zones_reset = 1;
        r.warnings.push("md copy A torn".into());
        let s = open_status(&r, Duration::from_millis(1500));
        assert_eq!(
            s,
            "serving; dirty recovery in 1500 ms (read 0.0 MiB): replayed 17 journal entries, \
             scanned 3 regions (40 md groups), mapped 5000 versions (9 superseded), 2 trims, \
             1 stray zones reset; warnings: 1 (see the log)"
        );
    }
}
