//! User writes, trims and write-zeroes: validation, read-modify-write of partial
//! blocks, then append + L2P update + validity.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{JournalRecord, Lba, Pba, VolumeId, BLOCK_SIZE};

use crate::core::Core;
use crate::layout::BS;
use crate::read::reader::read_block_sync;
use crate::request::Answer;
use crate::write::chunk_writer::ChunkWriter;
use crate::write::chunk_writer::PendingWrite;
use crate::{Clock, EngineError};

impl ChunkWriter {
    /// Starts a write; gives its data and answer back if it must wait for cache space.
    pub fn start_write(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
        done: Answer,
    ) -> Result<Option<(Vec<u8>, Answer)>, EngineError> {
        let len = data.len() as u64;
        if let Err(e) = core.validate_range(volume, offset, len, true) {
            done.send(Err(e));
            return Ok(None);
        }
        let blocks = self.blocks_to_write(core, volume, offset, len);
        if !self.can_append(blocks, core.regions.free_chunks.len()) {
            return Ok(Some((data, done)));
        }
        if let Err(e) = self.write_range(core, volume, offset, &data, false) {
            if self.failure.is_some() {
                // This request is in no queue `fail` drained: it learns of it here.
                done.send(Err(EngineError::Failed {
                    reason: e.to_string(),
                }));
                return Err(e);
            }
            // A read-modify-write's read or an L2P page fault failed, before the
            // failing block was touched: the blocks before it are written like any
            // others and the rest keep their old data, as a failed write may leave
            // its range. Only this request fails.
            tracing::warn!(%volume, offset, len, error = %e, "write failed");
            done.send(Err(e));
            return Ok(None);
        }
        core.stats.user_write_bytes += len;
        let c = core.volume_counters(volume);
        c.write_ops += 1;
        c.user_write_bytes += len;
        self.pending.push_back(PendingWrite {
            asn_end: self.asn_next,
            fua,
            done,
        });
        Ok(None)
    }

    /// Cache slots a write of `len` bytes at `offset` may take: its blocks, or on a
    /// volume mapped in units every unit it touches, plus the pads that keep each
    /// unit in one chunk (fewer than a unit at each chunk it reaches).
    fn blocks_to_write(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        offset: u64,
        len: u64,
    ) -> u64 {
        let shift = core.volumes.shift(volume);
        let unit = BS << shift;
        let units = (offset + len - 1) / unit - offset / unit + 1;
        let blocks = units << shift;
        if shift == 0 {
            return blocks;
        }
        blocks + self.unit_pads_max(blocks, 1 << shift)
    }

    /// Writes `len` bytes at `offset`: `data` bytes, or zeros when `zeros` (then `data`
    /// is ignored and `len` comes from the caller's range).
    fn write_range(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        offset: u64,
        data: &[u8],
        zeros: bool,
    ) -> Result<(), EngineError> {
        let shift = core.volumes.shift(volume);
        if shift > 0 {
            return self.write_units(core, volume, shift, offset, data, zeros);
        }
        self.write_blocks(core, volume, offset, data, zeros)
    }

    /// `write_range` block by block: whole blocks as they are, partial ones read
    /// first. On a dual volume the blocks go to its sparse map.
    fn write_blocks(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        offset: u64,
        data: &[u8],
        zeros: bool,
    ) -> Result<(), EngineError> {
        let dual = core.volumes.is_dual(volume);
        let len = data.len() as u64;
        let first = offset / BS;
        let last = (offset + len - 1) / BS;
        let mut block = self
            .block_scratch
            .take()
            .unwrap_or_else(|| Box::new([0; BLOCK_SIZE]));
        let mut result = Ok(());
        for lba in first..=last {
            let bstart = lba * BS;
            let lo = offset.max(bstart);
            let hi = (offset + len).min(bstart + BS);
            let full = lo == bstart && hi == bstart + BS;
            let src: &[u8] = if full && !zeros {
                let o = (lo - offset) as usize;
                &data[o..o + BLOCK_SIZE]
            } else {
                if !full {
                    if let Err(e) = read_block_sync(core, self, volume, Lba(lba), &mut block) {
                        result = Err(e);
                        break;
                    }
                }
                let (a, b) = ((lo - bstart) as usize, (hi - bstart) as usize);
                if zeros {
                    block[a..b].fill(0);
                } else {
                    let o = (lo - offset) as usize;
                    block[a..b].copy_from_slice(&data[o..o + (b - a)]);
                }
                &block[..]
            };
            let mapped = if dual {
                self.map_new_fine_block(core, volume, Lba(lba), src)
            } else {
                self.map_new_block(core, volume, Lba(lba), src)
            };
            if let Err(e) = mapped {
                result = Err(e);
                break;
            }
        }
        self.block_scratch = Some(block);
        result
    }

    /// `write_range` on a volume mapped in units of `1 << shift` blocks: each unit the
    /// range touches is written whole, the blocks it does not cover read first.
    fn write_units(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        shift: u32,
        offset: u64,
        data: &[u8],
        zeros: bool,
    ) -> Result<(), EngineError> {
        let len = data.len() as u64;
        let k = 1u64 << shift;
        let unit_bytes = k * BS;
        if core.volumes.is_dual(volume) {
            // Whole units to the unit map, the rest block by block to the sparse map.
            let (lo, hi) = (offset, offset + len);
            let first = lo.div_ceil(unit_bytes) * unit_bytes;
            let end = hi / unit_bytes * unit_bytes;
            if first >= end {
                return self.write_blocks(core, volume, offset, data, zeros);
            }
            // With `zeros` the data is zeros of the range's length too.
            let part = |a: u64, b: u64| &data[(a - lo) as usize..(b - lo) as usize];
            if lo < first {
                self.write_blocks(core, volume, lo, part(lo, first), zeros)?;
            }
            self.write_whole_units(core, volume, shift, first, part(first, end), zeros)?;
            if end < hi {
                self.write_blocks(core, volume, end, part(end, hi), zeros)?;
            }
            return Ok(());
        }
        self.write_whole_units(core, volume, shift, offset, data, zeros)
    }

    /// Writes every unit `[offset, offset + data.len())` touches, whole: the blocks
    /// the range does not cover are read first.
    fn write_whole_units(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        shift: u32,
        offset: u64,
        data: &[u8],
        zeros: bool,
    ) -> Result<(), EngineError> {
        let len = data.len() as u64;
        let k = 1u64 << shift;
        let unit_bytes = k * BS;
        let mut unit = std::mem::take(&mut self.unit_scratch);
        unit.resize(unit_bytes as usize, 0);
        let mut result = Ok(());
        'units: for u in offset / unit_bytes..=(offset + len - 1) / unit_bytes {
            let start = u * unit_bytes;
            let (lo, hi) = (offset.max(start), (offset + len).min(start + unit_bytes));
            for j in 0..k {
                let (b0, b1) = (start + j * BS, start + (j + 1) * BS);
                let Ok(block) = <&mut [u8; BLOCK_SIZE]>::try_from(
                    &mut unit[(j * BS) as usize..(b1 - start) as usize],
                ) else {
                    unreachable!("a unit is whole blocks")
                };
                if lo > b0 || hi < b1 {
                    if let Err(e) = read_block_sync(core, self, volume, Lba(u * k + j), block) {
                        result = Err(e);
                        break 'units;
                    }
                }
                let (a, b) = (lo.max(b0), hi.min(b1));
                if a < b {
                    let dst = &mut block[(a - b0) as usize..(b - b0) as usize];
                    if zeros {
                        dst.fill(0);
                    } else {
                        dst.copy_from_slice(&data[(a - offset) as usize..(b - offset) as usize]);
                    }
                }
            }
            if let Err(e) = self.map_new_unit(core, volume, shift, u, &unit) {
                result = Err(e);
                break;
            }
        }
        self.unit_scratch = unit;
        result
    }

    /// Appends the `1 << shift` blocks of unit `u` of `volume` in consecutive data
    /// slots of one chunk and maps the unit to them.
    fn map_new_unit(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        shift: u32,
        u: u64,
        data: &[u8],
    ) -> Result<(), EngineError> {
        let k = 1u64 << shift;
        // A dual volume's blocks written apart from the unit: each one's current copy
        // (the unit map's copy of such a block is invalid already).
        let mut overrides = [Pba::NONE; 1 << shale_format::MAP_UNIT_SHIFT_MAX];
        for j in 0..k {
            if let Some(p) = core.fine_lookup(volume, Lba(u * k + j))? {
                overrides[j as usize] = p;
            }
        }
        // Fault the page in first (last of the pages), as for a block.
        core.l2p.get(&mut core.cache, volume, Lba(u))?;
        for j in 0..k {
            core.directs.supersede(volume, Lba(u * k + j));
        }
        self.pad_for_unit(core, k);
        let mut base = Pba::NONE;
        for (j, block) in data.chunks_exact(BLOCK_SIZE).enumerate() {
            let pba = self.append_block(core, volume, Lba(u * k + j as u64), block);
            if j == 0 {
                base = pba;
            } else {
                debug_assert_eq!(pba, core.unit_block(base, j as u64), "unit split");
            }
            core.regions.mark_valid(&core.geo, pba, volume);
        }
        let old = core
            .l2p
            .set(&mut core.cache, volume, Lba(u), base)
            .inspect_err(|e| {
                self.fail(EngineError::Failed {
                    reason: format!("mapping {volume} unit {u} to {base}: {e}"),
                })
            })?;
        for j in 0..k {
            let over = overrides[j as usize];
            let old_j = if !over.is_none() {
                let fine = core.volumes.fine_map(volume);
                core.l2p
                    .set(&mut core.cache, fine, Lba(u * k + j), Pba::NONE)
                    .inspect_err(|e| {
                        self.fail(EngineError::Failed {
                            reason: format!(
                                "unmapping {volume} block {} of unit {u}: {e}",
                                u * k + j
                            ),
                        })
                    })?;
                over
            } else if old.is_none() {
                old
            } else {
                core.unit_block(old, j)
            };
            let new_j = core.unit_block(base, j);
            core.placement
                .user_write(&core.geo, &core.regions, core.sid_next, new_j, old_j);
            if !old_j.is_none() {
                core.regions.mark_invalid(&core.geo, old_j, volume);
            }
        }
        Ok(())
    }

    /// Writes block `lba` of a dual volume to its sparse map, over whatever its unit
    /// map holds.
    fn map_new_fine_block(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        lba: Lba,
        src: &[u8],
    ) -> Result<(), EngineError> {
        let fine = core.volumes.fine_map(volume);
        let coarse = core.coarse_lookup(volume, lba)?;
        // The sparse page is faulted in last: appending touches no page, so it is
        // still cached at the set below.
        let over = core
            .l2p
            .get(&mut core.cache, fine, lba)?
            .unwrap_or(Pba::NONE);
        let old = if over.is_none() { coarse } else { over };
        self.append_and_map(core, volume, fine, lba, src, Some(old))
    }

    /// Appends block `lba` of `volume` and maps it in L2P map `map` (the volume's, or
    /// a dual volume's sparse map), invalidating the copy it replaces: `old`, or
    /// what the map held. The map's page must be cached: appending touches no page,
    /// and an error here would leave a valid block unmapped, so it stops the engine.
    fn append_and_map(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        map: VolumeId,
        lba: Lba,
        src: &[u8],
        old: Option<Pba>,
    ) -> Result<(), EngineError> {
        let pba = self.append_block(core, volume, lba, src);
        core.regions.mark_valid(&core.geo, pba, volume);
        let held = core
            .l2p
            .set(&mut core.cache, map, lba, pba)
            .inspect_err(|e| {
                self.fail(EngineError::Failed {
                    reason: format!("mapping {volume} {lba} to {pba} (L2P map {map}): {e}"),
                })
            })?;
        let old = old.unwrap_or(held);
        core.placement
            .user_write(&core.geo, &core.regions, core.sid_next, pba, old);
        if !old.is_none() {
            core.regions.mark_invalid(&core.geo, old, volume);
        }
        Ok(())
    }

    pub(crate) fn map_new_block(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        lba: Lba,
        src: &[u8],
    ) -> Result<(), EngineError> {
        // Fault the page in before appending so a failing fault leaves nothing behind
        // (the request fails; the engine carries on).
        core.l2p.get(&mut core.cache, volume, lba)?;
        core.directs.supersede(volume, lba);
        self.append_and_map(core, volume, volume, lba, src, None)
    }

    /// Write-zeroes of partial edge blocks needs cache space.
    pub fn can_write_zeroes(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        offset: u64,
        len: u64,
    ) -> bool {
        if core.validate_range(volume, offset, len, false).is_err() {
            return true; // fails at once
        }
        let shift = core.volumes.shift(volume);
        let unit = BS << shift;
        let edges = u64::from(!offset.is_multiple_of(unit))
            + u64::from(!(offset + len).is_multiple_of(unit));
        let blocks = edges << shift;
        let pads = if shift == 0 {
            0
        } else {
            self.unit_pads_max(blocks, 1 << shift)
        };
        self.can_append(blocks + pads, core.regions.free_chunks.len())
    }

    /// Write-zeroes: whole blocks trimmed, partial edge blocks written as zeros. With
    /// edges it is answered like a write, once they are on the device.
    pub fn write_zeroes(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        offset: u64,
        len: u64,
        done: Answer,
    ) {
        let appended = self.asn_next;
        let r = self.trim(core, volume, offset, len, true);
        if r.is_ok() && self.asn_next > appended {
            self.pending.push_back(PendingWrite {
                asn_end: self.asn_next,
                fua: false,
                done,
            });
        } else {
            self.answer(done, r.map(|()| crate::Reply::Done));
        }
    }

    /// Trim (`zeroes == false`: whole blocks only, whole units on a volume mapped in
    /// units) or write-zeroes (exact).
    pub fn trim(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        offset: u64,
        len: u64,
        zeroes: bool,
    ) -> Result<(), EngineError> {
        core.validate_range(volume, offset, len, false)?;
        if !zeroes {
            core.volume_counters(volume).trim_ops += 1;
        }
        let shift = core.volumes.shift(volume);
        let unit = BS << shift;
        let end = offset + len;
        // In whole units, counted in blocks.
        let first_full = offset.div_ceil(unit) << shift;
        let end_full = (end / unit) << shift;
        if zeroes {
            // Partial edges become zeros by read-modify-write.
            if first_full > end_full {
                let z = vec![0u8; len as usize];
                return self.write_range(core, volume, offset, &z, true);
            }
            if offset < first_full * BS {
                let l = first_full * BS - offset;
                self.write_range(core, volume, offset, &vec![0u8; l as usize], true)?;
            }
            if end > end_full * BS && end_full >= first_full {
                let l = end - end_full * BS;
                self.write_range(core, volume, end_full * BS, &vec![0u8; l as usize], true)?;
            }
        }
        if end_full > first_full {
            self.unmap_range(core, volume, first_full, end_full - first_full)?;
            let (key_sid, key_pos) = self.write_position(core);
            core.journal.append(JournalRecord::Trim {
                volume,
                lba: Lba(first_full),
                count: end_full - first_full,
                key_sid,
                key_pos,
            });
            core.stats.user_trim_bytes += (end_full - first_full) * BS;
            core.volume_counters(volume).user_trim_bytes += (end_full - first_full) * BS;
        }
        Ok(())
    }

    /// The current user-write position (open chunk SID, write pointer), ordering trims
    /// among writes for recovery.
    pub fn write_position(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) -> (shale_format::Sid, u32) {
        match self.open {
            Some(r) => (core.regions.get(r).sid, core.regions.get(r).wp),
            None => (shale_format::Sid(core.sid_next), 0),
        }
    }

    /// Unmaps `count` LBAs from `first`, skipping pages never written. A failure part
    /// way stops the engine: the unmaps done so far have no journal record (the trim's
    /// is written only once it is complete), so space they emptied must never be
    /// reused on the strength of them.
    pub fn unmap_range(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        first: u64,
        count: u64,
    ) -> Result<(), EngineError> {
        Self::unmap_range_inner(core, volume, first, count).inspect_err(|e| {
            self.fail(EngineError::Failed {
                reason: format!("unmapping {volume} {first}+{count}: {e}"),
            })
        })
    }

    fn unmap_range_inner(
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        first: u64,
        count: u64,
    ) -> Result<(), EngineError> {
        core.directs.supersede_range(volume, first, first + count);
        // In L2P entries: blocks, or whole units (callers pass unit-aligned ranges on
        // volumes mapped in units).
        let shift = core.volumes.shift(volume);
        debug_assert!(first.is_multiple_of(1 << shift) && count.is_multiple_of(1 << shift));
        if core.volumes.is_dual(volume) {
            return Self::unmap_dual(
                core,
                volume,
                shift,
                first >> shift,
                (first + count) >> shift,
            );
        }
        let mut lba = first >> shift;
        let end = (first + count) >> shift;
        while lba < end {
            let epp = core.l2p.format().entries_per_page();
            let page = (lba / epp) as usize;
            let page_end = ((page as u64 + 1) * epp).min(end);
            if core.l2p.page_is_empty(volume, page) {
                lba = page_end;
                continue;
            }
            while lba < page_end {
                let old = core.l2p.set(&mut core.cache, volume, Lba(lba), Pba::NONE)?;
                if !old.is_none() {
                    for j in 0..1u64 << shift {
                        let b = core.unit_block(old, j);
                        core.regions.mark_invalid(&core.geo, b, volume);
                    }
                }
                lba += 1;
            }
        }
        Ok(())
    }

    /// Unmaps units `lo..hi` of dual volume `volume` from both its maps, skipping
    /// stretches whose pages were never written.
    fn unmap_dual(
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        shift: u32,
        lo: u64,
        hi: u64,
    ) -> Result<(), EngineError> {
        let k = 1u64 << shift;
        let epp = core.l2p.format().entries_per_page();
        let fine = core.volumes.fine_map(volume);
        let mut u = lo;
        while u < hi {
            let page = u / epp;
            let page_end = ((page + 1) * epp).min(hi);
            // The sparse pages under this unit-map page.
            let (f0, f1) = ((u * k) / epp, (page_end * k).div_ceil(epp));
            if core.l2p.page_is_empty(volume, page as usize)
                && (f0..f1).all(|p| core.l2p.page_is_empty(fine, p as usize))
            {
                u = page_end;
                continue;
            }
            while u < page_end {
                let mut over = [false; 1 << shale_format::MAP_UNIT_SHIFT_MAX];
                for j in 0..k {
                    let b = u * k + j;
                    if core.l2p.page_is_empty(fine, (b / epp) as usize) {
                        continue;
                    }
                    let old = core.l2p.set(&mut core.cache, fine, Lba(b), Pba::NONE)?;
                    if !old.is_none() {
                        over[j as usize] = true;
                        core.regions.mark_invalid(&core.geo, old, volume);
                    }
                }
                if !core.l2p.page_is_empty(volume, page as usize) {
                    let old = core.l2p.set(&mut core.cache, volume, Lba(u), Pba::NONE)?;
                    if !old.is_none() {
                        for j in (0..k).filter(|&j| !over[j as usize]) {
                            let b = core.unit_block(old, j);
                            core.regions.mark_invalid(&core.geo, b, volume);
                        }
                    }
                }
                u += 1;
            }
        }
        Ok(())
    }
}
