//! Erasure coding behind a small trait.
//!
//! The parity bytes are part of the on-disk format, so the format is pinned here, not
//! the crate: systematic Reed–Solomon over GF(2^8) with the polynomial 0x11d and the
//! encoding matrix of ISA-L's `gf_gen_rs_matrix` (a Vandermonde construction whose
//! first parity row is all ones, so parity 0 is the plain XOR of the data, and whose
//! second is the powers of 2, the RAID-6 Q syndrome) for up to three parity shards,
//! and ISA-L's Cauchy matrix (`gf_gen_cauchy1_matrix`) for four or more. The golden
//! vectors in this file's tests pin those bytes against a scalar reference written
//! from the definition, so a change of backend that changed a byte would fail them.

use rusty_erasure::{Coder, Matrix};

/// Most shards (data + parity) a stripe may have.
pub const MAX_SHARDS: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("{k}+{m}: need 1..={max} data shards, 1..={max} parity shards and at most {max} in all", max = MAX_SHARDS)]
    Shape { k: usize, m: usize },
    #[error("{missing} shards missing, the code survives at most {m}")]
    TooManyMissing { missing: usize, m: usize },
    #[error("shard buffers disagree: {0}")]
    Buffers(String),
}

/// What the arrays need of an erasure code.
pub trait ErasureCodec: std::fmt::Debug + Send {
    /// Data shards per stripe (K).
    fn data_shards(&self) -> usize;
    /// Parity shards per stripe (M).
    fn parity_shards(&self) -> usize;
    /// Computes the M parity shards of K equal-length data shards.
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError>;
    /// Rebuilds the shards named in `want` (indices into data then parity) from
    /// `shards` (K + M entries, `None` for those unavailable); `out` has one buffer
    /// per wanted shard.
    fn reconstruct(
        &self,
        shards: &[Option<&[u8]>],
        want: &[usize],
        out: &mut [&mut [u8]],
    ) -> Result<(), CodecError>;
}

/// Reed–Solomon in the format described in the module documentation.
pub struct ReedSolomon {
    k: usize,
    m: usize,
    coder: Coder,
}

impl std::fmt::Debug for ReedSolomon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReedSolomon({}+{})", self.k, self.m)
    }
}

impl ReedSolomon {
    pub fn new(k: usize, m: usize) -> Result<ReedSolomon, CodecError> {
        if k == 0 || m == 0 || k + m > MAX_SHARDS {
            return Err(CodecError::Shape { k, m });
        }
        let matrix = if m <= 3 {
            Matrix::reed_solomon(k, m)
        } else {
            Matrix::cauchy(k, m)
        }
        .map_err(|_| CodecError::Shape { k, m })?;
        let coder = rusty_erasure::coder(matrix).map_err(|_| CodecError::Shape { k, m })?;
        Ok(ReedSolomon { k, m, coder })
    }
}

impl ErasureCodec for ReedSolomon {
    fn data_shards(&self) -> usize {
        self.k
    }

    fn parity_shards(&self) -> usize {
        self.m
    }

    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        self.coder
            .encode(data, parity)
            .map_err(|e| CodecError::Buffers(e.to_string()))
    }

    fn reconstruct(
        &self,
        shards: &[Option<&[u8]>],
        want: &[usize],
        out: &mut [&mut [u8]],
    ) -> Result<(), CodecError> {
        let missing = shards.iter().filter(|s| s.is_none()).count();
        if missing > self.m {
            return Err(CodecError::TooManyMissing { missing, m: self.m });
        }
        self.coder
            .recover(shards, want, out)
            .map_err(|e| CodecError::Buffers(e.to_string()))
    }
}

/// `mirror`: one data shard, every parity shard a copy of it.
#[derive(Debug)]
pub struct Copies {
    pub copies: usize,
}

impl ErasureCodec for Copies {
    fn data_shards(&self) -> usize {
        1
    }

    fn parity_shards(&self) -> usize {
        self.copies - 1
    }

    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        let [d] = data else {
            return Err(CodecError::Buffers(format!(
                "{} data shards, want 1",
                data.len()
            )));
        };
        for p in parity.iter_mut() {
            if p.len() != d.len() {
                return Err(CodecError::Buffers("copy length".into()));
            }
            p.copy_from_slice(d);
        }
        Ok(())
    }

    fn reconstruct(
        &self,
        shards: &[Option<&[u8]>],
        _want: &[usize],
        out: &mut [&mut [u8]],
    ) -> Result<(), CodecError> {
        let Some(src) = shards.iter().flatten().next() else {
            return Err(CodecError::TooManyMissing {
                missing: shards.len(),
                m: self.parity_shards(),
            });
        };
        for o in out.iter_mut() {
            if o.len() != src.len() {
                return Err(CodecError::Buffers("copy length".into()));
            }
            o.copy_from_slice(src);
        }
        Ok(())
    }
}

/// `none`: data shards only; nothing can be rebuilt.
#[derive(Debug)]
pub struct NoParity {
    pub k: usize,
}

impl ErasureCodec for NoParity {
    fn data_shards(&self) -> usize {
        self.k
    }

    fn parity_shards(&self) -> usize {
        0
    }

    fn encode(&self, _data: &[&[u8]], _parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        Ok(())
    }

    fn reconstruct(
        &self,
        shards: &[Option<&[u8]>],
        _want: &[usize],
        _out: &mut [&mut [u8]],
    ) -> Result<(), CodecError> {
        Err(CodecError::TooManyMissing {
            missing: shards.iter().filter(|s| s.is_none()).count(),
            m: 0,
        })
    }
}

/// The codec of an array of `members` devices with this redundancy.
pub fn for_redundancy(
    r: crate::layout::Redundancy,
    members: usize,
) -> Result<Box<dyn ErasureCodec>, crate::layout::LayoutError> {
    use crate::layout::Redundancy;
    let (k, m) = r.shards(members)?;
    Ok(match r {
        Redundancy::None => Box::new(NoParity { k: k as usize }),
        Redundancy::Mirror => Box::new(Copies { copies: members }),
        Redundancy::Parity { .. } => Box::new(
            ReedSolomon::new(k as usize, m as usize)
                .map_err(|e| crate::layout::LayoutError::Parse(e.to_string()))?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// GF(2^8) multiplication, polynomial 0x11d, by shift and add: the definition,
    /// independent of any table.
    fn gf_mul(mut a: u8, mut b: u8) -> u8 {
        let mut p = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= 0x1d;
            }
            b >>= 1;
        }
        p
    }

    fn gf_inv(a: u8) -> u8 {
        (1..=255u8)
            .find(|&b| gf_mul(a, b) == 1)
            .expect("nonzero has an inverse")
    }

    /// Parity coefficient of data shard `j` in parity row `i`, from the definitions
    /// the format names.
    fn coefficient(k: usize, m: usize, i: usize, j: usize) -> u8 {
        if m <= 3 {
            // Vandermonde: row i holds (2^i)^j.
            let gen = (0..i).fold(1u8, |g, _| gf_mul(g, 2));
            (0..j).fold(1u8, |c, _| gf_mul(c, gen))
        } else {
            // Cauchy: 1 / ((k + i) xor j).
            gf_inv(((k + i) ^ j) as u8)
        }
    }

    fn reference_parity(k: usize, m: usize, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let len = data[0].len();
        (0..m)
            .map(|i| {
                (0..len)
                    .map(|b| {
                        (0..k).fold(0u8, |acc, j| {
                            acc ^ gf_mul(coefficient(k, m, i, j), data[j][b])
                        })
                    })
                    .collect()
            })
            .collect()
    }

    fn encode(code: &ReedSolomon, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let len = data[0].len();
        let mut parity = vec![vec![0u8; len]; code.parity_shards()];
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        code.encode(&refs, &mut outs).expect("encode");
        parity
    }

    /// The data of a golden vector: shard j byte b is (j * 37 + b * 11 + 5) mod 256.
    fn golden_data(k: usize, len: usize) -> Vec<Vec<u8>> {
        (0..k)
            .map(|j| {
                (0..len)
                    .map(|b| ((j * 37 + b * 11 + 5) % 256) as u8)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn parity_matches_the_reference_for_every_shape_we_offer() {
        let mut rng = ChaCha8Rng::seed_from_u64(19);
        for (k, m) in [
            (1, 1),
            (2, 1),
            (3, 1),
            (4, 1),
            (4, 2),
            (6, 2),
            (8, 3),
            (4, 4),
            (10, 4),
            (8, 6),
        ] {
            let code = ReedSolomon::new(k, m).expect("shape");
            let data: Vec<Vec<u8>> = (0..k)
                .map(|_| (0..512).map(|_| rng.gen::<u8>()).collect())
                .collect();
            assert_eq!(
                encode(&code, &data),
                reference_parity(k, m, &data),
                "{k}+{m}"
            );
        }
    }

    #[test]
    fn the_first_parity_row_is_xor_up_to_three_parity_shards() {
        for (k, m) in [(4, 1), (4, 2), (8, 3)] {
            let data = golden_data(k, 64);
            let p = encode(&ReedSolomon::new(k, m).expect("shape"), &data);
            let xor: Vec<u8> = (0..64)
                .map(|b| data.iter().fold(0, |a, d| a ^ d[b]))
                .collect();
            assert_eq!(p[0], xor, "{k}+{m}");
        }
    }

    /// Pinned bytes: these are on disk. Never change them; a new format needs a new
    /// layout version. (Computed once by a separate script from the same
    /// definitions, so the crate, the Rust reference and the script all agree.)
    #[test]
    fn golden_vectors() {
        let cases: [(usize, usize, &[&str]); 4] = [
            (4, 1, &["1400b488bc700c78"]),
            (4, 2, &["1400b488bc700c78", "f7d036b105ed38b0"]),
            (
                8,
                3,
                &["d89028c0a870b8f0", "da2a9c183d9f5242", "490ca2877d63f259"],
            ),
            (
                4,
                4,
                &[
                    "b84d6d2bb562d3ff",
                    "8a99c8d08dfeb396",
                    "b4f80ef7f0e590b6",
                    "3c2ca8dcd6df6d64",
                ],
            ),
        ];
        for (k, m, want) in cases {
            let data = golden_data(k, 8);
            let p = encode(&ReedSolomon::new(k, m).expect("shape"), &data);
            let hex: Vec<String> = p
                .iter()
                .map(|s| s.iter().map(|b| format!("{b:02x}")).collect())
                .collect();
            assert_eq!(hex, *want, "{k}+{m}");
            assert_eq!(p, reference_parity(k, m, &data), "{k}+{m}");
        }
    }

    #[test]
    fn any_m_lost_shards_come_back() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for (k, m) in [(2, 1), (4, 1), (4, 2), (6, 2), (8, 3), (5, 5)] {
            let code = ReedSolomon::new(k, m).expect("shape");
            let data: Vec<Vec<u8>> = (0..k)
                .map(|_| (0..4096).map(|_| rng.gen::<u8>()).collect())
                .collect();
            let parity = encode(&code, &data);
            let all: Vec<&Vec<u8>> = data.iter().chain(parity.iter()).collect();
            for _ in 0..20 {
                let mut lost: Vec<usize> = (0..k + m).collect();
                for i in (1..lost.len()).rev() {
                    lost.swap(i, rng.gen_range(0..=i));
                }
                lost.truncate(rng.gen_range(1..=m));
                lost.sort_unstable();
                let shards: Vec<Option<&[u8]>> = (0..k + m)
                    .map(|i| (!lost.contains(&i)).then(|| all[i].as_slice()))
                    .collect();
                let mut out = vec![vec![0u8; 4096]; lost.len()];
                let mut outs: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
                code.reconstruct(&shards, &lost, &mut outs)
                    .expect("reconstruct");
                for (o, &i) in out.iter().zip(&lost) {
                    assert_eq!(o, all[i], "{k}+{m} lost {lost:?}");
                }
            }
        }
    }

    #[test]
    fn more_than_m_lost_is_an_error() {
        let code = ReedSolomon::new(4, 2).expect("shape");
        let d = [0u8; 16];
        let shards = [None, None, None, Some(&d[..]), Some(&d[..]), Some(&d[..])];
        let mut o = [0u8; 16];
        assert_eq!(
            code.reconstruct(&shards, &[0], &mut [&mut o[..]]),
            Err(CodecError::TooManyMissing { missing: 3, m: 2 })
        );
    }

    #[test]
    fn copies_copy_and_any_copy_restores() {
        let c = Copies { copies: 3 };
        let d = [7u8; 8];
        let (mut p0, mut p1) = ([0u8; 8], [0u8; 8]);
        c.encode(&[&d], &mut [&mut p0, &mut p1]).expect("encode");
        assert_eq!((p0, p1), (d, d));
        let mut o = [0u8; 8];
        c.reconstruct(&[None, None, Some(&p1)], &[0], &mut [&mut o])
            .expect("one copy left");
        assert_eq!(o, d);
        assert!(c
            .reconstruct(&[None, None, None], &[0], &mut [&mut o])
            .is_err());
    }

    #[test]
    fn bad_shapes_are_refused() {
        for (k, m) in [(0, 1), (1, 0), (30, 3)] {
            assert!(matches!(
                ReedSolomon::new(k, m),
                Err(CodecError::Shape { .. })
            ));
        }
    }
}
