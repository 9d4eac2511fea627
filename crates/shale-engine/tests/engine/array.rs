//! The engine over a zoned array: data survives members lost while it runs, at
//! open, and across a clean restart; more lost than the code survives fails loudly.

use std::collections::HashMap;

use crate::common::{call, create, pattern, read, tiny_config, write};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shale_array::{
    MemberState, MirrorDevice, Redundancy, StripeLayout, ZoneArray, LABEL_ZONES,
    MIRROR_RESERVED_BYTES,
};
use shale_device::{
    ErrorRule, FaultController, FaultDevice, MemDevice, ZoneEmu, ZoneEmuConfig, ZonedDevice,
};
use shale_engine::{Engine, ManualClock, Request, VolumeUid};

type Member = ZoneEmu<FaultDevice>;
type Arr = ZoneArray<Member>;
type AEng = Engine<MemDevice, Arr, ManualClock>;

const ZONES: u64 = 28;
/// Array zones of 256 blocks, as the other engine tests use.
const ARRAY_ZONE_BLOCKS: u64 = 256;

fn members(n: usize, k: u64, seed: u64) -> (Vec<(Option<Member>, String)>, Vec<FaultController>) {
    // Two rows a zone, each one 512 KiB group (K units, the last partly padding when
    // K does not divide it).
    let unit = StripeLayout::choose_unit(k as u32, 4096).unwrap();
    let zone = ARRAY_ZONE_BLOCKS / 128 * unit;
    let mut zc = ZoneEmuConfig::new(zone);
    zc.max_open_zones = 8;
    zc.max_active_zones = 8;
    let bytes = zc.device_bytes_for(ZONES as u32 + LABEL_ZONES).unwrap();
    let mut ctls = Vec::new();
    let ms = (0..n)
        .map(|i| {
            let d = FaultDevice::new(bytes, 4096, seed + i as u64).unwrap();
            ctls.push(d.controller());
            (Some(ZoneEmu::format(d, &zc).unwrap()), format!("m{i}"))
        })
        .collect();
    (ms, ctls)
}

fn engine(r: Redundancy, n: usize, seed: u64) -> (AEng, Vec<FaultController>) {
    let (k, _) = r.shards(n).unwrap();
    let (ms, ctls) = members(n, u64::from(k), seed);
    let unit = StripeLayout::choose_unit(k, 4096).unwrap();
    let arr = ZoneArray::new(ms, r, unit).unwrap();
    let cache = MemDevice::new((128 + 8 * 256) * 4096, 4096).unwrap();
    let e = Engine::format(cache, arr, ManualClock::new(), tiny_config()).unwrap();
    (e, ctls)
}

/// Writes `n` random 4 KiB blocks (overwrites included); the model remembers each
/// block's pattern seed.
fn churn<C: shale_device::BlockDevice>(
    e: &mut Engine<C, Arr, ManualClock>,
    v: VolumeUid,
    blocks: u64,
    n: u32,
    rng: &mut ChaCha8Rng,
    model: &mut HashMap<u64, u64>,
) {
    for _ in 0..n {
        let lba = rng.gen_range(0..blocks);
        let seed = rng.gen::<u64>();
        write(e, v, lba * 4096, &pattern(seed, 4096)).unwrap();
        model.insert(lba, seed);
    }
}

fn verify<C: shale_device::BlockDevice>(
    e: &mut Engine<C, Arr, ManualClock>,
    v: VolumeUid,
    model: &HashMap<u64, u64>,
) {
    // In LBA order: which mirror serves a group's first md read depends on the reads
    // before it, and the tests that count repairs must not depend on a hash order.
    let mut blocks: Vec<_> = model.iter().collect();
    blocks.sort_unstable();
    for (&lba, &seed) in blocks {
        let got = read(e, v, lba * 4096, 4096).unwrap();
        assert!(got == pattern(seed, 4096), "lba {lba}: wrong data");
    }
}

fn reopen(e: AEng, r: Redundancy, drop_member: Option<usize>) -> AEng {
    let (cache, arr) = e.shutdown().unwrap();
    let (k, _) = r.shards(arr.layout().members as usize).unwrap();
    let unit = arr.layout().unit;
    let ms = arr
        .into_members()
        .into_iter()
        .enumerate()
        .map(|(i, (d, name))| {
            let d = d.filter(|_| Some(i) != drop_member);
            (d.map(|d| ZoneEmu::open(d.into_inner()).unwrap()), name)
        })
        .collect();
    let _ = k;
    Engine::open(
        cache,
        ZoneArray::new(ms, r, unit).unwrap(),
        ManualClock::new(),
        tiny_config(),
    )
    .unwrap()
}

#[test]
fn a_member_failing_under_load_loses_nothing() {
    for (r, n) in [
        (Redundancy::Parity { k: 4, m: 1 }, 5),
        (Redundancy::Parity { k: 2, m: 2 }, 4),
        (Redundancy::Parity { k: 3, m: 1 }, 4),
        (Redundancy::Parity { k: 6, m: 2 }, 8),
        (Redundancy::Mirror, 2),
    ] {
        let mut rng = ChaCha8Rng::seed_from_u64(n as u64);
        let (mut e, ctls) = engine(r, n, 40);
        let v = create(&mut e, "a", 14 << 20);
        let blocks = (14 << 20) / 4096;
        let mut model = HashMap::new();
        churn(&mut e, v, blocks, 6000, &mut rng, &mut model);
        call(&mut e, Request::Flush).unwrap();
        // Member 1 starts failing every request: the first error takes it out.
        ctls[1].add_error_rule(ErrorRule {
            reads: true,
            writes: true,
            offset: 0,
            len: u64::MAX,
            remaining: None,
        });
        churn(&mut e, v, blocks, 4000, &mut rng, &mut model);
        call(&mut e, Request::Flush).unwrap();
        verify(&mut e, v, &model);
        e.self_check().unwrap();
        let s = e.stats();
        assert!(s.capacity_gc_write_bytes > 0, "{r}: GC never ran");
        let mut e = reopen(e, r, Some(1));
        verify(&mut e, v, &model);
        churn(&mut e, v, blocks, 500, &mut rng, &mut model);
        verify(&mut e, v, &model);
        e.self_check().unwrap();
        let _ = e.shutdown().unwrap();
    }
}

#[test]
fn more_lost_members_than_the_code_survives_fail_loudly() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (mut e, ctls) = engine(r, 5, 90);
    let v = create(&mut e, "a", 3 << 20);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut model = HashMap::new();
    churn(&mut e, v, 700, 900, &mut rng, &mut model);
    call(&mut e, Request::Flush).unwrap();
    for c in &ctls[..2] {
        c.add_error_rule(ErrorRule {
            reads: true,
            writes: true,
            offset: 0,
            len: u64::MAX,
            remaining: None,
        });
    }
    // Reads of data on the capacity array fail with an error, never wrong bytes;
    // writes fail once compaction needs the array.
    let mut errors = 0;
    for (&lba, &seed) in &model {
        match read(&mut e, v, lba * 4096, 4096) {
            Ok(d) => assert!(d == pattern(seed, 4096), "lba {lba}: wrong data"),
            Err(_) => errors += 1,
        }
        if errors > 0 {
            break;
        }
    }
    let mut failed_write = errors > 0;
    for i in 0..3000u64 {
        if write(&mut e, v, (i % 700) * 4096, &pattern(i, 4096)).is_err() {
            failed_write = true;
            break;
        }
    }
    assert!(
        failed_write,
        "the engine went on as if nothing had happened"
    );
    let _ = e;
}

#[test]
fn a_missing_member_at_open_is_served_degraded() {
    let r = Redundancy::Parity { k: 4, m: 2 };
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (ms, _ctls) = members(6, 4, 70);
    let arr = ZoneArray::new(ms, r, shale_array::STRIPE_BYTES_MAX / 4).unwrap();
    let cache = MemDevice::new((128 + 8 * 256) * 4096, 4096).unwrap();
    let mut e = Engine::format(cache, arr, ManualClock::new(), tiny_config()).unwrap();
    let v = create(&mut e, "a", 3 << 20);
    let mut model = HashMap::new();
    churn(&mut e, v, 700, 1200, &mut rng, &mut model);
    let mut e = reopen(e, r, Some(4));
    verify(&mut e, v, &model);
    let mut e = reopen(e, r, Some(0));
    verify(&mut e, v, &model);
    churn(&mut e, v, 700, 600, &mut rng, &mut model);
    verify(&mut e, v, &model);
    let (_, arr) = e.shutdown().unwrap();
    assert_eq!(arr.members()[0].state, MemberState::Missing);
    assert!(arr.geometry().write_unit > 4096);
}

type MEng = Engine<MirrorDevice<FaultDevice>, Arr, ManualClock>;

fn mirrored_cache(seed: u64) -> (MirrorDevice<FaultDevice>, Vec<FaultController>) {
    let bytes = MIRROR_RESERVED_BYTES + (128 + 8 * 256) * 4096;
    let mut ctls = Vec::new();
    let ms = (0..2)
        .map(|i| {
            let d = FaultDevice::new(bytes, 4096, seed + i).unwrap();
            ctls.push(d.controller());
            (Some(d), format!("cache{i}"))
        })
        .collect();
    (MirrorDevice::new(ms).unwrap(), ctls)
}

/// A cache mirror failing under load, then missing at open: every byte stays.
#[test]
fn a_cache_mirror_lost_under_load_loses_nothing() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (ms, _) = members(5, 4, 500);
    let arr = ZoneArray::new(ms, r, shale_array::STRIPE_BYTES_MAX / 4).unwrap();
    let (cache, cctls) = mirrored_cache(600);
    let mut e: MEng = Engine::format(cache, arr, ManualClock::new(), tiny_config()).unwrap();
    let v = create(&mut e, "a", 14 << 20);
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let mut model = HashMap::new();
    let blocks = (14 << 20) / 4096;
    let w = |e: &mut MEng, n: u32, rng: &mut ChaCha8Rng, model: &mut HashMap<u64, u64>| {
        for _ in 0..n {
            let lba = rng.gen_range(0..blocks);
            let seed = rng.gen::<u64>();
            write(e, v, lba * 4096, &pattern(seed, 4096)).unwrap();
            model.insert(lba, seed);
        }
    };
    w(&mut e, 3000, &mut rng, &mut model);
    cctls[0].add_error_rule(ErrorRule {
        reads: true,
        writes: true,
        offset: 0,
        len: u64::MAX,
        remaining: None,
    });
    w(&mut e, 3000, &mut rng, &mut model);
    call(&mut e, Request::Flush).unwrap();
    for (&lba, &seed) in &model {
        assert!(read(&mut e, v, lba * 4096, 4096).unwrap() == pattern(seed, 4096));
    }
    e.self_check().unwrap();
    let (cache, arr) = e.shutdown().unwrap();
    assert_eq!(cache.members()[0].state, MemberState::Failed);
    let cms: Vec<_> = cache
        .into_members()
        .into_iter()
        .enumerate()
        .map(|(i, (d, n))| (d.filter(|_| i != 0), n))
        .collect();
    let cache = MirrorDevice::new(cms).unwrap();
    let mut e: MEng = Engine::open(cache, arr, ManualClock::new(), tiny_config()).unwrap();
    for (&lba, &seed) in &model {
        assert!(read(&mut e, v, lba * 4096, 4096).unwrap() == pattern(seed, 4096));
    }
    w(&mut e, 500, &mut rng, &mut model);
    e.self_check().unwrap();
}

/// Bytes of member `m`'s zones overwritten behind the zone emulation: silent
/// corruption of one member in every zone that holds data.
fn corrupt_member(arr: &mut Arr, m: u32) -> u32 {
    use shale_device::BlockDevice;
    let zones = arr.geometry().zone_count;
    let live: Vec<u32> = (0..zones)
        .filter(|&z| {
            arr.zone_info(z).is_ok_and(|i| {
                i.write_pointer > i.start || i.state == shale_device::ZoneState::Full
            })
        })
        .collect();
    let dev = arr.member_device_mut(m).unwrap();
    let base = dev.data_offset();
    let zone = dev.geometry().zone_size;
    for &z in &live {
        // The first 16 KiB of the member's unit in rows 0 and 1 of the zone.
        for row in 0..2u64 {
            let at =
                base + u64::from(z + LABEL_ZONES) * zone + row * (ARRAY_ZONE_BLOCKS * 4096 / 4 / 2);
            dev.inner_mut().write_at(at, &[0xa5; 16384]).unwrap();
        }
    }
    live.len() as u32
}

#[test]
fn silent_corruption_of_one_member_reads_correct_and_is_repaired() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (mut e, _ctls) = engine(r, 5, 800);
    let v = create(&mut e, "a", 14 << 20);
    let blocks = (14 << 20) / 4096;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut model = HashMap::new();
    churn(&mut e, v, blocks, 5000, &mut rng, &mut model);
    let (cache, mut arr) = e.shutdown().unwrap();
    let zones = corrupt_member(&mut arr, 0);
    assert!(
        zones > 3,
        "too little data on the capacity array: {zones} zones"
    );
    let mut e: AEng = Engine::open(cache, arr, ManualClock::new(), tiny_config()).unwrap();
    verify(&mut e, v, &model);
    let s = e.stats();
    assert!(s.crc_rebuilt_fixes > 0, "nothing was rebuilt: {s:?}");
    assert!(s.repairs_staged > 0, "nothing was staged for repair");
    let first = s.crc_rebuilt_fixes;
    // Compaction writes the repaired blocks anew; the corrupt copies become garbage.
    churn(&mut e, v, blocks, 3000, &mut rng, &mut model);
    verify(&mut e, v, &model);
    e.self_check().unwrap();
    let again = e.stats().crc_rebuilt_fixes - first;
    assert!(
        again < first,
        "repairs did not stick: {again} more rebuilds after {first}"
    );
    let (_, arr) = e.shutdown().unwrap();
    assert!(arr.members()[0].counters.corrupt_reads > 0);
    assert_eq!(
        arr.members()[0].state,
        MemberState::Ok,
        "corruption alone fails no member"
    );
}

/// The background scrub finds corruption no read has met, rebuilds it, and has
/// compaction write it anew.
#[test]
fn the_scrub_finds_and_repairs_corruption_nobody_read() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (mut e, _ctls) = engine(r, 5, 900);
    let v = create(&mut e, "a", 14 << 20);
    let blocks = (14 << 20) / 4096;
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let mut model = HashMap::new();
    churn(&mut e, v, blocks, 5000, &mut rng, &mut model);
    let (cache, mut arr) = e.shutdown().unwrap();
    corrupt_member(&mut arr, 3);
    let clock = ManualClock::new();
    let config = shale_engine::Config {
        scrub_bytes_per_sec: 1 << 30,
        ..tiny_config()
    };
    let mut e: AEng = Engine::open(cache, arr, clock.clone(), config).unwrap();
    // Time passes with no request at all: only the scrub reads.
    for _ in 0..2_000 {
        clock.advance_ns(1_000_000);
        e.poll();
    }
    let s = e.stats();
    assert!(s.scrub_bytes > 0, "the scrub never ran");
    assert!(s.scrub_errors > 0, "the scrub found nothing");
    assert!(s.repairs_staged > 0, "nothing was staged for repair");
    assert_eq!(s.user_read_bytes, 0);
    verify(&mut e, v, &model);
    e.self_check().unwrap();
}

/// With `corrupt`, the first 64 bytes of every data slot of every cache chunk on
/// mirror `m` overwritten (md slots left alone): silent corruption of one mirror's
/// data. Returns how many data slots hold that corruption.
fn corrupt_cache_mirror(cache: &mut MirrorDevice<FaultDevice>, m: u32, corrupt: bool) -> u64 {
    use shale_device::BlockDevice;
    let dev = cache.member_device_mut(m).unwrap();
    let mut sb = vec![0u8; 4096];
    dev.read_at(MIRROR_RESERVED_BYTES, &mut sb).unwrap();
    let l = shale_format::Superblock::decode(&sb, 0).unwrap().layout;
    let mut n = 0;
    for slot in (0..l.cache_data_blocks()).filter(|s| s % 128 < 126) {
        let at = MIRROR_RESERVED_BYTES + (l.data_start + slot) * 4096;
        let mut b = vec![0u8; 4096];
        dev.read_at(at, &mut b).unwrap();
        if corrupt {
            b[..64].fill(0x5a);
            dev.write_at(at, &b).unwrap();
        }
        n += u64::from(b[..64].iter().all(|&x| x == 0x5a));
    }
    n
}

/// A mirrored cache with one mirror's data silently corrupt: reads take the other
/// mirror's copy and mend the bad one, compaction moves good copies, and afterwards
/// the mended mirror alone serves everything.
#[test]
fn a_corrupt_cache_mirror_is_read_around_and_mended() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (ms, _) = members(5, 4, 900);
    let arr = ZoneArray::new(ms, r, StripeLayout::choose_unit(4, 4096).unwrap()).unwrap();
    let (cache, _) = mirrored_cache(910);
    let mut cfg = tiny_config();
    cfg.verify_compaction_reads = true;
    let mut e: MEng = Engine::format(cache, arr, ManualClock::new(), cfg.clone()).unwrap();
    let v = create(&mut e, "a", 14 << 20);
    let blocks = (14 << 20) / 4096;
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let mut model = HashMap::new();
    let w = |e: &mut MEng, n: u32, rng: &mut ChaCha8Rng, model: &mut HashMap<u64, u64>| {
        for _ in 0..n {
            let lba = rng.gen_range(0..blocks);
            let seed = rng.gen::<u64>();
            write(e, v, lba * 4096, &pattern(seed, 4096)).unwrap();
            model.insert(lba, seed);
        }
    };
    let check = |e: &mut MEng, model: &HashMap<u64, u64>| {
        for (&lba, &seed) in model {
            assert!(
                read(e, v, lba * 4096, 4096).unwrap() == pattern(seed, 4096),
                "lba {lba}"
            );
        }
    };
    w(&mut e, 2500, &mut rng, &mut model);
    let (mut cache, arr) = e.shutdown().unwrap();
    let bad = corrupt_cache_mirror(&mut cache, 0, true);
    assert!(bad > 1000);
    let mut e: MEng = Engine::open(cache, arr, ManualClock::new(), cfg.clone()).unwrap();
    check(&mut e, &model);
    let fixes = e.stats().crc_rebuilt_fixes;
    assert!(fixes > 0, "no corrupt cache block was met");
    // Each one met was mended on the bad mirror (reads alternate between the
    // mirrors, so this pass met some of them only).
    let (mut cache, arr) = e.shutdown().unwrap();
    let left = corrupt_cache_mirror(&mut cache, 0, false);
    assert_eq!(left, bad - fixes, "met {fixes} of {bad}, {left} left");
    // Compaction moves the chunks out (checking what it moves: it takes the good
    // mirror's copy) while writes go on; everything still reads right.
    let mut e: MEng = Engine::open(cache, arr, ManualClock::new(), cfg).unwrap();
    w(&mut e, 3000, &mut rng, &mut model);
    check(&mut e, &model);
    e.self_check().unwrap();
}

/// Every written metadata block on cache mirror `m` (superblocks, volume tables,
/// checkpoints, journal, L2P pages, and the md slots of the cache chunks) has its
/// first 64 bytes overwritten. Returns how many blocks that touched.
fn corrupt_cache_metadata(cache: &mut MirrorDevice<FaultDevice>, m: u32) -> u64 {
    use shale_device::BlockDevice;
    let dev = cache.member_device_mut(m).unwrap();
    let mut sb = vec![0u8; 4096];
    dev.read_at(MIRROR_RESERVED_BYTES, &mut sb).unwrap();
    let l = shale_format::Superblock::decode(&sb, 0).unwrap().layout;
    let md_slots = (0..l.cache_data_blocks())
        .filter(|s| s % 128 >= 126)
        .map(|s| l.data_start + s);
    let mut n = 0;
    for block in (0..l.data_start).chain(md_slots) {
        let at = MIRROR_RESERVED_BYTES + block * 4096;
        let mut b = vec![0u8; 4096];
        dev.read_at(at, &mut b).unwrap();
        if b.iter().any(|&x| x != 0) {
            b[..64].fill(0x5a);
            dev.write_at(at, &b).unwrap();
            n += 1;
        }
    }
    n
}

/// A mirrored cache whose one mirror holds corrupt metadata everywhere (both
/// superblock copies, the checkpoints, the journal, L2P pages, md): open takes each
/// structure from the other mirror, every byte reads back, and the engine carries on.
#[test]
fn corrupt_cache_metadata_on_one_mirror_is_read_from_the_other() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (ms, _) = members(5, 4, 1300);
    let arr = ZoneArray::new(ms, r, StripeLayout::choose_unit(4, 4096).unwrap()).unwrap();
    let (cache, _) = mirrored_cache(1310);
    let mut cfg = tiny_config();
    cfg.verify_compaction_reads = true;
    let mut e: MEng = Engine::format(cache, arr, ManualClock::new(), cfg.clone()).unwrap();
    let v = create(&mut e, "a", 14 << 20);
    let blocks = (14 << 20) / 4096;
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let mut model = HashMap::new();
    churn(&mut e, v, blocks, 2500, &mut rng, &mut model);
    call(&mut e, Request::Flush).unwrap();
    // After a crash (journal entries since the checkpoint to replay) and after a clean
    // shutdown (checkpoint only).
    for clean in [false, true] {
        churn(&mut e, v, blocks, 300, &mut rng, &mut model);
        call(&mut e, Request::Flush).unwrap();
        let (mut cache, arr) = if clean {
            e.shutdown().unwrap()
        } else {
            e.abandon()
        };
        let n = corrupt_cache_metadata(&mut cache, 0);
        assert!(n > 20, "only {n} metadata blocks written");
        e = Engine::open(cache, arr, ManualClock::new(), cfg.clone())
            .unwrap_or_else(|err| panic!("open over a corrupt mirror (clean {clean}): {err}"));
        verify(&mut e, v, &model);
        churn(&mut e, v, blocks, 500, &mut rng, &mut model);
        verify(&mut e, v, &model);
        e.self_check().unwrap();
    }
}

/// On mirror `m`, the newer of each cache md pair (by its claimed generation)
/// overwritten: that mirror reads as the older copy, which lacks the entries written
/// since. Returns how many pairs had two copies to choose from.
fn corrupt_newer_cache_md(cache: &mut MirrorDevice<FaultDevice>, m: u32) -> u64 {
    use shale_device::BlockDevice;
    let dev = cache.member_device_mut(m).unwrap();
    let mut sb = vec![0u8; 4096];
    dev.read_at(MIRROR_RESERVED_BYTES, &mut sb).unwrap();
    let l = shale_format::Superblock::decode(&sb, 0).unwrap().layout;
    let mut n = 0;
    for slot in (0..l.cache_data_blocks()).filter(|s| s % 128 == 126) {
        let at = MIRROR_RESERVED_BYTES + (l.data_start + slot) * 4096;
        let mut two = vec![0u8; 8192];
        dev.read_at(at, &mut two).unwrap();
        let (a, b) = two.split_at_mut(4096);
        if a.iter().all(|&x| x == 0) || b.iter().all(|&x| x == 0) {
            continue;
        }
        let newer =
            if shale_format::md_claimed_generation(b) > shale_format::md_claimed_generation(a) {
                b
            } else {
                a
            };
        newer[..64].fill(0x5a);
        dev.write_at(at, &two).unwrap();
        n += 1;
    }
    n
}

/// A mirror whose newer md copies are damaged still decodes its older ones, which
/// lack the newest entries: reads of those blocks find the entry in the other
/// mirror's md instead of failing as misdirected.
#[test]
fn an_older_md_copy_on_one_mirror_is_completed_from_the_other() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (ms, _) = members(5, 4, 1400);
    let arr = ZoneArray::new(ms, r, StripeLayout::choose_unit(4, 4096).unwrap()).unwrap();
    let (cache, _) = mirrored_cache(1410);
    let cfg = tiny_config();
    let mut e: MEng = Engine::format(cache, arr, ManualClock::new(), cfg.clone()).unwrap();
    let v = create(&mut e, "a", 14 << 20);
    let blocks = (14 << 20) / 4096;
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let mut model = HashMap::new();
    // Small flushed batches: each flush writes the open groups' md again, so the
    // pairs hold two generations.
    for _ in 0..40 {
        churn(&mut e, v, blocks, 20, &mut rng, &mut model);
        call(&mut e, Request::Flush).unwrap();
    }
    let (mut cache, arr) = e.shutdown().unwrap();
    let n = corrupt_newer_cache_md(&mut cache, 0);
    assert!(n > 0, "no md pair with two copies");
    let mut e: MEng = Engine::open(cache, arr, ManualClock::new(), cfg).unwrap();
    verify(&mut e, v, &model);
    assert!(e.stats().crc_rebuilt_fixes > 0);
    e.self_check().unwrap();
}
