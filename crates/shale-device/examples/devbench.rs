//! Side-by-side throughput of the device implementations and engines.
//!
//! `cargo run --release -p shale-device --example devbench [dir] [ops]`
//! Prints, per device, 4 KiB random writes and reads at queue depth 32 and
//! 128 KiB sequential writes: operations per second and MiB/s.

use std::time::Instant;

use shale_device::{
    BlockDevice, EngineChoice, FileDevice, FileOptions, IoBuf, IoOp, IoRequest, MemDevice,
    NullDevice,
};

/// Small enough that the memory device's pages (64 KiB each, allocated on first
/// write) stay a modest amount of RAM.
const DEVICE_BYTES: u64 = 256 << 20;
const QD: usize = 32;

/// xorshift, so runs are repeatable without a dependency.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Runs `ops` requests of `len` bytes at queue depth `QD`; returns seconds.
fn run(dev: &mut dyn BlockDevice, ops: u64, len: usize, write: bool, random: bool) -> f64 {
    let blocks = DEVICE_BYTES / len as u64;
    let mut rng = 0x2545_F491_4F6C_DD1D_u64;
    // Non-zero data: the memory device skips allocating pages for zeros.
    let mut bufs: Vec<IoBuf> = (0..QD)
        .map(|i| IoBuf::from_slice(&vec![i as u8 | 1; len]))
        .collect();
    let mut out = Vec::with_capacity(QD);
    let start = Instant::now();
    let (mut issued, mut done) = (0u64, 0u64);
    while done < ops {
        while issued < ops && (issued - done) < QD as u64 {
            let Some(buf) = bufs.pop() else { break };
            let block = if random {
                next(&mut rng) % blocks
            } else {
                issued % blocks
            };
            let offset = block * len as u64;
            let op = if write {
                IoOp::Write {
                    offset,
                    buf,
                    fua: false,
                }
            } else {
                IoOp::Read { offset, buf }
            };
            dev.submit(IoRequest { tag: issued, op });
            issued += 1;
        }
        out.clear();
        if let Err(e) = dev.poll(&mut out, 1) {
            eprintln!("poll failed: {e}");
            std::process::exit(1);
        }
        for c in out.drain(..) {
            if let Err(e) = c.result {
                eprintln!("I/O failed: {e}");
                std::process::exit(1);
            }
            if let Some(b) = c.buf {
                bufs.push(b);
            }
            done += 1;
        }
    }
    if write {
        if let Err(e) = dev.flush() {
            eprintln!("flush failed: {e}");
            std::process::exit(1);
        }
    }
    start.elapsed().as_secs_f64()
}

fn report(name: &str, dev: &mut dyn BlockDevice, ops: u64) {
    let cases: [(&str, usize, bool, bool, u64); 3] = [
        ("4k randwrite", 4096, true, true, ops),
        ("4k randread", 4096, false, true, ops),
        ("128k seqwrite", 128 * 1024, true, false, ops / 8),
    ];
    for (case, len, write, random, n) in cases {
        let secs = run(dev, n, len, write, random);
        let iops = n as f64 / secs;
        let mibs = iops * len as f64 / (1024.0 * 1024.0);
        println!("{name:<14} {case:<14} {iops:>10.0} op/s {mibs:>8.1} MiB/s");
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "/tmp".to_string());
    let ops: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let path = std::path::Path::new(&dir).join(format!("devbench-{}.img", std::process::id()));

    let mut mem = MemDevice::new(DEVICE_BYTES, 4096).expect("mem device");
    report("mem", &mut mem, ops);
    let mut null = NullDevice::new(DEVICE_BYTES, 4096).expect("null device");
    report("null", &mut null, ops);
    for (name, engine) in [
        ("file-uring", EngineChoice::Uring),
        ("file-psync", EngineChoice::Psync),
    ] {
        if let Err(e) = FileDevice::create_sparse(&path, DEVICE_BYTES) {
            eprintln!("{e}");
            std::process::exit(1);
        }
        let opts = FileOptions {
            engine,
            queue_depth: QD as u32,
            ..FileOptions::default()
        };
        match FileDevice::open_with(&path, &opts) {
            Ok(mut d) => {
                println!(
                    "# {name}: {} direct={} engine={:?}",
                    path.display(),
                    d.is_direct(),
                    d.engine_kind()
                );
                report(name, &mut d, ops);
            }
            Err(e) => println!("# {name}: unavailable: {e}"),
        }
        let _ = std::fs::remove_file(&path);
    }
}
