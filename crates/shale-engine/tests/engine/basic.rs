//! Basic data path: write, read, overwrite, trim, write-zeroes, flush, reopen.

use crate::common::*;
use shale_engine::{EngineError, Request, VolumeUid};

#[test]
fn write_read_reopen() {
    let mut e = tiny_engine();
    let v = create(&mut e, "a", 1 << 20);
    let d = pattern(1, 3 * 4096);
    write(&mut e, v, 4096, &d).unwrap();
    assert_eq!(read(&mut e, v, 4096, d.len() as u64).unwrap(), d);
    assert_eq!(read(&mut e, v, 0, 4096).unwrap(), vec![0u8; 4096]);
    // unaligned overwrite
    let d2 = pattern(2, 5000);
    write(&mut e, v, 4096 + 100, &d2).unwrap();
    let mut expect = vec![0u8; 4 * 4096];
    expect[4096..4096 + d.len()].copy_from_slice(&d);
    expect[4196..4196 + 5000].copy_from_slice(&d2);
    assert_eq!(read(&mut e, v, 0, 4 * 4096).unwrap(), expect);
    call(&mut e, Request::Flush).unwrap();
    e.self_check().unwrap();
    let mut e = reopen(e, tiny_config());
    e.self_check().unwrap();
    assert_eq!(read(&mut e, v, 0, 4 * 4096).unwrap(), expect);
    call(
        &mut e,
        Request::Trim {
            volume: v,
            offset: 4096,
            len: 4096,
        },
    )
    .unwrap();
    expect[4096..8192].fill(0);
    call(
        &mut e,
        Request::WriteZeroes {
            volume: v,
            offset: 8192 + 10,
            len: 20,
        },
    )
    .unwrap();
    expect[8192 + 10..8192 + 30].fill(0);
    assert_eq!(read(&mut e, v, 0, 4 * 4096).unwrap(), expect);
    e.self_check().unwrap();
}

#[test]
fn bad_input_is_refused() {
    let mut e = tiny_engine();
    let v = create(&mut e, "a", 1 << 20);
    assert!(matches!(
        read(&mut e, VolumeUid(3), 0, 4096),
        Err(EngineError::NoSuchVolume { .. })
    ));
    assert!(matches!(
        read(&mut e, v, 1 << 20, 1),
        Err(EngineError::OutOfRange { .. })
    ));
    assert!(matches!(
        read(&mut e, v, u64::MAX, 2),
        Err(EngineError::OutOfRange { .. })
    ));
    assert!(matches!(
        read(&mut e, v, 0, 0),
        Err(EngineError::ZeroLength { .. })
    ));
    assert!(matches!(
        write(&mut e, v, 0, &[]),
        Err(EngineError::ZeroLength { .. })
    ));
    assert!(matches!(
        write(&mut e, v, 0, &vec![1; 1 << 17]),
        Err(EngineError::TooLarge { .. })
    ));
    assert!(matches!(
        call(
            &mut e,
            Request::CreateVolume {
                name: "b".into(),
                size_bytes: 1 << 40
            }
        ),
        Err(EngineError::NoSpace { .. })
    ));
    assert!(matches!(
        call(
            &mut e,
            Request::CreateVolume {
                name: "a".into(),
                size_bytes: 4096
            }
        ),
        Err(EngineError::InvalidVolume { .. })
    ));
    assert!(matches!(
        call(
            &mut e,
            Request::CreateVolume {
                name: "c".into(),
                size_bytes: 100
            }
        ),
        Err(EngineError::InvalidVolume { .. })
    ));
    assert!(matches!(
        call(
            &mut e,
            Request::DeleteVolume {
                volume: VolumeUid(9)
            }
        ),
        Err(EngineError::NoSuchVolume { .. })
    ));
    e.self_check().unwrap();
}

#[test]
fn sustained_overwrites_run_compaction_and_gc() {
    let mut e = tiny_engine();
    let cap = e.user_capacity_bytes();
    let v = create(&mut e, "a", (cap / 2) / 4096 * 4096);
    let blocks = cap / 2 / 4096;
    let mut model = vec![0u64; blocks as usize];
    let mut x = 7u64;
    for i in 0..(blocks * 6) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lba = (x >> 33) % blocks;
        model[lba as usize] = i + 1;
        write(&mut e, v, lba * 4096, &pattern(i + 1, 4096)).unwrap();
        if i % 500 == 0 {
            e.self_check().unwrap();
        }
    }
    e.self_check().unwrap();
    for (lba, &s) in model.iter().enumerate() {
        let want = if s == 0 {
            vec![0u8; 4096]
        } else {
            pattern(s, 4096)
        };
        assert_eq!(
            read(&mut e, v, lba as u64 * 4096, 4096).unwrap(),
            want,
            "lba {lba}"
        );
    }
    let s = e.stats();
    assert!(s.compaction_victims > 0, "{s:?}");
    assert!(s.gc_victims > 0, "{s:?}");
    assert!(s.zone_resets > 0, "{s:?}");
    assert!(s.layer_waf() > 0.5, "{s:?}");
}

/// Regression: GC padded every partial batch as soon as zones ran short; with two
/// streams it spent two zones per zone freed and looped (hundreds of GC victims per
/// compaction victim, most capacity writes padding).
#[test]
fn gc_does_not_pad_while_other_victims_can_fill_batches() {
    use shale_engine::{Config, Engine, ManualClock};
    let cfg = Config {
        chunk_blocks: 128,
        compaction_free_chunks_pct: 50,
        gc_free_zones_min: 3,
        ..tiny_config()
    };
    let (c, z) = devices_with(128 + 6 * 128, 16, 128);
    let mut e = Engine::format(c, z, ManualClock::new(), cfg).unwrap();
    let n = e.user_capacity_bytes() / 4096 * 95 / 100;
    let v = create(&mut e, "a", n * 4096);
    let mut x = 1u64;
    for i in 0..n * 8 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        write(&mut e, v, (x >> 33) % n * 4096, &pattern(i, 4096)).unwrap();
    }
    e.self_check().unwrap();
    let s = e.stats();
    assert!(s.gc_victims > 0, "{s:?}");
    assert_eq!(s.capacity_pad_bytes, 0, "{s:?}");
    assert!(s.gc_victims < 2 * s.compaction_victims, "{s:?}");
}

/// Regression: completed write buffers were dropped instead of returning to the pool,
/// so every run allocated (and zeroed) a fresh aligned buffer.
#[test]
fn steady_state_writes_do_not_allocate_io_buffers() {
    let mut e = tiny_engine();
    let n = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "a", n * 4096);
    let mut x = 9u64;
    let mut after_warmup = 0;
    // The pool grows to the largest number of buffers of each size ever in flight at
    // once; after that it must stay flat.
    for i in 0..n * 12 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        write(&mut e, v, (x >> 33) % n * 4096, &pattern(i, 4096)).unwrap();
        if i == n * 8 {
            after_warmup = e.stats().io_buffer_allocs;
        }
    }
    let s = e.stats();
    assert!(s.gc_victims > 0, "{s:?}");
    assert!(
        s.io_buffer_allocs <= after_warmup + 8,
        "{} -> {}",
        after_warmup,
        s.io_buffer_allocs
    );
    assert!(s.io_buffer_allocs < 400, "{}", s.io_buffer_allocs);
}

/// After a reopen the md cache is empty: each read fetches its md together with the data,
/// asynchronously, once per group.
#[test]
fn reads_fetch_md_asynchronously() {
    let mut e = tiny_engine();
    let v = create(&mut e, "a", 4 << 20);
    for i in 0..1024u64 {
        write(&mut e, v, i * 4096, &pattern(i, 4096)).unwrap();
    }
    let mut e = reopen(e, tiny_config());
    // Whole-volume reads: many blocks per group, all in flight at once.
    for chunk in 0..16u64 {
        let got = read(&mut e, v, chunk * 65536, 65536).unwrap();
        for b in 0..16u64 {
            let i = chunk * 16 + b;
            assert_eq!(
                &got[(b * 4096) as usize..((b + 1) * 4096) as usize],
                &pattern(i, 4096)[..]
            );
        }
    }
    let s = e.stats();
    assert_eq!(s.md_reads_sync, 0, "{s:?}");
    assert!(s.md_reads > 0 && s.md_reads <= 1024 / 126 + 16, "{s:?}");
}

#[test]
fn a_flush_with_nothing_new_costs_no_io() {
    let mut e = tiny_engine();
    let v = create(&mut e, "a", 1 << 20);
    write(&mut e, v, 0, &pattern(1, 4096)).unwrap();
    call(&mut e, Request::Flush).unwrap();
    let before = e.stats();
    call(&mut e, Request::Flush).unwrap();
    call(&mut e, Request::Flush).unwrap();
    let after = e.stats();
    assert_eq!(after.idle_flushes, before.idle_flushes + 2);
    assert_eq!(after.durability_points, before.durability_points);
    assert_eq!(after.cache_md_write_bytes, before.cache_md_write_bytes);
    // A trim is something new.
    call(
        &mut e,
        Request::Trim {
            volume: v,
            offset: 0,
            len: 4096,
        },
    )
    .unwrap();
    call(&mut e, Request::Flush).unwrap();
    assert_eq!(e.stats().durability_points, after.durability_points + 1);
}

/// Blocks that lie side by side on a device are read with one request (a run stops at
/// a group's md, which data slots never straddle).
#[test]
fn blocks_side_by_side_are_read_with_one_device_read() {
    use shale_device::StatsDevice;
    let (c, z) = devices(128 + 8 * 256, 28);
    let c = StatsDevice::new(c);
    let stats = c.handle();
    let mut e = shale_engine::Engine::format(c, z, shale_engine::ManualClock::new(), tiny_config())
        .unwrap();
    let v = create(&mut e, "a", 4 << 20);
    let data: Vec<u8> = (0..16).flat_map(|i| pattern(i, 4096)).collect();
    // The first chunk's two groups (126 data slots each) fill and settle, so these
    // blocks are read from the cache device, not from memory.
    for i in 0..16u64 {
        write(&mut e, v, i * 16 * 4096, &data).unwrap();
    }
    let before = stats.snapshot();
    assert_eq!(read(&mut e, v, 0, 16 * 4096).unwrap(), data);
    let reads = stats.snapshot().since(&before).reads;
    assert_eq!(reads, 1, "16 blocks side by side took {reads} device reads");
    // Across a group boundary (slots 126 and 127 hold md): two runs.
    let before = stats.snapshot();
    let got = read(&mut e, v, 120 * 4096, 8 * 4096).unwrap();
    assert_eq!(got, data[8 * 4096..].to_vec());
    assert_eq!(stats.snapshot().since(&before).reads, 2);
}
