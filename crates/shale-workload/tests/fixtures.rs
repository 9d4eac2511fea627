//! The hand-made traces in tests/fixtures/traces parse, fit and fail as documented.

use std::path::PathBuf;
use std::sync::Arc;

use shale_workload::{
    IoKind, Source, StopAfter, Trace, TraceError, TraceFit, TraceFormat, TraceOp, TraceTiming,
    Workload, WorkloadConfig,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/traces")
        .join(name)
}

#[test]
fn msr_fixture_parses() {
    let t = Trace::from_path(TraceFormat::Msr, &fixture("msr_small.csv")).expect("parse");
    assert_eq!(t.len(), 10);
    let writes = t
        .records()
        .iter()
        .filter(|r| r.op == TraceOp::Write)
        .count();
    assert_eq!(writes, 7);
    assert_eq!(t.extent_bytes(), 5_368_725_504 + 16_384);
    assert_eq!(
        t.span_ns(),
        (128_166_372_041_000_013 - 128_166_372_003_061_629) * 100
    );
    let h = Trace::from_path(TraceFormat::Msr, &fixture("msr_header.csv")).expect("parse");
    assert_eq!(h.len(), 2);
}

#[test]
fn alibaba_fixture_parses_one_disk() {
    let path = fixture("alibaba_small.csv");
    // The first disk in the file: 3, four requests.
    let t = Trace::from_path(TraceFormat::Alibaba(None), &path).expect("parse");
    assert_eq!(t.len(), 4);
    assert_eq!(t.records()[1].op, TraceOp::Read);
    assert_eq!(t.extent_bytes(), 126_703_648_768 + 4096);
    assert_eq!(t.span_ns(), 10_000 * 1000);
    // Disk 7 when asked for; its time starts at its own first request.
    let fmt: TraceFormat = "alibaba:7".parse().expect("format");
    let t = Trace::from_path(fmt, &path).expect("parse");
    assert_eq!(t.len(), 2);
    assert_eq!(t.records()[0].len, 65_536);
    assert_eq!(t.span_ns(), 800 * 1000);
    // A disk the file does not hold is an empty trace, and says so.
    let e = Trace::from_path(TraceFormat::Alibaba(Some(9)), &path).expect_err("no disk 9");
    assert!(matches!(e, TraceError::Empty), "{e}");
    assert!("alibaba:x".parse::<TraceFormat>().is_err());
}

#[test]
fn simple_fixture_parses() {
    let t = Trace::from_path(TraceFormat::Simple, &fixture("simple_small.csv")).expect("parse");
    assert_eq!(t.len(), 10);
    assert_eq!(t.records()[5].op, TraceOp::Trim);
}

#[test]
fn bad_fixtures_report_their_line() {
    let e =
        Trace::from_path(TraceFormat::Msr, &fixture("msr_bad_type.csv")).expect_err("must fail");
    assert!(matches!(e, TraceError::BadOp { line: 2, .. }), "{e}");
    let e = Trace::from_path(TraceFormat::Simple, &fixture("simple_bad_number.csv"))
        .expect_err("must fail");
    assert!(
        matches!(
            e,
            TraceError::BadNumber {
                line: 3,
                field: "len_bytes",
                ..
            }
        ),
        "{e}"
    );
    let e =
        Trace::from_path(TraceFormat::Simple, &fixture("no_such_file.csv")).expect_err("must fail");
    assert!(matches!(e, TraceError::Open { .. }), "{e}");
}

#[test]
fn msr_replay_on_a_small_volume_is_aligned_and_inside() {
    let t = Trace::from_path(TraceFormat::Msr, &fixture("msr_small.csv")).expect("parse");
    for fit in [TraceFit::Modulo, TraceFit::Scale] {
        let mut cfg = WorkloadConfig::new("seq".parse().expect("spec"), 4096, 64 << 20);
        cfg.source = Source::Trace {
            traces: vec![Arc::new(t.clone())],
            fit,
            timing: TraceTiming::Recorded,
        };
        cfg.tenants = 2;
        cfg.stop = StopAfter::Passes(3);
        let ops: Vec<_> = Workload::new(&cfg).expect("cfg").collect();
        assert_eq!(ops.len(), 2 * 3 * 10);
        for op in &ops {
            assert_eq!(op.offset % 4096, 0);
            assert_eq!(op.len % 4096, 0);
            assert!(op.offset + op.len <= 64 << 20);
        }
        // Recorded timing: non-decreasing per tenant across loops.
        let t0: Vec<u64> = ops
            .iter()
            .filter(|o| o.tenant == 0)
            .map(|o| o.not_before_ns)
            .collect();
        assert!(t0.windows(2).all(|w| w[0] <= w[1]), "{t0:?}");
        assert_eq!(
            ops.iter().filter(|o| o.kind == IoKind::Write).count(),
            2 * 3 * 7
        );
    }
}
