//! Power cuts under a pool of shards: every shard's devices hang off one power rail
//! (`shale_testkit::power`), cut at a random device update, in the middle of a data
//! request, a flush across shards or a volume change made shard by shard; each
//! device then keeps, drops or keeps a random part of its unflushed writes. The
//! reopened pool must agree with shard 0 on its volumes (a change cut short is
//! finished or undone as a whole), keep every volume change that completed, and read
//! every block as one of the versions it may hold: the last flushed one, or one
//! written since.
//!
//! A failure prints its seed; rerun one with SHALE_SHARDS_CRASH_SEED=<seed>. 40 runs
//! of three cuts by default; SHALE_SHARDS_CRASH_RUNS=<n> for more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shale_device::{CrashMode, FaultDevice, ZoneEmu};
use shale_engine::{EngineError, ManualClock, Reply, Request, VolumeUid};
use shale_shards::LocalShards;
use shale_testkit::power::{Phase, PowerRail, Powered, Side, Target, Trigger};

type Cap = ZoneEmu<Powered>;
type Pool = LocalShards<Powered, Cap, ManualClock>;

mod common;

use common::{tiny_config as config, zone_config, BS, ZONE_BLOCKS};

const ZONES: u32 = 24;

/// Block contents: the write's id in the first 8 bytes, a fill derived from it.
fn block(id: u64) -> Vec<u8> {
    let mut b = vec![(id % 251) as u8; BS as usize];
    b[..8].copy_from_slice(&id.to_le_bytes());
    b
}

fn id_of(b: &[u8]) -> Option<u64> {
    if b.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let id = u64::from_le_bytes(b[..8].try_into().ok()?);
    (b == block(id).as_slice()).then_some(id)
}

/// A volume as the model knows it: its size (or the two it may have while a resize
/// is cut short) and per block the versions it may hold (0: zeros).
#[derive(Debug, Clone)]
struct Vol {
    blocks: u64,
    may: Vec<BTreeSet<u64>>,
}

impl Vol {
    fn new(blocks: u64) -> Vol {
        Vol {
            blocks,
            may: vec![BTreeSet::from([0]); blocks as usize],
        }
    }
}

struct World {
    rng: ChaCha8Rng,
    rail: PowerRail,
    vols: BTreeMap<VolumeUid, Vol>,
    /// A volume change in flight when the power went: it may or may not hold.
    pending: Option<Pending>,
    next_id: u64,
    names: u32,
}

#[derive(Debug, Clone)]
enum Pending {
    Create { name: String, blocks: u64 },
    Resize { uid: VolumeUid, blocks: u64 },
    Delete { uid: VolumeUid },
}

fn devices(rail: &PowerRail, n: usize, seed: u64) -> Vec<(Powered, Cap)> {
    (0..n as u64)
        .map(|i| {
            let cache = FaultDevice::new((128 + 4 * 256) * BS, 4096, seed ^ i).unwrap();
            let cap = FaultDevice::new(26 * ZONE_BLOCKS * BS, 4096, seed ^ (i << 8)).unwrap();
            let cap = ZoneEmu::format(
                Powered::new(cap, Side::Capacity, rail.clone()),
                &zone_config(ZONES),
            )
            .unwrap();
            (Powered::new(cache, Side::Cache, rail.clone()), cap)
        })
        .collect()
}

impl World {
    fn powered(&self) -> bool {
        self.rail.fired().is_none()
    }

    /// One random request; false once the power is off.
    fn step(&mut self, pool: &mut Pool) -> bool {
        let uids: Vec<VolumeUid> = self.vols.keys().copied().collect();
        let roll = self.rng.gen_range(0..100);
        if uids.is_empty() || roll < 3 {
            return self.create(pool);
        }
        let uid = uids[self.rng.gen_range(0..uids.len())];
        match roll {
            3..=5 => self.resize(pool, uid),
            6 => self.delete(pool, uid),
            7..=14 => {
                let r = pool.call(Request::Flush);
                if r.is_ok() {
                    // Everything written so far is durable: one version per block.
                    for v in self.vols.values_mut() {
                        for m in &mut v.may {
                            let last = *m.iter().next_back().unwrap_or(&0);
                            *m = BTreeSet::from([last]);
                        }
                    }
                }
                self.powered() || r.is_ok()
            }
            _ => self.write(pool, uid),
        }
    }

    fn write(&mut self, pool: &mut Pool, uid: VolumeUid) -> bool {
        let v = &self.vols[&uid];
        let n = self.rng.gen_range(1..=16u64).min(v.blocks);
        let at = self.rng.gen_range(0..=v.blocks - n);
        let mut data = Vec::with_capacity((n * BS) as usize);
        let first = self.next_id;
        for i in 0..n {
            data.extend(block(first + i));
        }
        self.next_id += n;
        // Whatever becomes of the request, these versions may be found.
        let v = self.vols.get_mut(&uid).unwrap();
        for i in 0..n {
            v.may[(at + i) as usize].insert(first + i);
        }
        let r = pool.call(Request::Write {
            volume: uid,
            offset: at * BS,
            data,
            fua: false,
        });
        assert!(
            r.is_ok() || !self.powered(),
            "write with the power on: {r:?}"
        );
        r.is_ok()
    }

    fn create(&mut self, pool: &mut Pool) -> bool {
        self.names += 1;
        let name = format!("v{}", self.names);
        let blocks = self.rng.gen_range(64..400u64);
        self.pending = Some(Pending::Create {
            name: name.clone(),
            blocks,
        });
        match pool.call(Request::CreateVolume {
            name,
            size_bytes: blocks * BS,
        }) {
            Ok(Reply::Volume(v)) => {
                self.vols.insert(v.uid, Vol::new(blocks));
                self.pending = None;
                true
            }
            Err(EngineError::NoSpace { .. } | EngineError::InvalidVolume { .. })
                if self.powered() =>
            {
                self.pending = None;
                true
            }
            r => {
                assert!(!self.powered(), "create with the power on: {r:?}");
                false
            }
        }
    }

    fn resize(&mut self, pool: &mut Pool, uid: VolumeUid) -> bool {
        let old = self.vols[&uid].blocks;
        let blocks = (old * self.rng.gen_range(60..140u64) / 100).max(64);
        self.pending = Some(Pending::Resize { uid, blocks });
        match pool.call(Request::ResizeVolume {
            volume: uid,
            size_bytes: blocks * BS,
        }) {
            Ok(_) => {
                self.pending = None;
                let v = self.vols.get_mut(&uid).unwrap();
                v.blocks = blocks;
                v.may.resize(blocks as usize, BTreeSet::from([0]));
                true
            }
            Err(EngineError::NoSpace { .. }) if self.powered() => {
                self.pending = None;
                true
            }
            r => {
                assert!(!self.powered(), "resize with the power on: {r:?}");
                false
            }
        }
    }

    fn delete(&mut self, pool: &mut Pool, uid: VolumeUid) -> bool {
        self.pending = Some(Pending::Delete { uid });
        match pool.call(Request::DeleteVolume { volume: uid }) {
            Ok(_) => {
                self.pending = None;
                self.vols.remove(&uid);
                true
            }
            r => {
                assert!(!self.powered(), "delete with the power on: {r:?}");
                false
            }
        }
    }

    /// Checks the reopened pool against the model.
    fn verify(&mut self, pool: &mut Pool, seed: u64) {
        let Ok(Reply::Volumes(list)) = pool.call(Request::ListVolumes) else {
            panic!("seed {seed}: list")
        };
        let found: BTreeMap<VolumeUid, (String, u64)> = list
            .iter()
            .map(|v| (v.uid, (v.name.clone(), v.size_bytes / BS)))
            .collect();
        // The change cut short either holds or does not, on every shard alike.
        match self.pending.take() {
            Some(Pending::Create { name, blocks }) => {
                if let Some((&uid, _)) = found.iter().find(|(_, (n, _))| *n == name) {
                    assert_eq!(found[&uid].1, blocks, "seed {seed}: created size");
                    self.vols.insert(uid, Vol::new(blocks));
                }
            }
            Some(Pending::Resize { uid, blocks }) => {
                let now = found.get(&uid).map(|f| f.1);
                let v = self.vols.get_mut(&uid).unwrap();
                assert!(
                    now == Some(v.blocks) || now == Some(blocks),
                    "seed {seed}: {uid} has {now:?} blocks, neither {} nor {blocks}",
                    v.blocks
                );
                let now = now.unwrap_or(v.blocks);
                // Blocks past the smaller size may have been unmapped by a shrink.
                for m in v.may.iter_mut().skip(now.min(blocks) as usize) {
                    m.insert(0);
                }
                v.blocks = now;
                v.may.resize(now as usize, BTreeSet::from([0]));
            }
            Some(Pending::Delete { uid }) => {
                if !found.contains_key(&uid) {
                    self.vols.remove(&uid);
                } else {
                    // Still there: a delete cut short may have unmapped some of it.
                    for m in &mut self.vols.get_mut(&uid).unwrap().may {
                        m.insert(0);
                    }
                }
            }
            None => {}
        }
        let want: BTreeSet<VolumeUid> = self.vols.keys().copied().collect();
        let got: BTreeSet<VolumeUid> = found.keys().copied().collect();
        assert_eq!(got, want, "seed {seed}: volumes");
        for (uid, v) in &mut self.vols {
            assert_eq!(found[uid].1, v.blocks, "seed {seed}: size of {uid}");
            let mut data = Vec::with_capacity((v.blocks * BS) as usize);
            for at in (0..v.blocks).step_by(16) {
                let len = (v.blocks - at).min(16) * BS;
                match pool.call(Request::Read {
                    volume: *uid,
                    offset: at * BS,
                    len,
                }) {
                    Ok(Reply::Read(d)) => data.extend(d),
                    r => panic!("seed {seed}: read {uid} block {at}: {r:?}"),
                }
            }
            for (b, m) in v.may.iter_mut().enumerate() {
                let got = id_of(&data[b * BS as usize..(b + 1) * BS as usize]);
                assert!(
                    got.is_some_and(|id| m.contains(&id)),
                    "seed {seed}: {uid} block {b} reads {got:?}, may hold {m:?}"
                );
                *m = BTreeSet::from([got.unwrap_or(0)]);
            }
        }
        pool.call(Request::SelfCheck)
            .unwrap_or_else(|e| panic!("seed {seed}: self-check: {e}"));
    }
}

fn crash_mode(rng: &mut ChaCha8Rng) -> CrashMode {
    match rng.gen_range(0..3) {
        0 => CrashMode::DropAll,
        1 => CrashMode::KeepAll,
        _ => CrashMode::KeepRandomSubset { seed: rng.gen() },
    }
}

/// What a run's power cuts hit: cuts by a trigger (not at the end of the steps), and
/// of those, cuts inside a volume change.
#[derive(Debug, Default, Clone, Copy)]
struct Hits {
    cuts: u32,
    in_volume_change: u32,
}

fn run(seed: u64) -> Hits {
    let mut hits = Hits::default();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = rng.gen_range(2..=3usize);
    let granule = [4096, 8192, 65536][rng.gen_range(0..3)];
    let rail = PowerRail::new();
    let mut pool: Pool = LocalShards::format(
        devices(&rail, n, seed),
        ManualClock::new,
        &config(),
        granule,
    )
    .unwrap();
    let mut w = World {
        rng,
        rail: rail.clone(),
        vols: BTreeMap::new(),
        pending: None,
        next_id: 1,
        names: 0,
    };
    for _generation in 0..3 {
        let nth = w.rng.gen_range(1..3000);
        rail.arm(Trigger {
            target: Target::AnyUpdate,
            nth,
            phase: if w.rng.gen() {
                Phase::Before
            } else {
                Phase::After
            },
            observe_only: false,
        });
        let mut steps = 0;
        while w.powered() && steps < 400 {
            if !w.step(&mut pool) {
                break;
            }
            steps += 1;
        }
        if !w.powered() {
            hits.cuts += 1;
            hits.in_volume_change += u32::from(w.pending.is_some());
        }
        // The power goes (if the trigger has not fired, now).
        rail.cut();
        let mut again = Vec::new();
        for (cache, cap) in pool.abandon() {
            let mut c = cache.into_inner();
            let mut z = cap.into_inner().into_inner();
            c.crash(&crash_mode(&mut w.rng)).unwrap();
            z.crash(&crash_mode(&mut w.rng)).unwrap();
            again.push((c, z));
        }
        rail.restore();
        let devices = again
            .into_iter()
            .map(|(c, z)| {
                let z = ZoneEmu::open(Powered::new(z, Side::Capacity, rail.clone()))
                    .unwrap_or_else(|e| panic!("seed {seed}: zone emulation: {e}"));
                (Powered::new(c, Side::Cache, rail.clone()), z)
            })
            .collect();
        pool = LocalShards::open(devices, ManualClock::new, &config())
            .unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"))
            .0;
        w.verify(&mut pool, seed);
    }
    hits
}

#[test]
fn power_cuts_across_shards_lose_nothing_flushed() {
    let seeds: Vec<u64> = match std::env::var("SHALE_SHARDS_CRASH_SEED") {
        Ok(s) => vec![s.parse().expect("a seed")],
        Err(_) => {
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs());
            let runs = std::env::var("SHALE_SHARDS_CRASH_RUNS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(40);
            (base..base + runs).collect()
        }
    };
    let many = seeds.len() > 1;
    let mut total = Hits::default();
    for seed in seeds {
        match std::panic::catch_unwind(|| run(seed)) {
            Ok(h) => {
                total.cuts += h.cuts;
                total.in_volume_change += h.in_volume_change;
            }
            Err(_) => panic!("power cut test failed; rerun with SHALE_SHARDS_CRASH_SEED={seed}"),
        }
    }
    eprintln!("power cuts across shards: {total:?}");
    if many {
        assert!(
            total.cuts > 0 && total.in_volume_change > 0,
            "the cuts missed what they are for: {total:?}"
        );
    }
}
