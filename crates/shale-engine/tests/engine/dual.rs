//! Dual-mapped volumes (`VolumeLayout::dual`): a map of 64 KiB units with a sparse
//! map of 4 KiB blocks over it. Data written in whole units keeps the small map;
//! blocks written apart from their unit go to the sparse map (no read-modify-write);
//! a whole unit written over them takes them back. The model test (`model.rs`) runs
//! such volumes under compaction, GC and reopens; the crash simulator through power
//! cuts.

use crate::common::*;
use shale_engine::{EngineError, Reply, Request, VolumeLayout, VolumeUid};

const UNIT: u64 = 64 << 10;

fn create_dual(e: &mut Eng, name: &str, bytes: u64, dual: bool) -> Result<VolumeUid, EngineError> {
    match call(
        e,
        Request::CreateVolumeWith {
            name: name.into(),
            size_bytes: bytes,
            layout: VolumeLayout {
                dual,
                ..VolumeLayout::with_map_unit(if dual { UNIT } else { 4096 }).unwrap()
            },
        },
    )? {
        Reply::Volume(v) => {
            assert_eq!(v.layout.dual, dual);
            Ok(v.uid)
        }
        r => panic!("unexpected {r:?}"),
    }
}

fn engine(zones: u64) -> Eng {
    // Zones of 4 MiB take 64 KiB units.
    let (c, z) = devices_with(128 + 8 * 256, zones, 1024);
    shale_engine::Engine::format(c, z, shale_engine::ManualClock::new(), tiny_config()).unwrap()
}

/// Writes `data` at `off` in requests of at most 64 KiB (the tiny pools' largest).
fn write_all(e: &mut Eng, v: VolumeUid, off: u64, data: &[u8]) {
    for (i, piece) in data.chunks(UNIT as usize).enumerate() {
        write(e, v, off + i as u64 * UNIT, piece).unwrap();
    }
}

/// Reads `len` bytes at `off` in requests of at most 64 KiB.
fn read_all(e: &mut Eng, v: VolumeUid, off: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let mut at = off;
    while at < off + len {
        let n = UNIT.min(off + len - at);
        out.extend(read(e, v, at, n).unwrap());
        at += n;
    }
    out
}

/// A flush, then the engine abandoned as by a kill and opened again (recovery), and
/// its self-check.
fn flush_and_kill(mut e: Eng) -> Eng {
    call(&mut e, Request::Flush).unwrap();
    let (c, z) = e.abandon();
    let z = shale_device::ZoneEmu::open(z.into_inner()).unwrap();
    let mut e =
        shale_engine::Engine::open(c, z, shale_engine::ManualClock::new(), tiny_config()).unwrap();
    e.self_check().unwrap();
    e
}

fn volume_stats(e: &Eng, v: VolumeUid) -> shale_engine::VolumeStats {
    e.stats()
        .volumes
        .into_iter()
        .find(|s| s.uid == v)
        .expect("volume stats")
}

#[test]
fn a_dual_volume_written_in_runs_keeps_a_sixteenth_of_the_map() {
    let mut e = engine(40);
    let plain = create_dual(&mut e, "plain", 48 << 20, false).unwrap();
    let dual = create_dual(&mut e, "dual", 48 << 20, true).unwrap();
    // Sequential writes of 1 MiB over the first 8 MiB of each.
    for i in 0..8u64 {
        let d = pattern(i, 1 << 20);
        write_all(&mut e, plain, i << 20, &d);
        write_all(&mut e, dual, i << 20, &d);
    }
    let (a, b) = (volume_stats(&e, plain), volume_stats(&e, dual));
    assert_eq!(b.l2p_sparse_bytes, 0, "{b:?}");
    assert!(b.l2p_table_bytes * 12 <= a.l2p_table_bytes, "{a:?} {b:?}");
    // A block written apart from its unit costs a sparse page, and is not
    // read-modify-write (one block to the cache, not the unit).
    let before = volume_stats(&e, dual).cache_write_bytes;
    write(&mut e, dual, (5 << 20) + 4096, &pattern(99, 4096)).unwrap();
    let b = volume_stats(&e, dual);
    assert_eq!(b.cache_write_bytes - before, 4096);
    assert_eq!(b.l2p_sparse_bytes, 4096);
    let mut want = pattern(5, 1 << 20);
    want[4096..8192].copy_from_slice(&pattern(99, 4096));
    assert_eq!(read_all(&mut e, dual, 5 << 20, 1 << 20), want);
    e.self_check().unwrap();
    // Persisted: the layout with the volume, both maps with the checkpoint.
    let mut e = reopen(e, tiny_config());
    e.self_check().unwrap();
    assert_eq!(read_all(&mut e, dual, 5 << 20, 1 << 20), want);
    assert_eq!(volume_stats(&e, dual).l2p_sparse_bytes, 4096);
}

#[test]
fn blocks_and_units_overwrite_each_other_and_trims_take_whole_units() {
    let mut e = engine(16);
    let v = create_dual(&mut e, "v", 4 << 20, true).unwrap();
    let mut want = pattern(1, 4 * UNIT as usize);
    write_all(&mut e, v, 0, &want);
    // Blocks over units, a write that is part blocks and part whole unit, and a unit
    // over blocks.
    let small = pattern(2, 3 * 4096 + 100);
    write(&mut e, v, UNIT - 4096, &small).unwrap();
    want[(UNIT - 4096) as usize..][..small.len()].copy_from_slice(&small);
    let straddle = pattern(3, (UNIT + 8192) as usize);
    write_all(&mut e, v, 2 * UNIT - 4096, &straddle);
    want[(2 * UNIT - 4096) as usize..][..straddle.len()].copy_from_slice(&straddle);
    assert_eq!(read_all(&mut e, v, 0, 4 * UNIT), want);
    let unit = pattern(4, UNIT as usize);
    write(&mut e, v, UNIT, &unit).unwrap();
    want[UNIT as usize..2 * UNIT as usize].copy_from_slice(&unit);
    assert_eq!(read_all(&mut e, v, 0, 4 * UNIT), want);
    e.self_check().unwrap();
    // Write-zeroes is exact; a trim drops whole units only (both maps).
    call(
        &mut e,
        Request::WriteZeroes {
            volume: v,
            offset: 3 * UNIT + 100,
            len: 5000,
        },
    )
    .unwrap();
    want[(3 * UNIT + 100) as usize..(3 * UNIT + 5100) as usize].fill(0);
    call(
        &mut e,
        Request::Trim {
            volume: v,
            offset: 4096,
            len: 2 * UNIT,
        },
    )
    .unwrap();
    want[UNIT as usize..2 * UNIT as usize].fill(0);
    assert_eq!(read_all(&mut e, v, 0, 4 * UNIT), want);
    e.self_check().unwrap();
    // Block status sees both maps.
    let ext = match call(
        &mut e,
        Request::Allocation {
            volume: v,
            offset: 0,
            len: 4 * UNIT,
        },
    )
    .unwrap()
    {
        Reply::Allocation(x) => x,
        r => panic!("unexpected {r:?}"),
    };
    let mapped: Vec<(u64, bool)> = ext.iter().map(|x| (x.len, x.mapped)).collect();
    assert_eq!(mapped, [(UNIT, true), (UNIT, false), (2 * UNIT, true)]);
    let mut e = reopen(e, tiny_config());
    e.self_check().unwrap();
    assert_eq!(read_all(&mut e, v, 0, 4 * UNIT), want);
}

#[test]
fn both_maps_survive_a_kill_after_a_flush() {
    let mut e = engine(16);
    let v = create_dual(&mut e, "v", 4 << 20, true).unwrap();
    let mut want = pattern(1, 8 * UNIT as usize);
    write_all(&mut e, v, 0, &want);
    call(&mut e, Request::Flush).unwrap();
    // After the checkpoint: blocks over units, then a unit over some of them.
    for i in 0..8u64 {
        let d = pattern(10 + i, 4096);
        let at = i * UNIT + (i % 4) * 4096;
        write(&mut e, v, at, &d).unwrap();
        want[at as usize..at as usize + 4096].copy_from_slice(&d);
    }
    let unit = pattern(30, UNIT as usize);
    write(&mut e, v, 2 * UNIT, &unit).unwrap();
    want[2 * UNIT as usize..3 * UNIT as usize].copy_from_slice(&unit);
    let mut e = flush_and_kill(e);
    assert_eq!(read_all(&mut e, v, 0, 8 * UNIT), want);
}

/// A unit's two halves written apart, side by side in the cache, with a trim of the
/// unit between them: recovery must not take them for one whole-unit write (which
/// the trim would then drop): the second half survives a kill, the first stays
/// trimmed. (Found by the crash simulator with 4 shards: seed 46200023, kill mode.)
#[test]
fn a_trim_between_two_halves_of_a_unit_survives_a_kill() {
    let mut e = engine(16);
    let v = create_dual(&mut e, "v", 4 << 20, true).unwrap();
    let mut want = pattern(1, 2 * UNIT as usize);
    write_all(&mut e, v, 0, &want);
    call(&mut e, Request::Flush).unwrap();
    let half = (UNIT / 2) as usize;
    write(&mut e, v, 0, &pattern(2, half)).unwrap();
    call(
        &mut e,
        Request::Trim {
            volume: v,
            offset: 0,
            len: UNIT,
        },
    )
    .unwrap();
    let second = pattern(3, half);
    write(&mut e, v, half as u64, &second).unwrap();
    want[..half].fill(0);
    want[half..2 * half].copy_from_slice(&second);
    assert_eq!(read_all(&mut e, v, 0, 2 * UNIT), want);
    let mut e = flush_and_kill(e);
    assert_eq!(read_all(&mut e, v, 0, 2 * UNIT), want);
}

#[test]
fn dual_mapping_needs_a_unit_and_room_in_the_map_pool() {
    let mut e = engine(16);
    let r = call(
        &mut e,
        Request::CreateVolumeWith {
            name: "x".into(),
            size_bytes: 1 << 20,
            layout: VolumeLayout {
                map_unit_shift: 0,
                dual: true,
            },
        },
    );
    assert!(
        matches!(r, Err(EngineError::InvalidVolume { ref reason }) if reason.contains("mapping unit above 4 KiB")),
        "{r:?}"
    );
    // A pool of 100 zones and two volume slots: a dual volume's maps may take a
    // sixteenth more pages than a 4 KiB one's, more than the pool keeps beyond
    // one page per slot, so one of the whole capacity is refused by name.
    let (c, z) = devices_with(128 + 8 * 256, 100, 1024);
    let config = shale_engine::Config {
        volumes_max: 2,
        ..tiny_config()
    };
    let mut e =
        shale_engine::Engine::format(c, z, shale_engine::ManualClock::new(), config).unwrap();
    let all = e.user_capacity_bytes() / UNIT * UNIT;
    assert!(all > 64 << 20, "{all}");
    let r = create_dual(&mut e, "all", all, true);
    assert!(
        matches!(r, Err(EngineError::InvalidVolume { ref reason }) if reason.contains("L2P room")),
        "{r:?}"
    );
    create_dual(&mut e, "half", all / 2 / UNIT * UNIT, true).unwrap();
}
