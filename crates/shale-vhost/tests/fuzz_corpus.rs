//! The stable stand-in for the `vhost_request` fuzzer: the committed seed
//! corpus (`fuzz/corpus/vhost_request/`) and random and mutated inputs go
//! through the entry point the cargo-fuzz target calls (driver in
//! `fuzz/standin.rs`). A failing input is printed with the seed that made it.
//!
//! `SHALE_FUZZ_ITERS` raises the number of random inputs (default 3000).
//! `cargo test -p shale-vhost --test fuzz_corpus -- --ignored write_seed_corpus`
//! regenerates the seeds.

#[path = "../../../fuzz/standin.rs"]
mod standin;

use shale_vhost::fuzzing::{self, build_input};
use standin::Entry;

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;
/// All features, 4 KiB blocks, 1 MiB device.
const SEL_RW: u8 = 0x26;

fn targets() -> [Entry; 1] {
    [Entry {
        name: "vhost_request",
        run: fuzzing::request,
        random_len_max: 4096,
    }]
}

#[test]
fn seed_corpus_replays() {
    standin::replay_seeds(&targets(), 8);
}

#[test]
fn random_and_mutated_inputs() {
    standin::random_and_mutated(&targets());
}

/// Each seed does what its name says, so the corpus starts on the parser's
/// accepting paths as well as its refusals.
#[test]
fn seeds_mean_what_they_say() {
    use fuzzing::Outcome::{Parsed, Refused};
    let want = [
        ("discard", vec![Parsed("discard")]),
        ("flush", vec![Parsed("flush")]),
        ("get-id", vec![Parsed("get-id")]),
        ("high-region", vec![Parsed("read")]),
        ("indirect", vec![Parsed("read")]),
        ("loop", vec![Refused(None)]),
        ("out-of-range", vec![Refused(Some(1))]),
        ("read-2seg", vec![Parsed("read")]),
        ("read-only-write", vec![Refused(Some(1))]),
        ("write", vec![Parsed("write")]),
        ("write-header-and-data-one-buffer", vec![Parsed("write")]),
        ("write-zeroes-unmap", vec![Parsed("write-zeroes")]),
        ("wrong-direction", vec![Refused(Some(1))]),
    ];
    let seeds = standin::corpus("vhost_request");
    for (name, outcomes) in want {
        let (_, data) = seeds
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("seed {name} missing"));
        let got: Vec<_> = fuzzing::outcomes(data)
            .into_iter()
            .map(|(_, o)| o)
            .collect();
        assert_eq!(got, outcomes, "seed {name}");
    }
    let (_, many) = seeds
        .iter()
        .find(|(n, _)| n == "many-heads")
        .expect("many-heads");
    assert_eq!(fuzzing::outcomes(many).len(), 5);
}

fn header(kind: u32, sector: u64) -> Vec<u8> {
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&[0; 4]);
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

fn dwz(kind: u32, sector: u64, sectors: u32, flags: u32) -> Vec<u8> {
    let mut v = header(kind, 0);
    v.extend_from_slice(&sector.to_le_bytes());
    v.extend_from_slice(&sectors.to_le_bytes());
    v.extend_from_slice(&flags.to_le_bytes());
    v
}

/// header at 0x1000 (desc 0), `data` (desc 1..), status at 0x7000 (last).
fn simple(sel: u8, hdr: Vec<u8>, hdr_len: u32, data: &[(u64, u32, u16)]) -> Vec<u8> {
    let mut descs = vec![(0x1000u64, hdr_len, NEXT, 1u16)];
    for (i, &(addr, len, flags)) in data.iter().enumerate() {
        descs.push((addr, len, flags | NEXT, i as u16 + 2));
    }
    descs.push((0x7000, 1, WRITE, 0));
    build_input(sel, &descs, &[0], &[(0x1000, hdr)])
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    let indirect_table: Vec<u8> = [
        (0x1000u64, 16u32, NEXT, 1u16),
        (0x2000, 4096, NEXT | WRITE, 2),
        (0x7000, 1, WRITE, 0),
    ]
    .iter()
    .flat_map(|&(a, l, f, n)| {
        let mut d = a.to_le_bytes().to_vec();
        d.extend_from_slice(&l.to_le_bytes());
        d.extend_from_slice(&f.to_le_bytes());
        d.extend_from_slice(&n.to_le_bytes());
        d
    })
    .collect();
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "read-2seg",
            simple(
                SEL_RW,
                header(0, 8),
                16,
                &[(0x2000, 4096, WRITE), (0x4000, 4096, WRITE)],
            ),
        ),
        (
            "write",
            simple(SEL_RW, header(1, 0), 16, &[(0x2000, 8192, 0)]),
        ),
        (
            "write-header-and-data-one-buffer",
            simple(SEL_RW, header(1, 0), 16 + 4096, &[]),
        ),
        ("flush", simple(SEL_RW, header(4, 0), 16, &[])),
        (
            "get-id",
            simple(SEL_RW, header(8, 0), 16, &[(0x2000, 20, WRITE)]),
        ),
        ("discard", simple(SEL_RW, dwz(11, 8, 8, 0), 32, &[])),
        (
            "write-zeroes-unmap",
            simple(SEL_RW, dwz(13, 0, 16, 1), 32, &[]),
        ),
        (
            "read-only-write",
            simple(SEL_RW | 1, header(1, 0), 16, &[(0x2000, 4096, 0)]),
        ),
        (
            "out-of-range",
            simple(
                SEL_RW,
                header(0, u64::MAX / 512),
                16,
                &[(0x2000, 4096, WRITE)],
            ),
        ),
        (
            "wrong-direction",
            simple(SEL_RW, header(0, 0), 16, &[(0x2000, 4096, 0)]),
        ),
        (
            "loop",
            build_input(
                SEL_RW,
                &[(0x1000, 16, NEXT, 1), (0x2000, 4096, NEXT | WRITE, 0)],
                &[0],
                &[(0x1000, header(0, 0))],
            ),
        ),
        (
            "indirect",
            build_input(
                SEL_RW,
                &[(0x3000, 48, INDIRECT, 0)],
                &[0],
                &[(0x1000, header(0, 0)), (0x3000, indirect_table)],
            ),
        ),
        (
            "many-heads",
            build_input(
                SEL_RW | 0x08,
                &[
                    (0x1000, 16, NEXT, 1),
                    (0x2000, 512, NEXT | WRITE, 2),
                    (0x7000, 1, WRITE, 0),
                    (0x1100, 16, NEXT, 4),
                    (0x7001, 1, WRITE, 0),
                ],
                &[0, 3, 0, 17, 2],
                &[(0x1000, header(0, 1)), (0x1100, header(4, 0))],
            ),
        ),
        (
            "high-region",
            simple(SEL_RW, header(0, 0), 16, &[(0x2_0000, 4096, WRITE)]),
        ),
    ];
    standin::write_seeds("vhost_request", seeds);
}
