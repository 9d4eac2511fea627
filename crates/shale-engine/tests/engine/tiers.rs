//! A pool with a cold tier (`Config::cold_zones`): GC moves every block it relocates
//! into the cold zones, blocks read often there come back to the fast tier, and both
//! survive a clean reopen and a recovery. The crash simulator cuts power under it.

use crate::common::*;
use shale_device::{MemDevice, ZoneEmu, ZonedConcat};
use shale_engine::{Config, Engine, ManualClock};

type Tiers = ZonedConcat<Cap, Cap>;
type TEng = Engine<MemDevice, Tiers, ManualClock>;

const FAST: u64 = 14;
const COLD: u64 = 24;
const VOLUME: u64 = 16 << 20;

fn config() -> Config {
    Config {
        cold_zones: COLD as u32,
        promote_reads: 3,
        ..tiny_config()
    }
}

fn tiered(clock: &ManualClock) -> TEng {
    let (c, fast) = devices(128 + 8 * 256, FAST);
    let (_, cold) = devices(1, COLD);
    let cap = ZonedConcat::tiers(fast, cold).unwrap();
    Engine::format(c, cap, clock.clone(), config()).unwrap()
}

fn reopen_tiers(cache: MemDevice, cap: Tiers, clock: &ManualClock) -> TEng {
    let (fast, cold) = cap.into_parts();
    let fast = ZoneEmu::open(fast.into_inner()).unwrap();
    let cold = ZoneEmu::open(cold.into_inner()).unwrap();
    let cap = ZonedConcat::tiers(fast, cold).unwrap();
    Engine::open(cache, cap, clock.clone(), config()).unwrap()
}

/// Every block reads back as the version `expect` names.
fn check(e: &mut TEng, v: shale_engine::VolumeUid, expect: &[u64]) {
    for (chunk, seeds) in expect.chunks(16).enumerate() {
        let got = read(e, v, chunk as u64 * 16 * 4096, seeds.len() as u64 * 4096).unwrap();
        for (i, &seed) in seeds.iter().enumerate() {
            let lba = chunk * 16 + i;
            assert!(
                got[i * 4096..(i + 1) * 4096] == pattern(seed, 4096)[..],
                "block {lba}: not version {seed}"
            );
        }
    }
}

#[test]
fn gc_moves_blocks_into_the_cold_tier_and_hot_reads_bring_them_back() {
    let clock = ManualClock::new();
    let mut e = tiered(&clock);
    let v = create(&mut e, "v", VOLUME);
    let blocks = VOLUME / 4096;
    let mut expect: Vec<u64> = (0..blocks).map(|b| b + 1).collect();
    for b in (0..blocks).step_by(16) {
        let data: Vec<u8> = (b..b + 16).flat_map(|x| pattern(x + 1, 4096)).collect();
        write(&mut e, v, b * 4096, &data).unwrap();
    }
    // Overwrites of the first half: its zones empty, GC moves the rest.
    let mut x = 7u64;
    for round in 0..3 * blocks / 2 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x % (blocks / 2);
        let seed = 1_000_000 + round;
        write(&mut e, v, b * 4096, &pattern(seed, 4096)).unwrap();
        expect[b as usize] = seed;
    }
    e.run_until_idle().unwrap();
    let s = e.stats();
    assert_eq!(s.cold_zone_count, COLD);
    assert!(s.capacity_gc_write_bytes > 0, "GC ran");
    assert!(s.free_cold_zones < COLD, "GC wrote cold zones: {s:?}");
    check(&mut e, v, &expect);
    e.self_check().unwrap();

    // The second half, written once and moved by GC, is read from the cold tier; reads
    // of one extent past the threshold bring its blocks back.
    let before = e.stats();
    let extent = VOLUME / 2 + (1 << 20);
    let cold_extent = (0..8).find_map(|i| {
        let at = extent + i * (1 << 20);
        let r0 = e.stats().cold_read_blocks;
        read(&mut e, v, at, 1 << 16).unwrap();
        (e.stats().cold_read_blocks > r0).then_some(at)
    });
    let at = cold_extent.expect("some extent of the second half is in the cold tier");
    for _ in 0..4 {
        read(&mut e, v, at, 1 << 16).unwrap();
    }
    let s = e.stats();
    assert!(s.cold_read_blocks > before.cold_read_blocks);
    assert!(s.promotions_staged > 0, "hot cold blocks staged: {s:?}");
    // Nothing else is written: after the linger the group goes out padded.
    clock.advance_ns(config().promote_linger_us * 1_000 + 1);
    e.run_until_idle().unwrap();
    let r0 = e.stats().cold_read_blocks;
    read(&mut e, v, at, 1 << 16).unwrap();
    let again = e.stats().cold_read_blocks - r0;
    assert!(
        again < 16,
        "promoted blocks are read from the fast tier ({again} cold)"
    );
    check(&mut e, v, &expect);
    e.self_check().unwrap();

    // A clean reopen, then a recovery, keep every block and the tiers.
    let (c, cap) = e.shutdown().unwrap();
    let mut e = reopen_tiers(c, cap, &clock);
    assert_eq!(e.stats().cold_zone_count, COLD);
    check(&mut e, v, &expect);
    write(&mut e, v, 0, &pattern(5, 4096)).unwrap();
    expect[0] = 5;
    call(&mut e, shale_engine::Request::Flush).unwrap();
    let (c, cap) = e.abandon();
    let mut e = reopen_tiers(c, cap, &clock);
    check(&mut e, v, &expect);
    e.self_check().unwrap();
}

/// Formats refuse tiers too small for their reserves, by name.
#[test]
fn a_cold_tier_needs_room_for_its_reserve() {
    let (c, fast) = devices(128 + 8 * 256, FAST);
    let (_, cold) = devices(1, 4);
    let cap = ZonedConcat::tiers(fast, cold).unwrap();
    let config = Config {
        cold_zones: 4,
        ..tiny_config()
    };
    let err = Engine::format(c, cap, ManualClock::new(), config)
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("cold"), "{err}");
}
