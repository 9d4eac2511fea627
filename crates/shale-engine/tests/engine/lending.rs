//! Zones given to and taken from the space manager (`Request::GiveZones`,
//! `Request::TakeZones`): a given zone is another shard's here, across clean reopens
//! and crashes, and is never scanned, reset or written here until it is taken back.

use crate::common::*;
use shale_device::{ZoneEmu, ZoneState, ZonedDevice};
use shale_engine::{Engine, EngineError, ManualClock, Reply, Request, VolumeUid};

/// The tiny configuration with a large spare: a shard lends only spare (down to
/// half of it), so there is some to lend.
fn lending_config() -> shale_engine::Config {
    shale_engine::Config {
        spare_factor: 0.5,
        ..tiny_config()
    }
}

fn lending_engine() -> Eng {
    let (c, z) = devices(128 + 8 * 256, 28);
    Engine::format(c, z, ManualClock::new(), lending_config()).unwrap()
}

fn give(e: &mut Eng, count: u32) -> Vec<u32> {
    match call(e, Request::GiveZones { count }).unwrap() {
        Reply::Zones(z) => z,
        r => panic!("unexpected {r:?}"),
    }
}

fn take(e: &mut Eng, zones: &[u32]) -> Result<(), EngineError> {
    call(
        e,
        Request::TakeZones {
            zones: zones.to_vec(),
        },
    )
    .map(|_| ())
}

/// The engine abandoned as by a kill (the devices keep every write) and opened
/// again: a recovery.
fn kill(e: Eng) -> Eng {
    let (c, z) = e.abandon();
    let z = ZoneEmu::open(z.into_inner()).unwrap();
    let mut e = Engine::open(c, z, ManualClock::new(), lending_config()).unwrap();
    e.self_check().unwrap();
    e
}

/// Writes block `lba` of `v` with data of `seed`, and notes it.
fn put(e: &mut Eng, v: VolumeUid, model: &mut [u64], lba: u64, seed: u64) {
    write(e, v, lba * 4096, &pattern(seed, 4096)).unwrap();
    model[lba as usize] = seed;
}

#[track_caller]
fn verify(e: &mut Eng, v: VolumeUid, model: &[u64]) {
    for (lba, &seed) in model.iter().enumerate() {
        let want = if seed == 0 {
            vec![0; 4096]
        } else {
            pattern(seed, 4096)
        };
        assert!(
            read(e, v, lba as u64 * 4096, 4096).unwrap() == want,
            "block {lba}"
        );
    }
}

/// Enough overwrites that compaction and GC go through every zone the engine owns.
fn churn(e: &mut Eng, v: VolumeUid, model: &mut [u64], rounds: u64, salt: u64) {
    let n = model.len() as u64;
    let mut x = salt;
    for i in 0..rounds * n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        put(e, v, model, (x >> 33) % n, salt * 1_000_000 + i + 1);
    }
}

#[test]
fn a_given_zone_is_another_shards_until_it_is_taken_back() {
    let mut e = lending_engine();
    let s0 = e.stats();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    churn(&mut e, v, &mut model, 1, 1);
    let given = give(&mut e, 3);
    assert_eq!(given.len(), 3, "{given:?}");
    let s = e.stats();
    assert_eq!((s.foreign_zones, s.zones_given), (3, 3));
    assert_eq!(s.data_zone_count, s0.data_zone_count - 3);
    // The zones are not used while they are another shard's: every zone the engine
    // owns fills and empties meanwhile.
    churn(&mut e, v, &mut model, 2, 2);
    e.self_check().unwrap();
    assert_eq!(e.stats().foreign_zones, 3);
    // Another shard writes one of them; a crash here, then a clean reopen, leave
    // it alone (no stray-zone reset, no scan).
    call(&mut e, Request::Flush).unwrap();
    let (c, mut z) = e.abandon();
    let other = pattern(99, 4096);
    z.append(given[0], &other).unwrap();
    z.flush().unwrap();
    let z = ZoneEmu::open(z.into_inner()).unwrap();
    let mut e = Engine::open(c, z, ManualClock::new(), lending_config()).unwrap();
    e.self_check().unwrap();
    verify(&mut e, v, &model);
    let e = reopen(e, lending_config());
    assert_eq!(e.stats().foreign_zones, 3);
    let (c, z) = e.shutdown().unwrap();
    let info = z.zone_info(given[0]).unwrap();
    assert_ne!(
        info.state,
        ZoneState::Empty,
        "another shard's zone was reset"
    );
    let z = ZoneEmu::open(z.into_inner()).unwrap();
    let mut e = Engine::open(c, z, ManualClock::new(), lending_config()).unwrap();
    // Taken back, each is reset and used again.
    take(&mut e, &given).unwrap();
    let s = e.stats();
    assert_eq!((s.foreign_zones, s.zones_taken), (0, 3));
    assert_eq!(s.data_zone_count, s0.data_zone_count);
    churn(&mut e, v, &mut model, 2, 3);
    e.self_check().unwrap();
    verify(&mut e, v, &model);
    call(&mut e, Request::Flush).unwrap();
    let mut e = kill(e);
    verify(&mut e, v, &model);
}

#[test]
fn giving_keeps_what_gc_needs_and_taking_checks_every_zone_first() {
    let mut e = lending_engine();
    let free = e.stats().free_zones;
    let given = give(&mut e, 1000);
    let s = e.stats();
    assert!(
        !given.is_empty() && (given.len() as u64) < free,
        "{given:?}"
    );
    assert_eq!(s.free_zones, free - given.len() as u64);
    // Nothing more to give: the engine keeps one more free zone than its GC
    // threshold, and zones for all the capacity it promised at half its spare.
    assert!(give(&mut e, 1000).is_empty());
    let most = given.len();
    let mine = {
        let mut all: Vec<u32> = (1..28).collect();
        all.retain(|z| !given.contains(z));
        all[0]
    };
    for bad in [
        vec![given[0], mine],
        vec![0],
        vec![28],
        vec![u32::MAX],
        vec![given[1], given[1]],
    ] {
        let r = take(&mut e, &bad);
        assert!(
            matches!(r, Err(EngineError::ZoneLending { .. })),
            "{bad:?}: {r:?}"
        );
        assert_eq!(e.stats().foreign_zones, given.len() as u64, "{bad:?}");
    }
    e.self_check().unwrap();
    take(&mut e, &given[3..]).unwrap();
    let given = &given[..3];
    assert_eq!(e.stats().foreign_zones, 3);
    // Only spare is lent: the format's whole capacity is still there for a volume,
    // and GC works in what is left.
    let all = e.user_capacity_bytes();
    let blocks = all / 4096;
    let v = create(&mut e, "v", blocks * 4096);
    // Never more lent than before the volume: the floor is the capacity promised,
    // not what the volumes hold.
    take(&mut e, &given[..1]).unwrap();
    let again = give(&mut e, 1000);
    assert!(2 + again.len() <= most, "{again:?} after {most}");
    assert!(give(&mut e, 1000).is_empty());
    let mut model = vec![0u64; blocks as usize];
    churn(&mut e, v, &mut model, 3, 4);
    e.self_check().unwrap();
    verify(&mut e, v, &model);
}

#[test]
fn a_taken_zone_is_recorded_only_once_it_holds_data() {
    let mut e = lending_engine();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    let given = give(&mut e, 4);
    // Taken and killed before anything used it: it is another shard's again (the
    // pool hands such zones out at its open).
    take(&mut e, &given).unwrap();
    let mut e = kill(e);
    assert_eq!(e.stats().foreign_zones, 4);
    // Taken, then filled by compaction and GC, and killed after a flush: the data
    // in it survives, and the zones are this engine's.
    take(&mut e, &given).unwrap();
    churn(&mut e, v, &mut model, 3, 5);
    call(&mut e, Request::Flush).unwrap();
    let mut e = kill(e);
    verify(&mut e, v, &model);
    assert_eq!(e.stats().foreign_zones, 0, "{:?}", e.stats().foreign_zones);
}

/// Random gives, takes, writes, flushes, kills and clean reopens: every flushed
/// write reads back, the accounting of foreign zones follows a model, and the
/// self-check holds after every step.
#[test]
fn random_lending_keeps_data_and_accounting() {
    let seed: u64 = std::env::var("SHALE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1e9d);
    eprintln!("seed {seed} (SHALE_SEED={seed} reruns it)");
    let mut x = seed;
    let mut next = move |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut e = lending_engine();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    // Zones given and not taken back: what the engine must say is foreign, except
    // zones taken since the last durable record of them (a kill gives them back).
    let mut away: Vec<u32> = Vec::new();
    let mut taken_since_checkpoint: Vec<u32> = Vec::new();
    for step in 0..60u64 {
        match next(6) {
            0 => {
                let g = give(&mut e, 1 + next(3) as u32);
                away.extend(&g);
                taken_since_checkpoint.clear();
            }
            1 if !away.is_empty() => {
                let n = 1 + next(away.len() as u64) as usize;
                let back: Vec<u32> = away.drain(..n).collect();
                take(&mut e, &back).unwrap();
                taken_since_checkpoint.extend(&back);
            }
            2 => {
                e = kill(e);
                // Zones taken and not yet written may come back as foreign.
                let foreign = e.stats().foreign_zones as usize;
                assert!(
                    foreign >= away.len() && foreign <= away.len() + taken_since_checkpoint.len(),
                    "seed {seed} step {step}: {foreign} foreign, {} away",
                    away.len()
                );
                // Whatever came back foreign the test takes again (a zone recorded
                // as this engine's, since it held data, is refused).
                let back = std::mem::take(&mut taken_since_checkpoint);
                for z in back {
                    if take(&mut e, &[z]).is_ok() {
                        taken_since_checkpoint.push(z);
                    }
                }
            }
            3 => {
                e = reopen(e, lending_config());
                taken_since_checkpoint.clear();
            }
            _ => {
                for _ in 0..200 {
                    let lba = next(blocks);
                    put(&mut e, v, &mut model, lba, step * 1000 + lba + 1);
                }
                call(&mut e, Request::Flush).unwrap();
            }
        }
        e.self_check()
            .unwrap_or_else(|err| panic!("seed {seed} step {step}: {err}"));
        assert_eq!(
            e.stats().foreign_zones as usize,
            away.len(),
            "seed {seed} step {step}"
        );
    }
    verify(&mut e, v, &model);
}
