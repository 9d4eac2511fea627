//! End to end, the open's progress: after a `kill -9`, `shale serve` with stderr on a
//! terminal (a pseudo-terminal from util-linux `script`) draws the recovery's steps as
//! a bar, with the log lines above it and the bar cleared before `ready`; with stderr
//! a file the log holds the step lines and no bar.

mod daemon_common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use daemon_common::*;

/// `s` quoted for `sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `s` without ANSI escape sequences (CSI: ESC `[`, parameters, a final byte).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            for f in chars.by_ref() {
                if ('\x40'..='\x7e').contains(&f) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A spinner frame of the bar (indicatif's default spinner is braille).
fn is_spinner(c: char) -> bool {
    ('\u{2800}'..='\u{28ff}').contains(&c)
}

/// Writes `len` bytes of a pattern at the start of the default export.
fn write_data(d: &Daemon, len: usize, seed: u64, flush: bool) {
    let scratch = d.dir.path().join("src.img");
    write_file(&scratch, &pattern(seed, len));
    let mut cmd = Command::new("nbdcopy");
    if flush {
        cmd.arg("--flush");
    }
    run(cmd.arg(&scratch).arg(d.uri("default")));
}

/// The script process, killed if the test fails before it exits.
struct Script(Child);

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `shale serve` on the daemon's devices with stderr (and stdout) on a
/// pseudo-terminal, 100 columns wide, until it is ready; then SIGTERM. Returns
/// everything written to the terminal.
fn serve_on_a_terminal(d: &Daemon) -> String {
    let dir = d.dir.path();
    let pid_file = dir.join("pty.pid");
    let out_file = dir.join("pty.out");
    let mut argv = vec![
        env!("CARGO_BIN_EXE_shale").to_string(),
        "serve".into(),
        "--data-dir".into(),
        d.data_dir().display().to_string(),
        "--tcp".into(),
        String::new(),
    ];
    argv.extend(SMALL_DEVICES.iter().map(|s| s.to_string()));
    let argv: Vec<String> = argv.iter().map(|a| sh_quote(a)).collect();
    let inner = format!(
        "stty cols 100 rows 30; echo $$ > {}; exec {}",
        sh_quote(&pid_file.display().to_string()),
        argv.join(" ")
    );
    let out = std::fs::File::create(&out_file).expect("pty output file");
    let mut script = Script(
        Command::new("script")
            .args(["-qfec", &inner, "/dev/null"])
            .env("TERM", "xterm-256color")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn script (util-linux)"),
    );
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let started = Instant::now();
    while !strip_ansi(&read(&out_file)).contains("shale_daemon::serve: ready") {
        if let Ok(Some(status)) = script.0.try_wait() {
            panic!(
                "shale serve on a terminal exited early ({status}): {}",
                read(&out_file)
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not ready on the terminal: {}",
            read(&out_file)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = read(&pid_file).trim().to_string();
    run(Command::new("kill").args(["-TERM", &pid]));
    loop {
        if let Some(status) = script.0.try_wait().expect("wait for script") {
            assert!(status.success(), "exit {status}: {}", read(&out_file));
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "did not stop: {}",
            read(&out_file)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    read(&out_file)
}

#[test]
fn recovery_steps_are_drawn_on_a_terminal_and_only_logged_to_a_file() {
    require("script", "bsdutils");
    require("nbdcopy", "libnbd-bin");
    let mut d = Daemon::start();
    write_data(&d, 48 * MIB as usize, 1, true);
    write_data(&d, 8 * MIB as usize, 2, false);
    d.kill9();

    // stderr a file: the steps are log lines, and nothing of a bar is there.
    d.spawn();
    let log = d.last_log();
    assert!(log.contains("dirty recovery"), "{log}");
    for step in ["superblock", "md scan", "resolve", "census", "self-check"] {
        assert!(
            log.contains(&format!("open step step=\"{step}\"")),
            "{step} not logged: {log}"
        );
    }
    assert!(
        !log.contains(['\x1b', '\r']) && !log.contains(is_spinner),
        "terminal control characters in the log file: {log:?}"
    );
    assert!(
        !log.contains("ETA") && !log.contains("open 9/14"),
        "a bar in the log file: {log}"
    );

    // stderr a terminal, after another crash.
    write_data(&d, 8 * MIB as usize, 3, true);
    d.kill9();
    let raw = serve_on_a_terminal(&d);
    let text = strip_ansi(&raw);
    // The bar: each step by its number, name and, for counted steps, units and ETA.
    for drawn in [
        "open 1 superblock",
        "open 5 journal",
        "open 6 hand-off",
        "open 7/14 L2P directories",
        "open 9/14 md scan",
        "md groups, ETA",
        "open 11/14 census",
        "open 14/14 self-check",
        "L2P pages, ETA",
    ] {
        assert!(text.contains(drawn), "{drawn:?} not drawn: {text:?}");
    }
    // Cleared before the summary line; nothing of it once the daemon serves.
    let summary = text.find("dirty recovery").expect("dirty recovery logged");
    let after = &text[summary..];
    assert!(
        !after.contains(is_spinner) && !after.contains("ETA"),
        "bar left after the open: {after:?}"
    );
    assert!(
        after.contains("ready") && after.contains("clean shutdown"),
        "{after:?}"
    );
    // No log line shares a row with the bar: what a row shows is what follows its
    // last carriage return (the bar is redrawn after `\r` and a line erase), and a
    // row showing a log line starts with the line's timestamp.
    for row in text.split('\n') {
        let shown = row.trim_end_matches('\r');
        let shown = shown.rsplit('\r').next().unwrap_or(shown);
        if shown.contains(" shale_") {
            assert!(
                shown.starts_with("20"),
                "a log line garbled by the bar: {shown:?}\nin {raw:?}"
            );
        }
    }
}
