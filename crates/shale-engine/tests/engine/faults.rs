//! The engine over devices that hold completions back (so they arrive late and out of
//! order) and that fail I/O on request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::common::{call, pattern, tiny_config};
use shale_device::{ErrorRule, FaultController, FaultDevice, Latency, ZoneEmu, ZoneEmuConfig};
use shale_engine::{Engine, EngineError, ManualClock, Reply, Request, VolumeUid};

type FEng = Engine<FaultDevice, ZoneEmu<FaultDevice>, ManualClock>;

fn fault_engine(seed: u64) -> (FEng, FaultController, FaultController) {
    let cache = FaultDevice::new((128 + 8 * 256) * 4096, 4096, seed).unwrap();
    let inner = FaultDevice::new(30 * 256 * 4096, 4096, seed + 1).unwrap();
    let (cc, zc) = (cache.controller(), inner.controller());
    let mut cfg = ZoneEmuConfig::new(256 * 4096);
    cfg.zone_count_max = 28;
    cfg.max_open_zones = 8;
    cfg.max_active_zones = 8;
    let cap = ZoneEmu::format(inner, &cfg).unwrap();
    let e = Engine::format(cache, cap, ManualClock::new(), tiny_config()).unwrap();
    (e, cc, zc)
}

/// A clean shutdown and open of the same devices.
fn reopen(e: FEng) -> FEng {
    let (c, z) = e.shutdown().unwrap();
    Engine::open(
        c,
        ZoneEmu::open(z.into_inner()).unwrap(),
        ManualClock::new(),
        tiny_config(),
    )
    .unwrap()
}

/// From now on every read (or write) of the device fails.
fn fail_all(ctl: &FaultController, reads: bool) {
    ctl.add_error_rule(ErrorRule {
        reads,
        writes: !reads,
        offset: 0,
        len: u64::MAX / 2,
        remaining: None,
    });
}

/// Writes one 4 KiB block of `pattern(seed)` at `offset`.
fn write_block(e: &mut FEng, v: VolumeUid, offset: u64, seed: u64) -> Result<Reply, EngineError> {
    call(
        e,
        Request::Write {
            volume: v,
            offset,
            data: pattern(seed, 4096),
            fua: false,
        },
    )
}

/// Creates volume 0 of `bytes`.
fn create_volume(e: &mut FEng, bytes: u64) -> VolumeUid {
    call(
        e,
        Request::CreateVolume {
            name: "a".into(),
            size_bytes: bytes,
        },
    )
    .unwrap();
    VolumeUid(1)
}

#[test]
fn late_and_reordered_completions() {
    let (mut e, cc, zc) = fault_engine(11);
    cc.set_latency(Latency::Polls { min: 0, max: 6 });
    zc.set_latency(Latency::Polls { min: 0, max: 6 });
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = match call(
        &mut e,
        Request::CreateVolume {
            name: "a".into(),
            size_bytes: blocks * 4096,
        },
    )
    .unwrap()
    {
        Reply::Volume(v) => v.uid,
        r => panic!("{r:?}"),
    };
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut x = 17u64;
    // Keep many requests in flight at once so completions interleave.
    let done = Arc::new(Mutex::new(0u64));
    let mut submitted = 0u64;
    for i in 0..blocks * 5 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lba = (x >> 33) % blocks;
        model.insert(lba, i);
        let d = done.clone();
        e.submit(
            Request::Write {
                volume: v,
                offset: lba * 4096,
                data: pattern(i, 4096),
                fua: i % 997 == 0,
            },
            Box::new(move |r| {
                r.unwrap();
                *d.lock().unwrap() += 1;
            }),
        );
        submitted += 1;
        if i % 32 == 31 {
            while *done.lock().unwrap() + 16 < submitted {
                if !e.poll() {
                    e.wait_io();
                }
            }
        }
        if i % 1000 == 999 {
            e.self_check().unwrap();
        }
    }
    e.run_until_idle().unwrap();
    e.self_check().unwrap();
    let s = e.stats();
    assert!(s.gc_victims > 0 && s.compaction_victims > 0, "{s:?}");
    for (&lba, &i) in model.iter().take(600) {
        match call(
            &mut e,
            Request::Read {
                volume: v,
                offset: lba * 4096,
                len: 4096,
            },
        )
        .unwrap()
        {
            Reply::Read(d) => assert_eq!(d, pattern(i, 4096), "lba {lba}"),
            r => panic!("{r:?}"),
        }
    }
    let mut e = reopen(e);
    e.self_check().unwrap();
    for (&lba, &i) in model.iter().skip(600).take(600) {
        match call(
            &mut e,
            Request::Read {
                volume: v,
                offset: lba * 4096,
                len: 4096,
            },
        )
        .unwrap()
        {
            Reply::Read(d) => assert_eq!(d, pattern(i, 4096), "lba {lba}"),
            r => panic!("{r:?}"),
        }
    }
}

#[test]
fn a_read_error_fails_that_read_only() {
    let (mut e, cc, _zc) = fault_engine(3);
    let v = VolumeUid(1);
    call(
        &mut e,
        Request::CreateVolume {
            name: "a".into(),
            size_bytes: 1 << 20,
        },
    )
    .unwrap();
    for i in 0..200u64 {
        call(
            &mut e,
            Request::Write {
                volume: v,
                offset: i * 4096,
                data: pattern(i, 4096),
                fua: false,
            },
        )
        .unwrap();
    }
    let loc = e.locate(v, shale_engine::Lba(5)).unwrap().unwrap();
    // Make sure the block is on the device, not only in a group buffer.
    call(&mut e, Request::Flush).unwrap();
    cc.add_error_rule(ErrorRule {
        reads: true,
        writes: false,
        offset: loc.offset,
        len: 4096,
        remaining: None,
    });
    let r = call(
        &mut e,
        Request::Read {
            volume: v,
            offset: 5 * 4096,
            len: 4096,
        },
    );
    if loc.in_memory {
        assert!(r.is_ok());
    } else {
        assert!(matches!(r, Err(EngineError::CacheIo { .. })), "{r:?}");
    }
    cc.clear_errors();
    match call(
        &mut e,
        Request::Read {
            volume: v,
            offset: 4 * 4096,
            len: 3 * 4096,
        },
    )
    .unwrap()
    {
        Reply::Read(d) => assert_eq!(&d[4096..8192], &pattern(5, 4096)[..]),
        r => panic!("{r:?}"),
    }
    e.self_check().unwrap();
}

#[test]
fn a_write_error_stops_the_engine_cleanly() {
    let (mut e, cc, _zc) = fault_engine(5);
    let v = VolumeUid(1);
    call(
        &mut e,
        Request::CreateVolume {
            name: "a".into(),
            size_bytes: 1 << 20,
        },
    )
    .unwrap();
    fail_all(&cc, false);
    let r = call(
        &mut e,
        Request::Write {
            volume: v,
            offset: 0,
            data: pattern(1, 4096),
            fua: false,
        },
    );
    assert!(r.is_err(), "{r:?}");
    // Everything after a fatal device error fails the same way, without panicking.
    let r = call(
        &mut e,
        Request::Read {
            volume: v,
            offset: 0,
            len: 4096,
        },
    );
    assert!(matches!(r, Err(EngineError::Failed { .. })), "{r:?}");
    assert!(matches!(e.shutdown(), Err(EngineError::Failed { .. })));
}

/// Reads `len` bytes at `offset` of volume `v`.
fn read(e: &mut FEng, v: VolumeUid, offset: u64, len: u64) -> Result<Reply, EngineError> {
    call(
        e,
        Request::Read {
            volume: v,
            offset,
            len,
        },
    )
}

/// Reads 4 KiB at each offset and checks it holds `pattern(seed)`.
fn assert_blocks(e: &mut FEng, v: VolumeUid, blocks: &[(u64, u64)]) {
    for &(off, seed) in blocks {
        match read(e, v, off, 4096) {
            Ok(Reply::Read(d)) => assert_eq!(d, pattern(seed, 4096), "offset {off}"),
            other => panic!("read at {off}: {other:?}"),
        }
    }
}

/// A write whose L2P page cannot be read fails with that error, and only that write:
/// nothing of it was appended, and the engine carries on.
#[test]
fn a_write_failing_its_l2p_fault_fails_only_itself() {
    let (mut e, cc, _zc) = fault_engine(7);
    let v = create_volume(&mut e, 4 << 20);
    for i in 0..64u64 {
        write_block(&mut e, v, i * 16 * 4096, i).unwrap();
    }
    let mut e = reopen(e);
    let appended = e.stats().user_blocks_appended;
    // Every cache read fails: the next write's L2P page fault among them.
    fail_all(&cc, true);
    let r = write_block(&mut e, v, 4096, 99);
    assert!(matches!(r, Err(EngineError::CacheIo { .. })), "{r:?}");
    assert_eq!(e.stats().user_blocks_appended, appended);
    call(&mut e, Request::Flush).unwrap();
    cc.clear_errors();
    write_block(&mut e, v, 4096, 99).unwrap();
    assert_blocks(&mut e, v, &[(0, 0), (4096, 99), (16 * 4096, 1)]);
    e.self_check().unwrap();
}

/// A partial write over a block that cannot be read (the read of its
/// read-modify-write fails) fails only itself; its other blocks are written.
#[test]
fn a_failed_read_modify_write_fails_only_its_write() {
    let (mut e, cc, _zc) = fault_engine(13);
    let v = create_volume(&mut e, 4 << 20);
    for i in 0..4u64 {
        write_block(&mut e, v, i * 4096, i).unwrap();
    }
    let mut e = reopen(e);
    // Loads the L2P page, so the only cache read left is the data block's.
    read(&mut e, v, 3 * 4096, 4096).unwrap();
    fail_all(&cc, true);
    // Block 0 whole, then the first half of block 1 (read-modify-write).
    let mut data = pattern(50, 4096);
    data.extend_from_slice(&pattern(51, 2048));
    let r = call(
        &mut e,
        Request::Write {
            volume: v,
            offset: 0,
            data,
            fua: false,
        },
    );
    assert!(matches!(r, Err(EngineError::CacheIo { .. })), "{r:?}");
    cc.clear_errors();
    call(&mut e, Request::Flush).unwrap();
    assert_blocks(&mut e, v, &[(0, 50), (4096, 1), (2 * 4096, 2)]);
    let mut e = reopen(e);
    e.self_check().unwrap();
}

/// An L2P page loaded ahead of its request that cannot be read is not that request's
/// error: the request faults the page in itself (here the second read works), and only
/// an error there would fail it. Pages of other requests still load ahead.
#[test]
fn a_failed_page_load_falls_back_to_the_synchronous_fault() {
    let (mut e, cc, _zc) = fault_engine(11);
    let v = create_volume(&mut e, 12 << 20);
    // One block in each of the volume's three L2P pages (1024 blocks each).
    for page in 0..3u64 {
        write_block(&mut e, v, page * 1024 * 4096, page).unwrap();
    }
    let mut e = reopen(e);
    // The next cache read fails once: the load of page 0 started for the write below.
    cc.add_error_rule(ErrorRule {
        reads: true,
        writes: false,
        offset: 0,
        len: u64::MAX / 2,
        remaining: Some(1),
    });
    write_block(&mut e, v, 4096, 10).unwrap();
    let ahead = e.stats().l2p_page_reads_ahead;
    write_block(&mut e, v, 1024 * 4096 + 4096, 11).unwrap();
    assert_eq!(e.stats().l2p_page_reads_ahead, ahead + 1);
    assert_blocks(
        &mut e,
        v,
        &[
            (0, 0),
            (4096, 10),
            (1024 * 4096, 1),
            (1024 * 4096 + 4096, 11),
            (2048 * 4096, 2),
        ],
    );
    e.self_check().unwrap();
}

/// Submits `count` one-block writes over the first `blocks` LBAs at once, then polls
/// for up to `secs` of wall time (or until all are answered); returns the answers.
fn write_burst(
    e: &mut FEng,
    v: VolumeUid,
    blocks: u64,
    count: u64,
    secs: f64,
    mut every_poll: impl FnMut(&FEng) -> bool,
) -> Arc<Mutex<Vec<Result<Reply, EngineError>>>> {
    let answers = Arc::new(Mutex::new(Vec::new()));
    for i in 0..count {
        let a = answers.clone();
        e.submit(
            Request::Write {
                volume: v,
                offset: (i % blocks) * 4096,
                data: pattern(i, 4096),
                fua: false,
            },
            Box::new(move |r| a.lock().unwrap().push(r)),
        );
    }
    poll_for(e, secs, |e| {
        every_poll(e);
        answers.lock().unwrap().len() as u64 == count
    });
    answers
}

/// Polls for up to `secs` of wall time, until `done`, in a spin: never waiting in
/// the device, so the loop runs as fast as it can while completions are held.
fn poll_for(e: &mut FEng, secs: f64, mut done: impl FnMut(&FEng) -> bool) {
    let start = std::time::Instant::now();
    while start.elapsed().as_secs_f64() < secs && !done(e) {
        e.poll();
    }
}

fn slow_capacity_engine(
    seed: u64,
    clock: ManualClock,
    latency_ms: u64,
    config: shale_engine::Config,
) -> (FEng, VolumeUid, u64) {
    let cache = FaultDevice::new((128 + 8 * 256) * 4096, 4096, seed).unwrap();
    let inner = FaultDevice::new(30 * 256 * 4096, 4096, seed + 1).unwrap();
    let zc = inner.controller();
    let mut cfg = ZoneEmuConfig::new(256 * 4096);
    cfg.zone_count_max = 28;
    let cap = ZoneEmu::format(inner, &cfg).unwrap();
    let mut e = Engine::format(cache, cap, clock, config).unwrap();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create_volume(&mut e, blocks * 4096);
    let d = std::time::Duration::from_millis(latency_ms);
    zc.set_latency(Latency::Duration { min: d, max: d });
    (e, v, blocks)
}

/// Stuck is a matter of time on the engine's clock, not of loop iterations: a
/// capacity device that takes 20 ms per completion, polled in a spin (so the loop runs
/// as many iterations as it can while writes wait for space), only makes the engine
/// slow while its clock stands still.
#[test]
fn a_slow_device_is_slow_not_stuck() {
    let count = 6_000;
    let (mut e, v, blocks) = slow_capacity_engine(31, ManualClock::new(), 20, tiny_config());
    let answers = write_burst(&mut e, v, blocks, count, 120.0, |_| false);
    let got = answers.lock().unwrap();
    assert_eq!(got.len() as u64, count, "writes not all answered");
    assert!(got.iter().all(|r| r.is_ok()), "a slow device failed writes");
    assert!(e.failure().is_none(), "{:?}", e.failure());
}

/// A fatal error while user reads are in flight: the failed engine answers them at
/// once, and their device completions, arriving later, are only released (they were
/// once dispatched to the reads the failure had already answered: a panic).
#[test]
fn completions_after_a_failure_are_released_not_dispatched() {
    let (mut e, cc, zc) = fault_engine(21);
    let bytes = e.user_capacity_bytes() / 2 / 4096 * 4096;
    let v = create_volume(&mut e, bytes);
    // More than the cache holds, so the first blocks are compacted into zones.
    let mut off = 0;
    while off < bytes {
        let n = (64 << 10).min(bytes - off);
        call(
            &mut e,
            Request::Write {
                volume: v,
                offset: off,
                data: pattern(off, n as usize),
                fua: false,
            },
        )
        .unwrap();
        off += n;
    }
    call(&mut e, Request::Flush).unwrap();
    assert!(e.stats().capacity_compaction_write_bytes > 0);
    // Zone reads take 8 polls; cache writes fail from now on.
    zc.set_latency(Latency::Polls { min: 8, max: 8 });
    let answers: Arc<Mutex<Vec<Result<Reply, EngineError>>>> = Arc::default();
    for i in 0..8u64 {
        let a = Arc::clone(&answers);
        e.submit(
            Request::Read {
                volume: v,
                offset: i * 4096,
                len: 4096,
            },
            Box::new(move |r| a.lock().unwrap().push(r)),
        );
    }
    e.poll();
    assert!(
        answers.lock().unwrap().is_empty(),
        "the reads wait for the zones"
    );
    fail_all(&cc, false);
    let a = Arc::clone(&answers);
    e.submit(
        Request::Write {
            volume: v,
            offset: bytes - 4096,
            data: pattern(7, 4096),
            fua: true,
        },
        Box::new(move |r| a.lock().unwrap().push(r)),
    );
    poll_until_failed_and_idle(&mut e, 10_000);
    assert!(e.failure().is_some(), "the write error stopped the engine");
    assert!(e.is_idle(), "every completion was released");
    let answers = answers.lock().unwrap();
    assert_eq!(answers.len(), 9, "every request answered once");
    assert!(answers[8..].iter().all(Result::is_err));
}

/// Polls (waiting for device I/O when nothing moved) until the engine has failed and
/// gone idle, at most `polls` times.
fn poll_until_failed_and_idle(e: &mut FEng, polls: usize) {
    for _ in 0..polls {
        if e.failure().is_some() && e.is_idle() {
            break;
        }
        if !e.poll() && !e.is_idle() {
            e.wait_io();
        }
    }
}

/// A flush waiting when a write error stops the engine: the flush is answered, and
/// the failed engine goes idle (it owes no durability point and holds no I/O), so
/// its thread sleeps instead of polling a dead engine.
#[test]
fn a_failed_engine_with_a_flush_waiting_goes_idle() {
    let (mut e, cc, _) = fault_engine(23);
    let v = create_volume(&mut e, 1 << 20);
    fail_all(&cc, false);
    let answers: Arc<Mutex<Vec<Result<Reply, EngineError>>>> = Arc::default();
    for req in [
        Request::Write {
            volume: v,
            offset: 0,
            data: pattern(3, 64 << 10),
            fua: false,
        },
        Request::Flush,
    ] {
        let a = Arc::clone(&answers);
        e.submit(req, Box::new(move |r| a.lock().unwrap().push(r)));
    }
    poll_until_failed_and_idle(&mut e, 1_000);
    assert!(e.failure().is_some(), "the write error stopped the engine");
    assert!(e.is_idle(), "a failed engine owes nothing and holds no I/O");
    let answers = answers.lock().unwrap();
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(Result::is_err), "{answers:?}");
}
