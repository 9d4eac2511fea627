//! A mirrored block device: the cache's copies behind one [`BlockDevice`].
//!
//! Every write, flush and discard goes to every writable member and completes when
//! all of them have answered; it succeeds if at least one member took it (a member
//! whose write failed is failed at once: it now lacks that write). So a write is
//! acknowledged only when every healthy mirror has it, and everything on the cache
//! (superblocks, journal, checkpoints, L2P pages, data) lives on every mirror.
//! Reads go to one readable member, in turn, and move to another if it fails.
//!
//! Each member keeps its first [`MIRROR_RESERVED_BYTES`] for the array's own label;
//! the mirror's byte 0 is the member's byte `MIRROR_RESERVED_BYTES`.

use std::collections::VecDeque;

use shale_device::{
    BlockDevice, DeviceError, DeviceInfo, IoBuf, IoCompletion, IoOp, IoOpKind, IoRequest,
};

use crate::control::ArrayHandle;
use crate::label::{self, Identity, LabelError};

#[path = "mirror_rebuild.rs"]
mod rebuild;
use crate::layout::{LayoutError, Redundancy};
use crate::member::{Member, MemberState, MemberStatus};
use crate::zoned::{ArrayError, READ_ERROR_LIMIT};
use shale_format::{ArrayRole, MemberRecord};

/// Bytes at the start of each mirror member kept for its label.
pub const MIRROR_RESERVED_BYTES: u64 = 1 << 20;

/// A mirrored block device.
pub struct MirrorDevice<C: BlockDevice> {
    info: DeviceInfo,
    members: Vec<Member<C>>,
    ops: Vec<Option<MOp>>,
    free_ops: Vec<u32>,
    parts: Vec<Option<(u32, u32)>>,
    free_parts: Vec<u32>,
    done: VecDeque<IoCompletion>,
    in_flight: usize,
    next_reader: usize,
    read_error_limit: u64,
    scratch: Vec<IoCompletion>,
    identity: Option<Identity>,
    /// Label changes are written (false for a read-only open: `shale check`).
    persist: bool,
    handle: Option<ArrayHandle<C>>,
    status_dirty: bool,
    maintain_calls: u64,
    rebuild: Option<rebuild::MirrorRebuild>,
    rebuild_limits: crate::RebuildLimits,
}

impl<C: BlockDevice> std::fmt::Debug for MirrorDevice<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorDevice")
            .field("info", &self.info)
            .field("members", &self.members.len())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct MOp {
    tag: u64,
    kind: MKind,
    /// The bytes a write or discard changes (for the rebuild's windows).
    range: (u64, u64),
    buf: Option<IoBuf>,
    parts_left: u32,
    /// Members that took a write/flush/discard.
    ok: u32,
    first_error: Option<DeviceError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MKind {
    Read { offset: u64, tried: u64 },
    Write,
    Flush,
    Discard,
}

impl<C: BlockDevice> MirrorDevice<C> {
    /// Puts a mirror together from its members in slot order (`None` for a missing
    /// one) with their names. At least one must be present.
    pub fn new(members: Vec<(Option<C>, String)>) -> Result<MirrorDevice<C>, ArrayError> {
        let n = members.len();
        let present: Vec<&C> = members.iter().filter_map(|(d, _)| d.as_ref()).collect();
        if n < 2 || present.is_empty() {
            return Err(ArrayError::TooFewMembers {
                redundancy: crate::Redundancy::Mirror,
                members: n,
                present: present.len(),
                need: 1,
            });
        }
        let lbs = present.iter().map(|d| d.info().logical_block_size).max();
        let size = present.iter().map(|d| d.info().size_bytes).min();
        let (Some(lbs), Some(size)) = (lbs, size) else {
            unreachable!("at least one member is present")
        };
        if size <= MIRROR_RESERVED_BYTES {
            return Err(ArrayError::Layout(LayoutError::Members(format!(
                "the smallest mirror member has {size} bytes; need more than {MIRROR_RESERVED_BYTES}"
            ))));
        }
        let size_bytes = (size - MIRROR_RESERVED_BYTES) / u64::from(lbs) * u64::from(lbs);
        let info = DeviceInfo {
            name: format!("mirror of {n}"),
            size_bytes,
            logical_block_size: lbs,
            max_io_bytes: present
                .iter()
                .map(|d| d.info().max_io_bytes)
                .min()
                .unwrap_or(0),
            queue_depth: present
                .iter()
                .map(|d| d.info().queue_depth)
                .min()
                .unwrap_or(1),
        };
        Ok(MirrorDevice {
            info,
            members: members
                .into_iter()
                .map(|(d, name)| Member::new(d, name))
                .collect(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            parts: Vec::new(),
            free_parts: Vec::new(),
            done: VecDeque::new(),
            in_flight: 0,
            next_reader: 0,
            read_error_limit: READ_ERROR_LIMIT,
            scratch: Vec::new(),
            identity: None,
            persist: true,
            handle: None,
            status_dirty: true,
            maintain_calls: 0,
            rebuild: None,
            rebuild_limits: crate::RebuildLimits::default(),
        })
    }

    /// Makes a new mirror of fresh devices, labelling each (a new identity in `pool`).
    pub fn create(devs: Vec<(C, String)>, pool: [u8; 16]) -> Result<MirrorDevice<C>, ArrayError> {
        let id = Identity::new(pool, ArrayRole::Cache, Redundancy::Mirror, 0, devs.len());
        let mut members = Vec::with_capacity(devs.len());
        for (i, (mut d, name)) in devs.into_iter().enumerate() {
            // Both label blocks: nothing of an earlier life may be read as newer.
            let mut blocks = vec![0u8; 2 * shale_format::BLOCK_SIZE];
            blocks[..shale_format::BLOCK_SIZE].copy_from_slice(&id.label(i).encode());
            d.write_at(0, &blocks)
                .and_then(|()| d.flush())
                .map_err(|source| LabelError::Device {
                    device: name.clone(),
                    source,
                })?;
            members.push((Some(d), name));
        }
        let mut m = MirrorDevice::new(members)?;
        m.identity = Some(id);
        Ok(m)
    }

    /// Puts a mirror together from its labelled devices, in any order.
    pub fn open(devs: Vec<(C, String)>) -> Result<MirrorDevice<C>, ArrayError> {
        Self::open_with(devs, true)
    }

    /// As [`Self::open`], but never writes a label (a checker's open).
    pub fn open_read_only(devs: Vec<(C, String)>) -> Result<MirrorDevice<C>, ArrayError> {
        Self::open_with(devs, false)
    }

    fn open_with(devs: Vec<(C, String)>, persist: bool) -> Result<MirrorDevice<C>, ArrayError> {
        let mut found = Vec::with_capacity(devs.len());
        for (mut d, name) in devs {
            match label::read_block(&mut d, &name) {
                Ok(l) => found.push((d, name, l)),
                // A device that cannot be read is as good as missing.
                Err(e @ LabelError::Device { .. }) => {
                    tracing::warn!(device = %name, error = %e, "cache mirror unreadable; left out");
                }
                Err(e) => return Err(e.into()),
            }
        }
        let label::Placement {
            identity: id,
            slots,
            changed,
        } = label::place(ArrayRole::Cache, found)?;
        let mut m = MirrorDevice::new(slots)?;
        m.persist = persist;
        let mut resume = None;
        for (i, rec) in id.members.iter().enumerate() {
            if m.members[i].dev.is_none() {
                continue;
            }
            match rec.state {
                MemberRecord::Ok => {}
                MemberRecord::Failed => {
                    m.members[i].fail("recorded failed in the array's labels".into());
                }
                // Written like the others, read only once the copy is done.
                MemberRecord::Rebuilding => {
                    m.members[i].state = MemberState::Rebuilding;
                    resume = Some((i as u32, rec.rebuilt));
                }
            }
        }
        m.identity = Some(id);
        if let Some((i, at)) = resume {
            m.start_rebuild(i, at);
        }
        if changed {
            m.write_labels();
        }
        if m.members.iter().all(|x| !x.readable()) {
            return Err(ArrayError::TooFewMembers {
                redundancy: Redundancy::Mirror,
                members: m.members.len(),
                present: 0,
                need: 1,
            });
        }
        Ok(m)
    }

    /// The label generation (0 without labels).
    pub fn generation(&self) -> u64 {
        self.identity.as_ref().map_or(0, |i| i.generation)
    }

    /// Records members' states in the labels when they changed.
    fn persist_states(&mut self) {
        let Some(id) = self.identity.as_mut() else {
            return;
        };
        if id.record(self.members.iter().map(|m| m.state)) {
            self.status_dirty = true;
            self.write_labels();
        }
    }

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
            if let Err(e) = label::write_block(dev, &id.label(i)) {
                m.counters.other_errors += 1;
                m.fail(format!("label write: {e}"));
                failed_one = true;
            }
        }
        if failed_one {
            self.persist_states();
        }
    }

    pub fn set_read_error_limit(&mut self, limit: u64) {
        self.read_error_limit = limit;
    }

    pub fn members(&self) -> Vec<MemberStatus> {
        crate::member::statuses(&self.members)
    }

    pub fn member_state(&self, index: u32) -> Option<MemberState> {
        self.members.get(index as usize).map(|m| m.state)
    }

    pub fn fail_member(&mut self, index: u32, reason: &str) -> Result<(), LayoutError> {
        self.members
            .get_mut(index as usize)
            .ok_or_else(|| LayoutError::Members(format!("no member {index}")))?
            .fail(reason.to_string());
        self.persist_states();
        Ok(())
    }

    /// Takes the mirror apart: its members in slot order, with their names.
    pub fn into_members(self) -> Vec<(Option<C>, String)> {
        self.members.into_iter().map(|m| (m.dev, m.name)).collect()
    }

    pub fn member_device_mut(&mut self, index: u32) -> Option<&mut C> {
        self.members.get_mut(index as usize)?.dev.as_mut()
    }

    fn new_op(&mut self, op: MOp) -> u32 {
        match self.free_ops.pop() {
            Some(i) => {
                self.ops[i as usize] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                (self.ops.len() - 1) as u32
            }
        }
    }

    fn send(&mut self, id: u32, member: u32, op: IoOp) {
        let tag = match self.free_parts.pop() {
            Some(i) => {
                self.parts[i as usize] = Some((id, member));
                i
            }
            None => {
                self.parts.push(Some((id, member)));
                (self.parts.len() - 1) as u32
            }
        };
        if let Some(Some(o)) = self.ops.get_mut(id as usize) {
            o.parts_left += 1;
        }
        let m = &mut self.members[member as usize];
        m.in_flight += 1;
        let Some(dev) = m.dev.as_mut() else {
            unreachable!("parts go only to present members")
        };
        let op = match op {
            IoOp::Read { offset, buf } => {
                m.counters.bytes_read += buf.len() as u64;
                IoOp::Read {
                    offset: offset + MIRROR_RESERVED_BYTES,
                    buf,
                }
            }
            IoOp::Write { offset, buf, fua } => {
                m.counters.bytes_written += buf.len() as u64;
                IoOp::Write {
                    offset: offset + MIRROR_RESERVED_BYTES,
                    buf,
                    fua,
                }
            }
            IoOp::Discard { offset, len } => IoOp::Discard {
                offset: offset + MIRROR_RESERVED_BYTES,
                len,
            },
            IoOp::Flush => IoOp::Flush,
        };
        dev.submit(IoRequest {
            tag: u64::from(tag),
            op,
        });
    }

    fn finish(&mut self, id: u32) {
        if self
            .ops
            .get(id as usize)
            .and_then(Option::as_ref)
            .is_some_and(|o| o.first_error.is_some())
        {
            // Before the request is answered: a mirror that missed a write must
            // never be read again, crash or not.
            self.persist_states();
        }
        let Some(op) = self.ops.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        self.free_ops.push(id);
        let result = match (op.kind, op.first_error) {
            (MKind::Read { .. }, None) => Ok(()),
            (MKind::Read { .. }, Some(e)) => Err(e),
            (_, _) if op.ok > 0 => Ok(()),
            (_, Some(e)) => Err(e),
            (k, None) => Err(DeviceError::Unavailable {
                op: kind_op(k),
                offset: 0,
                reason: "no mirror member is writable".into(),
            }),
        };
        self.done.push_back(IoCompletion {
            tag: op.tag,
            buf: op.buf,
            result,
        });
    }

    /// Sends a read to the next readable member not yet tried; fails the op when
    /// none is left.
    fn read_next(&mut self, id: u32) {
        let Some(Some(op)) = self.ops.get(id as usize) else {
            return;
        };
        let MKind::Read { offset, tried } = op.kind else {
            return;
        };
        let n = self.members.len();
        let pick = (0..n)
            .map(|i| (self.next_reader + i) % n)
            .find(|&i| tried & (1 << i) == 0 && self.members[i].readable());
        let Some(i) = pick else {
            if let Some(Some(op)) = self.ops.get_mut(id as usize) {
                op.first_error.get_or_insert(DeviceError::Unavailable {
                    op: IoOpKind::Read,
                    offset,
                    reason: "no mirror member could serve the read".into(),
                });
            }
            return self.finish(id);
        };
        self.next_reader = (i + 1) % n;
        let Some(Some(op)) = self.ops.get_mut(id as usize) else {
            return;
        };
        op.kind = MKind::Read {
            offset,
            tried: tried | (1 << i),
        };
        op.first_error = None;
        let buf = op
            .buf
            .take()
            .unwrap_or_else(|| IoBuf::zeroed(self.info.logical_block_size as usize));
        self.send(id, i as u32, IoOp::Read { offset, buf });
    }

    fn on_part(&mut self, c: IoCompletion) {
        let Some((id, member)) = usize::try_from(c.tag)
            .ok()
            .and_then(|t| self.parts.get_mut(t))
            .and_then(Option::take)
        else {
            tracing::error!(tag = c.tag, "mirror: completion for an unknown part");
            return;
        };
        self.free_parts.push(c.tag as u32);
        self.members[member as usize].in_flight -= 1;
        let Some(Some(op)) = self.ops.get_mut(id as usize) else {
            return;
        };
        op.parts_left -= 1;
        let kind = op.kind;
        match (kind, c.result) {
            (MKind::Read { .. }, Ok(())) => {
                op.buf = c.buf;
                self.finish(id);
            }
            (MKind::Read { .. }, Err(e)) => {
                op.buf = c.buf;
                let limit = self.read_error_limit;
                let m = &mut self.members[member as usize];
                m.counters.read_errors += 1;
                if m.counters.read_errors > limit {
                    m.fail(format!("{} read errors, last: {e}", m.counters.read_errors));
                }
                self.read_next(id);
            }
            (_, r) => {
                if op.buf.is_none() {
                    op.buf = c.buf;
                }
                match r {
                    Ok(()) => op.ok += 1,
                    Err(e) => {
                        let m = &mut self.members[member as usize];
                        if kind == MKind::Write {
                            m.counters.write_errors += 1;
                        } else {
                            m.counters.other_errors += 1;
                        }
                        m.fail(format!("{} error: {e}", kind_op(kind)));
                        op.first_error.get_or_insert(e);
                    }
                }
                if op.parts_left == 0 {
                    self.finish(id);
                }
            }
        }
    }

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
                self.members[i].fail(format!("device error: {e}"));
                let lost: Vec<u32> = (0..self.parts.len() as u32)
                    .filter(|&t| self.parts[t as usize].is_some_and(|(_, m)| m as usize == i))
                    .collect();
                for t in lost {
                    self.on_part(IoCompletion {
                        tag: u64::from(t),
                        buf: None,
                        result: Err(DeviceError::Unavailable {
                            op: IoOpKind::Submit,
                            offset: 0,
                            reason: format!("member queue lost: {e}"),
                        }),
                    });
                }
            }
        }
        if any {
            self.persist_states();
        }
        any
    }

    fn writable(&self) -> Vec<u32> {
        (0..self.members.len() as u32)
            .filter(|&i| self.members[i as usize].writable())
            .collect()
    }

    /// Runs `f` on every writable member synchronously; Ok if one took it.
    fn each_writable(
        &mut self,
        op: IoOpKind,
        mut f: impl FnMut(&mut C) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        let mut ok = 0;
        let mut first = None;
        for i in self.writable() {
            let m = &mut self.members[i as usize];
            let Some(dev) = m.dev.as_mut() else { continue };
            match f(dev) {
                Ok(()) => ok += 1,
                Err(e) => {
                    if op == IoOpKind::Write {
                        m.counters.write_errors += 1;
                    } else {
                        m.counters.other_errors += 1;
                    }
                    m.fail(format!("{op} error: {e}"));
                    first.get_or_insert(e);
                }
            }
        }
        if first.is_some() {
            self.persist_states();
        }
        match (ok, first) {
            (0, Some(e)) => Err(e),
            (0, None) => Err(DeviceError::Unavailable {
                op,
                offset: 0,
                reason: "no mirror member is writable".into(),
            }),
            _ => Ok(()),
        }
    }
}

/// The range rules of a block device, in the mirror's terms (members are larger).
fn check_range(info: &DeviceInfo, op: IoOpKind, offset: u64, len: u64) -> Result<(), DeviceError> {
    let lbs = u64::from(info.logical_block_size);
    if len == 0 {
        return Err(DeviceError::ZeroLength { op, offset });
    }
    if !offset.is_multiple_of(lbs) || !len.is_multiple_of(lbs) {
        return Err(DeviceError::Misaligned {
            op,
            offset,
            len,
            align: lbs,
        });
    }
    if offset
        .checked_add(len)
        .is_none_or(|end| end > info.size_bytes)
    {
        return Err(DeviceError::OutOfRange {
            op,
            offset,
            len,
            size: info.size_bytes,
        });
    }
    Ok(())
}

fn kind_op(k: MKind) -> IoOpKind {
    match k {
        MKind::Read { .. } => IoOpKind::Read,
        MKind::Write => IoOpKind::Write,
        MKind::Flush => IoOpKind::Flush,
        MKind::Discard => IoOpKind::Discard,
    }
}

impl<C: BlockDevice> BlockDevice for MirrorDevice<C> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        self.in_flight += 1;
        let bad = match &req.op {
            IoOp::Read { offset, buf } => {
                check_range(&self.info, IoOpKind::Read, *offset, buf.len() as u64)
            }
            IoOp::Write { offset, buf, .. } => {
                check_range(&self.info, IoOpKind::Write, *offset, buf.len() as u64)
            }
            IoOp::Discard { offset, len } => {
                check_range(&self.info, IoOpKind::Discard, *offset, *len)
            }
            IoOp::Flush => Ok(()),
        };
        if let Err(e) = bad {
            let buf = match req.op {
                IoOp::Read { buf, .. } | IoOp::Write { buf, .. } => Some(buf),
                _ => None,
            };
            self.done.push_back(IoCompletion {
                tag: req.tag,
                buf,
                result: Err(e),
            });
            return;
        }
        let range = match &req.op {
            IoOp::Write { offset, buf, .. } => (*offset, *offset + buf.len() as u64),
            IoOp::Discard { offset, len } => (*offset, *offset + *len),
            _ => (0, 0),
        };
        let (kind, buf) = match &req.op {
            IoOp::Read { offset, .. } => (
                MKind::Read {
                    offset: *offset,
                    tried: 0,
                },
                None,
            ),
            IoOp::Write { .. } => (MKind::Write, None),
            IoOp::Flush => (MKind::Flush, None),
            IoOp::Discard { .. } => (MKind::Discard, None),
        };
        let id = self.new_op(MOp {
            tag: req.tag,
            kind,
            range,
            buf,
            parts_left: 0,
            ok: 0,
            first_error: None,
        });
        if let IoOp::Read { buf, .. } = req.op {
            if let Some(Some(op)) = self.ops.get_mut(id as usize) {
                op.buf = Some(buf);
            }
            return self.read_next(id);
        }
        let targets = self.writable();
        if targets.is_empty() {
            return self.finish(id);
        }
        // The last member gets the caller's buffer; the others copies of it.
        let last = targets.len() - 1;
        let mut op = Some(req.op);
        for (j, &m) in targets.iter().enumerate() {
            let this = if j == last {
                op.take()
            } else {
                op.as_ref().map(|o| match o {
                    IoOp::Write { offset, buf, fua } => IoOp::Write {
                        offset: *offset,
                        buf: IoBuf::from_slice(buf),
                        fua: *fua,
                    },
                    IoOp::Discard { offset, len } => IoOp::Discard {
                        offset: *offset,
                        len: *len,
                    },
                    _ => IoOp::Flush,
                })
            };
            if let Some(o) = this {
                self.send(id, m, o);
            }
        }
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        // Take in what the members have finished first: a poll that does not wait
        // (min_complete 0, the engine's usual call) must still see it, or requests
        // would complete only when the caller runs out of other work and waits.
        self.pump(false);
        let want = min_complete.min(self.in_flight);
        let mut got = 0;
        loop {
            while let Some(c) = self.done.pop_front() {
                out.push(c);
                got += 1;
                self.in_flight -= 1;
            }
            if got >= want || (!self.pump(false) && !self.pump(true) && self.done.is_empty()) {
                return Ok(got);
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Read, offset, buf.len() as u64)?;
        let n = self.members.len();
        let order: Vec<usize> = (0..n).map(|j| (self.next_reader + j) % n).collect();
        self.read_first(&order, offset, buf).map_err(|e| {
            e.unwrap_or_else(|| unavailable_read(offset, "no mirror member could serve the read"))
        })
    }

    /// Attempt `a` reads the `a`-th readable mirror in slot order (or, if that one
    /// fails, the next that reads), so a caller whose check failed on one mirror's
    /// bytes gets every other mirror's in turn.
    fn read_rebuilt(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        attempt: u32,
    ) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Read, offset, buf.len() as u64)?;
        let order: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].readable())
            .skip(attempt as usize)
            .collect();
        self.read_first(&order, offset, buf).map_err(|e| {
            e.unwrap_or_else(|| {
                unavailable_read(
                    offset,
                    &format!("no mirror left to read after {attempt} copies"),
                )
            })
        })
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Write, offset, buf.len() as u64)?;
        self.each_writable(IoOpKind::Write, |d| {
            d.write_at(offset + MIRROR_RESERVED_BYTES, buf)
        })
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        self.each_writable(IoOpKind::Flush, |d| d.flush())
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Discard, offset, len)?;
        self.each_writable(IoOpKind::Discard, |d| {
            d.discard(offset + MIRROR_RESERVED_BYTES, len)
        })
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

impl<C: BlockDevice> MirrorDevice<C> {
    /// Reads `buf` from the first readable member of `order` that serves it; a read
    /// error counts against its member (failed past the limit). `Err(None)`: no
    /// member in `order` could be asked.
    fn read_first(
        &mut self,
        order: &[usize],
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), Option<DeviceError>> {
        let limit = self.read_error_limit;
        let mut first = None;
        for &i in order {
            if !self.members[i].readable() {
                continue;
            }
            let m = &mut self.members[i];
            let Some(dev) = m.dev.as_mut() else { continue };
            match dev.read_at(offset + MIRROR_RESERVED_BYTES, buf) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    m.counters.read_errors += 1;
                    if m.counters.read_errors > limit {
                        m.fail(format!("{} read errors, last: {e}", m.counters.read_errors));
                    }
                    first.get_or_insert(e);
                }
            }
        }
        Err(first)
    }
}

fn unavailable_read(offset: u64, reason: &str) -> DeviceError {
    DeviceError::Unavailable {
        op: IoOpKind::Read,
        offset,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_device::{ErrorRule, FaultController, FaultDevice};

    const SIZE: u64 = MIRROR_RESERVED_BYTES + (4 << 20);

    fn mirror(n: usize) -> (MirrorDevice<FaultDevice>, Vec<FaultController>) {
        let mut ctls = Vec::new();
        let ms = (0..n)
            .map(|i| {
                let d = FaultDevice::new(SIZE, 4096, i as u64).expect("dev");
                ctls.push(d.controller());
                (Some(d), format!("c{i}"))
            })
            .collect();
        (MirrorDevice::new(ms).expect("mirror"), ctls)
    }

    fn all_errors(c: &FaultController) {
        c.add_error_rule(ErrorRule {
            reads: true,
            writes: true,
            offset: 0,
            len: u64::MAX,
            remaining: None,
        });
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn async_io(m: &mut MirrorDevice<FaultDevice>, op: IoOp) -> IoCompletion {
        m.submit(IoRequest { tag: 5, op });
        let mut out = Vec::new();
        m.poll(&mut out, 1).expect("poll");
        out.pop().expect("one completion")
    }

    #[test]
    fn every_member_holds_every_write_past_the_label_area() {
        let (mut m, _) = mirror(3);
        assert_eq!(m.info().size_bytes, 4 << 20);
        let c = async_io(
            &mut m,
            IoOp::Write {
                offset: 8192,
                buf: IoBuf::from_slice(&pattern(1, 8192)),
                fua: true,
            },
        );
        c.result.expect("write");
        m.write_at(0, &pattern(2, 4096)).expect("sync write");
        for i in 0..3 {
            let d = m.member_device_mut(i).expect("member");
            let mut b = vec![0u8; 8192];
            d.read_at(MIRROR_RESERVED_BYTES + 8192, &mut b)
                .expect("read");
            assert_eq!(b, pattern(1, 8192));
            d.read_at(MIRROR_RESERVED_BYTES, &mut b[..4096])
                .expect("read");
            assert_eq!(&b[..4096], &pattern(2, 4096)[..]);
        }
        for _ in 0..6 {
            let c = async_io(
                &mut m,
                IoOp::Read {
                    offset: 8192,
                    buf: IoBuf::zeroed(8192),
                },
            );
            c.result.expect("read");
            assert_eq!(&c.buf.expect("buf")[..], &pattern(1, 8192)[..]);
        }
        assert!(
            m.members().iter().all(|s| s.counters.bytes_read > 0),
            "reads are spread"
        );
    }

    #[test]
    fn out_of_range_requests_are_refused_without_touching_members() {
        let (mut m, _) = mirror(2);
        let c = async_io(
            &mut m,
            IoOp::Write {
                offset: 4 << 20,
                buf: IoBuf::zeroed(4096),
                fua: false,
            },
        );
        assert!(matches!(c.result, Err(DeviceError::OutOfRange { .. })));
        assert!(m.write_at(100, &[0u8; 4096]).is_err());
        assert!(m.read_at(4 << 20, &mut [0u8; 4096]).is_err());
        assert!(m.members().iter().all(|s| s.state == MemberState::Ok));
    }

    #[test]
    fn a_failing_member_is_failed_and_the_others_serve() {
        let (mut m, ctls) = mirror(2);
        m.write_at(0, &pattern(3, 4096)).expect("write");
        all_errors(&ctls[0]);
        let c = async_io(
            &mut m,
            IoOp::Write {
                offset: 4096,
                buf: IoBuf::from_slice(&pattern(4, 4096)),
                fua: false,
            },
        );
        c.result.expect("the other mirror took it");
        assert_eq!(m.member_state(0), Some(MemberState::Failed));
        assert_eq!(m.members()[0].counters.write_errors, 1);
        for off in [0u64, 4096] {
            let c = async_io(
                &mut m,
                IoOp::Read {
                    offset: off,
                    buf: IoBuf::zeroed(4096),
                },
            );
            let want = pattern(if off == 0 { 3 } else { 4 }, 4096);
            assert_eq!(&c.buf.expect("buf")[..], &want[..]);
        }
        async_io(&mut m, IoOp::Flush).result.expect("flush");
        all_errors(&ctls[1]);
        let c = async_io(
            &mut m,
            IoOp::Write {
                offset: 0,
                buf: IoBuf::zeroed(4096),
                fua: false,
            },
        );
        assert!(c.result.is_err(), "no mirror left: the write fails");
        assert!(async_io(
            &mut m,
            IoOp::Read {
                offset: 0,
                buf: IoBuf::zeroed(4096)
            }
        )
        .result
        .is_err());
    }

    #[test]
    fn read_errors_move_to_the_partner_and_count() {
        let (mut m, ctls) = mirror(2);
        m.set_read_error_limit(2);
        m.write_at(0, &pattern(7, 4096)).expect("write");
        ctls[0].add_error_rule(ErrorRule {
            reads: true,
            writes: false,
            offset: 0,
            len: u64::MAX,
            remaining: None,
        });
        for _ in 0..8 {
            let c = async_io(
                &mut m,
                IoOp::Read {
                    offset: 0,
                    buf: IoBuf::zeroed(4096),
                },
            );
            assert_eq!(&c.buf.expect("buf")[..], &pattern(7, 4096)[..]);
            let mut b = vec![0u8; 4096];
            m.read_at(0, &mut b).expect("sync read");
            assert_eq!(b, pattern(7, 4096));
        }
        assert_eq!(m.member_state(0), Some(MemberState::Failed));
        assert_eq!(m.members()[0].counters.read_errors, 3);
    }

    #[test]
    fn one_member_present_is_enough_to_open() {
        let d = FaultDevice::new(SIZE, 4096, 9).expect("dev");
        let mut m =
            MirrorDevice::new(vec![(None, "gone".into()), (Some(d), "c1".into())]).expect("mirror");
        assert_eq!(m.member_state(0), Some(MemberState::Missing));
        m.write_at(0, &pattern(1, 4096)).expect("write");
        assert!(
            MirrorDevice::<FaultDevice>::new(vec![(None, "a".into()), (None, "b".into())]).is_err()
        );
    }

    fn run_rebuild(m: &mut MirrorDevice<FaultDevice>) {
        for _ in 0..100_000 {
            if !m.rebuilding() {
                return;
            }
            m.maintain();
        }
        panic!("rebuild did not finish");
    }

    #[test]
    fn a_replaced_mirror_gets_every_byte_and_writes_made_meanwhile() {
        let (mut m, _) = mirror(2);
        for i in 0..64u64 {
            m.write_at(i * 65536, &pattern(i as u8, 65536))
                .expect("write");
        }
        m.fail_member(0, "test").expect("fail");
        let fresh = FaultDevice::new(SIZE, 4096, 77).expect("dev");
        m.replace("c0", fresh, "new0".into()).expect("replace");
        assert_eq!(m.member_state(0), Some(MemberState::Rebuilding));
        // Writes while the copy runs, some ahead of it, some behind.
        for step in 0..8u64 {
            m.maintain();
            let off = ((step * 37) % 64) * 65536;
            let c = async_io(
                &mut m,
                IoOp::Write {
                    offset: off,
                    buf: IoBuf::from_slice(&pattern(100 + step as u8, 65536)),
                    fua: false,
                },
            );
            c.result.expect("write during rebuild");
        }
        run_rebuild(&mut m);
        assert_eq!(m.member_state(0), Some(MemberState::Ok));
        let mut want: Vec<Vec<u8>> = (0..64u64).map(|i| pattern(i as u8, 65536)).collect();
        for step in 0..8u64 {
            want[((step * 37) % 64) as usize] = pattern(100 + step as u8, 65536);
        }
        m.fail_member(1, "test").expect("fail the partner");
        for (i, w) in want.iter().enumerate() {
            let mut b = vec![0u8; 65536];
            m.read_at(i as u64 * 65536, &mut b)
                .expect("read from the rebuilt mirror");
            assert!(b == *w, "block {i} differs");
        }
    }

    #[test]
    fn a_mirror_copy_resumes_after_a_restart() {
        let devs: Vec<(FaultDevice, String)> = (0..2)
            .map(|i| {
                (
                    FaultDevice::new(SIZE, 4096, 30 + i).expect("dev"),
                    format!("c{i}"),
                )
            })
            .collect();
        let mut m = MirrorDevice::create(devs, [4; 16]).expect("create");
        m.write_at(4096, &pattern(9, 4096)).expect("write");
        m.flush().expect("flush");
        let fresh = FaultDevice::new(SIZE, 4096, 99).expect("dev");
        m.replace("c1", fresh, "new1".into()).expect("replace");
        m.maintain();
        let devs: Vec<(FaultDevice, String)> = m
            .into_members()
            .into_iter()
            .filter_map(|(d, n)| Some((d?, n)))
            .collect();
        let mut m = MirrorDevice::open(devs).expect("reopen");
        assert_eq!(m.member_state(1), Some(MemberState::Rebuilding));
        run_rebuild(&mut m);
        m.fail_member(0, "test").expect("fail");
        let mut b = vec![0u8; 4096];
        m.read_at(4096, &mut b).expect("read");
        assert_eq!(b, pattern(9, 4096));
    }
}
