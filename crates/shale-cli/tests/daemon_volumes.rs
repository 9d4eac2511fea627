//! Volumes change under live clients: delete, recreate and resize through the real
//! daemon, with real clients (libnbd through nbdsh, qemu-io) holding connections
//! across the change. A connection is bound to the volume it negotiated; no change
//! lets it reach another tenant's volume.

mod daemon_common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::*;

/// A client that stays connected and runs one command per line of its stdin,
/// answering one line each: libnbd (nbdsh) or qemu-io.
struct Held {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

const STALE_SCRIPT: &str = r#"
import sys
print("connected", h.get_size(), flush=True)
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "write":
            h.pwrite(bytes([int(cmd[2], 16)]) * 4096, int(cmd[1]))
            print("ok", flush=True)
        elif cmd[0] == "read":
            d = h.pread(4096, int(cmd[1]))
            print("data", d[:8].hex(), flush=True)
    except nbd.Error as e:
        print("error", e.errno, e.string.replace("\n", " "), flush=True)
"#;

impl Held {
    fn libnbd(d: &Daemon, export: &str) -> Held {
        require("nbdsh", "python3-libnbd");
        let script = d.dir.path().join(format!("held-{export}.py"));
        write_file(&script, STALE_SCRIPT.as_bytes());
        let mut h = Held::spawn(nbdsh_script(&d.uri(export), &script.display().to_string()));
        let first = h.line();
        assert!(first.starts_with("connected"), "libnbd client: {first}");
        h
    }

    /// qemu-io running `cmds` around a pause: the test changes the volume while it
    /// sleeps, connected; `line()` returns after its first command's output.
    fn qemu_io(d: &Daemon, export: &str, before: &str, pause_ms: u32, after: &[&str]) -> Held {
        require("qemu-io", "qemu-utils");
        // Line-buffered, so its first command's output arrives before the pause ends.
        let mut c = Command::new("stdbuf");
        c.args(["-oL", "qemu-io", "-f", "raw", "-c", before]);
        c.args(["-c", &format!("sleep {pause_ms}")]);
        for a in after {
            c.args(["-c", a]);
        }
        c.arg(d.uri(export));
        Held::spawn(c)
    }

    /// Everything the client prints until it exits.
    fn rest(mut self) -> String {
        drop(self.stdin.take());
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut out);
        let _ = self.child.wait();
        out
    }

    fn spawn(mut c: Command) -> Held {
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {c:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Held {
            child,
            stdin,
            stdout,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).expect("client output");
        l.trim().to_string()
    }

    fn send(&mut self, cmd: &str) {
        let w = self.stdin.as_mut().expect("stdin");
        writeln!(w, "{cmd}").expect("client stdin");
        w.flush().expect("flush");
    }

    /// One libnbd command and its answer.
    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.line()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn admin(d: &Daemon, args: &[&str]) -> std::process::Output {
    output(shale().args(args).arg("--data-dir").arg(d.data_dir()))
}

fn volumes(d: &Daemon) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&d.admin(&["volume", "list", "--json"])).expect("list json");
    v.as_array().cloned().unwrap_or_default()
}

fn volume(d: &Daemon, name: &str) -> Option<serde_json::Value> {
    volumes(d).into_iter().find(|v| v["name"] == name)
}

/// Waits until the volume shows `n` connected clients.
fn wait_clients(d: &Daemon, name: &str, n: u64) {
    let start = Instant::now();
    loop {
        let got = volume(d, name).and_then(|v| v["clients"].as_u64());
        if got == Some(n) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{name}: clients {got:?}, want {n}; log: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn qemu_io_once(d: &Daemon, export: &str, cmds: &[&str]) -> std::process::Output {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    output(c.arg(d.uri(export)))
}

fn qemu_io_ok(d: &Daemon, export: &str, cmds: &[&str]) -> String {
    let o = qemu_io_once(d, export, cmds);
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !text.contains("failed") && !text.contains("Pattern verification"),
        "qemu-io {cmds:?} on {export}: {text}"
    );
    text
}

/// The reported sequence: connect to `a`, delete `a`, create `b`, use the old
/// connection. Its writes never reach `b` and it cannot read `b`.
#[test]
fn a_deleted_volumes_clients_never_reach_the_next_volume() {
    let d = Daemon::start();
    d.admin(&["volume", "create", "a", "64MiB"]);
    qemu_io_ok(&d, "a", &["write -P 0xaa 0 1M"]);
    let uid_a = volume(&d, "a").expect("a")["uid"].as_u64();

    let mut lib = Held::libnbd(&d, "a");
    let mut qio = Held::qemu_io(
        &d,
        "a",
        "read -P 0xaa 0 4k",
        10_000,
        &["write -P 0xcd 0 64k", "read -P 0x5b 0 4k"],
    );
    let first = qio.line();
    assert!(first.contains("read 4096/4096"), "qemu-io: {first}");
    let paused = Instant::now();
    wait_clients(&d, "a", 2);

    // Refused while clients are connected, naming how many; nothing changes.
    let o = admin(&d, &["volume", "delete", "a"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "delete under clients succeeded");
    assert!(err.contains("2 connected clients"), "{err}");
    assert!(volume(&d, "a").is_some(), "a was deleted anyway");
    assert_eq!(lib.ask("read 0"), "data aaaaaaaaaaaaaaaa");

    // --force disconnects them and deletes.
    d.admin(&["volume", "delete", "a", "--force"]);
    assert!(volume(&d, "a").is_none());
    d.admin(&["volume", "create", "b", "64MiB"]);
    let b = volume(&d, "b").expect("b");
    assert_ne!(b["uid"].as_u64(), uid_a, "uid reused");
    // The new volume took the slot `a` had: only the uid tells them apart.
    qemu_io_ok(&d, "b", &["write -P 0x5b 0 1M"]);

    // The old connections fail; neither reaches b.
    let w = lib.ask("write 0 cd");
    assert!(w.starts_with("error"), "stale libnbd write: {w}");
    let r = lib.ask("read 0");
    assert!(r.starts_with("error"), "stale libnbd read: {r}");
    assert!(
        paused.elapsed() < Duration::from_secs(9),
        "the volume changes took longer than qemu-io's pause"
    );
    let rest = qio.rest();
    assert!(!rest.contains("wrote"), "stale qemu-io write: {rest}");
    assert!(
        !rest.contains("read 4096/4096"),
        "stale qemu-io read: {rest}"
    );

    // A new connection to the deleted name is refused; b holds only its own data.
    let o = qemu_io_once(&d, "a", &["read 0 4k"]);
    assert!(!o.status.success(), "connected to a deleted volume");
    qemu_io_ok(&d, "b", &["read -P 0x5b 0 1M", "read -P 0 1M 63M"]);
    assert_eq!(volume(&d, "b").expect("b")["clients"], 0);
    let log = d.log();
    assert!(
        log.contains("disconnected clients of an export"),
        "no disconnect logged: {log}"
    );
}

/// A volume deleted and created again under the same name is a new, empty volume;
/// clients that connect afterwards see it, never the old data.
#[test]
fn a_recreated_name_is_a_new_empty_volume() {
    let d = Daemon::start();
    d.admin(&["volume", "create", "vm", "32MiB"]);
    qemu_io_ok(&d, "vm", &["write -P 0x77 0 32M"]);
    let first = volume(&d, "vm").expect("vm");
    d.admin(&["volume", "delete", "vm"]);
    d.admin(&["volume", "create", "vm", "32MiB"]);
    let second = volume(&d, "vm").expect("vm");
    assert_eq!(first["id"], second["id"], "expected the slot to be reused");
    assert_ne!(first["uid"], second["uid"]);
    qemu_io_ok(&d, "vm", &["read -P 0 0 32M"]);
    // uids survive a restart and are not reissued after it.
    let mut d = d;
    d.stop();
    d.spawn();
    assert_eq!(volume(&d, "vm").expect("vm")["uid"], second["uid"]);
    d.admin(&["volume", "create", "other", "4MiB"]);
    let third = volume(&d, "other").expect("other");
    assert!(third["uid"].as_u64() > second["uid"].as_u64(), "{third}");
}

/// Resize under a connected client: growing is allowed (the client keeps the size
/// it connected with); shrinking is refused unless --force, which disconnects it.
#[test]
fn resize_under_a_connected_client() {
    let d = Daemon::start();
    d.admin(&["volume", "create", "r", "16MiB"]);
    let mut lib = Held::libnbd(&d, "r");
    wait_clients(&d, "r", 1);
    assert_eq!(lib.ask("write 8388608 42"), "ok");

    d.admin(&["volume", "resize", "r", "32MiB"]);
    assert_eq!(volume(&d, "r").expect("r")["size_bytes"], 32 << 20);
    // Still connected, with its old size and data.
    assert_eq!(lib.ask("read 8388608"), "data 4242424242424242");
    let past = lib.ask("read 20971520");
    assert!(
        past.starts_with("error"),
        "read past the size it connected with: {past}"
    );

    let o = admin(&d, &["volume", "resize", "r", "4MiB"]);
    assert!(!o.status.success(), "shrink under a client succeeded");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("1 connected client"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(volume(&d, "r").expect("r")["size_bytes"], 32 << 20);
    assert_eq!(lib.ask("read 8388608"), "data 4242424242424242");

    d.admin(&["volume", "resize", "r", "4MiB", "--force"]);
    assert_eq!(volume(&d, "r").expect("r")["size_bytes"], 4 << 20);
    let r = lib.ask("read 0");
    assert!(
        r.starts_with("error"),
        "client survived a forced shrink: {r}"
    );
    // A new client sees the new size.
    let out = qemu_io_ok(&d, "r", &["read 0 4M"]);
    assert!(out.contains("read 4194304/4194304"), "{out}");
    let o = qemu_io_once(&d, "r", &["read 4M 4k"]);
    assert!(
        !o.status.success() || !String::from_utf8_lossy(&o.stdout).contains("read 4096/4096"),
        "read past the shrunk end"
    );
}
