//! What a benchmark tenant does: a synthetic distribution (fio semantics) or a block
//! trace replayed (`trace:FILE`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use shale_workload::{
    Distribution, Source, SpecError, Trace, TraceError, TraceFit, TraceFormat, TraceTiming,
    WorkloadConfig,
};

/// A tenant's access pattern.
#[derive(Debug, Clone, PartialEq)]
pub enum Access {
    Synthetic(Distribution),
    /// Every tenant replays the trace from its start, looping, as fast as the system
    /// takes it; offsets wrap into the volume (`TraceFit::Modulo`) and requests are
    /// aligned to the run's block size.
    Trace {
        path: PathBuf,
        trace: Arc<Trace>,
    },
}

/// Why a workload could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(
        "unknown workload {name:?} (expected seq, uniform, random, zipf:THETA, \
         zoned:A/R:A/R..., drift:THETA or trace:FILE)"
    )]
    UnknownWorkload { name: String },
    #[error(transparent)]
    Spec(SpecError),
    #[error("trace {path}: {source}")]
    Trace {
        path: String,
        #[source]
        source: TraceError,
    },
    #[error(
        "trace {path}: cannot tell its format from line {line} ({fields} fields; MSR \
         Cambridge has 7, Alibaba 5, the simple op,offset,len CSV 3): name it, e.g. \
         trace:msr:FILE, trace:alibaba:FILE, trace:alibaba:DEVICE:FILE, trace:simple:FILE"
    )]
    UnknownTraceFormat {
        path: String,
        line: usize,
        fields: usize,
    },
}

impl Access {
    /// Loads a trace, in `format` or the one its first request line shows.
    pub fn trace(path: &Path, format: Option<TraceFormat>) -> Result<Access, AccessError> {
        let err = |source| AccessError::Trace {
            path: path.display().to_string(),
            source,
        };
        let format = match format {
            Some(f) => f,
            None => detect_format(path)?,
        };
        let trace = Trace::from_path(format, path).map_err(err)?;
        Ok(Access::Trace {
            path: path.to_path_buf(),
            trace: Arc::new(trace),
        })
    }

    /// A one-tenant, one-pass workload configuration of this access pattern.
    pub fn workload_config(&self, block_bytes: u64, volume_bytes: u64) -> WorkloadConfig {
        match self {
            Access::Synthetic(d) => WorkloadConfig::new(d.clone(), block_bytes, volume_bytes),
            Access::Trace { trace, .. } => {
                let mut w = WorkloadConfig::new(Distribution::Seq, block_bytes, volume_bytes);
                w.source = Source::Trace {
                    traces: vec![Arc::clone(trace)],
                    fit: TraceFit::Modulo,
                    timing: TraceTiming::AsFastAsPossible,
                };
                w
            }
        }
    }
}

/// The format of the first line that is not blank, a comment or a header, by its
/// number of fields.
fn detect_format(path: &Path) -> Result<TraceFormat, AccessError> {
    let text = std::fs::read(path).map_err(|source| AccessError::Trace {
        path: path.display().to_string(),
        source: TraceError::Open {
            path: path.display().to_string(),
            source,
        },
    })?;
    let head = &text[..text.len().min(64 << 10)];
    let head = String::from_utf8_lossy(head);
    for (i, line) in head.lines().enumerate() {
        let l = line.trim();
        let lower = l.to_ascii_lowercase();
        if l.is_empty()
            || l.starts_with('#')
            || lower.starts_with("timestamp")
            || lower.starts_with("device_id")
            || lower.starts_with("op,")
        {
            continue;
        }
        let fields = l.split(',').count();
        return match fields {
            7 => Ok(TraceFormat::Msr),
            5 => Ok(TraceFormat::Alibaba(None)),
            3 => Ok(TraceFormat::Simple),
            _ => Err(AccessError::UnknownTraceFormat {
                path: path.display().to_string(),
                line: i + 1,
                fields,
            }),
        };
    }
    // No request line: the parser says the trace is empty.
    Ok(TraceFormat::Simple)
}

impl From<Distribution> for Access {
    fn from(d: Distribution) -> Access {
        Access::Synthetic(d)
    }
}

impl FromStr for Access {
    type Err = AccessError;

    /// A distribution (`uniform`, `zipf:1.2`, ...), or `trace:FILE` with the format
    /// detected, or `trace:FORMAT:FILE` (`msr`, `alibaba`, `alibaba:DEVICE`, `simple`).
    fn from_str(s: &str) -> Result<Access, AccessError> {
        let Some(rest) = s.trim().strip_prefix("trace:") else {
            return s.parse().map(Access::Synthetic).map_err(|e| match e {
                SpecError::UnknownWorkload { name } => AccessError::UnknownWorkload { name },
                other => AccessError::Spec(other),
            });
        };
        for prefix in ["msr:", "simple:", "csv:"] {
            if let Some(path) = rest.strip_prefix(prefix) {
                let format = prefix.trim_end_matches(':').parse().ok();
                return Access::trace(Path::new(path), format);
            }
        }
        if let Some(r) = rest.strip_prefix("alibaba:") {
            // `alibaba:DEVICE:FILE` or `alibaba:FILE`.
            if let Some((dev, path)) = r.split_once(':') {
                if let Ok(id) = dev.parse::<u64>() {
                    return Access::trace(Path::new(path), Some(TraceFormat::Alibaba(Some(id))));
                }
            }
            return Access::trace(Path::new(r), Some(TraceFormat::Alibaba(None)));
        }
        Access::trace(Path::new(rest), None)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Access::Synthetic(d) => d.fmt(f),
            Access::Trace { path, .. } => {
                let name = path.file_name().unwrap_or(path.as_os_str());
                write!(f, "trace:{}", name.to_string_lossy())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/traces")
            .join(name)
            .display()
            .to_string()
    }

    #[test]
    fn trace_formats_are_detected_or_named() {
        for (file, records) in [
            ("msr_small.csv", 10),
            ("alibaba_small.csv", 4),
            ("simple_small.csv", 10),
        ] {
            let a: Access = format!("trace:{}", fixture(file)).parse().expect(file);
            let Access::Trace { trace, .. } = &a else {
                panic!("{file}: not a trace")
            };
            assert_eq!(trace.len(), records, "{file}");
            assert_eq!(a.to_string(), format!("trace:{file}"));
        }
        let a: Access = format!("trace:alibaba:7:{}", fixture("alibaba_small.csv"))
            .parse()
            .expect("disk 7");
        assert!(matches!(&a, Access::Trace { trace, .. } if trace.len() == 2));
        let e = format!("trace:msr:{}", fixture("simple_small.csv"))
            .parse::<Access>()
            .expect_err("simple is not msr");
        assert!(matches!(e, AccessError::Trace { .. }), "{e}");
        let e = "trace:/no/such/file"
            .parse::<Access>()
            .expect_err("missing");
        assert!(e.to_string().contains("/no/such/file"), "{e}");
        let e = "fast".parse::<Access>().expect_err("unknown");
        assert!(e.to_string().contains("trace:FILE"), "{e}");
        assert_eq!(
            "zipf:1.2".parse::<Access>().expect("synthetic"),
            Access::Synthetic("zipf:1.2".parse().expect("zipf"))
        );
    }
}
