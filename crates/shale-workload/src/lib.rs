//! Workload generators for Shale's benchmarks and simulator, compatible with fio.
//!
//! Workload names mean what fio means, because the write amplification Shale reports
//! depends on the generator as much as on the translation layer:
//!
//! | name | fio job | what it does |
//! | --- | --- | --- |
//! | `seq` | `rw=write` | sequential from the start of each volume, wrapping |
//! | `uniform` | `rw=randwrite` (defaults) | every block once per pass; random order from fio's random map, with its *next free block* fallback ([`randmap`]) |
//! | `random` | `randwrite` + `norandommap` | independent uniform draws |
//! | `zipf:θ` | `random_distribution=zipf:θ` | fio's Gray et al. generator with its hash scatter ([`zipf`]); no random map |
//! | `zoned:A/R:...` | `random_distribution=zoned:...` | `A`% of accesses uniform over the next `R`% of the volume |
//!
//! Random numbers come from fio's own generator (taus88, [`rng`]). Each tenant has its own
//! streams seeded from `(seed, tenant)`; everything is deterministic from the seed.
//! Distributions match fio's; the exact offsets do not (fio seeds from file names and job
//! numbers).
//!
//! Invariants of every produced [`IoOp`]: `offset` and `len` are multiples of the block
//! size, `len > 0`, and `offset + len <= (volume_bytes / bs) × bs`.
#![forbid(unsafe_code)]

pub mod clock;
mod offsets;
pub mod randmap;
pub mod rng;
pub mod size;
pub mod spec;
pub mod stream;
pub mod trace;
pub mod zipf;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use size::{format_size, parse_size, SizeError};
pub use spec::{Distribution, SpecError, Zone, ZonedSpec};
pub use stream::{
    ConfigError, IoKind, IoOp, RateLimit, Source, StopAfter, StreamPoll, StreamProgress,
    TenantStream, Workload, WorkloadConfig, BLOCK_ALIGN_BYTES, BLOCK_BYTES_MAX, QUEUE_DEPTH_MAX,
    TENANTS_MAX,
};
pub use trace::{
    parse_msr, parse_simple, Trace, TraceError, TraceFit, TraceFormat, TraceOp, TraceRecord,
    TraceTiming,
};
