//! Rebuilding a cache mirror from its partner, and the operator's commands.
//!
//! A replaced mirror starts `Rebuilding`: every write, flush and discard goes to it
//! as to the others (so what is behind the copy cursor stays current), but nothing
//! is read from it. The copy walks the device in windows, reading a readable
//! partner and writing the new mirror; a window that a write in flight overlaps is
//! left for later, so an older copy never lands over a newer write. Every
//! `PROGRESS_BYTES` the new mirror is flushed and the cursor recorded in the labels;
//! after a crash or a restart the copy resumes there. At the end the mirror is
//! flushed and becomes `Ok`.

use std::time::Instant;

use shale_device::{BlockDevice, MAINTAIN_IDLE};
use shale_format::{ArrayMember, MemberRecord};

use super::{MirrorDevice, MIRROR_RESERVED_BYTES};
use crate::control::{
    find_member, ArrayHandle, ArrayStatus, Command, CommandResult, RebuildStatus,
};
use crate::member::{Member, MemberState};

/// Bytes copied per step.
const WINDOW: u64 = 1 << 20;
/// The copy's progress is made durable this often.
const PROGRESS_BYTES: u64 = 64 << 20;

#[derive(Debug)]
pub(super) struct MirrorRebuild {
    member: u32,
    cursor: u64,
    /// Where the copy resumed (the rate counts from here).
    from: u64,
    recorded: u64,
    started: Instant,
    last: Instant,
    credit: f64,
}

impl<C: BlockDevice> MirrorDevice<C> {
    pub fn set_rebuild_limits(&mut self, limits: crate::RebuildLimits) {
        self.rebuild_limits = limits;
    }

    pub fn rebuilding(&self) -> bool {
        self.rebuild.is_some()
    }

    pub fn handle(&mut self) -> ArrayHandle<C> {
        if let Some(h) = &self.handle {
            return h.clone();
        }
        let h = ArrayHandle::new(self.status());
        self.handle = Some(h.clone());
        h
    }

    pub fn status(&self) -> ArrayStatus {
        ArrayStatus {
            role: "cache".into(),
            redundancy: "mirror".into(),
            generation: self.generation(),
            members: self.members(),
            member_shape: crate::control::MemberShape::Block {
                bytes: self.info.size_bytes + crate::mirror::MIRROR_RESERVED_BYTES,
            },
            rebuild: self.rebuild.as_ref().map(|r| {
                let secs = r.started.elapsed().as_secs_f64();
                RebuildStatus {
                    member: r.member,
                    done_bytes: r.cursor,
                    total_bytes: self.info.size_bytes,
                    bytes_per_sec: if secs > 0.0 {
                        (r.cursor - r.from) as f64 / secs
                    } else {
                        0.0
                    },
                }
            }),
        }
    }

    pub(super) fn publish(&mut self) {
        self.status_dirty = false;
        if let Some(h) = &self.handle {
            h.publish(self.status());
        }
    }

    pub(super) fn apply_commands(&mut self) {
        let Some(h) = self.handle.clone() else {
            return;
        };
        for p in h.take_commands() {
            let r = match p.command {
                Command::Fail { member } => self.fail_command(&member),
                Command::Replace { old, new, name } => self.replace(&old, new, name),
            };
            self.status_dirty = true;
            let _ = p.reply.send(r);
        }
    }

    fn fail_command(&mut self, which: &str) -> CommandResult {
        let i = find_member(&self.members(), which)?;
        let m = &self.members[i as usize];
        if m.state == MemberState::Failed {
            return Ok(format!("{} was already failed", m.name));
        }
        let others = (0..self.members.len())
            .filter(|&j| j != i as usize && self.members[j].readable())
            .count();
        if others == 0 {
            return Err(format!(
                "{} is the last readable mirror; failing it would lose the cache",
                m.name
            ));
        }
        if self.rebuild.as_ref().is_some_and(|r| r.member == i) {
            self.rebuild = None;
        }
        self.fail_member(i, "failed by the operator")
            .map_err(|e| e.to_string())?;
        Ok(format!("{} failed", self.members[i as usize].name))
    }

    /// Puts `new` in `old`'s slot and starts copying a partner onto it.
    pub fn replace(&mut self, old: &str, new: C, name: String) -> CommandResult {
        let i = find_member(&self.members(), old)?;
        if self.rebuild.is_some() {
            return Err("a mirror is being rebuilt; replace one at a time".into());
        }
        let partners = (0..self.members.len())
            .filter(|&j| j != i as usize && self.members[j].readable())
            .count();
        if partners == 0 {
            return Err("no other mirror to copy from".into());
        }
        let need = self.info.size_bytes + MIRROR_RESERVED_BYTES;
        if new.info().size_bytes < need {
            return Err(format!(
                "{name}: {} bytes, the mirror needs {need}",
                new.info().size_bytes
            ));
        }
        let mut member = Member::new(Some(new), name.clone());
        member.state = MemberState::Rebuilding;
        self.members[i as usize] = member;
        if let Some(id) = self.identity.as_mut() {
            id.members[i as usize] = ArrayMember {
                uuid: *uuid::Uuid::new_v4().as_bytes(),
                state: MemberRecord::Rebuilding,
                rebuilt: 0,
            };
            id.generation += 1;
        }
        self.write_labels();
        self.start_rebuild(i, 0);
        tracing::info!(member = %name, slot = i, "cache mirror replaced; copying");
        Ok(format!("{name} is mirror {i}; copying"))
    }

    pub(super) fn start_rebuild(&mut self, i: u32, at: u64) {
        let now = Instant::now();
        self.rebuild = Some(MirrorRebuild {
            member: i,
            cursor: at,
            from: at,
            recorded: at,
            started: now,
            last: now,
            credit: 0.0,
        });
    }

    fn overlaps_write(&self, lo: u64, hi: u64) -> bool {
        self.ops.iter().flatten().any(|op| {
            matches!(op.kind, super::MKind::Write | super::MKind::Discard)
                && op.range.0 < hi
                && lo < op.range.1
        })
    }

    pub(super) fn rebuild_step(&mut self) -> u64 {
        let rate = if self.in_flight > 0 {
            self.rebuild_limits.min_bytes_per_sec
        } else {
            self.rebuild_limits.max_bytes_per_sec
        };
        let size = self.info.size_bytes;
        let Some(r) = self.rebuild.as_mut() else {
            return MAINTAIN_IDLE;
        };
        if rate > 0 {
            let now = Instant::now();
            r.credit = (r.credit + now.duration_since(r.last).as_secs_f64() * rate as f64)
                .min(2.0 * WINDOW as f64);
            r.last = now;
            if r.credit < WINDOW as f64 {
                return ((WINDOW as f64 - r.credit) / rate as f64 * 1e9) as u64;
            }
        }
        let (i, lo) = (r.member as usize, r.cursor);
        if lo >= size {
            self.finish_rebuild();
            return MAINTAIN_IDLE;
        }
        let hi = (lo + WINDOW).min(size);
        if self.overlaps_write(lo, hi) {
            return 100_000;
        }
        match self.copy_window(i, lo, hi) {
            Ok(()) => {
                let Some(r) = self.rebuild.as_mut() else {
                    return MAINTAIN_IDLE;
                };
                r.cursor = hi;
                r.credit -= (hi - lo) as f64;
                self.status_dirty = true;
                if hi - r.recorded >= PROGRESS_BYTES {
                    self.record_progress(i, hi);
                }
                0
            }
            Err(e) => {
                tracing::warn!(error = %e, "mirror copy step failed");
                if !self.members[i].writable()
                    || !(0..self.members.len()).any(|j| j != i && self.members[j].readable())
                {
                    tracing::error!(member = %self.members[i].name, "mirror rebuild stopped: {e}");
                    self.rebuild = None;
                    self.members[i].fail(format!("rebuild failed: {e}"));
                    self.persist_states();
                    return MAINTAIN_IDLE;
                }
                1_000_000
            }
        }
    }

    fn copy_window(&mut self, i: usize, lo: u64, hi: u64) -> Result<(), String> {
        let mut buf = vec![0u8; (hi - lo) as usize];
        let limit = self.read_error_limit;
        let src = (0..self.members.len())
            .find(|&j| j != i && self.members[j].readable())
            .ok_or("no mirror to copy from")?;
        let m = &mut self.members[src];
        let dev = m.dev.as_mut().ok_or("the source mirror is gone")?;
        if let Err(e) = dev.read_at(lo + MIRROR_RESERVED_BYTES, &mut buf) {
            m.counters.read_errors += 1;
            let msg = format!("reading {}: {e}", m.name);
            if m.counters.read_errors > limit {
                m.fail(format!("{} read errors, last: {e}", m.counters.read_errors));
                self.persist_states();
            }
            return Err(msg);
        }
        m.counters.bytes_read += buf.len() as u64;
        let m = &mut self.members[i];
        let dev = m.dev.as_mut().ok_or("the new mirror is gone")?;
        if let Err(e) = dev.write_at(lo + MIRROR_RESERVED_BYTES, &buf) {
            m.counters.write_errors += 1;
            m.fail(format!("rebuild write: {e}"));
            self.persist_states();
            return Err(format!("writing the new mirror: {e}"));
        }
        m.counters.bytes_written += buf.len() as u64;
        Ok(())
    }

    /// Flushes the new mirror and records how far the copy is in the labels.
    fn record_progress(&mut self, i: usize, at: u64) {
        if let Some(dev) = self.members[i].dev.as_mut() {
            if let Err(e) = dev.flush() {
                self.members[i].fail(format!("flush during the rebuild: {e}"));
                self.rebuild = None;
                self.persist_states();
                return;
            }
        }
        if let Some(r) = self.rebuild.as_mut() {
            r.recorded = at;
        }
        if let Some(id) = self.identity.as_mut() {
            id.members[i].rebuilt = at;
            id.generation += 1;
        }
        self.write_labels();
    }

    fn finish_rebuild(&mut self) {
        let Some(r) = self.rebuild.take() else { return };
        let i = r.member as usize;
        if let Some(dev) = self.members[i].dev.as_mut() {
            if let Err(e) = dev.flush() {
                self.members[i].fail(format!("flush at the end of the rebuild: {e}"));
                self.persist_states();
                return;
            }
        }
        self.members[i].state = MemberState::Ok;
        if let Some(id) = self.identity.as_mut() {
            id.members[i].rebuilt = 0;
        }
        tracing::info!(
            member = %self.members[i].name,
            bytes = r.cursor - r.from,
            secs = r.started.elapsed().as_secs_f64(),
            "cache mirror rebuilt"
        );
        self.persist_states();
        self.status_dirty = true;
    }
}
