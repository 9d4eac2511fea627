//! Crash recovery, one test per rule of docs/recovery.md: the engine runs over fault
//! devices behind a power switch, is crashed at the dangerous moments (deterministic
//! triggers on the writes that matter), reopened, and every block checked against a
//! model that allows the flushed content, or for unflushed writes old or new.

use crate::common::rig::{after_write, Rig, Side, BS};
use crate::common::tiny_config;
use shale_device::{CrashMode, TearUnit, WriteId};
use shale_engine::{Config, Lba, OpenEvent, OpenReport, Request, StepReport, Tier, VolumeUid};

const V: VolumeUid = VolumeUid(1);

fn modes(seed: u64) -> Vec<CrashMode> {
    vec![
        CrashMode::DropAll,
        CrashMode::KeepAll,
        CrashMode::KeepRandomSubset { seed },
        CrashMode::Tear {
            seed,
            unit: TearUnit::Sector512,
        },
        CrashMode::Tear {
            seed: seed + 1,
            unit: TearUnit::Block4096,
        },
    ]
}

fn tier(r: &mut Rig, lba: u64) -> Option<(Tier, u64)> {
    r.e()
        .locate(V, Lba(lba))
        .unwrap()
        .map(|l| (l.tier, l.pba.0))
}

/// Rule: flushed data survives; unflushed data reads old or new, whatever the crash
/// kept, tore or dropped.
#[test]
fn flushed_data_survives_and_unflushed_is_old_or_new() {
    for (i, mode) in modes(7).into_iter().enumerate() {
        let mut r = Rig::new(i as u64);
        for l in 0..180 {
            r.write(l);
        }
        r.flush();
        for l in 90..240 {
            r.write(l);
        }
        r.crash(mode.clone(), mode.clone());
        r.verify();
        // The recovered engine carries on, and recovers again.
        for l in 0..60 {
            r.write(l * 3);
        }
        r.flush();
        r.write(5);
        r.crash(mode.clone(), CrashMode::DropAll);
        r.verify();
    }
}

/// Rule: a flushed trim stays trimmed, also when the trimmed data had been relocated
/// to a zone (the relocated copy carries the trimmed version's SID).
#[test]
fn flushed_trims_stay_trimmed_even_after_relocation() {
    let mut r = Rig::new(11);
    for l in 0..64 {
        r.write(l);
    }
    r.flush();
    let mut rng = 0x1234_5678;
    // Overwrite other blocks until the first ones were compacted into a zone.
    let moved = r.churn_until(&mut rng, 64, 200, 20_000, |e| {
        e.locate(V, Lba(3))
            .unwrap()
            .is_some_and(|l| l.tier == Tier::Capacity)
    });
    assert!(moved, "block 3 was never compacted");
    r.trim(0, 64);
    r.flush();
    for mode in [CrashMode::KeepAll, CrashMode::KeepRandomSubset { seed: 3 }] {
        r.write(500);
        r.crash(mode.clone(), mode);
        r.verify();
        for l in 0..64 {
            assert_eq!(r.model.allowed(V, l), vec![0], "lba {l}");
        }
    }
}

/// Rule: within one chunk the later position wins (two writes of one LBA in the same
/// chunk, both in the md the scan reads).
#[test]
fn within_a_chunk_the_later_position_wins() {
    let mut r = Rig::new(12);
    r.write(7);
    r.write(8);
    r.write(7);
    r.flush();
    let a = tier(&mut r, 7);
    r.crash(CrashMode::DropAll, CrashMode::DropAll);
    r.verify();
    assert!(a.is_some_and(|(t, _)| t == Tier::Cache));
}

/// Rule: the higher SID wins: a newer write in a later chunk beats the older copy
/// compaction moved to a zone, whichever region the scan reads first.
#[test]
fn the_higher_sid_wins() {
    let mut r = Rig::new(13);
    r.write(3);
    r.flush();
    let mut rng = 77;
    assert!(r.churn_until(&mut rng, 10, 150, 20_000, |e| {
        e.locate(V, Lba(3))
            .unwrap()
            .is_some_and(|l| l.tier == Tier::Capacity)
    }));
    // A newer version in the cache, flushed; then another one, not flushed.
    r.write(3);
    r.flush();
    r.write(3);
    r.crash(CrashMode::DropAll, CrashMode::KeepAll);
    r.verify();
}

/// Rule: relocated copies keep their SID, and equal SIDs hold the same data: a block
/// compacted, then moved again by GC, with its first chunk reused, reads its content.
#[test]
fn relocated_copies_keep_their_sid() {
    let mut r = Rig::new(14);
    for l in 0..40 {
        r.write(l);
    }
    r.flush();
    let mut rng = 99;
    let mut first_zone = None;
    let mut moved_twice = false;
    for _ in 0..200 {
        r.churn_until(&mut rng, 40, 3000, 100, |_| false);
        let Some((t, p)) = tier(&mut r, 5) else { break };
        if t == Tier::Capacity {
            match first_zone {
                None => first_zone = Some(p),
                Some(p0) if p0 != p => {
                    moved_twice = true;
                    break;
                }
                _ => {}
            }
        }
    }
    assert!(moved_twice, "block 5 was not moved by GC");
    assert!(r.e().stats().chunk_frees > 0 && r.e().stats().gc_victims > 0);
    r.flush();
    for mode in modes(5) {
        r.crash(mode.clone(), mode);
        r.verify();
    }
}

/// Rule: trims apply at their key: a write after a trim wins, a trim after a write
/// wins, also once the surviving write has been relocated.
#[test]
fn trims_apply_at_their_keys() {
    let mut r = Rig::new(15);
    r.write(10); // a
    r.trim(10, 1);
    r.write(10); // b wins over the trim
    r.write(11);
    r.write(11);
    r.trim(11, 1); // the trim wins over both writes
    r.flush();
    r.crash(CrashMode::DropAll, CrashMode::DropAll);
    r.verify();
    assert_eq!(r.model.allowed(V, 11), vec![0]);
    assert_ne!(r.model.allowed(V, 10), vec![0]);
    let mut rng = 5;
    assert!(r.churn_until(&mut rng, 20, 200, 20_000, |e| {
        e.locate(V, Lba(10))
            .unwrap()
            .is_some_and(|l| l.tier == Tier::Capacity)
    }));
    r.flush();
    r.crash(CrashMode::KeepRandomSubset { seed: 9 }, CrashMode::DropAll);
    r.verify();
}

/// Rule (deferred free): a chunk emptied by compaction is reused only after the
/// relocations that emptied it are durable. Crashing after every chunk has been
/// recycled, with nothing flushed by the user since, loses nothing flushed.
#[test]
fn freed_space_is_reused_only_after_relocations_are_durable() {
    for (i, mode) in modes(21).into_iter().enumerate() {
        let mut r = Rig::new(30 + i as u64);
        for l in 0..120 {
            r.write(l);
        }
        r.flush();
        let chunks = 8;
        let mut rng = 0xDEAD + i as u64;
        // Only blocks 200.. are overwritten: 0..120 must be relocated, never lost.
        let mut n = 0;
        while r.e().stats().chunk_frees < 2 * chunks && n < 60_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            r.write(200 + rng % 120);
            n += 1;
        }
        assert!(r.e().stats().chunk_frees >= 2 * chunks);
        r.crash(mode.clone(), mode);
        r.verify();
    }
}

/// Rule (torn metadata): the superblock fits in its first 512-byte sector, so a torn
/// superblock write is either the old or the new copy; when the new one never lands,
/// the checkpoint area it would have named is newer than the one the surviving copy
/// names, and is used.
#[test]
fn a_lost_superblock_write_leaves_a_newer_checkpoint_that_is_used() {
    for keep_bytes in [0, 512, 2048] {
        let mut r = Rig::new(40);
        for l in 0..50 {
            r.write(l);
        }
        r.flush();
        let (lo, hi) = r.superblock_range();
        r.sw.arm(after_write(Side::Cache, lo, hi, 0));
        // A volume change checkpoints: area write, flush, superblock write (cut after).
        let _ = r.try_call(Request::CreateVolume {
            name: "b".into(),
            size_bytes: 1 << 16,
        });
        assert!(r.sw.fired().is_some());
        let torn = last_write_in(&r.cache_ctl, lo, hi);
        let keep = pending_ids(&r.cache_ctl, torn);
        let rep = r
            .crash(
                CrashMode::TearWrite {
                    keep,
                    id: torn,
                    keep_bytes,
                },
                CrashMode::DropAll,
            )
            .clone();
        if keep_bytes == 0 {
            assert!(
                rep.warnings
                    .iter()
                    .any(|w| w.contains("newer than the one the superblock names")),
                "{:?}",
                rep.warnings
            );
        }
        r.verify();
    }
}

/// Rule (torn metadata): a torn checkpoint area leaves the previous checkpoint in
/// force (the superblock is written only after the area), and the journal since it
/// replays. The image is written payload first, header (length and CRC) last: tears
/// of the payload at its start, middle and end, and of the header.
#[test]
fn torn_checkpoint_falls_back_to_the_previous_one() {
    // (writes of the area that land before the cut, where the torn one is cut)
    for (skip, cut) in [(0, 0), (0, 1), (0, 2), (1, 0)] {
        let mut r = Rig::new(41);
        for l in 0..80 {
            r.write(l);
        }
        r.flush();
        for l in 40..100 {
            r.write(l);
        }
        r.flush();
        let (lo, hi) = r.checkpoint_range();
        r.sw.arm(after_write(Side::Cache, lo, hi, skip));
        let _ = r.try_call(Request::CreateVolume {
            name: "b".into(),
            size_bytes: 1 << 16,
        });
        assert!(r.sw.fired().is_some());
        let torn = last_write_in(&r.cache_ctl, lo, hi);
        let len = r
            .cache_ctl
            .pending_writes()
            .iter()
            .find(|p| p.id == torn)
            .map(|p| p.len)
            .unwrap();
        let keep_bytes = match cut {
            0 => 512,
            1 => len / 2 / 512 * 512,
            _ => len - 512,
        };
        let keep = pending_ids(&r.cache_ctl, torn);
        r.crash(
            CrashMode::TearWrite {
                keep,
                id: torn,
                keep_bytes,
            },
            CrashMode::KeepAll,
        );
        r.verify();
    }
}

/// Rule (torn metadata): a torn journal entry is the end of the journal; only the
/// interrupted flush (never acknowledged) is lost.
#[test]
fn torn_journal_entry_ends_the_journal() {
    for (keep_bytes, skip) in [(512u64, 0u32), (4096, 0), (4608, 1)] {
        let mut r = Rig::new(42);
        for l in 0..60 {
            r.write(l);
        }
        r.flush();
        for l in 30..90 {
            r.write(l);
        }
        let (lo, hi) = r.journal_range();
        r.sw.arm(after_write(Side::Cache, lo, hi, skip));
        r.flush();
        r.trim(0, 8);
        r.flush();
        assert!(r.sw.fired().is_some());
        let torn = last_write_in(&r.cache_ctl, lo, hi);
        let keep = pending_ids(&r.cache_ctl, torn);
        r.crash(
            CrashMode::TearWrite {
                keep,
                id: torn,
                keep_bytes,
            },
            CrashMode::KeepAll,
        );
        r.verify();
    }
}

/// Rule (torn md): a torn partial md rewrite falls back to the copy an earlier flush
/// made durable; the entries of the interrupted flush are lost, nothing else.
#[test]
fn torn_md_falls_back_to_the_older_copy() {
    let mut r = Rig::new(43);
    for l in 0..20 {
        r.write(l);
    }
    r.flush();
    for l in 20..40 {
        r.write(l);
    }
    // The md slots of the group holding block 39.
    let pba = r.e().locate(V, Lba(39)).unwrap().unwrap();
    let md_a = {
        let group_start = pba.offset - (pba.offset / BS - r.layout.data_start) % 128 * BS;
        group_start + 126 * BS
    };
    r.sw.arm(after_write(Side::Cache, md_a, md_a + 2 * BS, 0));
    r.flush();
    assert!(r.sw.fired().is_some());
    let torn = last_write_in(&r.cache_ctl, md_a, md_a + 2 * BS);
    let keep = pending_ids(&r.cache_ctl, torn);
    r.crash(
        CrashMode::TearWrite {
            keep,
            id: torn,
            keep_bytes: 1024,
        },
        CrashMode::KeepAll,
    );
    r.verify();
}

/// Rule (torn metadata): a torn volume table copy leaves the checkpoint's copy in
/// force (a volume change is complete when its checkpoint is).
#[test]
fn torn_volume_table_copy_is_not_used() {
    let mut r = Rig::new(44);
    r.write(1);
    r.flush();
    let (lo, hi) = r.volume_table_range();
    r.sw.arm(after_write(Side::Cache, lo, hi, 0));
    let _ = r.try_call(Request::CreateVolume {
        name: "b".into(),
        size_bytes: 1 << 16,
    });
    let torn = last_write_in(&r.cache_ctl, lo, hi);
    let keep = pending_ids(&r.cache_ctl, torn);
    let rep = r
        .crash(
            CrashMode::TearWrite {
                keep,
                id: torn,
                keep_bytes: 512,
            },
            CrashMode::DropAll,
        )
        .clone();
    assert!(
        rep.warnings.iter().any(|w| w.contains("volume table")),
        "{:?}",
        rep.warnings
    );
    r.verify();
    match r.call(Request::ListVolumes).unwrap() {
        shale_engine::Reply::Volumes(v) => assert_eq!(v.len(), 1),
        x => panic!("{x:?}"),
    }
}

/// Rule: a crash during recovery (here in its checkpoint) is recovered from again.
#[test]
fn a_crash_during_recovery_recovers_again() {
    for at in 0..3 {
        let mut r = Rig::new(45);
        for l in 0..100 {
            r.write(l);
        }
        r.flush();
        for l in 50..150 {
            r.write(l);
        }
        // Cut during the open's L2P page write-back, its checkpoint area, or its
        // superblock write.
        let ((lo, hi), skip) = match at {
            0 => (r.l2p_range(), 0),
            1 => (r.checkpoint_range(), 0),
            _ => (r.superblock_range(), 0),
        };
        r.sw.cut();
        let e = r.e.take().unwrap();
        drop(e.abandon());
        let (_, cache) = r
            .cache_ctl
            .crash(&CrashMode::KeepRandomSubset { seed: 8 })
            .unwrap();
        let (_, inner) = r.cap_ctl.crash(&CrashMode::KeepAll).unwrap();
        r.sw.restore();
        r.sw.arm(after_write(Side::Cache, lo, hi, skip));
        assert!(
            r.reopen(cache, inner).is_err(),
            "the open should have been cut ({at})"
        );
        r.crash(CrashMode::KeepRandomSubset { seed: 9 }, CrashMode::KeepAll);
        r.verify();
    }
}

/// Rule: the clean flag skips replay; a clean flag contradicted by journal entries
/// is not trusted.
#[test]
fn the_clean_flag_skips_replay_unless_the_journal_says_otherwise() {
    let mut r = Rig::new(46);
    for l in 0..30 {
        r.write(l);
    }
    let e = r.e.take().unwrap();
    let (c, z) = e.shutdown().unwrap();
    r.model.flushed();
    r.reopen(c.into_inner(), z.into_inner().into_inner())
        .unwrap();
    assert!(r.e().open_report().clean);
    assert!(r
        .e()
        .open_report()
        .steps
        .iter()
        .all(|s| s.name != "md scan"));
    r.verify();
    // Writes and a flush after the clean open, then a superblock claiming clean.
    for l in 0..30 {
        r.write(l + 10);
    }
    r.flush();
    r.sw.cut();
    let e = r.e.take().unwrap();
    drop(e.abandon());
    let (_, mut cache) = r.cache_ctl.crash(&CrashMode::DropAll).unwrap();
    let (_, inner) = r.cap_ctl.crash(&CrashMode::DropAll).unwrap();
    forge_clean_superblock(&mut cache);
    r.sw.restore();
    r.reopen(cache, inner).unwrap();
    let rep = r.e().open_report().clone();
    assert!(!rep.clean);
    assert!(
        rep.warnings.iter().any(|w| w.contains("clean flag")),
        "{:?}",
        rep.warnings
    );
    r.verify();
}

/// Rule: SIDs restart above anything on media. Writes after the last flush fill a
/// group (its md reaches media), the crash loses their chunk's opening; the chunk is
/// reused after recovery and must not mistake the lost life's md for its own.
#[test]
fn sids_restart_above_everything_on_media() {
    let mut r = Rig::new(47);
    r.write(1);
    r.flush();
    for l in 0..260 {
        r.write(400 + l);
    }
    r.crash(CrashMode::KeepAll, CrashMode::KeepAll);
    r.verify();
    // New, different blocks into the recycled chunks; flush; crash again.
    for l in 0..40 {
        r.write(100 + l);
    }
    r.flush();
    r.crash(CrashMode::DropAll, CrashMode::DropAll);
    r.verify();
}

/// Rule: md entries a completed flush made durable must still be there; if the md
/// holding them is damaged, open fails with a clear error rather than roll back.
#[test]
fn damaged_md_of_proven_entries_is_an_error() {
    let mut r = Rig::new(48);
    // A whole group written with no flush in between: its final md is its only copy.
    for l in 0..126 {
        r.write(l);
    }
    r.flush();
    r.write(200);
    r.flush();
    r.write(201);
    r.flush();
    let (newest, group_md, cache, inner) = md_of(&mut r, 0);
    damage(cache, group_md + newest * BS, inner, &mut r);
    let err = r.reopen_parts().unwrap_err();
    assert!(
        matches!(
            err,
            shale_engine::OpenError::Recovery(shale_engine::RecoveryError::MdLost { .. })
        ),
        "{err}"
    );
}

/// Rule: the journal is written after the flush that made what it claims durable, so
/// a damaged newest md copy of flushed entries is an error too (falling back to the
/// older copy would silently lose the last flush).
#[test]
fn a_damaged_newest_md_copy_of_flushed_entries_is_an_error() {
    let mut r = Rig::new(52);
    for l in 0..30 {
        r.write(l);
    }
    r.flush();
    r.write(31);
    r.flush();
    let (newest, group_md, cache, inner) = md_of(&mut r, 0);
    damage(cache, group_md + newest * BS, inner, &mut r);
    let err = r.reopen_parts().unwrap_err();
    assert!(
        matches!(
            err,
            shale_engine::OpenError::Recovery(shale_engine::RecoveryError::MdLost { .. })
        ),
        "{err}"
    );
}

/// Rule: a region open at the crash is closed by recovery, never continued (its tail
/// may hold md of writes recovery dropped).
#[test]
fn regions_open_at_a_crash_are_closed() {
    let mut r = Rig::new(49);
    for l in 0..10 {
        r.write(l);
    }
    r.flush();
    let before = r.e().locate(V, Lba(9)).unwrap().unwrap().pba.0 / 256;
    r.crash(CrashMode::DropAll, CrashMode::DropAll);
    r.write(50);
    r.flush();
    let after = r.e().locate(V, Lba(50)).unwrap().unwrap().pba.0 / 256;
    assert_ne!(before, after, "a new chunk takes the writes after recovery");
    r.verify();
}

/// Rule: incremental checkpoints write a bounded number of L2P pages per loop
/// iteration, and a crash anywhere inside one recovers from the previous checkpoint.
#[test]
fn incremental_checkpoints_are_bounded_and_crash_safe() {
    let config = Config {
        checkpoint_pages_per_poll: 1,
        checkpoint_interval_bytes: Some(40 * BS),
        l2p_cache_bytes_max: Some(64 * 4096),
        ..tiny_config()
    };
    // 90 zones: a volume of 16 L2P pages.
    let mut r = Rig::build(50, config.clone(), 90, 15 * 1024);
    let mut max_step = 0;
    for i in 0..300u64 {
        let before = r.e().stats().checkpoint_page_writes;
        r.write((i * 1031) % 15_000);
        let after = r.e().stats().checkpoint_page_writes;
        max_step = max_step.max(after - before);
    }
    let s = r.e().stats();
    assert!(
        s.checkpoints_started > 0 && s.checkpoint_page_writes > 0,
        "{s:?}"
    );
    // One write is a few loop iterations; each writes at most one page.
    assert!(max_step <= 8, "{max_step} pages in one write");
    r.flush();
    // Crash at each of the first L2P page writes of the next checkpoint.
    let (lo, hi) = r.l2p_range();
    for skip in 0..4 {
        r.sw.arm(after_write(Side::Cache, lo, hi, skip));
        for i in 0..200u64 {
            if !r.write((i * 577 + skip as u64) % 15_000) {
                break;
            }
            if i % 50 == 49 && !r.flush() {
                break;
            }
        }
        r.crash(
            CrashMode::KeepRandomSubset { seed: skip as u64 },
            CrashMode::KeepAll,
        );
        r.verify();
    }
}

/// Rule: a full journal forces a checkpoint (flush-heavy load: one entry per flush).
#[test]
fn a_full_journal_forces_a_checkpoint() {
    let mut r = Rig::new(51);
    for l in 0..100 {
        r.write(l % 20);
        r.flush();
    }
    let s = r.e().stats();
    assert!(s.checkpoints >= 10, "{s:?}");
    r.write(3);
    r.crash(CrashMode::KeepRandomSubset { seed: 2 }, CrashMode::KeepAll);
    r.verify();
}

/// One progress event as a test keeps it.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Started(usize, Option<usize>, &'static str),
    Advanced(&'static str, u64, u64, &'static str),
    Finished(usize, StepReport),
}

fn record(seen: &mut Vec<Seen>) -> impl FnMut(&OpenEvent<'_>) + '_ {
    move |e: &OpenEvent<'_>| {
        seen.push(match *e {
            OpenEvent::StepStarted { index, total, name } => Seen::Started(index, total, name),
            OpenEvent::StepAdvanced {
                name,
                done,
                total,
                unit,
            } => Seen::Advanced(name, done, total, unit),
            OpenEvent::StepFinished { index, step } => Seen::Finished(index, step.clone()),
        })
    }
}

/// Checks an open's events against its report: every step started and finished in
/// order, the step count known from the journal on, and each metered step's counts
/// starting at 0, growing, and ending at their total. Returns each metered step's
/// (name, unit, total).
fn check_progress(seen: &[Seen], report: &OpenReport) -> Vec<(&'static str, &'static str, u64)> {
    let n = report.steps.len();
    let mut metered = Vec::new();
    let mut i = 0;
    for (index, step) in report.steps.iter().enumerate() {
        let Some(Seen::Started(at, total, name)) = seen.get(i) else {
            panic!(
                "step {index} ({}) not started: {:?}",
                step.name,
                seen.get(i)
            );
        };
        assert_eq!((*at, *name), (index, step.name), "{seen:?}");
        // Superblock, label, checkpoint, volume table, journal: the count is not
        // known before the journal says whether the open replays.
        let want = if index < 5 { None } else { Some(n) };
        assert_eq!(*total, want, "step {index} ({name})");
        i += 1;
        let mut counts = Vec::new();
        while let Some(Seen::Advanced(s, done, total, unit)) = seen.get(i) {
            assert_eq!(*s, step.name);
            counts.push((*done, *total, *unit));
            i += 1;
        }
        if let Some(&(_, total, unit)) = counts.first() {
            assert_eq!(counts[0].0, 0, "{name}: {counts:?}");
            assert!(counts.iter().all(|c| (c.1, c.2) == (total, unit)));
            assert!(counts.windows(2).all(|w| w[0].0 < w[1].0), "{counts:?}");
            assert_eq!(
                counts.last().map(|c| c.0),
                Some(total),
                "{name}: {counts:?}"
            );
            assert!(counts.len() <= 102, "{name}: {} advances", counts.len());
            metered.push((step.name, unit, total));
        }
        assert_eq!(
            seen.get(i),
            Some(&Seen::Finished(index, step.clone())),
            "step {index} ({name})"
        );
        i += 1;
    }
    assert_eq!(
        i,
        seen.len(),
        "events after the last step: {:?}",
        &seen[i..]
    );
    metered
}

/// Progress: a clean open reports every step in order, with the L2P walks counted
/// (the census walking inside the open, as `shale check` has it).
#[test]
fn a_clean_open_reports_its_steps_and_l2p_walks() {
    let mut r = Rig::new(52);
    r.config.census_in_background = false;
    for l in 0..600 {
        r.write(l * 5);
    }
    let e = r.e.take().unwrap();
    let (c, z) = e.shutdown().unwrap();
    r.model.flushed();
    let mut seen = Vec::new();
    r.reopen_with_progress(
        c.into_inner(),
        z.into_inner().into_inner(),
        &mut record(&mut seen),
    )
    .unwrap();
    let report = r.e().open_report().clone();
    assert!(report.clean);
    let metered = check_progress(&seen, &report);
    let names: Vec<_> = report.steps.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "superblock",
            "capacity label",
            "checkpoint",
            "volume table",
            "journal",
            "L2P directories",
            "census",
            "resume",
            "self-check"
        ]
    );
    // 600 blocks spread over the volume's 3 L2P pages, walked once (by the census;
    // the self-check of an open looks at the regions).
    assert!(metered.contains(&("census", "L2P pages", 3)), "{metered:?}");
    assert!(
        metered
            .iter()
            .any(|m| m.0 == "self-check" && m.1 == "regions" && m.2 > 0),
        "{metered:?}"
    );
    assert_eq!(
        report
            .steps
            .iter()
            .find(|s| s.name == "self-check")
            .map(|s| s.bytes_read),
        Some(0),
        "the self-check of an open reads nothing"
    );
    assert!(
        metered
            .iter()
            .any(|m| m.0 == "checkpoint" && m.1 == "checkpoint blocks" && m.2 > 0),
        "{metered:?}"
    );
    r.verify();
}

/// Progress: a recovery reports every step in order; the md scan counts exactly the
/// md groups it reads, and the new checkpoint the dirty L2P pages it writes back.
#[test]
fn a_recovery_reports_its_steps_and_counts_its_long_loops() {
    let mut r = Rig::new(53);
    for l in 0..400 {
        r.write(l * 7 % 3000);
    }
    r.flush();
    for l in 0..300 {
        r.write(l * 11 % 3000);
    }
    r.flush();
    r.write(9);
    let (c, z) = r.crash_devices(CrashMode::KeepAll, CrashMode::KeepAll);
    let mut seen = Vec::new();
    r.reopen_with_progress(c, z, &mut record(&mut seen))
        .unwrap();
    let report = r.e().open_report().clone();
    assert!(!report.clean);
    let metered = check_progress(&seen, &report);
    let names: Vec<_> = report.steps.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "superblock",
            "capacity label",
            "checkpoint",
            "volume table",
            "journal",
            "L2P directories",
            "replay plan",
            "md scan",
            "resolve",
            "census",
            "regions",
            "new checkpoint",
            "self-check"
        ]
    );
    let total = |name: &str| {
        metered
            .iter()
            .find(|m| m.0 == name)
            .map(|m| (m.1, m.2))
            .unwrap_or_else(|| panic!("{name} not metered: {metered:?}"))
    };
    assert!(report.replay.md_groups_read > 0, "{:?}", report.replay);
    assert_eq!(
        total("md scan"),
        ("md groups", report.replay.md_groups_read)
    );
    assert_eq!(total("resolve").0, "versions");
    assert!(total("resolve").1 >= report.replay.entries_applied);
    // The census walks after the open (counts and bits rebuilt in the background).
    assert_eq!(total("census").1, 0, "{metered:?}");
    assert!(r.e().stats().census_pending);
    assert!(total("new checkpoint").1 > 0, "{metered:?}");
    assert_eq!(total("regions").0, "free zones");
    r.verify();
    // Without the self-check there is one step less, and the count says so.
    let cfg = Config {
        open_self_check: false,
        ..r.config.clone()
    };
    r.config = cfg;
    r.write(4);
    r.flush();
    let (c, z) = r.crash_devices(CrashMode::KeepAll, CrashMode::KeepAll);
    let mut seen = Vec::new();
    r.reopen_with_progress(c, z, &mut record(&mut seen))
        .unwrap();
    let report = r.e().open_report().clone();
    assert_eq!(report.steps.len(), 12);
    check_progress(&seen, &report);
    r.verify();
}

/// Progress: a failing open stops at the step that failed, with no finish for it.
#[test]
fn a_failed_open_reports_no_finish_for_the_failing_step() {
    let mut r = Rig::new(54);
    r.write(1);
    r.flush();
    let (mut c, z) = r.crash_devices(CrashMode::KeepAll, CrashMode::KeepAll);
    // Both superblock copies gone.
    use shale_device::BlockDevice;
    c.write_at(0, &vec![0xA5; 2 * BS as usize]).unwrap();
    let mut seen = Vec::new();
    assert!(r
        .reopen_with_progress(c, z, &mut record(&mut seen))
        .is_err());
    assert_eq!(seen, vec![Seen::Started(0, None, "superblock")]);
}

/// Crashes with everything durable; returns the md copy holding the most entries of
/// the group of `lba`, that group's md byte offset, and the restarted devices.
fn md_of(
    r: &mut Rig,
    lba: u64,
) -> (
    u64,
    u64,
    shale_device::FaultDevice,
    shale_device::FaultDevice,
) {
    use shale_device::BlockDevice;
    let pba = r.e().locate(V, Lba(lba)).unwrap().unwrap();
    let group_md = pba.offset - (pba.offset / BS - r.layout.data_start) % 128 * BS + 126 * BS;
    r.sw.cut();
    let e = r.e.take().unwrap();
    drop(e.abandon());
    let (_, mut cache) = r.cache_ctl.crash(&CrashMode::DropAll).unwrap();
    let (_, inner) = r.cap_ctl.crash(&CrashMode::DropAll).unwrap();
    let mut two = vec![0u8; 8192];
    cache.read_at(group_md, &mut two).unwrap();
    let n: Vec<u16> = (0..2)
        .map(|c| {
            shale_format::decode_md_header(&two[c * 4096..(c + 1) * 4096], 0)
                .map_or(0, |h| h.entry_count)
        })
        .collect();
    (u64::from(n[1] > n[0]), group_md, cache, inner)
}

/// Flips one byte of the block at `at` and parks the devices in the rig for
/// `reopen_parts`.
fn damage(
    mut cache: shale_device::FaultDevice,
    at: u64,
    inner: shale_device::FaultDevice,
    r: &mut Rig,
) {
    use shale_device::BlockDevice;
    let mut b = vec![0u8; 4096];
    cache.read_at(at, &mut b).unwrap();
    b[300] ^= 0x40;
    cache.write_at(at, &b).unwrap();
    r.sw.restore();
    r.parked = Some((cache, inner));
}

pub(crate) fn last_write_in(ctl: &shale_device::FaultController, lo: u64, hi: u64) -> WriteId {
    ctl.pending_writes()
        .iter()
        .rev()
        .find(|p| !p.discard && p.offset < hi && p.offset + p.len > lo && !p.durable)
        .map(|p| p.id)
        .expect("no pending write in range")
}

/// Every non-durable pending write except `but`.
pub(crate) fn pending_ids(ctl: &shale_device::FaultController, but: WriteId) -> Vec<WriteId> {
    ctl.pending_writes()
        .iter()
        .filter(|p| !p.durable && p.id != but)
        .map(|p| p.id)
        .collect()
}

/// Rewrites the newest superblock copy with the clean flag set (as if the flag were
/// wrong): open must see the journal entries after the checkpoint and recover.
fn forge_clean_superblock(cache: &mut shale_device::FaultDevice) {
    use shale_device::BlockDevice;
    let mut b = vec![0u8; 8192];
    cache.read_at(0, &mut b).unwrap();
    let a = shale_format::Superblock::decode(&b[..4096], 0).unwrap();
    let bb = shale_format::Superblock::decode(&b[4096..], 4096).unwrap();
    let mut sb = if a.generation > bb.generation { a } else { bb };
    sb.clean = true;
    sb.generation += 1;
    let copy = sb.generation % 2;
    cache.write_at(copy * 4096, &sb.encode()).unwrap();
}

/// Rule: after a clean shutdown the validity bits are rebuilt in the background. The
/// open returns with the census pending; writes, overwrites and trims served during
/// the walk leave exact bits and counts; a count reaching zero meanwhile waits; the
/// self-check (which finishes the walk) and every read agree afterwards.
#[test]
fn the_census_runs_in_the_background_after_a_clean_open() {
    let config = Config {
        census_pages_per_poll: 1,
        compaction_free_chunks_pct: 1,
        gc_free_zones_min: 1,
        l2p_cache_bytes_max: Some(64 * 4096),
        ..tiny_config()
    };
    // 90 zones: a volume of 16 L2P pages.
    let mut r = Rig::build(61, config, 90, 15 * 1024);
    for i in 0..2000u64 {
        r.write((i * 1031) % 15_000);
    }
    r.flush();
    let e = r.e.take().unwrap();
    let (c, z) = e.shutdown().unwrap();
    r.reopen(c.into_inner(), z.into_inner().into_inner())
        .unwrap();
    let report = r.e().open_report().clone();
    assert!(report.clean);
    let census = report.steps.iter().find(|s| s.name == "census").unwrap();
    assert_eq!(census.bytes_read, 0, "{census:?}");
    assert!(r.e().stats().census_pending);
    // Overwrite and trim blocks mapped at the open, a few at a time, while it walks.
    let mut overlapped = 0;
    for i in 0..40u64 {
        overlapped += u32::from(r.e().stats().census_pending);
        r.write((i * 1031) % 15_000);
        if i % 8 == 0 {
            r.trim((i * 2063) % 15_000, 3);
        }
    }
    assert!(
        overlapped >= 4,
        "only {overlapped} writes ran during the census"
    );
    let s = r.e().stats();
    assert!(s.census_pages > 0, "{s:?}");
    r.flush();
    r.verify();
    r.e().self_check().unwrap();
    let s = r.e().stats();
    assert!(!s.census_pending);
    assert!(s.census_pages >= 15, "{s:?}");
    // And the state it left survives a clean reopen (the census then checks counts).
    let e = r.e.take().unwrap();
    let (c, z) = e.shutdown().unwrap();
    r.model.flushed();
    r.reopen(c.into_inner(), z.into_inner().into_inner())
        .unwrap();
    r.e().self_check().unwrap();
    r.verify();
}

/// Rule: after a crash the counts are rebuilt with the bits, in the background. The
/// open returns with them unknown (the census step reads nothing); writes, overwrites
/// and trims served meanwhile leave exact counts; a shutdown finishes the walk before
/// its checkpoint records them, and a clean reopen's census agrees with them.
#[test]
fn after_a_crash_the_counts_are_rebuilt_in_the_background() {
    let config = Config {
        census_pages_per_poll: 1,
        compaction_free_chunks_pct: 1,
        gc_free_zones_min: 1,
        l2p_cache_bytes_max: Some(64 * 4096),
        ..tiny_config()
    };
    let mut r = Rig::build(64, config, 90, 15 * 1024);
    // Few enough writes that the cache has room after the crash (space running short
    // would finish the census at once).
    for i in 0..400u64 {
        r.write((i * 1031) % 15_000);
    }
    r.flush();
    for i in 0..100u64 {
        r.write((i * 577) % 15_000);
    }
    r.flush();
    let (c, z) = r.crash_devices(CrashMode::KeepAll, CrashMode::KeepAll);
    r.reopen(c, z).unwrap();
    let report = r.e().open_report().clone();
    assert!(!report.clean);
    let census = report.steps.iter().find(|s| s.name == "census").unwrap();
    assert_eq!(census.bytes_read, 0, "{census:?}");
    assert!(r.e().stats().census_pending);
    for i in 0..4u64 {
        r.write((i * 1031) % 15_000);
        r.trim((i * 2063) % 15_000, 3);
    }
    r.flush();
    // A shutdown in the middle of it finishes it; the clean reopen checks the counts
    // the shutdown recorded against a census of its own.
    assert!(r.e().stats().census_pending, "{:?}", r.e().stats());
    let e = r.e.take().unwrap();
    let (c, z) = e.shutdown().unwrap();
    r.model.flushed();
    r.reopen(c.into_inner(), z.into_inner().into_inner())
        .unwrap();
    assert!(r.e().open_report().clean);
    r.verify();
    for i in 0..40u64 {
        r.write((i * 1031) % 15_000);
    }
    r.flush();
    r.e().self_check().unwrap();
    assert!(!r.e().stats().census_pending);
    r.verify();
}

/// Rule: space running short speeds the census up and a write waiting for space
/// finishes it; then compaction runs.
#[test]
fn space_running_short_finishes_the_census() {
    let config = Config {
        census_pages_per_poll: 1,
        l2p_cache_bytes_max: Some(64 * 4096),
        ..tiny_config()
    };
    let mut r = Rig::build(62, config, 90, 15 * 1024);
    for i in 0..2000u64 {
        r.write((i * 1031) % 15_000);
    }
    let e = r.e.take().unwrap();
    let (c, z) = e.shutdown().unwrap();
    r.model.flushed();
    r.reopen(c.into_inner(), z.into_inner().into_inner())
        .unwrap();
    for i in 0..3000u64 {
        r.write((i * 7) % 15_000);
    }
    let s = r.e().stats();
    assert!(!s.census_pending, "{s:?}");
    assert!(s.compaction_victims > 0, "{s:?}");
    r.flush();
    r.verify();
    r.e().self_check().unwrap();
}

/// Rule: regions emptied while the census runs are not freed before it ends; a shutdown
/// meanwhile records them Closed with nothing valid, and the next open frees them,
/// whether it runs the census in the background or inside the open.
#[test]
fn regions_emptied_during_the_census_are_freed_by_the_next_open() {
    let free_after = |background: bool| {
        let config = Config {
            census_pages_per_poll: 1,
            compaction_free_chunks_pct: 1,
            gc_free_zones_min: 1,
            l2p_cache_bytes_max: Some(64 * 4096),
            ..tiny_config()
        };
        let mut r = Rig::build(63, config, 90, 15 * 1024);
        for l in 0..6000u64 {
            r.write(l);
        }
        let e = r.e.take().unwrap();
        let (c, z) = e.shutdown().unwrap();
        r.model.flushed();
        r.reopen(c.into_inner(), z.into_inner().into_inner())
            .unwrap();
        assert!(r.e().stats().census_pending);
        r.trim(0, 6000);
        assert!(
            r.e().stats().census_pending,
            "the census ended before the trim"
        );
        let e = r.e.take().unwrap();
        let (c, z) = e.shutdown().unwrap();
        r.model.flushed();
        r.config.census_in_background = background;
        r.reopen(c.into_inner(), z.into_inner().into_inner())
            .unwrap();
        r.e().self_check().unwrap();
        r.flush();
        r.verify();
        let s = r.e().stats();
        (s.free_chunks, s.free_zones)
    };
    let (chunks, zones) = free_after(false);
    assert_eq!((chunks, zones), free_after(true));
    assert!(
        zones >= 80,
        "{zones} free zones of 90 after everything was trimmed"
    );
}

/// Rule: L2P switches waiting for their page when a checkpoint begins (relocations of
/// blocks whose page is not cached) are recorded in the checkpoint instead of their
/// pages being faulted in and written; an open applies them, a recovery replays over
/// them, and the checkpoint that ends the recovery records them again.
#[test]
fn switches_waiting_at_a_checkpoint_are_recorded_and_applied_after_a_crash() {
    const PAGES: u64 = 27;
    let config = Config {
        // The L2P budget's floor: most of the volume's 27 pages are not cached.
        l2p_cache_bytes_max: Some(6 * 4096),
        checkpoint_interval_bytes: Some(1 << 40),
        ..tiny_config()
    };
    for (i, mode) in modes(31).into_iter().enumerate() {
        let mut r = Rig::build(40 + i as u64, config.clone(), 150, PAGES * 1024);
        // One block at the start of every page but the last, flushed.
        for p in 0..PAGES - 1 {
            r.write(p * 1024);
        }
        r.flush();
        // Churn inside the last page until compaction moved several of them while
        // their pages were not cached.
        let mut rng = 0x5eed_0000 + i as u64;
        let waiting = r.churn_until(&mut rng, (PAGES - 1) * 1024, 1024, 30_000, |e| {
            let s = e.stats();
            s.l2p_deferred_switches >= 8 && s.l2p_deferred_waiting >= 8
        });
        assert!(waiting, "no relocation switch waited for its page");
        let before = r.e().stats();
        // A volume change takes a synchronous checkpoint.
        r.call(Request::CreateVolume {
            name: "b".into(),
            size_bytes: 4096,
        })
        .unwrap();
        let after = r.e().stats();
        let recorded = after.checkpoint_switches - before.checkpoint_switches;
        assert!(
            recorded >= 8,
            "{recorded} switches recorded, {} were waiting",
            before.l2p_deferred_waiting
        );
        assert!(
            after.l2p_deferred_waiting >= before.l2p_deferred_waiting.min(8),
            "the checkpoint applied the switches instead of recording them"
        );
        // More writes and relocations after it, then a crash.
        r.churn_until(&mut rng, (PAGES - 1) * 1024, 1024, 300, |_| false);
        r.flush();
        r.write(3);
        let rep = r.crash(mode.clone(), mode.clone()).clone();
        assert!(!rep.clean);
        r.verify();
        assert!(
            r.e().stats().checkpoint_switches > 0,
            "the recovery's checkpoint recorded no switch"
        );
        // And again, with every write kept.
        r.crash(CrashMode::KeepAll, CrashMode::KeepAll);
        r.verify();
        if i == 0 {
            // A recorded switch past its volume's end (CRCs intact): the open refuses
            // the checkpoint as inconsistent.
            let (mut cache, inner) = r.crash_devices(CrashMode::KeepAll, CrashMode::KeepAll);
            assert!(forge_switch(&mut cache, &r.layout, PAGES * 1024 + 5));
            match r.reopen(cache, inner) {
                Err(shale_engine::OpenError::InconsistentCheckpoint { reason }) => {
                    assert!(reason.contains("L2P switch"), "{reason}")
                }
                other => panic!("forged switch opened: {:?}", other.map(|_| ())),
            }
        }
    }
}

/// Rule: a shrink's unmaps past the new end that wait as switches (their page, the
/// volume's new last page, evicted meanwhile) are recorded like any other: the page on
/// media still maps those LBAs, and a grow after the reopen must read them as zeros.
#[test]
fn a_shrinks_unmaps_waiting_as_switches_survive_a_reopen_and_a_grow() {
    let config = Config {
        l2p_cache_bytes_max: Some(6 * 4096),
        checkpoint_interval_bytes: Some(1 << 40),
        ..tiny_config()
    };
    let mut r = Rig::build(77, config, 150, 27 * 1024);
    // A few blocks past the future end in page 20, and some in each page after it.
    let tail: Vec<u64> = (0..4).map(|i| 20 * 1024 + 600 + i).collect();
    for &l in &tail {
        r.write(l);
    }
    for p in 21..27 {
        for i in 0..3 {
            r.write(p * 1024 + i * 7);
        }
    }
    r.flush();
    let before = r.e().stats().checkpoint_switches;
    // Unmapping pages 21..27 evicts page 20 with its unmaps as switches.
    let end = 20 * 1024 + 500;
    r.call(Request::ResizeVolume {
        volume: V,
        size_bytes: end * BS,
    })
    .unwrap();
    assert!(
        r.e().stats().checkpoint_switches > before,
        "the shrink's checkpoint recorded no switch"
    );
    for &l in &tail {
        r.model.observed(V, l, 0);
    }
    for p in 21..27 {
        for i in 0..3 {
            r.model.observed(V, p * 1024 + i * 7, 0);
        }
    }
    r.crash(CrashMode::KeepAll, CrashMode::KeepAll);
    r.call(Request::ResizeVolume {
        volume: V,
        size_bytes: 27 * 1024 * BS,
    })
    .unwrap();
    r.verify();
}

/// Moves the first switch of the checkpoint in force to `lba` and reseals it; false if
/// it has none.
fn forge_switch(
    cache: &mut shale_device::FaultDevice,
    l: &shale_format::CacheLayout,
    lba: u64,
) -> bool {
    use shale_device::BlockDevice;
    let mut b = vec![0u8; 8192];
    cache.read_at(0, &mut b).unwrap();
    let a = shale_format::Superblock::decode(&b[..4096], 0).unwrap();
    let bb = shale_format::Superblock::decode(&b[4096..], 4096).unwrap();
    let sb = if a.generation > bb.generation { a } else { bb };
    let at = l.checkpoint_start(sb.active_checkpoint) * 4096;
    let mut area = vec![0u8; l.checkpoint_blocks as usize * 4096];
    cache.read_at(at, &mut area).unwrap();
    let mut ck = shale_format::Checkpoint::decode(&area, at).unwrap();
    let Some(first) = ck.switches.first().copied() else {
        return false;
    };
    ck.switches[0] =
        shale_format::L2pSwitch::new(first.volume(), shale_engine::Lba(lba), first.pba).unwrap();
    ck.switches.sort();
    cache.write_at(at, &ck.encode()).unwrap();
    true
}
