//! Shards sharing one cache and one capacity device (`Shards::format_pooled`):
//! each shard's metadata in a window of its own, every chunk and zone held by one
//! shard, the space manager moving free chunks and zones to the shard that writes,
//! and every flushed block kept across moves, kills and reopens.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shale_device::{BlockDevice, MemDevice, SharedCache, SharedZones, ZoneEmu};
use shale_engine::{Config, ManualClock, Reply, Request};
use shale_shards::{LocalShards, Shards};
use shale_testkit::pattern;

mod common;

use common::{check_blocks, create, zone_config, BS, ZONE_BLOCKS};

type Cache = SharedCache<MemDevice>;
type Cap = SharedZones<ZoneEmu<MemDevice>>;
type Local = LocalShards<Cache, Cap, ManualClock>;

const GRANULE: u64 = 8192;
const ZONES: u32 = 49;
/// Chunks of 256 blocks in the shared area, with room for the metadata windows.
const CACHE_BLOCKS: u64 = 4 * 256 + 20 * 256;

/// Compaction starts late, so a shard that writes runs short of free chunks while
/// the others have many to lend.
fn config() -> Config {
    Config {
        streams_max: 1,
        spare_factor: 0.5,
        compaction_free_chunks_pct: 20,
        ..shale_testkit::tiny_config()
    }
}

fn devices() -> (MemDevice, ZoneEmu<MemDevice>) {
    let cache = MemDevice::new(CACHE_BLOCKS * BS, 4096).unwrap();
    let inner = MemDevice::new((u64::from(ZONES) + 2) * ZONE_BLOCKS * BS, 4096).unwrap();
    (cache, ZoneEmu::format(inner, &zone_config(ZONES)).unwrap())
}

/// The two devices back from a pool's views (every view but one dropped).
/// Completions of a dead process's requests die with its rings: dropped here.
fn device_of(pairs: Vec<(Cache, Cap)>) -> (MemDevice, ZoneEmu<MemDevice>) {
    let (mut caches, mut zones): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
    let z = zones.pop().unwrap();
    drop(zones);
    let c = caches.pop().unwrap();
    drop(caches);
    let mut cache = c.into_inner().expect("every other view dropped");
    let mut inner = z
        .into_inner()
        .expect("every other view dropped")
        .into_inner();
    cache.poll(&mut Vec::new(), 0).unwrap();
    inner.poll(&mut Vec::new(), 0).unwrap();
    (cache, ZoneEmu::open(inner).unwrap())
}

fn local_open(cache: MemDevice, cap: ZoneEmu<MemDevice>) -> Local {
    let devices = shale_shards::cache::pooled_devices_recorded(cache, cap).unwrap();
    Local::open(devices, ManualClock::new, &config()).unwrap().0
}

/// Every chunk and every zone is held by exactly one shard.
#[track_caller]
fn held_once(st: &shale_engine::Stats, chunks: u32, n: usize, ctx: &str) {
    assert_eq!(st.chunk_count, u64::from(chunks), "{ctx}: chunks held");
    assert_eq!(
        st.data_zone_count + n as u64,
        u64::from(ZONES),
        "{ctx}: zones held"
    );
}

#[test]
fn a_pool_on_one_cache_finds_its_shards_and_lends_chunks_to_the_one_that_writes() {
    let (cache, cap) = devices();
    let p = Shards::format_pooled(cache, cap, 2, ManualClock::new, &config(), GRANULE, 64).unwrap();
    let chunks = p.chunk_lending().expect("a shared cache").zone_count();
    assert!(p.lending().is_some(), "a shared capacity device");
    let stats = |p: &Shards<Cache, Cap>| match p.call(Request::Stats).unwrap() {
        Reply::Stats(s) => *s,
        r => panic!("{r:?}"),
    };
    held_once(&stats(&p), chunks, 2, "format");
    let size = p.user_capacity_bytes() / 2 / (2 * GRANULE) * (2 * GRANULE);
    let v = create(size, |r| p.call(r));
    let blocks = size / BS;
    let mut model = vec![0u64; blocks as usize];
    let mine: Vec<u64> = (0..blocks)
        .filter(|&b| p.map().locate(b * BS).0 == 0)
        .collect();
    let mut moved = 0;
    let mut x = 5u64;
    for i in 0..6 * mine.len() as u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let b = mine[((x >> 33) % mine.len() as u64) as usize];
        p.call(Request::Write {
            volume: v,
            offset: b * BS,
            data: pattern(i + 1, BS as usize),
            fua: false,
        })
        .unwrap();
        model[b as usize] = i + 1;
        if i % 64 == 0 {
            moved += p.rebalance(2).unwrap();
        }
    }
    p.call(Request::Flush).unwrap();
    let st = stats(&p);
    assert!(st.chunks_given > 0, "no chunk moved: {st:?}");
    assert!(moved as u64 >= st.chunks_given);
    held_once(&st, chunks, 2, "after the moves");
    p.call(Request::SelfCheck).unwrap();
    check_blocks(v, &model, "", |r| p.call(r));
    // A clean reopen finds the split from shard 0's superblock.
    let pairs = p.shutdown().unwrap();
    let (cache, cap) = device_of(pairs);
    let (p, _) = Shards::open_pooled(cache, cap, ManualClock::new, &config(), 64).unwrap();
    held_once(&stats(&p), chunks, 2, "after the reopen");
    check_blocks(v, &model, "reopened: ", |r| p.call(r));
}

#[test]
fn a_cache_too_small_for_the_windows_is_refused_and_per_shard_caches_are_not_taken_for_one() {
    let cache = MemDevice::new(600 * BS, 4096).unwrap();
    let (_, cap) = devices();
    let r = Shards::format_pooled(cache, cap, 2, ManualClock::new, &config(), GRANULE, 64);
    assert!(r.is_err(), "a cache with no room for chunks was formatted");
    let (cache, cap) = devices();
    let p = Shards::format_shared(
        vec![
            MemDevice::new((128 + 6 * 256) * BS, 4096).unwrap(),
            MemDevice::new((128 + 6 * 256) * BS, 4096).unwrap(),
        ],
        cap,
        ManualClock::new,
        &config(),
        GRANULE,
        64,
    )
    .unwrap();
    let mut own = p.shutdown().unwrap().into_iter().next().unwrap().0;
    assert_eq!(
        shale_shards::cache::recorded_cache_split(&mut own).unwrap(),
        None
    );
    let mut blank = cache;
    assert_eq!(
        shale_shards::cache::recorded_cache_split(&mut blank).unwrap(),
        None
    );
}

/// Random writes leaning on one shard, flushes, moves, kills and clean reopens of a
/// pool of 2 or 3 shards on one cache and one capacity device: every flushed block
/// reads back, every chunk and zone is held once, and each shard's self-check holds
/// after every step. `SHALE_SEED` reruns one seed.
#[test]
fn random_moves_kills_and_reopens_on_one_cache_keep_every_flushed_block() {
    let seeds: Vec<u64> = match std::env::var("SHALE_SEED") {
        Ok(s) => vec![s.parse().expect("SHALE_SEED is a number")],
        Err(_) => (0..6).collect(),
    };
    for seed in seeds {
        eprintln!("seed {seed} (SHALE_SEED={seed} reruns it)");
        let mut x = seed.wrapping_add(0xcace);
        let mut next = move |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let n = 2 + next(2) as usize;
        let (cache, cap) = devices();
        let (devs, cfg) = shale_shards::cache::pooled_devices(cache, cap, &config(), n).unwrap();
        let mut p = Local::format(devs, ManualClock::new, &cfg, GRANULE).unwrap();
        let chunks = p.chunk_lending().expect("a shared cache").zone_count();
        let size = p.user_capacity_bytes() / 2 / (n as u64 * GRANULE) * (n as u64 * GRANULE);
        let v = create(size, |r| p.call(r));
        let blocks = size / BS;
        let mut model = vec![0u64; blocks as usize];
        let mut moved = 0;
        let mut chunks_moved = 0;
        for step in 0..40u64 {
            let ctx = format!("seed {seed} step {step}");
            match next(8) {
                0 => {
                    let (cache, cap) = device_of(p.abandon());
                    p = local_open(cache, cap);
                }
                1 => {
                    let (cache, cap) = device_of(p.shutdown().unwrap());
                    p = local_open(cache, cap);
                }
                2 | 3 => {
                    let before = p.stats().chunks_given;
                    moved += p.rebalance(1 + next(2) as u32).unwrap();
                    chunks_moved += p.stats().chunks_given - before;
                }
                _ => {
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
            held_once(&p.stats(), chunks, n, &ctx);
        }
        check_blocks(v, &model, &format!("seed {seed}: "), |r| p.call(r));
        eprintln!("seed {seed}: {n} shards, {moved} moved ({chunks_moved} chunks)");
    }
}
