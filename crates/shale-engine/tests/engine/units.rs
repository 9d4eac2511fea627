//! Volumes mapped in units larger than a block (`VolumeLayout`): a map that many
//! times smaller, partial units written whole, trims of whole units only, and the
//! sizes and units refused. The model test (`model.rs`) runs them under compaction,
//! GC and reopens; the crash simulator through power cuts.

use crate::common::*;
use shale_engine::{EngineError, Reply, Request, VolumeLayout, VolumeUid};

fn create_mapped(e: &mut Eng, name: &str, bytes: u64, unit: u64) -> Result<VolumeUid, EngineError> {
    match call(
        e,
        Request::CreateVolumeWith {
            name: name.into(),
            size_bytes: bytes,
            layout: VolumeLayout::with_map_unit(unit).unwrap(),
        },
    )? {
        Reply::Volume(v) => {
            assert_eq!(v.layout.map_unit_bytes(), unit);
            Ok(v.uid)
        }
        r => panic!("unexpected {r:?}"),
    }
}

/// Zones of 4 MiB: 1,008 data slots take units up to 64 KiB (a unit is at most a 32nd
/// of a zone's data slots).
const ZONE_4M: u64 = 1024;

fn engine() -> Eng {
    let (c, z) = devices_with(128 + 8 * 256, 16, ZONE_4M);
    shale_engine::Engine::format(c, z, shale_engine::ManualClock::new(), tiny_config()).unwrap()
}

fn volume_stats(e: &Eng, v: VolumeUid) -> shale_engine::VolumeStats {
    e.stats()
        .volumes
        .into_iter()
        .find(|s| s.uid == v)
        .expect("volume stats")
}

#[test]
fn a_64k_unit_map_is_a_sixteenth_of_a_4k_one() {
    // Volumes of 48 MiB: 12 pages of 1,024 block entries.
    let (c, z) = devices_with(128 + 8 * 256, 40, ZONE_4M);
    let mut e = shale_engine::Engine::format(c, z, shale_engine::ManualClock::new(), tiny_config())
        .unwrap();
    let small = create_mapped(&mut e, "small", 48 << 20, 4096).unwrap();
    let large = create_mapped(&mut e, "large", 48 << 20, 64 << 10).unwrap();
    let (a, b) = (
        volume_stats(&e, small).l2p_table_bytes,
        volume_stats(&e, large).l2p_table_bytes,
    );
    assert!(a > 0 && b > 0, "{a} {b}");
    assert!(b * 12 <= a, "64 KiB units: {b} bytes of map against {a}");
    // The same after a reopen (the layout is persisted with the volume).
    let mut e = reopen(e, tiny_config());
    assert_eq!(volume_stats(&e, large).l2p_table_bytes, b);
    let listed = match call(&mut e, Request::ListVolumes).unwrap() {
        Reply::Volumes(v) => v,
        r => panic!("unexpected {r:?}"),
    };
    let units: Vec<u64> = listed.iter().map(|v| v.layout.map_unit_bytes()).collect();
    assert_eq!(units, [4096, 64 << 10]);
}

#[test]
fn a_partial_unit_is_written_whole_and_trimmed_only_whole() {
    let mut e = engine();
    let unit = 16u64 << 10;
    let v = create_mapped(&mut e, "v", 1 << 20, unit).unwrap();
    let base = pattern(1, 2 * unit as usize);
    write(&mut e, v, 0, &base).unwrap();
    let before = volume_stats(&e, v).cache_write_bytes;
    // One block inside the second unit: the whole unit is written again.
    let d = pattern(2, 4096);
    write(&mut e, v, unit + 4096, &d).unwrap();
    assert_eq!(volume_stats(&e, v).cache_write_bytes - before, unit);
    let mut want = base.clone();
    want[(unit + 4096) as usize..(unit + 8192) as usize].copy_from_slice(&d);
    assert_eq!(read(&mut e, v, 0, 2 * unit).unwrap(), want);
    // A trim of part of a unit keeps it; of a whole one, drops it.
    call(
        &mut e,
        Request::Trim {
            volume: v,
            offset: 4096,
            len: unit,
        },
    )
    .unwrap();
    assert_eq!(read(&mut e, v, 0, 2 * unit).unwrap(), want);
    call(
        &mut e,
        Request::Trim {
            volume: v,
            offset: 0,
            len: unit + 4096,
        },
    )
    .unwrap();
    want[..unit as usize].fill(0);
    assert_eq!(read(&mut e, v, 0, 2 * unit).unwrap(), want);
    // Write-zeroes is exact, whole units or not.
    call(
        &mut e,
        Request::WriteZeroes {
            volume: v,
            offset: unit + 100,
            len: 200,
        },
    )
    .unwrap();
    want[(unit + 100) as usize..(unit + 300) as usize].fill(0);
    assert_eq!(read(&mut e, v, 0, 2 * unit).unwrap(), want);
    e.self_check().unwrap();
    let mut e = reopen(e, tiny_config());
    e.self_check().unwrap();
    assert_eq!(read(&mut e, v, 0, 2 * unit).unwrap(), want);
}

#[test]
fn sizes_and_units_that_are_not_whole_are_refused() {
    // Zones of 252 data slots take units up to 32 KiB.
    let mut small = tiny_engine();
    assert!(matches!(
        create_mapped(&mut small, "x", 1 << 20, 64 << 10),
        Err(EngineError::InvalidVolume { ref reason }) if reason.contains("limited to 32768")
    ));
    create_mapped(&mut small, "x", 1 << 20, 32 << 10).unwrap();
    assert_eq!(shale_engine::max_map_unit_shift(252), 3);
    let mut e = engine();
    for (size, unit) in [(100 << 10, 64u64 << 10), ((1 << 20) + 8192, 16 << 10)] {
        let r = call(
            &mut e,
            Request::CreateVolumeWith {
                name: "x".into(),
                size_bytes: size,
                layout: VolumeLayout {
                    map_unit_shift: (unit / 4096u64).trailing_zeros() as u8,
                    dual: false,
                },
            },
        );
        assert!(
            matches!(r, Err(EngineError::InvalidVolume { .. })),
            "{size} {unit}: {r:?}"
        );
    }
    let r = call(
        &mut e,
        Request::CreateVolumeWith {
            name: "x".into(),
            size_bytes: 1 << 20,
            layout: VolumeLayout {
                map_unit_shift: 5,
                dual: false,
            },
        },
    );
    assert!(matches!(r, Err(EngineError::InvalidVolume { .. })), "{r:?}");
    assert!(VolumeLayout::with_map_unit(128 << 10).is_err());
    assert!(VolumeLayout::with_map_unit(12 << 10).is_err());
    let v = create_mapped(&mut e, "v", 1 << 20, 64 << 10).unwrap();
    let r = call(
        &mut e,
        Request::ResizeVolume {
            volume: v,
            size_bytes: (1 << 20) + 4096,
        },
    );
    assert!(matches!(r, Err(EngineError::InvalidVolume { .. })), "{r:?}");
    call(
        &mut e,
        Request::ResizeVolume {
            volume: v,
            size_bytes: 2 << 20,
        },
    )
    .unwrap();
    e.self_check().unwrap();
}
