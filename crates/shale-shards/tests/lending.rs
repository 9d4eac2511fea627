//! Shards sharing one capacity device (`Shards::format_shared`): every zone is held
//! by one shard, the space manager moves free zones to the shard that writes most,
//! zones no shard holds are handed out at open, and the data stays whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shale_device::{MemDevice, SharedZones, ZoneEmu};
use shale_engine::{Config, Engine, ManualClock, Reply, Request, Stats, VolumeUid};
use shale_shards::Shards;
use shale_testkit::pattern;

mod common;

use common::{check_blocks, create, zone_config, BS, ZONE_BLOCKS};

type Cap = SharedZones<ZoneEmu<MemDevice>>;
type Pool = Shards<MemDevice, Cap>;

const GRANULE: u64 = 8192;
/// Two shards' runs of 24 zones and one zone over, which neither starts with.
const ZONES: u32 = 49;

fn config() -> Config {
    Config {
        streams_max: 1,
        spare_factor: 0.5,
        ..shale_testkit::tiny_config()
    }
}

fn caches(n: usize) -> Vec<MemDevice> {
    (0..n)
        .map(|_| MemDevice::new((128 + 6 * 256) * BS, 4096).unwrap())
        .collect()
}

fn capacity() -> ZoneEmu<MemDevice> {
    let inner = MemDevice::new((u64::from(ZONES) + 2) * ZONE_BLOCKS * BS, 4096).unwrap();
    ZoneEmu::format(inner, &zone_config(ZONES)).unwrap()
}

fn two_shards() -> Pool {
    Pool::format_shared(
        caches(2),
        capacity(),
        ManualClock::new,
        &config(),
        GRANULE,
        64,
    )
    .unwrap()
}

/// The caches and the capacity device back from a pool shut down cleanly.
fn shut(p: Pool) -> (Vec<MemDevice>, ZoneEmu<MemDevice>) {
    let mut caches = Vec::new();
    let mut views = Vec::new();
    for (c, z) in p.shutdown().unwrap() {
        caches.push(c);
        views.push(z);
    }
    let last = views.pop().unwrap();
    drop(views);
    (caches, last.into_inner().expect("every other view dropped"))
}

fn open(caches: Vec<MemDevice>, cap: ZoneEmu<MemDevice>) -> Pool {
    let cap = ZoneEmu::open(cap.into_inner()).unwrap();
    Shards::open_shared(caches, cap, ManualClock::new, &config(), 64)
        .unwrap()
        .0
}

fn shard_stats(p: &Pool) -> Stats {
    match p.call(Request::Stats).unwrap() {
        Reply::Stats(s) => *s,
        r => panic!("{r:?}"),
    }
}

/// Every zone is held by exactly one shard: the shards' own zones (their data zones
/// and their label) add up to the device.
fn every_zone_held_once(p: &Pool) {
    let s = shard_stats(p);
    assert_eq!(
        s.data_zone_count + p.shards() as u64,
        u64::from(ZONES),
        "{s:?}"
    );
    p.call(Request::SelfCheck).unwrap();
}

fn write_block(p: &Pool, v: VolumeUid, block: u64, seed: u64) {
    p.call(Request::Write {
        volume: v,
        offset: block * BS,
        data: pattern(seed, BS as usize),
        fua: false,
    })
    .unwrap();
}

fn verify(p: &Pool, v: VolumeUid, model: &[u64]) {
    check_blocks(v, model, "", |r| p.call(r));
}

/// A volume of half the pool, and every block of shard 0's in it overwritten again
/// and again (`step` called every 64 writes): shard 0's GC runs and its free zones
/// fall while shard 1's stay. Returns the volume and what each block holds.
fn hammer_shard_0(p: &Pool, mut step: impl FnMut(&Pool)) -> (VolumeUid, Vec<u64>) {
    let size = p.user_capacity_bytes() / 2 / (2 * GRANULE) * (2 * GRANULE);
    let v = create(size, |r| p.call(r));
    let blocks = size / BS;
    let mut model = vec![0u64; blocks as usize];
    let mine: Vec<u64> = (0..blocks)
        .filter(|&b| p.map().locate(b * BS).0 == 0)
        .collect();
    let mut x = 7u64;
    for i in 0..6 * mine.len() as u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let b = mine[((x >> 33) % mine.len() as u64) as usize];
        write_block(p, v, b, i + 1);
        model[b as usize] = i + 1;
        if i % 64 == 0 {
            step(p);
        }
    }
    p.call(Request::Flush).unwrap();
    (v, model)
}

/// The moves hold across a clean reopen: every zone is where it went, the data whole.
fn reopen_and_verify(p: Pool, v: VolumeUid, model: &[u64]) {
    every_zone_held_once(&p);
    verify(&p, v, model);
    let (caches, cap) = shut(p);
    let p = open(caches, cap);
    every_zone_held_once(&p);
    verify(&p, v, model);
}

#[test]
fn the_manager_lends_free_zones_to_the_shard_that_writes() {
    let p = two_shards();
    let lending = p.lending().expect("a shared device");
    assert_eq!(lending.device_zone(1, 0), 24);
    // The zone neither shard started with was handed out at format.
    every_zone_held_once(&p);
    let mut moved = 0;
    let (v, model) = hammer_shard_0(&p, |p| moved += p.rebalance(2).unwrap());
    assert!(moved > 0, "no zone moved");
    // What moved was given by one shard and taken by the other; the zone handed out
    // at format was taken too.
    let s = shard_stats(&p);
    assert_eq!(
        (s.zones_given, s.zones_taken),
        (moved as u64, moved as u64 + 1)
    );
    reopen_and_verify(p, v, &model);
}

#[test]
fn the_space_managers_thread_moves_zones_by_itself() {
    let p = std::sync::Arc::new(two_shards());
    let manager = p
        .spawn_space_manager(std::time::Duration::from_millis(1), 2)
        .unwrap()
        .expect("a shared device");
    let (v, model) = hammer_shard_0(&p, |_| {
        std::thread::sleep(std::time::Duration::from_millis(2))
    });
    manager.stop();
    let p = std::sync::Arc::try_unwrap(p).expect("the manager let go of the pool");
    let s = shard_stats(&p);
    assert!(s.zones_given > 0, "{s:?}");
    assert_eq!(s.zones_taken, s.zones_given + 1);
    reopen_and_verify(p, v, &model);
}

#[test]
fn zones_no_shard_holds_are_handed_out_at_open() {
    let p = two_shards();
    every_zone_held_once(&p);
    let pairs = p.shutdown().unwrap();
    // Shard 1 alone gives zones away, and nobody takes them (the manager stopped
    // between the give and the take): no shard holds them.
    let mut pairs = pairs.into_iter();
    let (c0, z0) = pairs.next().unwrap();
    let (c1, z1) = pairs.next().unwrap();
    let mut e1 = Engine::open(c1, z1, ManualClock::new(), config()).unwrap();
    let given = match shale_testkit::call(&mut e1, Request::GiveZones { count: 3 }).unwrap() {
        Reply::Zones(z) => z,
        r => panic!("{r:?}"),
    };
    assert_eq!(given.len(), 3);
    let (c1, z1) = e1.shutdown().unwrap();
    drop(z0);
    let cap = z1.into_inner().expect("the other view dropped");
    let p = open(vec![c0, c1], cap);
    every_zone_held_once(&p);
}

#[test]
fn a_pool_whose_shards_each_hold_a_zone_is_refused() {
    let p = two_shards();
    let pairs: Vec<_> = p.shutdown().unwrap();
    let mut pairs = pairs.into_iter();
    let (c0, z0) = pairs.next().unwrap();
    let (c1, z1) = pairs.next().unwrap();
    // Shard 0 takes a zone shard 1 holds, behind the manager's back.
    let mut e0 = Engine::open(c0, z0, ManualClock::new(), config()).unwrap();
    let theirs = match shale_testkit::call(&mut e0, Request::ForeignZones).unwrap() {
        Reply::Zones(z) => z[5],
        r => panic!("{r:?}"),
    };
    shale_testkit::call(
        &mut e0,
        Request::TakeZones {
            zones: vec![theirs],
        },
    )
    .unwrap();
    let (c0, z0) = e0.shutdown().unwrap();
    drop(z0);
    let cap = ZoneEmu::open(z1.into_inner().unwrap().into_inner()).unwrap();
    let r = Shards::open_shared(vec![c0, c1], cap, ManualClock::new, &config(), 64);
    let Err(e) = r else {
        panic!("two holders of one zone were accepted");
    };
    assert!(e.to_string().contains("held by 2 shards"), "{e}");
}

type Local = shale_shards::LocalShards<MemDevice, Cap, ManualClock>;

/// The capacity device back from a pool's devices (every view but one dropped).
/// Completions of a dead process's requests die with its rings: dropped here.
fn device_of(pairs: Vec<(MemDevice, Cap)>) -> (Vec<MemDevice>, ZoneEmu<MemDevice>) {
    use shale_device::BlockDevice;
    let (mut caches, mut views): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
    let last = views.pop().unwrap();
    drop(views);
    let mut inner = last
        .into_inner()
        .expect("every other view dropped")
        .into_inner();
    for d in caches.iter_mut().chain([&mut inner]) {
        d.poll(&mut Vec::new(), 0).unwrap();
    }
    (caches, ZoneEmu::open(inner).unwrap())
}

fn local_open(caches: Vec<MemDevice>, cap: ZoneEmu<MemDevice>) -> Local {
    let views = SharedZones::split(cap, caches.len()).unwrap();
    Local::open(
        caches.into_iter().zip(views).collect(),
        ManualClock::new,
        &config(),
    )
    .unwrap()
    .0
}

/// Random writes leaning on one shard or another, flushes, moves of the space
/// manager, kills and clean reopens of a pool of 2 or 3 shards on one device: every
/// flushed block reads back, every zone is held by one shard, and each shard's
/// self-check holds after every step. `SHALE_SEED` reruns one seed.
#[test]
fn random_moves_kills_and_reopens_keep_every_flushed_block() {
    let seeds: Vec<u64> = match std::env::var("SHALE_SEED") {
        Ok(s) => vec![s.parse().expect("SHALE_SEED is a number")],
        Err(_) => (0..6).collect(),
    };
    for seed in seeds {
        eprintln!("seed {seed} (SHALE_SEED={seed} reruns it)");
        let mut x = seed.wrapping_add(0x5eed);
        let mut next = move |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let n = 2 + next(2) as usize;
        let views = SharedZones::split(capacity(), n).unwrap();
        let cfg = Config {
            zones_owned: Some(ZONES / n as u32),
            ..config()
        };
        let devices = caches(n).into_iter().zip(views).collect();
        let mut p = Local::format(devices, ManualClock::new, &cfg, GRANULE).unwrap();
        let size = p.user_capacity_bytes() / 2 / (n as u64 * GRANULE) * (n as u64 * GRANULE);
        let v = create(size, |r| p.call(r));
        let blocks = size / BS;
        let mut model = vec![0u64; blocks as usize];
        let mut moved = 0;
        for step in 0..40u64 {
            let ctx = format!("seed {seed} step {step}");
            match next(8) {
                0 => {
                    let (caches, cap) = device_of(p.abandon());
                    p = local_open(caches, cap);
                }
                1 => {
                    let (caches, cap) = device_of(p.shutdown().unwrap());
                    p = local_open(caches, cap);
                }
                2 | 3 => moved += p.rebalance(1 + next(2) as u32).unwrap(),
                _ => {
                    // Most writes to one shard's blocks: its free zones fall.
                    let hot = next(n as u64) as usize;
                    for i in 0..1500 {
                        let b = next(blocks);
                        if p.map().locate(b * BS).0 != hot && next(4) != 0 {
                            continue;
                        }
                        let id = step * 1000 + i + 1;
                        p.call(Request::Write {
                            volume: v,
                            offset: b * BS,
                            data: pattern(id, BS as usize),
                            fua: false,
                        })
                        .unwrap();
                        model[b as usize] = id;
                    }
                    p.call(Request::Flush).unwrap();
                }
            }
            p.self_check()
                .unwrap_or_else(|(s, e)| panic!("{ctx}: shard {s}: {e}"));
            let st = p.stats();
            assert_eq!(
                st.data_zone_count + n as u64,
                u64::from(ZONES),
                "{ctx}: zones held"
            );
        }
        check_blocks(v, &model, &format!("seed {seed}: "), |r| p.call(r));
        eprintln!("seed {seed}: {n} shards, {moved} zones moved");
    }
}
