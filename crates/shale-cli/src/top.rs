//! `shale top`: a live view of a running daemon's pool and volumes for an operator,
//! refreshed every interval from the admin socket's `stats` and `volume list`.
//!
//! - Sampling runs on its own thread, so a slow or hung daemon never delays 'q'.
//! - Keys are read as raw bytes on a thread of their own rather than through
//!   crossterm's event reader, which spins at 100% CPU without returning once the
//!   terminal hangs up (a closed ssh session); here end of input is a quit.
//! - Drawing is a pure function of two samples ([`render`]): the figures are tested
//!   without a terminal or a daemon.
//! - Everything read from the socket is untrusted input: a missing or odd field shows
//!   as "-", never a panic. Rates need two samples, so the first frame shows "-".

use std::io::{self, IsTerminal, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use crossterm::terminal::{self, ClearType};
use crossterm::{cursor, execute, queue, style};
use serde_json::Value;
use shale_daemon::admin::{call, AdminRequest};
use shale_workload::format_size;

use crate::volume::SocketArgs;

const MIB: f64 = 1024.0 * 1024.0;
/// Longest volume name shown in full; longer ones are cut so one name cannot push
/// every figure off a narrow terminal.
const NAME_WIDTH_MAX: usize = 32;
/// How often the view looks at the quit flag and the terminal size while waiting for
/// the next sample.
const TICK: Duration = Duration::from_millis(50);

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between refreshes (0.1 to 3600)
    #[arg(long, default_value = "1", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after this many refreshes (for scripts and tests); exits non-zero if the
    /// last one could not reach the daemon
    #[arg(long)]
    pub iterations: Option<u64>,
    #[command(flatten)]
    pub socket: SocketArgs,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.1..=3600.0).contains(&secs) {
        return Err(format!("{secs} s is outside 0.1 to 3600 s"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// One refresh's answers from the daemon.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was taken, from the start of `shale top` (monotonic).
    pub at: Duration,
    pub stats: Result<Value, String>,
    pub volumes: Result<Value, String>,
}

impl Sample {
    fn take(socket: &Path, at: Duration) -> Sample {
        let ask = |req| call(socket, &req).map_err(|e| e.to_string());
        Sample {
            at,
            stats: ask(AdminRequest::Stats),
            volumes: ask(AdminRequest::VolumeList),
        }
    }

    fn error(&self) -> Option<&str> {
        self.stats
            .as_ref()
            .err()
            .or(self.volumes.as_ref().err())
            .map(String::as_str)
    }
}

pub fn main(args: TopArgs) -> Result<()> {
    let socket = args.socket.socket();
    let (tx, rx) = mpsc::sync_channel(1);
    let sampler_socket = socket.clone();
    let (interval, iterations) = (args.interval, args.iterations);
    std::thread::Builder::new()
        .name("top-sampler".into())
        .spawn(move || sampler(&sampler_socket, interval, iterations, tx))
        .context("starting the sampler thread")?;
    let title = format!(
        "shale top  {}  every {}s",
        socket.display(),
        interval.as_secs_f64()
    );
    let outcome = if io::stdout().is_terminal() {
        tui(&title, &socket, &rx)?
    } else {
        plain(&title, &rx)?
    };
    match outcome {
        Outcome::Quit => Ok(()),
        Outcome::Done(last) => match last.as_ref().and_then(Sample::error) {
            Some(e) => anyhow::bail!("the last refresh could not reach the daemon: {e}"),
            None => Ok(()),
        },
    }
}

/// Takes a sample every `interval` (on a fixed schedule, so a slow answer does not
/// stretch every later interval) until `iterations` or until the view hangs up.
fn sampler(socket: &Path, interval: Duration, iterations: Option<u64>, tx: SyncSender<Sample>) {
    let start = Instant::now();
    let mut next = start;
    let mut taken = 0u64;
    loop {
        if tx.send(Sample::take(socket, start.elapsed())).is_err() {
            return;
        }
        taken += 1;
        if iterations.is_some_and(|n| taken >= n) {
            return;
        }
        next += interval;
        let now = Instant::now();
        if next < now {
            // Behind schedule (a slow daemon): start again from now rather than
            // firing the missed ticks back to back.
            next = now;
        }
        std::thread::sleep(next - now);
    }
}

enum Outcome {
    /// The operator quit ('q', Ctrl-C, a signal).
    Quit,
    /// `--iterations` refreshes were shown; the last sample.
    Done(Option<Sample>),
}

/// Restores the terminal on every way out of the view: return, error or panic.
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> io::Result<TerminalGuard> {
        terminal::enable_raw_mode()?;
        // From here on Drop undoes whatever part of the setup succeeded.
        let guard = TerminalGuard;
        execute!(io::stdout(), terminal::EnterAlternateScreen, cursor::Hide)?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = execute!(io::stdout(), cursor::Show, terminal::LeaveAlternateScreen);
        let _ = terminal::disable_raw_mode();
    }
}

/// Whether bytes read from the terminal in raw mode ask to quit: 'q', Ctrl-C (raw
/// mode turns it into a byte, not a signal), or Esc alone (an arrow key also starts
/// with Esc, but arrives as one read with the rest of its sequence).
fn is_quit(bytes: &[u8]) -> bool {
    bytes == [0x1b] || bytes.iter().any(|b| matches!(b, b'q' | b'Q' | 0x03))
}

/// Sets `quit` on a quit key, or when the terminal is gone (end of input or an
/// error). The thread blocks in read and is simply left behind at exit.
fn key_reader(quit: Arc<AtomicBool>) {
    let mut tty: Box<dyn Read + Send> = if io::stdin().is_terminal() {
        Box::new(io::stdin())
    } else {
        // Output on a terminal, input redirected: the keys are on the terminal.
        match std::fs::File::open("/dev/tty") {
            Ok(f) => Box::new(f),
            // No terminal to read: SIGINT/SIGTERM still quit.
            Err(_) => return,
        }
    };
    let spawned = std::thread::Builder::new()
        .name("top-keys".into())
        .spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                match tty.read(&mut buf) {
                    Ok(n) if n > 0 && !is_quit(&buf[..n]) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    _ => break,
                }
            }
            quit.store(true, Ordering::Relaxed);
        });
    // Without keys the view still quits on a signal; not worth failing over.
    drop(spawned);
}

fn tui(title: &str, socket: &Path, rx: &mpsc::Receiver<Sample>) -> Result<Outcome> {
    // Raw mode turns Ctrl-C into a key, but a SIGTERM or a closed terminal (SIGHUP)
    // must also leave through the guard rather than kill the process in raw mode.
    let quit = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, Arc::clone(&quit))
            .context("installing the signal handlers")?;
    }
    let _guard = TerminalGuard::enter().context("setting up the terminal")?;
    key_reader(Arc::clone(&quit));
    let title = format!("{title}  (q quits)");
    let mut out = io::stdout();
    let (mut prev, mut cur): (Option<Sample>, Option<Sample>) = (None, None);
    let mut size = terminal::size().context("terminal size")?;
    let frame = |prev: &Option<Sample>, cur: &Option<Sample>, width: u16| -> Vec<String> {
        match cur {
            Some(c) => render(&title, prev.as_ref(), c, usize::from(width)),
            // The first frame at once, even before a slow daemon answers.
            None => fit(
                vec![title.clone(), format!("asking {} ...", socket.display())],
                usize::from(width),
            ),
        }
    };
    draw(&mut out, &frame(&prev, &cur, size.0), size)?;
    loop {
        if quit.load(Ordering::Relaxed) {
            return Ok(Outcome::Quit);
        }
        match rx.recv_timeout(TICK) {
            Ok(s) => {
                prev = cur.replace(s);
                draw(&mut out, &frame(&prev, &cur, size.0), size)?;
            }
            Err(RecvTimeoutError::Timeout) => {
                // A resize shows within a tick: one ioctl, simpler than a SIGWINCH
                // handler.
                let now = terminal::size().context("terminal size")?;
                if now != size {
                    size = now;
                    draw(&mut out, &frame(&prev, &cur, size.0), size)?;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return Ok(Outcome::Done(cur)),
        }
    }
}

/// Redraws in place, line by line, clearing what the last frame left: no flash of an
/// empty screen between frames.
fn draw(out: &mut impl Write, lines: &[String], (width, height): (u16, u16)) -> Result<()> {
    let mut row = 0u16;
    for line in lines.iter().take(usize::from(height)) {
        queue!(out, cursor::MoveTo(0, row), style::Print(line))?;
        // A line filling the width leaves the cursor on its last cell, which a clear
        // would erase.
        if line.chars().count() < usize::from(width) {
            queue!(out, terminal::Clear(ClearType::UntilNewLine))?;
        }
        row += 1;
    }
    if row < height {
        queue!(
            out,
            cursor::MoveTo(0, row),
            terminal::Clear(ClearType::FromCursorDown)
        )?;
    }
    out.flush().context("writing to the terminal")?;
    Ok(())
}

/// Not a terminal: one plain frame per refresh, a blank line between frames, no
/// escape codes, no width limit.
fn plain(title: &str, rx: &mpsc::Receiver<Sample>) -> Result<Outcome> {
    let mut out = io::stdout().lock();
    let mut last: Option<Sample> = None;
    for s in rx {
        let mut text = render(title, last.as_ref(), &s, usize::MAX).join("\n");
        text.push_str("\n\n");
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader is gone (`shale top | head`): that is a quit, not an error.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(Outcome::Quit),
            Err(e) => return Err(e).context("writing to stdout"),
        }
        last = Some(s);
    }
    Ok(Outcome::Done(last))
}

// ---- rendering: samples in, lines out ----

/// The frame for `cur`, with rates over the interval since `prev`; every line cut to
/// `width` characters.
pub fn render(title: &str, prev: Option<&Sample>, cur: &Sample, width: usize) -> Vec<String> {
    let mut lines = vec![title.to_string()];
    if let Err(e) = &cur.stats {
        lines.push(format!("daemon: {e}"));
    }
    if let Err(e) = &cur.volumes {
        if cur.stats.as_ref().err() != Some(e) {
            lines.push(format!("volume list: {e}"));
        }
    }
    let now = cur.stats.as_ref().unwrap_or(&Value::Null);
    let before = prev.and_then(|p| p.stats.as_ref().ok());
    let dt = prev
        .and_then(|p| cur.at.checked_sub(p.at))
        .map(|d| d.as_secs_f64())
        .filter(|d| *d > 0.0);
    let rate = |path: &[&str]| per_sec(delta(before, now, path), dt);

    let fill = match (
        count(now, &["space", "free_chunks"]),
        count(now, &["space", "chunks"]),
    ) {
        (Some(free), Some(all)) if all > 0 && free <= all => {
            Some(100.0 * (1.0 - free as f64 / all as f64))
        }
        _ => None,
    };
    let zones = format!(
        "{} free / {}",
        opt_u64(count(now, &["space", "free_zones"])),
        opt_u64(count(now, &["space", "data_zones"]))
    );
    lines.push(format!(
        "pool: cache {} full   zones {zones}   layer WAF {}   engine {}",
        opt_f64(fill, 1, "%"),
        opt_f64(now["waf"]["layer"].as_f64(), 2, ""),
        engine_state(&now["engine"])
    ));
    lines.push(format!(
        "work: compaction {} victims/s   gc {} victims/s   relocated {} blocks/s   capacity {} MiB/s",
        opt_f64(rate(&["work", "compaction_victims"]), 1, ""),
        opt_f64(rate(&["work", "gc_victims"]), 1, ""),
        opt_f64(rate(&["work", "relocated_blocks"]), 0, ""),
        opt_f64(rate(&["bytes", "capacity_written"]).map(|b| b / MIB), 1, ""),
    ));
    lines.push(String::new());
    lines.extend(volume_table(prev, cur, dt));
    fit(lines, width)
}

const COLUMNS: [&str; 14] = [
    "VOLUME",
    "SIZE",
    "CLIENTS",
    "READ/s",
    "WRITE/s",
    "RMiB/s",
    "WMiB/s",
    "WAF",
    "R-p50",
    "R-p99",
    "W-p50",
    "W-p99",
    "DELAYED/s",
    "CACHE-MiB",
];

/// The volumes, from `volume list` (names and clients; the stats' own list when that
/// failed), with each one's figures from the stats' `volumes`, matched by uid (never
/// reused, unlike names).
fn volume_table(prev: Option<&Sample>, cur: &Sample, dt: Option<f64>) -> Vec<String> {
    let now = cur.stats.as_ref().unwrap_or(&Value::Null);
    let before = prev.and_then(|p| p.stats.as_ref().ok());
    let listed = match &cur.volumes {
        Ok(Value::Array(v)) => v.as_slice(),
        _ => now["volumes"].as_array().map_or(&[][..], Vec::as_slice),
    };
    let mut rows: Vec<[String; 14]> = vec![COLUMNS.map(String::from)];
    for vol in listed {
        let uid = vol["uid"].as_u64();
        let now_v = uid
            .and_then(|u| stats_volume(now, u))
            .unwrap_or(&Value::Null);
        let before_v = uid.and_then(|u| before.and_then(|b| stats_volume(b, u)));
        let rate = |path: &[&str]| per_sec(delta(before_v, now_v, path), dt);
        let mibs = |path: &[&str]| opt_f64(rate(path).map(|b| b / MIB), 1, "");
        let lat = |op: &str, q: f64, key: &str| {
            latency_us(
                &now_v["latency_us"][op],
                before_v.map(|b| &b["latency_us"][op]),
                q,
                key,
            )
            .map_or("-".to_string(), format_us)
        };
        let mut name: String = vol["name"].as_str().unwrap_or("-").to_string();
        if name.chars().count() > NAME_WIDTH_MAX {
            name = name.chars().take(NAME_WIDTH_MAX - 1).collect::<String>() + "~";
        }
        rows.push([
            name,
            vol["size_bytes"].as_u64().map_or("-".into(), format_size),
            opt_u64(vol["clients"].as_u64()),
            opt_f64(rate(&["ops", "read"]), 0, ""),
            opt_f64(rate(&["ops", "write"]), 0, ""),
            mibs(&["bytes", "user_read"]),
            mibs(&["bytes", "user_written"]),
            opt_f64(now_v["waf"]["layer"].as_f64(), 2, ""),
            lat("read", 0.50, "p50"),
            lat("read", 0.99, "p99"),
            lat("write", 0.50, "p50"),
            lat("write", 0.99, "p99"),
            // Requests the volume's rate limits held back.
            opt_f64(rate(&["throttle", "delayed"]), 0, ""),
            // Its valid data in the cache now (what a cache share bounds).
            opt_f64(
                now_v["cache_valid_bytes"].as_u64().map(|b| b as f64 / MIB),
                1,
                "",
            ),
        ]);
    }
    if rows.len() == 1 {
        return vec!["no volumes".into()];
    }
    align(&rows)
}

/// Columns as wide as their widest cell, two spaces apart: the name left-aligned,
/// figures right-aligned.
fn align<const N: usize>(rows: &[[String; N]]) -> Vec<String> {
    let mut width = [0usize; N];
    for r in rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, (cell, w)) in r.iter().zip(width).enumerate() {
                if i == 0 {
                    line.push_str(&format!("{cell:<w$}"));
                } else {
                    line.push_str(&format!("  {cell:>w$}"));
                }
            }
            line
        })
        .collect()
}

fn fit(lines: Vec<String>, width: usize) -> Vec<String> {
    lines
        .into_iter()
        .map(|l| {
            if l.chars().count() > width {
                l.chars().take(width).collect()
            } else {
                l
            }
        })
        .collect()
}

fn stats_volume(stats: &Value, uid: u64) -> Option<&Value> {
    stats["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["uid"].as_u64() == Some(uid))
}

fn engine_state(engine: &Value) -> String {
    match engine["up"].as_bool() {
        Some(true) => "up".into(),
        Some(false) => match engine["failure"].as_str() {
            Some(why) => format!("FAILED: {why}"),
            None => "FAILED".into(),
        },
        None => "-".into(),
    }
}

fn count(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().fold(v, |v, k| &v[*k]).as_u64()
}

/// How much a counter grew; none when either sample lacks it or it went backwards (a
/// restarted daemon counts from zero again).
fn delta(before: Option<&Value>, now: &Value, path: &[&str]) -> Option<u64> {
    count(now, path)?.checked_sub(count(before?, path)?)
}

fn per_sec(delta: Option<u64>, dt: Option<f64>) -> Option<f64> {
    Some(delta? as f64 / dt?)
}

/// A latency quantile in µs of one operation (`latency_us.read` or `.write`): over
/// the interval from the growth of each histogram bucket when both samples have
/// buckets; otherwise the daemon's cumulative figure `key` (p50, p99), which is also
/// what the first frame shows. None when nothing completed in the interval.
fn latency_us(now: &Value, before: Option<&Value>, q: f64, key: &str) -> Option<f64> {
    if let (Some(now_b), Some(before_b)) = (buckets(now), before.and_then(buckets)) {
        return interval_quantile(&before_b, &now_b, q);
    }
    now[key].as_f64()
}

/// `[[upper_bound_us, count], ...]`, skipping malformed entries; none when absent.
fn buckets(v: &Value) -> Option<Vec<(f64, u64)>> {
    let list = v["buckets"].as_array()?;
    Some(
        list.iter()
            .filter_map(|b| Some((b[0].as_f64()?, b[1].as_u64()?)))
            .collect(),
    )
}

/// The smallest upper bound where the cumulative count of the buckets' growth reaches
/// quantile `q`.
fn interval_quantile(before: &[(f64, u64)], now: &[(f64, u64)], q: f64) -> Option<f64> {
    // Only non-empty buckets are listed and counts only grow, so a bucket that
    // vanished means the daemon restarted: no interval figure.
    if before
        .iter()
        .any(|(ub, _)| !now.iter().any(|(n, _)| n == ub))
    {
        return None;
    }
    let mut grown = Vec::with_capacity(now.len());
    for &(ub, n) in now {
        let old = before.iter().find(|(b, _)| *b == ub).map_or(0, |b| b.1);
        grown.push((ub, n.checked_sub(old)?));
    }
    grown.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = grown.iter().map(|g| g.1).sum();
    if total == 0 {
        return None;
    }
    let target = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (ub, n) in grown {
        seen += n;
        if seen >= target {
            return Some(ub);
        }
    }
    None
}

fn format_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0}us")
    } else if us < 100_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else if us < 10_000_000.0 {
        format!("{:.0}ms", us / 1000.0)
    } else {
        format!("{:.1}s", us / 1e6)
    }
}

fn opt_u64(v: Option<u64>) -> String {
    v.map_or("-".into(), |n| n.to_string())
}

fn opt_f64(v: Option<f64>, decimals: usize, unit: &str) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.decimals$}{unit}"),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!([
            {"name": "default", "uid": 1, "id": 0, "size_bytes": 512u64 << 20, "clients": 1},
            {"name": "a-much-longer-volume-name", "uid": 7, "id": 1, "size_bytes": 4096, "clients": 0},
        ])
    }

    /// Stats as the daemon will send them, with per-volume figures for uid 1 only
    /// (uid 7 has none yet).
    fn stats(compaction: u64, capacity_mib: u64, reads: u64, read_buckets: Value) -> Value {
        json!({
            "bytes": {"capacity_written": capacity_mib << 20, "user_written": 0},
            "waf": {"layer": 0.5, "cache": 1.0},
            "space": {"free_chunks": 16, "chunks": 64, "free_zones": 100, "data_zones": 128},
            "work": {"compaction_victims": compaction, "gc_victims": 0, "relocated_blocks": 0},
            "engine": {"up": true},
            "volumes": [{
                "name": "default", "uid": 1, "id": 0, "size_bytes": 512u64 << 20,
                "ops": {"read": reads, "write": reads / 2, "trim": 0},
                "bytes": {"user_read": reads * 4096, "user_written": reads / 2 * 4096},
                "waf": {"layer": 1.25},
                "throttle": {"waiting": 0, "delayed": reads / 4, "wait_ms": 0},
                "latency_us": {
                    "read": {"count": reads, "p50": 99, "p99": 999, "max": 5000, "buckets": read_buckets},
                    "write": {"count": reads / 2, "p50": 40, "p99": 80, "max": 90},
                },
            }],
        })
    }

    fn sample(at_secs: u64, stats: Value) -> Sample {
        Sample {
            at: Duration::from_secs(at_secs),
            stats: Ok(stats),
            volumes: Ok(list()),
        }
    }

    /// The cells of the table row whose first cell is `name`.
    fn row(lines: &[String], name: &str) -> Vec<String> {
        let l = lines
            .iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row {name}: {lines:#?}"));
        l.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn rates_and_interval_percentiles_from_two_samples() {
        // Cumulative buckets: before 100 reads at <=10us; then 100 more, 98 at <=100us
        // and 2 at <=5000us: the interval's p50 is 100us, its p99 5000us (the
        // cumulative p50 would still say 10us).
        let a = sample(10, stats(4, 100, 100, json!([[10, 100]])));
        let b = sample(
            12,
            stats(10, 120, 200, json!([[10, 100], [100, 98], [5000, 2]])),
        );
        let lines = render("t", Some(&a), &b, 200);
        let text = lines.join("\n");
        assert!(text.contains("cache 75.0% full"), "{text}");
        assert!(text.contains("zones 100 free / 128"), "{text}");
        assert!(text.contains("layer WAF 0.50"), "{text}");
        assert!(text.contains("engine up"), "{text}");
        assert!(text.contains("compaction 3.0 victims/s"), "{text}");
        assert!(text.contains("capacity 10.0 MiB/s"), "{text}");
        let r = row(&lines, "default");
        // name size clients read/s write/s rMiB/s wMiB/s waf r50 r99 w50 w99
        assert_eq!(r[3], "50", "{text}"); // 100 reads in 2 s
        assert_eq!(r[4], "25", "{text}");
        assert_eq!(r[5], "0.2", "{text}"); // 100 * 4 KiB / 2 s
        assert_eq!(r[7], "1.25", "{text}");
        assert_eq!(r[8], "100us", "{text}");
        assert_eq!(r[9], "5.0ms", "{text}");
        // Writes have no buckets: the daemon's cumulative figures.
        assert_eq!((r[10].as_str(), r[11].as_str()), ("40us", "80us"), "{text}");
        assert_eq!(r[12], "12", "{text}"); // 25 delayed in 2 s, rounded
                                           // A volume the stats do not cover yet: its list fields, and "-" for the rest.
        let r = row(&lines, "a-much-longer-volume-name");
        assert_eq!(r[1..3], ["4KiB", "0"], "{text}");
        assert!(r[3..].iter().all(|c| c == "-"), "{text}");
    }

    #[test]
    fn first_frame_has_no_rates() {
        let a = sample(0, stats(4, 100, 100, json!([[10, 100]])));
        let lines = render("t", None, &a, 200);
        let text = lines.join("\n");
        assert!(text.contains("compaction - victims/s"), "{text}");
        assert!(text.contains("capacity - MiB/s"), "{text}");
        let r = row(&lines, "default");
        assert_eq!(r[3..7], ["-", "-", "-", "-"], "{text}");
        // Latency since the daemon started is known at once.
        assert_eq!(r[8], "99us", "{text}");
    }

    #[test]
    fn columns_line_up_and_fit_the_width() {
        let a = sample(0, stats(4, 100, 100, json!([[10, 100]])));
        let b = sample(1, stats(5, 101, 150, json!([[10, 150]])));
        let lines = render("t", Some(&a), &b, 500);
        let table: Vec<&String> = lines
            .iter()
            .skip_while(|l| !l.starts_with("VOLUME"))
            .collect();
        assert_eq!(table.len(), 3, "{lines:#?}");
        // Figures are right-aligned: every line of the table ends at the same column,
        // and each header's right edge is a cell's right edge on every row.
        let len = table[0].chars().count();
        assert!(table.iter().all(|l| l.chars().count() == len), "{lines:#?}");
        for h in COLUMNS.iter().skip(1) {
            let end = table[0].find(h).unwrap() + h.len();
            for l in &table[1..] {
                let b = l.as_bytes();
                assert_ne!(b[end - 1], b' ', "column {h}: {l}");
                assert!(end == b.len() || b[end] == b' ', "column {h}: {l}");
            }
        }
        // A narrow terminal cuts every line, never wraps.
        let narrow = render("a title longer than thirty characters", Some(&a), &b, 30);
        assert!(
            narrow.iter().all(|l| l.chars().count() <= 30),
            "{narrow:#?}"
        );
        assert!(
            narrow.iter().any(|l| l.starts_with("default ")),
            "{narrow:#?}"
        );
    }

    #[test]
    fn todays_daemon_without_volume_figures() {
        // Today's stats: no "volumes", no "engine".
        let mut s = stats(4, 100, 100, json!([]));
        s.as_object_mut().unwrap().remove("volumes");
        s.as_object_mut().unwrap().remove("engine");
        let a = sample(0, s.clone());
        let b = sample(1, s);
        let lines = render("t", Some(&a), &b, 200);
        let text = lines.join("\n");
        assert!(text.contains("engine -"), "{text}");
        assert!(text.contains("compaction 0.0 victims/s"), "{text}");
        let r = row(&lines, "default");
        assert_eq!(r[1..3], ["512MiB", "1"], "{text}");
        assert!(r[3..].iter().all(|c| c == "-"), "{text}");
    }

    #[test]
    fn odd_json_shows_dashes_and_errors_show_in_the_frame() {
        let odd = [
            json!(null),
            json!("text"),
            json!([1, 2]),
            json!({"space": {"free_chunks": 5, "chunks": 0}, "waf": {"layer": null},
                   "engine": {"up": false, "failure": "zone 3 stuck"},
                   "volumes": [{"uid": 1, "ops": {"read": -1, "write": "x"},
                                "latency_us": {"read": {"buckets": [[1], "x", [null, 2], [10, 1]]},
                                               "write": {"buckets": {"a": 1}}}},
                               "not an object"]}),
        ];
        for (i, s) in odd.iter().enumerate() {
            for list in [json!(null), json!([{"name": 5}, 7]), list()] {
                let a = Sample {
                    at: Duration::from_secs(1),
                    stats: Ok(s.clone()),
                    volumes: Ok(list.clone()),
                };
                let b = Sample {
                    at: Duration::from_secs(1), // no time passed: no rates, no division by zero
                    ..a.clone()
                };
                let lines = render("t", Some(&a), &b, 100);
                assert!(lines.len() >= 4, "{i}: {lines:#?}");
            }
        }
        let failed = render("t", None, &sample(0, odd[3].clone()), 200).join("\n");
        assert!(failed.contains("engine FAILED: zone 3 stuck"), "{failed}");
        assert!(failed.contains("cache - full"), "{failed}");

        let down = Sample {
            at: Duration::from_secs(3),
            stats: Err("admin socket x: is shale serve running? (refused)".into()),
            volumes: Err("admin socket x: is shale serve running? (refused)".into()),
        };
        let text = render("t", Some(&sample(2, stats(1, 1, 1, json!([])))), &down, 200).join("\n");
        assert_eq!(text.matches("is shale serve running").count(), 1, "{text}");
        assert!(text.contains("daemon: admin socket x"), "{text}");
        assert!(text.contains("no volumes"), "{text}");
        assert_eq!(
            down.error(),
            Some("admin socket x: is shale serve running? (refused)")
        );
    }

    #[test]
    fn interval_quantiles() {
        let before = [(10.0, 5), (100.0, 5)];
        // 10 new: 9 at <=10, 1 at <=1000.
        let now = [(10.0, 14), (100.0, 5), (1000.0, 1)];
        assert_eq!(interval_quantile(&before, &now, 0.5), Some(10.0));
        assert_eq!(interval_quantile(&before, &now, 0.9), Some(10.0));
        assert_eq!(interval_quantile(&before, &now, 0.99), Some(1000.0));
        // Nothing happened in the interval.
        assert_eq!(interval_quantile(&before, &before, 0.5), None);
        // Counts went down or a bucket vanished: the daemon restarted.
        assert_eq!(
            interval_quantile(&before, &[(10.0, 1), (100.0, 5)], 0.5),
            None
        );
        assert_eq!(interval_quantile(&before, &[(10.0, 9)], 0.5), None);
        // Unsorted buckets are fine.
        assert_eq!(
            interval_quantile(&[], &[(100.0, 1), (10.0, 1)], 0.5),
            Some(10.0)
        );
    }

    #[test]
    fn quit_keys() {
        assert!(is_quit(b"q"));
        assert!(is_quit(b"xQ"));
        assert!(is_quit(&[0x03]));
        assert!(is_quit(&[0x1b]));
        assert!(!is_quit(b"\x1b[A")); // an arrow key
        assert!(!is_quit(b"j"));
    }

    #[test]
    fn interval_flag() {
        assert_eq!(parse_interval("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("NaN").is_err());
        assert!(parse_interval("fast").is_err());
    }
}
