//! Parser unit tests: descriptors are built by hand over a small guest memory.

use super::*;
use proptest::prelude::*;
use vm_memory::GuestMemoryMmap;

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const HDR: u64 = 0x1000;
const DATA: u64 = 0x2000;
const STATUS: u64 = 0x8000;
const MEM_BYTES: usize = 1 << 20;

fn mem() -> GuestMemoryMmap<()> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_BYTES)]).expect("guest memory")
}

fn limits() -> RequestLimits {
    RequestLimits {
        capacity_bytes: 1 << 30,
        block_bytes: 4096,
        seg_max: 8,
        size_max: 64 << 10,
        discard_sectors_max: 1 << 16,
        write_zeroes_sectors_max: 1 << 16,
        read_only: false,
        discard: true,
        write_zeroes: true,
    }
}

fn header(m: &GuestMemoryMmap<()>, kind: u32, sector: u64) {
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&[0; 4]);
    h.extend_from_slice(&sector.to_le_bytes());
    m.write_slice(&h, GuestAddress(HDR)).expect("header");
}

fn dwz(m: &GuestMemoryMmap<()>, sector: u64, sectors: u32, flags: u32) {
    let mut s = sector.to_le_bytes().to_vec();
    s.extend_from_slice(&sectors.to_le_bytes());
    s.extend_from_slice(&flags.to_le_bytes());
    m.write_slice(&s, GuestAddress(HDR + 16)).expect("segment");
}

fn d(addr: u64, len: u32, flags: u16) -> Descriptor {
    Descriptor::new(addr, len, flags, 0)
}

/// header, data segments (with `data_flags`), status.
fn chain(data: &[(u64, u32)], data_flags: u16) -> Vec<Descriptor> {
    let mut v = vec![d(HDR, 16, NEXT)];
    v.extend(data.iter().map(|&(a, l)| d(a, l, NEXT | data_flags)));
    v.push(d(STATUS, 1, WRITE));
    v
}

fn err(r: Result<Request, Rejected>) -> Rejected {
    match r {
        Ok(req) => panic!("parsed {req:?}"),
        Err(e) => e,
    }
}

#[test]
fn read_multi_segment() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_IN, 16);
    let r = parse(
        3,
        chain(&[(DATA, 4096), (DATA + 0x4000, 8192)], WRITE),
        &m,
        &limits(),
    )
    .expect("read");
    assert_eq!(r.head, 3);
    assert_eq!(r.status, GuestAddress(STATUS));
    assert_eq!(
        r.op,
        Op::Read {
            offset: 16 * 512,
            len: 12288,
            segments: vec![
                Segment {
                    addr: GuestAddress(DATA),
                    len: 4096
                },
                Segment {
                    addr: GuestAddress(DATA + 0x4000),
                    len: 8192
                }
            ]
        }
    );
}

#[test]
fn write_with_header_and_data_in_one_descriptor() {
    // The spec forbids assuming a framing: header and data may share a buffer.
    let m = mem();
    header(&m, VIRTIO_BLK_T_OUT, 8);
    let descs = vec![d(HDR, 16 + 4096, NEXT), d(STATUS, 1, WRITE)];
    let r = parse(0, descs, &m, &limits()).expect("write");
    assert_eq!(
        r.op,
        Op::Write {
            offset: 4096,
            len: 4096,
            segments: vec![Segment {
                addr: GuestAddress(HDR + 16),
                len: 4096
            }]
        }
    );
}

#[test]
fn status_shares_the_last_data_descriptor() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_IN, 0);
    let descs = vec![d(HDR, 16, NEXT), d(DATA, 4097, WRITE)];
    let r = parse(0, descs, &m, &limits()).expect("read");
    assert_eq!(r.status, GuestAddress(DATA + 4096));
    assert!(matches!(r.op, Op::Read { len: 4096, .. }));
}

#[test]
fn flush_get_id_discard_write_zeroes() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_FLUSH, 0);
    assert_eq!(
        parse(0, chain(&[], 0), &m, &limits()).expect("flush").op,
        Op::Flush
    );

    header(&m, VIRTIO_BLK_T_GET_ID, 0);
    let r = parse(0, chain(&[(DATA, 64)], WRITE), &m, &limits()).expect("get id");
    assert_eq!(
        r.op,
        Op::GetId {
            segments: vec![Segment {
                addr: GuestAddress(DATA),
                len: 20
            }]
        }
    );

    header(&m, VIRTIO_BLK_T_DISCARD, 0);
    dwz(&m, 8, 16, 0);
    let r = parse(
        0,
        vec![d(HDR, 32, NEXT), d(STATUS, 1, WRITE)],
        &m,
        &limits(),
    );
    assert_eq!(
        r.expect("discard").op,
        Op::Discard {
            offset: 4096,
            len: 8192
        }
    );

    header(&m, VIRTIO_BLK_T_WRITE_ZEROES, 0);
    dwz(&m, 0, 8, 1);
    let r = parse(
        0,
        vec![d(HDR, 32, NEXT), d(STATUS, 1, WRITE)],
        &m,
        &limits(),
    );
    assert_eq!(
        r.expect("write zeroes").op,
        Op::WriteZeroes {
            offset: 0,
            len: 4096,
            unmap: true
        }
    );
}

#[test]
fn discard_flags_and_limits() {
    let m = mem();
    let dz = || vec![d(HDR, 32, NEXT), d(STATUS, 1, WRITE)];
    header(&m, VIRTIO_BLK_T_DISCARD, 0);
    dwz(&m, 0, 8, 1); // unmap is not a discard flag
    assert_eq!(err(parse(0, dz(), &m, &limits())).code, STATUS_UNSUPP);
    dwz(&m, 0, 1 << 17, 0);
    assert!(matches!(
        err(parse(0, dz(), &m, &limits())).error,
        RequestError::TooManySectors { .. }
    ));
    dwz(&m, 1, 8, 0);
    assert!(matches!(
        err(parse(0, dz(), &m, &limits())).error,
        RequestError::UnalignedSector { .. }
    ));
    dwz(&m, (1 << 30) / 512, 8, 0);
    assert!(matches!(
        err(parse(0, dz(), &m, &limits())).error,
        RequestError::OutOfRange { .. }
    ));
    header(&m, VIRTIO_BLK_T_WRITE_ZEROES, 0);
    dwz(&m, 0, 8, 2);
    assert_eq!(err(parse(0, dz(), &m, &limits())).code, STATUS_UNSUPP);
    // Two segments: max_write_zeroes_seg is 1.
    let two = vec![d(HDR, 48, NEXT), d(STATUS, 1, WRITE)];
    assert!(matches!(
        err(parse(0, two, &m, &limits())).error,
        RequestError::SegmentPayload { .. }
    ));
    // Not negotiated: unsupported.
    let l = RequestLimits {
        write_zeroes: false,
        ..limits()
    };
    dwz(&m, 0, 8, 0);
    assert_eq!(err(parse(0, dz(), &m, &l)).code, STATUS_UNSUPP);
}

#[test]
fn unknown_type_is_unsupp() {
    let m = mem();
    for kind in [2, 5, 10, 14, 15, 99, u32::MAX] {
        header(&m, kind, 0);
        let e = err(parse(0, chain(&[], 0), &m, &limits()));
        assert_eq!(e.code, STATUS_UNSUPP, "type {kind}");
        assert_eq!(e.status, Some(GuestAddress(STATUS)));
    }
}

#[test]
fn range_checks_are_overflow_safe() {
    let m = mem();
    for sector in [
        u64::MAX,
        u64::MAX / 512,
        (1 << 30) / 512,
        (1 << 30) / 512 - 7,
    ] {
        header(&m, VIRTIO_BLK_T_IN, sector);
        let e = err(parse(0, chain(&[(DATA, 4096)], WRITE), &m, &limits()));
        assert_eq!(e.code, STATUS_IOERR, "sector {sector}");
    }
    // The last block is fine.
    header(&m, VIRTIO_BLK_T_IN, (1 << 30) / 512 - 8);
    assert!(parse(0, chain(&[(DATA, 4096)], WRITE), &m, &limits()).is_ok());
}

#[test]
fn lengths_and_alignment() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_IN, 0);
    let e = err(parse(0, chain(&[(DATA, 512)], WRITE), &m, &limits()));
    assert!(matches!(e.error, RequestError::UnalignedLength { .. }));
    header(&m, VIRTIO_BLK_T_IN, 1);
    let e = err(parse(0, chain(&[(DATA, 4096)], WRITE), &m, &limits()));
    assert!(matches!(e.error, RequestError::UnalignedSector { .. }));
    // A descriptor over size_max.
    header(&m, VIRTIO_BLK_T_IN, 0);
    let e = err(parse(0, chain(&[(DATA, 128 << 10)], WRITE), &m, &limits()));
    assert!(matches!(e.error, RequestError::DescriptorTooLarge { .. }));
    // More descriptors than seg_max + 2, status still reported.
    let many: Vec<(u64, u32)> = (0..9).map(|i| (DATA + i * 4096, 4096)).collect();
    let e = err(parse(0, chain(&many, WRITE), &m, &limits()));
    assert!(matches!(e.error, RequestError::TooManyDescriptors { .. }));
    assert_eq!(e.status, Some(GuestAddress(STATUS)));
}

#[test]
fn direction_must_match_the_type() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_IN, 0);
    let e = err(parse(0, chain(&[(DATA, 4096)], 0), &m, &limits()));
    assert!(matches!(e.error, RequestError::UnexpectedReadable { .. }));
    header(&m, VIRTIO_BLK_T_OUT, 0);
    let e = err(parse(0, chain(&[(DATA, 4096)], WRITE), &m, &limits()));
    assert!(matches!(e.error, RequestError::UnexpectedWritable { .. }));
    header(&m, VIRTIO_BLK_T_FLUSH, 0);
    let e = err(parse(0, chain(&[(DATA, 4096)], 0), &m, &limits()));
    assert!(matches!(e.error, RequestError::UnexpectedReadable { .. }));
    // Readable after writable.
    header(&m, VIRTIO_BLK_T_OUT, 0);
    let descs = vec![
        d(HDR, 16, NEXT),
        d(DATA, 4096, NEXT | WRITE),
        d(DATA + 4096, 4096, NEXT),
        d(STATUS, 1, WRITE),
    ];
    let e = err(parse(0, descs, &m, &limits()));
    assert!(matches!(
        e.error,
        RequestError::ReadableAfterWritable { .. }
    ));
}

#[test]
fn read_only_refuses_writes() {
    let m = mem();
    let l = RequestLimits {
        read_only: true,
        ..limits()
    };
    header(&m, VIRTIO_BLK_T_OUT, 0);
    let e = err(parse(0, chain(&[(DATA, 4096)], 0), &m, &l));
    assert_eq!((e.code, e.error), (STATUS_IOERR, RequestError::ReadOnly));
    header(&m, VIRTIO_BLK_T_IN, 0);
    assert!(parse(0, chain(&[(DATA, 4096)], WRITE), &m, &l).is_ok());
}

#[test]
fn shape_errors_without_a_status() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_IN, 0);
    // No descriptors.
    assert!(err(parse(0, Vec::new(), &m, &limits())).status.is_none());
    // The last descriptor is readable.
    let e = err(parse(
        0,
        vec![d(HDR, 16, NEXT), d(DATA, 1, 0)],
        &m,
        &limits(),
    ));
    assert_eq!((e.status, e.error), (None, RequestError::NoStatus));
    // The last descriptor still says NEXT: the chain was cut (a loop, a bad index).
    let e = err(parse(
        0,
        vec![d(HDR, 16, NEXT), d(STATUS, 1, NEXT | WRITE)],
        &m,
        &limits(),
    ));
    assert!(matches!(e.error, RequestError::BrokenChain { .. }));
    assert!(e.status.is_none());
    // The status byte outside guest memory.
    let e = err(parse(
        0,
        vec![d(HDR, 16, NEXT), d(MEM_BYTES as u64, 1, WRITE)],
        &m,
        &limits(),
    ));
    assert_eq!(e.status, None);
    // A zero-length status descriptor.
    let e = err(parse(
        0,
        vec![d(HDR, 16, NEXT), d(STATUS, 0, WRITE)],
        &m,
        &limits(),
    ));
    assert_eq!(e.status, None);
}

#[test]
fn header_and_data_outside_memory() {
    let m = mem();
    let e = err(parse(
        0,
        vec![d(MEM_BYTES as u64 - 8, 16, NEXT), d(STATUS, 1, WRITE)],
        &m,
        &limits(),
    ));
    assert!(matches!(
        e.error,
        RequestError::OutsideMemory { index: 0, .. }
    ));
    assert_eq!(e.code, STATUS_IOERR);
    let e = err(parse(
        0,
        vec![d(HDR, 8, NEXT), d(STATUS, 1, WRITE)],
        &m,
        &limits(),
    ));
    assert!(matches!(e.error, RequestError::ShortHeader { readable: 8 }));
    header(&m, VIRTIO_BLK_T_IN, 0);
    let e = err(parse(
        0,
        chain(&[(u64::MAX - 100, 4096)], WRITE),
        &m,
        &limits(),
    ));
    assert!(matches!(e.error, RequestError::OutsideMemory { .. }));
}

#[test]
fn scatter_and_gather_round_trip() {
    let m = mem();
    let segs = [
        Segment {
            addr: GuestAddress(DATA),
            len: 3,
        },
        Segment {
            addr: GuestAddress(DATA + 100),
            len: 5,
        },
    ];
    scatter(&m, &segs, b"abcdefgh").expect("scatter");
    let mut out = [0u8; 8];
    gather(&m, &segs, &mut out).expect("gather");
    assert_eq!(&out, b"abcdefgh");
}

proptest! {
    /// A well-formed read or write of any aligned size and position inside the
    /// device parses to exactly what was asked, whatever the segment split.
    #[test]
    fn well_formed_requests_parse(
        write in any::<bool>(),
        block in 0u64..((1 << 30) / 4096),
        splits in proptest::collection::vec(1u32..=16, 1..=8),
    ) {
        let m = mem();
        let kind = if write { VIRTIO_BLK_T_OUT } else { VIRTIO_BLK_T_IN };
        let blocks: u64 = splits.iter().map(|&s| u64::from(s)).sum();
        let block = block.min((1 << 30) / 4096 - blocks);
        header(&m, kind, block * 8);
        let mut at = DATA;
        let segs: Vec<(u64, u32)> = splits.iter().map(|&s| {
            let seg = (at, s * 4096);
            at += u64::from(s) * 4096;
            seg
        }).collect();
        let r = parse(1, chain(&segs, if write { 0 } else { WRITE }), &m, &limits());
        let r = r.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        let segments: Vec<Segment> = segs.iter().map(|&(a, l)| Segment { addr: GuestAddress(a), len: l }).collect();
        let want = if write {
            Op::Write { offset: block * 4096, len: blocks * 4096, segments }
        } else {
            Op::Read { offset: block * 4096, len: blocks * 4096, segments }
        };
        prop_assert_eq!(r.op, want);
    }

    /// Any descriptors at all: a result, never a panic; a reported status byte
    /// is always inside guest memory.
    #[test]
    fn arbitrary_descriptors(
        descs in proptest::collection::vec((any::<u64>(), any::<u32>(), 0u16..4), 0..12),
        kind in 0u32..16,
        sector in any::<u64>(),
    ) {
        let m = mem();
        header(&m, kind, sector);
        let descs: Vec<Descriptor> = descs.iter().map(|&(a, l, f)| {
            Descriptor::new(if a % 2 == 0 { a % MEM_BYTES as u64 } else { a }, l % 70_000, f, 0)
        }).collect();
        match parse(0, descs, &m, &limits()) {
            Ok(r) => prop_assert!(m.check_range(r.status, 1, Permissions::Write)),
            Err(e) => if let Some(s) = e.status {
                prop_assert!(m.check_range(s, 1, Permissions::Write));
            },
        }
    }
}
