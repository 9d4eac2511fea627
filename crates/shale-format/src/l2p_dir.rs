//! A volume's L2P directory: for each L2P page, which slot of the L2P area holds its
//! newest copy, and that copy's CRC32C (kept outside the page, so a misdirected or stale
//! page is detected).
//!
//! Invariants: slot `s` belongs to pool page `s / 2`; a page never written has slot
//! [`L2P_SLOT_NONE`] and reads as all-unmapped.

use crate::codec::{check_crc, check_header, check_len_crc, Reader, Writer};
use crate::{FormatError, Structure, VolumeId};

pub const L2P_DIR_MAGIC: u32 = u32::from_le_bytes(*b"SHLD");
/// The dense form: a descriptor per page.
pub const L2P_DIR_VERSION: u16 = 1;
/// The runs form: only the written pages, in runs (what sparse volumes write).
pub const L2P_DIR_VERSION_RUNS: u16 = 2;
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
    /// Runs of written pages (slot not NONE) and how many pages they hold.
    fn runs(&self) -> (usize, usize) {
        let mut runs = 0;
        let mut written = 0;
        let mut prev = false;
        for p in &self.pages {
            let w = p.slot != L2P_SLOT_NONE;
            runs += usize::from(w && !prev);
            written += usize::from(w);
            prev = w;
        }
        (runs, written)
    }

    /// Bytes of the dense form (version 1: a descriptor per page) and of the runs form
    /// (version 2: `start u32, len u32` then the run's descriptors, for each run of
    /// written pages).
    fn lens(&self) -> (usize, usize) {
        let (runs, written) = self.runs();
        (
            L2P_DIR_HEADER_LEN + 8 * self.pages.len(),
            L2P_DIR_HEADER_LEN + 8 * runs + 8 * written,
        )
    }

    /// The encoded length: the smaller form, so never more than the dense bound
    /// `Checkpoint::encoded_blocks` sizes the areas by.
    pub fn encoded_len(&self) -> usize {
        let (dense, runs) = self.lens();
        dense.min(runs)
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        self.chunks(&mut |c| out.extend_from_slice(c));
    }

    /// Hands the encoded directory to `f` a bounded piece at a time (the sealed header,
    /// then the pages in batches): at TiB scale a directory is megabytes.
    pub(crate) fn chunks(&self, f: &mut dyn FnMut(&[u8])) {
        let (runs, written) = self.runs();
        let as_runs = 8 * runs + 8 * written < 8 * self.pages.len();
        let mut header = [0u8; L2P_DIR_HEADER_LEN];
        let mut w = Writer::new(&mut header);
        w.u32(L2P_DIR_MAGIC);
        w.u16(if as_runs {
            L2P_DIR_VERSION_RUNS
        } else {
            L2P_DIR_VERSION
        });
        w.u16(0);
        w.u32(0);
        w.u32(self.volume.0);
        w.u32(self.pages.len() as u32);
        w.u32(if as_runs { runs as u32 } else { 0 });
        if as_runs {
            crate::codec::sealed_chunks(&mut header, |g| self.run_chunks(g), f);
        } else {
            crate::codec::sealed_chunks(&mut header, |g| desc_chunks(&self.pages, g), f);
        }
    }

    fn run_chunks(&self, f: &mut dyn FnMut(&[u8])) {
        let mut i = 0;
        while i < self.pages.len() {
            if self.pages[i].slot == L2P_SLOT_NONE {
                i += 1;
                continue;
            }
            let start = i;
            while i < self.pages.len() && self.pages[i].slot != L2P_SLOT_NONE {
                i += 1;
            }
            let mut head = [0u8; 8];
            let mut w = Writer::new(&mut head);
            w.u32(start as u32);
            w.u32((i - start) as u32);
            f(&head);
            desc_chunks(&self.pages[start..i], f);
        }
    }

    /// Returns the directory and the bytes consumed. A directory of runs may describe
    /// at most `max_pages` pages (the caller's bound on what it allocates: the pool's
    /// page count when it is known, a multiple of the input's length when not).
    pub fn decode(
        buf: &[u8],
        at: u64,
        max_pages: u64,
    ) -> Result<(L2pDirectory, usize), FormatError> {
        let s = Structure::L2pDirectory;
        let version = buf
            .get(4..6)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
        let runs_form = version == L2P_DIR_VERSION_RUNS;
        check_header(
            buf,
            s,
            at,
            L2P_DIR_MAGIC,
            if runs_form {
                L2P_DIR_VERSION_RUNS
            } else {
                L2P_DIR_VERSION
            },
            L2P_DIR_HEADER_LEN,
        )?;
        let mut r = Reader::at(buf, 12, s, at);
        let volume = VolumeId(r.u32()?);
        let count = r.u32()? as usize;
        let run_count = r.u32()? as usize;
        if count as u64 > max_pages {
            return Err(r.invalid(
                "page_count",
                format!("{count} pages, more than the {max_pages} allowed"),
            ));
        }
        if !runs_form {
            let len = count
                .checked_mul(8)
                .and_then(|n| n.checked_add(L2P_DIR_HEADER_LEN))
                .ok_or_else(|| r.invalid("page_count", format!("{count} overflows")))?;
            check_len_crc(buf, len, s, at)?;
            let mut pages = Vec::with_capacity(count);
            for _ in 0..count {
                let slot = r.u32()?;
                let crc32c = r.u32()?;
                // An unwritten page's CRC means nothing (the runs form does not even
                // store it): it reads as NONE whatever the bytes say.
                pages.push(if slot == L2P_SLOT_NONE {
                    PageDesc::NONE
                } else {
                    PageDesc { slot, crc32c }
                });
            }
            return Ok((L2pDirectory { volume, pages }, len));
        }
        // The runs' extent first (their headers, bounds-checked), so the CRC is
        // checked before anything is allocated.
        let mut len = L2P_DIR_HEADER_LEN;
        for _ in 0..run_count {
            let mut h = Reader::at(buf, len, s, at);
            let _start = h.u32()?;
            let n = h.u32()? as usize;
            len = n
                .checked_mul(8)
                .and_then(|b| b.checked_add(len + 8))
                .filter(|&e| e <= buf.len())
                .ok_or(FormatError::Truncated {
                    structure: s,
                    at,
                    len: buf.len(),
                    need: len + 8 + n.saturating_mul(8),
                })?;
        }
        check_crc(&buf[..len], s, at)?;
        let mut pages = vec![PageDesc::NONE; count];
        let mut r = Reader::at(buf, L2P_DIR_HEADER_LEN, s, at);
        let mut end = 0usize;
        for _ in 0..run_count {
            let start = r.u32()? as usize;
            let n = r.u32()? as usize;
            if n == 0 || start < end || start.saturating_add(n) > count {
                return Err(r.invalid(
                    "run",
                    format!("{n} pages at {start}: empty, out of order or past {count}"),
                ));
            }
            for p in &mut pages[start..start + n] {
                let slot = r.u32()?;
                if slot == L2P_SLOT_NONE {
                    return Err(r.invalid("run", "an unwritten page inside a run".into()));
                }
                *p = PageDesc {
                    slot,
                    crc32c: r.u32()?,
                };
            }
            end = start + n;
        }
        Ok((L2pDirectory { volume, pages }, len))
    }
}

/// Encodes `pages`' descriptors (slot, CRC) to `f` in batches.
fn desc_chunks(pages: &[PageDesc], f: &mut dyn FnMut(&[u8])) {
    const BATCH: usize = 512;
    let mut buf = [0u8; BATCH * 8];
    for batch in pages.chunks(BATCH) {
        let mut w = Writer::new(&mut buf);
        for p in batch {
            w.u32(p.slot);
            w.u32(p.crc32c);
        }
        f(&buf[..batch.len() * 8]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A sparse volume writes its runs; a page count past the caller's bound is
    /// refused before anything is allocated.
    #[test]
    fn sparse_directories_are_runs_and_bounded() {
        let mut pages = vec![PageDesc::NONE; 1 << 20];
        pages[5] = PageDesc { slot: 8, crc32c: 1 };
        pages[6] = PageDesc {
            slot: 10,
            crc32c: 2,
        };
        pages[900_000] = PageDesc { slot: 2, crc32c: 3 };
        let d = L2pDirectory {
            volume: VolumeId(1),
            pages,
        };
        let mut b = Vec::new();
        d.encode_into(&mut b);
        assert_eq!(b.len(), L2P_DIR_HEADER_LEN + 2 * 8 + 3 * 8);
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), L2P_DIR_VERSION_RUNS);
        assert_eq!(L2pDirectory::decode(&b, 0, 1 << 20), Ok((d, b.len())));
        assert!(matches!(
            L2pDirectory::decode(&b, 0, (1 << 20) - 1),
            Err(FormatError::InvalidField {
                field: "page_count",
                ..
            })
        ));
    }

    /// Found by fuzzing: a dense directory may carry a CRC for an unwritten page,
    /// which the runs form cannot say; it decodes as NONE so that re-encoding in
    /// either form gives back the same directory.
    #[test]
    fn an_unwritten_page_decodes_as_none_whatever_its_crc() {
        let d = L2pDirectory {
            volume: VolumeId(3),
            pages: vec![
                PageDesc {
                    slot: L2P_SLOT_NONE,
                    crc32c: 7,
                },
                PageDesc { slot: 1, crc32c: 2 },
            ],
        };
        let mut b = Vec::new();
        d.encode_into(&mut b);
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), L2P_DIR_VERSION);
        let (got, _) = L2pDirectory::decode(&b, 0, 2).unwrap();
        assert_eq!(got.pages[0], PageDesc::NONE);
        assert_eq!(got.pages[1], d.pages[1]);
        let mut again = Vec::new();
        got.encode_into(&mut again);
        assert_eq!(L2pDirectory::decode(&again, 0, 2).unwrap().0, got);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let _ = L2pDirectory::decode(&bytes, 0, 1 << 20);
        }

        /// Dense or sparse (runs of written pages among unwritten ones), the smaller
        /// form is written and decodes to the same directory.
        #[test]
        fn roundtrip(
            vol in any::<u32>(),
            pages in proptest::collection::vec(
                prop_oneof![Just(None), (0u32..u32::MAX, any::<u32>()).prop_map(Some)],
                0..300,
            ),
        ) {
            let d = L2pDirectory {
                volume: VolumeId(vol),
                pages: pages
                    .iter()
                    .map(|p| p.map_or(PageDesc::NONE, |(slot, crc32c)| PageDesc { slot, crc32c }))
                    .collect(),
            };
            let mut b = vec![1, 2, 3];
            d.encode_into(&mut b);
            prop_assert_eq!(b.len() - 3, d.encoded_len());
            prop_assert!(d.encoded_len() <= L2P_DIR_HEADER_LEN + 8 * d.pages.len());
            prop_assert_eq!(L2pDirectory::decode(&b[3..], 0, 300), Ok((d.clone(), d.encoded_len())));
            b[3 + 14] ^= 1;
            prop_assert!(L2pDirectory::decode(&b[3..], 0, 300).is_err());
        }
    }
}
