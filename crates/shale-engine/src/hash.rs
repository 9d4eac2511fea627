//! A fast hasher for the engine's own `u64` keys (packed volume and LBA, PBAs): one
//! multiply and a fold instead of SipHash. The keys are not adversarial: they come
//! from our own md and layout, never from a client.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default)]
pub(crate) struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        self.0 ^= self.0 >> 32;
    }
}

/// A map keyed by such `u64`s.
pub(crate) type U64Map<V> = HashMap<u64, V, BuildHasherDefault<U64Hasher>>;

/// A (volume, LBA) as one `u64` key: LBAs are below 2^58, volume ids below 64.
pub(crate) fn pack(v: shale_format::VolumeId, lba: u64) -> u64 {
    (u64::from(v.0) << 58) | lba
}

/// The (volume, LBA) of a key made by [`pack`].
pub(crate) fn unpack(k: u64) -> (shale_format::VolumeId, u64) {
    (
        shale_format::VolumeId((k >> 58) as u32),
        k & ((1 << 58) - 1),
    )
}

#[cfg(test)]
mod pack_tests {
    use super::*;
    use shale_format::VolumeId;

    #[test]
    fn packed_keys_roundtrip() {
        for (v, l) in [(0u32, 0u64), (62, (1 << 58) - 1), (7, 123_456_789)] {
            assert_eq!(unpack(pack(VolumeId(v), l)), (VolumeId(v), l));
        }
    }
}
