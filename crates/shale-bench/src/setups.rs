//! What the side-by-side experiments (`controllers.rs`, `hybrid.rs`) share: their
//! setups run a few at a time on threads, and their errors.

use crate::system::RunError;
use crate::SetupError;

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
