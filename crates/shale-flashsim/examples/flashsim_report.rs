//! Prints the flash model's figures: simulation speed, steady-state WAF against the
//! analytic model, and each preset's emulated throughput for the seeds' workloads.
//!
//! `cargo run --release -p shale-flashsim --example flashsim_report [-- --quick]`
//! (`--quick` runs every part at 1/8 the size, as a smoke test.)

use std::time::Instant;

use shale_device::BlockDevice;

use shale_flashsim::{
    emulated_bytes_per_sec, preset, simulated_block_device, spare_factor_from_rho,
    uniform_random_waf, Backing, FlashStats, Ftl, FtlConfig, GcPolicy, Superblock,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((u128::from(z) * u128::from(n)) >> 64) as u64
    }
}

/// Sequential fill of the span, `warm` random writes, then `measure` random writes
/// of `io` bytes; returns the measured part.
fn random_writes(
    f: &mut Ftl,
    span: u64,
    io: u64,
    warm: u64,
    measure: u64,
    seed: u64,
) -> FlashStats {
    let fill = f.geometry().iu_bytes.max(128 * KIB);
    let mut off = 0;
    while off < span {
        let len = fill.min(span - off);
        f.write(off, len).expect("in range");
        off += len;
    }
    let mut rng = Rng(seed);
    let slots = span / io;
    for _ in 0..warm {
        f.write(rng.below(slots) * io, io).expect("in range");
    }
    let before = f.stats();
    for _ in 0..measure {
        f.write(rng.below(slots) * io, io).expect("in range");
    }
    f.stats().since(&before)
}

fn speed(scale: u64) {
    println!("== simulation speed (uniform random writes, greedy, Sf 7%)");
    for (iu, io) in [
        (4 * KIB, 4 * KIB),
        (64 * KIB, 4 * KIB),
        (64 * KIB, 64 * KIB),
    ] {
        let cap = (4 << 30) / scale;
        let cfg = FtlConfig::new(iu, Superblock::Bytes(1024 * iu), 0.07);
        let cfg = if iu > 4 * KIB {
            FtlConfig::new(iu, Superblock::CapacityDivisor(228), 0.07)
        } else {
            cfg
        };
        let timing = preset("tlc").expect("preset").timing;
        let mut f = Ftl::new(&cfg, cap, timing).expect("valid");
        let n = cap / iu * 3;
        let t = Instant::now();
        let s = random_writes(&mut f, cap, io, n, n, 1);
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  {} GiB drive, {} KiB IU, {} KiB writes: {:.2} M host writes/s (fill + {} writes, WAF {:.2})",
            cap >> 30,
            iu / KIB,
            io / KIB,
            (2 * n + cap / f.geometry().iu_bytes.max(128 * KIB)) as f64 / secs / 1e6,
            2 * n,
            s.waf()
        );
    }
}

/// The same through the device wrapper over a `NullDevice` (argument checks, stats
/// publishing).
fn wrapper_speed(scale: u64) {
    let cap = (4 << 30) / scale;
    let p = preset("tlc").expect("preset");
    let mut d = simulated_block_device(&p, cap, Backing::Null).expect("builds");
    let buf = vec![0u8; 4096];
    let mut rng = Rng(2);
    let n = cap / 4096 * 3;
    let t = Instant::now();
    for _ in 0..n {
        d.write_at(rng.below(cap / 4096) * 4096, &buf)
            .expect("write");
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "  FlashSim<NullDevice> tlc {} GiB, 4 KiB random write_at: {:.2} M writes/s (WAF {:.2})",
        cap >> 30,
        n as f64 / secs / 1e6,
        d.stats().waf()
    );
}

fn analytic(scale: u64) {
    println!("== 4 KiB IU, uniform random 4 KiB writes, steady state vs analytic");
    let cases: [(f64, u64, GcPolicy, u64); 9] = [
        (0.07, 1024, GcPolicy::Greedy, 1116),
        (0.10, 1024, GcPolicy::Greedy, 1080),
        (0.18, 1024, GcPolicy::Greedy, 984),
        (0.28, 1024, GcPolicy::Greedy, 864),
        (0.07, 1024, GcPolicy::Fifo, 1116),
        (0.18, 1024, GcPolicy::Fifo, 984),
        (0.07, 1024, GcPolicy::CostBenefit, 1116),
        (spare_factor_from_rho(0.07), 64, GcPolicy::Greedy, 16 * 1024),
        (spare_factor_from_rho(0.07), 64, GcPolicy::Fifo, 16 * 1024),
    ];
    for (sf, ppb, policy, user_superblocks) in cases {
        let user_superblocks = (user_superblocks / scale).max(8);
        let cfg = FtlConfig::new(4 * KIB, Superblock::Bytes(ppb * 4 * KIB), sf).with_policy(policy);
        let cap = user_superblocks * ppb * 4 * KIB;
        let timing = preset("tlc").expect("preset").timing;
        let mut f = Ftl::new(&cfg, cap, timing).expect("valid");
        let eff = f.geometry().effective_spare_factor();
        let ius = cap / (4 * KIB);
        let s = random_writes(&mut f, cap, 4 * KIB, 4 * ius, 4 * ius, 7);
        let expected = uniform_random_waf(eff).expect("in range");
        println!(
            "  Sf {:5.2}% {:>11} {:>4}-IU superblocks x {:>5}: WAF {:6.3}  analytic {:6.3}  ({:+.2}%)",
            eff * 100.0,
            format!("{policy:?}"),
            ppb,
            f.geometry().superblocks,
            s.waf(),
            expected,
            (s.waf() / expected - 1.0) * 100.0
        );
    }
}

/// Hot/cold skew: `hot_writes` of the writes go to the first `hot_space` of the
/// drive, the rest uniformly to the remainder.
fn skew(scale: u64) {
    println!("== 4 KiB IU, Sf 7%, 1024-IU superblocks, hot/cold 4 KiB writes (80% to 20%)");
    for separate in [true, false] {
        for policy in [GcPolicy::Greedy, GcPolicy::CostBenefit, GcPolicy::Fifo] {
            let cfg = FtlConfig {
                separate_gc_stream: separate,
                ..FtlConfig::new(4 * KIB, Superblock::Bytes(1024 * 4 * KIB), 0.07)
                    .with_policy(policy)
            };
            let cap = (1 << 30) / scale;
            let timing = preset("tlc").expect("preset").timing;
            let mut f = Ftl::new(&cfg, cap, timing).expect("valid");
            let ius = cap / (4 * KIB);
            let hot = ius / 5;
            let mut rng = Rng(5);
            let mut off = 0;
            while off < cap {
                f.write(off, 128 * KIB).expect("in range");
                off += 128 * KIB;
            }
            let one = |f: &mut Ftl, rng: &mut Rng| {
                let lpn = if rng.below(10) < 8 {
                    rng.below(hot)
                } else {
                    hot + rng.below(ius - hot)
                };
                f.write(lpn * 4 * KIB, 4 * KIB).expect("in range");
            };
            for _ in 0..8 * ius {
                one(&mut f, &mut rng);
            }
            let before = f.stats();
            for _ in 0..4 * ius {
                one(&mut f, &mut rng);
            }
            let s = f.stats().since(&before);
            println!(
                "  {:>11} {} streams: WAF {:.3}",
                format!("{policy:?}"),
                if separate { "separate" } else { "shared  " },
                s.waf()
            );
        }
    }
}

fn mib_s(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / MIB as f64
}

fn presets(scale: u64) {
    println!("== presets: steady state after preconditioning, emulated throughput");
    let cap = (4 << 30) / scale;
    for name in ["qlc-p5316", "tlc", "optane"] {
        let p = preset(name).expect("preset");
        let d = p.datasheet;
        println!(
            "  {name}: datasheet seq {:.0}/{:.0} MB/s, 4K random {:.0}K/{:.1}K IOPS",
            d.seq_read_mb_s,
            d.seq_write_mb_s,
            d.rand_read_4k_iops / 1e3,
            d.rand_write_4k_iops / 1e3
        );
        let cfg = match p.ftl_config() {
            Ok(c) => c,
            Err(_) => {
                // In place: no amplification; only the command and media rates matter.
                let t = p.timing;
                let per_4k = t.command_ps(4096) as f64 * 1e-12;
                let media = 4096.0 / t.program_bytes_per_sec;
                println!(
                    "    4K random write {:.0}K IOPS, seq write {:.0} MB/s (NAND == host)",
                    1.0 / per_4k.max(media) / 1e3,
                    t.program_bytes_per_sec / 1e6
                );
                continue;
            }
        };
        for (label, span_frac, io) in [
            ("4K random, full span", 1.0, 4 * KIB),
            ("4K random, 90% span (seed 004: 10% OP)", 0.9, 4 * KIB),
            ("64K random, full span", 1.0, 64 * KIB),
        ] {
            let mut f = Ftl::new(&cfg, cap, p.timing).expect("valid");
            let span = ((cap as f64 * span_frac) as u64) / (64 * KIB) * (64 * KIB);
            let n = span / f.geometry().iu_bytes * 4;
            let s = random_writes(&mut f, span, io, n, n, 11);
            let bps = emulated_bytes_per_sec(s.host_bytes_written, &[&s]).unwrap_or(0.0);
            println!(
                "    {label}: device WAF {:.2} (GC {:.2}), {:.0} IOPS = {:.1} MiB/s",
                s.waf(),
                s.gc_waf(),
                bps / io as f64,
                mib_s(bps)
            );
        }
        let mut f = Ftl::new(&cfg, cap, p.timing).expect("valid");
        let before = f.stats();
        for _ in 0..3 {
            let mut off = 0;
            while off < cap {
                f.write(off, 128 * KIB).expect("in range");
                off += 128 * KIB;
            }
        }
        let s = f.stats().since(&before);
        let w = emulated_bytes_per_sec(s.host_bytes_written, &[&s]).unwrap_or(0.0);
        let before = f.stats();
        let mut rng = Rng(3);
        for _ in 0..100_000 {
            f.read(rng.below(cap / (4 * KIB)) * 4 * KIB, 4 * KIB)
                .expect("in range");
        }
        let r = f.stats().since(&before);
        let rb = emulated_bytes_per_sec(r.host_bytes_read, &[&r]).unwrap_or(0.0);
        let before = f.stats();
        let mut off = 0;
        while off < cap {
            f.read(off, 128 * KIB).expect("in range");
            off += 128 * KIB;
        }
        let sr = f.stats().since(&before);
        let srb = emulated_bytes_per_sec(sr.host_bytes_read, &[&sr]).unwrap_or(0.0);
        println!(
            "    128K sequential write {:.0} MB/s (WAF {:.2}), read {:.0} MB/s; 4K random read {:.0}K IOPS",
            w / 1e6,
            s.waf(),
            srb / 1e6,
            rb / 4096.0 / 1e3
        );
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 8 } else { 1 };
    speed(scale);
    wrapper_speed(scale);
    analytic(scale);
    skew(scale);
    presets(scale);
}
