//! `shale top` against the real daemon: under a pseudo-terminal (a private tmux
//! server, so a user's own tmux is never touched), through a pipe, and with the
//! daemon gone. A missing tmux fails the test with the package to install.
#![allow(clippy::unwrap_used)]

mod daemon_common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daemon_common::*;

/// A detached tmux session on its own server socket, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Runs `script` (a shell script file) in a 160x40 pane. The script ends with
    /// a long sleep, so the pane stays readable after the command exits.
    fn start(tag: &str, script: &Path) -> Tmux {
        require("tmux", "tmux");
        let t = Tmux {
            socket: format!("shale-test-{tag}-{}", std::process::id()),
        };
        run(t
            .cmd()
            .args(["new-session", "-d", "-x", "160", "-y", "40", "-s", "top"])
            .arg(format!("sh {}", script.display()))
            .env("TERM", "xterm-256color"));
        t
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    fn screen(&self) -> String {
        stdout(self.cmd().args(["capture-pane", "-p", "-t", "top"]))
    }

    /// Captures the screen until `done` holds for one, and returns every distinct
    /// screen seen (the last one satisfies `done`).
    fn watch(&self, limit: Duration, done: impl Fn(&str) -> bool) -> Vec<String> {
        let start = Instant::now();
        let mut seen: Vec<String> = Vec::new();
        loop {
            let s = self.screen();
            if seen.last() != Some(&s) {
                seen.push(s.clone());
            }
            if done(&s) {
                return seen;
            }
            assert!(
                start.elapsed() < limit,
                "screen not as expected after {limit:?}; screens seen:\n{}",
                seen.join("\n-----\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

/// A script running `shale top ARGS` and then printing its exit status.
fn top_script(d: &Daemon, name: &str, args: &str) -> std::path::PathBuf {
    let path = d.dir.path().join(name);
    let body = format!(
        "{} top {args} --data-dir '{}'\necho TOP_EXIT=$?\nsleep 600\n",
        env!("CARGO_BIN_EXE_shale"),
        d.data_dir().display()
    );
    write_file(&path, body.as_bytes());
    path
}

/// The daemon with a second volume and some writes on both.
fn busy_daemon() -> Daemon {
    require("qemu-io", "qemu-utils");
    let d = Daemon::start();
    d.admin(&["volume", "create", "second", "64MiB"]);
    for (export, fill) in [("default", "0xab"), ("second", "0xcd")] {
        run(Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            &format!("write -P {fill} 0 8M"),
            "-c",
            "read -P 0 16M 1M",
            &d.uri(export),
        ]));
    }
    d
}

#[test]
fn top_on_a_terminal_shows_the_pool_and_every_volume_then_exits() {
    let d = busy_daemon();
    let script = top_script(&d, "top3.sh", "--iterations 3");
    let started = Instant::now();
    let tmux = Tmux::start("frames", &script);
    let screens = tmux.watch(Duration::from_secs(60), |s| s.contains("TOP_EXIT="));
    let took = started.elapsed();
    let all = screens.join("\n-----\n");
    let frame = screens
        .iter()
        .find(|s| s.contains("VOLUME") && s.contains("second"))
        .unwrap_or_else(|| panic!("no frame with the volumes:\n{all}"));
    for want in [
        "shale top",
        "q quits",
        "pool: cache",
        "% full",
        "zones",
        "layer WAF",
        "engine up",
        "compaction",
        "gc",
        "MiB/s",
        "default",
        "second",
        "64MiB",
        "512MiB",
        "R-p99",
    ] {
        assert!(frame.contains(want), "{want:?} missing from:\n{frame}");
    }
    // Columns fit the 160-column pane (tmux would wrap a longer line onto the next).
    assert!(frame.lines().all(|l| l.chars().count() <= 160), "{frame}");
    let last = screens.last().unwrap();
    assert!(last.contains("TOP_EXIT=0"), "{all}");
    // The alternate screen is gone: the shell's screen is back, without the frame.
    assert!(!last.contains("VOLUME"), "{all}");
    // Three refreshes one second apart: about 2 s, plus start-up.
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn q_quits_at_once_and_a_stopped_daemon_shows_in_the_frame() {
    let mut d = busy_daemon();
    let script = top_script(&d, "top-q.sh", "--iterations 1000");
    let tmux = Tmux::start("quit", &script);
    tmux.watch(Duration::from_secs(30), |s| {
        s.contains("VOLUME") && s.contains("engine up")
    });
    // The daemon goes away: the frame says so and top keeps retrying.
    d.stop();
    tmux.watch(Duration::from_secs(30), |s| {
        s.contains("is shale serve running?")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!tmux.screen().contains("TOP_EXIT="), "{}", tmux.screen());
    let asked = Instant::now();
    run(tmux.cmd().args(["send-keys", "-t", "top", "q"]));
    let screens = tmux.watch(Duration::from_secs(30), |s| s.contains("TOP_EXIT="));
    let took = asked.elapsed();
    let last = screens.last().unwrap();
    assert!(last.contains("TOP_EXIT=0"), "{last}");
    assert!(took < Duration::from_secs(3), "q took {took:?}");
}

/// Regression: crossterm's event reader spun at 100% CPU, never returning, once the
/// terminal hung up (a closed ssh session), so `shale top` outlived its terminal.
#[test]
fn closing_the_terminal_ends_top() {
    let d = Daemon::start();
    let pidfile = d.dir.path().join("top.pid");
    let script = d.dir.path().join("top-hup.sh");
    let body = format!(
        "echo $$ > '{}'\nexec {} top --iterations 1000 --data-dir '{}'\n",
        pidfile.display(),
        env!("CARGO_BIN_EXE_shale"),
        d.data_dir().display()
    );
    write_file(&script, body.as_bytes());
    let tmux = Tmux::start("hangup", &script);
    tmux.watch(Duration::from_secs(30), |s| s.contains("engine up"));
    let pid = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .to_string();
    // A zombie waiting for its reaper has exited too.
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    };
    assert!(alive(), "top {pid} not running");
    drop(tmux); // kills the server: the pane's terminal hangs up
    let start = Instant::now();
    while alive() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "shale top {pid} still running after its terminal closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn top_through_a_pipe_prints_plain_frames() {
    let d = busy_daemon();
    let started = Instant::now();
    let out = stdout(
        shale()
            .args(["top", "--iterations", "2", "--interval", "0.5"])
            .arg("--data-dir")
            .arg(d.data_dir()),
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!out.contains('\x1b'), "escape codes in {out:?}");
    assert_eq!(out.matches("pool: cache").count(), 2, "{out}");
    assert_eq!(out.matches("\nVOLUME ").count(), 2, "{out}");
    assert!(!out.contains("q quits"), "{out}");
    let frames: Vec<&str> = out.split("shale top ").filter(|f| !f.is_empty()).collect();
    assert_eq!(frames.len(), 2, "{out}");
    for name in ["default ", "second "] {
        assert!(frames.iter().all(|f| f.contains(name)), "{out}");
    }
    // Rates need two samples: the first frame has none, the second has them.
    assert!(frames[0].contains("compaction - victims/s"), "{out}");
    assert!(
        frames[1].contains(" victims/s") && !frames[1].contains("compaction - "),
        "{out}"
    );
}

#[test]
fn top_without_a_daemon_says_so_and_fails_after_its_iterations() {
    let dir = tempfile::tempdir().unwrap();
    let out = output(
        shale()
            .args(["top", "--iterations", "2", "--interval", "0.2"])
            .arg("--admin-socket")
            .arg(dir.path().join("admin.sock")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert_eq!(text.matches("is shale serve running?").count(), 2, "{text}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not reach the daemon"),
        "{out:?}"
    );
}
