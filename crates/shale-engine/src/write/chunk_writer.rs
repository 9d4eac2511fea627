//! The ChunkWriter: the open chunk, its group buffers, and the batched device writes.

use shale_device::{BlockDevice, IoOp, IoRequest, ZonedDevice};
use shale_format::{
    EntryKind, JournalRecord, Lba, MdEntry, Pba, RegionId, RegionRole, RegionState, VolumeId,
    BLOCK_SIZE,
};

use std::collections::VecDeque;

use super::group::{GroupBuf, MdState};
use super::runs::Runs;
use crate::core::Core;
use crate::engine::InflightIo;
use crate::flush::Durability;
use crate::layout::Groups;
use crate::request::Answer;
use crate::{Clock, EngineError, Reply};

/// A write request waiting for its blocks' device writes.
#[derive(Debug)]
pub(crate) struct PendingWrite {
    pub asn_end: u64,
    pub fua: bool,
    pub done: Answer,
}

/// Settled group buffers kept for reuse; a burst beyond this allocates (up to
/// `write_buffers_max`) and gives the memory back when it settles.
const GROUP_BUFFERS_IDLE_MAX: usize = 4;

#[derive(Debug)]
pub(crate) struct ChunkWriter {
    /// The chunk user writes go to, if one is open and not full.
    pub open: Option<RegionId>,
    /// Unsettled groups in creation (= ASN) order.
    pub groups: Vec<GroupBuf>,
    pool: Vec<Vec<u8>>,
    pub buffers_max: usize,
    next_id: u32,
    /// Data slots left in the open chunk.
    pub open_remaining: u64,
    pub chunk_data_capacity: u64,
    /// Appended blocks' device writes, in ASN order.
    pub runs: Runs,
    /// The next append sequence number.
    pub asn_next: u64,
    /// Write requests waiting for their blocks' device writes.
    pub pending: VecDeque<PendingWrite>,
    /// Read-modify-write's block, lent out while a write runs.
    pub block_scratch: Option<Box<[u8; BLOCK_SIZE]>>,
    /// A mapping unit being assembled by a write to a volume mapped in units.
    pub unit_scratch: Vec<u8>,
    /// A failure that must stop the engine (a block appended but not mapped, an unmap
    /// cut short), for the event loop to act on before anything else happens.
    pub failure: Option<EngineError>,
    /// Acknowledgements are held in `ready` until a hand-off image covers them.
    pub hold_acks: bool,
    /// Successful answers waiting for the hand-off image (`Engine::deliver`).
    pub ready: Vec<Answer>,
}

impl ChunkWriter {
    pub fn new(buffers_max: u32, chunk_blocks: u32) -> ChunkWriter {
        ChunkWriter {
            open: None,
            groups: Vec::new(),
            pool: Vec::new(),
            buffers_max: buffers_max as usize,
            next_id: 0,
            open_remaining: 0,
            runs: Runs::default(),
            asn_next: 0,
            pending: VecDeque::new(),
            block_scratch: Some(Box::new([0; BLOCK_SIZE])),
            unit_scratch: Vec::new(),
            failure: None,
            hold_acks: false,
            ready: Vec::new(),
            chunk_data_capacity: u64::from(
                Groups {
                    blocks: chunk_blocks,
                }
                .data_capacity(),
            ),
        }
    }

    /// The in-memory copy of `slot` of `region`, if its group is unsettled.
    pub fn find(&self, region: RegionId, slot: u32) -> Option<&[u8]> {
        self.groups.iter().find_map(|g| {
            (g.region == region && slot >= g.start_slot && slot < g.start_slot + g.filled)
                .then(|| g.block(slot - g.start_slot))
        })
    }

    pub fn has_unsettled(&self, region: RegionId) -> bool {
        self.groups.iter().any(|g| g.region == region)
    }

    /// Records a failure that stops the engine; the first one is its cause.
    pub(crate) fn fail(&mut self, e: EngineError) {
        self.failure.get_or_insert(e);
    }

    /// Completes write requests whose blocks are all written; FUA ones wait for the
    /// next durability point.
    pub fn complete_writes(&mut self, durability: &mut Durability) {
        let wm = self.runs.watermark();
        while self.pending.front().is_some_and(|w| w.asn_end <= wm) {
            let Some(w) = self.pending.pop_front() else {
                break;
            };
            if w.fua {
                durability.waiters.push(w.done);
                durability.requested = true;
            } else if self.hold_acks {
                self.ready.push(w.done);
            } else {
                w.done.send(Ok(Reply::Done));
            }
        }
    }

    /// Answers a request whose effect is in memory only (a trim): held for the
    /// hand-off image like a completed write when a store is attached.
    pub fn answer(&mut self, done: Answer, r: Result<Reply, EngineError>) {
        match r {
            Ok(Reply::Done) if self.hold_acks => self.ready.push(done),
            r => done.send(r),
        }
    }

    /// The most pads `blocks` blocks written in units of `k` may need: fewer than a
    /// unit where the open chunk ends, and again at each further chunk they reach.
    pub fn unit_pads_max(&self, blocks: u64, k: u64) -> u64 {
        (k - 1) * (2 + blocks / self.chunk_data_capacity.max(1))
    }

    /// Pads the open chunk to its end if a unit of `k` blocks no longer fits in it,
    /// so the unit's blocks take consecutive data slots of one chunk.
    pub fn pad_for_unit(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        k: u64,
    ) {
        if self.open.is_some() && self.open_remaining < k {
            while self.open.is_some() {
                self.append_pad(core);
                core.stats.unit_pad_blocks += 1;
            }
        }
    }

    /// Whether `n` blocks can be appended now without waiting.
    pub fn can_append(&self, n: u64, free_chunks: usize) -> bool {
        let room = self.open_remaining + free_chunks as u64 * self.chunk_data_capacity;
        let groups_needed = n.div_ceil(shale_format::GROUP_DATA_SLOTS as u64) as usize + 1;
        room >= n && self.groups.len() + groups_needed <= self.buffers_max
    }
}

impl ChunkWriter {
    /// Appends one block for (volume, lba) at the write pointer; returns its PBA. The
    /// caller checked `can_append`.
    pub fn append_block(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        lba: Lba,
        block: &[u8],
    ) -> Pba {
        core.volume_counters(volume).cache_write_bytes += BLOCK_SIZE as u64;
        core.stats.user_blocks_appended += 1;
        self.append(core, EntryKind::Data, volume, lba, block)
    }

    /// Appends a pad block: a slot of the user write order for a direct write
    /// (`write/direct.rs`). The caller checked `can_append`.
    pub fn append_pad(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) -> Pba {
        const ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];
        self.append(core, EntryKind::Pad, VolumeId::NONE, Lba(0), &ZEROS)
    }

    fn append(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        kind: EntryKind,
        volume: VolumeId,
        lba: Lba,
        block: &[u8],
    ) -> Pba {
        let region = match self.open {
            Some(r) => r,
            None => {
                let Some(r) = core.regions.free_chunks.pop_front() else {
                    panic!("append without a free chunk: can_append was not checked");
                };
                let sid = core.next_sid();
                core.regions.open(r, sid, RegionRole::User, 0);
                core.journal
                    .append(JournalRecord::RegionOpened { region: r, sid });
                core.md_cache
                    .invalidate_range(core.geo.region_base(r).0, core.geo.chunk_blocks);
                self.open = Some(r);
                self.open_remaining = self.chunk_data_capacity;
                r
            }
        };
        let groups = Groups {
            blocks: core.geo.chunk_blocks,
        };
        let wp = core.regions.get(region).wp;
        let (g, idx) = groups.locate(wp);
        let need_new = self
            .groups
            .last()
            .is_none_or(|b| b.region != region || b.group != g);
        if need_new {
            debug_assert_eq!(idx, 0);
            let data = self
                .pool
                .pop()
                .unwrap_or_else(|| vec![0u8; shale_format::GROUP_DATA_SLOTS * BLOCK_SIZE]);
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            let sid = core.regions.get(region).sid;
            self.groups.push(GroupBuf::new(
                id,
                region,
                g,
                groups.start(g),
                groups.data_slots(g),
                sid,
                data,
                self.asn_next,
            ));
        }
        let Some(gb) = self.groups.last_mut() else {
            unreachable!("group just ensured")
        };
        let entry = MdEntry {
            kind,
            volume,
            lba,
            sid: gb.sid,
            data_crc: shale_format::block_crc(block),
            ..MdEntry::EMPTY
        };
        let i = gb.append(block, &entry);
        debug_assert_eq!(i, idx);
        self.asn_next += 1;
        self.open_remaining -= 1;
        let full = gb.is_full();
        if full {
            gb.seal_final();
        }
        let reg = core.regions.get_mut(region);
        reg.wp += 1;
        if full {
            reg.wp = if g + 1 < groups.count() {
                groups.start(g + 1)
            } else {
                groups.end()
            };
            if reg.wp >= groups.end() {
                self.open = None;
                self.open_remaining = 0;
            }
        }
        core.geo.pba(region, groups.start(g) + i)
    }

    /// Submits one device write per group with unsubmitted blocks, and pending final
    /// md writes.
    pub fn submit_runs(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) -> Result<(), EngineError> {
        for gi in 0..self.groups.len() {
            let (region, start, from, to, asn_base, id) = {
                let g = &self.groups[gi];
                (
                    g.region,
                    g.start_slot,
                    g.submitted,
                    g.filled,
                    g.asn_base,
                    g.id,
                )
            };
            // Power-of-two pieces, so pooled buffers of a few sizes serve every run.
            let mut at = from;
            while at < to {
                let n = 1u32 << (31 - (to - at).leading_zeros());
                let bytes = n as usize * BLOCK_SIZE;
                let mut buf = core.bufs.take(n as usize);
                buf.copy_from_slice(
                    &self.groups[gi].data[at as usize * BLOCK_SIZE..(at + n) as usize * BLOCK_SIZE],
                );
                let run_seq = self
                    .runs
                    .push(asn_base + u64::from(at), asn_base + u64::from(at + n));
                let tag = core.io.insert(InflightIo::CacheRun {
                    group_id: id,
                    run_seq,
                    bytes: bytes as u32,
                });
                let offset = core.geo.chunk_offset(region, start + at);
                core.cache.submit(IoRequest {
                    tag,
                    op: IoOp::Write {
                        offset,
                        buf,
                        fua: false,
                    },
                });
                self.groups[gi].inflight += 1;
                core.regions.get_mut(region).inflight_writes += 1;
                core.stats.cache_data_write_bytes += bytes as u64;
                at += n;
            }
            self.groups[gi].submitted = to;
            if self.groups[gi].md_state == MdState::FinalPending {
                let g = &mut self.groups[gi];
                g.md_state = MdState::FinalSubmitted;
                g.inflight += 1;
                let mut buf = core.bufs.take(1);
                buf.copy_from_slice(&g.md[..]);
                let md_slot = Groups {
                    blocks: core.geo.chunk_blocks,
                }
                .md_slot(g.group)
                    + g.md_final_copy;
                let offset = core.geo.chunk_offset(region, md_slot);
                let tag = core.io.insert(InflightIo::CacheMd { group_id: id });
                core.cache.submit(IoRequest {
                    tag,
                    op: IoOp::Write {
                        offset,
                        buf,
                        fua: false,
                    },
                });
                core.regions.get_mut(region).inflight_writes += 1;
                core.stats.cache_md_write_bytes += BLOCK_SIZE as u64;
            }
        }
        Ok(())
    }

    fn group_index(&self, id: u32) -> usize {
        let Some(i) = self.groups.iter().position(|g| g.id == id) else {
            panic!("completion for unknown group {id}");
        };
        i
    }

    pub fn on_run_done(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        group_id: u32,
        run_seq: u64,
        _bytes: u32,
    ) -> Result<(), EngineError> {
        self.runs.complete(run_seq);
        let i = self.group_index(group_id);
        self.groups[i].inflight -= 1;
        let region = self.groups[i].region;
        core.regions.get_mut(region).inflight_writes -= 1;
        self.maybe_settle(core, i);
        Ok(())
    }

    pub fn on_md_done(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        group_id: u32,
    ) -> Result<(), EngineError> {
        let i = self.group_index(group_id);
        let g = &mut self.groups[i];
        g.inflight -= 1;
        g.md_newest = Some(g.md_final_copy);
        let region = g.region;
        core.regions.get_mut(region).inflight_writes -= 1;
        self.maybe_settle(core, i);
        Ok(())
    }

    /// Releases a settled group's buffer, caches its md, and closes its chunk if that
    /// was the chunk's last unsettled group.
    fn maybe_settle(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        i: usize,
    ) {
        if !self.groups[i].settled() {
            return;
        }
        let g = self.groups.remove(i);
        let md_a = core.geo.pba(
            g.region,
            Groups {
                blocks: core.geo.chunk_blocks,
            }
            .md_slot(g.group),
        );
        core.md_cache.insert(md_a.0, &g.md[..]);
        if self.pool.len() < GROUP_BUFFERS_IDLE_MAX {
            self.pool.push(g.data);
        }
        let unsettled = self.has_unsettled(g.region);
        let now = core.now();
        if core.regions.try_close(&core.geo, g.region, unsettled, now) {
            core.journal
                .append(JournalRecord::RegionClosed { region: g.region });
        }
        debug_assert!(core.regions.get(g.region).state != RegionState::Free);
    }
}
