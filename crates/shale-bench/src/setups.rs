//! What the side-by-side experiments (`controllers.rs`, `hybrid.rs`) share: their
//! setups run a few at a time on threads, and their errors.

use crate::shale::{build_shale, ShaleConfig};
use crate::system::RunError;
use crate::{BenchConfig, Scale, SetupError};

/// Why a setup of an experiment failed.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("setup {setup}: {source}")]
    Setup {
        setup: &'static str,
        #[source]
        source: SetupError,
    },
    #[error("setup {setup}: {source}")]
    Run {
        setup: &'static str,
        #[source]
        source: Box<RunError>,
    },
}

/// The standard configuration at `scale` (at `capacity_bytes` if given) with
/// `tenants` tenants.
pub(crate) fn experiment_config(
    scale: Scale,
    capacity_bytes: Option<u64>,
    tenants: u32,
) -> Result<BenchConfig, ExperimentError> {
    let setup = |source| ExperimentError::Setup {
        setup: "all",
        source,
    };
    let mut cfg = BenchConfig::standard(scale);
    if let Some(c) = capacity_bytes {
        cfg = cfg.with_capacity(c).map_err(setup)?;
    }
    cfg.tenants = tenants;
    Ok(cfg)
}

/// The size Shale gives every volume of setup `setup` (built as `cfg` says).
pub(crate) fn volume_bytes_of(
    setup: &'static str,
    cfg: &ShaleConfig,
) -> Result<u64, ExperimentError> {
    build_shale(cfg)
        .map(|s| s.volume_bytes())
        .map_err(|source| ExperimentError::Setup { setup, source })
}

/// Runs `run` for every setup, `jobs` at a time, results in the setups' order; the
/// first error stops it (after its batch).
pub(crate) fn run_all<S: Copy + Send + Sync, R: Send>(
    setups: &[S],
    jobs: usize,
    name: impl Fn(S) -> &'static str,
    run: impl Fn(S) -> Result<R, ExperimentError> + Sync,
) -> Result<Vec<R>, ExperimentError> {
    let mut results = Vec::with_capacity(setups.len());
    for batch in setups.chunks(jobs.max(1)) {
        let done: Vec<Result<R, ExperimentError>> = std::thread::scope(|s| {
            let run = &run;
            let handles: Vec<_> = batch
                .iter()
                .map(|&setup| s.spawn(move || run(setup)))
                .collect();
            handles
                .into_iter()
                .zip(batch)
                .map(|(h, &setup)| {
                    h.join().unwrap_or_else(|_| {
                        Err(ExperimentError::Run {
                            setup: name(setup),
                            source: Box::new(RunError::Model {
                                step: "setup thread",
                                reason: "panicked".into(),
                            }),
                        })
                    })
                })
                .collect()
        });
        for r in done {
            results.push(r?);
        }
    }
    Ok(results)
}
