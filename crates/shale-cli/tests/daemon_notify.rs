//! The daemon under a service manager: this test plays systemd's side of the
//! readiness protocol (it binds the `NOTIFY_SOCKET` datagram socket and reads what
//! the real `shale serve` sends), and checks that an idle admin client does not hold
//! up a stop.

mod daemon_common;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixStream};
use std::time::{Duration, Instant};

use daemon_common::{Daemon, SMALL_DEVICES};

/// The default listeners (the unix socket only), small devices (as `Daemon::start`).
fn args() -> Vec<String> {
    SMALL_DEVICES.iter().map(|s| s.to_string()).collect()
}

/// The service manager's end: a datagram socket the daemon is pointed at.
struct NotifySocket {
    sock: UnixDatagram,
    /// The value of NOTIFY_SOCKET.
    addr: OsString,
    _dir: Option<tempfile::TempDir>,
}

impl NotifySocket {
    fn file() -> NotifySocket {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind notify socket");
        NotifySocket {
            sock,
            addr: path.into_os_string(),
            _dir: Some(dir),
        }
    }

    fn abstract_namespace() -> NotifySocket {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("shale-test-notify-{}-{nanos}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
        let sock = UnixDatagram::bind_addr(&addr).expect("bind abstract notify socket");
        NotifySocket {
            sock,
            addr: format!("@{name}").into(),
            _dir: None,
        }
    }

    fn env(&self) -> Vec<(String, OsString)> {
        vec![("NOTIFY_SOCKET".into(), self.addr.clone())]
    }

    /// The next datagram, if one comes within `timeout`.
    fn recv(&self, timeout: Duration) -> Option<String> {
        self.sock
            .set_read_timeout(Some(timeout))
            .expect("read timeout");
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8(buf[..n].to_vec()).expect("utf-8 datagram")),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("recv: {e}"),
        }
    }

    /// Datagrams up to and including the first with the assignment `key` (such as
    /// `READY=1`), in order; fails after 30 s.
    fn until(&self, key: &str) -> Vec<Message> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {key} within 30 s; got {seen:?}");
            if let Some(text) = self.recv(left) {
                let m = Message::parse(&text);
                let done = m.has(key);
                seen.push(m);
                if done {
                    return seen;
                }
            }
        }
    }
}

/// One notification: `KEY=value` lines.
#[derive(Debug)]
struct Message(Vec<(String, String)>);

impl Message {
    fn parse(text: &str) -> Message {
        Message(
            text.lines()
                .map(|l| {
                    let (k, v) = l
                        .split_once('=')
                        .unwrap_or_else(|| panic!("not an assignment: {l:?} in {text:?}"));
                    (k.to_string(), v.to_string())
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn has(&self, assignment: &str) -> bool {
        let (k, v) = assignment.split_once('=').expect("KEY=value");
        self.get(k) == Some(v)
    }

    fn status(&self) -> &str {
        self.get("STATUS")
            .unwrap_or_else(|| panic!("no STATUS in {self:?}"))
    }
}

/// Waits for READY=1 and checks what it says of the process.
fn ready(ns: &NotifySocket, d: &Daemon) -> Message {
    let mut seen = ns.until("READY=1");
    let ready = seen.pop().expect("ready message");
    let pid = d.pid().expect("running").to_string();
    assert_eq!(ready.get("MAINPID"), Some(pid.as_str()), "{ready:?}");
    // While the devices open, the status says so (a recovery can be long).
    assert!(
        seen.iter()
            .any(|m| m.get("STATUS").is_some_and(|s| s.contains("opening"))),
        "no status before READY: {seen:?}"
    );
    ready
}

#[test]
fn ready_with_the_open_summary_dirty_recovery_and_stopping() {
    let ns = NotifySocket::file();
    let mut d = Daemon::start_with_env(args(), ns.env());
    let first = ready(&ns, &d);
    assert!(
        first.status().contains("opened after a clean shutdown"),
        "{first:?}"
    );

    d.kill9();
    d.spawn();
    let second = ready(&ns, &d);
    let status = second.status();
    assert!(status.contains("dirty recovery"), "{second:?}");
    assert!(status.contains("journal entries"), "{second:?}");
    assert!(status.contains("regions"), "{second:?}");

    // SIGTERM: STOPPING=1 while it drains, then a clean exit 0 (stop checks both).
    d.stop();
    let stopping = ns.until("STOPPING=1").pop().expect("stopping message");
    assert!(stopping.status().contains("draining"), "{stopping:?}");

    // And the next start after that clean stop says so.
    d.spawn();
    let third = ready(&ns, &d);
    assert!(
        third.status().contains("opened after a clean shutdown"),
        "{third:?}"
    );
    d.stop();
}

#[test]
fn abstract_socket_and_watchdog() {
    let ns = NotifySocket::abstract_namespace();
    let mut env = ns.env();
    // A 400 ms watchdog: pings every 200 ms, not on every 50 ms loop turn.
    env.push(("WATCHDOG_USEC".into(), "400000".into()));
    let mut d = Daemon::start_with_env(args(), env);
    let r = ready(&ns, &d);
    assert!(r.status().contains("clean shutdown"), "{r:?}");

    let window = Instant::now();
    let mut pings = 0;
    while window.elapsed() < Duration::from_secs(1) {
        if let Some(text) = ns.recv(Duration::from_millis(100)) {
            assert_eq!(text, "WATCHDOG=1");
            pings += 1;
        }
    }
    assert!((3..=8).contains(&pings), "{pings} pings in 1 s");

    d.stop();
    let stopping = ns.until("STOPPING=1").pop().expect("stopping message");
    assert!(stopping.status().contains("draining"), "{stopping:?}");
}

#[test]
fn an_idle_admin_client_does_not_delay_stop() {
    let mut d = Daemon::start();
    let admin = d.data_dir().join("admin.sock");
    // One client that has been served and then says nothing, one that sent half a
    // request, one that never spoke; all hold a connection thread.
    let served = UnixStream::connect(&admin).expect("connect");
    (&served)
        .write_all(b"{\"op\":\"volume_list\"}\n")
        .expect("write");
    let mut line = String::new();
    BufReader::new(&served).read_line(&mut line).expect("reply");
    assert!(line.contains("\"ok\":true"), "{line}");
    let half = UnixStream::connect(&admin).expect("connect");
    (&half).write_all(b"{\"op\":").expect("write");
    let _silent = UnixStream::connect(&admin).expect("connect");
    // A later client served means the acceptor has taken the three above.
    assert!(d.admin(&["volume", "list"]).contains("default"));

    let started = Instant::now();
    d.stop();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "stop took {took:?} with idle admin clients"
    );
    served
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut rest = Vec::new();
    assert_eq!((&served).read_to_end(&mut rest).expect("end of file"), 0);
}
