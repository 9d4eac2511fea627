//! Prometheus text metrics on a loopback HTTP port.
//!
//! A deliberately tiny HTTP/1.0 responder: it answers `GET /metrics` with the text
//! exposition format and anything else with 404. Requests are read with a size and
//! time limit, so a stuck scraper cannot pin the thread for long.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const REQUEST_BYTES_MAX: usize = 8192;

/// One sample in the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricKind,
    /// Label pairs, e.g. `[("volume", "default")]`.
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// Renders samples in the Prometheus text format, one HELP/TYPE header per name.
pub fn render(metrics: &[Metric]) -> String {
    let mut out = String::new();
    let mut last: Option<&str> = None;
    for m in metrics {
        if last != Some(m.name) {
            let kind = match m.kind {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
            };
            let _ = writeln!(out, "# HELP {} {}", m.name, m.help);
            let _ = writeln!(out, "# TYPE {} {kind}", m.name);
            last = Some(m.name);
        }
        out.push_str(m.name);
        if !m.labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in m.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let escaped = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(out, "{k}=\"{escaped}\"");
            }
            out.push('}');
        }
        let _ = writeln!(out, " {}", m.value);
    }
    out
}

pub type MetricsSource = Arc<dyn Fn() -> Vec<Metric> + Send + Sync>;

/// A running metrics endpoint; dropping it stops the listener.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    pub fn start(addr: SocketAddr, source: MetricsSource) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("shale-metrics".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => serve(s, &source),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut s: TcpStream, source: &MetricsSource) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let mut buf = vec![0u8; REQUEST_BYTES_MAX];
    let mut len = 0;
    while len < buf.len() {
        match s.read(&mut buf[len..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                len += n;
                if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let request = String::from_utf8_lossy(&buf[..len]);
    let first = request.lines().next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = if method == "GET" && (path == "/metrics" || path == "/") {
        ("200 OK", render(&source()))
    } else {
        ("404 Not Found", "not found\n".to_string())
    };
    let _ = write!(
        s,
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Metric> {
        vec![
            Metric {
                name: "shale_user_bytes_written_total",
                help: "Bytes written by clients.",
                kind: MetricKind::Counter,
                labels: vec![],
                value: 4096.0,
            },
            Metric {
                name: "shale_volume_size_bytes",
                help: "Volume size.",
                kind: MetricKind::Gauge,
                labels: vec![("volume", "a\"b".into())],
                value: 1.0,
            },
            Metric {
                name: "shale_volume_size_bytes",
                help: "Volume size.",
                kind: MetricKind::Gauge,
                labels: vec![("volume", "c".into())],
                value: 2.0,
            },
        ]
    }

    #[test]
    fn renders_text_format() {
        let text = render(&sample());
        assert_eq!(
            text.matches("# TYPE shale_volume_size_bytes gauge").count(),
            1
        );
        assert!(text.contains("shale_user_bytes_written_total 4096\n"));
        assert!(text.contains("shale_volume_size_bytes{volume=\"a\\\"b\"} 1\n"));
    }

    #[test]
    fn serves_http() {
        let server = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), Arc::new(sample))
            .expect("start");
        let get = |path: &str| {
            let mut s = TcpStream::connect(server.local_addr()).expect("connect");
            write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).expect("read");
            out
        };
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
        assert!(ok.contains("shale_user_bytes_written_total 4096"));
        assert!(get("/nope").starts_with("HTTP/1.0 404"));
    }
}
