//! `BlkZoned` against a model of a zoned drive: the drive executes queued requests
//! in a seeded random order and fails any write that is not at its zone's write
//! pointer at the moment it executes, as a ZNS drive does. So a test fails if
//! `BlkZoned` ever lets two writes of one zone into the kernel at once.

use std::sync::{Arc, Mutex};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::DeviceInfo;

const ZONE_SECTORS: u64 = 512; // 256 KiB zones
const ZONE: u64 = ZONE_SECTORS * SECTOR;
const CAP_SECTORS: u64 = 384; // 192 KiB writable
const CAP: u64 = CAP_SECTORS * SECTOR;
const CONV: u64 = 2;
const SEQ: u64 = 6;

#[derive(Debug)]
struct DriveState {
    zones: Vec<BlkZone>,
    data: Vec<u8>,
    /// A write starting at this byte offset fails (and moves no write pointer).
    fail_write_at: Option<u64>,
    /// Writes refused because they were not at the write pointer when executed.
    out_of_order: u64,
}

#[derive(Debug, Clone)]
struct Drive(Arc<Mutex<DriveState>>);

impl Drive {
    fn new() -> Drive {
        let zones = (0..CONV + SEQ)
            .map(|i| BlkZone {
                start: i * ZONE_SECTORS,
                len: ZONE_SECTORS,
                wp: i * ZONE_SECTORS,
                kind: if i < CONV { 1 } else { 2 },
                cond: if i < CONV { 0 } else { 1 },
                capacity: if i < CONV { ZONE_SECTORS } else { CAP_SECTORS },
                ..BlkZone::default()
            })
            .collect();
        Drive(Arc::new(Mutex::new(DriveState {
            zones,
            data: vec![0; ((CONV + SEQ) * ZONE) as usize],
            fail_write_at: None,
            out_of_order: 0,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DriveState> {
        self.0.lock().expect("drive lock")
    }

    fn limits(max_open: u32, max_active: u32) -> Limits {
        Limits {
            zone_sectors: ZONE_SECTORS as u32,
            nr_zones: (CONV + SEQ) as u32,
            max_open,
            max_active,
            max_io_bytes: 64 << 10,
        }
    }

    /// Executes one data request as the drive would.
    fn execute(&self, op: &mut IoOp) -> Result<(), DeviceError> {
        let mut s = self.state();
        match op {
            IoOp::Read { offset, buf } => {
                let o = *offset as usize;
                let n = buf.len();
                buf.copy_from_slice(&s.data[o..o + n]);
                Ok(())
            }
            IoOp::Write { offset, buf, .. } => {
                let (off, len) = (*offset, buf.len() as u64);
                s.write(off, &buf[..])
                    .map_err(|source| DeviceError::Io {
                        op: IoOpKind::Write,
                        offset: off,
                        source,
                    })
                    .map(|()| assert!(len > 0))
            }
            IoOp::Flush | IoOp::Discard { .. } => Ok(()),
        }
    }
}

impl DriveState {
    fn write(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        let i = (off / ZONE) as usize;
        if self.fail_write_at == Some(off) {
            self.fail_write_at = None;
            return Err(io::Error::other("injected media error"));
        }
        let z = &mut self.zones[i];
        let len = data.len() as u64;
        if z.kind != 1 {
            if off / SECTOR != z.wp {
                self.out_of_order += 1;
                return Err(io::Error::other(
                    "unaligned write: not at the write pointer",
                ));
            }
            if (off + len) / SECTOR > z.start + z.capacity || z.cond == 0xE {
                return Err(io::Error::other("write past the zone's capacity"));
            }
            z.wp += len / SECTOR;
            z.cond = if z.wp == z.start + z.capacity {
                0xE
            } else if z.cond == 0x3 {
                0x3
            } else {
                0x2
            };
        }
        self.data[off as usize..(off + len) as usize].copy_from_slice(data);
        Ok(())
    }
}

impl ZoneControl for Drive {
    fn report(&self, sector: u64, max: usize) -> io::Result<(Vec<BlkZone>, bool)> {
        let s = self.state();
        Ok((
            s.zones
                .iter()
                .filter(|z| z.start >= sector)
                .take(max)
                .copied()
                .collect(),
            true,
        ))
    }

    fn command(&self, action: ZoneAction, sector: u64, sectors: u64) -> io::Result<()> {
        assert_eq!(sectors, ZONE_SECTORS, "commands name one whole zone");
        let mut s = self.state();
        let z = s
            .zones
            .iter_mut()
            .find(|z| z.start == sector)
            .ok_or_else(|| io::Error::other("no zone there"))?;
        match action {
            ZoneAction::Reset => {
                z.wp = z.start;
                z.cond = 0x1;
            }
            ZoneAction::Finish => {
                z.wp = z.start + z.len;
                z.cond = 0xE;
            }
            ZoneAction::Open => z.cond = 0x3,
            ZoneAction::Close => z.cond = if z.wp == z.start { 0x1 } else { 0x4 },
        }
        Ok(())
    }
}

/// The drive's data path: requests wait until a poll, which executes them in a
/// random order.
#[derive(Debug)]
struct Data {
    drive: Drive,
    info: DeviceInfo,
    pending: Vec<IoRequest>,
    rng: ChaCha8Rng,
}

impl BlockDevice for Data {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn submit(&mut self, req: IoRequest) {
        self.pending.push(req);
    }
    fn poll(&mut self, out: &mut Vec<IoCompletion>, min: usize) -> Result<usize, DeviceError> {
        let mut n = 0;
        while !self.pending.is_empty() && (n < min || self.rng.gen_bool(0.5)) {
            let i = self.rng.gen_range(0..self.pending.len());
            let mut req = self.pending.swap_remove(i);
            let result = self.drive.execute(&mut req.op);
            let buf = match req.op {
                IoOp::Read { buf, .. } | IoOp::Write { buf, .. } => Some(buf),
                _ => None,
            };
            out.push(IoCompletion {
                tag: req.tag,
                buf,
                result,
            });
            n += 1;
        }
        Ok(n)
    }
    fn in_flight(&self) -> usize {
        self.pending.len()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let s = self.drive.state();
        buf.copy_from_slice(&s.data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        self.drive
            .state()
            .write(offset, buf)
            .map_err(|source| DeviceError::Io {
                op: IoOpKind::Write,
                offset,
                source,
            })
    }
    fn flush(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn discard(&mut self, _: u64, _: u64) -> Result<(), DeviceError> {
        Ok(())
    }
}

fn open(drive: &Drive, seed: u64, max_open: u32, max_active: u32) -> BlkZoned {
    let data = Data {
        drive: drive.clone(),
        info: DeviceInfo {
            name: "model".into(),
            size_bytes: (CONV + SEQ) * ZONE,
            logical_block_size: 4096,
            max_io_bytes: 1 << 20,
            queue_depth: 64,
        },
        pending: Vec::new(),
        rng: ChaCha8Rng::seed_from_u64(seed),
    };
    let mut z = BlkZoned::assemble(
        Box::new(data),
        Box::new(drive.clone()),
        Path::new("model"),
        &Drive::limits(max_open, max_active),
    )
    .expect("assemble");
    z.settle().expect("settle");
    z
}

fn pattern(zone: u32, i: u64) -> IoBuf {
    let mut b = IoBuf::zeroed(32 << 10);
    for (j, x) in b.iter_mut().enumerate() {
        *x = (zone as u64 * 131 + i * 7 + j as u64 / 4096) as u8;
    }
    b
}

/// Polls until `n` completions have arrived.
fn collect(z: &mut BlkZoned, n: usize) -> Vec<ZoneCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        z.poll(&mut out, 1).expect("poll");
    }
    out
}

#[test]
fn writes_stay_in_order_per_zone_whatever_the_drive_runs_first() {
    for seed in 0..24 {
        let drive = Drive::new();
        let mut z = open(&drive, seed, 0, 0);
        assert_eq!(z.geometry().zone_count, SEQ as u32);
        assert_eq!(z.geometry().zone_capacity, CAP);
        assert_eq!(z.geometry().max_io_bytes, 64 << 10);
        // Six 32 KiB writes fill each of four zones: all submitted before any poll.
        let mut tag = 0;
        for i in 0..6u64 {
            for zone in 0..4u32 {
                let offset = u64::from(zone) * ZONE + i * (32 << 10);
                z.submit(ZoneRequest {
                    tag,
                    op: ZoneOp::Write {
                        offset,
                        buf: pattern(zone, i),
                        fua: false,
                    },
                });
                tag += 1;
            }
        }
        z.submit(ZoneRequest {
            tag: 999,
            op: ZoneOp::Flush,
        });
        let done = collect(&mut z, 25);
        for c in &done {
            assert!(
                c.result.is_ok(),
                "seed {seed}: tag {} failed: {:?}",
                c.tag,
                c.result
            );
        }
        // The flush comes back after every write before it.
        assert_eq!(done.last().map(|c| c.tag), Some(999), "seed {seed}");
        assert_eq!(drive.state().out_of_order, 0, "seed {seed}");
        for zone in 0..4u32 {
            let info = z.zone_info(zone).expect("zone");
            assert_eq!(info.state, ZoneState::Full, "seed {seed} zone {zone}");
            for i in 0..6u64 {
                let mut got = vec![0u8; 32 << 10];
                z.read_at(u64::from(zone) * ZONE + i * (32 << 10), &mut got)
                    .expect("read");
                assert_eq!(got, &pattern(zone, i)[..], "seed {seed}");
            }
        }
        // Shale's zone 0 is the drive's first sequential zone, after the conventional ones.
        let s = drive.state();
        let at = (CONV * ZONE) as usize;
        assert_eq!(&s.data[at..at + (32 << 10)], &pattern(0, 0)[..]);
    }
}

#[test]
fn a_failed_write_fails_the_writes_behind_it_and_the_zone_is_read_back() {
    let drive = Drive::new();
    let mut z = open(&drive, 7, 0, 0);
    let base = ZONE; // Shale's zone 1
    drive.state().fail_write_at = Some(CONV * ZONE + base + (32 << 10));
    for i in 0..4u64 {
        z.submit(ZoneRequest {
            tag: i,
            op: ZoneOp::Write {
                offset: base + i * (32 << 10),
                buf: pattern(1, i),
                fua: false,
            },
        });
    }
    let mut done = collect(&mut z, 4);
    done.sort_by_key(|c| c.tag);
    assert!(done[0].result.is_ok());
    for c in &done[1..] {
        assert!(c.result.is_err(), "tag {} should fail", c.tag);
    }
    assert_eq!(drive.state().out_of_order, 0);
    let info = z.zone_info(1).expect("zone");
    assert_eq!(
        info.write_pointer,
        base + (32 << 10),
        "the drive's write pointer"
    );
    assert_eq!(info.state, ZoneState::ImplicitlyOpen);
    // Writing goes on from there.
    assert_eq!(
        z.write_at(base + (32 << 10), &pattern(1, 9)[..])
            .expect("write"),
        base + (32 << 10)
    );
}

#[test]
fn a_reset_waits_for_the_zones_writes() {
    let drive = Drive::new();
    let mut z = open(&drive, 3, 0, 0);
    for i in 0..3u64 {
        z.submit(ZoneRequest {
            tag: i,
            op: ZoneOp::Write {
                offset: 2 * ZONE + i * (32 << 10),
                buf: pattern(2, i),
                fua: false,
            },
        });
    }
    z.reset_zone(2).expect("reset");
    // The writes ran before the reset (none was refused), and their completions wait.
    assert_eq!(drive.state().out_of_order, 0);
    let done = collect(&mut z, 3);
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_eq!(z.zone_info(2).expect("zone").state, ZoneState::Empty);
    assert_eq!(drive.state().zones[(CONV + 2) as usize].cond, 0x1);
    assert_eq!(
        z.write_at(2 * ZONE, &pattern(2, 5)[..]).expect("write"),
        2 * ZONE
    );
}

#[test]
fn open_closes_open_zones_and_finishes_zones_written_to_capacity() {
    let drive = Drive::new();
    {
        let mut s = drive.state();
        // Shale's zone 0: open, half written. Zone 1: written to 192 KiB of a larger
        // capacity (so 192 KiB is the smallest one, zone 1 is full at it).
        let z0 = &mut s.zones[CONV as usize];
        z0.cond = 0x2;
        z0.wp += 64;
        let z1 = &mut s.zones[(CONV + 1) as usize];
        z1.capacity = ZONE_SECTORS;
        z1.cond = 0x3;
        z1.wp += CAP_SECTORS;
    }
    let z = open(&drive, 1, 14, 14);
    assert_eq!(z.geometry().zone_capacity, CAP);
    assert_eq!(z.geometry().max_open_zones, 14);
    let z0 = z.zone_info(0).expect("zone 0");
    assert_eq!(
        (z0.state, z0.write_pointer),
        (ZoneState::Closed, 64 * SECTOR)
    );
    assert_eq!(z.zone_info(1).expect("zone 1").state, ZoneState::Full);
    let s = drive.state();
    assert_eq!(s.zones[CONV as usize].cond, 0x4, "closed on the drive");
    assert_eq!(
        s.zones[(CONV + 1) as usize].cond,
        0xE,
        "finished on the drive"
    );
}

#[test]
fn the_open_and_active_zone_limits_are_the_drives() {
    let drive = Drive::new();
    let mut z = open(&drive, 5, 2, 3);
    z.write_at(0, &pattern(0, 0)[..]).expect("zone 0");
    z.write_at(ZONE, &pattern(1, 0)[..]).expect("zone 1");
    assert!(matches!(
        z.write_at(2 * ZONE, &pattern(2, 0)[..]),
        Err(ZoneError::TooManyOpen { limit: 2, .. })
    ));
    z.close_zone(0).expect("close");
    z.write_at(2 * ZONE, &pattern(2, 0)[..]).expect("zone 2");
    assert!(matches!(
        z.write_at(3 * ZONE, &pattern(3, 0)[..]),
        Err(ZoneError::TooManyActive { limit: 3, .. })
    ));
    z.finish_zone(0).expect("finish");
    z.close_zone(1).expect("close");
    z.write_at(3 * ZONE, &pattern(3, 0)[..]).expect("zone 3");
    // Writes anywhere but the write pointer are refused before reaching the drive.
    assert!(matches!(
        z.write_at(2 * ZONE + (64 << 10), &pattern(2, 1)[..]),
        Err(ZoneError::NotAtWritePointer { .. })
    ));
    assert_eq!(drive.state().out_of_order, 0);
}
