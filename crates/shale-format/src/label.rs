//! The capacity label, in blocks 0 and 1 of zone 0 of the capacity device (two
//! identical copies: a corrupt copy is caught by its CRC and the other one read). It
//! binds the capacity device to its cache device (same UUID as the superblock) and
//! records the geometry the format assumed.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{CapacityGeometry, FormatError, Structure, BLOCK_SIZE};

pub const LABEL_MAGIC: u32 = u32::from_le_bytes(*b"SHCL");
pub const LABEL_VERSION: u16 = 1;
pub const LABEL_LEN: usize = 48;
/// Copies of the label at the start of zone 0, one per block.
pub const LABEL_COPIES: usize = 2;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapacityLabel {
    pub uuid: [u8; 16],
    pub geometry: CapacityGeometry,
}

impl CapacityLabel {
    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(LABEL_MAGIC);
        w.u16(LABEL_VERSION);
        w.u16(0);
        w.u32(0);
        w.u32(BLOCK_SIZE as u32); // 12
        w.bytes(&self.uuid); // 16
        w.u32(self.geometry.zone_size_blocks); // 32
        w.u32(self.geometry.zone_capacity_blocks); // 36
        w.u32(self.geometry.zone_count); // 40
        w.u32(0); // 44 reserved
        debug_assert_eq!(w.pos(), LABEL_LEN);
        seal(&mut b, BLOCK_SIZE);
        b
    }

    pub fn decode(buf: &[u8], at: u64) -> Result<CapacityLabel, FormatError> {
        let s = Structure::CapacityLabel;
        check_header(buf, s, at, LABEL_MAGIC, LABEL_VERSION, BLOCK_SIZE)?;
        let buf = &buf[..BLOCK_SIZE];
        check_crc(buf, s, at)?;
        let mut r = Reader::at(buf, 12, s, at);
        let bs = r.u32()?;
        if bs != BLOCK_SIZE as u32 {
            return Err(r.invalid("block_size", format!("{bs} != {BLOCK_SIZE}")));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.bytes(16)?);
        let geometry = CapacityGeometry {
            zone_size_blocks: r.u32()?,
            zone_capacity_blocks: r.u32()?,
            zone_count: r.u32()?,
        };
        if geometry.zone_capacity_blocks > geometry.zone_size_blocks {
            return Err(r.invalid("zone_capacity_blocks", "exceeds zone size".into()));
        }
        Ok(CapacityLabel { uuid, geometry })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
            let _ = CapacityLabel::decode(&bytes, 0);
        }

        #[test]
        fn roundtrip(uuid in any::<[u8; 16]>(), size in 1u32..1_000_000, cap_less in 0u32..100,
                     count in any::<u32>()) {
            let l = CapacityLabel {
                uuid,
                geometry: CapacityGeometry {
                    zone_size_blocks: size,
                    zone_capacity_blocks: size.saturating_sub(cap_less),
                    zone_count: count,
                },
            };
            let b = l.encode();
            prop_assert_eq!(CapacityLabel::decode(&b, 0), Ok(l));
            let mut bad = b;
            bad[33] ^= 0x40;
            let is_crc = matches!(CapacityLabel::decode(&bad, 0), Err(FormatError::ChecksumMismatch { .. }));
            prop_assert!(is_crc);
        }
    }
}
