//! Drives a system under test through preconditioning and one measured workload.
//!
//! Tenants are interleaved round-robin, one operation at a time (fio runs one job per
//! tenant; for a system that completes requests in order of submission this interleave is
//! what a scheduler would produce on average). Counters are reset between
//! preconditioning and measurement, so every reported figure covers the measured
//! workload alone.

use std::time::{Duration, Instant};

use shale_workload::{Distribution, IoKind, StopAfter, StreamProgress, Workload, WorkloadConfig};

use crate::config::BenchConfig;
use crate::system::{DeviceReport, RunError, SystemUnderTest};

/// The measured workload.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    pub workload: Distribution,
    pub block_bytes: u64,
    pub read_pct: u8,
    pub seed: u64,
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

/// What a run measured, before any arithmetic.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub system: String,
    pub config: BenchConfig,
    pub spec: RunSpec,
    pub volume_count: u32,
    pub volume_bytes: u64,
    /// What the tenants did during the measured workload.
    pub user: StreamProgress,
    /// Every device's figures for the measured workload.
    pub devices: Vec<DeviceReport>,
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

/// One phase: runs `cfg` to its stop condition against `sut`.
fn run_phase(
    sut: &mut dyn SystemUnderTest,
    cfg: &WorkloadConfig,
    name: &str,
    total_bytes: u64,
    progress: &mut dyn Progress,
) -> Result<StreamProgress, RunError> {
    let mut workload = Workload::new(cfg)?;
    progress.phase(name, total_bytes);
    let count_writes_only = matches!(cfg.stop, StopAfter::WriteBytes(_));
    let mut pending_bytes = 0u64;
    let mut ops = 0u64;
    while let Some(op) = workload.next_round_robin() {
        sut.submit(&op)?;
        if !count_writes_only || op.kind == IoKind::Write {
            pending_bytes += op.len;
        }
        ops += 1;
        if ops.is_multiple_of(PROGRESS_EVERY_OPS) {
            progress.advance(pending_bytes);
            pending_bytes = 0;
        }
    }
    sut.drain()?;
    progress.advance(pending_bytes);
    progress.finish_phase();
    Ok(workload.progress())
}

/// Preconditions `sut` as `cfg` says, resets its counters, then runs `spec`.
pub fn run(
    sut: &mut dyn SystemUnderTest,
    cfg: &BenchConfig,
    spec: &RunSpec,
    progress: &mut dyn Progress,
) -> Result<RunOutcome, RunError> {
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
    let per_tenant = |multiple: u64| -> u64 {
        multiple
            .saturating_mul(cfg.capacity_bytes)
            .div_ceil(u64::from(tenants.max(1)))
    };

    let started = Instant::now();
    if let Some(pre) = &cfg.precondition {
        if pre.seq_passes > 0 {
            let bs = pre.seq_block_bytes.min(volume_bytes);
            let w = base(
                Distribution::Seq,
                bs,
                StopAfter::Passes(pre.seq_passes),
                spec.seed ^ SEQ_PHASE,
            );
            let total = pre.seq_passes * u64::from(tenants) * w.slots() * bs;
            run_phase(sut, &w, "precondition: sequential", total, progress)?;
        }
        if pre.random_capacity_multiple > 0 {
            let bs = pre.random_block_bytes.min(volume_bytes);
            let target = per_tenant(pre.random_capacity_multiple);
            let w = base(
                pre.random_distribution.clone(),
                bs,
                StopAfter::WriteBytes(target),
                spec.seed ^ RANDOM_PHASE,
            );
            run_phase(
                sut,
                &w,
                "precondition: random",
                target * u64::from(tenants),
                progress,
            )?;
        }
    }
    // A read-only workload never reaches a write target; it runs for the same bytes.
    let stop_after = |target: u64| {
        if spec.read_pct >= 100 {
            StopAfter::Bytes(target)
        } else {
            StopAfter::WriteBytes(target)
        }
    };
    if cfg.ramp_capacity_multiple > 0 {
        let target = per_tenant(cfg.ramp_capacity_multiple);
        let mut w = base(
            spec.workload.clone(),
            spec.block_bytes,
            stop_after(target),
            spec.seed ^ RAMP_PHASE,
        );
        w.read_pct = spec.read_pct;
        run_phase(
            sut,
            &w,
            &format!("ramp: {}", spec.workload),
            target * u64::from(tenants),
            progress,
        )?;
    }
    let precondition_wall = started.elapsed();
    sut.reset_counters();

    let started = Instant::now();
    let target = per_tenant(cfg.measure_capacity_multiple);
    let mut w = base(
        spec.workload.clone(),
        spec.block_bytes,
        stop_after(target),
        spec.seed,
    );
    w.read_pct = spec.read_pct;
    let user = run_phase(
        sut,
        &w,
        &format!("measure: {}", spec.workload),
        target * u64::from(tenants),
        progress,
    )?;
    let measure_wall = started.elapsed();

    Ok(RunOutcome {
        system: sut.name().to_string(),
        config: cfg.clone(),
        spec: spec.clone(),
        volume_count: tenants,
        volume_bytes,
        user,
        devices: sut.devices(),
        precondition_wall,
        measure_wall,
    })
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
