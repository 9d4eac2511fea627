//! Serves in-memory exports over NBD, for trying clients by hand.
//!
//! ```text
//! cargo run -p shale-nbd --example mem_server -- \
//!     --unix /tmp/shale.sock --tcp 127.0.0.1:10809 --export vol0=1G --export vol1=256M
//! ```
//!
//! Stops on end of standard input (Ctrl-D) or when killed.

use std::io::Read;
use std::sync::Arc;

use shale_nbd::{MemBackend, MemBackendConfig, MemExportSpec, Server, ServerConfig};

fn size(s: &str) -> Option<u64> {
    let (num, mul) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHALE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let mut config = ServerConfig {
        tcp: None,
        ..ServerConfig::default()
    };
    let mut exports = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--unix" => config.unix_socket = Some(v.into()),
            "--tcp" => config.tcp = Some(v.parse().expect("--tcp ADDR:PORT")),
            "--export" => {
                let (name, sz) = v.split_once('=').expect("--export NAME=SIZE");
                exports.push(MemExportSpec::new(name, size(sz).expect("size like 64M")));
            }
            other => panic!("unknown argument {other}"),
        }
    }
    if exports.is_empty() {
        exports.push(MemExportSpec::new("vol0", 1 << 30));
    }
    if config.unix_socket.is_none() && config.tcp.is_none() {
        config.unix_socket = Some("/tmp/shale-nbd.sock".into());
    }
    let backend = Arc::new(MemBackend::new(exports, MemBackendConfig::default()));
    let server = Server::start(config, backend).expect("server start");
    eprintln!(
        "serving; unix={:?} tcp={:?}; Ctrl-D to stop",
        server.unix_path(),
        server.tcp_addr()
    );
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    server.shutdown();
}
