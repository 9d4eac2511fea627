//! Direct writes (`write/direct.rs`): large writes go straight to a zone, rank in
//! recovery at the chunk slot they took, and lose to every later write, trim and
//! volume change, across clean reopens and crashes.

use std::sync::{Arc, Mutex};

use crate::common::rig::*;
use crate::common::*;
use shale_device::CrashMode;
use shale_engine::{Config, DirectWritePolicy, Engine, ManualClock, Reply, Request, VolumeUid};

fn direct_config() -> Config {
    Config {
        direct_write_min_bytes: 16 * 1024,
        direct_write_policy: DirectWritePolicy::Any,
        request_bytes_max: 1 << 20,
        write_buffers_max: 8,
        ..tiny_config()
    }
}

/// Submits every request, then polls until all are answered; the answers in order.
fn burst(e: &mut Eng, reqs: Vec<Request>) -> Vec<Reply> {
    let slots: Vec<Arc<Mutex<Option<Reply>>>> = reqs
        .into_iter()
        .map(|r| {
            let slot = Arc::new(Mutex::new(None));
            let s2 = slot.clone();
            e.submit(r, Box::new(move |r| *s2.lock().unwrap() = Some(r.unwrap())));
            slot
        })
        .collect();
    e.run_until_idle().unwrap();
    slots
        .iter()
        .map(|s| s.lock().unwrap().take().expect("answered"))
        .collect()
}

#[test]
fn a_large_write_goes_to_a_zone_and_its_tail_to_the_cache() {
    let (c, z) = devices(128 + 8 * 256, 28);
    let mut e = Engine::format(c, z, ManualClock::new(), direct_config()).unwrap();
    let v = create(&mut e, "a", 2 << 20);
    let data = pattern(7, 1 << 20);
    write(&mut e, v, 0, &data).unwrap();
    let st = e.stats();
    assert_eq!(st.direct_write_bytes, 1 << 20);
    // Two whole zone groups went straight to the zone; the 4 blocks left waited
    // for a group that nothing else would fill, and went to the cache.
    assert_eq!(st.direct_blocks_mapped, 252);
    assert_eq!(st.direct_blocks_to_cache, 4);
    assert_eq!(st.capacity_direct_write_bytes, 252 * 4096);
    assert_eq!(st.user_blocks_appended, 4);
    assert_eq!(read(&mut e, v, 0, 1 << 20).unwrap(), data);
    e.self_check().unwrap();
    let mut e = reopen(e, direct_config());
    assert_eq!(read(&mut e, v, 0, 1 << 20).unwrap(), data);
    e.self_check().unwrap();
}

#[test]
fn small_writes_and_directs_off_use_the_cache() {
    let (c, z) = devices(128 + 8 * 256, 28);
    let config = Config {
        direct_write_min_bytes: 0,
        ..direct_config()
    };
    let mut e = Engine::format(c, z, ManualClock::new(), config).unwrap();
    let v = create(&mut e, "a", 2 << 20);
    write(&mut e, v, 0, &pattern(1, 1 << 20)).unwrap();
    assert_eq!(e.stats().direct_write_bytes, 0);
    let (c, z) = devices(128 + 8 * 256, 28);
    let mut e = Engine::format(c, z, ManualClock::new(), direct_config()).unwrap();
    let v = create(&mut e, "a", 2 << 20);
    // Below the threshold, or not whole blocks.
    write(&mut e, v, 0, &pattern(1, 12 * 1024)).unwrap();
    write(&mut e, v, 512, &pattern(2, 64 * 1024)).unwrap();
    assert_eq!(e.stats().direct_write_bytes, 0);
}

/// Under the sequential policy a large write goes to a zone only once its volume
/// has written a run of 1 MiB in order before it; large writes elsewhere, another
/// volume's, and a run broken by a jump go through the cache.
#[test]
fn the_sequential_policy_sends_only_runs_to_zones() {
    let (c, z) = devices(128 + 8 * 256, 28);
    let config = Config {
        direct_write_policy: DirectWritePolicy::Sequential,
        direct_write_min_bytes: 64 * 1024,
        ..direct_config()
    };
    let mut e = Engine::format(c, z, ManualClock::new(), config.clone()).unwrap();
    let a = create(&mut e, "a", 4 << 20);
    let b = create(&mut e, "b", 4 << 20);
    let mut model = vec![0u8; 4 << 20];
    let mut put = |e: &mut Eng, v, off: u64, seed: u64| {
        let data = pattern(seed, 65536);
        write(e, v, off, &data).unwrap();
        if v == a {
            model[off as usize..off as usize + 65536].copy_from_slice(&data);
        }
    };
    // 16 writes of 64 KiB in order (1 MiB) go through the cache; the 17th on is a
    // run, except in volume b, which never wrote the blocks before.
    for i in 0..16 {
        put(&mut e, a, i * 65536, i);
    }
    assert_eq!(e.stats().direct_write_bytes, 0);
    put(&mut e, b, 16 * 65536, 99);
    assert_eq!(e.stats().direct_write_bytes, 0, "another volume's run");
    for i in 16..24 {
        put(&mut e, a, i * 65536, i);
    }
    assert_eq!(e.stats().direct_write_bytes, 8 * 65536);
    // A jump starts a new run; a write at random is no run either.
    put(&mut e, a, 40 * 65536, 40);
    put(&mut e, a, 3 * 65536, 41);
    assert_eq!(e.stats().direct_write_bytes, 8 * 65536);
    // The run goes on where it stopped.
    put(&mut e, a, 24 * 65536, 24);
    assert_eq!(e.stats().direct_write_bytes, 9 * 65536);
    let all = |e: &mut Eng| -> Vec<u8> {
        (0..4u64)
            .flat_map(|m| read(e, a, m << 20, 1 << 20).unwrap())
            .collect()
    };
    assert!(all(&mut e) == model);
    e.self_check().unwrap();
    let mut e = reopen(e, config);
    assert!(all(&mut e) == model);
}

/// Writes queued together share zone groups; later cache writes, trims and
/// overlapping directs in the same burst win in queue order, and a partial write of a
/// block a direct write is carrying waits for it and merges with its data.
#[test]
fn concurrent_directs_share_groups_and_lose_to_later_writes() {
    let (c, z) = devices(128 + 8 * 256, 28);
    let mut e = Engine::format(c, z, ManualClock::new(), direct_config()).unwrap();
    let v = create(&mut e, "a", 4 << 20);
    let mut model = vec![0u8; 4 << 20];
    let mut reqs = Vec::new();
    let mut put = |reqs: &mut Vec<Request>, off: u64, data: Vec<u8>| {
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        reqs.push(Request::Write {
            volume: v,
            offset: off,
            data,
            fua: false,
        });
    };
    for i in 0..24u64 {
        put(&mut reqs, i * 65536, pattern(100 + i, 65536));
    }
    // A cache write over a direct block, a direct over a direct, a partial write of
    // a direct's block, then a trim.
    put(&mut reqs, 3 * 65536 + 4096, pattern(200, 4096));
    put(&mut reqs, 5 * 65536 + 8192, pattern(201, 32768));
    put(&mut reqs, 7 * 65536 + 100, pattern(202, 50));
    reqs.push(Request::Trim {
        volume: v,
        offset: 9 * 65536,
        len: 8192,
    });
    model[9 * 65536..9 * 65536 + 8192].fill(0);
    for r in burst(&mut e, reqs) {
        assert!(matches!(r, Reply::Done));
    }
    let st = e.stats();
    assert!(st.direct_blocks_mapped >= 252, "{st:?}");
    assert_eq!(read_all(&mut e, v, 4 << 20), model);
    e.self_check().unwrap();
    let mut e = reopen(e, direct_config());
    assert_eq!(read_all(&mut e, v, 4 << 20), model);
}

fn read_all(e: &mut Eng, v: VolumeUid, len: u64) -> Vec<u8> {
    (0..len)
        .step_by(1 << 20)
        .flat_map(|off| read(e, v, off, 1 << 20).unwrap())
        .collect()
}

/// Random bursts of direct and cache writes, trims and flushes, crashed at random
/// points (mid-burst too) with random subsets of the unflushed writes kept: every
/// block must read back as a version written since its last flush, never an older
/// one a direct block was overwritten by.
#[test]
fn directs_survive_crashes_in_write_order() {
    let (mut mapped, mut superseded) = (0, 0);
    for seed in 0..12u64 {
        let mut rig = Rig::with_config(seed, direct_config());
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..40 {
            match rnd(10) {
                0 => {
                    assert!(rig.flush(), "seed {seed} round {round}");
                }
                1 => {
                    let lba = rnd(VOLUME_BLOCKS - 16);
                    rig.trim(lba, 1 + rnd(8));
                }
                _ => {
                    let mut reqs = Vec::new();
                    for _ in 0..2 + rnd(10) {
                        let n = [1, 2, 4, 8, 16][rnd(5) as usize];
                        let lba = rnd(VOLUME_BLOCKS - n);
                        let mut data = Vec::new();
                        for b in 0..n {
                            rig.seq += 1;
                            rig.model.wrote(VolumeUid(1), lba + b, rig.seq);
                            data.extend(block_of(rig.seq));
                        }
                        reqs.push(Request::Write {
                            volume: VolumeUid(1),
                            offset: lba * 4096,
                            data,
                            fua: false,
                        });
                    }
                    let e = rig.e();
                    for r in reqs {
                        // Answers after a crash are errors; the model judges the data.
                        e.submit(r, Box::new(|_| {}));
                    }
                    // Sometimes the power goes mid-burst.
                    let polls = if rnd(3) == 0 { rnd(40) } else { u64::MAX };
                    let mut i = 0;
                    while i < polls && !e.is_idle() {
                        if !e.poll() {
                            e.wait_io();
                        }
                        i += 1;
                    }
                }
            }
            if rnd(8) == 0 {
                let st = rig.e().stats();
                (mapped, superseded) = (
                    mapped + st.direct_blocks_mapped,
                    superseded + st.direct_blocks_superseded,
                );
                let mode = match rnd(3) {
                    0 => CrashMode::DropAll,
                    1 => CrashMode::KeepAll,
                    _ => CrashMode::KeepRandomSubset { seed: rnd(1 << 30) },
                };
                rig.crash(mode.clone(), mode);
                rig.verify();
            }
        }
        rig.e().run_until_idle().unwrap();
        let st = rig.e().stats();
        (mapped, superseded) = (
            mapped + st.direct_blocks_mapped,
            superseded + st.direct_blocks_superseded,
        );
        rig.crash(CrashMode::DropAll, CrashMode::DropAll);
        rig.verify();
    }
    // The zone path ran, not only the fallback to the cache.
    assert!(
        mapped > 1000 && superseded > 0,
        "{mapped} direct blocks mapped, {superseded} superseded"
    );
}

/// A large write past the volume's end, even at the last offsets there are, is
/// refused like any other and leaves the sequential streams sound.
#[test]
fn a_large_write_out_of_range_is_refused() {
    let (c, z) = devices(128 + 8 * 256, 28);
    let config = Config {
        direct_write_policy: DirectWritePolicy::Sequential,
        ..direct_config()
    };
    let mut e = Engine::format(c, z, ManualClock::new(), config).unwrap();
    let v = create(&mut e, "a", 2 << 20);
    for offset in [2 << 20, u64::MAX - 65535, u64::MAX - 4095] {
        assert!(
            write(&mut e, v, offset, &pattern(1, 64 * 1024)).is_err(),
            "{offset}"
        );
    }
    write(&mut e, v, 0, &pattern(2, 64 * 1024)).unwrap();
    e.self_check().unwrap();
}
