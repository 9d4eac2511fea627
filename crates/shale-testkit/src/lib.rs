//! What Shale's tests share, so each helper exists once:
//!
//! - [`pattern`]: deterministic, incompressible-looking test data;
//! - [`call`]: one engine request run to completion on the caller's thread;
//! - [`tiny_config`]: the engine configuration of tiny test devices;
//! - [`power`]: the power rail both simulated devices hang off, with crash triggers
//!   (the crash simulator and the engine's crash tests);
//! - [`tls::Pki`]: a throwaway CA with server and client certificates for TLS tests.
//!
//! A test-only crate: crates list it under `[dev-dependencies]` (the crash simulator,
//! itself a test harness, as a dependency); nothing shipped in `shale` links it.

pub mod power;
pub mod tls;

use std::sync::{Arc, Mutex};

use shale_device::{BlockDevice, ZonedDevice};
use shale_engine::{Clock, Config, Engine, EngineError, Reply, Request};

/// Tiny chunks, a tiny L2P and md cache, tight thresholds and two streams: on devices
/// of a few dozen chunks and zones, compaction, GC, checkpoints and L2P write-back run
/// constantly. Tests override what they are about.
pub fn tiny_config() -> Config {
    Config {
        chunk_blocks: 256,
        volumes_max: 4,
        spare_factor: 0.05,
        journal_blocks: 16,
        compaction_free_chunks_pct: 50,
        gc_free_zones_min: 8,
        l2p_cache_bytes_max: Some(16 * 4096),
        l2p_reserved_pages: 2,
        md_cache_bytes_max: 8 * 4096,
        write_buffers_max: 4,
        request_bytes_max: 64 * 1024,
        streams_max: 2,
        requests_per_poll_max: 8,
        background_steps_per_poll_max: 4,
        ..Config::default()
    }
}

/// `len` deterministic, incompressible-looking bytes from `seed` (xorshift64): the same
/// seed gives the same bytes, different seeds different ones, so a test can name a
/// block's version by its seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Polls of the engine [`call`] allows before declaring the request stuck.
pub const CALL_POLLS_MAX: u32 = 400_000;

/// Submits `req` and polls the engine until it completes (a single-threaded engine:
/// the caller's thread runs it). Panics if it has not completed after
/// [`CALL_POLLS_MAX`] polls.
pub fn call<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    e: &mut Engine<C, Z, K>,
    req: Request,
) -> Result<Reply, EngineError> {
    let slot: Arc<Mutex<Option<Result<Reply, EngineError>>>> = Arc::new(Mutex::new(None));
    let s2 = Arc::clone(&slot);
    e.submit(
        req,
        Box::new(move |r| *s2.lock().expect("call slot") = Some(r)),
    );
    for _ in 0..CALL_POLLS_MAX {
        if let Some(r) = slot.lock().expect("call slot").take() {
            return r;
        }
        if !e.poll() {
            e.wait_io();
        }
    }
    panic!("request never completed");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_seeded() {
        assert_eq!(pattern(7, 4096), pattern(7, 4096));
        assert_ne!(pattern(7, 4096), pattern(8, 4096));
        assert_eq!(pattern(7, 100), pattern(7, 4096)[..100]);
    }
}
