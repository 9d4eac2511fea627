//! The analytic write amplification of uniform random single-page writes, the yardstick
//! the simulator is validated against.
//!
//! For greedy cleaning with large erase blocks, or FIFO cleaning of any block size,
//! independent uniform page overwrites reach a steady state in which a victim block
//! still holds a fraction `u` of valid pages, with `u` the non-trivial root of
//! `u = exp(-(1 - u) * alpha)` for `alpha = 1 / (1 - Sf)` (physical over logical). The
//! write amplification `1 / (1 - u)` then has the closed form
//! `alpha / (alpha + W0(-alpha * e^-alpha))` (Hu et al. 2009, Desnoyers 2012), with `W0`
//! the principal branch of the Lambert W function.

/// `-1/e`, the left end of the domain of the Lambert W function.
const MINUS_INV_E: f64 = -0.367_879_441_171_442_33;

/// The principal branch `W0` of the Lambert W function: the `w >= -1` with
/// `w * e^w = x`. `None` for `x < -1/e` (no real solution) or non-finite input.
pub fn lambert_w0(x: f64) -> Option<f64> {
    if !x.is_finite() || x < MINUS_INV_E {
        return None;
    }
    if x == MINUS_INV_E {
        return Some(-1.0);
    }
    if x == 0.0 {
        return Some(0.0);
    }
    // Starting points: the branch-point series near -1/e (where Halley's method is
    // slow because W has a square-root singularity), log1p for moderate x, and the
    // asymptotic expansion for large x.
    let mut w = if x < -0.25 {
        let p = (2.0 * (std::f64::consts::E * x + 1.0)).sqrt();
        -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p * p * p
    } else if x < 3.0 {
        x.ln_1p() * 0.8
    } else {
        let l = x.ln();
        l - l.ln()
    };
    for _ in 0..64 {
        let ew = w.exp();
        let f = w * ew - x;
        let wp1 = w + 1.0;
        if wp1 == 0.0 {
            break;
        }
        let denom = ew * wp1 - (w + 2.0) * f / (2.0 * wp1);
        if denom == 0.0 || !denom.is_finite() {
            break;
        }
        let next = w - f / denom;
        let done = (next - w).abs() <= 4.0 * f64::EPSILON * (1.0 + next.abs());
        w = next;
        if done {
            break;
        }
    }
    Some(w)
}

/// Steady-state write amplification of uniform random single-page writes under
/// greedy (large blocks) or FIFO cleaning, for a spare factor `Sf` = spare / physical.
/// Infinite at `Sf = 0`; `None` outside `[0, 1)`.
pub fn uniform_random_waf(spare_factor: f64) -> Option<f64> {
    if !(0.0..1.0).contains(&spare_factor) {
        return None;
    }
    if spare_factor == 0.0 {
        return Some(f64::INFINITY);
    }
    let alpha = 1.0 / (1.0 - spare_factor);
    let w = lambert_w0(-alpha * (-alpha).exp())?;
    Some(alpha / (alpha + w))
}

/// Over-provisioning stated as rho = spare / user, converted to Sf = spare / physical.
pub fn spare_factor_from_rho(rho: f64) -> f64 {
    rho / (1.0 + rho)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w0_satisfies_its_equation_across_the_domain() {
        let mut x = MINUS_INV_E;
        while x < 1.0e6 {
            let w = lambert_w0(x).expect("in domain");
            assert!(w >= -1.0, "W0({x}) = {w} below the branch point");
            let back = w * w.exp();
            assert!(
                (back - x).abs() <= 1e-12 * (1.0 + x.abs()),
                "W0({x}) = {w}: w e^w = {back}"
            );
            x = if x < 0.0 { x + 0.0137 } else { x * 1.7 + 0.01 };
        }
    }

    #[test]
    fn w0_known_values() {
        assert_eq!(lambert_w0(0.0), Some(0.0));
        assert_eq!(lambert_w0(MINUS_INV_E), Some(-1.0));
        let omega = lambert_w0(1.0).expect("in domain");
        assert!((omega - 0.567_143_290_409_783_8).abs() < 1e-14, "{omega}");
        let e = lambert_w0(std::f64::consts::E).expect("in domain");
        assert!((e - 1.0).abs() < 1e-14, "{e}");
        // -ln2/2 = W0^-1 ... W0(-ln2/2) = -ln2 (since -ln2 * e^-ln2 = -ln2/2).
        let l = lambert_w0(-std::f64::consts::LN_2 / 2.0).expect("in domain");
        assert!((l + std::f64::consts::LN_2).abs() < 1e-14, "{l}");
        assert_eq!(lambert_w0(-0.5), None);
        assert_eq!(lambert_w0(f64::NAN), None);
    }

    #[test]
    fn w0_near_branch_point_is_accurate() {
        for k in 1..40 {
            let x = MINUS_INV_E + 10f64.powi(-k / 3);
            let w = lambert_w0(x).expect("in domain");
            assert!((w * w.exp() - x).abs() < 1e-15, "x = {x}, w = {w}");
        }
    }

    #[test]
    fn waf_matches_the_published_values() {
        for (sf, expected) in [
            (0.07, 7.32),
            (0.10, 5.18),
            (0.18, 2.97),
            (0.20, 2.69),
            (0.28, 1.99),
        ] {
            let waf = uniform_random_waf(sf).expect("in range");
            assert!((waf - expected).abs() < 0.006, "Sf {sf}: {waf}");
        }
        // rho = 7% (Sf 6.54%): the 7.82 quoted for large blocks.
        let waf = uniform_random_waf(spare_factor_from_rho(0.07)).expect("in range");
        assert!((waf - 7.82).abs() < 0.01, "{waf}");
        assert_eq!(uniform_random_waf(0.0), Some(f64::INFINITY));
        assert_eq!(uniform_random_waf(1.0), None);
    }

    #[test]
    fn waf_solves_the_victim_utilisation_equation() {
        for sf in [0.03, 0.07, 0.11, 0.28, 0.5, 0.8] {
            let waf = uniform_random_waf(sf).expect("in range");
            let u = 1.0 - 1.0 / waf;
            let alpha = 1.0 / (1.0 - sf);
            assert!((u - (-(1.0 - u) * alpha).exp()).abs() < 1e-12, "Sf {sf}");
        }
    }
}
