use super::*;
use crate::{DeviceInfo, MemDevice};

const KB: u64 = 1024;
const ZONE: u64 = 64 * KB;
const CAP: u64 = 48 * KB;
/// Metadata area for up to 252 zones: two geometry blocks and two one-block tables
/// (16 KiB), rounded up so zone 0 starts aligned to the zone size.
const META: u64 = ZONE;

fn config() -> ZoneEmuConfig {
    ZoneEmuConfig {
        zone_size: ZONE,
        zone_capacity: CAP,
        max_open_zones: 2,
        max_active_zones: 3,
        zone_count_max: 0,
    }
}

fn mem(zones: u64, lbs: u32) -> MemDevice {
    MemDevice::new(META + zones * ZONE, lbs).expect("valid mem device")
}

/// A device whose asynchronous discards take effect only at the next `poll`, after
/// anything submitted later (as an io_uring hole punch may): a write the emulator
/// let overtake a reset's discard would be erased by it.
#[derive(Debug)]
struct LateDiscard<D> {
    inner: D,
    queued: VecDeque<IoRequest>,
    discards: u64,
    /// The next queued discard fails (and does nothing).
    fail_next: bool,
    /// The next discard vanishes: never completed, not counted in flight.
    lose_next: bool,
}

impl<D: BlockDevice> LateDiscard<D> {
    fn new(inner: D) -> LateDiscard<D> {
        LateDiscard {
            inner,
            queued: VecDeque::new(),
            discards: 0,
            fail_next: false,
            lose_next: false,
        }
    }

    /// Applies queued discards and drops their completions (a power cycle).
    fn settle(&mut self) {
        for req in std::mem::take(&mut self.queued) {
            if let IoOp::Discard { offset, len } = req.op {
                self.inner.discard(offset, len).expect("queued discard");
            }
        }
    }
}

impl<D: BlockDevice> BlockDevice for LateDiscard<D> {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn submit(&mut self, req: IoRequest) {
        match req.op {
            IoOp::Discard { .. } if std::mem::take(&mut self.lose_next) => {}
            IoOp::Discard { .. } => self.queued.push_back(req),
            _ => self.inner.submit(req),
        }
    }
    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let mut added = 0;
        for req in std::mem::take(&mut self.queued) {
            let IoOp::Discard { offset, len } = req.op else {
                unreachable!("only discards are queued")
            };
            self.discards += 1;
            let result = if std::mem::take(&mut self.fail_next) {
                Err(DeviceError::Injected {
                    op: IoOpKind::Discard,
                    offset,
                })
            } else {
                self.inner.discard(offset, len)
            };
            out.push(IoCompletion {
                tag: req.tag,
                buf: None,
                result,
            });
            added += 1;
        }
        Ok(added + self.inner.poll(out, min_complete.saturating_sub(added))?)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.queued.len()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&mut self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.inner.discard(offset, len)
    }
}

/// Submits an asynchronous append of `bytes` to `zone`.
fn submit_append<D: BlockDevice>(emu: &mut ZoneEmu<D>, tag: u64, zone: u32, bytes: &[u8]) {
    emu.submit(ZoneRequest {
        tag,
        op: ZoneOp::Append {
            zone,
            buf: IoBuf::from_slice(bytes),
            fua: false,
        },
    });
}

fn small() -> ZoneEmu<MemDevice> {
    ZoneEmu::format(mem(8, 4096), &config()).expect("format")
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(2654435761).wrapping_add(seed) >> 7) as u8 | 1)
        .collect()
}

fn states(emu: &impl ZonedDevice) -> Vec<(ZoneState, u64)> {
    let mut v = Vec::new();
    emu.report_zones(0, u32::MAX, &mut v).expect("report");
    v.iter()
        .map(|z| (z.state, z.write_pointer - z.start))
        .collect()
}

#[test]
fn format_lays_out_zones_after_metadata() {
    let emu = small();
    let g = emu.geometry();
    assert_eq!(g.zone_count, 8);
    assert_eq!(g.zone_size, ZONE);
    assert_eq!(g.zone_capacity, CAP);
    assert_eq!(g.logical_block_size, 4096);
    assert_eq!(emu.data_offset(), META);
    assert!(states(&emu).iter().all(|&s| s == (ZoneState::Empty, 0)));
    let z = emu.zone_info(3).expect("zone 3");
    assert_eq!(
        (z.start, z.capacity, z.write_pointer),
        (3 * ZONE, CAP, 3 * ZONE)
    );
    assert!(matches!(
        emu.zone_info(8),
        Err(ZoneError::NoSuchZone { zone: 8, count: 8 })
    ));
}

#[test]
fn format_rejects_bad_configs() {
    let bad = [
        ZoneEmuConfig {
            zone_capacity: ZONE + 4096,
            ..config()
        },
        ZoneEmuConfig {
            zone_capacity: 0,
            ..config()
        },
        ZoneEmuConfig {
            zone_size: ZONE + 512,
            ..config()
        },
        ZoneEmuConfig {
            zone_size: 0,
            ..config()
        },
        ZoneEmuConfig {
            max_open_zones: 4,
            max_active_zones: 3,
            ..config()
        },
    ];
    for c in bad {
        assert!(
            matches!(
                ZoneEmu::format(mem(8, 4096), &c),
                Err(DeviceError::InvalidGeometry { .. })
            ),
            "{c:?} accepted"
        );
    }
    let tiny = MemDevice::new(META + ZONE - 4096, 4096).expect("mem");
    assert!(matches!(
        ZoneEmu::format(tiny, &config()),
        Err(DeviceError::TooSmall { .. })
    ));
    let capped = ZoneEmu::format(
        mem(8, 4096),
        &ZoneEmuConfig {
            zone_count_max: 5,
            ..config()
        },
    )
    .expect("format");
    assert_eq!(capped.geometry().zone_count, 5);
}

#[test]
fn writes_only_at_the_write_pointer_and_within_capacity() {
    let mut emu = small();
    let d = data(8192, 1);
    assert_eq!(emu.write_at(0, &d).expect("write at wp"), 0);
    assert!(matches!(
        emu.write_at(0, &d),
        Err(ZoneError::NotAtWritePointer {
            zone: 0,
            offset: 0,
            write_pointer: 8192
        })
    ));
    assert!(matches!(
        emu.write_at(ZONE - 4096, &d),
        Err(ZoneError::CrossesZoneBoundary { .. })
    ));
    assert!(matches!(
        emu.write_at(8192, &[0u8; 100]),
        Err(ZoneError::Device(DeviceError::Misaligned { .. }))
    ));
    assert!(matches!(
        emu.write_at(8192, &[]),
        Err(ZoneError::Device(DeviceError::ZeroLength { .. }))
    ));
    assert!(matches!(
        emu.write_at(8 * ZONE, &d),
        Err(ZoneError::Device(DeviceError::OutOfRange { .. }))
    ));
    // Past capacity: 40 KiB left, 44 KiB does not fit, 40 KiB fills the zone.
    assert!(matches!(
        emu.write_at(8192, &data(44 * 1024, 2)),
        Err(ZoneError::ZoneFull { zone: 0, .. })
    ));
    assert_eq!(
        emu.zone_info(0).expect("z").state,
        ZoneState::ImplicitlyOpen
    );
    emu.write_at(8192, &data(40 * 1024, 2)).expect("fill");
    let z = emu.zone_info(0).expect("z");
    assert_eq!((z.state, z.write_pointer), (ZoneState::Full, CAP));
    assert!(matches!(
        emu.append(0, &d),
        Err(ZoneError::ZoneFull { zone: 0, .. })
    ));
    // Reads: below the write pointer only, never across zones.
    let mut back = vec![0u8; 8192];
    emu.read_at(0, &mut back).expect("read");
    assert_eq!(back, d);
    let mut big = vec![0u8; 52 * 1024];
    assert!(matches!(
        emu.read_at(0, &mut big),
        Err(ZoneError::ReadPastWritePointer { zone: 0, .. })
    ));
    assert!(matches!(
        emu.read_at(ZONE, &mut back),
        Err(ZoneError::ReadPastWritePointer { zone: 1, .. })
    ));
    assert!(matches!(
        emu.read_at(ZONE - 4096, &mut back),
        Err(ZoneError::CrossesZoneBoundary { .. })
    ));
}

#[test]
fn append_returns_where_data_landed() {
    let mut emu = small();
    assert_eq!(emu.append(2, &data(4096, 1)).expect("append"), 2 * ZONE);
    assert_eq!(
        emu.append(2, &data(8192, 2)).expect("append"),
        2 * ZONE + 4096
    );
    let mut back = vec![0u8; 8192];
    emu.read_at(2 * ZONE + 4096, &mut back).expect("read");
    assert_eq!(back, data(8192, 2));
    assert!(matches!(
        emu.append(9, &data(4096, 1)),
        Err(ZoneError::NoSuchZone { zone: 9, .. })
    ));
    // Async appends: each completion says where its data went.
    let mut out = Vec::new();
    for t in 0..3u64 {
        submit_append(&mut emu, t, 2, &data(4096, 10 + t));
    }
    assert_eq!(emu.in_flight(), 3);
    assert_eq!(emu.poll(&mut out, 3).expect("poll"), 3);
    for c in &out {
        let at = c.result.as_ref().expect("ok").expect("landed");
        assert_eq!(at, 2 * ZONE + 12288 + c.tag * 4096);
        let mut back = vec![0u8; 4096];
        emu.read_at(at, &mut back).expect("read");
        assert_eq!(back, data(4096, 10 + c.tag));
    }
    assert_eq!(emu.in_flight(), 0);
}

#[test]
fn open_and_active_limits() {
    let mut emu = small(); // 2 open, 3 active
    emu.append(0, &[1u8; 4096]).expect("open 0");
    emu.append(1, &[1u8; 4096]).expect("open 1");
    assert!(matches!(
        emu.append(2, &[1u8; 4096]),
        Err(ZoneError::TooManyOpen { zone: 2, limit: 2 })
    ));
    assert!(matches!(
        emu.open_zone(2),
        Err(ZoneError::TooManyOpen { zone: 2, limit: 2 })
    ));
    emu.close_zone(0).expect("close 0");
    assert_eq!(emu.zone_info(0).expect("z").state, ZoneState::Closed);
    emu.open_zone(2).expect("explicit open 2");
    // Active: 0 closed, 1 and 2 open = 3 = limit.
    emu.close_zone(2).expect("close 2 with empty wp");
    assert_eq!(emu.zone_info(2).expect("z").state, ZoneState::Empty);
    emu.append(2, &[1u8; 4096]).expect("implicit open 2");
    emu.close_zone(2).expect("close 2");
    assert!(matches!(
        emu.append(3, &[1u8; 4096]),
        Err(ZoneError::TooManyActive { zone: 3, limit: 3 })
    ));
    assert!(matches!(
        emu.finish_zone(3),
        Err(ZoneError::TooManyActive { zone: 3, limit: 3 })
    ));
    emu.finish_zone(0).expect("finish releases");
    emu.append(3, &[1u8; 4096]).expect("now fits");
}

#[test]
fn management_follows_the_state_machine() {
    let mut emu = small();
    for (action, state) in [
        (ZoneAction::Close, ZoneState::Empty),
        (ZoneAction::Close, ZoneState::Full),
        (ZoneAction::Open, ZoneState::Full),
    ] {
        let zone = 4;
        if state == ZoneState::Full {
            emu.finish_zone(zone).expect("finish");
        }
        match emu.manage(zone, action) {
            Err(ZoneError::InvalidTransition {
                zone: 4,
                state: s,
                action: a,
            }) => assert_eq!((s, a), (state, action)),
            other => panic!("{action:?} on {state:?}: {other:?}"),
        }
    }
    emu.reset_zone(4).expect("reset full");
    emu.open_zone(4).expect("open empty");
    emu.open_zone(4).expect("open open is a no-op");
    assert_eq!(
        emu.zone_info(4).expect("z").state,
        ZoneState::ExplicitlyOpen
    );
    emu.append(4, &[3u8; 4096]).expect("write to explicit");
    assert_eq!(
        emu.zone_info(4).expect("z").state,
        ZoneState::ExplicitlyOpen
    );
    emu.close_zone(4).expect("close");
    emu.close_zone(4).expect("close closed is a no-op");
    emu.finish_zone(4).expect("finish");
    let z = emu.zone_info(4).expect("z");
    assert_eq!(
        (z.state, z.write_pointer),
        (ZoneState::Full, 4 * ZONE + CAP)
    );
    emu.finish_zone(4).expect("finish full is a no-op");
    assert!(matches!(
        emu.manage(8, ZoneAction::Reset),
        Err(ZoneError::NoSuchZone { .. })
    ));
}

/// Writes 16 KiB of `data(_, 5)` to zone 1 and resets it: Empty, nothing readable.
fn fill_and_reset_zone_1<D: BlockDevice>(emu: &mut ZoneEmu<D>) {
    emu.append(1, &data(16384, 5)).expect("append");
    emu.reset_zone(1).expect("reset");
    let z = emu.zone_info(1).expect("z");
    assert_eq!((z.state, z.write_pointer), (ZoneState::Empty, ZONE));
    let mut b = vec![0u8; 4096];
    assert!(matches!(
        emu.read_at(ZONE, &mut b),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
}

#[test]
fn reset_discards_the_zone_on_the_inner_device() {
    let mut dev = mem(8, 4096);
    {
        let mut emu = ZoneEmu::format(&mut dev, &config()).expect("format");
        fill_and_reset_zone_1(&mut emu);
    }
    let mut raw = vec![1u8; 16384];
    dev.read_at(META + ZONE, &mut raw).expect("raw read");
    assert!(raw.iter().all(|&b| b == 0), "reset did not trim");
}

#[test]
fn without_discard_on_reset_a_reset_only_moves_the_write_pointer() {
    let mut dev = mem(8, 4096);
    {
        let mut emu = ZoneEmu::format(&mut dev, &config()).expect("format");
        emu.set_discard_on_reset(false);
        fill_and_reset_zone_1(&mut emu);
        // The zone is reusable at once and reads back what is written next.
        emu.append(1, &data(4096, 9)).expect("append after reset");
        let mut b = vec![0u8; 4096];
        emu.read_at(ZONE, &mut b).expect("read");
        assert_eq!(b, data(4096, 9));
    }
    // Below the new write pointer the new data; above it the old bytes, never read.
    let mut raw = vec![0u8; 16384];
    dev.read_at(META + ZONE, &mut raw).expect("raw read");
    assert_eq!(&raw[..4096], &data(4096, 9)[..]);
    assert_eq!(&raw[4096..], &data(16384, 5)[4096..]);
    // Reopened, the zone keeps its write pointer and refuses reads above it.
    let mut emu = ZoneEmu::open(&mut dev).expect("reopen");
    let mut b = vec![0u8; 4096];
    assert!(matches!(
        emu.read_at(ZONE + 4096, &mut b),
        Err(ZoneError::ReadPastWritePointer { .. })
    ));
}

#[test]
fn writes_after_a_reset_wait_for_its_discard() {
    let mut emu = ZoneEmu::format(LateDiscard::new(mem(8, 4096)), &config()).expect("format");
    emu.append(1, &data(16384, 5)).expect("append");
    emu.reset_zone(1).expect("reset");
    assert_eq!(emu.inner().queued.len(), 1, "the discard is asynchronous");
    // Submitted while the discard is in flight: held, then written after it.
    let fresh = data(8192, 9);
    submit_append(&mut emu, 7, 1, &fresh);
    let mut out = Vec::new();
    assert_eq!(emu.poll(&mut out, 1).expect("poll"), 1);
    assert_eq!(out[0].tag, 7);
    assert_eq!(out[0].result.as_ref().expect("append"), &Some(ZONE));
    let mut back = vec![0u8; 8192];
    emu.read_at(ZONE, &mut back).expect("read");
    assert!(
        back == fresh,
        "the discard erased a write submitted after it"
    );

    // A synchronous append waits for the discard instead.
    emu.reset_zone(1).expect("reset again");
    emu.append(1, &fresh).expect("append");
    emu.read_at(ZONE, &mut back).expect("read");
    assert!(back == fresh);
    // The old bytes past the new write pointer were trimmed.
    let mut raw = vec![1u8; 8192];
    emu.inner
        .inner
        .read_at(META + ZONE + 8192, &mut raw)
        .expect("raw");
    assert!(raw.iter().all(|&b| b == 0));
    assert_eq!(emu.inner().discards, 2);
}

#[test]
fn a_failed_discard_is_reported_once_by_the_next_command() {
    let mut emu = ZoneEmu::format(LateDiscard::new(mem(8, 4096)), &config()).expect("format");
    emu.append(2, &data(4096, 1)).expect("append");
    emu.inner.fail_next = true;
    emu.reset_zone(2).expect("reset returns before its discard");
    // The held write still goes out, after the failed discard.
    submit_append(&mut emu, 3, 2, &data(4096, 2));
    let mut out = Vec::new();
    emu.poll(&mut out, 1).expect("poll");
    assert!(out[0].result.is_ok());
    assert!(matches!(
        emu.finish_zone(4),
        Err(ZoneError::Device(DeviceError::Injected {
            op: IoOpKind::Discard,
            ..
        }))
    ));
    emu.finish_zone(4).expect("reported once");
    // A flush reports it too (asynchronous flush shown; `flush` is the same path).
    emu.append(3, &data(4096, 3)).expect("append");
    emu.inner.fail_next = true;
    emu.reset_zone(3).expect("reset");
    emu.submit(ZoneRequest {
        tag: 4,
        op: ZoneOp::Flush,
    });
    out.clear();
    emu.poll(&mut out, 1).expect("poll");
    assert!(out[0].result.is_err(), "{:?}", out[0].result);
    emu.flush().expect("reported once");
}

#[test]
fn a_discard_the_inner_device_drops_is_an_error_not_a_hang() {
    let mut emu = ZoneEmu::format(LateDiscard::new(mem(8, 4096)), &config()).expect("format");
    emu.append(1, &data(4096, 1)).expect("append");
    emu.inner.lose_next = true;
    emu.reset_zone(1).expect("reset");
    assert!(matches!(
        emu.append(1, &data(4096, 2)),
        Err(ZoneError::Device(DeviceError::Io {
            op: IoOpKind::Discard,
            ..
        }))
    ));
}

#[test]
fn read_only_and_offline_zones() {
    let mut emu = small();
    emu.append(5, &data(8192, 1)).expect("append");
    emu.set_zone_state(5, ZoneFault::ReadOnly).expect("ro");
    let mut b = vec![0u8; 8192];
    emu.read_at(5 * ZONE, &mut b)
        .expect("read-only zones are readable");
    assert_eq!(b, data(8192, 1));
    assert!(matches!(
        emu.append(5, &b),
        Err(ZoneError::ReadOnly { zone: 5 })
    ));
    assert!(matches!(
        emu.reset_zone(5),
        Err(ZoneError::ReadOnly { zone: 5 })
    ));
    // The read-only zone no longer holds an open resource.
    emu.append(0, &[1u8; 4096]).expect("open 0");
    emu.append(1, &[1u8; 4096]).expect("open 1");
    emu.set_zone_state(5, ZoneFault::Offline).expect("offline");
    assert!(matches!(
        emu.read_at(5 * ZONE, &mut b),
        Err(ZoneError::Offline { zone: 5 })
    ));
    assert!(matches!(
        emu.set_zone_state(5, ZoneFault::ReadOnly),
        Err(ZoneError::Offline { zone: 5 })
    ));
    assert!(matches!(
        emu.finish_zone(5),
        Err(ZoneError::Offline { zone: 5 })
    ));
    // Fault states survive a reopen.
    let emu = ZoneEmu::open(emu.into_inner()).expect("reopen");
    assert_eq!(emu.zone_info(5).expect("z").state, ZoneState::Offline);
}

#[test]
fn reopen_after_flush_keeps_write_pointers_and_closes_open_zones() {
    let mut emu = ZoneEmu::format(mem(8, 4096), &ZoneEmuConfig::new(ZONE)).expect("format");
    emu.append(0, &data(8192, 1)).expect("append");
    emu.open_zone(1).expect("open");
    emu.append(2, &data(4096, 2)).expect("append");
    emu.close_zone(2).expect("close");
    emu.append(3, &data(ZONE as usize, 3)).expect("fill");
    emu.open_zone(6).expect("explicit open, nothing written");
    emu.flush().expect("flush");
    let emu = ZoneEmu::open(emu.into_inner()).expect("reopen");
    let s = states(&emu);
    assert_eq!(s[0], (ZoneState::Closed, 8192));
    assert_eq!(s[1], (ZoneState::Empty, 0));
    assert_eq!(s[2], (ZoneState::Closed, 4096));
    assert_eq!(s[3], (ZoneState::Full, ZONE));
    assert_eq!(s[6], (ZoneState::Empty, 0));
    let mut emu = emu;
    let mut b = vec![0u8; 8192];
    emu.read_at(0, &mut b).expect("read");
    assert_eq!(b, data(8192, 1));
    // Closed zones reopen implicitly on the next write.
    assert_eq!(emu.append(0, &[9u8; 4096]).expect("append"), 8192);
}

#[test]
fn reopen_without_flush_returns_to_last_persisted_table() {
    let mut emu = small();
    emu.append(0, &data(8192, 1)).expect("append");
    emu.flush().expect("flush");
    let g = emu.table_generation();
    emu.append(0, &data(4096, 2)).expect("append after flush");
    emu.append(1, &data(4096, 3)).expect("append after flush");
    assert_eq!(emu.table_generation(), g, "writes alone do not persist");
    let emu = ZoneEmu::open(emu.into_inner()).expect("reopen");
    let s = states(&emu);
    assert_eq!(s[0], (ZoneState::Closed, 8192));
    assert_eq!(s[1], (ZoneState::Empty, 0));
    assert_eq!(emu.table_generation(), g);
}

#[test]
fn torn_table_write_falls_back_to_previous_generation() {
    let mut dev = mem(8, 512);
    let slot_bytes;
    {
        let mut emu = ZoneEmu::format(&mut dev, &config()).expect("format");
        slot_bytes = emu.meta.table_slot_bytes;
        emu.append(0, &data(4096, 1)).expect("append");
        emu.flush().expect("flush"); // generation 2, slot 0
        emu.append(0, &data(4096, 2)).expect("append");
        emu.flush().expect("flush"); // generation 3, slot 1
        assert_eq!(emu.table_generation(), 3);
    }
    // Tear the newest table (slot 1): its second sector is stale garbage.
    dev.write_at(TABLE_SLOT0_OFFSET + slot_bytes, &[0x5Au8; 512])
        .expect("tear");
    {
        let emu = ZoneEmu::open(&mut dev).expect("falls back");
        assert_eq!(emu.table_generation(), 2);
        assert_eq!(states(&emu)[0], (ZoneState::Closed, 4096));
    }
    // Both tables gone: corrupt, not a panic.
    dev.write_at(TABLE_SLOT0_OFFSET, &[0u8; 512]).expect("wipe");
    assert!(matches!(
        ZoneEmu::open(&mut dev),
        Err(DeviceError::CorruptMetadata { .. })
    ));
}

#[test]
fn geometry_mirror_and_validation_against_the_device() {
    let mut dev = mem(8, 4096);
    drop(ZoneEmu::format(&mut dev, &config()).expect("format"));
    let mut image = vec![0u8; dev.size_bytes() as usize];
    dev.read_at(0, &mut image).expect("image");

    // Geometry copy 0 destroyed: copy 1 serves.
    dev.write_at(0, &[0xFFu8; 4096]).expect("smash");
    let emu = ZoneEmu::open(&mut dev).expect("mirror");
    assert_eq!(emu.geometry().zone_count, 8);
    drop(emu);
    dev.write_at(4096, &[0xFFu8; 4096]).expect("smash");
    assert!(matches!(
        ZoneEmu::open(&mut dev),
        Err(DeviceError::CorruptMetadata { .. })
    ));

    // Unformatted device.
    assert!(matches!(
        ZoneEmu::open(mem(8, 4096)),
        Err(DeviceError::CorruptMetadata { .. })
    ));
    // Device smaller than the format.
    let mut small_dev = mem(7, 4096);
    small_dev
        .write_at(0, &image[..META as usize])
        .expect("copy");
    assert!(matches!(
        ZoneEmu::open(small_dev),
        Err(DeviceError::InvalidGeometry { .. })
    ));
    // Another logical block size.
    let mut other = mem(8, 512);
    other.write_at(0, &image[..META as usize]).expect("copy");
    assert!(matches!(
        ZoneEmu::open(other),
        Err(DeviceError::InvalidGeometry { .. })
    ));
    // Device too small to hold even the geometry.
    assert!(matches!(
        ZoneEmu::open(MemDevice::new(4096, 4096).expect("mem")),
        Err(DeviceError::TooSmall { .. })
    ));
}

#[test]
fn reformat_never_picks_up_old_tables() {
    let mut dev = mem(8, 4096);
    {
        let mut emu = ZoneEmu::format(&mut dev, &config()).expect("format");
        emu.append(0, &data(4096, 1)).expect("append");
        emu.flush().expect("flush");
    }
    let emu = ZoneEmu::format(&mut dev, &config()).expect("reformat");
    assert_eq!(emu.meta.format_id, 2);
    drop(emu);
    let emu = ZoneEmu::open(&mut dev).expect("open");
    assert_eq!(states(&emu)[0], (ZoneState::Empty, 0));
}

#[test]
fn async_flush_persists_and_reports_errors_in_completions() {
    let mut emu = small();
    let mut tag = 0;
    for zone in 0..2u32 {
        for i in 0..4u64 {
            emu.submit(ZoneRequest {
                tag,
                op: ZoneOp::Write {
                    offset: emu.geometry().zone_start(zone) + i * 4096,
                    buf: IoBuf::from_slice(&data(4096, tag)),
                    fua: i == 3,
                },
            });
            tag += 1;
        }
    }
    emu.submit(ZoneRequest {
        tag: 100,
        op: ZoneOp::Flush,
    });
    emu.submit(ZoneRequest {
        tag: 101,
        op: ZoneOp::Write {
            offset: 3 * ZONE + 4096,
            buf: IoBuf::zeroed(4096),
            fua: false,
        },
    });
    emu.submit(ZoneRequest {
        tag: 102,
        op: ZoneOp::Read {
            offset: 4096,
            buf: IoBuf::zeroed(4096),
        },
    });
    let g = emu.table_generation();
    let mut out = Vec::new();
    let mut n = 0;
    while emu.in_flight() > 0 {
        n += emu.poll(&mut out, 1).expect("poll");
    }
    assert_eq!(n, 11);
    assert_eq!(emu.table_generation(), g + 1);
    for c in &out {
        match c.tag {
            0..=7 => assert!(c.result.is_ok()),
            100 => assert!(matches!(c.result, Ok(None))),
            101 => assert!(matches!(
                c.result,
                Err(ZoneError::NotAtWritePointer { zone: 3, .. })
            )),
            102 => assert_eq!(c.buf.as_deref(), Some(&data(4096, 1)[..])),
            t => panic!("unexpected tag {t}"),
        }
    }
    let emu = ZoneEmu::open(emu.into_inner()).expect("reopen");
    assert_eq!(states(&emu)[0], (ZoneState::Closed, 16384));
    assert_eq!(states(&emu)[1], (ZoneState::Closed, 16384));
}

mod model {
    //! A plain model of the ZNS state machine and limits, written independently
    //! of the emulator, and a property test holding the two in lockstep.
    use super::*;
    use proptest::prelude::*;

    const ZONES: u32 = 6;
    const OPEN_MAX: u32 = 2;
    const ACTIVE_MAX: u32 = 3;

    #[derive(Debug, Clone)]
    pub enum Op {
        /// Write `blocks` at the write pointer shifted by `shift` blocks.
        Write {
            zone: u32,
            shift: i8,
            blocks: u8,
            via_submit: bool,
        },
        Append {
            zone: u32,
            blocks: u8,
            via_submit: bool,
        },
        Read {
            zone: u32,
            at_block: u16,
            blocks: u8,
        },
        Manage {
            zone: u32,
            action: ZoneAction,
        },
        Fault {
            zone: u32,
            offline: bool,
        },
        Flush,
        Reopen,
    }

    fn op(cap_blocks: u16) -> impl Strategy<Value = Op> {
        let zone = 0..=ZONES; // ZONES itself does not exist
        let action = prop_oneof![
            Just(ZoneAction::Open),
            Just(ZoneAction::Close),
            Just(ZoneAction::Finish),
            Just(ZoneAction::Reset),
        ];
        prop_oneof![
            8 => (zone.clone(), -1i8..=1, 1u8..=6, any::<bool>()).prop_map(
                |(zone, shift, blocks, via_submit)| Op::Write { zone, shift: if shift == 0 || blocks % 3 != 0 { 0 } else { shift }, blocks, via_submit }
            ),
            6 => (zone.clone(), 1u8..=6, any::<bool>())
                .prop_map(|(zone, blocks, via_submit)| Op::Append { zone, blocks, via_submit }),
            4 => (zone.clone(), 0..cap_blocks + 4, 1u8..=4)
                .prop_map(|(zone, at_block, blocks)| Op::Read { zone, at_block, blocks }),
            5 => (zone.clone(), action).prop_map(|(zone, action)| Op::Manage { zone, action }),
            1 => (zone, any::<bool>()).prop_map(|(zone, offline)| Op::Fault { zone, offline }),
            2 => Just(Op::Flush),
            1 => Just(Op::Reopen),
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct MZone {
        state: ZoneState,
        wp: u64,
    }

    struct Model {
        zones: Vec<MZone>,
        persisted: Vec<MZone>,
        data: Vec<Vec<u8>>,
        cap: u64,
        lbs: u64,
    }

    fn open(s: ZoneState) -> bool {
        matches!(s, ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen)
    }

    impl Model {
        fn count(&self, f: impl Fn(ZoneState) -> bool) -> u32 {
            self.zones.iter().filter(|z| f(z.state)).count() as u32
        }
        fn opens(&self) -> u32 {
            self.count(open)
        }
        fn actives(&self) -> u32 {
            self.count(|s| open(s) || s == ZoneState::Closed)
        }

        /// Expected outcome of a write of `len` at `off` (None = append) to `zone`.
        /// For a write (`off` given) the zone is the one holding `off`.
        fn write(&mut self, zone: u32, off: Option<u64>, len: u64) -> Result<u64, &'static str> {
            let lba_end = u64::from(ZONES) * ZONE;
            let zone = match off {
                Some(o) => {
                    if o + len > lba_end {
                        return Err("OutOfRange");
                    }
                    if o / ZONE != (o + len - 1) / ZONE {
                        return Err("CrossesZoneBoundary");
                    }
                    (o / ZONE) as u32
                }
                None if zone >= ZONES => return Err("NoSuchZone"),
                None => zone,
            };
            let z = self.zones[zone as usize];
            let start = u64::from(zone) * ZONE;
            match z.state {
                ZoneState::Offline => return Err("Offline"),
                ZoneState::ReadOnly => return Err("ReadOnly"),
                ZoneState::Full => return Err("ZoneFull"),
                _ => {}
            }
            if off.is_some_and(|o| o != start + z.wp) {
                return Err("NotAtWritePointer");
            }
            if z.wp + len > self.cap {
                return Err("ZoneFull");
            }
            if z.state == ZoneState::Empty && self.actives() >= ACTIVE_MAX {
                return Err("TooManyActive");
            }
            if matches!(z.state, ZoneState::Empty | ZoneState::Closed) && self.opens() >= OPEN_MAX {
                return Err("TooManyOpen");
            }
            let zm = &mut self.zones[zone as usize];
            if matches!(zm.state, ZoneState::Empty | ZoneState::Closed) {
                zm.state = ZoneState::ImplicitlyOpen;
            }
            zm.wp += len;
            if zm.wp == self.cap {
                zm.state = ZoneState::Full;
            }
            Ok(start + z.wp)
        }

        fn read(&self, off: u64, len: u64) -> Result<(), &'static str> {
            if off + len > u64::from(ZONES) * ZONE {
                return Err("OutOfRange");
            }
            if off / ZONE != (off + len - 1) / ZONE {
                return Err("CrossesZoneBoundary");
            }
            let z = self.zones[(off / ZONE) as usize];
            if z.state == ZoneState::Offline {
                return Err("Offline");
            }
            if off % ZONE + len > z.wp {
                return Err("ReadPastWritePointer");
            }
            Ok(())
        }

        fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), &'static str> {
            if zone >= ZONES {
                return Err("NoSuchZone");
            }
            let z = self.zones[zone as usize];
            use ZoneAction::*;
            use ZoneState::*;
            let next = match (z.state, action) {
                (Offline, _) => return Err("Offline"),
                (ReadOnly, _) => return Err("ReadOnly"),
                (_, Reset) => Empty,
                (Empty, Open) => {
                    if self.actives() >= ACTIVE_MAX {
                        return Err("TooManyActive");
                    }
                    if self.opens() >= OPEN_MAX {
                        return Err("TooManyOpen");
                    }
                    ExplicitlyOpen
                }
                (Closed, Open) => {
                    if self.opens() >= OPEN_MAX {
                        return Err("TooManyOpen");
                    }
                    ExplicitlyOpen
                }
                (ImplicitlyOpen | ExplicitlyOpen, Open) => ExplicitlyOpen,
                (Full, Open) => return Err("InvalidTransition"),
                (Empty | Full, Close) => return Err("InvalidTransition"),
                (Closed, Close) => Closed,
                (_, Close) if z.wp == 0 => Empty,
                (_, Close) => Closed,
                (Empty, Finish) => {
                    if self.actives() >= ACTIVE_MAX {
                        return Err("TooManyActive");
                    }
                    Full
                }
                (_, Finish) => Full,
            };
            let wp = match next {
                Empty => 0,
                Full => self.cap,
                _ => z.wp,
            };
            self.zones[zone as usize] = MZone { state: next, wp };
            if next == Empty {
                self.data[zone as usize].clear();
            }
            self.persisted = self.zones.clone();
            Ok(())
        }

        fn fault(&mut self, zone: u32, offline: bool) -> Result<(), &'static str> {
            if zone >= ZONES {
                return Err("NoSuchZone");
            }
            let z = &mut self.zones[zone as usize];
            if z.state == ZoneState::Offline && !offline {
                return Err("Offline");
            }
            z.state = if offline {
                ZoneState::Offline
            } else {
                ZoneState::ReadOnly
            };
            self.persisted = self.zones.clone();
            Ok(())
        }

        fn reopen(&mut self) {
            self.zones = self
                .persisted
                .iter()
                .map(|z| match z.state {
                    s if open(s) && z.wp == 0 => MZone {
                        state: ZoneState::Empty,
                        wp: 0,
                    },
                    s if open(s) => MZone {
                        state: ZoneState::Closed,
                        wp: z.wp,
                    },
                    _ => *z,
                })
                .collect();
        }
    }

    fn kind(e: &ZoneError) -> &'static str {
        match e {
            ZoneError::NotAtWritePointer { .. } => "NotAtWritePointer",
            ZoneError::ZoneFull { .. } => "ZoneFull",
            ZoneError::TooManyOpen { .. } => "TooManyOpen",
            ZoneError::TooManyActive { .. } => "TooManyActive",
            ZoneError::ReadPastWritePointer { .. } => "ReadPastWritePointer",
            ZoneError::CrossesZoneBoundary { .. } => "CrossesZoneBoundary",
            ZoneError::NoSuchZone { .. } => "NoSuchZone",
            ZoneError::ReadOnly { .. } => "ReadOnly",
            ZoneError::Offline { .. } => "Offline",
            ZoneError::InvalidTransition { .. } => "InvalidTransition",
            ZoneError::Device(DeviceError::OutOfRange { .. }) => "OutOfRange",
            ZoneError::Device(e) => panic!("unexpected device error {e}"),
        }
    }

    fn fill(zone: u32, at: u64, len: u64, salt: u64) -> Vec<u8> {
        (0..len)
            .map(|i| ((u64::from(zone) * 977 + at + i + salt * 31) % 253) as u8 + 1)
            .collect()
    }

    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn run(lbs: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let cfg = ZoneEmuConfig {
            zone_size: ZONE,
            zone_capacity: CAP,
            max_open_zones: OPEN_MAX,
            max_active_zones: ACTIVE_MAX,
            zone_count_max: 0,
        };
        let mut emu = Some(
            ZoneEmu::format(LateDiscard::new(mem(u64::from(ZONES), lbs)), &cfg)
                .map_err(|e| TestCaseError::fail(e.to_string()))?,
        );
        let lbs = u64::from(lbs);
        let mut m = Model {
            zones: vec![
                MZone {
                    state: ZoneState::Empty,
                    wp: 0
                };
                ZONES as usize
            ],
            persisted: Vec::new(),
            data: vec![Vec::new(); ZONES as usize],
            cap: CAP,
            lbs,
        };
        m.persisted = m.zones.clone();
        let mut out = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            let e = emu.as_mut().expect("device present");
            match op {
                Op::Write {
                    zone,
                    shift,
                    blocks,
                    via_submit,
                } => {
                    let len = u64::from(blocks) * m.lbs;
                    let wp = m.zones.get(zone as usize).map_or(0, |z| z.wp);
                    let base = u64::from(zone) * ZONE + wp;
                    let off = (base as i64 + i64::from(shift) * m.lbs as i64).max(0) as u64;
                    let payload = fill(zone, off, len, step as u64);
                    let expect = m.write(0, Some(off), len);
                    let got = if via_submit {
                        e.submit(ZoneRequest {
                            tag: step as u64,
                            op: ZoneOp::Write {
                                offset: off,
                                buf: IoBuf::from_slice(&payload),
                                fua: false,
                            },
                        });
                        out.clear();
                        e.poll(&mut out, 1).expect("poll");
                        prop_assert_eq!(out.len(), 1);
                        let c = out.pop().expect("one completion");
                        c.result.map(|l| l.expect("landed"))
                    } else {
                        e.write_at(off, &payload)
                    };
                    match (&expect, &got) {
                        (Ok(a), Ok(b)) => {
                            prop_assert_eq!(a, b);
                            let z = (off / ZONE) as usize;
                            m.data[z].extend_from_slice(&payload);
                        }
                        (Err(k), Err(g)) => prop_assert_eq!(*k, kind(g), "step {}", step),
                        _ => prop_assert!(
                            false,
                            "step {} write: model {:?}, device {:?}",
                            step,
                            expect,
                            got
                        ),
                    }
                }
                Op::Append {
                    zone,
                    blocks,
                    via_submit,
                } => {
                    let len = u64::from(blocks) * m.lbs;
                    let payload = fill(zone, 0, len, step as u64);
                    let expect = m.write(zone, None, len);
                    let got = if via_submit {
                        e.submit(ZoneRequest {
                            tag: step as u64,
                            op: ZoneOp::Append {
                                zone,
                                buf: IoBuf::from_slice(&payload),
                                fua: true,
                            },
                        });
                        out.clear();
                        e.poll(&mut out, 1).expect("poll");
                        let c = out.pop().expect("one completion");
                        c.result.map(|l| l.expect("landed"))
                    } else {
                        e.append(zone, &payload)
                    };
                    match (&expect, &got) {
                        (Ok(a), Ok(b)) => {
                            prop_assert_eq!(a, b);
                            m.data[zone as usize].extend_from_slice(&payload);
                        }
                        (Err(k), Err(g)) => prop_assert_eq!(*k, kind(g), "step {}", step),
                        _ => prop_assert!(
                            false,
                            "step {} append: model {:?}, device {:?}",
                            step,
                            expect,
                            got
                        ),
                    }
                }
                Op::Read {
                    zone,
                    at_block,
                    blocks,
                } => {
                    let at = u64::from(at_block) % (ZONE / m.lbs + 1);
                    let off = u64::from(zone) * ZONE + at * m.lbs;
                    let len = u64::from(blocks) * m.lbs;
                    let expect = m.read(off, len);
                    let mut buf = vec![0u8; len as usize];
                    let got = e.read_at(off, &mut buf);
                    match (&expect, &got) {
                        (Ok(()), Ok(())) => {
                            let z = (off / ZONE) as usize;
                            let rel = (off % ZONE) as usize;
                            // Only what the model knows was written is compared: the
                            // unwritten tail of a finished zone has no defined content.
                            let known = &m.data[z];
                            let n = known.len().saturating_sub(rel).min(len as usize);
                            if n > 0 {
                                prop_assert!(
                                    buf[..n] == known[rel..rel + n],
                                    "step {} read data differs",
                                    step
                                );
                            }
                        }
                        (Err(k), Err(g)) => prop_assert_eq!(*k, kind(g), "step {}", step),
                        _ => prop_assert!(
                            false,
                            "step {} read: model {:?}, device {:?}",
                            step,
                            expect,
                            got
                        ),
                    }
                }
                Op::Manage { zone, action } => {
                    let expect = m.manage(zone, action);
                    let got = e.manage(zone, action);
                    match (&expect, &got) {
                        (Ok(()), Ok(())) => {}
                        (Err(k), Err(g)) => prop_assert_eq!(*k, kind(g), "step {}", step),
                        _ => prop_assert!(
                            false,
                            "step {} {:?}: model {:?}, device {:?}",
                            step,
                            action,
                            expect,
                            got
                        ),
                    }
                }
                Op::Fault { zone, offline } => {
                    let expect = m.fault(zone, offline);
                    let f = if offline {
                        ZoneFault::Offline
                    } else {
                        ZoneFault::ReadOnly
                    };
                    let got = e.set_zone_state(zone, f);
                    match (&expect, &got) {
                        (Ok(()), Ok(())) => {}
                        (Err(k), Err(g)) => prop_assert_eq!(*k, kind(g), "step {}", step),
                        _ => prop_assert!(
                            false,
                            "step {} fault: model {:?}, device {:?}",
                            step,
                            expect,
                            got
                        ),
                    }
                }
                Op::Flush => {
                    if step % 2 == 0 {
                        e.flush().expect("flush");
                    } else {
                        e.submit(ZoneRequest {
                            tag: 1 << 40,
                            op: ZoneOp::Flush,
                        });
                        out.clear();
                        e.poll(&mut out, 1).expect("poll");
                        prop_assert!(out.pop().is_some_and(|c| c.result.is_ok()));
                    }
                    m.persisted = m.zones.clone();
                }
                Op::Reopen => {
                    let mut dev = emu.take().expect("device").into_inner();
                    dev.settle();
                    emu = Some(ZoneEmu::open(dev).map_err(|e| TestCaseError::fail(e.to_string()))?);
                    m.reopen();
                    for (z, mz) in m.zones.iter().enumerate() {
                        m.data[z].truncate(mz.wp as usize);
                    }
                }
            }
            let e = emu.as_ref().expect("device present");
            let got = states(e);
            let want: Vec<(ZoneState, u64)> = m.zones.iter().map(|z| (z.state, z.wp)).collect();
            prop_assert_eq!(got, want, "zone table after step {}", step);
            prop_assert_eq!(e.in_flight(), 0);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn matches_the_zns_model(
            lbs in prop_oneof![Just(512u32), Just(4096u32)],
            ops in proptest::collection::vec(op((CAP / 512) as u16), 1..120),
        ) {
            run(lbs, ops)?;
        }
    }
}

/// Every one-byte flip in the metadata area (both geometry copies, both table slots,
/// used and unused bytes) is reported by `verify_metadata`, and the device still
/// opens on the surviving copy.
#[test]
fn every_metadata_byte_flip_is_reported_and_survived() {
    let mut emu = small();
    emu.flush().expect("flush");
    let mut dev = emu.into_inner();
    assert_eq!(ZoneEmu::verify_metadata(&mut dev).expect("verify"), vec![]);
    let meta_end = TABLE_SLOT0_OFFSET + 2 * META_BLOCK_BYTES;
    // Every byte of the geometry copies; a stride through the table slots (their
    // used bytes are the header and eight 16-byte entries, all covered).
    let offsets = (0..TABLE_SLOT0_OFFSET)
        .chain((TABLE_SLOT0_OFFSET..meta_end).filter(|o| o % 4096 < 200 || o % 61 == 0));
    for at in offsets {
        let base = at / 4096 * 4096;
        let mut b = vec![0u8; 4096];
        dev.read_at(base, &mut b).expect("read");
        b[(at - base) as usize] ^= 0x10;
        dev.write_at(base, &b).expect("write");
        let problems = ZoneEmu::verify_metadata(&mut dev).expect("verify");
        assert!(!problems.is_empty(), "flip at byte {at} not reported");
        assert!(
            problems.iter().all(|p| !p.fatal),
            "flip at byte {at}: {problems:?}"
        );
        b[(at - base) as usize] ^= 0x10;
        dev.write_at(base, &b).expect("restore");
        let reopened = ZoneEmu::open(dev).expect("opens on the other copy");
        dev = reopened.into_inner();
    }
}

/// 600 zones of two 4 KiB blocks: three table blocks a copy.
fn many_zones() -> ZoneEmuConfig {
    ZoneEmuConfig {
        zone_size: 8 * KB,
        zone_capacity: 8 * KB,
        max_open_zones: 1,
        max_active_zones: 1,
        zone_count_max: 600,
    }
}

/// The metadata area's 4 KiB blocks that differ between two reads of it.
fn changed_blocks(a: &[u8], b: &[u8]) -> Vec<u64> {
    let bs = META_BLOCK_BYTES as usize;
    (0..a.len() / bs)
        .filter(|&i| a[i * bs..(i + 1) * bs] != b[i * bs..(i + 1) * bs])
        .map(|i| i as u64)
        .collect()
}

#[test]
fn a_persist_writes_only_the_table_blocks_that_changed() {
    let zc = many_zones();
    let size = zc.device_bytes_for(600).expect("fits");
    let mut dev = MemDevice::new(size, 4096).expect("device");
    let mut emu = ZoneEmu::format(&mut dev, &zc).expect("format");
    let slot = emu.meta.table_slot_bytes;
    assert_eq!(slot, 3 * META_BLOCK_BYTES);
    let area = |emu: &mut ZoneEmu<&mut MemDevice>| {
        let mut b = vec![0u8; (2 * slot) as usize];
        emu.inner_mut()
            .read_at(TABLE_SLOT0_OFFSET, &mut b)
            .expect("read");
        b
    };
    let g = emu.table_generation();
    let before = area(&mut emu);
    // Zone 300 is in block 1, whose newest copy after format is copy 1.
    emu.append(300, &[1u8; 4096]).expect("append");
    emu.flush().expect("flush");
    let after = area(&mut emu);
    assert_eq!(changed_blocks(&before, &after), vec![1], "block 1, copy 0");
    assert_eq!(emu.table_generation(), g + 1);
    // Nothing changed: a flush writes no table block.
    emu.flush().expect("flush");
    assert_eq!(changed_blocks(&after, &area(&mut emu)), Vec::<u64>::new());
    assert_eq!(emu.table_generation(), g + 1);
    // The next change of block 1 goes to its other copy; zone 599 is in block 2.
    emu.finish_zone(300).expect("finish");
    let finished = area(&mut emu);
    assert_eq!(changed_blocks(&after, &finished), vec![3 + 1]);
    emu.append(599, &[2u8; 4096]).expect("append");
    emu.flush().expect("flush");
    assert_eq!(changed_blocks(&finished, &area(&mut emu)), vec![2]);
    drop(emu);
    assert_eq!(ZoneEmu::verify_metadata(&mut dev).expect("verify"), vec![]);
    let emu = ZoneEmu::open(&mut dev).expect("reopen");
    let s = states(&emu);
    assert_eq!(s[300], (ZoneState::Full, 8 * KB));
    assert_eq!(s[599], (ZoneState::Closed, 4 * KB));
    assert!(s
        .iter()
        .enumerate()
        .all(|(i, &(st, _))| i == 300 || i == 599 || st == ZoneState::Empty));
}

/// One flush that closes an active zone in block 0 and opens one in block 1, under a
/// limit of one active zone; its inner flushes fail after the first and the power is
/// cut with each subset of the writes it left pending. Every outcome opens within the
/// limit: block 1's write is sent only once block 0's is durable.
#[test]
fn a_torn_persist_never_exceeds_the_active_zone_limit() {
    use crate::{CrashMode, FaultDevice};
    let zc = many_zones();
    let size = zc.device_bytes_for(600).expect("fits");
    let scenario = || {
        let dev = FaultDevice::new(size, 4096, 7).expect("device");
        let ctl = dev.controller();
        let mut emu = ZoneEmu::format(dev, &zc).expect("format");
        emu.append(0, &[1u8; 4096]).expect("open zone 0");
        emu.flush().expect("flush");
        emu.append(0, &[2u8; 4096]).expect("zone 0 full");
        emu.append(300, &[3u8; 4096]).expect("open zone 300");
        // Every flush after the persist's first one fails: what it wrote before
        // failing is left pending.
        ctl.fail_flushes(1, 8);
        assert!(emu.flush().is_err(), "a flush fails");
        let pending: Vec<_> = ctl.pending_writes().into_iter().map(|w| w.id).collect();
        (ctl, pending)
    };
    let (_, pending) = scenario();
    assert!(!pending.is_empty());
    for mask in 0..1u32 << pending.len() {
        let (ctl, pending) = scenario();
        let keep = pending
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & 1 << i != 0)
            .map(|(_, &id)| id)
            .collect();
        let (_, dev) = ctl.crash(&CrashMode::Keep(keep)).expect("crash");
        let emu = ZoneEmu::open(dev).unwrap_or_else(|e| panic!("subset {mask:b}: {e}"));
        let s = states(&emu);
        let old_or_new = [(ZoneState::Closed, 4 * KB), (ZoneState::Full, 8 * KB)];
        assert!(old_or_new.contains(&s[0]), "subset {mask:b}: {:?}", s[0]);
        assert!(matches!(s[300].0, ZoneState::Empty | ZoneState::Closed));
    }
}

/// A pool formatted with the whole-table metadata (version 1) opens, works and
/// keeps its format.
#[test]
fn a_version_1_table_opens_and_stays_version_1() {
    use crate::zone_meta::{whole_table_slot_bytes, MetaGeometry};
    let zones = 8u32;
    let mut dev = mem(u64::from(zones), 4096);
    let slot = whole_table_slot_bytes(u64::from(zones));
    let meta = MetaGeometry {
        version: META_VERSION_WHOLE,
        logical_block_size: 4096,
        zone_size: ZONE,
        zone_capacity: CAP,
        zone_count: zones,
        max_open_zones: 2,
        max_active_zones: 3,
        table_slot_bytes: slot,
        data_offset: data_offset_for(slot, ZONE).expect("offset"),
        format_id: 1,
    };
    let empty = TableEntry {
        state: ZoneState::Empty,
        wp: 0,
    };
    let mut buf = vec![0u8; slot as usize];
    for generation in 0..2u64 {
        encode_table(
            1,
            generation,
            vec![empty; zones as usize].into_iter(),
            &mut buf,
        );
        dev.write_at(TABLE_SLOT0_OFFSET + generation * slot, &buf)
            .expect("table");
    }
    let mut block = vec![0u8; META_BLOCK_BYTES as usize];
    encode_geometry(&meta, &mut block);
    dev.write_at(0, &block).expect("geometry");
    dev.write_at(META_BLOCK_BYTES, &block).expect("geometry");
    let mut emu = ZoneEmu::open(&mut dev).expect("open");
    emu.append(3, &data(8192, 4)).expect("append");
    emu.flush().expect("flush");
    emu.finish_zone(5).expect("finish");
    assert_eq!(emu.table_generation(), 3);
    drop(emu);
    assert_eq!(ZoneEmu::verify_metadata(&mut dev).expect("verify"), vec![]);
    let emu = ZoneEmu::open(&mut dev).expect("reopen");
    assert_eq!(emu.meta.version, META_VERSION_WHOLE);
    let s = states(&emu);
    assert_eq!(s[3], (ZoneState::Closed, 8192));
    assert_eq!(s[5], (ZoneState::Full, CAP));
}
