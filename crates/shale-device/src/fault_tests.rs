use super::*;
use crate::{IoBuf, ZoneEmu, ZoneEmuConfig, ZoneState, ZonedDevice};

const MIB: u64 = 1024 * 1024;

fn dev(seed: u64) -> FaultDevice {
    FaultDevice::new(4 * MIB, 512, seed).expect("fault device")
}

fn fill(len: usize, v: u8) -> Vec<u8> {
    vec![v; len]
}

fn read(d: &mut FaultDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    d.read_at(offset, &mut b).expect("read");
    b
}

fn write_async(d: &mut FaultDevice, tag: u64, offset: u64, data: &[u8], fua: bool) {
    d.submit(IoRequest {
        tag,
        op: IoOp::Write {
            offset,
            buf: IoBuf::from_slice(data),
            fua,
        },
    });
}

fn drain(d: &mut FaultDevice) -> Vec<IoCompletion> {
    let mut out = Vec::new();
    while d.in_flight() > 0 {
        d.poll(&mut out, 1).expect("poll");
    }
    out
}

#[test]
fn constructor_validates_geometry() {
    assert!(matches!(
        FaultDevice::new(0, 512, 1),
        Err(DeviceError::TooSmall { .. })
    ));
    assert!(matches!(
        FaultDevice::new(MIB, 768, 1),
        Err(DeviceError::InvalidGeometry { .. })
    ));
}

#[test]
fn only_flushed_writes_survive_drop_all() {
    let mut d = dev(1);
    d.write_at(0, &fill(4096, 1)).expect("write");
    d.flush().expect("flush");
    d.write_at(4096, &fill(4096, 2)).expect("write");
    d.write_at(0, &fill(512, 3)).expect("overwrite");
    assert_eq!(d.counters().writes_pending, 2);
    let report = d.crash(&CrashMode::DropAll).expect("crash");
    assert_eq!(report.dropped.len(), 2);
    assert!(report.applied.is_empty() && report.torn.is_none());
    assert_eq!(read(&mut d, 0, 4096), fill(4096, 1));
    assert_eq!(read(&mut d, 4096, 4096), fill(4096, 0));
    assert_eq!(d.counters().writes_pending, 0);
    assert_eq!(d.counters().crashes, 1);
}

#[test]
fn keep_all_is_a_flush_at_the_crash() {
    let mut d = dev(1);
    d.write_at(0, &fill(4096, 1)).expect("write");
    d.discard(1024, 1024).expect("discard");
    let r = d.crash(&CrashMode::KeepAll).expect("crash");
    assert_eq!(r.applied.len(), 2);
    let b = read(&mut d, 0, 4096);
    assert_eq!(&b[..1024], &fill(1024, 1)[..]);
    assert_eq!(&b[1024..2048], &fill(1024, 0)[..]);
    assert_eq!(&b[2048..], &fill(2048, 1)[..]);
}

#[test]
fn fua_write_is_durable_when_its_completion_arrives() {
    let mut d = dev(1);
    write_async(&mut d, 1, 0, &fill(4096, 7), true);
    write_async(&mut d, 2, 8192, &fill(4096, 8), false);
    assert_eq!(drain(&mut d).len(), 2);
    let p = d.pending_writes();
    assert_eq!(
        p.len(),
        1,
        "the FUA write was folded into the durable image"
    );
    assert_eq!(
        (p[0].offset, p[0].completed, p[0].durable),
        (8192, true, false)
    );
    d.crash(&CrashMode::DropAll).expect("crash");
    assert_eq!(read(&mut d, 0, 4096), fill(4096, 7));
    assert_eq!(read(&mut d, 8192, 4096), fill(4096, 0));
}

#[test]
fn flush_covers_only_writes_completed_before_it_was_submitted() {
    let mut d = dev(3);
    d.controller()
        .set_latency(Latency::Polls { min: 3, max: 3 });
    // The write is still in flight when the flush is submitted.
    write_async(&mut d, 1, 0, &fill(4096, 1), false);
    d.submit(IoRequest {
        tag: 2,
        op: IoOp::Flush,
    });
    let done = drain(&mut d);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|c| c.result.is_ok()));
    let p = d.pending_writes();
    assert_eq!(p.len(), 1);
    assert!(p[0].completed && !p[0].durable);
    // Now it has completed: a second flush covers it.
    d.submit(IoRequest {
        tag: 3,
        op: IoOp::Flush,
    });
    drain(&mut d);
    assert!(d.pending_writes().is_empty());
    d.crash(&CrashMode::DropAll).expect("crash");
    assert_eq!(read(&mut d, 0, 4096), fill(4096, 1));
}

#[test]
fn a_durable_write_is_never_overwritten_by_an_older_pending_one() {
    let mut d = dev(1);
    d.write_at(0, &fill(4096, 1)).expect("older, not durable");
    write_async(&mut d, 1, 0, &fill(4096, 2), true);
    drain(&mut d);
    // Pending: [older (optional), newer (durable)].
    assert_eq!(d.pending_writes().len(), 2);
    for mode in [
        CrashMode::DropAll,
        CrashMode::KeepAll,
        CrashMode::KeepRandomSubset { seed: 9 },
    ] {
        let mut d2 = dev(1);
        d2.write_at(0, &fill(4096, 1)).expect("w");
        write_async(&mut d2, 1, 0, &fill(4096, 2), true);
        drain(&mut d2);
        d2.crash(&mode).expect("crash");
        assert_eq!(read(&mut d2, 0, 4096), fill(4096, 2), "{mode:?}");
    }
}

#[test]
fn random_subset_is_seeded_and_applied_in_order() {
    let run = |seed: u64| {
        let mut d = dev(1);
        d.write_at(0, &fill(MIB as usize, 0xEE)).expect("base");
        d.flush().expect("flush");
        for i in 0..32u64 {
            d.write_at(i * 4096, &fill(4096, i as u8 + 1)).expect("w");
        }
        let r = d
            .crash(&CrashMode::KeepRandomSubset { seed })
            .expect("crash");
        let image = read(&mut d, 0, 32 * 4096);
        (r, image)
    };
    let (a, img_a) = run(42);
    let (b, img_b) = run(42);
    assert_eq!(a, b, "same seed, same crash");
    assert_eq!(img_a, img_b);
    assert_eq!(a.applied.len() + a.dropped.len(), 32);
    assert!(!a.applied.is_empty() && !a.dropped.is_empty());
    for i in 0..32u64 {
        let kept = a.applied.contains(&WriteId(i + 1));
        let want = if kept { i as u8 + 1 } else { 0xEE };
        let block = &img_a[(i * 4096) as usize..((i + 1) * 4096) as usize];
        assert!(block.iter().all(|&x| x == want), "block {i}");
    }
    let (c, _) = run(43);
    assert_ne!(a.applied, c.applied, "another seed, another subset");
}

#[test]
fn keep_chosen_writes() {
    let mut d = dev(1);
    for i in 0..4u64 {
        d.write_at(i * 512, &fill(512, i as u8 + 1)).expect("w");
    }
    let ids: Vec<WriteId> = d.pending_writes().iter().map(|p| p.id).collect();
    assert!(matches!(
        d.crash(&CrashMode::Keep(vec![WriteId(99)])),
        Err(CrashError::UnknownWrite { id: WriteId(99) })
    ));
    let r = d
        .crash(&CrashMode::Keep(vec![ids[1], ids[3]]))
        .expect("crash");
    assert_eq!(r.applied, vec![ids[1], ids[3]]);
    let b = read(&mut d, 0, 2048);
    let want: Vec<u8> = [0u8, 2, 0, 4].iter().flat_map(|&v| fill(512, v)).collect();
    assert_eq!(b, want);
}

#[test]
fn torn_write_keeps_a_prefix_at_the_chosen_granularity() {
    for unit in [TearUnit::Sector512, TearUnit::Block4096] {
        let mut seen_cuts = std::collections::BTreeSet::new();
        for seed in 0..20u64 {
            let mut d = dev(1);
            d.write_at(0, &fill(64 * 1024, 0xAA)).expect("old");
            d.flush().expect("flush");
            d.write_at(0, &fill(64 * 1024, 0xBB)).expect("new");
            let r = d.crash(&CrashMode::Tear { seed, unit }).expect("crash");
            let (id, kept) = r.torn.expect("one write torn");
            assert_eq!(id, WriteId(1));
            assert_eq!(kept % unit.bytes(), 0);
            assert!(kept > 0 && kept < 64 * 1024);
            let b = read(&mut d, 0, 64 * 1024);
            assert!(b[..kept as usize].iter().all(|&x| x == 0xBB));
            assert!(b[kept as usize..].iter().all(|&x| x == 0xAA));
            seen_cuts.insert(kept);
        }
        assert!(seen_cuts.len() > 3, "{unit:?}: cuts {seen_cuts:?}");
    }
}

#[test]
fn explicit_tear_and_its_errors() {
    let mut d = dev(1);
    d.write_at(0, &fill(8192, 5)).expect("w");
    let id = d.pending_writes()[0].id;
    for bad in [8192u64, 100, 9000] {
        assert!(matches!(
            d.crash(&CrashMode::TearWrite {
                keep: vec![],
                id,
                keep_bytes: bad
            }),
            Err(CrashError::TearOutOfRange { .. })
        ));
    }
    let r = d
        .crash(&CrashMode::TearWrite {
            keep: vec![],
            id,
            keep_bytes: 1536,
        })
        .expect("crash");
    assert_eq!(r.torn, Some((id, 1536)));
    let b = read(&mut d, 0, 8192);
    assert!(b[..1536].iter().all(|&x| x == 5) && b[1536..].iter().all(|&x| x == 0));
}

#[test]
fn crash_retires_old_handles_and_loses_in_flight_requests() {
    let mut d = dev(1);
    let ctl = d.controller();
    ctl.set_latency(Latency::Polls { min: 5, max: 5 });
    write_async(&mut d, 1, 0, &fill(512, 1), false);
    d.submit(IoRequest {
        tag: 2,
        op: IoOp::Read {
            offset: 0,
            buf: IoBuf::zeroed(512),
        },
    });
    assert_eq!(ctl.counters().in_flight, 2);
    let (r, mut fresh) = ctl.crash(&CrashMode::KeepAll).expect("crash");
    assert_eq!(r.lost_in_flight, 2);
    // The write was submitted, so a crash may keep it even though it never completed.
    assert_eq!(r.applied, vec![WriteId(0)]);
    assert!(matches!(
        d.read_at(0, &mut [0u8; 512]),
        Err(DeviceError::Crashed { .. })
    ));
    assert!(matches!(
        d.write_at(0, &[0u8; 512]),
        Err(DeviceError::Crashed { .. })
    ));
    assert!(matches!(d.flush(), Err(DeviceError::Crashed { .. })));
    assert!(matches!(
        d.poll(&mut Vec::new(), 1),
        Err(DeviceError::Crashed { .. })
    ));
    assert_eq!(d.in_flight(), 0);
    assert_eq!(fresh.in_flight(), 0);
    assert_eq!(read(&mut fresh, 0, 512), fill(512, 1));
    // The restarted device's volatile and durable images are the same.
    let mut durable = vec![0u8; 512];
    ctl.read_durable(0, &mut durable).expect("durable");
    assert_eq!(durable, fill(512, 1));
}

#[test]
fn injected_errors_at_ranges_never_touch_other_data() {
    let mut d = dev(1);
    d.write_at(0, &fill(16384, 1)).expect("base");
    let ctl = d.controller();
    ctl.add_error_rule(ErrorRule {
        reads: false,
        writes: true,
        offset: 4096,
        len: 512,
        remaining: Some(2),
    });
    ctl.add_error_rule(ErrorRule {
        reads: true,
        writes: false,
        offset: 12288,
        len: 4096,
        remaining: None,
    });
    // Overlapping writes fail twice, then the rule is spent.
    for _ in 0..2 {
        assert!(matches!(
            d.write_at(0, &fill(8192, 2)),
            Err(DeviceError::Injected {
                op: IoOpKind::Write,
                offset: 0
            })
        ));
    }
    assert_eq!(
        read(&mut d, 0, 8192),
        fill(8192, 1),
        "failed writes changed nothing"
    );
    write_async(&mut d, 1, 8192, &fill(4096, 3), false);
    assert!(drain(&mut d)[0].result.is_ok());
    d.write_at(0, &fill(8192, 2)).expect("rule spent");
    assert!(matches!(
        d.read_at(12288, &mut [0u8; 512]),
        Err(DeviceError::Injected {
            op: IoOpKind::Read,
            ..
        })
    ));
    d.submit(IoRequest {
        tag: 5,
        op: IoOp::Read {
            offset: 8192,
            buf: IoBuf::zeroed(8192),
        },
    });
    let c = drain(&mut d);
    assert!(matches!(c[0].result, Err(DeviceError::Injected { .. })));
    assert_eq!(read(&mut d, 8192, 4096), fill(4096, 3));
    assert_eq!(d.counters().injected_errors, 4);
    ctl.clear_errors();
    assert_eq!(read(&mut d, 12288, 4096), fill(4096, 1));
}

#[test]
fn error_rate_is_seeded() {
    let failures = |seed: u64| {
        let mut d = dev(seed);
        d.controller().set_error_rate(0, 100_000);
        (0..1000u64)
            .filter(|i| d.write_at((i % 8) * 512, &[1u8; 512]).is_err())
            .collect::<Vec<u64>>()
    };
    let a = failures(7);
    assert_eq!(a, failures(7));
    assert_ne!(a, failures(8));
    assert!((50..200).contains(&a.len()), "{} of 1000 at 10%", a.len());
}

#[test]
fn flush_failures_make_nothing_durable() {
    let mut d = dev(1);
    d.write_at(0, &fill(512, 1)).expect("w");
    d.controller().fail_flushes(0, 1);
    assert!(matches!(
        d.flush(),
        Err(DeviceError::Injected {
            op: IoOpKind::Flush,
            ..
        })
    ));
    d.crash(&CrashMode::DropAll).expect("crash");
    assert_eq!(read(&mut d, 0, 512), fill(512, 0));
}

#[test]
fn latency_in_polls_reorders_completions() {
    let mut d = dev(11);
    d.controller()
        .set_latency(Latency::Polls { min: 0, max: 8 });
    for i in 0..64u64 {
        write_async(&mut d, i, i * 512, &fill(512, i as u8), false);
    }
    let mut out = Vec::new();
    let mut polls = 0;
    while d.in_flight() > 0 {
        d.poll(&mut out, 0).expect("poll");
        polls += 1;
        assert!(polls < 100, "completions never released");
    }
    assert!(polls > 3, "completions were held back");
    let tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
    let mut sorted = tags.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..64).collect::<Vec<u64>>());
    assert_ne!(tags, sorted, "held completions come back out of order");
    // A waiting poll gets what it asked for without spinning the caller.
    for i in 0..8u64 {
        write_async(&mut d, i, i * 512, &fill(512, 1), false);
    }
    out.clear();
    assert_eq!(d.poll(&mut out, 8).expect("poll"), 8);
}

#[test]
fn latency_in_time_holds_completions() {
    let mut d = dev(1);
    d.controller().set_latency(Latency::Duration {
        min: Duration::from_millis(2),
        max: Duration::from_millis(4),
    });
    let start = Instant::now();
    for i in 0..4u64 {
        write_async(&mut d, i, i * 512, &fill(512, 1), false);
    }
    let mut out = Vec::new();
    d.poll(&mut out, 0).expect("poll");
    assert!(out.is_empty(), "nothing is due yet");
    d.poll(&mut out, 4).expect("poll");
    assert_eq!(out.len(), 4);
    assert!(start.elapsed() >= Duration::from_millis(2));
}

#[test]
fn counters_and_pending_enumeration() {
    let mut d = dev(1);
    d.write_at(0, &fill(1024, 1)).expect("w");
    write_async(&mut d, 1, 4096, &fill(512, 1), true);
    d.discard(8192, 512).expect("discard");
    d.flush().expect("flush");
    let c = d.counters();
    assert_eq!(
        (c.writes, c.fua_writes, c.discards, c.flushes),
        (2, 1, 1, 1)
    );
    assert_eq!(c.bytes_written, 1536);
    assert_eq!(c.in_flight, 1);
    let p = d.pending_writes();
    // The FUA write has not completed, so it blocks the fold of what follows.
    assert_eq!(p.len(), 2);
    assert!(!p[0].completed && p[0].fua);
    assert!(p[1].discard && p[1].durable);
    drain(&mut d);
    assert!(d.pending_writes().is_empty());
    assert_eq!(d.counters().writes_pending, 0);
}

#[test]
fn zone_emulation_survives_crashes_and_torn_table_writes() {
    // 40 zones: the zone table spans two 512-byte sectors, so a tear can cut it.
    let zone = 16384u64;
    let mut d = FaultDevice::new(16384 + 40 * zone, 512, 5).expect("dev");
    let ctl = d.controller();
    let cfg = ZoneEmuConfig::new(zone);
    {
        let mut emu = ZoneEmu::format(&mut d, &cfg).expect("format");
        assert_eq!(emu.geometry().zone_count, 40);
        emu.append(0, &fill(8192, 1)).expect("append");
        emu.append(39, &fill(4096, 1)).expect("append");
        emu.flush().expect("flush");
        emu.append(0, &fill(4096, 2)).expect("unflushed append");
    }
    d.crash(&CrashMode::Tear {
        seed: 3,
        unit: TearUnit::Sector512,
    })
    .expect("crash");
    {
        let mut emu = ZoneEmu::open(&mut d).expect("reopen after crash");
        let z = emu.zone_info(0).expect("zone");
        assert_eq!((z.state, z.write_pointer), (ZoneState::Closed, 8192));
        let mut b = vec![0u8; 8192];
        emu.read_at(0, &mut b).expect("read");
        assert_eq!(b, fill(8192, 1));
        // The next table write is left pending: the flush after it fails.
        emu.append(39, &fill(4096, 3)).expect("append");
        ctl.fail_flushes(1, 1);
        assert!(emu.flush().is_err());
    }
    let table = d
        .pending_writes()
        .into_iter()
        .rev()
        .find(|p| (8192..16384).contains(&p.offset))
        .expect("table write pending");
    d.crash(&CrashMode::TearWrite {
        keep: vec![],
        id: table.id,
        keep_bytes: 512,
    })
    .expect("crash");
    let emu = ZoneEmu::open(&mut d).expect("falls back to the previous table");
    let z = emu.zone_info(39).expect("zone");
    assert_eq!(
        (z.state, z.write_pointer - z.start),
        (ZoneState::Closed, 4096)
    );
}

mod oracle {
    //! Crash consistency against an oracle: after any crash, every sector holds the
    //! value of its last durable write (or zeros) or of a later write, and nothing
    //! else.
    use super::*;
    use proptest::prelude::*;

    const SECTORS: u64 = 16;

    #[derive(Debug, Clone)]
    enum Op {
        /// Write `len` sectors at `at`: synchronously, or submitted and polled.
        Write {
            at: u64,
            len: u64,
            sync: bool,
            fua: bool,
        },
        /// Submitted and left in flight until the next poll.
        InFlight {
            at: u64,
            len: u64,
        },
        Flush {
            sync: bool,
        },
        Crash {
            seed: u64,
            tear: bool,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..SECTORS, 1..=3u64, any::<bool>(), any::<bool>()).prop_map(|(at, len, sync, fua)| Op::Write {
                at,
                len: len.min(SECTORS - at),
                sync,
                fua: fua && !sync,
            }),
            2 => (0..SECTORS, 1..=3u64).prop_map(|(at, len)| Op::InFlight { at, len: len.min(SECTORS - at) }),
            2 => any::<bool>().prop_map(|sync| Op::Flush { sync }),
            1 => (any::<u64>(), any::<bool>()).prop_map(|(seed, tear)| Op::Crash { seed, tear }),
        ]
    }

    /// Per sector: the writes since the last durable one, oldest first, with
    /// (value, write number, durable).
    type History = Vec<Vec<(u8, u64, bool)>>;

    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
        let mut d = FaultDevice::new(SECTORS * 512, 512, 1).expect("dev");
        let mut hist: History = vec![vec![(0, u64::MAX, true)]; SECTORS as usize];
        // Writes whose completion has been delivered, and those still in flight.
        let mut completed: Vec<u64> = Vec::new();
        let mut in_flight: Vec<u64> = Vec::new();
        let mut next = 0u64;
        let mut out = Vec::new();
        let mark_durable = |hist: &mut History, ids: &[u64]| {
            for h in hist.iter_mut() {
                for e in h.iter_mut() {
                    if ids.contains(&e.1) {
                        e.2 = true;
                    }
                }
                // Everything before the newest durable write is gone for good.
                if let Some(last) = h.iter().rposition(|e| e.2) {
                    h.drain(..last);
                }
            }
        };
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Write { at, len, sync, fua } => {
                    let id = next;
                    next += 1;
                    let value = (id % 250) as u8 + 1;
                    let data = fill((len * 512) as usize, value);
                    for s in at..at + len {
                        hist[s as usize].push((value, id, false));
                    }
                    if sync {
                        d.write_at(at * 512, &data).expect("write");
                        completed.push(id);
                    } else {
                        write_async(&mut d, id, at * 512, &data, fua);
                        out.clear();
                        d.poll(&mut out, in_flight.len() + 1).expect("poll");
                        completed.append(&mut in_flight);
                        completed.push(id);
                        if fua {
                            mark_durable(&mut hist, &[id]);
                        }
                    }
                }
                Op::InFlight { at, len } => {
                    let id = next;
                    next += 1;
                    let value = (id % 250) as u8 + 1;
                    for s in at..at + len {
                        hist[s as usize].push((value, id, false));
                    }
                    write_async(
                        &mut d,
                        id,
                        at * 512,
                        &fill((len * 512) as usize, value),
                        false,
                    );
                    in_flight.push(id);
                }
                Op::Flush { sync } => {
                    if sync {
                        d.flush().expect("flush");
                    } else {
                        d.submit(IoRequest {
                            tag: u64::MAX,
                            op: IoOp::Flush,
                        });
                        out.clear();
                        d.poll(&mut out, in_flight.len() + 1).expect("poll");
                    }
                    // Covers what had completed when it was submitted; requests in
                    // flight complete in the same poll but after it.
                    mark_durable(&mut hist, &completed);
                    completed.clear();
                    if !sync {
                        completed.append(&mut in_flight);
                    }
                }
                Op::Crash { seed, tear } => {
                    let mode = if tear {
                        CrashMode::Tear {
                            seed,
                            unit: TearUnit::Sector512,
                        }
                    } else {
                        CrashMode::KeepRandomSubset { seed }
                    };
                    d.crash(&mode).expect("crash");
                    for (s, h) in hist.iter_mut().enumerate() {
                        let got = read(&mut d, s as u64 * 512, 512);
                        let v = got[0];
                        prop_assert!(
                            got.iter().all(|&b| b == v),
                            "step {} sector {} mixed",
                            step,
                            s
                        );
                        prop_assert!(
                            h.iter().any(|e| e.0 == v),
                            "step {} sector {}: {} not among allowed {:?}",
                            step,
                            s,
                            v,
                            h
                        );
                        *h = vec![(v, u64::MAX, true)];
                    }
                    completed.clear();
                    in_flight.clear();
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn crashes_leave_only_allowed_values(ops in proptest::collection::vec(op(), 1..80)) {
            run(ops)?;
        }
    }
}

#[test]
fn zone_emulation_persists_only_completed_writes_and_waits_on_reset() {
    use crate::{ZoneOp, ZoneRequest};
    let zone = 65536u64;
    let mut d = FaultDevice::new(16384 + 4 * zone, 4096, 9).expect("dev");
    let ctl = d.controller();
    {
        let mut emu = ZoneEmu::format(&mut d, &ZoneEmuConfig::new(zone)).expect("format");
        emu.append(0, &fill(4096, 1)).expect("append");
        ctl.set_latency(Latency::Polls { min: 2, max: 6 });
        for t in 0..4u64 {
            emu.submit(ZoneRequest {
                tag: t,
                op: ZoneOp::Append {
                    zone: 0,
                    buf: IoBuf::from_slice(&fill(4096, 2)),
                    fua: false,
                },
            });
        }
        // Pointer advanced at submission...
        assert_eq!(emu.zone_info(0).expect("z").write_pointer, 5 * 4096);
        // ...but a flush now persists only the completed prefix.
        emu.flush().expect("flush");
        // Reset of zone 1 (nothing in flight there) does not wait for zone 0.
        emu.reset_zone(1).expect("reset 1");
        assert_eq!(emu.in_flight(), 4);
        // Reset of zone 0 waits for its writes; their completions stay for poll.
        emu.reset_zone(0).expect("reset 0");
        let mut out = Vec::new();
        assert_eq!(emu.poll(&mut out, 0).expect("poll"), 4);
        assert!(out.iter().all(|c| c.result.is_ok()));
        assert_eq!(emu.in_flight(), 0);
        emu.append(2, &fill(4096, 3)).expect("append");
        for t in 0..3u64 {
            emu.submit(ZoneRequest {
                tag: t,
                op: ZoneOp::Append {
                    zone: 2,
                    buf: IoBuf::from_slice(&fill(4096, 4)),
                    fua: false,
                },
            });
        }
        emu.flush().expect("flush with appends in flight");
    }
    let report = d.crash(&CrashMode::DropAll).expect("crash");
    assert_eq!(report.lost_in_flight, 3);
    let emu = ZoneEmu::open(&mut d).expect("reopen");
    let z0 = emu.zone_info(0).expect("z");
    assert_eq!((z0.state, z0.write_pointer), (ZoneState::Empty, 0));
    let z2 = emu.zone_info(2).expect("z");
    assert_eq!(
        (z2.state, z2.write_pointer - z2.start),
        (ZoneState::Closed, 4096),
        "in-flight appends are not claimed by the persisted pointer"
    );
}
