//! Drives a system under test through preconditioning and measured workloads.
//!
//! Tenants are interleaved round-robin, one operation at a time (fio runs one job per
//! tenant; for a system that completes requests in order of submission this interleave is
//! what a scheduler would produce on average). Counters are reset between
//! preconditioning and measurement, so every reported figure covers the measured
//! workload alone.
//!
//! A measured workload is a [`MixSpec`]: groups of tenants, each group with its own
//! distribution, block size and read share (the seeds' Figure 14 runs 7 writers beside
//! one reader; Figure 18 half sequential, half random tenants). Tenants of a read-only
//! group run for as long as the writers do. [`run`] is one preconditioned measurement;
//! the suites call [`precondition`] once and [`measure`] for several workloads in turn.

use std::time::{Duration, Instant};

use serde::Serialize;
use shale_workload::{
    Distribution, IoKind, StopAfter, StreamProgress, TenantStream, Workload, WorkloadConfig,
};

use crate::access::Access;
use crate::config::BenchConfig;
use crate::system::{DeviceReport, RunError, SystemUnderTest};

/// The measured workload of `shale bench run`: one group of every tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    pub workload: Access,
    pub block_bytes: u64,
    pub read_pct: u8,
    pub seed: u64,
}

/// Tenants doing the same thing.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    /// Number of tenants in the group; groups take consecutive tenants.
    pub tenants: u32,
    pub workload: Access,
    pub block_bytes: u64,
    pub read_pct: u8,
    /// The group runs beside the others until they are done, at the pace taking
    /// turns gives it (one request per turn), instead of to its own share of the
    /// writes: a tenant writing less than its neighbours. (A read-only group beside
    /// writers always runs so.)
    pub background: bool,
}

impl GroupSpec {
    /// Whether the group's end ends the phase, in `mix`: writers do (readers beside
    /// them run until they are done), unless every writer is in the background,
    /// when the readers do.
    fn ends_phase(&self, mix: &MixSpec) -> bool {
        if mix.groups.iter().all(|g| g.background) {
            return true;
        }
        let writers_end = mix.groups.iter().any(|g| !g.background && g.read_pct < 100);
        !self.background && (!writers_end || self.read_pct < 100)
    }

    /// Whether the group ends the phase by bytes read (it reads only, and ends it).
    fn ends_by_reads(&self, mix: &MixSpec) -> bool {
        self.read_pct >= 100 && self.ends_phase(mix)
    }
}

/// A measured workload: groups covering every tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct MixSpec {
    /// Name in reports (`uniform`, `7x uniform 4k w + 1x uniform 64k r`).
    pub name: String,
    pub groups: Vec<GroupSpec>,
    pub seed: u64,
}

impl MixSpec {
    /// Every tenant doing `spec`.
    pub fn single(spec: &RunSpec, tenants: u32) -> MixSpec {
        MixSpec {
            name: spec.workload.to_string(),
            groups: vec![GroupSpec {
                tenants,
                workload: spec.workload.clone(),
                block_bytes: spec.block_bytes,
                read_pct: spec.read_pct,
                background: false,
            }],
            seed: spec.seed,
        }
    }

    /// The group that names the mix's block size and read share in reports: the first
    /// group that writes, else the first.
    pub fn primary(&self) -> Option<&GroupSpec> {
        self.groups
            .iter()
            .find(|g| g.read_pct < 100)
            .or_else(|| self.groups.first())
    }

    fn tenants(&self) -> u32 {
        self.groups.iter().map(|g| g.tenants).sum()
    }
}

/// Where the runner reports how far it got (a progress bar, or nothing).
pub trait Progress {
    /// A phase starts; `total_bytes` is what its stop condition counts.
    fn phase(&mut self, name: &str, total_bytes: u64);
    fn advance(&mut self, bytes: u64);
    fn finish_phase(&mut self);
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn phase(&mut self, _name: &str, _total_bytes: u64) {}
    fn advance(&mut self, _bytes: u64) {}
    fn finish_phase(&mut self) {}
}

/// One point of a time series, counted from the start of the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub user_written: u64,
    pub user_read: u64,
    /// The bottleneck model's clock: the busiest device's busy time so far.
    pub emulated_s: f64,
    pub capacity_written: u64,
    pub cache_written: u64,
    /// The system's background traffic by cause (`SystemUnderTest::traffic`).
    pub traffic: Vec<(String, u64)>,
}

/// What a run measured, before any arithmetic.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub system: String,
    pub config: BenchConfig,
    pub mix: MixSpec,
    pub volume_count: u32,
    pub volume_bytes: u64,
    /// What the tenants did during the measured workload.
    pub user: StreamProgress,
    /// Every device's figures for the measured workload.
    pub devices: Vec<DeviceReport>,
    pub traffic: Vec<crate::system::Traffic>,
    pub l2p: Option<crate::system::L2pStats>,
    /// Samples every `sample_every_bytes` of user writes (empty if not asked for).
    pub series: Vec<Sample>,
    pub precondition_wall: Duration,
    pub measure_wall: Duration,
}

/// Operations between progress updates.
const PROGRESS_EVERY_OPS: u64 = 4096;

/// Sub-stream seeds of the phases, so the measured stream differs from the
/// preconditioning streams for every seed.
const SEQ_PHASE: u64 = 0x5e9_0001;
const RANDOM_PHASE: u64 = 0x5e9_0002;
const RAMP_PHASE: u64 = 0x5e9_0003;

/// Takes samples of a system's counters every `every_bytes` of user writes.
struct Sampler {
    every_bytes: u64,
    next_at: u64,
    samples: Vec<Sample>,
}

impl Sampler {
    fn take(&mut self, sut: &dyn SystemUnderTest, user: &StreamProgress) {
        let devices = sut.devices();
        let sum = |role: crate::system::DeviceRole| -> u64 {
            devices
                .iter()
                .filter(|d| d.role == role)
                .map(|d| d.stats.host_bytes_written)
                .sum()
        };
        let busy_ns = devices.iter().map(|d| d.stats.busy_ns).max().unwrap_or(0);
        self.samples.push(Sample {
            user_written: user.write_bytes,
            user_read: user.read_bytes,
            emulated_s: busy_ns as f64 * 1e-9,
            capacity_written: sum(crate::system::DeviceRole::Capacity),
            cache_written: sum(crate::system::DeviceRole::Cache),
            traffic: sut
                .traffic()
                .into_iter()
                .map(|t| (t.name.to_string(), t.bytes))
                .collect(),
        });
    }
}

/// Tenant streams of one phase and the round-robin over them.
struct Streams {
    streams: Vec<TenantStream>,
    /// Streams whose end ends the phase (the others run alongside).
    ends_phase: Vec<bool>,
    finished: Vec<bool>,
    /// Phase-ending streams not yet finished.
    ending_left: usize,
    cursor: usize,
}

impl Streams {
    fn single(cfg: &WorkloadConfig) -> Result<Streams, RunError> {
        let streams = Workload::new(cfg)?.into_streams();
        let n = streams.len();
        Ok(Streams {
            streams,
            ends_phase: vec![true; n],
            finished: vec![false; n],
            ending_left: n,
            cursor: 0,
        })
    }

    /// Stream `t` of group `g` is built as tenant `t` of a workload of every tenant
    /// doing `g`, so each tenant's stream depends only on its own group and the seed.
    fn mixed(
        mix: &MixSpec,
        base: &dyn Fn(&GroupSpec) -> WorkloadConfig,
        target_bytes: u64,
    ) -> Result<Streams, RunError> {
        let tenants = mix.tenants();
        let all_read = mix.groups.iter().all(|g| g.read_pct >= 100);
        let mut streams = Vec::new();
        let mut ends_phase = Vec::new();
        let mut first = 0u32;
        for g in &mix.groups {
            let mut w = base(g);
            w.tenants = tenants;
            w.read_pct = g.read_pct;
            let ends = g.ends_phase(mix);
            // A read-only group beside writers runs until they finish.
            w.stop = if all_read || g.ends_by_reads(mix) {
                StopAfter::Bytes(target_bytes)
            } else if ends {
                StopAfter::WriteBytes(target_bytes)
            } else {
                StopAfter::Bytes(u64::MAX)
            };
            let mut group: Vec<TenantStream> = Workload::new(&w)?
                .into_streams()
                .into_iter()
                .skip(first as usize)
                .take(g.tenants as usize)
                .collect();
            ends_phase.extend(std::iter::repeat_n(ends, group.len()));
            streams.append(&mut group);
            first += g.tenants;
        }
        let n = streams.len();
        let ending_left = ends_phase.iter().filter(|&&e| e).count();
        Ok(Streams {
            streams,
            ends_phase,
            finished: vec![false; n],
            ending_left,
            cursor: 0,
        })
    }

    fn next(&mut self) -> Option<shale_workload::IoOp> {
        let n = self.streams.len();
        for _ in 0..n {
            let i = self.cursor;
            self.cursor = (i + 1) % n;
            if self.finished[i] || (!self.ends_phase[i] && self.ending_left == 0) {
                continue;
            }
            match self.streams[i].next_op() {
                Some(op) => return Some(op),
                None => {
                    self.finished[i] = true;
                    if self.ends_phase[i] {
                        self.ending_left -= 1;
                    }
                }
            }
        }
        None
    }

    fn progress(&self) -> StreamProgress {
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
}

/// One phase: runs `streams` to their end against `sut`.
fn run_phase(
    sut: &mut dyn SystemUnderTest,
    mut streams: Streams,
    count_writes_only: bool,
    name: &str,
    total_bytes: u64,
    progress: &mut dyn Progress,
    mut sampler: Option<&mut Sampler>,
) -> Result<StreamProgress, RunError> {
    progress.phase(name, total_bytes);
    let mut pending_bytes = 0u64;
    let mut ops = 0u64;
    let mut written = 0u64;
    let mut read = 0u64;
    while let Some(op) = streams.next() {
        sut.submit(&op)?;
        match op.kind {
            IoKind::Write => written += op.len,
            IoKind::Read => read += op.len,
            IoKind::Trim => {}
        }
        if !count_writes_only || op.kind == IoKind::Write {
            pending_bytes += op.len;
        }
        ops += 1;
        if let Some(s) = sampler.as_deref_mut() {
            if written >= s.next_at {
                s.next_at = written + s.every_bytes;
                let p = StreamProgress {
                    write_bytes: written,
                    read_bytes: read,
                    ..StreamProgress::default()
                };
                s.take(sut, &p);
            }
        }
        if ops.is_multiple_of(PROGRESS_EVERY_OPS) {
            progress.advance(pending_bytes);
            pending_bytes = 0;
        }
    }
    sut.drain()?;
    let done = streams.progress();
    if let Some(s) = sampler {
        s.take(sut, &done);
    }
    progress.advance(pending_bytes);
    progress.finish_phase();
    Ok(done)
}

fn per_tenant(cfg: &BenchConfig, tenants: u32, multiple: u64) -> u64 {
    multiple
        .saturating_mul(cfg.capacity_bytes)
        .div_ceil(u64::from(tenants.max(1)))
}

/// Preconditions `sut` as `cfg` says (sequential passes, then random writes).
pub fn precondition(
    sut: &mut dyn SystemUnderTest,
    cfg: &BenchConfig,
    seed: u64,
    progress: &mut dyn Progress,
) -> Result<Duration, RunError> {
    let started = Instant::now();
    let tenants = sut.volume_count();
    let volume_bytes = sut.volume_bytes();
    let base = |dist: Distribution, block_bytes: u64, stop: StopAfter, seed: u64| {
        let mut w = WorkloadConfig::new(dist, block_bytes, volume_bytes);
        w.tenants = tenants;
        w.queue_depth = cfg.queue_depth;
        w.stop = stop;
        w.seed = seed;
        w
    };
    if let Some(pre) = &cfg.precondition {
        if pre.seq_passes > 0 {
            let bs = pre.seq_block_bytes.min(volume_bytes);
            let w = base(
                Distribution::Seq,
                bs,
                StopAfter::Passes(pre.seq_passes),
                seed ^ SEQ_PHASE,
            );
            let total = pre.seq_passes * u64::from(tenants) * w.slots() * bs;
            run_phase(
                sut,
                Streams::single(&w)?,
                false,
                "precondition: sequential",
                total,
                progress,
                None,
            )?;
        }
        if pre.random_capacity_multiple > 0 {
            let bs = pre.random_block_bytes.min(volume_bytes);
            let target = per_tenant(cfg, tenants, pre.random_capacity_multiple);
            let w = base(
                pre.random_distribution.clone(),
                bs,
                StopAfter::WriteBytes(target),
                seed ^ RANDOM_PHASE,
            );
            run_phase(
                sut,
                Streams::single(&w)?,
                true,
                "precondition: random",
                target * u64::from(tenants),
                progress,
                None,
            )?;
        }
    }
    Ok(started.elapsed())
}

/// Runs `mix` on a preconditioned `sut`: the ramp (unmeasured), a counter reset, then
/// the measured phase, sampling the counters every `sample_every_bytes` of user writes
/// if asked.
pub fn measure(
    sut: &mut dyn SystemUnderTest,
    cfg: &BenchConfig,
    mix: &MixSpec,
    sample_every_bytes: Option<u64>,
    progress: &mut dyn Progress,
) -> Result<RunOutcome, RunError> {
    let tenants = sut.volume_count();
    if mix.tenants() != tenants {
        return Err(RunError::Model {
            step: "workload setup",
            reason: format!(
                "the workload has {} tenants, the system {tenants} volumes",
                mix.tenants()
            ),
        });
    }
    let volume_bytes = sut.volume_bytes();
    // Progress counts what ends the phase: the writers' bytes, or the readers'.
    let by_writes = !mix.groups.iter().any(|g| g.ends_by_reads(mix));
    let writers = mix
        .groups
        .iter()
        .filter(|g| g.ends_phase(mix))
        .map(|g| g.tenants)
        .sum::<u32>();
    // Writes of `multiple` × capacity in total, over the writing tenants.
    let target = |multiple: u64| per_tenant(cfg, writers, multiple);
    let make = |seed: u64| {
        move |g: &GroupSpec| {
            let mut w = g.workload.workload_config(g.block_bytes, volume_bytes);
            w.queue_depth = cfg.queue_depth;
            w.seed = seed;
            w
        }
    };
    let started = Instant::now();
    if cfg.ramp_capacity_multiple > 0 {
        let t = target(cfg.ramp_capacity_multiple);
        let streams = Streams::mixed(mix, &make(mix.seed ^ RAMP_PHASE), t)?;
        run_phase(
            sut,
            streams,
            by_writes,
            &format!("ramp: {}", mix.name),
            t * u64::from(writers),
            progress,
            None,
        )?;
    }
    let ramp_wall = started.elapsed();
    sut.reset_counters();

    let started = Instant::now();
    let t = target(cfg.measure_capacity_multiple);
    let streams = Streams::mixed(mix, &make(mix.seed), t)?;
    let mut sampler = sample_every_bytes.map(|every| Sampler {
        every_bytes: every.max(1),
        next_at: 0,
        samples: Vec::new(),
    });
    let user = run_phase(
        sut,
        streams,
        by_writes,
        &format!("measure: {}", mix.name),
        t * u64::from(writers),
        progress,
        sampler.as_mut(),
    )?;
    let measure_wall = started.elapsed();
    Ok(RunOutcome {
        system: sut.name().to_string(),
        config: cfg.clone(),
        mix: mix.clone(),
        volume_count: tenants,
        volume_bytes,
        user,
        devices: sut.devices(),
        traffic: sut.traffic(),
        l2p: sut.l2p(),
        series: sampler.map(|s| s.samples).unwrap_or_default(),
        precondition_wall: ramp_wall,
        measure_wall,
    })
}

/// Preconditions `sut` as `cfg` says, resets its counters, then runs `spec`.
pub fn run(
    sut: &mut dyn SystemUnderTest,
    cfg: &BenchConfig,
    spec: &RunSpec,
    progress: &mut dyn Progress,
) -> Result<RunOutcome, RunError> {
    let pre = precondition(sut, cfg, spec.seed, progress)?;
    let mix = MixSpec::single(spec, sut.volume_count());
    let mut o = measure(sut, cfg, &mix, None, progress)?;
    o.precondition_wall += pre;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Scale;
    use crate::raw::{RawConfig, RawSystem};
    use crate::report::BenchReport;
    use crate::system::DeviceRole;
    use shale_flashsim::FlashStats;

    /// Records what each phase (between counter resets) received.
    #[derive(Debug, Default)]
    struct Recorder {
        written: u64,
        read: u64,
        ops_per_tenant: Vec<u64>,
        resets: u32,
        drains: u32,
        written_before_reset: u64,
        block_sizes: Vec<u64>,
    }

    impl SystemUnderTest for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn volume_count(&self) -> u32 {
            4
        }
        fn volume_bytes(&self) -> u64 {
            4 << 20
        }
        fn sector_bytes(&self) -> u64 {
            512
        }
        fn submit(&mut self, op: &shale_workload::IoOp) -> Result<(), RunError> {
            assert!(op.offset + op.len <= self.volume_bytes());
            if self.ops_per_tenant.is_empty() {
                self.ops_per_tenant = vec![0; 4];
            }
            self.ops_per_tenant[op.tenant as usize] += 1;
            if !self.block_sizes.contains(&op.len) {
                self.block_sizes.push(op.len);
            }
            match op.kind {
                IoKind::Write => self.written += op.len,
                IoKind::Read => self.read += op.len,
                IoKind::Trim => {}
            }
            Ok(())
        }
        fn drain(&mut self) -> Result<(), RunError> {
            self.drains += 1;
            Ok(())
        }
        fn reset_counters(&mut self) {
            self.resets += 1;
            self.written_before_reset = self.written;
            self.written = 0;
            self.read = 0;
        }
        fn devices(&self) -> Vec<DeviceReport> {
            vec![DeviceReport {
                role: DeviceRole::Capacity,
                preset: "none".into(),
                stats: FlashStats {
                    host_bytes_written: self.written,
                    nand_bytes_written: self.written,
                    ..FlashStats::default()
                },
            }]
        }
    }

    fn small_config() -> BenchConfig {
        let mut c = BenchConfig::standard(Scale::Tiny);
        c.capacity_bytes = 16 << 20;
        c.tenants = 4;
        c
    }

    fn spec(workload: &str, bs: u64, read_pct: u8, seed: u64) -> RunSpec {
        RunSpec {
            workload: workload.parse().expect("spec"),
            block_bytes: bs,
            read_pct,
            seed,
        }
    }

    #[test]
    fn phases_write_what_the_configuration_says() {
        let mut r = Recorder::default();
        let cfg = small_config();
        let o = run(&mut r, &cfg, &spec("uniform", 4096, 0, 1), &mut NoProgress).expect("run");
        assert_eq!(r.resets, 1);
        // Precondition: 2 sequential passes over 4 x 4 MiB, 4 x 16 MiB random, then a
        // ramp of 1 x 16 MiB.
        assert_eq!(
            r.written_before_reset,
            2 * (16 << 20) + 4 * (16 << 20) + (16 << 20)
        );
        // Measured: 2 x capacity, split over the tenants.
        assert_eq!(o.user.write_bytes, 2 * (16 << 20));
        assert_eq!(r.written, o.user.write_bytes);
        assert!(r.block_sizes.contains(&(1 << 20)) && r.block_sizes.contains(&65536));
        assert!(r.drains >= 4);
        let per_tenant = &r.ops_per_tenant;
        assert!(
            per_tenant.iter().all(|&n| n == per_tenant[0]),
            "{per_tenant:?}"
        );
    }

    #[test]
    fn read_only_workloads_finish() {
        let mut r = Recorder::default();
        let o = run(
            &mut r,
            &small_config(),
            &spec("random", 4096, 100, 1),
            &mut NoProgress,
        )
        .expect("run");
        assert_eq!(o.user.write_bytes, 0);
        assert_eq!(o.user.read_bytes, 2 * (16 << 20));
    }

    #[test]
    fn mixed_groups_read_alongside_the_writers_and_sample() {
        let mut r = Recorder::default();
        let cfg = small_config();
        let mix = MixSpec {
            name: "3w+1r".into(),
            groups: vec![
                GroupSpec {
                    tenants: 3,
                    workload: "uniform".parse().expect("spec"),
                    block_bytes: 4096,
                    read_pct: 0,
                    background: false,
                },
                GroupSpec {
                    tenants: 1,
                    workload: "uniform".parse().expect("spec"),
                    block_bytes: 65536,
                    read_pct: 100,
                    background: false,
                },
            ],
            seed: 3,
        };
        let o = measure(&mut r, &cfg, &mix, Some(4 << 20), &mut NoProgress).expect("run");
        // 2 x capacity of writes over the 3 writers; the reader issued one read per
        // writer operation of each writer, give or take a round.
        assert!(o.user.write_bytes >= 2 * (16 << 20));
        assert!(o.user.write_bytes < 2 * (16 << 20) + 3 * 4096);
        let writer_ops = o.user.write_bytes / 4096 / 3;
        let reader_ops = o.user.read_bytes / 65536;
        assert!(
            reader_ops.abs_diff(writer_ops) <= 1,
            "{reader_ops} {writer_ops}"
        );
        assert!(o.series.len() >= 8, "{}", o.series.len());
        assert!(o
            .series
            .windows(2)
            .all(|w| w[0].user_written <= w[1].user_written));
        let mut wrong = mix.clone();
        wrong.groups[1].tenants = 2;
        assert!(measure(&mut r, &cfg, &wrong, None, &mut NoProgress).is_err());
    }

    /// A background writer takes a request per turn beside the others and stops when
    /// they do: the foreground writers write the phase's bytes, it writes its pace.
    #[test]
    fn a_background_group_writes_at_its_pace_until_the_others_end() {
        let mut r = Recorder::default();
        let mut cfg = small_config();
        cfg.ramp_capacity_multiple = 0;
        let g = |tenants, bs, background| GroupSpec {
            tenants,
            workload: "uniform".parse().expect("spec"),
            block_bytes: bs,
            read_pct: 0,
            background,
        };
        let mix = MixSpec {
            name: "3x64k + 1x4k background".into(),
            groups: vec![g(3, 65536, false), g(1, 4096, true)],
            seed: 5,
        };
        let o = measure(&mut r, &cfg, &mix, None, &mut NoProgress).expect("run");
        let foreground_ops = r.ops_per_tenant[0];
        let background_ops = r.ops_per_tenant[3];
        assert!(
            background_ops.abs_diff(foreground_ops) <= 1,
            "{background_ops} {foreground_ops}"
        );
        // 2 x capacity over the 3 foreground writers, plus the background's 4 KiB a turn.
        let foreground = 3 * foreground_ops * 65536;
        assert!((2 * (16 << 20)..2 * (16 << 20) + 3 * 65536).contains(&foreground));
        assert_eq!(o.user.write_bytes, foreground + background_ops * 4096);
        // Every group in the background: they all end the phase, as foreground ones.
        let mut all = mix.clone();
        all.groups[0].background = true;
        let o = measure(&mut r, &cfg, &all, None, &mut NoProgress).expect("run");
        assert!(o.user.write_bytes >= 2 * (16 << 20));
    }

    fn raw_run(workload: &str, bs: u64, seed: u64) -> BenchReport {
        let cfg = BenchConfig::standard(Scale::Tiny);
        let mut sut = RawSystem::new(&RawConfig {
            preset: "qlc-p5316".into(),
            capacity_bytes: cfg.capacity_bytes,
            tenants: cfg.tenants,
            host_spare_pct: 10,
        })
        .expect("raw");
        let o = run(
            &mut sut,
            &cfg,
            &spec(workload, bs, 0, seed),
            &mut NoProgress,
        )
        .expect("run");
        BenchReport::from_outcome(&o)
    }

    #[test]
    fn raw_orders_workloads_as_a_qlc_drive_does() {
        let seq = raw_run("seq", 1 << 20, 0);
        let uniform = raw_run("uniform", 4096, 0);
        let random = raw_run("random", 4096, 0);
        let big = raw_run("uniform", 65536, 0);
        for r in [&seq, &uniform, &random, &big] {
            assert_eq!(r.waf.layer, Some(1.0), "raw writes straight to the drive");
            assert!(r.bytes.user_written >= 2 * r.capacity_bytes);
        }
        let total = |r: &BenchReport| r.waf.total.expect("wrote something");
        assert!(total(&seq) <= 1.05, "seq {}", total(&seq));
        // 4 KiB writes pay the 64 KiB IU's read-modify-write on top of GC.
        assert!(total(&uniform) > 16.0, "uniform {}", total(&uniform));
        assert!(total(&random) > 16.0, "random {}", total(&random));
        assert!(total(&big) < total(&uniform) / 4.0);
        let mibs = |r: &BenchReport| r.emulated_mib_s.expect("busy");
        assert!(mibs(&seq) > 10.0 * mibs(&uniform));
    }

    #[test]
    fn raw_runs_replay_from_their_seed() {
        let a = raw_run("random", 4096, 7);
        let b = raw_run("random", 4096, 7);
        let c = raw_run("random", 4096, 8);
        assert_eq!(a.bytes, b.bytes);
        assert_ne!(a.bytes.capacity_nand, c.bytes.capacity_nand);
    }
}
