//! The model against theory and against the seeds' measurements, one claim per test.
//!
//! Every run preconditions first (sequential fill, then random writes) and measures
//! only the steady state, as the seeds did. Sizes are chosen so each test takes a
//! few seconds in the test profile; the figures measured at larger sizes are in
//! docs/flash-model.md.

use crate::testutil::steady_state;
use crate::{
    preset, spare_factor_from_rho, uniform_random_waf, Ftl, FtlConfig, GcPolicy, Superblock,
    TimingModel,
};

const KIB: u64 = 1024;

fn any_timing() -> TimingModel {
    TimingModel::from_datasheet(&preset("tlc").expect("preset").datasheet)
}

/// Uniform random 4 KiB writes on a 4 KiB-IU drive: steady-state WAF.
fn waf_4k(ius: u64, ius_per_superblock: u64, sf: f64, policy: GcPolicy, seed: u64) -> (f64, f64) {
    let cfg = FtlConfig::new(4 * KIB, Superblock::Bytes(ius_per_superblock * 4 * KIB), sf)
        .with_policy(policy);
    let mut ftl = Ftl::new(&cfg, ius * 4 * KIB, any_timing()).expect("valid config");
    let eff = ftl.geometry().effective_spare_factor();
    let s = steady_state(&mut ftl, ius * 4 * KIB, 4 * KIB, 4 * ius, 4 * ius, seed);
    ftl.self_check().expect("consistent");
    (s.waf(), eff)
}

/// Checks the steady-state WAF against the analytic value. `user_superblocks` is
/// chosen so that `user / (1 - sf)` is a whole number of superblocks (300), which keeps
/// the drive's real spare factor equal to the nominal one.
fn check_formula(sf: f64, user_superblocks: u64, policy: GcPolicy, tolerance: f64) {
    let seed = 0x5eed_0000 + (sf * 1000.0) as u64;
    let (waf, eff) = waf_4k(user_superblocks * 1024, 1024, sf, policy, seed);
    let expected = uniform_random_waf(eff).expect("in range");
    let err = (waf - expected).abs() / expected;
    println!("Sf {sf} {policy:?}: WAF {waf:.3}, analytic {expected:.3}");
    assert!(
        (eff - sf).abs() < 1e-6,
        "Sf {sf}: geometry gives effective {eff}"
    );
    assert!(
        err <= tolerance,
        "Sf {sf} {policy:?} seed {seed:#x}: WAF {waf:.3}, analytic {expected:.3} ({:.2}% off)",
        err * 100.0
    );
}

#[test]
fn greedy_large_superblocks_match_analytic_sf_7() {
    check_formula(0.07, 279, GcPolicy::Greedy, 0.02);
}

#[test]
fn greedy_large_superblocks_match_analytic_sf_10() {
    check_formula(0.10, 270, GcPolicy::Greedy, 0.02);
}

#[test]
fn greedy_large_superblocks_match_analytic_sf_18() {
    check_formula(0.18, 246, GcPolicy::Greedy, 0.02);
}

#[test]
fn greedy_large_superblocks_match_analytic_sf_28() {
    check_formula(0.28, 216, GcPolicy::Greedy, 0.02);
}

#[test]
fn fifo_matches_analytic_sf_7() {
    check_formula(0.07, 279, GcPolicy::Fifo, 0.01);
}

#[test]
fn fifo_matches_analytic_sf_18() {
    check_formula(0.18, 246, GcPolicy::Fifo, 0.01);
}

/// Greedy with small superblocks does better than the large-block limit (7.82 at
/// rho 7%) because victims are picked from a wider spread of valid counts; the quoted
/// figure is 7.0 (two digits, so +-0.7%). Runs at different sizes and seeds agree to
/// 0.1%, so 2% is a safe tolerance that still fails for a model off by one reserve
/// superblock or a victim-choice bug.
#[test]
fn greedy_small_superblocks_at_rho_7_percent() {
    let sf = spare_factor_from_rho(0.07);
    let seed = 0x64;
    let (waf, _) = waf_4k(256 * KIB, 64, sf, GcPolicy::Greedy, seed);
    println!("rho 7%, 64-IU superblocks, greedy: WAF {waf:.3}");
    assert!(
        (waf - 7.0).abs() / 7.0 <= 0.02,
        "64-IU superblocks, rho 7%, seed {seed:#x}: WAF {waf:.3}, expected ~7.0"
    );
}

/// The `qlc-p5316` model of a 4 GiB drive (the `paper` configuration's capacity).
fn p5316() -> (crate::Preset, Ftl) {
    let p = preset("qlc-p5316").expect("preset");
    let cfg = p.ftl_config().expect("conventional");
    let ftl = Ftl::new(&cfg, 4 << 30, p.timing).expect("valid");
    (p, ftl)
}

/// 4 KiB uniform random writes over `span_fraction` of the 4 GiB P5316 model.
fn p5316_random_4k(span_fraction: f64, seed: u64) -> crate::FlashStats {
    let (_, mut ftl) = p5316();
    let span = ((4u64 << 30) as f64 * span_fraction) as u64 / (64 * KIB) * (64 * KIB);
    let ius = span / (64 * KIB);
    let s = steady_state(&mut ftl, span, 4 * KIB, 4 * ius, 4 * ius, seed);
    ftl.self_check().expect("consistent");
    s
}

/// Every 4 KiB write programs a whole 64 KiB IU (16x) and GC multiplies that by its own
/// factor; GC alone behaves as the analytic model predicts for the IU-granular
/// overwrites it sees, a little below it because a 4 GiB model has superblocks of only
/// 287 IUs (greedy gains from the spread of small blocks: -0.6% at 1024 IUs, -10% at
/// 64, see docs/flash-model.md), so the tolerance is -5%..+1%.
#[test]
fn qlc_p5316_random_4k_is_16x_iu_rmw_on_top_of_gc() {
    let seed = 0x5316;
    let s = p5316_random_4k(1.0, seed);
    let rmw = s.waf() / s.gc_waf();
    assert!((rmw - 16.0).abs() < 1e-9, "seed {seed:#x}: IU factor {rmw}");
    assert_eq!(s.nand_bytes_read_rmw, s.host_bytes_written * 15);
    let expected = uniform_random_waf(0.11).expect("in range");
    let err = s.gc_waf() / expected - 1.0;
    println!(
        "qlc-p5316 full span: device WAF {:.2} = 16 x GC {:.3} (analytic {expected:.3})",
        s.waf(),
        s.gc_waf()
    );
    assert!(
        (-0.05..=0.01).contains(&err),
        "seed {seed:#x}: GC WAF {:.3} vs analytic {expected:.3}",
        s.gc_waf()
    );
}

/// Seed 004 §4.1.1 measured raw QLC WAF 43.3 under 4 KiB uniform random writes with
/// 10% host over-provisioning; the model, whose spare factor was inferred from that
/// figure through the analytic model, reproduces it within the finite-superblock
/// effect above (5%).
#[test]
fn qlc_p5316_reproduces_the_seed_raw_qlc_waf() {
    let seed = 0x0433;
    let s = p5316_random_4k(0.9, seed);
    println!("qlc-p5316 90% span: device WAF {:.2} (seed 43.3)", s.waf());
    assert!(
        (s.waf() / 43.3 - 1.0).abs() <= 0.05,
        "seed {seed:#x}: WAF {:.2}",
        s.waf()
    );
}

/// The timing model turns the counts into the real drive's figures: 4 KiB random writes
/// at full span near Table 1's 5.7K IOPS (seed 000), with 10% host over-provisioning
/// near the 8 x 5.02 MiB/s seed 004 measured, sequential writes at the sequential
/// figure and random reads at the command rate. 10% for the random figures: the
/// datasheet rounds and the seeds' own runs vary by more than that between figures.
#[test]
fn qlc_p5316_timing_lands_on_the_drive_figures() {
    let mib = (1u64 << 20) as f64;
    let full = p5316_random_4k(1.0, 0x57);
    let iops =
        crate::emulated_bytes_per_sec(full.host_bytes_written, &[&full]).expect("busy") / 4096.0;
    let op10 = p5316_random_4k(0.9, 0x502);
    let op10_mib_s =
        crate::emulated_bytes_per_sec(op10.host_bytes_written, &[&op10]).expect("busy") / mib;
    println!("qlc-p5316 4K random: {iops:.0} IOPS full span, {op10_mib_s:.1} MiB/s at 90% span");
    assert!(
        (iops / 5700.0 - 1.0).abs() <= 0.10,
        "full span: {iops:.0} IOPS"
    );
    assert!(
        (op10_mib_s / (8.0 * 5.02) - 1.0).abs() <= 0.10,
        "90% span: {op10_mib_s:.1} MiB/s"
    );

    let (p, mut ftl) = p5316();
    let cap = 4u64 << 30;
    let pass = |ftl: &mut Ftl| {
        let before = ftl.stats();
        let mut off = 0;
        while off < cap {
            ftl.write(off, 128 * KIB).expect("in range");
            off += 128 * KIB;
        }
        ftl.stats().since(&before)
    };
    pass(&mut ftl);
    let seq = pass(&mut ftl);
    let seq_mb_s =
        crate::emulated_bytes_per_sec(seq.host_bytes_written, &[&seq]).expect("busy") / 1e6;
    assert_eq!(seq.waf(), 1.0);
    assert!(
        (seq_mb_s / p.datasheet.seq_write_mb_s - 1.0).abs() <= 0.02,
        "sequential write {seq_mb_s:.0} MB/s"
    );

    let before = ftl.stats();
    let mut rng = crate::testutil::Rng::new(9);
    for _ in 0..10_000 {
        ftl.read(rng.below(cap / 4096) * 4096, 4096)
            .expect("in range");
    }
    let r = ftl.stats().since(&before);
    let read_iops = crate::emulated_bytes_per_sec(r.host_bytes_read, &[&r]).expect("busy") / 4096.0;
    assert!(
        (read_iops / p.datasheet.rand_read_4k_iops - 1.0).abs() <= 0.01,
        "random read {read_iops:.0} IOPS"
    );
}

/// Hot/cold locality (80% of writes to 20% of the space): the classic log-structured
/// result that cost-benefit cleaning beats greedy, whose victims are mostly hot
/// superblocks caught before their data had time to die, while the cold data's
/// superblocks sit with a little invalid space each.
#[test]
fn cost_benefit_beats_greedy_under_hot_cold_locality() {
    let run = |policy: GcPolicy| {
        let cfg =
            FtlConfig::new(4 * KIB, Superblock::Bytes(512 * 4 * KIB), 0.07).with_policy(policy);
        let ius = 256 * 512;
        let mut f = Ftl::new(&cfg, ius * 4 * KIB, any_timing()).expect("valid");
        let hot = ius / 5;
        let mut rng = crate::testutil::Rng::new(0xc01d);
        let mut write = |f: &mut Ftl| {
            let lpn = if rng.below(10) < 8 {
                rng.below(hot)
            } else {
                hot + rng.below(ius - hot)
            };
            f.write(lpn * 4 * KIB, 4 * KIB).expect("in range");
        };
        for lpn in 0..ius {
            f.write(lpn * 4 * KIB, 4 * KIB).expect("in range");
        }
        for _ in 0..8 * ius {
            write(&mut f);
        }
        let before = f.stats();
        for _ in 0..4 * ius {
            write(&mut f);
        }
        f.self_check().expect("consistent");
        f.stats().since(&before).waf()
    };
    let greedy = run(GcPolicy::Greedy);
    let cost_benefit = run(GcPolicy::CostBenefit);
    println!("hot/cold 80/20, Sf 7%: greedy {greedy:.3}, cost-benefit {cost_benefit:.3}");
    assert!(
        cost_benefit < greedy * 0.95,
        "greedy {greedy:.3}, cost-benefit {cost_benefit:.3}"
    );
}
