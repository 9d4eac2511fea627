//! Workload names, parsed from the strings people type: `seq`, `uniform`, `random`,
//! `zipf:1.2`, `zoned:60/10:30/20:10/70`. They mean what fio means (see the crate docs).

use std::fmt;
use std::str::FromStr;

/// Most zones a `zoned:` spec may list (fio allows up to 256 `zone_split` entries; a few
/// are all anyone uses, and a bound keeps the per-op table small).
pub const ZONES_MAX: usize = 64;

/// One zone of a `zoned:` spec: `access_pct` of the accesses go, uniformly, to the next
/// `range_pct` of the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    pub access_pct: u8,
    pub range_pct: u8,
}

/// Hot/cold sets as fio's `random_distribution=zoned:60/10:30/20:10/70`: zones are laid
/// out from the start of the volume in the order given. Access percentages add up to
/// exactly 100; range percentages to at most 100 (the rest of the volume is not touched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZonedSpec {
    zones: Vec<Zone>,
}

impl ZonedSpec {
    pub fn new(zones: Vec<Zone>) -> Result<ZonedSpec, SpecError> {
        if zones.is_empty() {
            return Err(SpecError::MissingParameter { workload: "zoned" });
        }
        if zones.len() > ZONES_MAX {
            return Err(SpecError::TooManyZones {
                count: zones.len(),
                max: ZONES_MAX,
            });
        }
        let access: u32 = zones.iter().map(|z| u32::from(z.access_pct)).sum();
        let range: u32 = zones.iter().map(|z| u32::from(z.range_pct)).sum();
        if access != 100 {
            return Err(SpecError::ZoneAccessSum { sum: access });
        }
        if range > 100 {
            return Err(SpecError::ZoneRangeSum { sum: range });
        }
        if let Some((i, _)) = zones
            .iter()
            .enumerate()
            .find(|(_, z)| z.access_pct > 0 && z.range_pct == 0)
        {
            return Err(SpecError::EmptyZone { index: i });
        }
        Ok(ZonedSpec { zones })
    }

    pub fn zones(&self) -> &[Zone] {
        &self.zones
    }
}

/// The access pattern of a synthetic workload.
#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    /// Sequential from the start of the volume, wrapping at the end (fio `rw=write`).
    Seq,
    /// fio's default `randwrite`: each pass writes every block exactly once, in the order
    /// fio's random map produces (uniform draw, next free block on a collision).
    Uniform,
    /// fio `norandommap`: independent uniform draws.
    Random,
    /// fio `random_distribution=zipf:θ` (no random map).
    Zipf { theta: f64 },
    /// fio `random_distribution=zoned:...` (no random map).
    Zoned(ZonedSpec),
    /// SepBIT's moving hot set: zipf θ over a hot set drawn anew after every
    /// 1/8 of the volume's blocks in operations, so blocks that were hot go cold
    /// (as in cloud traces). Not an fio distribution; θ = 1 is allowed.
    Drift { theta: f64 },
}

impl Distribution {
    /// Validates `theta` the way fio does, plus the nonsense fio lets through (≤ 0, NaN).
    pub fn zipf(theta: f64) -> Result<Distribution, SpecError> {
        if !theta.is_finite() || theta <= 0.0 || theta == 1.0 || theta > THETA_MAX {
            return Err(SpecError::ThetaOutOfRange { theta });
        }
        Ok(Distribution::Zipf { theta })
    }

    /// `drift:θ`; θ in (0, THETA_MAX].
    pub fn drift(theta: f64) -> Result<Distribution, SpecError> {
        if !theta.is_finite() || theta <= 0.0 || theta > THETA_MAX {
            return Err(SpecError::ThetaOutOfRange { theta });
        }
        Ok(Distribution::Drift { theta })
    }

    /// Short name: `seq`, `uniform`, `random`, `zipf`, `zoned`, `drift`.
    pub fn kind(&self) -> &'static str {
        match self {
            Distribution::Seq => "seq",
            Distribution::Uniform => "uniform",
            Distribution::Random => "random",
            Distribution::Zipf { .. } => "zipf",
            Distribution::Zoned(_) => "zoned",
            Distribution::Drift { .. } => "drift",
        }
    }
}

/// Largest accepted zipf θ. Above ~10 nearly every access hits one block, and the
/// generator's `pow` terms underflow.
pub const THETA_MAX: f64 = 10.0;

/// Why a workload spec was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("empty workload spec")]
    Empty,
    #[error(
        "unknown workload {name:?} (expected seq, uniform, random, zipf:THETA, zoned:A/R:A/R... or drift:THETA)"
    )]
    UnknownWorkload { name: String },
    #[error("workload {workload} takes a parameter (e.g. zipf:1.2, zoned:60/10:40/90)")]
    MissingParameter { workload: &'static str },
    #[error("workload {workload} takes no parameter, got {param:?}")]
    UnexpectedParameter {
        workload: &'static str,
        param: String,
    },
    #[error("theta {text:?} is not a number")]
    BadTheta { text: String },
    #[error("theta {theta} out of range (must be > 0 and <= {max}; zipf also != 1)", max = THETA_MAX)]
    ThetaOutOfRange { theta: f64 },
    #[error("zone {index} {text:?}: expected ACCESS%/RANGE% with whole numbers 0..=100")]
    BadZone { index: usize, text: String },
    #[error("zoned spec lists {count} zones, at most {max} allowed")]
    TooManyZones { count: usize, max: usize },
    #[error("zoned access percentages add up to {sum}, must be exactly 100")]
    ZoneAccessSum { sum: u32 },
    #[error("zoned range percentages add up to {sum}, must be at most 100")]
    ZoneRangeSum { sum: u32 },
    #[error("zone {index} receives accesses but covers 0% of the volume")]
    EmptyZone { index: usize },
}

impl FromStr for Distribution {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Distribution, SpecError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(SpecError::Empty);
        }
        let (name, param) = match s.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s, None),
        };
        let name_lc = name.to_ascii_lowercase();
        let no_param = |workload: &'static str, d: Distribution| match param {
            None => Ok(d),
            Some(p) => Err(SpecError::UnexpectedParameter {
                workload,
                param: p.into(),
            }),
        };
        match name_lc.as_str() {
            "seq" | "sequential" => no_param("seq", Distribution::Seq),
            "uniform" => no_param("uniform", Distribution::Uniform),
            "random" => no_param("random", Distribution::Random),
            "zipf" => {
                let p = param.ok_or(SpecError::MissingParameter { workload: "zipf" })?;
                let theta: f64 = p
                    .trim()
                    .parse()
                    .map_err(|_| SpecError::BadTheta { text: p.into() })?;
                Distribution::zipf(theta)
            }
            "drift" => {
                let p = param.ok_or(SpecError::MissingParameter { workload: "drift" })?;
                let theta: f64 = p
                    .trim()
                    .parse()
                    .map_err(|_| SpecError::BadTheta { text: p.into() })?;
                Distribution::drift(theta)
            }
            "zoned" => {
                let p = param.ok_or(SpecError::MissingParameter { workload: "zoned" })?;
                let mut zones = Vec::new();
                for (index, part) in p.split(':').enumerate() {
                    if index >= ZONES_MAX {
                        return Err(SpecError::TooManyZones {
                            count: p.split(':').count(),
                            max: ZONES_MAX,
                        });
                    }
                    let bad = || SpecError::BadZone {
                        index,
                        text: part.into(),
                    };
                    let (a, r) = part.split_once('/').ok_or_else(bad)?;
                    let pct = |x: &str| -> Option<u8> {
                        x.trim().parse::<u8>().ok().filter(|&v| v <= 100)
                    };
                    zones.push(Zone {
                        access_pct: pct(a).ok_or_else(bad)?,
                        range_pct: pct(r).ok_or_else(bad)?,
                    });
                }
                Ok(Distribution::Zoned(ZonedSpec::new(zones)?))
            }
            _ => Err(SpecError::UnknownWorkload { name: name.into() }),
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distribution::Zipf { theta } => write!(f, "zipf:{theta}"),
            Distribution::Drift { theta } => write!(f, "drift:{theta}"),
            Distribution::Zoned(z) => {
                f.write_str("zoned:")?;
                for (i, zone) in z.zones.iter().enumerate() {
                    if i > 0 {
                        f.write_str(":")?;
                    }
                    write!(f, "{}/{}", zone.access_pct, zone.range_pct)?;
                }
                Ok(())
            }
            other => f.write_str(other.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_kind_and_round_trips() {
        for s in [
            "seq",
            "uniform",
            "random",
            "zipf:1.2",
            "zipf:0.8",
            "zoned:60/10:30/20:10/70",
            "zoned:100/50",
            "drift:1",
            "drift:0.8",
        ] {
            let d: Distribution = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(d.to_string(), s);
            assert_eq!(d.to_string().parse::<Distribution>(), Ok(d));
        }
        assert_eq!("SEQ".parse::<Distribution>(), Ok(Distribution::Seq));
        assert_eq!("sequential".parse::<Distribution>(), Ok(Distribution::Seq));
    }

    #[test]
    fn rejects_nonsense_with_typed_errors() {
        let err = |s: &str| s.parse::<Distribution>().err();
        assert_eq!(err(""), Some(SpecError::Empty));
        assert!(matches!(
            err("fast"),
            Some(SpecError::UnknownWorkload { .. })
        ));
        assert!(matches!(
            err("zipf"),
            Some(SpecError::MissingParameter { .. })
        ));
        assert!(matches!(err("zipf:abc"), Some(SpecError::BadTheta { .. })));
        assert!(matches!(err("zipf:"), Some(SpecError::BadTheta { .. })));
        for t in ["1", "1.0", "0", "-0.5", "NaN", "inf", "11"] {
            assert!(
                matches!(
                    err(&format!("zipf:{t}")),
                    Some(SpecError::ThetaOutOfRange { .. })
                ),
                "zipf:{t}"
            );
        }
        for t in ["0", "-1", "NaN", "inf", "11"] {
            assert!(
                matches!(
                    err(&format!("drift:{t}")),
                    Some(SpecError::ThetaOutOfRange { .. })
                ),
                "drift:{t}"
            );
        }
        assert!(matches!(
            err("drift"),
            Some(SpecError::MissingParameter { .. })
        ));
        assert!(matches!(err("drift:x"), Some(SpecError::BadTheta { .. })));
        assert!(matches!(
            err("uniform:3"),
            Some(SpecError::UnexpectedParameter { .. })
        ));
        assert!(matches!(
            err("zoned"),
            Some(SpecError::MissingParameter { .. })
        ));
        assert!(matches!(
            err("zoned:60/10:30/20"),
            Some(SpecError::ZoneAccessSum { sum: 90 })
        ));
        assert!(matches!(
            err("zoned:50/60:50/60"),
            Some(SpecError::ZoneRangeSum { sum: 120 })
        ));
        assert!(matches!(
            err("zoned:60-10"),
            Some(SpecError::BadZone { index: 0, .. })
        ));
        assert!(matches!(
            err("zoned:60/10:40/x"),
            Some(SpecError::BadZone { index: 1, .. })
        ));
        assert!(matches!(
            err("zoned:101/10"),
            Some(SpecError::BadZone { .. })
        ));
        assert!(matches!(
            err("zoned:60/0:40/100"),
            Some(SpecError::EmptyZone { index: 0 })
        ));
        let many = vec!["1/1"; ZONES_MAX + 1].join(":");
        assert!(matches!(
            err(&format!("zoned:{many}")),
            Some(SpecError::TooManyZones { .. })
        ));
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<Distribution>();
        }

        #[test]
        fn zoned_specs_never_panic(s in "zoned:[0-9/:]{0,30}") {
            let _ = s.parse::<Distribution>();
        }
    }
}
