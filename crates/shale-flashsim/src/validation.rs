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

#[test]
fn greedy_small_superblocks_at_rho_7_percent() {
    let sf = spare_factor_from_rho(0.07);
    let seed = 0x64;
    let (waf, _) = waf_4k(256 * KIB, 64, sf, GcPolicy::Greedy, seed);
    println!("rho 7%, 64-IU superblocks, greedy: WAF {waf:.3}");
    assert!(
        (waf - 7.0).abs() / 7.0 <= 0.03,
        "64-IU superblocks, rho 7%, seed {seed:#x}: WAF {waf:.3}, expected ~7.0"
    );
}
