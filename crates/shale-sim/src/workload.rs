//! The seeded workload: writes of many sizes and alignments (sub-block, 512-byte
//! aligned, unaligned, whole blocks, multi-block), reads, trims, write-zeroes, flushes,
//! FUA writes, and now and then a volume create, grow, shrink or delete, over the
//! volumes the model knows. Offsets favour a hot region of each volume so several
//! unflushed writes often hit the same block.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shale_engine::VolumeUid;

use crate::model::Model;

const BS: u64 = 4096;

/// One request the workload wants submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Write {
        volume: VolumeUid,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Read {
        volume: VolumeUid,
        offset: u64,
        len: u64,
    },
    Trim {
        volume: VolumeUid,
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        volume: VolumeUid,
        offset: u64,
        len: u64,
    },
    Flush,
    Create {
        name: String,
        size_blocks: u64,
        /// Mapped in units of `1 << shift` blocks.
        shift: u8,
        /// Dual mapped: a sparse map of blocks over the unit map (only with a unit).
        dual: bool,
    },
    Resize {
        volume: VolumeUid,
        size_blocks: u64,
    },
    Delete {
        volume: VolumeUid,
    },
}

impl Op {
    /// Volume changes run alone (the simulator drains everything first).
    pub fn is_admin(&self) -> bool {
        matches!(
            self,
            Op::Create { .. } | Op::Resize { .. } | Op::Delete { .. }
        )
    }
}

/// Relative weights of the request kinds (per mille-ish; only ratios matter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    pub write: u32,
    pub read: u32,
    pub trim: u32,
    pub write_zeroes: u32,
    pub flush: u32,
    pub admin: u32,
    /// Percent of writes sent with FUA.
    pub fua_pct: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            write: 700,
            read: 150,
            trim: 40,
            write_zeroes: 30,
            flush: 30,
            admin: 4,
            fua_pct: 4,
        }
    }
}

/// Limits the workload keeps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub request_bytes_max: u64,
    pub user_capacity_blocks: u64,
    pub volumes_max: u32,
    /// Volume sizes are charged in whole units of this many blocks: on a pool of
    /// shards a volume takes up to a granule more than its share in some shard, so
    /// it is charged a whole group of granules (one per shard); 1 on one engine.
    pub charge_blocks: u64,
    /// The smallest volume the pool takes (a granule per shard; 8 blocks here).
    pub volume_blocks_min: u64,
    /// Volumes created may be mapped in units of up to `1 << unit_shift_max` blocks
    /// (0: blocks only).
    pub unit_shift_max: u8,
}

impl Limits {
    /// A mapping unit shift for a volume of `blocks` blocks: 0 in most draws, else a
    /// unit the size is a multiple of; and with a unit, dual mapping in half the
    /// draws.
    pub fn draw_layout(&self, rng: &mut impl Rng, blocks: u64) -> (u8, bool) {
        if self.unit_shift_max == 0 || !rng.gen_bool(0.4) {
            return (0, false);
        }
        let shift = rng.gen_range(1..=self.unit_shift_max);
        let shift = (0..=shift)
            .rev()
            .find(|&s| blocks.is_multiple_of(1 << s))
            .unwrap_or(0);
        (shift, shift > 0 && rng.gen_bool(0.5))
    }
}

impl Limits {
    /// What a volume of `blocks` takes from the user capacity.
    pub fn charged(&self, blocks: u64) -> u64 {
        let unit = self.charge_blocks.max(1);
        blocks.div_ceil(unit) * unit
    }
}

/// Generates requests from its own seeded stream.
#[derive(Debug)]
pub struct Workload {
    rng: ChaCha8Rng,
    mix: Mix,
    limits: Limits,
    names: u64,
    data_seed: u64,
}

impl Workload {
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn new(rng: ChaCha8Rng, mix: Mix, limits: Limits) -> Workload {
        Workload {
            rng,
            mix,
            limits,
            names: 0,
            data_seed: 1,
        }
    }

    /// Fresh bytes that no other write produced (so a stale or misdirected block is
    /// recognisable): an arithmetic sequence of 64-bit words from a random base,
    /// cheap to generate and different in every word.
    pub fn data(&mut self, len: usize) -> Vec<u8> {
        self.data_seed += 1;
        let base = self.rng.gen::<u64>() ^ self.data_seed.rotate_left(32);
        let step = self.rng.gen::<u64>() | 1;
        let mut out = vec![0u8; len.div_ceil(8) * 8];
        for (i, c) in out.chunks_exact_mut(8).enumerate() {
            let w = base.wrapping_add(step.wrapping_mul(i as u64));
            c.copy_from_slice(&w.to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// A fresh volume name.
    pub fn name(&mut self) -> String {
        self.names += 1;
        format!("vol{}", self.names)
    }

    fn pick_volume(&mut self, model: &Model) -> Option<(VolumeUid, u64)> {
        let vols = model.volumes();
        if vols.is_empty() {
            return None;
        }
        let i = self.rng.gen_range(0..vols.len());
        vols.iter().nth(i).map(|(&id, v)| (id, v.size_bytes()))
    }

    /// A range of at most `max` bytes inside a volume of `size` bytes, with a mix of
    /// alignments; offsets favour the first eighth of the volume.
    fn range(&mut self, size: u64, max: u64) -> (u64, u64) {
        let max = max.min(size).max(1);
        let hot = self.rng.gen_bool(0.5);
        let span = if hot { (size / 8).max(BS) } else { size };
        let (offset, len) = match self.rng.gen_range(0..10) {
            // Whole blocks, 1..=4.
            0..=3 => {
                let blocks = self.rng.gen_range(1..=4u64);
                (self.rng.gen_range(0..span / BS) * BS, blocks * BS)
            }
            // Whole blocks, up to the request limit.
            4 | 5 => {
                let blocks = self.rng.gen_range(1..=(max / BS).max(1));
                (self.rng.gen_range(0..span / BS) * BS, blocks * BS)
            }
            // 512-byte aligned, sub-block or straddling.
            6 | 7 => {
                let sectors = self.rng.gen_range(1..=16u64);
                (self.rng.gen_range(0..span / 512) * 512, sectors * 512)
            }
            // Any byte alignment.
            _ => {
                let len = self.rng.gen_range(1..=20_000u64);
                (self.rng.gen_range(0..span), len)
            }
        };
        let offset = offset.min(size - 1);
        let len = len.min(max).min(size - offset).max(1);
        (offset, len)
    }

    /// The next request, or `None` when there is no volume to use.
    pub fn next(&mut self, model: &Model) -> Option<Op> {
        let m = &self.mix;
        let weights = [m.write, m.read, m.trim, m.write_zeroes, m.flush, m.admin];
        let total: u32 = weights.iter().sum();
        let mut r = self.rng.gen_range(0..total.max(1));
        let mut kind = weights.len() - 1;
        for (i, &w) in weights.iter().enumerate() {
            if r < w {
                kind = i;
                break;
            }
            r -= w;
        }
        let (write, read, trim) = (kind == 0, kind == 1, kind == 2);
        match kind {
            4 => return Some(Op::Flush),
            5 => return self.admin(model),
            _ => {}
        }
        let (volume, size) = self.pick_volume(model)?;
        let max = self.limits.request_bytes_max;
        if write {
            let (offset, len) = self.range(size, max);
            let fua = self.rng.gen_range(0..100) < self.mix.fua_pct;
            let data = self.data(len as usize);
            return Some(Op::Write {
                volume,
                offset,
                data,
                fua,
            });
        }
        if read {
            let (offset, len) = self.range(size, max);
            return Some(Op::Read {
                volume,
                offset,
                len,
            });
        }
        // Trims and write-zeroes may be larger than a data request.
        let (offset, len) = self.range(size, 4 * max);
        Some(if trim {
            Op::Trim {
                volume,
                offset,
                len,
            }
        } else {
            Op::WriteZeroes {
                volume,
                offset,
                len,
            }
        })
    }

    /// A volume change that the engine should accept.
    fn admin(&mut self, model: &Model) -> Option<Op> {
        let vols = model.volumes();
        let l = self.limits;
        let used: u64 = vols.values().map(|v| l.charged(v.size_blocks)).sum();
        // Whole charge units only, so whatever is drawn below fits.
        let free = l.user_capacity_blocks.saturating_sub(used) / l.charge_blocks.max(1)
            * l.charge_blocks.max(1);
        let min = l.volume_blocks_min.max(8);
        let choice = self.rng.gen_range(0..4);
        if choice == 0 && (vols.len() as u32) < l.volumes_max && free >= min {
            let size_blocks = self.rng.gen_range(min..=free.clamp(min, 512.max(min)));
            let name = self.name();
            let (shift, dual) = l.draw_layout(&mut self.rng, size_blocks);
            return Some(Op::Create {
                name,
                size_blocks,
                shift,
                dual,
            });
        }
        let (volume, size) = self.pick_volume(model)?;
        let blocks = size / BS;
        // Sizes of a volume mapped in units are whole units.
        let unit = model.volume(volume).map_or(1, |v| v.unit_blocks);
        let whole = |b: u64| b / unit * unit;
        match choice {
            1 if free >= unit => {
                let grow = whole(self.rng.gen_range(unit..=free.min(blocks.max(8)).max(unit)));
                Some(Op::Resize {
                    volume,
                    size_blocks: blocks + grow.max(unit),
                })
            }
            2 if blocks > min.max(unit) => Some(Op::Resize {
                volume,
                size_blocks: whole(self.rng.gen_range(blocks * 3 / 4..blocks).max(min)).max(unit),
            }),
            3 if vols.len() > 1 => Some(Op::Delete { volume }),
            _ => None,
        }
    }
}
