//! A volume's L2P directory: for each L2P page, which slot of the L2P area holds its
//! newest copy, and that copy's CRC32C (kept outside the page, so a misdirected or stale
//! page is detected).
//!
//! Invariants: slot `s` belongs to pool page `s / 2`; a page never written has slot
//! [`L2P_SLOT_NONE`] and reads as all-unmapped.

use crate::codec::{check_crc, check_header, Reader, Writer};
use crate::{FormatError, Structure, VolumeId};

pub const L2P_DIR_MAGIC: u32 = u32::from_le_bytes(*b"SHLD");
pub const L2P_DIR_VERSION: u16 = 1;
pub const L2P_DIR_HEADER_LEN: usize = 24;
pub const L2P_SLOT_NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageDesc {
    pub slot: u32,
    pub crc32c: u32,
}

impl PageDesc {
    pub const NONE: PageDesc = PageDesc {
        slot: L2P_SLOT_NONE,
        crc32c: 0,
    };
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L2pDirectory {
    pub volume: VolumeId,
    pub pages: Vec<PageDesc>,
}

impl L2pDirectory {
    pub fn encoded_len(&self) -> usize {
        L2P_DIR_HEADER_LEN + 8 * self.pages.len()
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        self.chunks(&mut |c| out.extend_from_slice(c));
    }

    /// Hands the encoded directory to `f` a bounded piece at a time (the sealed header,
    /// then the pages in batches): at TiB scale a directory is megabytes.
    pub(crate) fn chunks(&self, f: &mut dyn FnMut(&[u8])) {
        let mut header = [0u8; L2P_DIR_HEADER_LEN];
        let mut w = Writer::new(&mut header);
        w.u32(L2P_DIR_MAGIC);
        w.u16(L2P_DIR_VERSION);
        w.u16(0);
        w.u32(0);
        w.u32(self.volume.0);
        w.u32(self.pages.len() as u32);
        w.u32(0);
        crate::codec::sealed_chunks(&mut header, |g| self.page_chunks(g), f);
    }

    fn page_chunks(&self, f: &mut dyn FnMut(&[u8])) {
        const BATCH: usize = 512;
        let mut buf = [0u8; BATCH * 8];
        for batch in self.pages.chunks(BATCH) {
            let mut w = Writer::new(&mut buf);
            for p in batch {
                w.u32(p.slot);
                w.u32(p.crc32c);
            }
            f(&buf[..batch.len() * 8]);
        }
    }

    /// Returns the directory and the bytes consumed.
    pub fn decode(buf: &[u8], at: u64) -> Result<(L2pDirectory, usize), FormatError> {
        let s = Structure::L2pDirectory;
        check_header(
            buf,
            s,
            at,
            L2P_DIR_MAGIC,
            L2P_DIR_VERSION,
            L2P_DIR_HEADER_LEN,
        )?;
        let mut r = Reader::at(buf, 12, s, at);
        let volume = VolumeId(r.u32()?);
        let count = r.u32()? as usize;
        r.skip(4)?;
        let len = count
            .checked_mul(8)
            .and_then(|n| n.checked_add(L2P_DIR_HEADER_LEN))
            .ok_or_else(|| r.invalid("page_count", format!("{count} overflows")))?;
        if buf.len() < len {
            return Err(FormatError::Truncated {
                structure: s,
                at,
                len: buf.len(),
                need: len,
            });
        }
        check_crc(&buf[..len], s, at)?;
        let mut pages = Vec::with_capacity(count);
        for _ in 0..count {
            pages.push(PageDesc {
                slot: r.u32()?,
                crc32c: r.u32()?,
            });
        }
        Ok((L2pDirectory { volume, pages }, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let _ = L2pDirectory::decode(&bytes, 0);
        }

        #[test]
        fn roundtrip(vol in any::<u32>(), pages in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..100)) {
            let d = L2pDirectory { volume: VolumeId(vol), pages: pages.iter().map(|&(slot, crc32c)| PageDesc { slot, crc32c }).collect() };
            let mut b = vec![1, 2, 3];
            d.encode_into(&mut b);
            prop_assert_eq!(L2pDirectory::decode(&b[3..], 0), Ok((d.clone(), d.encoded_len())));
            b[3 + 14] ^= 1;
            prop_assert!(L2pDirectory::decode(&b[3..], 0).is_err());
        }
    }
}
