//! The crash simulator's CI runs: fast configurations of every mode, the replay
//! guarantee, and the longer runs behind `#[ignore]`.
//!
//! Seeds are fixed so CI is stable; `SHALE_SIM_SEED=<n>` moves every run to other
//! seeds. A failure prints each violation with the command that replays it.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use shale_sim::{run, Counts, Mode, RunReport, Side, SimConfig, Violation, ViolationKind};

fn base_seed(default: u64) -> u64 {
    std::env::var("SHALE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `runs` seeds from `seed` on two threads; returns the totals, the
/// violations and the reports.
fn run_seeds(cfg: &SimConfig, seed: u64, runs: u64) -> (Counts, Vec<Violation>, Vec<RunReport>) {
    let threads = 2u64;
    let mut reports: Vec<RunReport> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let cfg = cfg.clone();
                s.spawn(move || {
                    (0..runs)
                        .filter(|k| k % threads == t)
                        .map(|k| run(seed + k, &cfg))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    reports.sort_by_key(|r| r.seed);
    let mut total = Counts::default();
    for r in &reports {
        total.add(&r.counts);
    }
    let v = reports.iter().filter_map(|r| r.violation.clone()).collect();
    (total, v, reports)
}

fn assert_clean(what: &str, seed: u64, total: &Counts, violations: &[Violation], secs: f64) {
    eprintln!("{what}: seeds from {seed}, {secs:.1}s\n{total}");
    if !violations.is_empty() {
        for v in violations {
            eprintln!("{v}");
        }
        panic!(
            "{what}: {} violation(s), first: {}",
            violations.len(),
            violations[0]
        );
    }
}

/// Optimised builds (CI) run the full count; unoptimised ones a fifth of it
/// (`cfg(unoptimized)` from build.rs: debug assertions alone are no sign of it, the CI
/// profile has them at full optimisation).
fn scaled(cycles: u64) -> u64 {
    if cfg!(unoptimized) {
        cycles / 5
    } else {
        cycles
    }
}

#[test]
fn a_seed_replays_exactly() {
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 12;
    let seed = base_seed(7);
    let a = run(seed, &cfg);
    let b = run(seed, &cfg);
    assert_eq!(a.trace, b.trace, "seed {seed}: traces differ");
    assert_eq!(a.counts, b.counts, "seed {seed}: counts differ");
    assert_eq!(a.violation, b.violation);
    let c = run(seed + 1, &cfg);
    assert_ne!(
        a.trace,
        c.trace,
        "seeds {seed} and {} gave one trace",
        seed + 1
    );
    // The same holds with the power cut inside device operations and in live mode.
    let mut live = SimConfig::fast(Mode::Live);
    live.generations = 8;
    assert_eq!(run(seed, &live).trace, run(seed, &live).trace);
}

/// The CI configuration: at least 2,000 crash points (optimised), each followed by a
/// crash, a reopen and a check of every block when the open succeeds.
#[test]
fn crash_cycles() {
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 50;
    let cycles = scaled(2000);
    let runs = cycles.div_ceil(u64::from(cfg.generations));
    let seed = base_seed(1_000);
    let t = Instant::now();
    let (total, violations, _) = run_seeds(&cfg, seed, runs);
    assert_clean(
        "crash",
        seed,
        &total,
        &violations,
        t.elapsed().as_secs_f64(),
    );
    assert!(total.cycles >= cycles, "{total}");
    assert_eq!(
        total.crashes, total.cycles,
        "every crash point crashes: {total}"
    );
    assert_eq!(
        total.recovered + total.needs_recovery + total.clean_reopens,
        total.crashes,
        "every crash ends in a verified open or a refused one: {total}"
    );
    assert!(
        total.clean_reopens > 0 && total.blocks_verified > 0,
        "{total}"
    );
    assert!(
        total.torn_writes > 0 && total.crashes_in_shutdown > 0,
        "{total}"
    );
    // The bias reaches the dangerous moments.
    for m in [
        "when:compaction",
        "when:gc",
        "trip:checkpoint",
        "trip:l2p",
        "trip:journal",
        "trip:chunk-close",
        "trip:zone-close",
        "trip:zone-write",
        "shutdown:superblock",
        "after-shutdown",
    ] {
        assert!(
            total.moments.get(m).copied().unwrap_or(0) > 0,
            "crash point {m} never reached: {total}"
        );
    }
    assert!(
        total.gc_victims > 0 && total.compaction_victims > 0,
        "{total}"
    );
}

/// Live mode: at every crash point the running engine passes its self-check and
/// reads back the model's newest content everywhere.
#[test]
fn live_checks_at_crash_points() {
    let mut cfg = SimConfig::fast(Mode::Live);
    cfg.generations = 50;
    let runs = scaled(400).div_ceil(50);
    let seed = base_seed(2_000);
    let t = Instant::now();
    let (total, violations, _) = run_seeds(&cfg, seed, runs);
    assert_clean("live", seed, &total, &violations, t.elapsed().as_secs_f64());
    assert!(total.live_checks > 0 && total.clean_reopens > 0, "{total}");
    assert!(total.gc_victims > 0 && total.zone_resets > 0, "{total}");
}

/// Injected I/O errors surface as typed errors caused by the injection, never as
/// wrong data; the engine then crashes and reopens like after a power loss.
#[test]
fn injected_errors_are_typed() {
    let mut cfg = SimConfig::fast(Mode::Errors);
    cfg.generations = 50;
    let runs = scaled(400).div_ceil(50);
    let seed = base_seed(3_100);
    let t = Instant::now();
    let (total, violations, _) = run_seeds(&cfg, seed, runs);
    assert_clean(
        "errors",
        seed,
        &total,
        &violations,
        t.elapsed().as_secs_f64(),
    );
    assert!(
        total.injected_errors_surfaced > 0 && total.engine_failures_injected > 0,
        "{total}"
    );
}

/// Kill mode: the process dies at each crash point, the devices keep every write
/// and the hand-off store survives; every acknowledged write must read back.
#[test]
fn kills_lose_no_acknowledged_write() {
    let mut cfg = SimConfig::fast(Mode::Kill);
    cfg.generations = 50;
    let runs = scaled(400).div_ceil(50);
    let seed = base_seed(4_100);
    let t = Instant::now();
    let (total, violations, _) = run_seeds(&cfg, seed, runs);
    assert_clean("kill", seed, &total, &violations, t.elapsed().as_secs_f64());
    assert!(total.recovered > 0 && total.crashes_in_open > 0, "{total}");
}

/// A write-zeroes with partial edge blocks was answered before its edge blocks
/// were written, so a kill right after lost it (seed 13000000, cycle 6).
#[test]
fn kill_after_write_zeroes_with_edges() {
    replays_clean(Mode::Kill, 50, 13_000_000);
}

/// Long validation: 50,000 crash points in crash mode, 10,000 each in live, errors
/// and kill mode. `cargo test -p shale-sim --release -- --ignored long`
#[test]
#[ignore]
fn long_crash_runs() {
    for (mode, seed, runs) in [
        (Mode::Crash, 100_000, 500),
        (Mode::Live, 200_000, 100),
        (Mode::Errors, 300_000, 100),
        (Mode::Kill, 400_000, 100),
    ] {
        let mut cfg = SimConfig::fast(mode);
        cfg.generations = 100;
        let seed = base_seed(seed);
        let t = Instant::now();
        let (total, violations, _) = run_seeds(&cfg, seed, runs);
        assert_clean(
            &format!("long {mode}"),
            seed,
            &total,
            &violations,
            t.elapsed().as_secs_f64(),
        );
    }
}

/// Runs one seed (a regression) and expects no violation.
fn replays_clean(mode: Mode, generations: u32, seed: u64) {
    let mut cfg = SimConfig::fast(mode);
    cfg.generations = generations;
    let r = run(seed, &cfg);
    assert!(r.violation.is_none(), "{}", r.violation.unwrap());
}

/// Runs seeds aimed at one kind of crash point; returns every violation.
fn aimed(only: &str, seeds: &[u64], generations: u32) -> Vec<Violation> {
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = generations;
    cfg.only = Some(only.into());
    seeds
        .iter()
        .filter_map(|&s| run(s, &cfg).violation)
        .collect()
}

/// Regression (found by this simulator): the clean-shutdown checkpoint records zones
/// freed since the last durability point as Free, and resets them only after the
/// clean superblock is written. Power lost between the two leaves zones that are
/// Free in the checkpoint but still full on the device; the engine reopened (clean,
/// or recovered from that checkpoint) stops at its first group write into one
/// ("zone is full").
#[test]
fn zones_freed_at_shutdown_survive_a_crash_after_the_clean_superblock() {
    let v = aimed("shutdown:superblock", &[1, 8, 23, 40], 50);
    assert!(v.is_empty(), "{}", v[0]);
}

/// Regression (found by this simulator): recovery adopts the newer checkpoint area
/// that a crash kept the superblock from naming, then writes its own checkpoint into
/// the other area, which the durable superblock still names. Power lost before
/// recovery's superblock write leaves a superblock naming a torn checkpoint, and the
/// devices no longer open ("checkpoint header: CRC32C mismatch").
#[test]
fn recovery_never_overwrites_the_checkpoint_the_superblock_names() {
    let v = aimed("shutdown:superblock", &[2, 11, 16, 21], 50);
    assert!(v.is_empty(), "{}", v[0]);
}

/// Regression (found by this simulator): a volume change takes a checkpoint, which
/// drains the device queues; a device error met there (here an injected read error
/// on a compaction victim read) is returned to the volume-change request while the
/// engine keeps running, and the completions reaped after it in the same batch are
/// dropped. Their I/O slots never clear, and the next durability point waits for
/// them forever (the simulator stops it by cutting the power after 2,000,000 device
/// calls in one poll).
#[test]
fn an_io_error_inside_a_volume_change_does_not_hang_the_engine() {
    replays_clean(Mode::Errors, 20, 5015);
}

/// Regression (found by the long run): a clean shutdown's checkpoint records zones
/// freed since the last durability point as Free and wrote the clean superblock before
/// resetting them. A crash between the two left a clean image with a Free zone still
/// full; the clean open trusted it and the first group write into it failed ("zone is
/// full"). The clean flag now goes down only after the resets, and every open resets
/// Free zones that are not empty.
#[test]
fn a_clean_open_never_reuses_a_free_zone_that_was_not_reset() {
    replays_clean(Mode::Crash, 100, 100_279);
}

/// Regression (a false violation of the oracle): a write-zeroes failed on an
/// injected read error in its sub-block edge after unmapping the whole blocks inside;
/// a later read saw some blocks old and some new, which the model took for wrong data.
/// A failed request now leaves each block old or new, and the cycle ends in a crash.
#[test]
fn a_failed_request_leaves_each_block_old_or_new() {
    replays_clean(Mode::Errors, 100, 32);
}

/// Regression (found by this simulator): a write whose L2P page fault met an injected
/// I/O error (the eviction's write-back) failed the engine, but the write itself was
/// in none of the queues a failing engine answers, so its completion was dropped and
/// the client waited forever. The simulator now reports a request a failed engine
/// never answered at once.
#[test]
fn a_write_failing_inside_the_engine_is_answered() {
    replays_clean(Mode::Errors, 8, 730_081);
}

/// The harness has teeth: with a cache device that acknowledges flushes without
/// making anything durable, crashes lose flushed writes and metadata, and the runs
/// must say so.
#[test]
fn a_cache_that_lies_about_flushes_is_caught() {
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 20;
    cfg.lying_flushes = Some(Side::Cache);
    let seed = base_seed(4_000);
    let (_, violations, _) = run_seeds(&cfg, seed, 6);
    for v in &violations {
        eprintln!("{v}");
    }
    assert!(
        violations.len() >= 4,
        "seeds from {seed}: only {} of 6 runs noticed a lying cache",
        violations.len()
    );
}

/// The oracle has teeth: when the simulator acknowledges flushes the engine never
/// saw, the model expects durability the engine never promised, and crashes must
/// show up as lost data (the engine itself stays consistent).
#[test]
fn flushes_the_engine_never_saw_show_up_as_lost_data() {
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 20;
    cfg.phantom_flushes = true;
    let seed = base_seed(5_000);
    let (_, violations, _) = run_seeds(&cfg, seed, 6);
    for v in &violations {
        eprintln!("{v}");
    }
    assert!(
        violations
            .iter()
            .any(|v| v.kind == ViolationKind::WrongDataAfterCrash),
        "seeds from {seed}: lost flushed writes went unnoticed ({} violations)",
        violations.len()
    );
}

/// Pools of 2 and 4 shards, every mode: each shard's devices on the one power rail,
/// cut at a device of any shard, inside split requests, flushes across shards and
/// volume changes made shard by shard; every block checked after each recovery.
#[test]
fn sharded_pools_crash_and_recover() {
    for (shards, modes) in [
        (2, vec![Mode::Crash, Mode::Live, Mode::Errors, Mode::Kill]),
        (4, vec![Mode::Crash, Mode::Errors, Mode::Kill]),
    ] {
        for mode in modes {
            let mut cfg = SimConfig::fast(mode);
            cfg.generations = 25;
            cfg.shards = shards;
            let runs = scaled(200).div_ceil(25).max(2);
            let seed = base_seed(6_000 + u64::from(shards) * 100);
            let t = Instant::now();
            let (total, violations, _) = run_seeds(&cfg, seed, runs);
            let what = format!("{mode}, {shards} shards");
            assert_clean(&what, seed, &total, &violations, t.elapsed().as_secs_f64());
            assert!(
                total.requests_split > 0 && total.volume_changes_across_shards > 0,
                "{what}: {total}"
            );
            if mode == Mode::Crash {
                assert!(
                    (0..shards as usize).all(|s| total.cuts_by_shard.contains_key(&s)),
                    "{what}: a cut on every shard's devices: {total}"
                );
                assert!(total.recovered > 0, "{what}: {total}");
            }
        }
    }
}

/// Shards sharing one capacity device, every mode: the space manager moves free zones
/// between them at random moments, power cuts land inside its gives and takes, and
/// after every recovery each zone is held by one shard (the pool's open refuses two
/// holders) and every block checks.
#[test]
fn shards_sharing_a_capacity_device_crash_and_recover() {
    for mode in [Mode::Crash, Mode::Live, Mode::Errors, Mode::Kill] {
        let mut cfg = SimConfig::fast(mode);
        cfg.generations = 25;
        cfg.shards = 2;
        cfg.shared_capacity = true;
        let runs = scaled(150).div_ceil(25).max(2);
        let seed = base_seed(6_500);
        let t = Instant::now();
        let (total, violations, _) = run_seeds(&cfg, seed, runs);
        let what = format!("{mode}, 2 shards sharing a device");
        assert_clean(&what, seed, &total, &violations, t.elapsed().as_secs_f64());
        assert!(total.zones_moved > 0, "{what}: no zone moved: {total}");
        if mode == Mode::Crash {
            assert!(total.recovered > 0, "{what}: {total}");
        }
    }
    // It replays exactly from its seed too.
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 10;
    cfg.shards = 3;
    cfg.shared_capacity = true;
    let seed = base_seed(9);
    let (a, b) = (run(seed, &cfg), run(seed, &cfg));
    assert_eq!(a.trace, b.trace, "seed {seed}: traces differ");
    assert_eq!(a.counts, b.counts, "seed {seed}: counts differ");
}

/// Shards sharing one cache and one capacity device, every mode: each shard's
/// metadata in its window, the chunks and zones moved between shards at random
/// moments, power cuts inside the moves, and after every recovery every block checks.
#[test]
fn shards_sharing_a_cache_crash_and_recover() {
    for mode in [Mode::Crash, Mode::Live, Mode::Errors, Mode::Kill] {
        let mut cfg = SimConfig::fast(mode);
        cfg.generations = 25;
        cfg.shards = 2;
        cfg.shared_cache = true;
        let runs = scaled(150).div_ceil(25).max(2);
        let seed = base_seed(6_700);
        let t = Instant::now();
        let (total, violations, _) = run_seeds(&cfg, seed, runs);
        let what = format!("{mode}, 2 shards sharing a cache");
        assert_clean(&what, seed, &total, &violations, t.elapsed().as_secs_f64());
        assert!(total.chunks_given > 0, "{what}: no chunk moved: {total}");
    }
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 10;
    cfg.shards = 3;
    cfg.shared_cache = true;
    let seed = base_seed(19);
    let (a, b) = (run(seed, &cfg), run(seed, &cfg));
    assert_eq!(a.trace, b.trace, "seed {seed}: traces differ");
    assert_eq!(a.counts, b.counts, "seed {seed}: counts differ");
}

/// A sharded run replays exactly from its seed, like any other.
#[test]
fn a_sharded_seed_replays_exactly() {
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 10;
    cfg.shards = 3;
    let seed = base_seed(8);
    let (a, b) = (run(seed, &cfg), run(seed, &cfg));
    assert_eq!(a.trace, b.trace, "seed {seed}: traces differ");
    assert_eq!(a.counts, b.counts, "seed {seed}: counts differ");
}

/// The harness keeps its teeth with shards: a lying cache in a pool of two is caught.
#[test]
fn a_lying_cache_under_shards_is_caught() {
    let mut cfg = SimConfig::fast(Mode::Crash);
    cfg.generations = 20;
    cfg.shards = 2;
    cfg.lying_flushes = Some(Side::Cache);
    let seed = base_seed(4_500);
    let (_, violations, _) = run_seeds(&cfg, seed, 4);
    assert!(
        violations.len() >= 2,
        "seeds from {seed}: only {} of 4 sharded runs noticed a lying cache",
        violations.len()
    );
}

/// Regression (found by this simulator with 4 shards): a shrink failing in one shard
/// after shard 0 made it was undone by growing back, which left the old size over a
/// tail of zeros; it is now finished instead.
#[test]
fn a_shrink_failing_in_one_shard_keeps_the_volume_whole() {
    let mut cfg = SimConfig::fast(Mode::Errors);
    cfg.generations = 50;
    cfg.shards = 4;
    let r = run(903, &cfg);
    assert!(r.violation.is_none(), "{}", r.violation.unwrap());
}

/// Regression (found by this simulator with 2 shards): a failed engine's reads were
/// answered by the failure, yet their device completions, reaped by a later wait
/// (one shard failed, its neighbour idle), were dispatched to them: a panic.
#[test]
fn completions_reaped_after_a_failure_are_only_released() {
    let mut cfg = SimConfig::fast(Mode::Errors);
    cfg.generations = 50;
    cfg.shards = 2;
    let r = run(18_200_297, &cfg);
    assert!(r.violation.is_none(), "{}", r.violation.unwrap());
}

/// Regression (found by this simulator, one engine, live mode): with two GC streams,
/// GC kept reading sparse victims while one stream's partial group held blocks of
/// every victim read, filled the other stream's zones, and ran out of free zones with
/// all of them victims waiting on the blocks it held: a write never completed.
#[test]
fn gc_never_holds_more_than_the_free_zones_can_take() {
    let cfg = SimConfig::fast(Mode::Live);
    let r = run(18_900_030, &cfg);
    assert!(r.violation.is_none(), "{}", r.violation.unwrap());
}
