//! Deterministic workload helpers for the model's tests.

use crate::{FlashStats, Ftl};

/// SplitMix64: tiny, fast and good enough for uniform block choice; every test that
/// uses it prints its seed on failure through its assertion messages.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-shift; the bias is below 2^-32 for our n).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Fills the first `span_bytes` of the drive sequentially in `fill_io` writes, then
/// issues `warm` independent uniform random writes of `io` bytes (aligned to `io`)
/// over the span, then `measure` more, and returns the statistics of the measured
/// part only.
pub(crate) fn steady_state(
    ftl: &mut Ftl,
    span_bytes: u64,
    io: u64,
    warm: u64,
    measure: u64,
    seed: u64,
) -> FlashStats {
    let fill_io = ftl.geometry().iu_bytes.max(io);
    let mut off = 0;
    while off < span_bytes {
        let len = fill_io.min(span_bytes - off);
        ftl.write(off, len).expect("in range");
        off += len;
    }
    let mut rng = Rng::new(seed);
    let slots = span_bytes / io;
    for _ in 0..warm {
        ftl.write(rng.below(slots) * io, io).expect("in range");
    }
    let before = ftl.stats();
    for _ in 0..measure {
        ftl.write(rng.below(slots) * io, io).expect("in range");
    }
    ftl.stats().since(&before)
}
