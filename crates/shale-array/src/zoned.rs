//! A zoned array: many zoned members behind one [`ZonedDevice`].
//!
//! Array zone `z` is zone `z + LABEL_ZONES` on every member, written in full rows
//! (stripes) only: a write must start at the zone's write pointer and be a whole
//! number of stripes ([`ZoneGeometry::write_unit`] says how many bytes one is). Each row
//! is encoded and every member writes its unit, so no row is ever rewritten and no
//! parity is ever updated in place. A write completes when every writable member has
//! its shard; it succeeds while at most M shards of it are missing (failed members
//! and members whose write failed; the latter are failed at once, since their zone
//! now lacks a row).
//!
//! Reads go to the member holding the data; if it is not readable, or its read
//! fails, the bytes are rebuilt from the same range of K other shards of the row.
//! Read errors count against a member and fail it past `read_error_limit`.
//!
//! After a crash the members of a zone may disagree on how many rows they hold (each
//! lost its own unflushed writes). The array reports the fewest, as `Closed`, and
//! refuses writes to such a zone until it is finished or reset: what lies above the
//! lowest pointer was never flushed, so nothing may rely on it.
//!
//! Every operation, synchronous ones included, runs through the same state machine;
//! a synchronous call polls members until its own operation is done and queues any
//! other completion it meets for the next `poll`.

use std::collections::VecDeque;

use shale_device::{
    DeviceError, IoBuf, IoOpKind, ZoneAction, ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo,
    ZoneOp, ZoneRequest, ZoneState, ZonedDevice,
};

use crate::codec::{self, ErasureCodec};
use crate::control::ArrayHandle;
use crate::label::{self, Identity, LabelError};
use crate::layout::{LayoutError, Redundancy, StripeLayout, LABEL_ZONES, STRIPE_BYTES_MAX};
use crate::member::{Member, MemberState, MemberStatus};
use rebuild::Rebuild;
pub use rebuild::RebuildLimits;

#[path = "zoned_rebuild.rs"]
mod rebuild;
use shale_format::{ArrayRole, MemberRecord};

/// Unit-sized write buffers kept for reuse.
const BUF_POOL_MAX: usize = 256;

/// Read errors a member may return before it is failed.
pub const READ_ERROR_LIMIT: u64 = 16;

/// A zoned array.
pub struct ZoneArray<Z: ZonedDevice> {
    geo: ZoneGeometry,
    layout: StripeLayout,
    redundancy: Redundancy,
    codec: Box<dyn ErasureCodec>,
    members: Vec<Member<Z>>,
    member_geo: ZoneGeometry,
    ops: Slab<Op>,
    parts: Slab<Part>,
    done: VecDeque<ZoneCompletion>,
    /// The completion of the synchronous operation in progress.
    sync_done: Option<ZoneCompletion>,
    /// Caller requests not yet returned by `poll`.
    in_flight: usize,
    read_error_limit: u64,
    scratch: Vec<ZoneCompletion>,
    /// The label state; `None` for an array put together without labels (tests,
    /// benchmarks).
    identity: Option<Identity>,
    /// Label changes are written (false for a read-only open: `shale check`).
    persist: bool,
    /// The operator's handle, once asked for.
    handle: Option<ArrayHandle<Z>>,
    /// The snapshot behind the handle is out of date.
    status_dirty: bool,
    maintain_calls: u64,
    /// A member being rebuilt.
    rebuild: Option<Rebuild>,
    rebuild_limits: RebuildLimits,
    /// Buffers for member reads and writes, by length, reused (a fresh large
    /// allocation page-faults on every use).
    pool: std::collections::HashMap<usize, Vec<IoBuf>>,
    pooled: usize,
    /// The rebuild's window buffers, kept between steps.
    rebuild_bufs: Vec<Vec<u8>>,
}

impl<Z: ZonedDevice> std::fmt::Debug for ZoneArray<Z> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZoneArray")
            .field("geometry", &self.geo)
            .field("layout", &self.layout)
            .field("redundancy", &self.redundancy)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// Why an array could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Label(LabelError),
    #[error("{present} of {members} members present; {redundancy} needs at least {need}")]
    TooFewMembers {
        redundancy: Redundancy,
        members: usize,
        present: usize,
        need: usize,
    },
}

/// A caller's request in progress.
#[derive(Debug)]
struct Op {
    /// The caller's tag; `None` for the synchronous operation.
    tag: Option<u64>,
    buf: Option<IoBuf>,
    /// A one-row write's buffer split into its data units (sent to the members as
    /// they are, no copy), gathered back here and joined for the caller.
    split: Vec<Option<IoBuf>>,
    parts_left: u32,
    kind: OpKind,
    /// The first error that fails the whole request.
    error: Option<ZoneError>,
    landed_at: Option<u64>,
}

#[derive(Debug)]
enum OpKind {
    /// Shards of each written row that did not land, and the errors seen.
    Write {
        offset: u64,
        lost: u32,
        errors: Vec<(u32, ZoneError)>,
    },
    Read {
        pieces: Vec<Piece>,
    },
    Flush {
        lost: u32,
        errors: Vec<(u32, ZoneError)>,
    },
}

/// The part of a read that one unit of one row holds.
#[derive(Debug)]
struct Piece {
    /// Where in the caller's buffer.
    at: usize,
    len: usize,
    zone: u32,
    row: u64,
    shard: u32,
    /// Offset inside the unit.
    off: u64,
    dest: Dest,
    /// Shards read for reconstruction (by shard index), when degraded.
    shards: Vec<Option<IoBuf>>,
    /// Shards that cannot be used (failed reads, unreadable members, the target).
    bad: u64,
    pending: u32,
}

/// Where a piece's bytes land.
#[derive(Debug)]
enum Dest {
    /// The piece is the whole request: it reads straight into the caller's buffer.
    Whole,
    /// Its own part of the caller's buffer (split in block-aligned parts, one per
    /// piece, joined back when the read finishes: a whole-group read copies
    /// nothing). `None` while a member holds it.
    Part(Option<IoBuf>),
    /// A buffer of its own, copied into the caller's at `at` (pieces not
    /// [`IO_ALIGN`]-aligned).
    Copy,
}

#[derive(Debug)]
struct Part {
    op: u32,
    member: u32,
    kind: PartKind,
}

#[derive(Debug, Clone, Copy)]
enum PartKind {
    /// `Some(d)`: the unit is data unit `d` of the op's split buffer, to be kept.
    Write(Option<u32>),
    Flush,
    /// The piece's own shard.
    Direct {
        piece: u32,
    },
    /// Another shard of the piece's row, for reconstruction.
    Shard {
        piece: u32,
        shard: u32,
    },
}

/// A slab of values keyed by small integers (tags).
#[derive(Debug)]
struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    fn new() -> Slab<T> {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
    fn insert(&mut self, v: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(v);
                i
            }
            None => {
                self.items.push(Some(v));
                (self.items.len() - 1) as u32
            }
        }
    }
    fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.items.get_mut(i as usize).and_then(Option::as_mut)
    }
    fn remove(&mut self, i: u32) -> Option<T> {
        let v = self.items.get_mut(i as usize).and_then(Option::take);
        if v.is_some() {
            self.free.push(i);
        }
        v
    }
}

fn unavailable(op: IoOpKind, offset: u64, reason: String) -> ZoneError {
    ZoneError::Device(DeviceError::Unavailable { op, offset, reason })
}

/// Whether a member's error says the member is at fault (its media or link), rather
/// than the request breaking a zone rule every member would break alike.
fn is_fault(e: &ZoneError) -> bool {
    matches!(
        e,
        ZoneError::Device(_) | ZoneError::Offline { .. } | ZoneError::ReadOnly { .. }
    )
}

/// A member's rule error in the array's terms (its zone numbers).
fn to_array_error(e: ZoneError) -> ZoneError {
    let z = |zone: u32| zone.saturating_sub(LABEL_ZONES);
    match e {
        ZoneError::TooManyOpen { zone, limit } => ZoneError::TooManyOpen {
            zone: z(zone),
            limit,
        },
        ZoneError::TooManyActive { zone, limit } => ZoneError::TooManyActive {
            zone: z(zone),
            limit,
        },
        ZoneError::InvalidTransition {
            zone,
            state,
            action,
        } => ZoneError::InvalidTransition {
            zone: z(zone),
            state,
            action,
        },
        ZoneError::ReadOnly { zone } => ZoneError::ReadOnly { zone: z(zone) },
        ZoneError::Offline { zone } => ZoneError::Offline { zone: z(zone) },
        other => other,
    }
}

impl<Z: ZonedDevice> ZoneArray<Z> {
    /// Puts an array together from its members in slot order (`None` for a missing
    /// one), with their display names. `unit` is the stripe unit in bytes
    /// ([`StripeLayout::choose_unit`]). Members must share one geometry.
    pub fn new(
        members: Vec<(Option<Z>, String)>,
        redundancy: Redundancy,
        unit: u64,
    ) -> Result<ZoneArray<Z>, ArrayError> {
        let n = members.len();
        let (k, m) = redundancy.shards(n)?;
        let codec = codec::for_redundancy(redundancy, n)?;
        let present = members.iter().filter(|(d, _)| d.is_some()).count();
        if present < k as usize || n - present > m as usize {
            return Err(ArrayError::TooFewMembers {
                redundancy,
                members: n,
                present,
                need: n - m as usize,
            });
        }
        let mg = member_geometry(&members)?;
        let members: Vec<Member<Z>> = members
            .into_iter()
            .map(|(d, name)| Member::new(d, name))
            .collect();
        let (geo, layout) = array_geometry(&mg, redundancy, n as u32, k, m, unit)?;
        Ok(ZoneArray {
            geo,
            layout,
            redundancy,
            codec,
            members,
            member_geo: mg,
            ops: Slab::new(),
            parts: Slab::new(),
            done: VecDeque::new(),
            sync_done: None,
            in_flight: 0,
            read_error_limit: READ_ERROR_LIMIT,
            scratch: Vec::new(),
            identity: None,
            persist: true,
            handle: None,
            status_dirty: true,
            maintain_calls: 0,
            rebuild: None,
            rebuild_limits: RebuildLimits::default(),
            pool: std::collections::HashMap::new(),
            pooled: 0,
            rebuild_bufs: Vec::new(),
        })
    }

    /// Makes a new array of fresh devices: labels every member (a new identity in
    /// `pool`) and returns the array, every zone empty.
    pub fn create(
        devs: Vec<(Z, String)>,
        redundancy: Redundancy,
        unit: u64,
        pool: [u8; 16],
    ) -> Result<ZoneArray<Z>, ArrayError> {
        let id = Identity::new(pool, ArrayRole::Capacity, redundancy, unit, devs.len());
        let mut members = Vec::with_capacity(devs.len());
        for (i, (mut d, name)) in devs.into_iter().enumerate() {
            let zerr = |source| LabelError::Zone {
                device: name.clone(),
                source,
            };
            if d.zone_info(0).map_err(zerr)?.state != ZoneState::Empty {
                d.manage(0, ZoneAction::Reset).map_err(zerr)?;
            }
            label::write_zoned(&mut d, &id.label(i)).map_err(zerr)?;
            members.push((Some(d), name));
        }
        let mut a = ZoneArray::new(members, redundancy, unit)?;
        a.identity = Some(id);
        Ok(a)
    }

    /// Puts an array together from its labelled devices, in any order (see
    /// `label.rs` for what is refused and what is recorded).
    pub fn open(devs: Vec<(Z, String)>) -> Result<ZoneArray<Z>, ArrayError> {
        Self::open_with(devs, true)
    }

    /// As [`Self::open`], but never writes a label (a checker's open): what open
    /// would record stays in memory.
    pub fn open_read_only(devs: Vec<(Z, String)>) -> Result<ZoneArray<Z>, ArrayError> {
        Self::open_with(devs, false)
    }

    fn open_with(devs: Vec<(Z, String)>, persist: bool) -> Result<ZoneArray<Z>, ArrayError> {
        let mut found = Vec::with_capacity(devs.len());
        for (mut d, name) in devs {
            match label::read_zoned(&mut d, &name) {
                Ok(l) => found.push((d, name, l)),
                // A device that cannot be read is as good as missing.
                Err(e @ LabelError::Zone { .. }) => {
                    tracing::warn!(device = %name, error = %e, "array member unreadable; left out");
                }
                Err(e) => return Err(e.into()),
            }
        }
        let label::Placement {
            identity: id,
            slots,
            changed,
        } = label::place(ArrayRole::Capacity, found)?;
        let mut a = ZoneArray::new(slots, id.redundancy, id.unit)?;
        a.persist = persist;
        for (i, rec) in id.members.iter().enumerate() {
            if rec.state == MemberRecord::Failed && a.members[i].dev.is_some() {
                a.members[i].fail("recorded failed in the array's labels".into());
            }
            if rec.state == MemberRecord::Rebuilding && a.members[i].dev.is_some() {
                a.members[i].state = MemberState::Rebuilding;
                a.resume_rebuild(i as u32);
            }
        }
        a.identity = Some(id);
        if changed {
            a.write_labels();
        }
        if a.failed_members() > a.layout.m as usize {
            return Err(ArrayError::TooFewMembers {
                redundancy: a.redundancy,
                members: a.members.len(),
                present: a.members.len() - a.failed_members(),
                need: a.members.len() - a.layout.m as usize,
            });
        }
        Ok(a)
    }

    /// The label generation (0 without labels).
    pub fn generation(&self) -> u64 {
        self.identity.as_ref().map_or(0, |i| i.generation)
    }

    /// Records members' states in the labels when they changed: a new generation
    /// written to every writable member (a member that cannot take it fails too).
    fn persist_states(&mut self) {
        let Some(id) = self.identity.as_mut() else {
            return;
        };
        if id.record(self.members.iter().map(|m| m.state)) {
            self.status_dirty = true;
            self.write_labels();
        }
    }

    /// Writes the current identity's label to every writable member.
    fn write_labels(&mut self) {
        let Some(id) = self.identity.clone().filter(|_| self.persist) else {
            return;
        };
        let mut failed_one = false;
        for (i, m) in self.members.iter_mut().enumerate() {
            if !m.writable() {
                continue;
            }
            let Some(dev) = m.dev.as_mut() else { continue };
            if let Err(e) = label::write_zoned(dev, &id.label(i)) {
                m.counters.other_errors += 1;
                m.fail(format!("label write: {e}"));
                failed_one = true;
            }
        }
        if failed_one {
            self.persist_states();
        }
    }

    pub fn layout(&self) -> &StripeLayout {
        &self.layout
    }

    pub fn redundancy(&self) -> Redundancy {
        self.redundancy
    }

    pub fn set_read_error_limit(&mut self, limit: u64) {
        self.read_error_limit = limit;
    }

    /// Every member, in slot order.
    pub fn members(&self) -> Vec<MemberStatus> {
        crate::member::statuses(&self.members)
    }

    /// Members not serving in full (failed, missing, or being rebuilt).
    pub fn failed_members(&self) -> usize {
        self.members.iter().filter(|m| !m.readable()).count()
    }

    /// Takes member `index` out of service, as an operator's `device fail` does.
    pub fn fail_member(&mut self, index: u32, reason: &str) -> Result<(), LayoutError> {
        let m = self
            .members
            .get_mut(index as usize)
            .ok_or_else(|| LayoutError::Members(format!("no member {index}")))?;
        m.fail(reason.to_string());
        self.persist_states();
        Ok(())
    }

    /// A member's device (for tests and tools that inspect members).
    pub fn member_device_mut(&mut self, index: u32) -> Option<&mut Z> {
        self.members.get_mut(index as usize)?.dev.as_mut()
    }

    /// Member `i` holds zone `zone` as the array does: serving, or rebuilt that far.
    fn in_zone(&self, i: usize, zone: u32) -> bool {
        let m = &self.members[i];
        m.dev.is_some()
            && match m.state {
                MemberState::Ok => true,
                MemberState::Rebuilding => self
                    .rebuild
                    .as_ref()
                    .is_some_and(|r| r.member as usize == i && !r.is_stale(zone)),
                MemberState::Failed | MemberState::Missing => false,
            }
    }

    fn member_offset(&self, zone: u32, row: u64, off: u64) -> u64 {
        self.member_geo.zone_start(zone + LABEL_ZONES) + row * self.layout.unit + off
    }

    /// (fewest rows, most rows, state) of an array zone over its readable members.
    fn zone_rows(&self, zone: u32) -> Result<(u64, u64, ZoneState), ZoneError> {
        if zone >= self.geo.zone_count {
            return Err(ZoneError::NoSuchZone {
                zone,
                count: self.geo.zone_count,
            });
        }
        let mut lo: Option<(u64, ZoneState)> = None;
        let mut hi = 0;
        let mut first_err = None;
        for (i, m) in self.members.iter().enumerate() {
            if !self.in_zone(i, zone) {
                continue;
            }
            let Some(dev) = m.dev.as_ref() else { continue };
            let info = match dev.zone_info(zone + LABEL_ZONES) {
                Ok(i) => i,
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            if matches!(info.state, ZoneState::Offline | ZoneState::ReadOnly) {
                first_err.get_or_insert(to_array_error(if info.state == ZoneState::Offline {
                    ZoneError::Offline { zone: info.index }
                } else {
                    ZoneError::ReadOnly { zone: info.index }
                }));
                continue;
            }
            let rows = if info.state == ZoneState::Full {
                self.layout.rows_per_zone
            } else {
                ((info.write_pointer - info.start) / self.layout.unit)
                    .min(self.layout.rows_per_zone)
            };
            hi = hi.max(rows);
            if lo.is_none_or(|(r, _)| rows < r) {
                lo = Some((rows, info.state));
            }
        }
        match lo {
            Some((rows, state)) => {
                let state = if hi != rows && state == ZoneState::Empty {
                    ZoneState::Closed
                } else {
                    state
                };
                Ok((rows, hi, state))
            }
            None => Err(first_err.unwrap_or_else(|| {
                unavailable(
                    IoOpKind::ZoneManagement,
                    self.geo.zone_start(zone),
                    "no array member can report this zone".into(),
                )
            })),
        }
    }

    fn finish_op(&mut self, id: u32) {
        let Some(mut op) = self.ops.remove(id) else {
            return;
        };
        if !op.split.is_empty() {
            op.buf = Some(join_split(
                std::mem::take(&mut op.split),
                self.layout.unit as usize,
            ));
        }
        if let OpKind::Read { pieces } = &mut op.kind {
            if op.buf.is_none() && pieces.iter().any(|pc| matches!(pc.dest, Dest::Part(_))) {
                op.buf = Some(join_pieces(pieces));
            }
        }
        let result = match op.error {
            Some(e) => Err(e),
            None => Ok(op.landed_at),
        };
        let c = ZoneCompletion {
            tag: op.tag.unwrap_or(0),
            buf: op.buf,
            result,
        };
        if op.tag.is_some() {
            self.done.push_back(c);
        } else {
            self.sync_done = Some(c);
        }
    }

    /// Sends one part to a member.
    fn send(&mut self, op: u32, member: u32, kind: PartKind, req: ZoneOp) {
        let tag = self.parts.insert(Part { op, member, kind });
        let m = &mut self.members[member as usize];
        let Some(dev) = m.dev.as_mut() else {
            unreachable!("parts go only to present members")
        };
        m.in_flight += 1;
        if let Some(o) = self.ops.get_mut(op) {
            o.parts_left += 1;
        }
        dev.submit(ZoneRequest {
            tag: u64::from(tag),
            op: req,
        });
    }

    fn fail_fast(&mut self, tag: Option<u64>, buf: Option<IoBuf>, e: ZoneError) {
        let id = self.ops.insert(Op {
            tag,
            buf,
            split: Vec::new(),
            parts_left: 0,
            kind: OpKind::Flush {
                lost: 0,
                errors: Vec::new(),
            },
            error: Some(e),
            landed_at: None,
        });
        self.finish_op(id);
    }

    fn start(&mut self, tag: Option<u64>, op: ZoneOp) {
        match op {
            ZoneOp::Write { offset, buf, fua } => self.start_write(tag, offset, buf, fua),
            ZoneOp::Read { offset, buf } => self.start_read(tag, offset, buf),
            ZoneOp::Flush => self.start_flush(tag),
            ZoneOp::Append { buf, .. } => self.fail_fast(
                tag,
                Some(buf),
                ZoneError::Device(DeviceError::Unsupported {
                    op: IoOpKind::Append,
                }),
            ),
        }
    }

    /// Checks a write against the zone rules in the array's terms; returns (zone,
    /// first row).
    fn check_write(&self, offset: u64, len: u64) -> Result<(u32, u64), ZoneError> {
        let s = self.layout.stripe_bytes();
        let zone = (offset / self.geo.zone_size) as u32;
        let start = self.geo.zone_start(zone);
        let rel = offset - start.min(offset);
        if len == 0 || !rel.is_multiple_of(s) || !len.is_multiple_of(s) {
            return Err(ZoneError::Device(DeviceError::Misaligned {
                op: IoOpKind::Write,
                offset,
                len,
                align: s,
            }));
        }
        if len > u64::from(self.geo.max_io_bytes) {
            return Err(ZoneError::Device(DeviceError::TooLarge {
                op: IoOpKind::Write,
                offset,
                len,
                max: u64::from(self.geo.max_io_bytes),
            }));
        }
        let (rows, hi, state) = self.zone_rows(zone)?;
        if state == ZoneState::Full || rel + len > self.geo.zone_capacity {
            return Err(ZoneError::ZoneFull {
                zone,
                offset,
                len,
                zone_end: start + self.geo.zone_capacity,
            });
        }
        if rel != rows * s || hi != rows {
            return Err(ZoneError::NotAtWritePointer {
                zone,
                offset,
                write_pointer: start + hi * s,
            });
        }
        Ok((zone, rows))
    }

    fn start_write(&mut self, tag: Option<u64>, offset: u64, buf: IoBuf, fua: bool) {
        let (zone, row0) = match self.check_write(offset, buf.len() as u64) {
            Ok(z) => z,
            Err(e) => return self.fail_fast(tag, Some(buf), e),
        };
        let l = self.layout;
        let unit = l.unit as usize;
        let rows = buf.len() / l.stripe_bytes() as usize;
        let k = l.k as usize;
        let (mut out, buf, tail) = match self.encode_rows(buf, rows) {
            Ok(Encoded { shards, buf, tail }) => (shards, buf, tail),
            Err((buf, e)) => {
                let e = unavailable(IoOpKind::Write, offset, format!("encode: {e}"));
                return self.fail_fast(tag, Some(buf), e);
            }
        };
        let split = buf.is_none();
        // Data units that are the caller's buffer's parts; a padded copy of a short
        // last unit goes back to the pool instead.
        let kept = k - usize::from(tail.is_some());
        // A member holds one shard position per row, and positions rotate by row, so
        // a multi-row write gathers each member's units from several positions.
        let id = self.ops.insert(Op {
            tag,
            buf,
            split: if split {
                let mut v: Vec<Option<IoBuf>> = (0..k).map(|_| None).collect();
                v[k - 1] = tail;
                v
            } else {
                Vec::new()
            },
            parts_left: 0,
            kind: OpKind::Write {
                offset,
                lost: 0,
                errors: Vec::new(),
            },
            error: None,
            landed_at: Some(offset),
        });
        let mut lost = 0;
        for member in 0..l.members {
            let mut mbuf: Option<IoBuf> = None;
            let mut holds = false;
            for r in 0..rows {
                let Some(s) = l.shard_on(zone, row0 + r as u64, member) else {
                    continue;
                };
                holds = true;
                if rows == 1 {
                    break;
                }
                let b = mbuf.get_or_insert_with(|| IoBuf::zeroed(rows * unit));
                b[r * unit..(r + 1) * unit]
                    .copy_from_slice(&out[s as usize][r * unit..(r + 1) * unit]);
            }
            if !holds {
                continue;
            }
            if !self.in_zone(member as usize, zone) {
                lost += 1;
                continue;
            }
            let Some(s_row0) = l.shard_on(zone, row0, member) else {
                continue;
            };
            let mbuf = match mbuf {
                Some(b) => b,
                None => std::mem::replace(&mut out[s_row0 as usize], IoBuf::zeroed(0)),
            };
            self.members[member as usize].counters.bytes_written += mbuf.len() as u64;
            let moff = self.member_offset(zone, row0, 0);
            let kind = PartKind::Write(split.then_some(s_row0).filter(|&d| (d as usize) < kept));
            self.send(
                id,
                member,
                kind,
                ZoneOp::Write {
                    offset: moff,
                    buf: mbuf,
                    fua,
                },
            );
        }
        for (s, b) in out.into_iter().enumerate() {
            if split && s < kept {
                // A data unit not sent (its member is out) stays with the op.
                if let Some(slot) = self.ops.get_mut(id).and_then(|o| o.split.get_mut(s)) {
                    if !b.is_empty() {
                        *slot = Some(b);
                    }
                }
            } else {
                self.give_buf(b);
            }
        }
        if let Some(Op {
            kind: OpKind::Write { lost: l0, .. },
            ..
        }) = self.ops.get_mut(id)
        {
            *l0 = lost;
        }
        self.settle_write(id);
    }

    /// Completes a write once its parts are all back.
    fn settle_write(&mut self, id: u32) {
        let m = self.layout.m;
        let Some(op) = self.ops.get_mut(id) else {
            return;
        };
        if op.parts_left > 0 {
            return;
        }
        let OpKind::Write {
            offset,
            lost,
            errors,
        } = &mut op.kind
        else {
            return;
        };
        let errors = std::mem::take(errors);
        let (lost, offset) = (*lost, *offset);
        let all_rules = !errors.is_empty()
            && errors.iter().all(|(_, e)| !is_fault(e))
            && errors.len() as u32 + lost == self.layout.shards().min(self.layout.members);
        if all_rules {
            // Every member refused alike (a zone limit): the request's own error.
            let (_, e) = errors.into_iter().next().expect("not empty");
            op.error = Some(to_array_error(e));
            op.landed_at = None;
            return self.finish_op(id);
        }
        let failed = lost + errors.len() as u32;
        let mut first = None;
        let any = !errors.is_empty();
        for (member, e) in errors {
            let mm = &mut self.members[member as usize];
            mm.counters.write_errors += 1;
            mm.fail(format!("write error: {e}"));
            first.get_or_insert(e);
        }
        if any {
            // Before the write is acknowledged: a member missing a row must never be
            // trusted again, crash or not.
            self.persist_states();
        }
        if failed > m {
            let op = self.ops.get_mut(id).expect("present");
            op.landed_at = None;
            op.error = Some(unavailable(
                IoOpKind::Write,
                offset,
                format!(
                    "{failed} shards of the stripe could not be written, {} survives {m}{}",
                    self.redundancy,
                    first
                        .map(|e| format!(" (first error: {e})"))
                        .unwrap_or_default()
                ),
            ));
        }
        self.finish_op(id);
    }

    fn start_flush(&mut self, tag: Option<u64>) {
        let id = self.ops.insert(Op {
            tag,
            buf: None,
            split: Vec::new(),
            parts_left: 0,
            kind: OpKind::Flush {
                lost: 0,
                errors: Vec::new(),
            },
            error: None,
            landed_at: None,
        });
        let mut lost = 0;
        for member in 0..self.layout.members {
            if self.members[member as usize].writable() {
                self.send(id, member, PartKind::Flush, ZoneOp::Flush);
            } else {
                lost += 1;
            }
        }
        if let Some(Op {
            kind: OpKind::Flush { lost: l0, .. },
            ..
        }) = self.ops.get_mut(id)
        {
            *l0 = lost;
        }
        self.settle_flush(id);
    }

    fn settle_flush(&mut self, id: u32) {
        let Some(op) = self.ops.get_mut(id) else {
            return;
        };
        if op.parts_left > 0 {
            return;
        }
        let OpKind::Flush { lost, errors } = &mut op.kind else {
            return;
        };
        let errors = std::mem::take(errors);
        let failed = *lost + errors.len() as u32;
        let any = !errors.is_empty();
        for (member, e) in errors {
            let mm = &mut self.members[member as usize];
            mm.counters.other_errors += 1;
            mm.fail(format!("flush error: {e}"));
        }
        if any {
            self.persist_states();
        }
        if failed > self.layout.m {
            let op = self.ops.get_mut(id).expect("present");
            op.error = Some(unavailable(
                IoOpKind::Flush,
                0,
                format!(
                    "{failed} members failed, {} survives {}",
                    self.redundancy, self.layout.m
                ),
            ));
        }
        self.finish_op(id);
    }

    fn check_read(&self, offset: u64, len: u64) -> Result<u32, ZoneError> {
        let lbs = u64::from(self.geo.logical_block_size);
        if len == 0 || !offset.is_multiple_of(lbs) || !len.is_multiple_of(lbs) {
            return Err(ZoneError::Device(DeviceError::Misaligned {
                op: IoOpKind::Read,
                offset,
                len,
                align: lbs,
            }));
        }
        let zone = (offset / self.geo.zone_size) as u32;
        let start = self.geo.zone_start(zone);
        if offset + len > start + self.geo.zone_size {
            return Err(ZoneError::CrossesZoneBoundary { offset, len });
        }
        let (rows, _, state) = self.zone_rows(zone)?;
        let wp = if state == ZoneState::Full {
            start + self.geo.zone_capacity
        } else {
            start + rows * self.layout.stripe_bytes()
        };
        if offset + len > wp {
            return Err(ZoneError::ReadPastWritePointer {
                zone,
                offset,
                len,
                write_pointer: wp,
            });
        }
        Ok(zone)
    }

    fn start_read(&mut self, tag: Option<u64>, offset: u64, buf: IoBuf) {
        let len = buf.len() as u64;
        let zone = match self.check_read(offset, len) {
            Ok(z) => z,
            Err(e) => return self.fail_fast(tag, Some(buf), e),
        };
        let l = self.layout;
        let mut rel = offset - self.geo.zone_start(zone);
        let end = rel + len;
        let mut pieces = Vec::new();
        let mut at = 0usize;
        while rel < end {
            let (row, shard, off) = l.locate(rel);
            let n = (l.shard_data_bytes(shard) - off).min(end - rel);
            pieces.push(Piece {
                at,
                len: n as usize,
                zone,
                row,
                shard,
                off,
                dest: Dest::Copy,
                shards: Vec::new(),
                bad: 0,
                pending: 0,
            });
            at += n as usize;
            rel += n;
        }
        let mut buf = Some(buf);
        if pieces.len() == 1 {
            pieces[0].dest = Dest::Whole;
        } else if let Some(b) = buf.take() {
            let lens: Vec<usize> = pieces.iter().map(|pc| pc.len).collect();
            match b.split(&lens) {
                Ok(parts) => {
                    for (pc, part) in pieces.iter_mut().zip(parts) {
                        pc.dest = Dest::Part(Some(part));
                    }
                }
                Err(b) => buf = Some(b),
            }
        }
        let count = pieces.len() as u32;
        let id = self.ops.insert(Op {
            tag,
            buf,
            split: Vec::new(),
            parts_left: 0,
            kind: OpKind::Read { pieces },
            error: None,
            landed_at: None,
        });
        // Held so the op cannot finish while its pieces are still being sent.
        if let Some(op) = self.ops.get_mut(id) {
            op.parts_left += 1;
        }
        for p in 0..count {
            self.start_piece(id, p);
        }
        self.part_done(id);
    }

    fn piece(&mut self, id: u32, p: u32) -> Option<&mut Piece> {
        match &mut self.ops.get_mut(id)?.kind {
            OpKind::Read { pieces } => pieces.get_mut(p as usize),
            _ => None,
        }
    }

    fn start_piece(&mut self, id: u32, p: u32) {
        let Some(pc) = self.piece(id, p) else { return };
        let (zone, row, shard, off, len) = (pc.zone, pc.row, pc.shard, pc.off, pc.len);
        let member = self.layout.member_of(zone, row, shard);
        if !self.in_zone(member as usize, zone) {
            return self.start_reconstruct(id, p);
        }
        let buf = match self.piece(id, p).map(|pc| &mut pc.dest) {
            Some(Dest::Part(part)) => part.take(),
            Some(Dest::Whole) => self.ops.get_mut(id).and_then(|o| o.buf.take()),
            _ => None,
        }
        .unwrap_or_else(|| self.take_buf(len));
        self.members[member as usize].counters.bytes_read += len as u64;
        let moff = self.member_offset(zone, row, off);
        self.send(
            id,
            member,
            PartKind::Direct { piece: p },
            ZoneOp::Read { offset: moff, buf },
        );
    }

    /// Reads the piece's range from K other shards of its row.
    fn start_reconstruct(&mut self, id: u32, p: u32) {
        let l = self.layout;
        let Some(pc) = self.piece(id, p) else { return };
        pc.bad |= 1 << pc.shard;
        if pc.shards.is_empty() {
            pc.shards = (0..l.shards()).map(|_| None).collect();
        }
        let target = pc.shard;
        let member = l.member_of(pc.zone, pc.row, target);
        self.members[member as usize].counters.reconstructed_reads += 1;
        self.fill_reconstruct(id, p);
    }

    /// Sends shard reads until K are held or in flight; fails the piece if the row
    /// has too few readable shards left.
    fn fill_reconstruct(&mut self, id: u32, p: u32) {
        let l = self.layout;
        let Some(zone) = self.piece(id, p).map(|pc| pc.zone) else {
            return;
        };
        let readable: Vec<bool> = (0..self.members.len())
            .map(|i| self.in_zone(i, zone))
            .collect();
        let Some(pc) = self.piece(id, p) else { return };
        let (row, off, len) = (pc.row, pc.off, pc.len);
        let mut have = pc.shards.iter().filter(|s| s.is_some()).count() as u32 + pc.pending;
        let mut bad = pc.bad;
        let mut sends = Vec::new();
        for s in 0..l.shards() {
            if have >= l.k {
                break;
            }
            if bad & (1 << s) != 0 || pc.shards[s as usize].is_some() {
                continue;
            }
            let member = l.member_of(zone, row, s);
            if !readable[member as usize] {
                bad |= 1 << s;
                continue;
            }
            sends.push((s, member));
            have += 1;
        }
        let Some(pc) = self.piece(id, p) else { return };
        pc.bad = bad;
        pc.pending += sends.len() as u32;
        if have < l.k {
            let offset = self.geo.zone_start(zone) + row * l.stripe_bytes();
            let e = unavailable(
                IoOpKind::Read,
                offset,
                format!(
                    "row {row} of zone {zone} has fewer than {} readable shards",
                    l.k
                ),
            );
            if let Some(op) = self.ops.get_mut(id) {
                op.error.get_or_insert(e);
            }
            // Shard reads already sent come back and are dropped.
            return;
        }
        for (s, member) in sends {
            self.members[member as usize].counters.bytes_read += len as u64;
            let moff = self.member_offset(zone, row, off);
            let buf = self.take_buf(len);
            self.send(
                id,
                member,
                PartKind::Shard { piece: p, shard: s },
                ZoneOp::Read { offset: moff, buf },
            );
        }
    }

    /// Rebuilds the piece's bytes from K shards held and copies them into place.
    fn decode_piece(&mut self, id: u32, p: u32) {
        let l = self.layout;
        let Some(op) = self.ops.get_mut(id) else {
            return;
        };
        let OpKind::Read { pieces } = &mut op.kind else {
            return;
        };
        let pc = &mut pieces[p as usize];
        let (at, len) = (pc.at, pc.len);
        // Decoded straight into the piece's part of the caller's buffer where it has
        // one (a part lost with a member's queue is replaced: the join then copies).
        let mut copy = Vec::new();
        let out: &mut [u8] = match &mut pc.dest {
            Dest::Part(part) => part.get_or_insert_with(|| IoBuf::zeroed(len)),
            Dest::Whole | Dest::Copy => {
                copy = vec![0u8; len];
                &mut copy
            }
        };
        let shards: Vec<Option<&[u8]>> = pc.shards.iter().map(|s| s.as_deref()).collect();
        let r = self
            .codec
            .reconstruct(&shards, &[pc.shard as usize], &mut [out]);
        let used: Vec<IoBuf> = pc.shards.iter_mut().filter_map(Option::take).collect();
        match r {
            Ok(()) if !copy.is_empty() => {
                // A whole-request piece's buffer may be gone (its member's queue
                // was lost): the caller gets a fresh one.
                let b = op.buf.get_or_insert_with(|| IoBuf::zeroed(len));
                b[at..at + len].copy_from_slice(&copy);
            }
            Ok(()) => {}
            Err(e) => {
                op.error.get_or_insert(unavailable(
                    IoOpKind::Read,
                    0,
                    format!("reconstruct {}: {e}", l.k),
                ));
            }
        }
        for b in used {
            self.give_buf(b);
        }
    }

    /// A piece's direct read is back with `buf`: the caller's buffer (or its part)
    /// goes back where it belongs; a buffer of the piece's own is copied into the
    /// caller's if the read succeeded (`ok`) and given back to be pooled.
    fn land_piece(&mut self, id: u32, p: u32, buf: IoBuf, ok: bool) -> Option<IoBuf> {
        let Some(op) = self.ops.get_mut(id) else {
            return Some(buf);
        };
        let OpKind::Read { pieces } = &mut op.kind else {
            return Some(buf);
        };
        let pc = &mut pieces[p as usize];
        match &mut pc.dest {
            Dest::Whole => op.buf = Some(buf),
            Dest::Part(part) => *part = Some(buf),
            Dest::Copy => {
                if let (true, Some(b)) = (ok, op.buf.as_mut()) {
                    b[pc.at..pc.at + pc.len].copy_from_slice(&buf);
                }
                return Some(buf);
            }
        }
        None
    }

    /// One part of op `id` is back: finish the op when nothing remains.
    fn part_done(&mut self, id: u32) {
        let Some(op) = self.ops.get_mut(id) else {
            return;
        };
        op.parts_left -= 1;
        if op.parts_left > 0 {
            return;
        }
        match op.kind {
            OpKind::Write { .. } => self.settle_write(id),
            OpKind::Flush { .. } => self.settle_flush(id),
            OpKind::Read { .. } => self.finish_op(id),
        }
    }

    fn read_error(&mut self, member: u32, e: &ZoneError) {
        let limit = self.read_error_limit;
        let m = &mut self.members[member as usize];
        m.counters.read_errors += 1;
        if !is_fault(e) || m.counters.read_errors > limit {
            m.fail(format!("{} read errors, last: {e}", m.counters.read_errors));
        }
    }

    /// Applies one member completion.
    fn on_part(&mut self, c: ZoneCompletion) {
        let Some(part) = u32::try_from(c.tag).ok().and_then(|t| self.parts.remove(t)) else {
            tracing::error!(tag = c.tag, "array: completion for an unknown part");
            return;
        };
        self.members[part.member as usize].in_flight -= 1;
        let id = part.op;
        let mut c = c;
        match (part.kind, c.buf.take()) {
            (PartKind::Write(Some(d)), Some(b)) => {
                if let Some(slot) = self
                    .ops
                    .get_mut(id)
                    .and_then(|o| o.split.get_mut(d as usize))
                {
                    *slot = Some(b);
                }
            }
            (PartKind::Write(None), Some(b)) => self.give_buf(b),
            (_, b) => c.buf = b,
        }
        match (part.kind, c.result) {
            (PartKind::Write(_), Err(e)) | (PartKind::Flush, Err(e)) => {
                if let Some(Op {
                    kind: OpKind::Write { errors, .. } | OpKind::Flush { errors, .. },
                    ..
                }) = self.ops.get_mut(id)
                {
                    errors.push((part.member, e));
                }
            }
            (PartKind::Write(_) | PartKind::Flush, Ok(_)) => {}
            (PartKind::Direct { piece }, Ok(_)) => {
                if let Some(buf) = c.buf {
                    if let Some(spare) = self.land_piece(id, piece, buf, true) {
                        self.give_buf(spare);
                    }
                }
            }
            (PartKind::Direct { piece }, Err(e)) => {
                if let Some(buf) = c.buf {
                    if let Some(spare) = self.land_piece(id, piece, buf, false) {
                        self.give_buf(spare);
                    }
                }
                self.read_error(part.member, &e);
                self.start_reconstruct(id, piece);
            }
            (PartKind::Shard { piece, shard }, r) => {
                let k = self.layout.k;
                let mut ready = false;
                let mut retry = false;
                if let Some(pc) = self.piece(id, piece) {
                    pc.pending -= 1;
                    match (r, c.buf) {
                        (Ok(_), Some(b)) => pc.shards[shard as usize] = Some(b),
                        _ => {
                            pc.bad |= 1 << shard;
                            retry = true;
                        }
                    }
                    let held = pc.shards.iter().filter(|s| s.is_some()).count() as u32;
                    ready = pc.pending == 0 && held >= k;
                }
                if retry {
                    let e = unavailable(IoOpKind::Read, 0, "shard read failed".into());
                    self.read_error(part.member, &e);
                    self.fill_reconstruct(id, piece);
                }
                if ready && self.ops.get_mut(id).is_some_and(|o| o.error.is_none()) {
                    self.decode_piece(id, piece);
                }
            }
        }
        self.part_done(id);
    }

    /// Polls members; `block` waits for at least one completion from a member with
    /// requests in flight. Returns whether anything arrived.
    fn pump(&mut self, block: bool) -> bool {
        let mut any = false;
        for i in 0..self.members.len() {
            if self.members[i].in_flight == 0 {
                continue;
            }
            let Some(dev) = self.members[i].dev.as_mut() else {
                continue;
            };
            let mut got = std::mem::take(&mut self.scratch);
            let r = dev.poll(&mut got, usize::from(block && !any));
            for c in got.drain(..) {
                any = true;
                self.on_part(c);
            }
            self.scratch = got;
            if let Err(e) = r {
                any = true;
                self.lose_member(i as u32, &e);
            }
        }
        if any {
            self.persist_states();
        }
        any
    }

    /// A member's queue broke: fail it, and every part it held with it.
    fn lose_member(&mut self, member: u32, e: &DeviceError) {
        self.members[member as usize].counters.other_errors += 1;
        self.members[member as usize].fail(format!("device error: {e}"));
        let tags: Vec<u32> = self
            .parts
            .items
            .iter()
            .enumerate()
            .filter(|(_, p)| p.as_ref().is_some_and(|p| p.member == member))
            .map(|(i, _)| i as u32)
            .collect();
        for t in tags {
            self.on_part(ZoneCompletion {
                tag: u64::from(t),
                buf: None,
                result: Err(ZoneError::Device(DeviceError::Unavailable {
                    op: IoOpKind::Submit,
                    offset: 0,
                    reason: format!("member queue lost: {e}"),
                })),
            });
        }
    }

    /// Runs one synchronous operation to its end.
    fn run_sync(&mut self, op: ZoneOp) -> ZoneCompletion {
        self.sync_done = None;
        self.start(None, op);
        loop {
            if let Some(c) = self.sync_done.take() {
                return c;
            }
            if !self.pump(false) && !self.pump(true) {
                // Nothing in flight and not done: cannot happen; fail rather than spin.
                return ZoneCompletion {
                    tag: 0,
                    buf: None,
                    result: Err(unavailable(
                        IoOpKind::Submit,
                        0,
                        "array operation lost its parts".into(),
                    )),
                };
            }
        }
    }
}

/// The members' shared geometry; members must agree.
fn member_geometry<Z: ZonedDevice>(
    members: &[(Option<Z>, String)],
) -> Result<ZoneGeometry, LayoutError> {
    let mut it = members.iter().filter_map(|(d, n)| Some((d.as_ref()?, n)));
    let Some((first, first_name)) = it.next() else {
        return Err(LayoutError::Members("no member present".into()));
    };
    let g = first.geometry().clone();
    let mut mg = g.clone();
    for (d, name) in it {
        let h = d.geometry();
        if (
            h.zone_size,
            h.zone_capacity,
            h.zone_count,
            h.logical_block_size,
        ) != (
            g.zone_size,
            g.zone_capacity,
            g.zone_count,
            g.logical_block_size,
        ) {
            return Err(LayoutError::Members(format!(
                "{name} has zones of {} bytes ({} writable) x {} with {}-byte blocks, {first_name} {} ({}) x {} with {}",
                h.zone_size, h.zone_capacity, h.zone_count, h.logical_block_size,
                g.zone_size, g.zone_capacity, g.zone_count, g.logical_block_size
            )));
        }
        let min_limit = |a: u32, b: u32| match (a, b) {
            (0, x) | (x, 0) => x,
            (a, b) => a.min(b),
        };
        mg.max_open_zones = min_limit(mg.max_open_zones, h.max_open_zones);
        mg.max_active_zones = min_limit(mg.max_active_zones, h.max_active_zones);
        mg.max_io_bytes = mg.max_io_bytes.min(h.max_io_bytes);
    }
    Ok(mg)
}

/// A write's rows encoded: the K data and M parity shards to send, the caller's buffer
/// when the data shards are copies (`None`: they are its parts), and the short last
/// part of a one-row buffer whose padded copy was sent instead.
struct Encoded {
    shards: Vec<IoBuf>,
    buf: Option<IoBuf>,
    tail: Option<IoBuf>,
}

/// The caller's buffer back from its split data units. A unit that did not come
/// back (a member kept it) leaves a fresh buffer of the same length (a kept part
/// counts `unit` bytes; only the short last part, which never leaves, is shorter):
/// a write's bytes are not needed once written.
fn join_split(parts: Vec<Option<IoBuf>>, unit: usize) -> IoBuf {
    let len = parts
        .iter()
        .map(|p| p.as_ref().map_or(unit, IoBuf::len))
        .sum();
    if parts.iter().all(Option::is_some) {
        if let Ok(b) = IoBuf::join(parts.into_iter().flatten().collect()) {
            return b;
        }
    }
    IoBuf::zeroed(len)
}

/// The caller's buffer back from its pieces' parts. A part a member kept (its
/// queue was lost; the read has failed) leaves zeroes in a fresh buffer.
fn join_pieces(pieces: &mut [Piece]) -> IoBuf {
    let parts: Vec<Option<IoBuf>> = pieces
        .iter_mut()
        .map(|pc| match &mut pc.dest {
            Dest::Part(part) => part.take(),
            Dest::Whole | Dest::Copy => None,
        })
        .collect();
    if parts.iter().all(Option::is_some) {
        match IoBuf::join(parts.into_iter().flatten().collect()) {
            Ok(b) => return b,
            Err(parts) => return copy_pieces(pieces, parts.into_iter().map(Some).collect()),
        }
    }
    copy_pieces(pieces, parts)
}

fn copy_pieces(pieces: &[Piece], parts: Vec<Option<IoBuf>>) -> IoBuf {
    let len = pieces.iter().map(|pc| pc.at + pc.len).max().unwrap_or(0);
    let mut whole = IoBuf::zeroed(len);
    for (pc, part) in pieces.iter().zip(parts) {
        if let Some(b) = part {
            whole[pc.at..pc.at + pc.len].copy_from_slice(&b);
        }
    }
    whole
}

fn array_geometry(
    mg: &ZoneGeometry,
    redundancy: Redundancy,
    members: u32,
    k: u32,
    m: u32,
    unit: u64,
) -> Result<(ZoneGeometry, StripeLayout), LayoutError> {
    let bad = |reason: String| LayoutError::Unit { unit, reason };
    if unit == 0
        || !unit.is_multiple_of(4096)
        || !unit.is_multiple_of(u64::from(mg.logical_block_size))
    {
        return Err(bad(
            "must be a non-zero multiple of 4096 and of the block size".into(),
        ));
    }
    if u64::from(k.saturating_sub(1)) * unit >= STRIPE_BYTES_MAX {
        return Err(bad(format!(
            "{k} data units of it leave one without data in a {STRIPE_BYTES_MAX}-byte row"
        )));
    }
    if unit > u64::from(mg.max_io_bytes) {
        return Err(bad(format!(
            "larger than the members' largest I/O ({})",
            mg.max_io_bytes
        )));
    }
    if mg.max_active_zones == 1 {
        return Err(LayoutError::Members(
            "members allow one active zone; the labels need one of their own".into(),
        ));
    }
    if mg.zone_count <= LABEL_ZONES {
        return Err(LayoutError::Members(format!(
            "members have {} zones; the array needs more than {LABEL_ZONES}",
            mg.zone_count
        )));
    }
    let rows = mg.zone_capacity / unit;
    if rows == 0 {
        return Err(bad(format!(
            "larger than a zone's writable {} bytes",
            mg.zone_capacity
        )));
    }
    let layout = StripeLayout {
        members,
        k,
        m,
        unit,
        rows_per_zone: rows,
    };
    let s = layout.stripe_bytes();
    let rows_per_io = (u64::from(mg.max_io_bytes) / unit).max(1);
    let max_io = (rows_per_io * s).min(u64::from(u32::MAX) / s * s) as u32;
    let geo = ZoneGeometry {
        name: format!("array {redundancy} of {members}"),
        logical_block_size: mg.logical_block_size,
        zone_size: mg.zone_size * u64::from(k),
        zone_capacity: rows * s,
        zone_count: mg.zone_count - LABEL_ZONES,
        max_open_zones: mg.max_open_zones,
        // Zone 0 of each member (the labels) stays closed, so active.
        max_active_zones: mg.max_active_zones.saturating_sub(1),
        max_io_bytes: max_io,
        write_unit: s as u32,
    };
    Ok((geo, layout))
}

impl<Z: ZonedDevice> ZonedDevice for ZoneArray<Z> {
    fn geometry(&self) -> &ZoneGeometry {
        &self.geo
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        let (rows, _, state) = self.zone_rows(zone)?;
        let start = self.geo.zone_start(zone);
        let write_pointer = if state == ZoneState::Full {
            start + self.geo.zone_capacity
        } else {
            start + rows * self.layout.stripe_bytes()
        };
        Ok(ZoneInfo {
            index: zone,
            start,
            capacity: self.geo.zone_capacity,
            write_pointer,
            state,
        })
    }

    fn submit(&mut self, req: ZoneRequest) {
        self.in_flight += 1;
        self.start(Some(req.tag), req.op);
    }

    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        // Take in what the members have finished first: a poll that does not wait
        // (min_complete 0, the engine's usual call) must still see it, or requests
        // would complete only when the caller runs out of other work and waits.
        self.pump(false);
        let want = min_complete.min(self.in_flight);
        let mut got = 0;
        let mut waited = false;
        loop {
            while let Some(c) = self.done.pop_front() {
                out.push(c);
                got += 1;
                self.in_flight -= 1;
            }
            // After one wait, a member's part counts as progress: the caller has
            // other devices to look at before waiting on the next member.
            if got >= want || waited {
                return Ok(got);
            }
            if !self.pump(false) {
                if !self.pump(true) && self.done.is_empty() {
                    return Ok(got);
                }
                waited = true;
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        let c = self.run_sync(ZoneOp::Read {
            offset,
            buf: IoBuf::zeroed(buf.len()),
        });
        c.result?;
        match c.buf {
            Some(b) => {
                buf.copy_from_slice(&b);
                Ok(())
            }
            None => Err(unavailable(
                IoOpKind::Read,
                offset,
                "read lost its buffer".into(),
            )),
        }
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let c = self.run_sync(ZoneOp::Write {
            offset,
            buf: IoBuf::from_slice(buf),
            fua: false,
        });
        c.result.map(|l| l.unwrap_or(offset))
    }

    fn append(&mut self, _zone: u32, _buf: &[u8]) -> Result<u64, ZoneError> {
        Err(ZoneError::Device(DeviceError::Unsupported {
            op: IoOpKind::Append,
        }))
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        if zone >= self.geo.zone_count {
            return Err(ZoneError::NoSuchZone {
                zone,
                count: self.geo.zone_count,
            });
        }
        let mut ok = 0;
        let mut rule = None;
        let mut faults = Vec::new();
        // A reset empties the zone on every member, one being rebuilt included
        // (which makes the zone rebuilt); other actions skip members behind in it.
        let targets: Vec<bool> = (0..self.members.len())
            .map(|i| {
                if action == ZoneAction::Reset {
                    self.members[i].writable()
                } else {
                    self.in_zone(i, zone)
                }
            })
            .collect();
        for (i, m) in self.members.iter_mut().enumerate() {
            if !targets[i] {
                continue;
            }
            let Some(dev) = m.dev.as_mut() else { continue };
            match dev.manage(zone + LABEL_ZONES, action) {
                Ok(()) => ok += 1,
                Err(e) if is_fault(&e) => faults.push((i, e)),
                Err(e) => rule = Some((i, e)),
            }
        }
        if ok == 0 {
            if let Some((_, e)) = rule {
                return Err(to_array_error(e));
            }
        } else if let Some((i, e)) = rule {
            // The others accepted it: this member's zone has diverged.
            faults.push((i, e));
        }
        for (i, e) in faults {
            self.members[i].counters.other_errors += 1;
            self.members[i].fail(format!("zone {action:?} of zone {zone}: {e}"));
        }
        if action == ZoneAction::Reset {
            self.rebuild_zone_reset(zone);
        }
        self.persist_states();
        if self.failed_members() > self.layout.m as usize {
            return Err(unavailable(
                IoOpKind::ZoneManagement,
                self.geo.zone_start(zone),
                format!(
                    "{} members failed, {} survives {}",
                    self.failed_members(),
                    self.redundancy,
                    self.layout.m
                ),
            ));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        self.run_sync(ZoneOp::Flush).result.map(|_| ())
    }

    fn read_rebuilt(&mut self, offset: u64, buf: &mut [u8], attempt: u32) -> Result<(), ZoneError> {
        let zone = self.check_read(offset, buf.len() as u64)?;
        let l = self.layout;
        let mut rel = offset - self.geo.zone_start(zone);
        let end = rel + buf.len() as u64;
        let mut at = 0usize;
        while rel < end {
            let (row, shard, off) = l.locate(rel);
            let n = (l.shard_data_bytes(shard) - off).min(end - rel) as usize;
            let suspect = l.member_of(zone, row, shard);
            // Attempt a > 0 also leaves out the a-th other shard of the row: with a
            // second copy bad (corruption met by a rebuild), some attempt avoids both.
            let also = match attempt {
                0 => None,
                a => {
                    let others: Vec<u32> = (0..l.shards())
                        .filter(|&s| s != shard)
                        .map(|s| l.member_of(zone, row, s))
                        .collect();
                    match others.get(a as usize - 1) {
                        Some(&m) => Some(m),
                        None => {
                            return Err(unavailable(
                                IoOpKind::Read,
                                offset,
                                format!("no rebuild attempt {attempt}"),
                            ))
                        }
                    }
                }
            };
            self.rebuild_piece(zone, row, shard, off, suspect, also, &mut buf[at..at + n])?;
            if attempt == 0 {
                self.members[suspect as usize].counters.corrupt_reads += 1;
            }
            at += n;
            rel += n as u64;
        }
        Ok(())
    }

    fn maintain(&mut self) -> u64 {
        self.apply_commands();
        let next = self.rebuild_step();
        self.maintain_calls += 1;
        if self.status_dirty || self.maintain_calls.is_multiple_of(1024) {
            self.publish();
        }
        if next == shale_device::MAINTAIN_IDLE && self.handle.is_some() {
            crate::control::COMMAND_POLL_NS
        } else {
            next
        }
    }
}

impl<Z: ZonedDevice> ZoneArray<Z> {
    /// A buffer for one member's part of a write: a unit-sized one comes from the
    /// pool (fresh large allocations are page faults on every write).
    /// Every shard of `rows` rows of `buf`, data then parity, each shard's rows back
    /// to back. A single row of whole units (the engine's usual write: one group)
    /// is the caller's buffer itself, split (`None` comes back: the op joins the
    /// units for the caller); otherwise the data is copied and `buf` comes back.
    #[allow(clippy::type_complexity)]
    fn encode_rows(
        &mut self,
        buf: IoBuf,
        rows: usize,
    ) -> Result<Encoded, (IoBuf, crate::CodecError)> {
        let l = self.layout;
        let (unit, k) = (l.unit as usize, l.k as usize);
        let mut tail = None;
        let (mut out, buf) = if rows == 1 && buf.len() > (k - 1) * unit && buf.len() <= k * unit {
            // One row is sent as the caller's buffer split in units, no copy. When K
            // does not divide the row its last unit is short: only that one is copied
            // into a unit padded with zeros, and the short part stays with the op to
            // join the caller's buffer back.
            let mut lens = vec![unit; k - 1];
            lens.push(buf.len() - (k - 1) * unit);
            match buf.split(&lens) {
                Ok(mut parts) => {
                    if lens[k - 1] < unit {
                        let short = parts.pop().expect("K parts");
                        let mut last = self.take_buf(unit);
                        let (head, pad) = last.split_at_mut(short.len());
                        head.copy_from_slice(&short);
                        pad.fill(0);
                        parts.push(last);
                        tail = Some(short);
                    }
                    (parts, None)
                }
                Err(buf) => (self.copy_shards(&buf, rows), Some(buf)),
            }
        } else {
            (self.copy_shards(&buf, rows), Some(buf))
        };
        out.extend((k..l.shards() as usize).map(|_| self.take_buf(rows * unit)));
        for r in 0..rows {
            let (data, parity) = out.split_at_mut(k);
            let srcs: Vec<&[u8]> = data.iter().map(|o| &o[r * unit..(r + 1) * unit]).collect();
            let mut dsts: Vec<&mut [u8]> = parity
                .iter_mut()
                .map(|o| &mut o[r * unit..(r + 1) * unit])
                .collect();
            if let Err(e) = self.codec.encode(&srcs, &mut dsts) {
                let buf = buf.unwrap_or_else(|| {
                    let mut parts: Vec<Option<IoBuf>> = out.drain(..k).map(Some).collect();
                    if tail.is_some() {
                        parts[k - 1] = tail;
                    }
                    join_split(parts, unit)
                });
                return Err((buf, e));
            }
        }
        Ok(Encoded {
            shards: out,
            buf,
            tail,
        })
    }

    /// The data shards of `rows` rows of `buf`, copied into buffers of their own
    /// (the last unit of a row K does not divide padded with zeros).
    fn copy_shards(&mut self, buf: &[u8], rows: usize) -> Vec<IoBuf> {
        let l = self.layout;
        let (unit, stripe) = (l.unit as usize, l.stripe_bytes() as usize);
        let mut out: Vec<IoBuf> = (0..l.k).map(|_| self.take_buf(rows * unit)).collect();
        for r in 0..rows {
            let row = &buf[r * stripe..(r + 1) * stripe];
            for (d, o) in out.iter_mut().enumerate() {
                let n = l.shard_data_bytes(d as u32) as usize;
                let (head, pad) = o[r * unit..(r + 1) * unit].split_at_mut(n);
                head.copy_from_slice(&row[d * unit..d * unit + n]);
                // Zeros on media too (pooled buffers hold old bytes).
                pad.fill(0);
            }
        }
        out
    }

    fn take_buf(&mut self, len: usize) -> IoBuf {
        if let Some(b) = self.pool.get_mut(&len).and_then(Vec::pop) {
            self.pooled -= 1;
            return b;
        }
        IoBuf::zeroed(len)
    }

    fn give_buf(&mut self, b: IoBuf) {
        if !b.is_empty() && self.pooled < BUF_POOL_MAX {
            self.pooled += 1;
            self.pool.entry(b.len()).or_default().push(b);
        }
    }

    /// Decodes `out` (a range of `shard` in `row` of `zone`, at `off` in the unit) from
    /// K shards held by members other than `exclude`, reading them synchronously.
    #[allow(clippy::too_many_arguments)]
    fn rebuild_piece(
        &mut self,
        zone: u32,
        row: u64,
        shard: u32,
        off: u64,
        exclude: u32,
        also: Option<u32>,
        out: &mut [u8],
    ) -> Result<(), ZoneError> {
        let l = self.layout;
        let moff = self.member_offset(zone, row, off);
        let mut shards: Vec<Option<Vec<u8>>> = vec![None; l.shards() as usize];
        let mut held = 0;
        for s in (0..l.shards()).filter(|&s| s != shard) {
            if held == l.k {
                break;
            }
            let m = l.member_of(zone, row, s);
            if m == exclude || Some(m) == also || !self.in_zone(m as usize, zone) {
                continue;
            }
            let mut b = vec![0u8; out.len()];
            let Some(dev) = self.members[m as usize].dev.as_mut() else {
                continue;
            };
            match dev.read_at(moff, &mut b) {
                Ok(()) => {
                    shards[s as usize] = Some(b);
                    held += 1;
                }
                Err(e) => self.read_error(m, &e),
            }
        }
        if held < l.k {
            return Err(unavailable(
                IoOpKind::Read,
                moff,
                format!(
                    "row {row} of zone {zone}: {held} other shards readable, {} needed",
                    l.k
                ),
            ));
        }
        let refs: Vec<Option<&[u8]>> = shards.iter().map(|s| s.as_deref()).collect();
        self.codec
            .reconstruct(&refs, &[shard as usize], &mut [out])
            .map_err(|e| unavailable(IoOpKind::Read, moff, format!("reconstruct: {e}")))
    }

    /// Takes the array apart: its members in slot order (`None` where missing), with
    /// their names. Failed members are handed back too; the caller decides.
    pub fn into_members(self) -> Vec<(Option<Z>, String)> {
        self.members.into_iter().map(|m| (m.dev, m.name)).collect()
    }

    /// The state of member `index` (for tests; `members()` for reports).
    pub fn member_state(&self, index: u32) -> Option<MemberState> {
        self.members.get(index as usize).map(|m| m.state)
    }
}

#[cfg(test)]
#[path = "zoned_tests.rs"]
mod tests;
