//! Rebuilding a zoned array member, and the operator's commands.
//!
//! A replaced member starts `Rebuilding` with every zone stale. A stale zone holds
//! nothing valid on the new member: writes skip it there (the stripe is one shard
//! short, as when degraded), reads reconstruct, and the zone's state comes from the
//! other members. The rebuild walks the zones in order. An empty zone is simply
//! empty on the new member (reset if it is not), so the rebuild's time follows the
//! live data, not the device. A written zone is rebuilt in windows, at the new
//! member's write pointer: the K other shards of those rows are read, the missing
//! one decoded and appended, so the new member writes its zone sequentially, as a
//! zoned drive needs. Rows whose write is still in flight are never read; once the
//! new member has every completed row and no write to the zone is in flight, the
//! zone is rebuilt and later writes include the member. An engine reset of a stale
//! zone makes it rebuilt at once (empty everywhere).
//!
//! Progress needs no bookkeeping of its own: it is the new member's write pointers
//! (flushed after each zone). After a crash or a restart the label still says
//! `Rebuilding`; open compares each zone's pointer on the new member with the
//! others' and resumes where they differ.
//!
//! The rebuild runs in `maintain`, a window per call, synchronously: a window is
//! K member reads of `REBUILD_WINDOW` bytes and one write. Its pace: at most
//! `max_bytes_per_sec` (0: no limit) while the array is idle, and down to
//! `min_bytes_per_sec` while it has requests in flight, as md's
//! `speed_limit_min/max`.

use std::time::Instant;

use shale_device::{ZoneAction, ZoneState, ZonedDevice, MAINTAIN_IDLE};
use shale_format::{ArrayMember, MemberRecord};

use super::ZoneArray;
use crate::control::{
    find_member, ArrayHandle, ArrayStatus, Command, CommandResult, RebuildStatus,
};
use crate::layout::{Redundancy, LABEL_ZONES};
use crate::member::{Member, MemberState};

/// Bytes rebuilt per member per step.
const REBUILD_WINDOW: u64 = 1 << 20;

/// How fast a rebuild may go, in bytes per second of rebuilt data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildLimits {
    /// Guaranteed even while the array is busy.
    pub min_bytes_per_sec: u64,
    /// While idle; 0 for no limit.
    pub max_bytes_per_sec: u64,
}

impl Default for RebuildLimits {
    fn default() -> Self {
        RebuildLimits {
            min_bytes_per_sec: 32 << 20,
            max_bytes_per_sec: 0,
        }
    }
}

#[derive(Debug)]
pub(super) struct Rebuild {
    pub member: u32,
    stale: Vec<bool>,
    cursor: u32,
    done_bytes: u64,
    total_bytes: u64,
    started: Instant,
    /// When the pace was last paid for, and the bytes it allows now.
    last: Instant,
    credit: f64,
    /// Consecutive steps that failed to read their sources.
    read_failures: u32,
}

impl Rebuild {
    pub fn is_stale(&self, zone: u32) -> bool {
        self.stale.get(zone as usize).copied().unwrap_or(false)
    }
}

impl<Z: ZonedDevice> ZoneArray<Z> {
    pub fn set_rebuild_limits(&mut self, limits: RebuildLimits) {
        self.rebuild_limits = limits;
    }

    /// The handle other threads use to see the array and command it.
    pub fn handle(&mut self) -> ArrayHandle<Z> {
        if let Some(h) = &self.handle {
            return h.clone();
        }
        let h = ArrayHandle::new(self.status());
        self.handle = Some(h.clone());
        h
    }

    pub fn status(&self) -> ArrayStatus {
        ArrayStatus {
            role: "capacity".into(),
            redundancy: self.redundancy.to_string(),
            generation: self.generation(),
            members: self.members(),
            member_shape: crate::control::MemberShape::Zoned(self.member_geo.clone()),
            rebuild: self.rebuild.as_ref().map(|r| {
                let secs = r.started.elapsed().as_secs_f64();
                RebuildStatus {
                    member: r.member,
                    done_bytes: r.done_bytes,
                    total_bytes: r.total_bytes.max(r.done_bytes),
                    bytes_per_sec: if secs > 0.0 {
                        r.done_bytes as f64 / secs
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
        if self.members[i as usize].state == MemberState::Failed {
            return Ok(format!(
                "{} was already failed",
                self.members[i as usize].name
            ));
        }
        if self.rebuild.as_ref().is_some_and(|r| r.member == i) {
            self.rebuild = None;
        }
        self.fail_member(i, "failed by the operator")
            .map_err(|e| e.to_string())?;
        Ok(format!(
            "{} failed; {} of {} members serving",
            self.members[i as usize].name,
            self.members.len() - self.failed_members(),
            self.members.len()
        ))
    }

    /// Puts `new` in `old`'s slot and starts rebuilding it.
    pub fn replace(&mut self, old: &str, mut new: Z, name: String) -> CommandResult {
        let i = find_member(&self.members(), old)?;
        if self.layout.m == 0 {
            return Err(format!(
                "redundancy {} has nothing to rebuild from",
                self.redundancy
            ));
        }
        if let Some(r) = &self.rebuild {
            return Err(format!(
                "{} is being rebuilt; replace one member at a time",
                self.members[r.member as usize].name
            ));
        }
        let others_out = (0..self.members.len())
            .filter(|&j| j != i as usize && !self.members[j].readable())
            .count();
        if others_out >= self.layout.m as usize + usize::from(self.layout.m == 0) {
            return Err(format!(
                "{others_out} other members are out; {} cannot rebuild a member from what is left",
                self.redundancy
            ));
        }
        let (g, h) = (new.geometry().clone(), &self.member_geo);
        if (
            g.zone_size,
            g.zone_capacity,
            g.zone_count,
            g.logical_block_size,
        ) != (
            h.zone_size,
            h.zone_capacity,
            h.zone_count,
            h.logical_block_size,
        ) {
            return Err(format!(
                "{name}: zones of {} bytes ({} writable) x {}, the array's members {} ({}) x {}",
                g.zone_size,
                g.zone_capacity,
                g.zone_count,
                h.zone_size,
                h.zone_capacity,
                h.zone_count
            ));
        }
        // Nothing of the device's past may be read as rebuilt.
        for z in 0..g.zone_count {
            match new.zone_info(z) {
                Ok(info) if info.state == ZoneState::Empty => {}
                _ => new
                    .manage(z, ZoneAction::Reset)
                    .map_err(|e| format!("{name}: resetting zone {z}: {e}"))?,
            }
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
        let zones = self.geo.zone_count as usize;
        self.rebuild = Some(Rebuild {
            member: i,
            stale: vec![true; zones],
            cursor: 0,
            done_bytes: 0,
            total_bytes: 0,
            started: Instant::now(),
            last: Instant::now(),
            credit: 0.0,
            read_failures: 0,
        });
        self.rebuild_total();
        self.write_labels();
        tracing::info!(member = %name, slot = i, "array member replaced; rebuilding");
        Ok(format!("{name} is slot {i}; rebuilding"))
    }

    /// The bytes the rebuild still has to write, from the zones' write pointers.
    fn rebuild_total(&mut self) {
        let Some(r) = &self.rebuild else { return };
        let member = r.member;
        let mut total = 0;
        for z in 0..self.geo.zone_count {
            if !self.rebuild.as_ref().is_some_and(|r| r.is_stale(z)) {
                continue;
            }
            if let Ok((rows, _, _)) = self.zone_rows(z) {
                let have = self.new_member_rows(member, z).unwrap_or(0);
                total += rows.saturating_sub(have) * self.layout.unit;
            }
        }
        if let Some(r) = self.rebuild.as_mut() {
            r.total_bytes = r.done_bytes + total;
        }
    }

    /// After an open that found a member `Rebuilding`: the zones where it differs
    /// from the others are stale; the rebuild resumes there.
    pub(super) fn resume_rebuild(&mut self, i: u32) {
        let zones = self.geo.zone_count;
        self.rebuild = Some(Rebuild {
            member: i,
            stale: vec![true; zones as usize],
            cursor: 0,
            done_bytes: 0,
            total_bytes: 0,
            started: Instant::now(),
            last: Instant::now(),
            credit: 0.0,
            read_failures: 0,
        });
        for z in 0..zones {
            let Ok((rows, hi, state)) = self.zone_rows(z) else {
                continue;
            };
            let Some(dev) = self.members[i as usize].dev.as_ref() else {
                continue;
            };
            let Ok(mine) = dev.zone_info(z + LABEL_ZONES) else {
                continue;
            };
            let mine_rows = (mine.write_pointer - mine.start) / self.layout.unit;
            let same = rows == hi
                && (mine.state == ZoneState::Full) == (state == ZoneState::Full)
                && (state == ZoneState::Full || mine_rows == rows);
            if same {
                if let Some(r) = self.rebuild.as_mut() {
                    r.stale[z as usize] = false;
                }
            }
        }
        self.rebuild_total();
        tracing::info!(
            member = %self.members[i as usize].name,
            "array member rebuild resumes"
        );
    }

    /// The engine reset `zone`: it is empty on every member, the new one included.
    pub(super) fn rebuild_zone_reset(&mut self, zone: u32) {
        if let Some(r) = self.rebuild.as_mut() {
            if let Some(s) = r.stale.get_mut(zone as usize) {
                *s = false;
            }
        }
    }

    fn new_member_rows(&self, member: u32, zone: u32) -> Option<u64> {
        let info = self.members[member as usize]
            .dev
            .as_ref()?
            .zone_info(zone + LABEL_ZONES)
            .ok()?;
        Some(if info.state == ZoneState::Full {
            self.layout.rows_per_zone
        } else {
            (info.write_pointer - info.start) / self.layout.unit
        })
    }

    /// The first row of `zone` a write in flight covers.
    fn first_row_in_flight(&self, zone: u32) -> Option<u64> {
        let start = self.geo.zone_start(zone);
        let s = self.layout.stripe_bytes();
        self.ops
            .items
            .iter()
            .flatten()
            .filter_map(|op| match op.kind {
                super::OpKind::Write { offset, .. }
                    if offset >= start && offset < start + self.geo.zone_size =>
                {
                    Some((offset - start) / s)
                }
                _ => None,
            })
            .min()
    }

    /// One step of the rebuild; returns how soon the next is wanted (ns).
    pub(super) fn rebuild_step(&mut self) -> u64 {
        let Some(r) = self.rebuild.as_mut() else {
            return MAINTAIN_IDLE;
        };
        // Pace: credit accrues at the allowed rate; a window is spent at once.
        let rate = if self.in_flight > 0 {
            self.rebuild_limits.min_bytes_per_sec
        } else {
            self.rebuild_limits.max_bytes_per_sec
        };
        let now = Instant::now();
        if rate > 0 {
            let dt = now.duration_since(r.last).as_secs_f64();
            r.credit = (r.credit + dt * rate as f64).min(2.0 * REBUILD_WINDOW as f64);
            r.last = now;
            if r.credit < REBUILD_WINDOW as f64 {
                let wait = (REBUILD_WINDOW as f64 - r.credit) / rate as f64;
                return (wait * 1e9) as u64;
            }
        }
        let member = r.member;
        let Some(zone) = (r.cursor..self.geo.zone_count).find(|&z| r.stale[z as usize]) else {
            if let Some(z) = (0..r.cursor).find(|&z| r.stale[z as usize]) {
                r.cursor = z;
                return 0;
            }
            self.finish_rebuild();
            return MAINTAIN_IDLE;
        };
        r.cursor = zone;
        match self.rebuild_zone_window(member, zone) {
            Ok(Some(bytes)) => {
                if let Some(r) = self.rebuild.as_mut() {
                    r.done_bytes += bytes;
                    r.credit -= bytes as f64;
                    r.read_failures = 0;
                }
                self.status_dirty = true;
                0
            }
            // Writes to the zone are in flight: come back shortly.
            Ok(None) => 1_000_000,
            Err(e) => {
                tracing::warn!(zone, error = %e, "rebuild step failed");
                let give_up = self.rebuild.as_mut().is_none_or(|r| {
                    r.read_failures += 1;
                    r.read_failures > 64
                });
                if give_up || !self.members[member as usize].writable() {
                    tracing::error!(
                        member = %self.members[member as usize].name,
                        "rebuild stopped: {e}"
                    );
                    self.rebuild = None;
                    self.members[member as usize].fail(format!("rebuild failed: {e}"));
                    self.persist_states();
                    return MAINTAIN_IDLE;
                }
                1_000_000
            }
        }
    }

    /// Rebuilds one window of `zone` on `member`. `Ok(Some(bytes))` written (0 when
    /// the zone became rebuilt), `Ok(None)` when it must wait for writes in flight.
    fn rebuild_zone_window(&mut self, member: u32, zone: u32) -> Result<Option<u64>, String> {
        let (rows, hi, state) = self.zone_rows(zone).map_err(|e| e.to_string())?;
        let full = state == ZoneState::Full;
        let have = self
            .new_member_rows(member, zone)
            .ok_or("the new member cannot report the zone")?;
        let in_flight = self.first_row_in_flight(zone);
        let target = in_flight.map_or(if full { rows.max(hi) } else { rows }, |f| f.min(rows));
        if have >= target {
            if in_flight.is_some() {
                return Ok(None);
            }
            let dev = self.members[member as usize]
                .dev
                .as_mut()
                .ok_or("the new member is gone")?;
            let mine = dev
                .zone_info(zone + LABEL_ZONES)
                .map_err(|e| e.to_string())?
                .state;
            // The new member's zone takes the state the others' have, so it holds
            // an open or active slot exactly when they do.
            let action = match state {
                ZoneState::Empty if mine != ZoneState::Empty => Some(ZoneAction::Reset),
                ZoneState::Full if mine != ZoneState::Full => Some(ZoneAction::Finish),
                ZoneState::Closed
                    if matches!(mine, ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen) =>
                {
                    Some(ZoneAction::Close)
                }
                _ => None,
            };
            if let Some(a) = action {
                dev.manage(zone + LABEL_ZONES, a)
                    .map_err(|e| e.to_string())?;
            }
            if have > 0 || full {
                dev.flush().map_err(|e| e.to_string())?;
            }
            if let Some(r) = self.rebuild.as_mut() {
                r.stale[zone as usize] = false;
            }
            return Ok(Some(0));
        }
        let n = (target - have).min((REBUILD_WINDOW / self.layout.unit).max(1));
        let bytes = self.rebuild_rows(member, zone, have, n)?;
        Ok(Some(bytes))
    }

    /// Reads rows `first..first+n` of `zone` from K other members, decodes
    /// `member`'s units and appends them to its zone.
    fn rebuild_rows(&mut self, member: u32, zone: u32, first: u64, n: u64) -> Result<u64, String> {
        let l = self.layout;
        let unit = l.unit as usize;
        let sources: Vec<usize> = (0..self.members.len())
            .filter(|&j| j != member as usize && self.in_zone(j, zone))
            .take(l.k as usize)
            .collect();
        if sources.len() < l.k as usize {
            return Err(format!(
                "zone {zone}: {} members hold it, {} needed",
                sources.len(),
                l.k
            ));
        }
        let moff = self.member_offset(zone, first, 0);
        // Window buffers are kept between steps: fresh megabyte allocations would
        // page-fault on every window.
        let mut bufs = std::mem::take(&mut self.rebuild_bufs);
        bufs.resize_with(sources.len() + 1, Vec::new);
        for b in &mut bufs {
            b.resize(n as usize * unit, 0);
        }
        let r = self.rebuild_rows_into(member, zone, first, n, moff, &sources, &mut bufs);
        self.rebuild_bufs = bufs;
        r
    }

    /// The body of [`Self::rebuild_rows`]: `bufs` holds one window per source, then
    /// the output window.
    #[allow(clippy::too_many_arguments)]
    fn rebuild_rows_into(
        &mut self,
        member: u32,
        zone: u32,
        first: u64,
        n: u64,
        moff: u64,
        sources: &[usize],
        bufs: &mut [Vec<u8>],
    ) -> Result<u64, String> {
        let l = self.layout;
        let unit = l.unit as usize;
        let (ins, out) = bufs.split_at_mut(sources.len());
        let out = &mut out[0];
        for (b, &j) in ins.iter_mut().zip(sources) {
            let dev = self.members[j].dev.as_mut().ok_or("a source vanished")?;
            if let Err(e) = dev.read_at(moff, b) {
                self.read_error(j as u32, &e);
                return Err(format!("reading {}: {e}", self.members[j].name));
            }
            self.members[j].counters.bytes_read += b.len() as u64;
        }
        for r in 0..n as usize {
            let row = first + r as u64;
            let mut shards: Vec<Option<&[u8]>> = vec![None; l.shards() as usize];
            for (b, &j) in ins.iter().zip(sources) {
                if let Some(s) = l.shard_on(zone, row, j as u32) {
                    shards[s as usize] = Some(&b[r * unit..(r + 1) * unit]);
                }
            }
            let Some(want) = l.shard_on(zone, row, member) else {
                continue;
            };
            self.codec
                .reconstruct(
                    &shards,
                    &[want as usize],
                    &mut [&mut out[r * unit..(r + 1) * unit]],
                )
                .map_err(|e| format!("zone {zone} row {row}: {e}"))?;
        }
        let m = &mut self.members[member as usize];
        let dev = m.dev.as_mut().ok_or("the new member is gone")?;
        if let Err(e) = dev.write_at(moff, out) {
            m.counters.write_errors += 1;
            m.fail(format!("rebuild write: {e}"));
            return Err(format!("writing the new member: {e}"));
        }
        m.counters.bytes_written += out.len() as u64;
        Ok(out.len() as u64)
    }

    fn finish_rebuild(&mut self) {
        let Some(r) = self.rebuild.take() else { return };
        let m = &mut self.members[r.member as usize];
        if let Some(dev) = m.dev.as_mut() {
            if let Err(e) = dev.flush() {
                m.fail(format!("flush at the end of the rebuild: {e}"));
                self.persist_states();
                return;
            }
        }
        m.state = MemberState::Ok;
        tracing::info!(
            member = %m.name,
            bytes = r.done_bytes,
            secs = r.started.elapsed().as_secs_f64(),
            "array member rebuilt"
        );
        self.persist_states();
        self.status_dirty = true;
    }

    /// Whether a rebuild is running.
    pub fn rebuilding(&self) -> bool {
        self.rebuild.is_some()
    }

    /// `Redundancy` of the array (for commands that depend on it).
    pub fn can_rebuild(&self) -> bool {
        self.redundancy != Redundancy::None
    }
}
