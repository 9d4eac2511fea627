//! Workload configuration and the per-tenant operation streams.
//!
//! A [`Workload`] is N tenants, each on its own volume with its own stream seeded from
//! `(seed, tenant)`, so adding a tenant or changing one tenant's mix never changes what
//! another tenant does. Streams only *produce* operations; executors decide how many to
//! keep in flight (`queue_depth` is carried for them) and when to issue them.
//!
//! Pacing is clock-free: each operation carries `not_before_ns`, the earliest time since
//! the start of the run at which it may be issued (from the tenant's rate limit and, for
//! trace replay with recorded timing, the trace's timestamps). An executor compares that
//! with its own [`Clock`](crate::Clock), or ignores it to run as fast as possible.

use std::sync::Arc;

use crate::offsets::{stream_id, OffsetGen};
use crate::rng::{derive_seed, Taus88};
use crate::spec::Distribution;
use crate::trace::{fit_record, Trace, TraceFit, TraceOp, TraceTiming};

/// Most tenants one workload may have.
pub const TENANTS_MAX: u32 = 4096;
/// Largest block size (fio's limit on `bs` is far larger; nothing in Shale needs more).
pub const BLOCK_BYTES_MAX: u64 = 64 << 20;
/// Block sizes are multiples of this (the smallest logical block any device reports).
pub const BLOCK_ALIGN_BYTES: u64 = 512;
/// Most operations an executor may keep in flight per tenant.
pub const QUEUE_DEPTH_MAX: u32 = 65_536;

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoKind {
    Read,
    Write,
    Trim,
}

/// One operation on one tenant's volume. `offset` is relative to the start of the volume;
/// `offset` and `len` are multiples of the block size, and `offset + len` is inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoOp {
    pub tenant: u32,
    pub kind: IoKind,
    pub offset: u64,
    pub len: u64,
    /// Earliest issue time, in nanoseconds since the start of the run.
    pub not_before_ns: u64,
}

/// A per-tenant rate limit (fio `rate` / `rate_iops`), measured from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    OpsPerSec(u64),
    BytesPerSec(u64),
}

/// When a tenant's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAfter {
    /// After this many operations.
    Ops(u64),
    /// Once this many bytes (reads, writes and trims) have been issued; the last
    /// operation may overshoot by less than one operation (as fio's `io_size`).
    Bytes(u64),
    /// Once this many bytes have been written.
    WriteBytes(u64),
    /// After this many passes: a synthetic pass is `volume_bytes / bs` operations (for
    /// `uniform`, every block exactly once); a trace pass is the whole trace.
    Passes(u64),
}

/// Where a tenant's operations come from.
#[derive(Debug, Clone)]
pub enum Source {
    Synthetic(Distribution),
    /// Tenant `i` replays `traces[i % traces.len()]`, looping until its stop condition.
    Trace {
        traces: Vec<Arc<Trace>>,
        fit: TraceFit,
        timing: TraceTiming,
    },
}

/// Everything that determines a workload. Two workloads built from equal configurations
/// produce identical operation sequences.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub source: Source,
    /// I/O size of synthetic workloads and the alignment of replayed traces.
    pub block_bytes: u64,
    /// Percentage of synthetic operations that are reads (0..=100). Traces carry their
    /// own mix.
    pub read_pct: u8,
    pub tenants: u32,
    /// Size of each tenant's volume.
    pub volume_bytes: u64,
    pub seed: u64,
    pub stop: StopAfter,
    pub rate: Option<RateLimit>,
    /// For executors: operations a tenant keeps in flight. Does not change the stream.
    pub queue_depth: u32,
}

impl WorkloadConfig {
    /// A write-only synthetic workload with one tenant, QD 1, no rate limit, one pass.
    pub fn new(dist: Distribution, block_bytes: u64, volume_bytes: u64) -> WorkloadConfig {
        WorkloadConfig {
            source: Source::Synthetic(dist),
            block_bytes,
            read_pct: 0,
            tenants: 1,
            volume_bytes,
            seed: 0,
            stop: StopAfter::Passes(1),
            rate: None,
            queue_depth: 1,
        }
    }

    /// Block-size slots in each volume.
    pub fn slots(&self) -> u64 {
        self.volume_bytes / self.block_bytes.max(1)
    }

    /// Checks every field; [`Workload::new`] calls this.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bs = self.block_bytes;
        if bs == 0 {
            return Err(ConfigError::ZeroBlockSize);
        }
        if !bs.is_multiple_of(BLOCK_ALIGN_BYTES) {
            return Err(ConfigError::BlockSizeUnaligned {
                block_bytes: bs,
                align: BLOCK_ALIGN_BYTES,
            });
        }
        if bs > BLOCK_BYTES_MAX {
            return Err(ConfigError::BlockSizeTooLarge {
                block_bytes: bs,
                max: BLOCK_BYTES_MAX,
            });
        }
        if self.volume_bytes < bs {
            return Err(ConfigError::VolumeSmallerThanBlock {
                volume_bytes: self.volume_bytes,
                block_bytes: bs,
            });
        }
        if self.read_pct > 100 {
            return Err(ConfigError::ReadPctOutOfRange {
                read_pct: self.read_pct,
            });
        }
        if self.tenants == 0 || self.tenants > TENANTS_MAX {
            return Err(ConfigError::TenantCount {
                tenants: self.tenants,
                max: TENANTS_MAX,
            });
        }
        if self.queue_depth == 0 || self.queue_depth > QUEUE_DEPTH_MAX {
            return Err(ConfigError::QueueDepth {
                queue_depth: self.queue_depth,
                max: QUEUE_DEPTH_MAX,
            });
        }
        match self.rate {
            Some(RateLimit::OpsPerSec(0)) | Some(RateLimit::BytesPerSec(0)) => {
                return Err(ConfigError::ZeroRate)
            }
            _ => {}
        }
        match &self.source {
            Source::Synthetic(_) => {
                if self.read_pct == 100 && matches!(self.stop, StopAfter::WriteBytes(n) if n > 0) {
                    return Err(ConfigError::StopNeverReached);
                }
            }
            Source::Trace { traces, .. } => {
                if traces.is_empty() {
                    return Err(ConfigError::NoTrace);
                }
                if let StopAfter::WriteBytes(n) = self.stop {
                    if n > 0
                        && traces
                            .iter()
                            .any(|t| !t.records().iter().any(|r| r.op == TraceOp::Write))
                    {
                        return Err(ConfigError::StopNeverReached);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Why a workload configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("block size is 0")]
    ZeroBlockSize,
    #[error("block size {block_bytes} is not a multiple of {align} bytes")]
    BlockSizeUnaligned { block_bytes: u64, align: u64 },
    #[error("block size {block_bytes} is larger than the limit of {max} bytes")]
    BlockSizeTooLarge { block_bytes: u64, max: u64 },
    #[error("volume of {volume_bytes} bytes is smaller than one block of {block_bytes} bytes")]
    VolumeSmallerThanBlock { volume_bytes: u64, block_bytes: u64 },
    #[error("read percentage {read_pct} is above 100")]
    ReadPctOutOfRange { read_pct: u8 },
    #[error("{tenants} tenants: need 1..={max}")]
    TenantCount { tenants: u32, max: u32 },
    #[error("queue depth {queue_depth}: need 1..={max}")]
    QueueDepth { queue_depth: u32, max: u32 },
    #[error("rate limit of 0 would never issue anything")]
    ZeroRate,
    #[error("the stop condition counts written bytes but the workload never writes")]
    StopNeverReached,
    #[error("trace replay without a trace")]
    NoTrace,
}

/// What [`TenantStream::poll`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPoll {
    /// Issue this now.
    Ready(IoOp),
    /// The next operation may not be issued before this time (ns since the start).
    NotBefore(u64),
    /// The stream has met its stop condition.
    Finished,
}

/// Counts of what a stream has produced so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamProgress {
    pub ops: u64,
    pub bytes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub trim_bytes: u64,
}

#[derive(Debug, Clone)]
enum Producer {
    Synthetic {
        offsets: OffsetGen,
        rwmix: Taus88,
        read_pct: u8,
    },
    Trace {
        trace: Arc<Trace>,
        fit: TraceFit,
        timing: TraceTiming,
        pos: usize,
        loops: u64,
    },
}

/// One tenant's deterministic operation stream.
#[derive(Debug, Clone)]
pub struct TenantStream {
    tenant: u32,
    producer: Producer,
    block_bytes: u64,
    usable_bytes: u64,
    slots: u64,
    stop: StopAfter,
    rate: Option<RateLimit>,
    progress: StreamProgress,
    peeked: Option<IoOp>,
}

impl TenantStream {
    fn new(cfg: &WorkloadConfig, tenant: u32) -> TenantStream {
        let tenant_seed = derive_seed(cfg.seed, u64::from(tenant));
        let slots = cfg.slots();
        let producer = match &cfg.source {
            Source::Synthetic(dist) => Producer::Synthetic {
                offsets: OffsetGen::new(dist, slots, tenant_seed),
                rwmix: Taus88::from_seed(tenant_seed, stream_id::RWMIX),
                read_pct: cfg.read_pct,
            },
            Source::Trace {
                traces,
                fit,
                timing,
            } => Producer::Trace {
                trace: Arc::clone(&traces[tenant as usize % traces.len()]),
                fit: *fit,
                timing: *timing,
                pos: 0,
                loops: 0,
            },
        };
        TenantStream {
            tenant,
            producer,
            block_bytes: cfg.block_bytes,
            usable_bytes: slots * cfg.block_bytes,
            slots,
            stop: cfg.stop,
            rate: cfg.rate,
            progress: StreamProgress::default(),
            peeked: None,
        }
    }

    pub fn tenant(&self) -> u32 {
        self.tenant
    }

    /// Bytes of the volume the stream may touch (`slots × bs`).
    pub fn usable_bytes(&self) -> u64 {
        self.usable_bytes
    }

    /// What has been produced so far (an operation held by `poll` counts as produced).
    pub fn progress(&self) -> StreamProgress {
        self.progress
    }

    fn finished(&self) -> bool {
        let p = &self.progress;
        match self.stop {
            StopAfter::Ops(n) => p.ops >= n,
            StopAfter::Bytes(n) => p.bytes >= n,
            StopAfter::WriteBytes(n) => p.write_bytes >= n,
            StopAfter::Passes(n) => match &self.producer {
                Producer::Synthetic { .. } => p.ops >= n.saturating_mul(self.slots),
                Producer::Trace { loops, .. } => *loops >= n,
            },
        }
    }

    fn rate_not_before(&self) -> u64 {
        const NS_PER_SEC: u128 = 1_000_000_000;
        let (done, rate) = match self.rate {
            None => return 0,
            Some(RateLimit::OpsPerSec(r)) => (self.progress.ops, r),
            Some(RateLimit::BytesPerSec(r)) => (self.progress.bytes, r),
        };
        let ns = u128::from(done) * NS_PER_SEC / u128::from(rate.max(1));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn produce(&mut self) -> Option<IoOp> {
        if self.finished() {
            return None;
        }
        let rate_ns = self.rate_not_before();
        let (kind, offset, len, time_ns) = match &mut self.producer {
            Producer::Synthetic {
                offsets,
                rwmix,
                read_pct,
            } => {
                let kind = match *read_pct {
                    0 => IoKind::Write,
                    100 => IoKind::Read,
                    pct => {
                        // fio's rwmix draw (per operation here; fio switches direction
                        // in bursts, which does not change the mix).
                        if rwmix.between(1, 100) <= u32::from(pct) {
                            IoKind::Read
                        } else {
                            IoKind::Write
                        }
                    }
                };
                let slot = offsets.next_slot();
                (kind, slot * self.block_bytes, self.block_bytes, 0)
            }
            Producer::Trace {
                trace,
                fit,
                timing,
                pos,
                loops,
            } => {
                let rec = trace.records()[*pos];
                let (offset, len) = fit_record(
                    &rec,
                    *fit,
                    trace.extent_bytes(),
                    self.usable_bytes,
                    self.block_bytes,
                );
                let time_ns = match (timing, rec.at_ns) {
                    (TraceTiming::Recorded, Some(at)) => {
                        at.saturating_add(loops.saturating_mul(trace.span_ns()))
                    }
                    _ => 0,
                };
                *pos += 1;
                if *pos == trace.len() {
                    *pos = 0;
                    *loops += 1;
                }
                let kind = match rec.op {
                    TraceOp::Read => IoKind::Read,
                    TraceOp::Write => IoKind::Write,
                    TraceOp::Trim => IoKind::Trim,
                };
                (kind, offset, len, time_ns)
            }
        };
        let p = &mut self.progress;
        p.ops += 1;
        p.bytes += len;
        match kind {
            IoKind::Read => p.read_bytes += len,
            IoKind::Write => p.write_bytes += len,
            IoKind::Trim => p.trim_bytes += len,
        }
        Some(IoOp {
            tenant: self.tenant,
            kind,
            offset,
            len,
            not_before_ns: rate_ns.max(time_ns),
        })
    }

    /// The next operation regardless of time (its `not_before_ns` says when it is due).
    pub fn next_op(&mut self) -> Option<IoOp> {
        self.peeked.take().or_else(|| self.produce())
    }

    /// The next operation if it is due at `now_ns` (nanoseconds since the start of the
    /// run, read from the executor's clock).
    pub fn poll(&mut self, now_ns: u64) -> StreamPoll {
        let op = match self.peeked.take().or_else(|| self.produce()) {
            Some(op) => op,
            None => return StreamPoll::Finished,
        };
        if op.not_before_ns <= now_ns {
            StreamPoll::Ready(op)
        } else {
            self.peeked = Some(op);
            StreamPoll::NotBefore(op.not_before_ns)
        }
    }
}

impl Iterator for TenantStream {
    type Item = IoOp;
    fn next(&mut self) -> Option<IoOp> {
        self.next_op()
    }
}

/// All tenants of one workload.
#[derive(Debug, Clone)]
pub struct Workload {
    streams: Vec<TenantStream>,
    queue_depth: u32,
    cursor: usize,
}

impl Workload {
    pub fn new(cfg: &WorkloadConfig) -> Result<Workload, ConfigError> {
        cfg.validate()?;
        Ok(Workload {
            streams: (0..cfg.tenants)
                .map(|t| TenantStream::new(cfg, t))
                .collect(),
            queue_depth: cfg.queue_depth,
            cursor: 0,
        })
    }

    pub fn queue_depth(&self) -> u32 {
        self.queue_depth
    }

    pub fn streams(&self) -> &[TenantStream] {
        &self.streams
    }

    pub fn streams_mut(&mut self) -> &mut [TenantStream] {
        &mut self.streams
    }

    pub fn into_streams(self) -> Vec<TenantStream> {
        self.streams
    }

    /// Sum of every stream's progress.
    pub fn progress(&self) -> StreamProgress {
        self.streams
            .iter()
            .fold(StreamProgress::default(), |mut acc, s| {
                let p = s.progress();
                acc.ops += p.ops;
                acc.bytes += p.bytes;
                acc.read_bytes += p.read_bytes;
                acc.write_bytes += p.write_bytes;
                acc.trim_bytes += p.trim_bytes;
                acc
            })
    }

    /// One operation from each unfinished tenant in turn (ignoring time); `None` when
    /// every tenant has finished.
    pub fn next_round_robin(&mut self) -> Option<IoOp> {
        let n = self.streams.len();
        for _ in 0..n {
            let i = self.cursor;
            self.cursor = (self.cursor + 1) % n;
            if let Some(op) = self.streams[i].next_op() {
                return Some(op);
            }
        }
        None
    }
}

impl Iterator for Workload {
    type Item = IoOp;
    fn next(&mut self) -> Option<IoOp> {
        self.next_round_robin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse_simple;

    fn cfg(d: &str) -> WorkloadConfig {
        WorkloadConfig::new(d.parse().expect("spec"), 4096, 4096 * 1000)
    }

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() {
        for d in ["uniform", "random", "zipf:1.2", "zoned:80/20:20/80"] {
            let mut c = cfg(d);
            c.tenants = 3;
            c.read_pct = 30;
            c.stop = StopAfter::Ops(500);
            let a: Vec<IoOp> = Workload::new(&c).expect("cfg").collect();
            let b: Vec<IoOp> = Workload::new(&c).expect("cfg").collect();
            assert_eq!(a, b, "{d}");
            c.seed = 1;
            let other: Vec<IoOp> = Workload::new(&c).expect("cfg").collect();
            assert_ne!(a, other, "{d}");
        }
    }

    #[test]
    fn tenants_are_independent_of_each_other() {
        let mut c = cfg("random");
        c.stop = StopAfter::Ops(200);
        c.tenants = 2;
        let two: Vec<IoOp> = Workload::new(&c).expect("cfg").collect();
        c.tenants = 5;
        c.read_pct = 0;
        let five: Vec<IoOp> = Workload::new(&c).expect("cfg").collect();
        let t1 = |v: &[IoOp]| -> Vec<u64> {
            v.iter()
                .filter(|o| o.tenant == 1)
                .map(|o| o.offset)
                .collect()
        };
        assert_eq!(t1(&two), t1(&five));
        let t0: Vec<u64> = two
            .iter()
            .filter(|o| o.tenant == 0)
            .map(|o| o.offset)
            .collect();
        assert_ne!(t0, t1(&two));
    }

    #[test]
    fn round_robin_interleaves_tenants() {
        let mut c = cfg("seq");
        c.tenants = 3;
        c.stop = StopAfter::Ops(2);
        let tenants: Vec<u32> = Workload::new(&c).expect("cfg").map(|o| o.tenant).collect();
        assert_eq!(tenants, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn stop_conditions() {
        let mut c = cfg("uniform");
        c.block_bytes = 8192;
        c.stop = StopAfter::Bytes(8192 * 10 + 1);
        assert_eq!(Workload::new(&c).expect("cfg").count(), 11);
        c.stop = StopAfter::Passes(2);
        assert_eq!(Workload::new(&c).expect("cfg").count(), 1000);
        c.read_pct = 50;
        c.stop = StopAfter::WriteBytes(8192 * 100);
        let mut w = Workload::new(&c).expect("cfg");
        let ops: Vec<IoOp> = w.by_ref().collect();
        let writes = ops.iter().filter(|o| o.kind == IoKind::Write).count();
        assert_eq!(writes, 100);
        assert_eq!(w.progress().write_bytes, 8192 * 100);
        let reads = ops.len() - writes;
        assert!((60..150).contains(&reads), "reads {reads}");
    }

    #[test]
    fn offsets_are_aligned_and_inside_the_volume() {
        let mut c = cfg("random");
        c.block_bytes = 65536;
        c.volume_bytes = 65536 * 7 + 4096;
        c.stop = StopAfter::Ops(1000);
        for op in Workload::new(&c).expect("cfg") {
            assert_eq!(op.offset % 65536, 0);
            assert!(op.offset + op.len <= 65536 * 7);
        }
    }

    #[test]
    fn rate_limit_spaces_operations() {
        let mut c = cfg("seq");
        c.stop = StopAfter::Ops(4);
        c.rate = Some(RateLimit::OpsPerSec(1000));
        let t: Vec<u64> = Workload::new(&c)
            .expect("cfg")
            .map(|o| o.not_before_ns)
            .collect();
        assert_eq!(t, [0, 1_000_000, 2_000_000, 3_000_000]);
        c.rate = Some(RateLimit::BytesPerSec(4096 * 2));
        let t: Vec<u64> = Workload::new(&c)
            .expect("cfg")
            .map(|o| o.not_before_ns)
            .collect();
        assert_eq!(t, [0, 500_000_000, 1_000_000_000, 1_500_000_000]);
    }

    #[test]
    fn poll_holds_an_early_operation() {
        let mut c = cfg("seq");
        c.stop = StopAfter::Ops(2);
        c.rate = Some(RateLimit::OpsPerSec(10));
        let mut w = Workload::new(&c).expect("cfg");
        let s = &mut w.streams_mut()[0];
        assert!(matches!(s.poll(0), StreamPoll::Ready(op) if op.offset == 0));
        assert_eq!(s.poll(50_000_000), StreamPoll::NotBefore(100_000_000));
        assert!(matches!(s.poll(100_000_000), StreamPoll::Ready(op) if op.offset == 4096));
        assert_eq!(s.poll(u64::MAX), StreamPoll::Finished);
    }

    #[test]
    fn trace_replay_loops_and_fits() {
        let t = parse_simple("w,0,4096\nr,1048576,8192\nt,4000,200\n".as_bytes()).expect("trace");
        let mut c = cfg("seq");
        c.source = Source::Trace {
            traces: vec![Arc::new(t)],
            fit: TraceFit::Modulo,
            timing: TraceTiming::AsFastAsPossible,
        };
        c.volume_bytes = 1 << 19;
        c.stop = StopAfter::Passes(2);
        let ops: Vec<IoOp> = Workload::new(&c).expect("cfg").collect();
        assert_eq!(ops.len(), 6);
        assert_eq!(
            (ops[1].kind, ops[1].offset, ops[1].len),
            (IoKind::Read, 0, 8192)
        );
        assert_eq!(
            (ops[2].kind, ops[2].offset, ops[2].len),
            (IoKind::Trim, 0, 8192)
        );
        assert_eq!(ops[3], ops[0]);
    }

    #[test]
    fn bad_configurations_are_typed_errors() {
        let check = |f: &dyn Fn(&mut WorkloadConfig), want: fn(&ConfigError) -> bool| {
            let mut c = cfg("uniform");
            f(&mut c);
            let e = Workload::new(&c).expect_err("should be rejected");
            assert!(want(&e), "{e}");
        };
        check(&|c| c.block_bytes = 0, |e| {
            matches!(e, ConfigError::ZeroBlockSize)
        });
        check(&|c| c.block_bytes = 1000, |e| {
            matches!(e, ConfigError::BlockSizeUnaligned { .. })
        });
        check(&|c| c.block_bytes = 1 << 30, |e| {
            matches!(e, ConfigError::BlockSizeTooLarge { .. })
        });
        check(&|c| c.volume_bytes = 2048, |e| {
            matches!(e, ConfigError::VolumeSmallerThanBlock { .. })
        });
        check(&|c| c.read_pct = 101, |e| {
            matches!(e, ConfigError::ReadPctOutOfRange { .. })
        });
        check(&|c| c.tenants = 0, |e| {
            matches!(e, ConfigError::TenantCount { .. })
        });
        check(&|c| c.queue_depth = 0, |e| {
            matches!(e, ConfigError::QueueDepth { .. })
        });
        check(&|c| c.rate = Some(RateLimit::BytesPerSec(0)), |e| {
            matches!(e, ConfigError::ZeroRate)
        });
        check(
            &|c| {
                c.read_pct = 100;
                c.stop = StopAfter::WriteBytes(1);
            },
            |e| matches!(e, ConfigError::StopNeverReached),
        );
        check(
            &|c| {
                c.source = Source::Trace {
                    traces: vec![],
                    fit: TraceFit::Modulo,
                    timing: TraceTiming::Recorded,
                }
            },
            |e| matches!(e, ConfigError::NoTrace),
        );
    }
}
