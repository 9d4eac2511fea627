//! The L2P switch table a checkpoint may carry: L2P entries whose newest value is not
//! yet in the page the checkpoint's directory references (relocations and evicted
//! changes whose page was not cached when the checkpoint began).
//!
//! Persisting them instead of faulting their pages in makes a checkpoint, and the one
//! a recovery ends with, cost what was switched rather than a 4 KiB page read and
//! write per switch: relocations of scattered data touch one L2P page each.
//!
//! Invariants: entries are sorted by (volume, LBA) with no two alike; each overrides
//! the referenced page's entry for that LBA.

use crate::codec::{check_header, check_len_crc, Reader, Writer};
use crate::{FormatError, Lba, Pba, Structure, VolumeId};

pub const L2P_SWITCHES_MAGIC: u32 = u32::from_le_bytes(*b"SHSW");
pub const L2P_SWITCHES_VERSION: u16 = 1;
pub const L2P_SWITCHES_HEADER_LEN: usize = 16;
/// Bytes per switch.
pub const L2P_SWITCH_LEN: usize = 16;
/// LBAs a switch can name (48 bits; pools address at most 2^40 blocks).
pub const L2P_SWITCH_LBA_LIMIT: u64 = 1 << 48;

/// One L2P entry override: `lba` of `volume` maps to `pba` (`Pba::NONE`: unmapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct L2pSwitch {
    /// `volume << 48 | lba`: the sort key and the stored first word.
    key: u64,
    pub pba: Pba,
}

impl L2pSwitch {
    /// `None` when the volume id or LBA does not fit the stored form (16 and 48 bits).
    pub fn new(volume: VolumeId, lba: Lba, pba: Pba) -> Option<L2pSwitch> {
        (volume.0 <= u32::from(u16::MAX) && lba.0 < L2P_SWITCH_LBA_LIMIT).then_some(L2pSwitch {
            key: u64::from(volume.0) << 48 | lba.0,
            pba,
        })
    }

    pub fn volume(&self) -> VolumeId {
        VolumeId((self.key >> 48) as u32)
    }

    pub fn lba(&self) -> Lba {
        Lba(self.key & (L2P_SWITCH_LBA_LIMIT - 1))
    }
}

/// Bytes the table takes for `n` switches (none: no table at all).
pub fn l2p_switches_len(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        L2P_SWITCHES_HEADER_LEN + n * L2P_SWITCH_LEN
    }
}

/// Hands the encoded table of `switches` (sorted, distinct) to `f` a bounded piece at
/// a time: at TiB scale it may be megabytes.
pub(crate) fn switch_chunks(switches: &[L2pSwitch], f: &mut dyn FnMut(&[u8])) {
    debug_assert!(switches.windows(2).all(|w| w[0].key < w[1].key));
    let mut header = [0u8; L2P_SWITCHES_HEADER_LEN];
    let mut w = Writer::new(&mut header);
    w.u32(L2P_SWITCHES_MAGIC);
    w.u16(L2P_SWITCHES_VERSION);
    w.u16(0);
    w.u32(0);
    w.u32(switches.len() as u32);
    crate::codec::sealed_chunks(
        &mut header,
        |g| {
            let mut buf = [0u8; 256 * L2P_SWITCH_LEN];
            for batch in switches.chunks(256) {
                let mut w = Writer::new(&mut buf);
                for s in batch {
                    w.u64(s.key);
                    w.u64(s.pba.0);
                }
                g(&buf[..batch.len() * L2P_SWITCH_LEN]);
            }
        },
        f,
    );
}

/// Decodes a table of at most `max` switches at the start of `buf`; returns it and the
/// bytes consumed.
pub fn decode_l2p_switches(
    buf: &[u8],
    at: u64,
    max: usize,
) -> Result<(Vec<L2pSwitch>, usize), FormatError> {
    let s = Structure::L2pSwitches;
    check_header(
        buf,
        s,
        at,
        L2P_SWITCHES_MAGIC,
        L2P_SWITCHES_VERSION,
        L2P_SWITCHES_HEADER_LEN,
    )?;
    let mut r = Reader::at(buf, 12, s, at);
    let count = r.u32()? as usize;
    if count == 0 || count > max {
        return Err(r.invalid(
            "count",
            format!("{count} switches; a table holds 1 to {max}"),
        ));
    }
    let len = L2P_SWITCHES_HEADER_LEN + count * L2P_SWITCH_LEN;
    check_len_crc(buf, len, s, at)?;
    let mut out = Vec::with_capacity(count);
    let mut prev: Option<u64> = None;
    for _ in 0..count {
        let key = r.u64()?;
        let pba = Pba(r.u64()?);
        if prev.is_some_and(|p| p >= key) {
            return Err(r.invalid(
                "switch",
                format!(
                    "volume {} lba {} out of order",
                    key >> 48,
                    key & 0xFFFF_FFFF_FFFF
                ),
            ));
        }
        prev = Some(key);
        out.push(L2pSwitch { key, pba });
    }
    Ok((out, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(sw: &[L2pSwitch]) -> Vec<u8> {
        let mut out = Vec::new();
        switch_chunks(sw, &mut |b| out.extend_from_slice(b));
        out
    }

    proptest! {
        #[test]
        fn roundtrip(raw in proptest::collection::btree_map((0u32..64, 0u64..1 << 40), any::<u64>(), 1..600)) {
            let sw: Vec<L2pSwitch> = raw.iter().map(|(&(v, l), &p)| L2pSwitch::new(VolumeId(v), Lba(l), Pba(p)).unwrap()).collect();
            let bytes = encode(&sw);
            prop_assert_eq!(bytes.len(), l2p_switches_len(sw.len()));
            let (back, used) = decode_l2p_switches(&bytes, 0, sw.len()).unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(&back, &sw);
            for (s, (&(v, l), &p)) in back.iter().zip(&raw) {
                prop_assert_eq!((s.volume(), s.lba(), s.pba), (VolumeId(v), Lba(l), Pba(p)));
            }
            prop_assert!(decode_l2p_switches(&bytes, 0, sw.len() - 1).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000), max in 0usize..200) {
            let _ = decode_l2p_switches(&bytes, 0, max);
        }
    }

    #[test]
    fn damage_and_disorder_are_typed_errors() {
        let sw = vec![
            L2pSwitch::new(VolumeId(0), Lba(7), Pba(1)).unwrap(),
            L2pSwitch::new(VolumeId(1), Lba(3), Pba::NONE).unwrap(),
        ];
        let good = encode(&sw);
        let mut bad = good.clone();
        bad[20] ^= 1;
        assert!(matches!(
            decode_l2p_switches(&bad, 0, 10),
            Err(FormatError::ChecksumMismatch { .. })
        ));
        assert!(matches!(
            decode_l2p_switches(&good[..good.len() - 1], 0, 10),
            Err(FormatError::Truncated { .. })
        ));
        // Swapped entries, resealed: out of order.
        let mut swapped = good.clone();
        let (a, b) = swapped[16..].split_at_mut(16);
        a.swap_with_slice(&mut b[..16]);
        crate::codec::seal(&mut swapped, good.len());
        assert!(matches!(
            decode_l2p_switches(&swapped, 0, 10),
            Err(FormatError::InvalidField { .. })
        ));
        assert!(L2pSwitch::new(VolumeId(1 << 16), Lba(0), Pba(0)).is_none());
        assert!(L2pSwitch::new(VolumeId(0), Lba(1 << 48), Pba(0)).is_none());
    }
}
