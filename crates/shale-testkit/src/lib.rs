//! What Shale's tests share, so each helper exists once:
//!
//! - [`pattern`]: deterministic, incompressible-looking test data;
//! - [`call`]: one engine request run to completion on the caller's thread;
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
use shale_engine::{Clock, Engine, EngineError, Reply, Request};

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
