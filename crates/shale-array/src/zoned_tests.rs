//! Tests of the zoned array against a byte model: every redundancy, degraded reads,
//! member errors, crashes that leave members disagreeing.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shale_device::{
    CrashMode, ErrorRule, FaultController, FaultDevice, IoBuf, MemDevice, ZoneAction,
    ZoneCompletion, ZoneEmu, ZoneEmuConfig, ZoneError, ZoneOp, ZoneRequest, ZoneState, ZonedDevice,
};

use crate::codec::{ErasureCodec, ReedSolomon};
use crate::layout::{Redundancy, StripeLayout, LABEL_ZONES, STRIPE_BYTES_MAX};
use crate::member::MemberState;
use crate::zoned::ZoneArray;

const MEMBER_ZONE: u64 = 1 << 20;
const ZONES: u32 = 6;
const UNIT: u64 = 16 * 1024;

fn emu_config() -> ZoneEmuConfig {
    ZoneEmuConfig {
        zone_capacity: MEMBER_ZONE - 64 * 1024,
        ..ZoneEmuConfig::new(MEMBER_ZONE)
    }
}

fn mem_member(i: usize) -> (Option<ZoneEmu<MemDevice>>, String) {
    let cfg = emu_config();
    let bytes = cfg.device_bytes_for(ZONES + LABEL_ZONES).expect("size");
    let dev = MemDevice::new(bytes, 4096)
        .expect("mem")
        .with_name(format!("m{i}"));
    (
        Some(ZoneEmu::format(dev, &cfg).expect("format")),
        format!("m{i}"),
    )
}

fn mem_array(r: Redundancy, n: usize) -> ZoneArray<ZoneEmu<MemDevice>> {
    ZoneArray::new((0..n).map(mem_member).collect(), r, UNIT).expect("array")
}

fn fault_array(
    r: Redundancy,
    n: usize,
    seed: u64,
) -> (ZoneArray<ZoneEmu<FaultDevice>>, Vec<FaultController>) {
    let cfg = emu_config();
    let bytes = cfg.device_bytes_for(ZONES + LABEL_ZONES).expect("size");
    let mut ctls = Vec::new();
    let members = (0..n)
        .map(|i| {
            let dev = FaultDevice::new(bytes, 4096, seed + i as u64).expect("fault");
            ctls.push(dev.controller());
            (
                Some(ZoneEmu::format(dev, &cfg).expect("format")),
                format!("f{i}"),
            )
        })
        .collect();
    (ZoneArray::new(members, r, UNIT).expect("array"), ctls)
}

fn shapes() -> Vec<(Redundancy, usize)> {
    vec![
        (Redundancy::None, 1),
        (Redundancy::None, 3),
        (Redundancy::Mirror, 2),
        (Redundancy::Mirror, 3),
        (Redundancy::Parity { k: 2, m: 1 }, 3),
        (Redundancy::Parity { k: 4, m: 1 }, 5),
        (Redundancy::Parity { k: 4, m: 2 }, 6),
        (Redundancy::Parity { k: 3, m: 3 }, 6),
    ]
}

/// What the array should hold: the bytes written to each zone, in order.
#[derive(Default)]
struct Model {
    zones: Vec<Vec<u8>>,
}

impl Model {
    fn new() -> Model {
        Model {
            zones: vec![Vec::new(); ZONES as usize],
        }
    }
}

fn random_rows(rng: &mut ChaCha8Rng, stripe: usize, rows: usize) -> Vec<u8> {
    (0..stripe * rows).map(|_| rng.gen()).collect()
}

fn write_async<Z: ZonedDevice>(a: &mut ZoneArray<Z>, offset: u64, data: &[u8]) -> ZoneCompletion {
    a.submit(ZoneRequest {
        tag: 77,
        op: ZoneOp::Write {
            offset,
            buf: IoBuf::from_slice(data),
            fua: false,
        },
    });
    let mut out = poll_one(a);
    assert_eq!(out.len(), 1);
    out.pop().expect("one")
}

/// Polls until a completion arrives (an array's poll may return after waiting once
/// for a member's part).
fn poll_one<Z: ZonedDevice>(a: &mut ZoneArray<Z>) -> Vec<ZoneCompletion> {
    let mut out = Vec::new();
    while out.is_empty() {
        a.poll(&mut out, 1).expect("poll");
    }
    out
}

fn read_async<Z: ZonedDevice>(
    a: &mut ZoneArray<Z>,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, ZoneError> {
    a.submit(ZoneRequest {
        tag: 9,
        op: ZoneOp::Read {
            offset,
            buf: IoBuf::zeroed(len),
        },
    });
    let mut out = poll_one(a);
    let c = out.pop().expect("one");
    assert_eq!(c.tag, 9);
    c.result?;
    Ok(c.buf.expect("buffer back").to_vec())
}

/// Reads every zone of `model` back in pieces of assorted sizes and offsets.
fn check_reads<Z: ZonedDevice>(a: &mut ZoneArray<Z>, model: &Model, rng: &mut ChaCha8Rng) {
    let zsize = a.geometry().zone_size;
    for (z, bytes) in model.zones.iter().enumerate() {
        if bytes.is_empty() {
            continue;
        }
        let base = z as u64 * zsize;
        for _ in 0..12 {
            let blocks = bytes.len() / 4096;
            let first = rng.gen_range(0..blocks);
            let n = rng.gen_range(1..=(blocks - first).min(40));
            let (off, len) = (first * 4096, n * 4096);
            let got = read_async(a, base + off as u64, len).expect("read");
            assert_eq!(got, bytes[off..off + len], "zone {z} at {off} len {len}");
        }
        let mut all = vec![0u8; bytes.len()];
        a.read_at(base, &mut all).expect("sync read");
        assert_eq!(&all, bytes, "zone {z} whole");
    }
}

fn fill<Z: ZonedDevice>(a: &mut ZoneArray<Z>, model: &mut Model, rng: &mut ChaCha8Rng, zones: u32) {
    fill_rows(a, model, rng, zones, &[1, 2, 3]);
}

/// Writes of `rows[i]` rows each, alternately asynchronous and synchronous, to the
/// first `zones` zones.
fn fill_rows<Z: ZonedDevice>(
    a: &mut ZoneArray<Z>,
    model: &mut Model,
    rng: &mut ChaCha8Rng,
    zones: u32,
    rows: &[usize],
) {
    let s = a.geometry().write_unit as usize;
    let zsize = a.geometry().zone_size;
    for z in 0..zones {
        for (i, &n) in rows.iter().enumerate() {
            let data = random_rows(rng, s, n);
            let off = z as u64 * zsize + model.zones[z as usize].len() as u64;
            if i % 2 == 0 {
                let c = write_async(a, off, &data);
                assert_eq!(c.result.expect("write"), Some(off));
            } else {
                assert_eq!(a.write_at(off, &data).expect("write"), off);
            }
            model.zones[z as usize].extend_from_slice(&data);
        }
    }
}

#[test]
fn every_shape_reads_back_what_it_wrote() {
    for (r, n) in shapes() {
        let mut rng = ChaCha8Rng::seed_from_u64(n as u64);
        let mut a = mem_array(r, n);
        let mut model = Model::new();
        fill(&mut a, &mut model, &mut rng, 3);
        check_reads(&mut a, &model, &mut rng);
        let info = a.zone_info(1).expect("info");
        assert_eq!(info.write_pointer - info.start, model.zones[1].len() as u64);
        assert_eq!(info.state, ZoneState::ImplicitlyOpen, "{r}");
    }
}

/// A read of whole units comes back in the caller's own buffer (split among the
/// members and joined back), also when a unit is rebuilt from the others into its part.
#[test]
fn a_whole_row_read_comes_back_in_the_callers_buffer() {
    let mut a = mem_array(Redundancy::Parity { k: 4, m: 1 }, 5);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let s = a.geometry().write_unit as usize;
    let data = random_rows(&mut rng, s, 2);
    a.write_at(0, &data).expect("write");
    for failed in [false, true] {
        if failed {
            a.fail_member(1, "test").expect("fail");
        }
        let buf = IoBuf::zeroed(2 * s);
        let at = buf.as_ptr();
        a.submit(ZoneRequest {
            tag: 5,
            op: ZoneOp::Read { offset: 0, buf },
        });
        let c = poll_one(&mut a).pop().expect("one");
        c.result.expect("read");
        let got = c.buf.expect("buffer back");
        assert_eq!(got.as_ptr(), at, "failed member: {failed}");
        assert!(got[..] == data[..], "failed member: {failed}");
    }
}

#[test]
fn geometry_follows_the_layout() {
    let a = mem_array(Redundancy::Parity { k: 4, m: 2 }, 6);
    let g = a.geometry();
    assert_eq!(g.zone_count, ZONES);
    assert_eq!(g.write_unit as u64, 4 * UNIT);
    let rows = (MEMBER_ZONE - 64 * 1024) / UNIT;
    assert_eq!(g.zone_capacity, rows * 4 * UNIT);
    assert_eq!(g.zone_size, 4 * MEMBER_ZONE);
    assert_eq!(g.max_io_bytes as u64 % g.write_unit as u64, 0);
}

/// The bytes on the members are the layout's: data units in order, parity the
/// code's, rotating across members.
#[test]
fn members_hold_data_and_parity_where_the_layout_says() {
    let r = Redundancy::Parity { k: 4, m: 2 };
    let mut a = mem_array(r, 6);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let s = a.geometry().write_unit as usize;
    let zsize = a.geometry().zone_size;
    let data = random_rows(&mut rng, s, 7);
    a.write_at(2 * zsize, &data).expect("write");
    let l = *a.layout();
    let code = ReedSolomon::new(4, 2).expect("code");
    let unit = UNIT as usize;
    for row in 0..7u64 {
        let mut shards = vec![vec![0u8; unit]; 6];
        for (s_i, shard) in shards.iter_mut().enumerate() {
            let m = l.member_of(2, row, s_i as u32);
            let dev = a.member_device_mut(m).expect("member");
            let off = dev.geometry().zone_start(2 + LABEL_ZONES) + row * UNIT;
            dev.read_at(off, shard).expect("member read");
        }
        let row_data = &data[row as usize * s..(row as usize + 1) * s];
        for d in 0..4 {
            assert_eq!(
                shards[d],
                row_data[d * unit..(d + 1) * unit],
                "row {row} data {d}"
            );
        }
        let mut parity = vec![vec![0u8; unit]; 2];
        let srcs: Vec<&[u8]> = shards[..4].iter().map(Vec::as_slice).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        code.encode(&srcs, &mut outs).expect("encode");
        assert_eq!(parity[0], shards[4], "row {row} P");
        assert_eq!(parity[1], shards[5], "row {row} Q");
    }
}

#[test]
fn partial_stripes_and_writes_off_the_pointer_are_refused() {
    let mut a = mem_array(Redundancy::Parity { k: 4, m: 1 }, 5);
    let s = a.geometry().write_unit as usize;
    let c = write_async(&mut a, 0, &vec![1u8; s / 2]);
    assert!(matches!(
        c.result,
        Err(ZoneError::Device(
            shale_device::DeviceError::Misaligned { .. }
        ))
    ));
    let c = write_async(&mut a, s as u64, &vec![1u8; s]);
    assert!(
        matches!(c.result, Err(ZoneError::NotAtWritePointer { .. })),
        "{:?}",
        c.result
    );
    assert!(a.write_at(0, &vec![1u8; s]).is_ok());
    assert!(matches!(
        read_async(&mut a, s as u64, 4096),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
    assert!(a.append(0, &vec![0u8; s]).is_err());
    // Nothing above is a member's fault.
    assert!(a.members().iter().all(|m| m.state == MemberState::Ok));
}

#[test]
fn up_to_m_failed_members_lose_nothing_and_writes_go_on() {
    for (r, n) in shapes() {
        let (_, m) = r.shards(n).expect("shape");
        if m == 0 {
            continue;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(11 + n as u64);
        let mut a = mem_array(r, n);
        let mut model = Model::new();
        fill(&mut a, &mut model, &mut rng, 2);
        let mut order: Vec<u32> = (0..n as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        for &victim in order.iter().take(m as usize) {
            a.fail_member(victim, "test").expect("member");
            check_reads(&mut a, &model, &mut rng);
        }
        // Writes continue over the survivors, and read back degraded.
        fill(&mut a, &mut model, &mut rng, 4);
        check_reads(&mut a, &model, &mut rng);
        a.flush().expect("flush");
        // One more and the data that needed it fails, never reads wrong.
        a.fail_member(order[m as usize], "test").expect("member");
        let zsize = a.geometry().zone_size;
        let mut saw_error = false;
        for z in 0..2u64 {
            let len = model.zones[z as usize].len();
            match read_async(&mut a, z * zsize, len) {
                Ok(b) => assert_eq!(b, model.zones[z as usize], "{r}: wrong data"),
                Err(ZoneError::Device(shale_device::DeviceError::Unavailable { .. })) => {
                    saw_error = true
                }
                Err(e) => panic!("{r}: unexpected {e}"),
            }
        }
        assert!(saw_error, "{r}: a stripe missing M+1 shards must fail");
        let s = a.geometry().write_unit as usize;
        let off = model.zones[0].len() as u64;
        assert!(
            write_async(&mut a, off, &vec![5u8; s]).result.is_err(),
            "{r}"
        );
    }
}

#[test]
fn read_errors_are_rebuilt_counted_and_fail_the_member_past_the_limit() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let (mut a, ctls) = fault_array(r, 5, 100);
    a.set_read_error_limit(3);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut model = Model::new();
    fill(&mut a, &mut model, &mut rng, 2);
    ctls[2].add_error_rule(ErrorRule {
        reads: true,
        writes: false,
        offset: 0,
        len: u64::MAX,
        remaining: Some(2),
    });
    check_reads(&mut a, &model, &mut rng);
    let st = &a.members()[2];
    assert_eq!(st.counters.read_errors, 2);
    assert_eq!(st.state, MemberState::Ok);
    assert!(st.counters.reconstructed_reads >= 2);
    ctls[2].add_error_rule(ErrorRule {
        reads: true,
        writes: false,
        offset: 0,
        len: u64::MAX,
        remaining: None,
    });
    check_reads(&mut a, &model, &mut rng);
    assert_eq!(a.member_state(2), Some(MemberState::Failed));
    check_reads(&mut a, &model, &mut rng);
}

#[test]
fn a_write_error_fails_the_member_not_the_write() {
    let r = Redundancy::Parity { k: 4, m: 2 };
    let (mut a, ctls) = fault_array(r, 6, 200);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut model = Model::new();
    fill(&mut a, &mut model, &mut rng, 1);
    ctls[4].add_error_rule(ErrorRule {
        reads: false,
        writes: true,
        offset: 0,
        len: u64::MAX,
        remaining: None,
    });
    fill(&mut a, &mut model, &mut rng, 2);
    assert_eq!(a.member_state(4), Some(MemberState::Failed));
    assert_eq!(a.members()[4].counters.write_errors, 1);
    check_reads(&mut a, &model, &mut rng);
    // Two more write failures exceed M = 2: the write fails.
    for i in [0, 1] {
        ctls[i].add_error_rule(ErrorRule {
            reads: false,
            writes: true,
            offset: 0,
            len: u64::MAX,
            remaining: None,
        });
    }
    let s = a.geometry().write_unit as usize;
    let off = a.geometry().zone_size * 2;
    assert!(write_async(&mut a, off, &vec![1u8; s]).result.is_err());
}

#[test]
fn members_disagreeing_after_a_crash_show_the_lowest_pointer_until_finished() {
    let r = Redundancy::Parity { k: 2, m: 1 };
    let (mut a, ctls) = fault_array(r, 3, 300);
    let s = a.geometry().write_unit as usize;
    let zsize = a.geometry().zone_size;
    a.write_at(zsize, &vec![1u8; 2 * s]).expect("write");
    a.flush().expect("flush");
    a.write_at(zsize + 2 * s as u64, &vec![2u8; s])
        .expect("write");
    // Only member 0 made the third row durable before the power failed.
    a.member_device_mut(0)
        .expect("m0")
        .flush()
        .expect("flush m0");
    drop(a);
    let members: Vec<_> = ctls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (_, dev) = c.crash(&CrashMode::DropAll).expect("crash");
            (Some(ZoneEmu::open(dev).expect("reopen")), format!("f{i}"))
        })
        .collect();
    let mut a = ZoneArray::new(members, r, UNIT).expect("array");
    let info = a.zone_info(1).expect("info");
    assert_eq!(info.write_pointer - info.start, 2 * s as u64);
    assert_eq!(info.state, ZoneState::Closed);
    let c = write_async(&mut a, zsize + 2 * s as u64, &vec![3u8; s]);
    assert!(
        matches!(c.result, Err(ZoneError::NotAtWritePointer { .. })),
        "{:?}",
        c.result
    );
    assert!(a.members().iter().all(|m| m.state == MemberState::Ok));
    let mut back = vec![0u8; 2 * s];
    a.read_at(zsize, &mut back).expect("read");
    assert!(back.iter().all(|&b| b == 1));
    a.manage(1, ZoneAction::Finish).expect("finish");
    assert_eq!(a.zone_info(1).expect("info").state, ZoneState::Full);
    a.manage(1, ZoneAction::Reset).expect("reset");
    assert_eq!(a.zone_info(1).expect("info").state, ZoneState::Empty);
    a.write_at(zsize, &vec![4u8; s])
        .expect("a reset zone takes writes again");
}

#[test]
fn a_missing_member_at_open_is_degraded_not_fatal() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let mut members: Vec<_> = (0..5).map(mem_member).collect();
    members[3].0 = None;
    let mut a = ZoneArray::new(members, r, UNIT).expect("degraded array");
    assert_eq!(a.member_state(3), Some(MemberState::Missing));
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let mut model = Model::new();
    fill(&mut a, &mut model, &mut rng, 2);
    check_reads(&mut a, &model, &mut rng);
    let mut members: Vec<_> = (0..5).map(mem_member).collect();
    members[3].0 = None;
    members[1].0 = None;
    assert!(ZoneArray::new(members, r, UNIT).is_err());
}

#[test]
fn zone_management_and_limits_follow_the_members() {
    let mut a = mem_array(Redundancy::Mirror, 2);
    let s = a.geometry().write_unit as usize;
    a.manage(0, ZoneAction::Open).expect("open");
    assert_eq!(a.zone_info(0).expect("i").state, ZoneState::ExplicitlyOpen);
    a.manage(0, ZoneAction::Close).expect("close");
    assert_eq!(a.zone_info(0).expect("i").state, ZoneState::Empty);
    a.write_at(0, &vec![4u8; s]).expect("write");
    a.manage(0, ZoneAction::Finish).expect("finish");
    let i = a.zone_info(0).expect("i");
    assert_eq!(
        (i.state, i.write_pointer),
        (ZoneState::Full, i.start + i.capacity)
    );
    let mut z = vec![0u8; 4096];
    a.read_at(i.capacity - 4096, &mut z)
        .expect("a full zone reads to its end");
    assert!(a.manage(ZONES, ZoneAction::Reset).is_err());
    let mut all = Vec::new();
    a.report_zones(0, u32::MAX, &mut all).expect("report");
    assert_eq!(all.len(), ZONES as usize);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random writes, reads, member failures (at most M) and zone resets, many
    /// requests in flight at once, against the byte model.
    #[test]
    fn random_operations_match_the_model(seed in any::<u64>(), shape in 0usize..8) {
        let (r, n) = shapes()[shape];
        let (_, m) = r.shards(n).expect("shape");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut a = mem_array(r, n);
        let mut model = Model::new();
        let s = a.geometry().write_unit as usize;
        let zsize = a.geometry().zone_size;
        let cap = a.geometry().zone_capacity as usize;
        let mut failed = 0;
        let mut expect: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
        // Writes in flight (tag, zone, start): reads stay below them, since a read of
        // data whose write has not completed may see either.
        let mut writing: Vec<(u64, usize, usize)> = Vec::new();
        for step in 0..120u64 {
            let z = rng.gen_range(0..ZONES) as usize;
            match rng.gen_range(0..10) {
                0..=3 => {
                    let rows = rng.gen_range(1..=3);
                    if model.zones[z].len() + rows * s > cap {
                        continue;
                    }
                    let data = random_rows(&mut rng, s, rows);
                    let off = z as u64 * zsize + model.zones[z].len() as u64;
                    a.submit(ZoneRequest { tag: step, op: ZoneOp::Write { offset: off, buf: IoBuf::from_slice(&data), fua: false } });
                    writing.push((step, z, model.zones[z].len()));
                    model.zones[z].extend_from_slice(&data);
                    expect.push((step, None));
                }
                4..=7 => {
                    let readable = writing
                        .iter()
                        .filter(|w| w.1 == z)
                        .map(|w| w.2)
                        .min()
                        .unwrap_or(model.zones[z].len());
                    let blocks = readable / 4096;
                    if blocks == 0 {
                        continue;
                    }
                    let first = rng.gen_range(0..blocks);
                    let nb = rng.gen_range(1..=(blocks - first).min(20));
                    let want = model.zones[z][first * 4096..(first + nb) * 4096].to_vec();
                    a.submit(ZoneRequest { tag: step, op: ZoneOp::Read { offset: z as u64 * zsize + first as u64 * 4096, buf: IoBuf::zeroed(nb * 4096) } });
                    expect.push((step, Some(want)));
                }
                8 if failed < m => {
                    let v = rng.gen_range(0..n as u32);
                    if a.member_state(v) == Some(MemberState::Ok) {
                        a.fail_member(v, "test").expect("member");
                        failed += 1;
                    }
                }
                9 => {
                    // Drain, then reset the zone.
                    let mut out = Vec::new();
                    while a.in_flight() > 0 {
                        a.poll(&mut out, usize::MAX).expect("poll");
                    }
                    check(&mut expect, &mut writing, out)?;
                    a.manage(z as u32, ZoneAction::Reset).expect("reset");
                    model.zones[z].clear();
                }
                _ => {}
            }
            if rng.gen_range(0..4) == 0 {
                let mut out = Vec::new();
                a.poll(&mut out, 1).expect("poll");
                check(&mut expect, &mut writing, out)?;
            }
        }
        let mut out = Vec::new();
        while a.in_flight() > 0 {
            a.poll(&mut out, usize::MAX).expect("poll");
        }
        check(&mut expect, &mut writing, out)?;
        prop_assert!(expect.is_empty(), "requests never completed: {}", expect.len());
        prop_assert_eq!(a.in_flight(), 0);
    }
}

fn check(
    expect: &mut Vec<(u64, Option<Vec<u8>>)>,
    writing: &mut Vec<(u64, usize, usize)>,
    out: Vec<ZoneCompletion>,
) -> Result<(), TestCaseError> {
    for c in out {
        writing.retain(|w| w.0 != c.tag);
        let i = expect
            .iter()
            .position(|(t, _)| *t == c.tag)
            .ok_or_else(|| TestCaseError::fail(format!("unexpected tag {}", c.tag)))?;
        let (_, want) = expect.remove(i);
        prop_assert!(c.result.is_ok(), "tag {}: {:?}", c.tag, c.result);
        if let Some(w) = want {
            let got = c.buf.expect("buffer");
            let diff = got.iter().zip(&w).position(|(a, b)| a != b);
            prop_assert!(
                diff.is_none(),
                "tag {}: first wrong byte at {:?} of {}",
                c.tag,
                diff,
                w.len()
            );
        }
    }
    Ok(())
}

fn fresh_member(name: &str) -> ZoneEmu<MemDevice> {
    let cfg = emu_config();
    let bytes = cfg.device_bytes_for(ZONES + LABEL_ZONES).expect("size");
    let dev = MemDevice::new(bytes, 4096).expect("mem").with_name(name);
    ZoneEmu::format(dev, &cfg).expect("format")
}

/// Runs the rebuild to its end (bounded).
fn run_rebuild<Z: ZonedDevice>(a: &mut ZoneArray<Z>) {
    for _ in 0..100_000 {
        if !a.rebuilding() {
            return;
        }
        a.maintain();
    }
    panic!("rebuild did not finish");
}

#[test]
fn a_replaced_member_is_rebuilt_from_live_zones_only() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let mut a = mem_array(r, 5);
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let mut model = Model::new();
    fill(&mut a, &mut model, &mut rng, 3);
    a.fail_member(2, "test").expect("fail");
    fill(&mut a, &mut model, &mut rng, 4);
    let reply = a.replace("m2", fresh_member("new2"), "new2".into());
    assert!(reply.is_ok(), "{reply:?}");
    assert_eq!(a.member_state(2), Some(MemberState::Rebuilding));
    // Reads during the rebuild are served (degraded) throughout.
    for _ in 0..3 {
        a.maintain();
        check_reads(&mut a, &model, &mut rng);
    }
    run_rebuild(&mut a);
    assert_eq!(a.member_state(2), Some(MemberState::Ok));
    let written: usize = model.zones.iter().map(Vec::len).sum();
    let rebuilt = a.members()[2].counters.bytes_written;
    // One unit in five of each written row (plus, on member 2, nothing else).
    assert_eq!(
        rebuilt as usize,
        written / 4,
        "rebuild wrote more than the live data"
    );
    // The rebuilt member now carries its share: lose another and read everything.
    a.fail_member(0, "test").expect("fail");
    check_reads(&mut a, &model, &mut rng);
}

#[test]
fn writes_and_resets_during_a_rebuild_are_not_lost() {
    let r = Redundancy::Parity { k: 2, m: 1 };
    let mut a = mem_array(r, 3);
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let mut model = Model::new();
    fill(&mut a, &mut model, &mut rng, 4);
    a.fail_member(1, "test").expect("fail");
    a.replace("1", fresh_member("new1"), "new1".into())
        .expect("replace");
    let s = a.geometry().write_unit as usize;
    let zsize = a.geometry().zone_size;
    for step in 0..40u64 {
        a.maintain();
        let z = (step % ZONES as u64) as usize;
        match step % 7 {
            3 if z > 0 => {
                a.manage(z as u32, ZoneAction::Reset).expect("reset");
                model.zones[z].clear();
            }
            _ if model.zones[z].len() + s <= a.geometry().zone_capacity as usize => {
                let data = random_rows(&mut rng, s, 1);
                let off = z as u64 * zsize + model.zones[z].len() as u64;
                let c = write_async(&mut a, off, &data);
                c.result.expect("write during rebuild");
                model.zones[z].extend_from_slice(&data);
            }
            _ => {}
        }
    }
    run_rebuild(&mut a);
    assert_eq!(a.member_state(1), Some(MemberState::Ok));
    a.fail_member(2, "test").expect("fail");
    check_reads(&mut a, &model, &mut rng);
}

#[test]
fn a_rebuild_resumes_after_a_restart() {
    let r = Redundancy::Parity { k: 4, m: 1 };
    let members: Vec<_> = (0..5)
        .map(|i| {
            let (d, n) = mem_member(i);
            (d.expect("present"), n)
        })
        .collect();
    let mut a = ZoneArray::create(members, r, UNIT, [9; 16]).expect("create");
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let mut model = Model::new();
    fill(&mut a, &mut model, &mut rng, 5);
    a.flush().expect("flush");
    a.replace("m3", fresh_member("new3"), "new3".into())
        .expect("replace");
    for _ in 0..4 {
        a.maintain();
    }
    assert!(a.rebuilding());
    let devs: Vec<_> = a
        .into_members()
        .into_iter()
        .filter_map(|(d, n)| Some((d?, n)))
        .collect();
    let mut a = ZoneArray::open(devs).expect("reopen");
    assert_eq!(a.member_state(3), Some(MemberState::Rebuilding));
    assert!(a.rebuilding());
    check_reads(&mut a, &model, &mut rng);
    run_rebuild(&mut a);
    assert_eq!(a.member_state(3), Some(MemberState::Ok));
    let gen = a.generation();
    a.fail_member(1, "test").expect("fail");
    assert!(a.generation() > gen);
    check_reads(&mut a, &model, &mut rng);
}

#[test]
fn operators_command_through_the_handle() {
    let mut a = mem_array(Redundancy::Parity { k: 2, m: 1 }, 3);
    let h = a.handle();
    assert_eq!(h.status().members.len(), 3);
    let rx = h.submit(crate::Command::Fail {
        member: "m1".into(),
    });
    a.maintain();
    let reply = rx.recv().expect("answered");
    assert!(reply.is_ok(), "{reply:?}");
    assert_eq!(h.status().members[1].state, MemberState::Failed);
    let rx = h.submit(crate::Command::Fail {
        member: "nobody".into(),
    });
    a.maintain();
    assert!(rx.recv().expect("answered").is_err());
    let rx = h.submit(crate::Command::Replace {
        old: "m1".into(),
        new: fresh_member("n1"),
        name: "n1".into(),
    });
    a.maintain();
    assert!(rx.recv().expect("answered").is_ok());
    run_rebuild(&mut a);
    a.maintain();
    let st = h.status();
    assert_eq!(st.members[1].state, MemberState::Ok);
    assert_eq!(st.members[1].name, "n1");
    assert!(st.rebuild.is_none());
}

#[test]
fn a_corrupt_unit_is_rebuilt_from_the_others() {
    use shale_device::BlockDevice;
    for (r, n) in [
        (Redundancy::Parity { k: 4, m: 1 }, 5),
        (Redundancy::Parity { k: 4, m: 2 }, 6),
        (Redundancy::Mirror, 2),
    ] {
        let mut a = mem_array(r, n);
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        let s = a.geometry().write_unit as usize;
        let data = random_rows(&mut rng, s, 3);
        a.write_at(0, &data).expect("write");
        let l = *a.layout();
        // Row 1, data shard 0: garbage on its member, behind the zone emulation.
        let victim = l.member_of(0, 1, 0);
        let dev = a.member_device_mut(victim).expect("member");
        let at = dev.data_offset() + dev.geometry().zone_start(LABEL_ZONES) + UNIT + 8192;
        dev.inner_mut()
            .write_at(at, &[0x5a; 4096])
            .expect("corrupt");
        let off = s as u64 + 8192;
        let mut plain = vec![0u8; 4096];
        a.read_at(off, &mut plain).expect("read");
        assert_ne!(
            plain,
            data[off as usize..off as usize + 4096],
            "{r}: corruption not visible"
        );
        let mut rebuilt = vec![0u8; 3 * 4096];
        a.read_rebuilt(off - 4096, &mut rebuilt, 0)
            .expect("rebuilt read");
        assert!(
            rebuilt == data[off as usize - 4096..off as usize + 8192],
            "{r}: not rebuilt"
        );
        assert_eq!(a.members()[victim as usize].counters.corrupt_reads, 1);
    }
}

/// A K+M array in memory with the unit K's rows take (a padded last unit when K does
/// not divide the row).
fn padded_array(k: u8, m: u8) -> (Redundancy, ZoneArray<ZoneEmu<MemDevice>>) {
    let r = Redundancy::Parity { k, m };
    let unit = StripeLayout::choose_unit(u32::from(k), 4096).expect("unit");
    let members = (0..usize::from(k + m)).map(mem_member).collect();
    (r, ZoneArray::new(members, r, unit).expect("array"))
}

/// K that does not divide a 512 KiB row (3+1, 6+2): every row is one whole group, the
/// last data unit ends in zeros on media, and the padding takes part in the parity,
/// so degraded reads and a rebuild give the data back.
#[test]
fn rows_k_does_not_divide_end_in_padding_and_survive_losses() {
    for (k, m) in [(3u8, 1u8), (6, 2), (5, 1)] {
        let (r, mut a) = padded_array(k, m);
        let unit = a.layout().unit;
        assert_eq!(a.geometry().write_unit as u64, STRIPE_BYTES_MAX, "{r}");
        let mut rng = ChaCha8Rng::seed_from_u64(u64::from(k) * 10 + u64::from(m));
        let mut model = Model::new();
        fill_rows(&mut a, &mut model, &mut rng, 3, &[1, 2]);
        check_reads(&mut a, &model, &mut rng);
        // The padding of row 0 of zone 0 is zeros on the member holding the last
        // data unit.
        let l = *a.layout();
        let last = u32::from(k) - 1;
        let pad = (l.unit - l.shard_data_bytes(last)) as usize;
        assert!(pad > 0, "{r}: {unit}-byte units divide the row");
        let holder = l.member_of(0, 0, last);
        let dev = a.member_device_mut(holder).expect("member");
        let at = dev.geometry().zone_start(LABEL_ZONES) + l.unit - pad as u64;
        let mut b = vec![1u8; pad];
        dev.read_at(at, &mut b).expect("member read");
        assert!(b.iter().all(|&x| x == 0), "{r}: padding holds data");
        // Lose M members: every byte still reads back.
        for victim in 0..u32::from(m) {
            a.fail_member(victim, "test").expect("fail");
        }
        check_reads(&mut a, &model, &mut rng);
        // Replace one and rebuild it; then it carries its share.
        a.replace("0", fresh_member("new0"), "new0".into())
            .expect("replace");
        run_rebuild(&mut a);
        assert_eq!(a.member_state(0), Some(MemberState::Ok), "{r}");
        a.fail_member(u32::from(m), "test").expect("fail");
        check_reads(&mut a, &model, &mut rng);
    }
}

/// A one-row write where K does not divide the row sends its first K - 1 units as
/// they are and a padded copy of the short last one: the caller gets its own buffer
/// back whole (the parts joined in place), with a member out too.
#[test]
fn a_one_row_write_k_does_not_divide_gives_the_callers_buffer_back() {
    for (k, m) in [(3u8, 1u8), (6, 2), (5, 1)] {
        let (r, mut a) = padded_array(k, m);
        let mut rng = ChaCha8Rng::seed_from_u64(u64::from(k) * 7 + u64::from(m));
        let row = a.geometry().write_unit as usize;
        let zsize = a.geometry().zone_size;
        let mut model = Model::new();
        for z in 0..2u32 {
            if z == 1 {
                // The member holding row 0's first data unit is out: that unit stays
                // with the op, and the buffer still comes back whole.
                let holder = a.layout().member_of(1, 0, 0);
                a.fail_member(holder, "test").expect("fail");
            }
            let data = random_rows(&mut rng, row, 1);
            let off = u64::from(z) * zsize;
            let c = write_async(&mut a, off, &data);
            assert_eq!(c.result.expect("write"), Some(off), "{r}");
            let back = c.buf.expect("the caller's buffer");
            assert_eq!(back.len(), row, "{r}");
            assert!(back[..] == data[..], "{r}: buffer not given back intact");
            model.zones[z as usize].extend_from_slice(&data);
        }
        check_reads(&mut a, &model, &mut rng);
    }
}
