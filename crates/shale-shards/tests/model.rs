//! The model-based test with shards: random sequences of writes of every size and
//! alignment, trims, write-zeroes, reads, flushes, clean reopens and volume
//! create/resize/delete on pools of 2 to 4 shards with small granules (so most
//! requests span shards), each shard on tiny chunks and zones so compaction and GC
//! run constantly. Every read must match an in-memory model and every shard's
//! self-check must pass after every step; block status must agree with what was
//! written.
//!
//! A failure prints the shrunk case and the seed; rerun with SHALE_MODEL_SEED=<seed>.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use shale_device::MemDevice;
use shale_engine::{EngineError, ManualClock, Reply, Request, VolumeUid};
use shale_shards::{ShardMap, Shards};
use shale_testkit::pattern;

mod common;

use common::{mem_devices, tiny_config as config, MemCap as Cap};

type Pool = Shards<MemDevice, Cap>;

fn devices() -> (MemDevice, Cap) {
    mem_devices(4, 24)
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        vol: u8,
        at: u32,
        len: u32,
        seed: u64,
        fua: bool,
    },
    Read {
        vol: u8,
        at: u32,
        len: u32,
    },
    Trim {
        vol: u8,
        at: u32,
        len: u32,
    },
    Zeroes {
        vol: u8,
        at: u32,
        len: u32,
    },
    Status {
        vol: u8,
        at: u32,
        len: u32,
    },
    Flush,
    Reopen,
    Create {
        blocks: u16,
    },
    Resize {
        vol: u8,
        pct: u16,
    },
    Delete {
        vol: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![
        3 => (1u32..=4).prop_map(|b| b * 4096),
        2 => 1u32..20_000,
        3 => (4u32..=16).prop_map(|b| b * 4096),
    ];
    prop_oneof![
        100 => (any::<u8>(), any::<u32>(), len.clone(), any::<u64>(), prop::bool::weighted(0.05))
            .prop_map(|(vol, at, len, seed, fua)| Op::Write { vol, at, len, seed, fua }),
        25 => (any::<u8>(), any::<u32>(), 1u32..40_000).prop_map(|(vol, at, len)| Op::Read { vol, at, len }),
        4 => (any::<u8>(), any::<u32>(), 1u32..60_000).prop_map(|(vol, at, len)| Op::Trim { vol, at, len }),
        3 => (any::<u8>(), any::<u32>(), 1u32..30_000).prop_map(|(vol, at, len)| Op::Zeroes { vol, at, len }),
        4 => (any::<u8>(), any::<u32>(), 1u32..200_000).prop_map(|(vol, at, len)| Op::Status { vol, at, len }),
        2 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        2 => (16u16..400).prop_map(|blocks| Op::Create { blocks }),
        1 => (any::<u8>(), 50u16..150).prop_map(|(vol, pct)| Op::Resize { vol, pct }),
        1 => any::<u8>().prop_map(|vol| Op::Delete { vol }),
    ]
}

struct World {
    pool: Option<Pool>,
    map: ShardMap,
    model: BTreeMap<VolumeUid, Vec<u8>>,
    /// Blocks a write or write-zeroes mapped since the last trim of them: block
    /// status must call these mapped (it may call others mapped too, not these not).
    mapped: BTreeMap<VolumeUid, Vec<bool>>,
    names: u32,
}

impl World {
    fn pool(&self) -> &Pool {
        self.pool.as_ref().unwrap()
    }

    fn call(&self, r: Request) -> Result<Reply, EngineError> {
        self.pool().call(r)
    }

    fn pick(&self, vol: u8) -> Option<VolumeUid> {
        let ids: Vec<_> = self.model.keys().copied().collect();
        (!ids.is_empty()).then(|| ids[vol as usize % ids.len()])
    }

    fn range(&self, v: VolumeUid, at: u32, len: u32) -> (u64, u64) {
        let size = self.model[&v].len() as u64;
        let off = u64::from(at) % size;
        (off, u64::from(len).min(size - off).max(1))
    }

    /// Whether a volume of `size` more bytes fits every shard.
    fn fits(&self, size: u64, except: Option<VolumeUid>) -> bool {
        let caps = self.pool().shard_capacities();
        (0..self.map.shards()).all(|s| {
            let used: u64 = self
                .model
                .iter()
                .filter(|(u, _)| Some(**u) != except)
                .map(|(_, m)| self.map.local_size(s, m.len() as u64))
                .sum();
            used + self.map.local_size(s, size) <= caps[s]
        })
    }

    fn set_mapped(&mut self, v: VolumeUid, lo: u64, hi: u64, on: bool) {
        let m = self.mapped.get_mut(&v).unwrap();
        for b in lo.div_ceil(4096)..hi / 4096 {
            m[b as usize] = on;
        }
        if on {
            // Partly written blocks are mapped too.
            for b in [lo / 4096, (hi - 1) / 4096] {
                m[b as usize] = true;
            }
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Write {
                vol,
                at,
                len,
                seed,
                fua,
            } => {
                let Some(v) = self.pick(vol) else {
                    return Ok(());
                };
                let (off, len) = self.range(v, at, len);
                let data = pattern(seed, len as usize);
                let r = self.call(Request::Write {
                    volume: v,
                    offset: off,
                    data: data.clone(),
                    fua,
                });
                prop_assert!(r.is_ok(), "write {v} {off}+{len}: {r:?}");
                self.model.get_mut(&v).unwrap()[off as usize..(off + len) as usize]
                    .copy_from_slice(&data);
                self.set_mapped(v, off, off + len, true);
            }
            Op::Read { vol, at, len } => self.read_and_compare(vol, at, len)?,
            Op::Trim { vol, at, len } | Op::Zeroes { vol, at, len } => {
                let Some(v) = self.pick(vol) else {
                    return Ok(());
                };
                let (off, len) = self.range(v, at, len);
                let zeroes = matches!(op, Op::Zeroes { .. });
                let req = if zeroes {
                    Request::WriteZeroes {
                        volume: v,
                        offset: off,
                        len,
                    }
                } else {
                    Request::Trim {
                        volume: v,
                        offset: off,
                        len,
                    }
                };
                let r = self.call(req);
                prop_assert!(r.is_ok(), "trim/zeroes {v} {off}+{len}: {r:?}");
                let (lo, hi) = if zeroes {
                    (off, off + len)
                } else {
                    (off.div_ceil(4096) * 4096, (off + len) / 4096 * 4096)
                };
                if lo < hi {
                    self.model.get_mut(&v).unwrap()[lo as usize..hi as usize].fill(0);
                    // Whole blocks of zeroes may be unmapped (they read as zeroes).
                    self.set_mapped(v, lo, hi, false);
                }
            }
            Op::Status { vol, at, len } => self.status(vol, at, len)?,
            Op::Flush => {
                let r = self.call(Request::Flush);
                prop_assert!(r.is_ok(), "flush: {r:?}");
            }
            Op::Reopen => {
                count(self.pool())?;
                let pool = self.pool.take().unwrap();
                let devices = pool
                    .shutdown()
                    .map_err(|e| TestCaseError::fail(format!("shutdown: {e}")))?;
                let (pool, _) = Shards::open(devices, ManualClock::new, &config(), 64)
                    .map_err(|e| TestCaseError::fail(format!("reopen: {e}")))?;
                prop_assert_eq!(*pool.map(), self.map);
                self.pool = Some(pool);
                self.check_list()?;
            }
            Op::Create { blocks } => self.create(u64::from(blocks) * 4096)?,
            Op::Resize { vol, pct } => self.resize(vol, pct)?,
            Op::Delete { vol } => {
                let Some(v) = self.pick(vol) else {
                    return Ok(());
                };
                let r = self.call(Request::DeleteVolume { volume: v });
                prop_assert!(r.is_ok(), "delete: {r:?}");
                self.model.remove(&v);
                self.mapped.remove(&v);
                let r = self.call(Request::Read {
                    volume: v,
                    offset: 0,
                    len: 4096,
                });
                prop_assert!(
                    matches!(r, Err(EngineError::NoSuchVolume { .. })),
                    "read of deleted {v}: {r:?}"
                );
            }
        }
        Ok(())
    }

    fn read_and_compare(&self, vol: u8, at: u32, len: u32) -> Result<(), TestCaseError> {
        let Some(v) = self.pick(vol) else {
            return Ok(());
        };
        let (off, len) = self.range(v, at, len);
        let got = match self.call(Request::Read {
            volume: v,
            offset: off,
            len,
        }) {
            Ok(Reply::Read(d)) => d,
            r => return Err(TestCaseError::fail(format!("read {v} {off}+{len}: {r:?}"))),
        };
        let want = &self.model[&v][off as usize..(off + len) as usize];
        if got != want {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(TestCaseError::fail(format!(
                "read {v} {off}+{len} differs from the model first at byte {}",
                off as usize + first
            )));
        }
        Ok(())
    }

    fn status(&self, vol: u8, at: u32, len: u32) -> Result<(), TestCaseError> {
        let Some(v) = self.pick(vol) else {
            return Ok(());
        };
        let (off, len) = self.range(v, at, len);
        let ext = match self.call(Request::Allocation {
            volume: v,
            offset: off,
            len,
        }) {
            Ok(Reply::Allocation(e)) => e,
            r => {
                return Err(TestCaseError::fail(format!(
                    "status {v} {off}+{len}: {r:?}"
                )))
            }
        };
        prop_assert_eq!(
            ext.iter().map(|e| e.len).sum::<u64>(),
            len,
            "extents cover the range"
        );
        prop_assert!(
            ext.windows(2).all(|w| w[0].mapped != w[1].mapped),
            "neighbours differ: {:?}",
            ext
        );
        let mut at = off;
        for e in &ext {
            if !e.mapped {
                // Nothing written there may be reported unmapped, and it reads zero.
                for b in at / 4096..(at + e.len).div_ceil(4096) {
                    prop_assert!(
                        !self.mapped[&v][b as usize],
                        "block {b} of {v} written but reported unmapped"
                    );
                }
                prop_assert!(self.model[&v][at as usize..(at + e.len) as usize]
                    .iter()
                    .all(|&x| x == 0));
            }
            at += e.len;
        }
        Ok(())
    }

    fn check_list(&self) -> Result<(), TestCaseError> {
        let list = match self.call(Request::ListVolumes) {
            Ok(Reply::Volumes(v)) => v,
            r => return Err(TestCaseError::fail(format!("list: {r:?}"))),
        };
        let got: BTreeMap<VolumeUid, u64> = list.iter().map(|v| (v.uid, v.size_bytes)).collect();
        let want: BTreeMap<VolumeUid, u64> = self
            .model
            .iter()
            .map(|(u, m)| (*u, m.len() as u64))
            .collect();
        prop_assert_eq!(got, want);
        Ok(())
    }

    fn create(&mut self, size: u64) -> Result<(), TestCaseError> {
        self.names += 1;
        let min = self.map.shards() as u64 * self.map.granule();
        let fits = self.fits(size, None);
        match self.call(Request::CreateVolume {
            name: format!("v{}", self.names),
            size_bytes: size,
        }) {
            Ok(Reply::Volume(info)) => {
                prop_assert!(fits && size >= min, "created {size} bytes that do not fit");
                prop_assert_eq!(info.size_bytes, size);
                prop_assert!(!self.model.contains_key(&info.uid));
                self.model.insert(info.uid, vec![0; size as usize]);
                self.mapped
                    .insert(info.uid, vec![false; (size / 4096) as usize]);
            }
            Err(EngineError::NoSpace { .. }) => {
                prop_assert!(!fits, "refused {size} bytes that fit")
            }
            Err(EngineError::InvalidVolume { .. }) => {
                prop_assert!(size < min || self.model.len() == 4, "refused {size}")
            }
            r => return Err(TestCaseError::fail(format!("create: {r:?}"))),
        }
        self.check_list()
    }

    fn resize(&mut self, vol: u8, pct: u16) -> Result<(), TestCaseError> {
        let Some(v) = self.pick(vol) else {
            return Ok(());
        };
        let old = self.model[&v].len() as u64;
        let min = self.map.shards() as u64 * self.map.granule();
        let size = (old / 4096 * u64::from(pct) / 100).max(8) * 4096;
        let fits = self.fits(size, Some(v));
        match self.call(Request::ResizeVolume {
            volume: v,
            size_bytes: size,
        }) {
            Ok(_) => {
                prop_assert!(fits && size >= min);
                self.model.get_mut(&v).unwrap().resize(size as usize, 0);
                self.mapped
                    .get_mut(&v)
                    .unwrap()
                    .resize((size / 4096) as usize, false);
            }
            Err(EngineError::NoSpace { .. }) => prop_assert!(!fits),
            Err(EngineError::InvalidVolume { .. }) => prop_assert!(size < min),
            r => return Err(TestCaseError::fail(format!("resize: {r:?}"))),
        }
        self.check_list()
    }

    fn verify_all(&self) -> Result<(), TestCaseError> {
        for (v, m) in &self.model {
            let size = m.len() as u64;
            let mut off = 0;
            while off < size {
                let len = (size - off).min(64 * 1024);
                let got = match self.call(Request::Read {
                    volume: *v,
                    offset: off,
                    len,
                }) {
                    Ok(Reply::Read(d)) => d,
                    r => return Err(TestCaseError::fail(format!("final read {v}: {r:?}"))),
                };
                prop_assert!(
                    got == m[off as usize..(off + len) as usize],
                    "final read {} at {} differs",
                    v,
                    off
                );
                off += len;
            }
        }
        Ok(())
    }
}

fn run_case(ops: &[Op], shards: usize, granule_blocks: u64) -> Result<(), TestCaseError> {
    let devices = (0..shards).map(|_| devices()).collect();
    let pool = Shards::format(
        devices,
        ManualClock::new,
        &config(),
        granule_blocks * 4096,
        64,
    )
    .map_err(|e| TestCaseError::fail(format!("format: {e}")))?;
    let map = *pool.map();
    let mut w = World {
        pool: Some(pool),
        map,
        model: BTreeMap::new(),
        mapped: BTreeMap::new(),
        names: 0,
    };
    let cap = w.pool().user_capacity_bytes();
    for share in [55u64, 40] {
        w.create(cap * share / 100 / 4096 / 64 * 64 * 4096)?;
    }
    // Fill both volumes three times, then overwrite random blocks, so compaction and
    // GC have live data to move and every shard's zones hold a mix of live and dead
    // blocks when the case starts.
    for round in 0..3u64 {
        for vol in 0..2u8 {
            let Some(v) = w.pick(vol) else { continue };
            let size = w.model[&v].len() as u32;
            for at in (0..size).step_by(64 * 1024) {
                let seed = u64::from(at) + u64::from(vol) + (round << 40);
                w.step(&Op::Write {
                    vol,
                    at,
                    len: 64 * 1024,
                    seed,
                    fua: false,
                })?;
            }
        }
    }
    let mut x = u64::from(granule_blocks as u32) * 0x9e37_79b9 + shards as u64;
    for i in 0..cap / 4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (vol, at) = ((x >> 60) as u8, (x as u32) & !4095);
        w.step(&Op::Write {
            vol,
            at,
            len: 4096,
            seed: i,
            fua: false,
        })?;
    }
    for (i, op) in ops.iter().enumerate() {
        w.step(op)
            .map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
        if let Err(e) = w.call(Request::SelfCheck) {
            return Err(TestCaseError::fail(format!(
                "self-check after step {i} {op:?}: {e}"
            )));
        }
    }
    w.verify_all()?;
    let st = count(w.pool())?;
    if std::env::var("SHALE_MODEL_DEBUG").is_ok() {
        eprintln!(
            "case: {shards} shards, granule {granule_blocks}, {} ops, capacity {:?}, volumes {:?}, user bytes {}, capacity bytes {}, resets {}",
            ops.len(),
            w.pool().shard_capacities(),
            w.model.values().map(Vec::len).collect::<Vec<_>>(),
            st.user_write_bytes,
            st.capacity_write_bytes(),
            st.zone_resets
        );
    }
    w.pool
        .take()
        .unwrap()
        .shutdown()
        .map_err(|e| TestCaseError::fail(format!("shutdown: {e}")))?;
    Ok(())
}

static TOTALS: std::sync::Mutex<(u64, u64)> = std::sync::Mutex::new((0, 0));

/// Adds the pool's compaction and GC victims since it opened to the totals.
fn count(pool: &Pool) -> Result<Box<shale_engine::Stats>, TestCaseError> {
    let st = match pool.call(Request::Stats) {
        Ok(Reply::Stats(s)) => s,
        r => return Err(TestCaseError::fail(format!("stats: {r:?}"))),
    };
    let mut t = TOTALS.lock().unwrap();
    t.0 += st.compaction_victims;
    t.1 += st.gc_victims;
    Ok(st)
}

fn seed() -> u64 {
    std::env::var("SHALE_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

fn run_model(cases: u32, max_ops: usize) {
    let seed = seed();
    eprintln!("sharded model test starting, SHALE_MODEL_SEED={seed}");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = PtConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 500,
        ..PtConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let shape = (2usize..=4, prop_oneof![Just(1u64), Just(2), Just(16)]);
    let result = runner.run(
        &(shape, proptest::collection::vec(op(), 1..max_ops)),
        |((n, g), ops)| run_case(&ops, n, g),
    );
    if let Err(e) = result {
        panic!("sharded model test failed; rerun with SHALE_MODEL_SEED={seed}\n{e}");
    }
    let t = TOTALS.lock().unwrap();
    eprintln!(
        "sharded model test passed, SHALE_MODEL_SEED={seed}; compaction victims {}, GC victims {}",
        t.0, t.1
    );
    assert!(
        t.0 > 0 && t.1 > 0,
        "background work never ran: compaction {}, GC {}",
        t.0,
        t.1
    );
}

#[test]
fn shards_match_model() {
    run_model(12, 300);
}

/// Longer sequences; run with `cargo test -- --ignored`.
#[test]
#[ignore]
fn shards_match_model_long() {
    run_model(100, 1500);
}
