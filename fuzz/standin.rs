//! The stable-toolchain stand-in for the fuzzers, shared by each crate's
//! `tests/fuzz_corpus.rs` (included with `#[path]`): it replays the committed seed
//! corpus (`fuzz/corpus/<target>/`) through the entry points the cargo-fuzz targets
//! call, then random inputs and random mutations of the seeds. A failing input is
//! printed with the seed that made it.
//!
//! `SHALE_FUZZ_ITERS` sets the number of inputs per target (default 3000);
//! `SHALE_FUZZ_SEED` replays a run.

#![allow(dead_code)]

use std::path::PathBuf;

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub type Target = fn(&[u8]);

/// A fuzz target: its name (the corpus folder and the cargo-fuzz binary), its entry
/// point, and the longest random input worth trying (past it only seeds mutate).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    pub run: Target,
    pub random_len_max: usize,
}

pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read seed"),
            )
        })
        .collect();
    out.sort();
    out
}

pub fn run_guarded(target: &str, f: Target, input: &[u8], what: &str) {
    let r = std::panic::catch_unwind(|| f(input));
    if r.is_err() {
        panic!(
            "{target}: {what} panicked; input ({} bytes): {:02x?}",
            input.len(),
            input
        );
    }
}

/// Every committed seed of every target, which must have at least `seeds_min`.
pub fn replay_seeds(targets: &[Entry], seeds_min: usize) {
    for t in targets {
        let seeds = corpus(t.name);
        assert!(
            seeds.len() >= seeds_min,
            "{}: seed corpus missing or tiny",
            t.name
        );
        for (file, data) in &seeds {
            run_guarded(t.name, t.run, data, file);
        }
    }
}

/// Little-endian values that sit on the edges decoders check.
const EDGES: [u64; 10] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0xffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

fn mutate(rng: &mut ChaCha8Rng, v: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..8) {
        match rng.gen_range(0..6) {
            0 if !v.is_empty() => {
                let at = rng.gen_range(0..v.len());
                v[at] ^= 1 << rng.gen_range(0..8);
            }
            1 if !v.is_empty() => {
                let at = rng.gen_range(0..v.len());
                v[at] = [0u8, 0xff, 0x7f, 0x80][rng.gen_range(0..4)];
            }
            2 if !v.is_empty() => {
                v.truncate(rng.gen_range(0..v.len()));
            }
            // A field-sized edge value at a field-aligned offset: on-disk structures
            // are fixed-width little-endian fields, mostly in their first bytes.
            3 | 4 if v.len() > 8 => {
                let width = [1usize, 2, 4, 8][rng.gen_range(0..4)];
                let window = if rng.gen_bool(0.75) {
                    v.len().min(256)
                } else {
                    v.len()
                };
                let at = (rng.gen_range(0..window) / width) * width;
                let value = if rng.gen_bool(0.5) {
                    EDGES[rng.gen_range(0..EDGES.len())]
                } else {
                    rng.gen_range(0..64)
                };
                let bytes = value.to_le_bytes();
                let end = (at + width).min(v.len());
                v[at..end].copy_from_slice(&bytes[..end - at]);
            }
            _ => {
                let at = rng.gen_range(0..=v.len());
                let mut extra = vec![0u8; rng.gen_range(1..16)];
                rng.fill_bytes(&mut extra);
                v.splice(at..at, extra);
            }
        }
    }
}

/// Random inputs (one in four) and mutations of the seeds through every target.
pub fn random_and_mutated(targets: &[Entry]) {
    random_and_mutated_share(targets, 1);
}

/// As [`random_and_mutated`], with a `1/divisor` share of the inputs: for
/// targets whose inputs cost more (a device opened per input).
pub fn random_and_mutated_share(targets: &[Entry], divisor: usize) {
    let iters: usize = std::env::var("SHALE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
        / divisor.max(1);
    let seed: u64 = std::env::var("SHALE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("fuzz_corpus seed {seed} (SHALE_FUZZ_SEED={seed} to replay)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for t in targets {
        let seeds = corpus(t.name);
        let start = std::time::Instant::now();
        for i in 0..iters {
            let input = if i % 4 == 0 || seeds.is_empty() {
                let mut v = vec![0u8; rng.gen_range(0..=t.random_len_max)];
                rng.fill_bytes(&mut v);
                v
            } else {
                let (_, base) = &seeds[rng.gen_range(0..seeds.len())];
                let mut v = base.clone();
                mutate(&mut rng, &mut v);
                v
            };
            run_guarded(t.name, t.run, &input, &format!("seed {seed} iteration {i}"));
        }
        eprintln!(
            "fuzz_corpus {}: {iters} inputs in {:.1?}",
            t.name,
            start.elapsed()
        );
    }
}

/// Writes a target's seeds into `fuzz/corpus/<target>/`.
pub fn write_seeds(target: &str, seeds: Vec<(&str, Vec<u8>)>) {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (name, data) in seeds {
        std::fs::write(dir.join(name), data).expect("write seed");
    }
}
