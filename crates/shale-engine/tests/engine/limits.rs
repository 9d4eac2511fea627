//! Volume rate limits: the engine holds a limited volume's requests to its rates,
//! leaves other volumes alone, and keeps the limits across a clean restart and a
//! crash.

use std::sync::{Arc, Mutex};

use shale_device::CrashMode;
use shale_engine::{EngineError, ManualClock, Reply, Request, VolumeLimits, VolumeUid};

use crate::common::*;

type Done = Arc<Mutex<Vec<Result<Reply, EngineError>>>>;

fn submit_writes(e: &mut Eng, v: VolumeUid, n: u64, done: &Done) {
    for i in 0..n {
        let d = done.clone();
        e.submit(
            Request::Write {
                volume: v,
                offset: (i % 64) * 4096,
                data: pattern(i, 4096),
                fua: false,
            },
            Box::new(move |r| d.lock().unwrap().push(r)),
        );
    }
}

/// Polls until nothing moves (no time passes on the manual clock).
fn settle(e: &mut Eng) {
    for _ in 0..10_000 {
        if !e.poll() && e.is_idle() {
            return;
        }
        if !e.is_idle() {
            e.wait_io();
        }
    }
}

fn set(e: &mut Eng, v: VolumeUid, limits: VolumeLimits) -> Result<Reply, EngineError> {
    call(e, Request::SetVolumeLimits { volume: v, limits })
}

fn limits_of(e: &mut Eng, name: &str) -> VolumeLimits {
    match call(e, Request::ListVolumes).unwrap() {
        Reply::Volumes(vs) => vs.into_iter().find(|v| v.name == name).unwrap().limits,
        r => panic!("unexpected {r:?}"),
    }
}

#[test]
fn a_limited_volume_is_held_to_its_rate_and_others_are_not() {
    let (c, z) = devices(128 + 8 * 256, 28);
    let clock = ManualClock::new();
    let mut e = shale_engine::Engine::format(c, z, clock.clone(), tiny_config()).unwrap();
    let slow = create(&mut e, "slow", 1 << 20);
    let fast = create(&mut e, "fast", 1 << 20);
    let l = VolumeLimits {
        iops_max: 100,
        bytes_per_sec_max: 0,
        ..VolumeLimits::NONE
    };
    match set(&mut e, slow, l).unwrap() {
        Reply::Volume(v) => assert_eq!(v.limits, l),
        r => panic!("unexpected {r:?}"),
    }
    let (slow_done, fast_done): (Done, Done) = Default::default();
    submit_writes(&mut e, slow, 60, &slow_done);
    submit_writes(&mut e, fast, 60, &fast_done);
    settle(&mut e);
    // The bucket holds a tenth of a second: 10 requests at once, the rest wait.
    assert_eq!(fast_done.lock().unwrap().len(), 60);
    assert_eq!(slow_done.lock().unwrap().len(), 10);
    assert_eq!(e.stats().throttle_waiting, 50);
    assert!(e.device_wake_ns() > 0 && e.device_wake_ns() <= 10_000_000);
    // 100 ms later, 10 more; half a second later, all.
    clock.advance_ns(100_000_000);
    settle(&mut e);
    assert_eq!(slow_done.lock().unwrap().len(), 20);
    for _ in 0..4 {
        clock.advance_ns(100_000_000);
        settle(&mut e);
    }
    assert_eq!(slow_done.lock().unwrap().len(), 60);
    assert!(slow_done.lock().unwrap().iter().all(Result::is_ok));
    // The 50 that did not fit the first burst were delayed, 100 to 500 ms each.
    let s = e.stats();
    assert_eq!(s.throttle_waits, 50);
    let v = s
        .volumes
        .iter()
        .find(|v| v.uid == slow)
        .expect("slow's stats");
    assert_eq!((v.throttle_waiting, v.throttle_delayed), (0, 50));
    assert_eq!(
        v.throttle_wait_ns,
        10 * (100 + 200 + 300 + 400 + 500) * 1_000_000
    );
    let f = s
        .volumes
        .iter()
        .find(|v| v.uid == fast)
        .expect("fast's stats");
    assert_eq!(f.throttle_delayed, 0);
    // Removing the limits releases what waits at once (the bucket is empty: the last
    // 10 took what the last 100 ms brought).
    submit_writes(&mut e, slow, 30, &slow_done);
    settle(&mut e);
    assert_eq!(slow_done.lock().unwrap().len(), 60);
    set(&mut e, slow, VolumeLimits::NONE).unwrap();
    settle(&mut e);
    assert_eq!(slow_done.lock().unwrap().len(), 90);
    // A flush passes requests that wait (they have not completed).
    set(&mut e, slow, l).unwrap();
    submit_writes(&mut e, slow, 30, &slow_done);
    call(&mut e, Request::Flush).unwrap();
    assert!(slow_done.lock().unwrap().len() < 120);
    // A delete comes after what the volume sent before it: those are served first
    // (limits or not), in order, then the volume goes.
    call(&mut e, Request::DeleteVolume { volume: slow }).unwrap();
    settle(&mut e);
    let done = slow_done.lock().unwrap();
    assert_eq!(done.len(), 120);
    assert!(done[90..].iter().all(Result::is_ok));
    drop(done);
    let r = call(
        &mut e,
        Request::Read {
            volume: slow,
            offset: 0,
            len: 4096,
        },
    );
    assert!(matches!(r, Err(EngineError::NoSuchVolume { .. })), "{r:?}");
    e.self_check().unwrap();
}

#[test]
fn limits_survive_a_restart_and_a_crash_and_bad_ones_are_refused() {
    let mut rig = rig::Rig::new(7);
    let v = VolumeUid(1);
    let l = VolumeLimits {
        iops_max: 2_000,
        bytes_per_sec_max: 64 << 20,
        ..VolumeLimits::NONE
    };
    rig.call(Request::SetVolumeLimits {
        volume: v,
        limits: l,
    })
    .unwrap();
    let bad = VolumeLimits {
        iops_max: 0,
        bytes_per_sec_max: 100,
        ..VolumeLimits::NONE
    };
    assert!(matches!(
        rig.call(Request::SetVolumeLimits {
            volume: v,
            limits: bad
        }),
        Err(EngineError::InvalidVolume { .. })
    ));
    assert!(matches!(
        rig.call(Request::SetVolumeLimits {
            volume: VolumeUid(999),
            limits: l
        }),
        Err(EngineError::NoSuchVolume { .. })
    ));
    // A crash right after: the change was checkpointed before it was answered.
    assert!(!rig.crash(CrashMode::DropAll, CrashMode::DropAll).clean);
    let got = match rig.call(Request::ListVolumes).unwrap() {
        Reply::Volumes(vs) => vs[0].limits,
        r => panic!("unexpected {r:?}"),
    };
    assert_eq!(got, l);
    // And a clean restart.
    let (c, z) = devices(128 + 8 * 256, 28);
    let mut e = shale_engine::Engine::format(c, z, ManualClock::new(), tiny_config()).unwrap();
    let a = create(&mut e, "a", 1 << 20);
    set(&mut e, a, l).unwrap();
    let mut e = reopen(e, tiny_config());
    assert_eq!(limits_of(&mut e, "a"), l);
}

fn rig_limits(r: &mut rig::Rig) -> VolumeLimits {
    match r.call(Request::ListVolumes).unwrap() {
        Reply::Volumes(vs) => vs[0].limits,
        x => panic!("unexpected {x:?}"),
    }
}

/// A crash in the middle of a limits change: a copy of the (two-block) volume table
/// torn anywhere, or whole but not yet checkpointed, leaves the checkpoint's limits in
/// force; a cut during the checkpoint leaves the old limits or the new. The data stays.
#[test]
fn a_crash_during_a_limits_change_leaves_the_old_limits_or_the_new() {
    use crate::recovery::{last_write_in, pending_ids};
    use rig::{after_write, Rig};
    use shale_testkit::power::Side;
    let old = VolumeLimits {
        iops_max: 1_000,
        bytes_per_sec_max: 0,
        ..VolumeLimits::NONE
    };
    let new = VolumeLimits {
        iops_max: 0,
        bytes_per_sec_max: 8 << 20,
        ..VolumeLimits::NONE
    };
    let v = VolumeUid(1);
    // Torn at 512 bytes, between the copy's two blocks, inside its second block; and
    // (case 3) written whole.
    for (case, keep_bytes) in [(0u64, 512u64), (1, 4096), (2, 4096 + 512), (3, 0)] {
        let mut r = Rig::new(60 + case);
        for l in 0..40 {
            r.write(l);
        }
        r.call(Request::SetVolumeLimits {
            volume: v,
            limits: old,
        })
        .unwrap();
        r.flush();
        let (lo, hi) = r.volume_table_range();
        r.sw.arm(after_write(Side::Cache, lo, hi, 0));
        let _ = r.try_call(Request::SetVolumeLimits {
            volume: v,
            limits: new,
        });
        let torn = last_write_in(&r.cache_ctl, lo, hi);
        let keep = pending_ids(&r.cache_ctl, torn);
        let cache_mode = if keep_bytes == 0 {
            CrashMode::KeepAll
        } else {
            CrashMode::TearWrite {
                keep,
                id: torn,
                keep_bytes,
            }
        };
        let rep = r.crash(cache_mode, CrashMode::DropAll).clone();
        assert!(
            rep.warnings.iter().any(|w| w.contains("volume table")),
            "case {case}: {:?}",
            rep.warnings
        );
        assert_eq!(rig_limits(&mut r), old, "case {case}");
        r.verify();
    }
    // Cut during the checkpoint that makes the change complete: old or new.
    for seed in 0..6 {
        let mut r = Rig::new(70 + seed);
        for l in 0..40 {
            r.write(l);
        }
        r.flush();
        let (lo, hi) = r.checkpoint_range();
        r.sw.arm(after_write(Side::Cache, lo, hi, seed as u32 % 3));
        let _ = r.try_call(Request::SetVolumeLimits {
            volume: v,
            limits: new,
        });
        r.crash(
            CrashMode::KeepRandomSubset { seed },
            CrashMode::KeepRandomSubset { seed },
        );
        let got = rig_limits(&mut r);
        assert!(got == new || got.is_none(), "seed {seed}: {got:?}");
        r.verify();
    }
}

fn cache_valid_bytes(e: &Eng, v: VolumeUid) -> u64 {
    e.stats()
        .volumes
        .iter()
        .find(|s| s.uid == v)
        .map_or(0, |s| s.cache_valid_bytes)
}

/// Runs a noisy volume (uniform writes over 64 MiB, three quarters of the writes)
/// beside a quiet one (uniform over 16 MiB), the noisy one with cache share `pct`;
/// returns, over the second half, the most of the cache's data blocks the noisy one
/// held and the least the quiet one held, in percent, and the engine.
fn noisy_beside_quiet(pct: u8) -> (f64, f64, Eng) {
    let (c, z) = devices(128 + 64 * 256, 200);
    let config = shale_engine::Config {
        compaction_free_chunks_pct: 15,
        ..tiny_config()
    };
    let mut e = shale_engine::Engine::format(c, z, ManualClock::new(), config).unwrap();
    let noisy = create(&mut e, "noisy", 64 << 20);
    let quiet = create(&mut e, "quiet", 16 << 20);
    let l = VolumeLimits {
        cache_share_pct: pct,
        ..VolumeLimits::NONE
    };
    set(&mut e, noisy, l).unwrap();
    // The cache's data blocks: 64 chunks of 256 blocks, two md blocks per 128.
    let cache_bytes = (64 * 252 * 4096) as f64;
    let (mut noisy_max, mut quiet_min) = (0f64, f64::MAX);
    let mut x = 7u64;
    let rounds = 24_000u64;
    for i in 0..rounds {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let (v, lba) = if i % 4 == 3 {
            (quiet, (x >> 33) % 4096)
        } else {
            (noisy, (x >> 33) % 16_384)
        };
        write(&mut e, v, lba * 4096, &pattern(i, 4096)).unwrap();
        if i >= rounds / 2 && i % 200 == 0 {
            noisy_max = noisy_max.max(cache_valid_bytes(&e, noisy) as f64 / cache_bytes * 100.0);
            quiet_min = quiet_min.min(cache_valid_bytes(&e, quiet) as f64 / cache_bytes * 100.0);
        }
    }
    (noisy_max, quiet_min, e)
}

#[test]
fn a_volume_past_its_cache_share_is_compacted_first() {
    let (free_noisy, free_quiet, _) = noisy_beside_quiet(0);
    let (noisy, quiet, mut e) = noisy_beside_quiet(20);
    println!(
        "noisy volume's most of the cache: {free_noisy:.1}% without a share, {noisy:.1}% with \
         a 20% share; quiet volume's least: {free_quiet:.1}% and {quiet:.1}%"
    );
    // Within 5% of the share; without it the noisy volume takes far more.
    assert!(noisy <= 25.0, "noisy held {noisy:.1}% against a 20% share");
    assert!(free_noisy > noisy + 10.0, "{free_noisy:.1}% vs {noisy:.1}%");
    // Chunks hold both volumes' blocks, so compacting the noisy one's also moves some
    // of the quiet one's: the share bounds a volume, it does not reserve the rest.
    assert!(quiet > 0.0 && free_quiet > 0.0);
    // The counts follow the data across a restart (the open's census rebuilds them).
    let before: Vec<u64> = e
        .stats()
        .volumes
        .iter()
        .map(|v| v.cache_valid_bytes)
        .collect();
    e = reopen(e, tiny_config());
    // The background census rebuilds them as it walks the L2P.
    e.run_until_idle().unwrap();
    let after: Vec<u64> = e
        .stats()
        .volumes
        .iter()
        .map(|v| v.cache_valid_bytes)
        .collect();
    assert_eq!(before, after);
    assert_eq!(limits_of(&mut e, "noisy").cache_share_pct, 20);
    // Past 100% is refused.
    let v = e.stats().volumes[0].uid;
    let bad = VolumeLimits {
        cache_share_pct: 101,
        ..VolumeLimits::NONE
    };
    assert!(matches!(
        set(&mut e, v, bad),
        Err(EngineError::InvalidVolume { .. })
    ));
}

/// Hot/cold writes (90% of them to a tenth of the volume) on a volume whose GC
/// policy is `gc`, beside another volume; returns the GC victims, the capacity bytes
/// GC wrote, and the engine, every block read back checked.
fn hot_cold_with_gc(gc: shale_engine::VolumeGc) -> (u64, u64, Eng) {
    let (c, z) = devices(128 + 4 * 256, 24);
    let clock = ManualClock::new();
    let mut e = shale_engine::Engine::format(c, z, clock.clone(), tiny_config()).unwrap();
    let blocks = e.user_capacity_bytes() / 4096 * 8 / 10;
    let v = create(&mut e, "hc", blocks * 4096);
    let l = VolumeLimits {
        gc,
        ..VolumeLimits::NONE
    };
    set(&mut e, v, l).unwrap();
    let mut last = vec![u64::MAX; blocks as usize];
    let mut x = 11u64;
    for i in 0..blocks * 8 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = x >> 33;
        let lba = if r % 10 < 9 {
            r % (blocks / 10)
        } else {
            r % blocks
        };
        write(&mut e, v, lba * 4096, &pattern(i, 4096)).unwrap();
        last[lba as usize] = i;
        // Zones age as writes go by (cost-benefit weighs their age).
        clock.advance_ns(1_000);
    }
    for (lba, &i) in last.iter().enumerate() {
        if i != u64::MAX {
            assert_eq!(
                read(&mut e, v, lba as u64 * 4096, 4096).unwrap(),
                pattern(i, 4096)
            );
        }
    }
    let s = e.stats();
    (s.gc_victims, s.capacity_gc_write_bytes, e)
}

/// Which zone each policy takes is `choose_per_policy`'s property test; here, GC
/// under a volume's own policy keeps every block, and the policy lasts.
#[test]
fn a_volumes_gc_policy_is_kept_and_gc_under_it_keeps_every_block() {
    use shale_engine::VolumeGc;
    let (greedy_victims, greedy_bytes, _) = hot_cold_with_gc(VolumeGc::Greedy);
    let (cb_victims, cb_bytes, mut e) = hot_cold_with_gc(VolumeGc::CostBenefit);
    println!(
        "hot/cold: greedy {greedy_victims} GC victims, {greedy_bytes} bytes moved; \
         cost-benefit {cb_victims} victims, {cb_bytes} bytes"
    );
    assert!(greedy_victims > 0 && cb_victims > 0);
    e = reopen(e, tiny_config());
    assert_eq!(limits_of(&mut e, "hc").gc, VolumeGc::CostBenefit);
}
