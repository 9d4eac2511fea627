//! User reads: asynchronous device reads of single blocks, verified against their md
//! entry, assembled into the reply.

use shale_device::{BlockDevice, IoBuf, IoOp, IoRequest, ZoneOp, ZoneRequest, ZonedDevice};
use shale_format::{
    decode_md_entry, decode_md_header, md_claimed_generation, Lba, Pba, RegionId, VolumeId,
    BLOCK_SIZE,
};

use crate::core::Core;
use crate::engine::InflightIo;
use crate::layout::Geometry;
use crate::layout::{Groups, BS};
use crate::read::md_cache::md_check;
use crate::request::Answer;
use crate::write::chunk_writer::ChunkWriter;
use crate::{Clock, EngineError, Reply};

pub(crate) struct ReadOp {
    pub done: Option<Answer>,
    pub data: Vec<u8>,
    pub volume: VolumeId,
    pub first_lba: u64,
    /// Byte offset of the request inside its first block.
    pub head: usize,
    pub pending: u32,
    pub error: Option<EngineError>,
}

impl std::fmt::Debug for ReadOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOp")
            .field("volume", &self.volume)
            .field("first_lba", &self.first_lba)
            .field("len", &self.data.len())
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl ReadOp {
    /// Copies the part of block `i` (relative to the first block) the request covers.
    fn put(&mut self, i: u32, block: &[u8]) {
        let bstart = i as usize * BLOCK_SIZE;
        let lo = bstart.max(self.head);
        let hi = (bstart + BLOCK_SIZE).min(self.head + self.data.len());
        if lo < hi {
            self.data[lo - self.head..hi - self.head]
                .copy_from_slice(&block[lo - bstart..hi - bstart]);
        }
    }
}

/// The read path's state: user reads in flight and the md reads they wait for.
#[derive(Debug, Default)]
pub(crate) struct Reader {
    /// Reads in flight (a slab; the index travels in the I/O tag).
    pub ops: Vec<Option<ReadOp>>,
    pub free: Vec<u32>,
    /// md reads in flight for user reads (PBA of copy A), and data blocks waiting for
    /// them: (key, run, PBA of its first block, data).
    pub md_reads: Vec<u64>,
    pub parked: Vec<(u64, Run, Pba, shale_device::IoBuf)>,
}

/// Blocks of one device read of a user read: (read op, first block, blocks).
pub(crate) type Run = (u32, u32, u16);

/// The most blocks one device read of a user read covers (128 KiB).
const RUN_BLOCKS_MAX: u16 = 32;

/// Consecutive blocks of a user read found at consecutive PBAs of one region, gathered
/// into one device read.
struct PendingRun {
    block: u32,
    blocks: u16,
    pba: Pba,
    region: RegionId,
    slot: u32,
}

impl Reader {
    pub fn start_read(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &ChunkWriter,
        volume: VolumeId,
        offset: u64,
        len: u64,
        done: Answer,
    ) -> Result<(), EngineError> {
        if let Err(e) = core.validate_range(volume, offset, len, true) {
            done.send(Err(e));
            return Ok(());
        }
        core.stats.user_read_bytes += len;
        let c = core.volume_counters(volume);
        c.read_ops += 1;
        c.user_read_bytes += len;
        let first = offset / BS;
        let last = (offset + len - 1) / BS;
        let mut op = ReadOp {
            done: Some(done),
            data: vec![0u8; len as usize],
            volume,
            first_lba: first,
            head: (offset % BS) as usize,
            pending: 0,
            error: None,
        };
        let mut run: Option<PendingRun> = None;
        let op_id = match self.free.pop() {
            Some(i) => i,
            None => {
                self.ops.push(None);
                (self.ops.len() - 1) as u32
            }
        };
        for lba in first..=last {
            let i = (lba - first) as u32;
            let pba = match core.lookup(volume, Lba(lba)) {
                Ok(p) => p,
                Err(e) => {
                    op.error.get_or_insert(e);
                    break;
                }
            };
            if pba.is_none() {
                continue; // zeros
            }
            let Some((region, slot)) = core.geo.region_slot(pba) else {
                panic!("L2P maps {volume} {lba} to {pba} outside the data regions");
            };
            if let Some(b) = writer.find(region, slot) {
                op.put(i, b);
                continue;
            }
            op.pending += 1;
            // Data slots never straddle a group's md, so a run stays in one group.
            if let Some(r) = run.as_mut().filter(|r| {
                r.region == region
                    && r.block + u32::from(r.blocks) == i
                    && r.pba.0 + u64::from(r.blocks) == pba.0
                    && r.blocks < RUN_BLOCKS_MAX
            }) {
                r.blocks += 1;
                continue;
            }
            if let Some(r) = run.take() {
                self.submit_run(core, op_id, r);
            }
            run = Some(PendingRun {
                block: i,
                blocks: 1,
                pba,
                region,
                slot,
            });
        }
        if let Some(r) = run.take() {
            self.submit_run(core, op_id, r);
        }
        self.ops[op_id as usize] = Some(op);
        self.maybe_finish_read(op_id);
        Ok(())
    }

    /// One device read for a run of blocks, and its md unless cached or on the way.
    fn submit_run(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        op_id: u32,
        r: PendingRun,
    ) {
        let n = usize::from(r.blocks);
        let buf = core.bufs.take(n);
        let tag = core.io.insert(InflightIo::Read {
            op: op_id,
            block: r.block,
            blocks: r.blocks,
            pba: r.pba,
        });
        let bytes = n as u64 * BS;
        if core.geo.is_chunk(r.region) {
            let offset = core.geo.chunk_offset(r.region, r.slot);
            core.cache.submit(IoRequest {
                tag,
                op: IoOp::Read { offset, buf },
            });
            core.stats.cache_read_bytes += bytes;
        } else {
            let offset = core.geo.zone_offset(r.region, r.slot);
            core.capacity.submit(ZoneRequest {
                tag,
                op: ZoneOp::Read { offset, buf },
            });
            core.stats.capacity_read_bytes += bytes;
        }
        self.prefetch_md(core, r.pba);
    }

    fn maybe_finish_read(&mut self, op_id: u32) {
        let finished = self.ops[op_id as usize]
            .as_ref()
            .is_some_and(|o| o.pending == 0);
        if !finished {
            return;
        }
        let Some(mut op) = self.ops[op_id as usize].take() else {
            return;
        };
        self.free.push(op_id);
        let r = match op.error.take() {
            Some(e) => Err(e),
            None => Ok(Reply::Read(std::mem::take(&mut op.data))),
        };
        if let Some(d) = op.done.take() {
            d.send(r);
        }
    }

    pub fn on_read_done(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &ChunkWriter,
        run: Run,
        pba: Pba,
        r: Result<Option<IoBuf>, EngineError>,
    ) -> Result<(), EngineError> {
        let key = md_key(&core.geo, pba).3 .0;
        match r {
            // Its md is still on the way: wait for it rather than read it synchronously.
            Ok(Some(buf)) if self.md_reads.contains(&key) && !core.md_cache.contains(key) => {
                self.parked.push((key, run, pba, buf));
            }
            r => self.finish_run_read(core, writer, run, pba, r),
        }
        Ok(())
    }

    /// Verifies each block of a run against its md and copies it into the reply.
    fn finish_run_read(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &ChunkWriter,
        (op_id, block, blocks): Run,
        pba: Pba,
        r: Result<Option<IoBuf>, EngineError>,
    ) {
        let Some((volume, first_lba)) = self.ops[op_id as usize]
            .as_ref()
            .map(|o| (o.volume, o.first_lba + u64::from(block)))
        else {
            panic!("read completion for unknown op {op_id}");
        };
        let mut buf = match r {
            Ok(Some(buf)) => buf,
            Ok(None) => panic!("read completion without its buffer"),
            Err(e) => {
                if let Some(op) = self.ops[op_id as usize].as_mut() {
                    op.pending -= u32::from(blocks);
                    op.error.get_or_insert(e);
                }
                self.maybe_finish_read(op_id);
                return;
            }
        };
        for j in 0..u32::from(blocks) {
            let lba = Lba(first_lba + u64::from(j));
            let at = Pba(pba.0 + u64::from(j));
            let data = &mut buf[j as usize * BLOCK_SIZE..(j as usize + 1) * BLOCK_SIZE];
            let checked = match verify_block(core, writer, volume, lba, at, data) {
                Err(e) if !rebuilt_block(core, writer, volume, lba, at, data, &e) => Err(e),
                _ => Ok(()),
            };
            if checked.is_ok() {
                // A read warms each extent it touches once, not once per block.
                let first = j == 0 || lba.0.is_multiple_of(1 << crate::tier::EXTENT_SHIFT);
                warm_cold_read(core, volume, lba, at, data, first);
            }
            if let Some(op) = self.ops[op_id as usize].as_mut() {
                op.pending -= 1;
                match checked {
                    Ok(()) => op.put(block + j, data),
                    Err(e) => {
                        op.error.get_or_insert(e);
                    }
                }
            }
        }
        core.bufs.give(buf);
        self.maybe_finish_read(op_id);
    }

    /// Starts reading the md of the group holding `pba` unless it is cached or already
    /// being read, so a data block and its md travel together.
    fn prefetch_md(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        pba: Pba,
    ) {
        let (region, _, md_slot, key) = md_key(&core.geo, pba);
        if core.md_cache.contains(key.0) || self.md_reads.contains(&key.0) {
            return;
        }
        self.md_reads.push(key.0);
        core.stats.md_reads += 1;
        let tag = core.io.insert(InflightIo::MdRead { key: key.0 });
        if core.geo.is_chunk(region) {
            let buf = core.bufs.take(2);
            let offset = core.geo.chunk_offset(region, md_slot);
            core.stats.cache_read_bytes += 2 * BS;
            core.cache.submit(IoRequest {
                tag,
                op: IoOp::Read { offset, buf },
            });
        } else {
            // A zone group is written once, both md copies in the same write: they are
            // the same block, and copy B is read only if copy A turns out bad.
            let buf = core.bufs.take(1);
            let offset = core.geo.zone_offset(region, md_slot);
            core.stats.capacity_read_bytes += BS;
            core.capacity.submit(ZoneRequest {
                tag,
                op: ZoneOp::Read { offset, buf },
            });
        }
    }

    /// An md read arrived: cache it and verify the data blocks that waited for it. Errors
    /// fail only the reads that needed it.
    pub fn on_md_read_done(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &ChunkWriter,
        key: u64,
        r: Result<Option<IoBuf>, EngineError>,
    ) {
        self.md_reads.retain(|&k| k != key);
        let (region, g, _, _) = md_key(&core.geo, Pba(key));
        let picked = match r {
            Ok(Some(buf)) => {
                let p = pick_md(core, writer, region, g, Pba(key), &buf).map(|_| ());
                core.bufs.give(buf);
                p
            }
            Ok(None) => panic!("md read completed without its buffer"),
            Err(e) => Err(e),
        };
        let picked = match picked {
            // Copy A of a zone group bad or unreadable, or both of a chunk's: both
            // copies again, then the device's other copies.
            Err(_) => md_block_read_both(core, writer, Pba(key)).map(|_| ()),
            p => p,
        };
        let mut i = 0;
        while i < self.parked.len() {
            if self.parked[i].0 != key {
                i += 1;
                continue;
            }
            let (_, run, pba, buf) = self.parked.swap_remove(i);
            let r = match &picked {
                Ok(()) => Ok(Some(buf)),
                Err(e) => {
                    core.bufs.give(buf);
                    Err(EngineError::Failed {
                        reason: format!("md read for {pba}: {e}"),
                    })
                }
            };
            self.finish_run_read(core, writer, run, pba, r);
        }
    }
}

/// A verified read of `lba` from `pba`: in the cold tier, it warms the block's extent
/// (if `count`: the read's first block there), and a block of a hot enough extent is
/// queued to go back to the fast tier (`tier.rs`). Blocks of volumes mapped in units
/// move only with their unit, so they stay.
fn warm_cold_read(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    volume: VolumeId,
    lba: Lba,
    pba: Pba,
    data: &[u8],
    count: bool,
) {
    let threshold = core.config.promote_reads;
    if threshold == 0 || !core.geo.tiered() || core.volumes.shift(volume) > 0 {
        return;
    }
    let Some((region, _)) = core.geo.region_slot(pba) else {
        return;
    };
    if !core.geo.is_cold(region) {
        return;
    }
    core.stats.cold_read_blocks += 1;
    let Some(uid) = core.volumes.get(volume).map(|e| e.uid) else {
        return;
    };
    if core.tier.warm(volume, uid, lba, count) >= threshold {
        core.tier.queue(pba, data);
    }
}

/// Reads one block synchronously (read-modify-write of partial blocks).
pub(crate) fn read_block_sync(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    volume: VolumeId,
    lba: Lba,
    out: &mut [u8; BLOCK_SIZE],
) -> Result<(), EngineError> {
    let pba = core.lookup(volume, lba)?;
    if pba.is_none() {
        out.fill(0);
        return Ok(());
    }
    let Some((region, slot)) = core.geo.region_slot(pba) else {
        panic!("L2P maps {volume} {lba} to {pba} outside the data regions");
    };
    if let Some(b) = writer.find(region, slot) {
        out.copy_from_slice(b);
        return Ok(());
    }
    if core.geo.is_chunk(region) {
        let off = core.geo.chunk_offset(region, slot);
        core.cache
            .read_at(off, out)
            .map_err(EngineError::cache("read-modify-write read", off))?;
        core.stats.cache_read_bytes += BS;
    } else {
        let off = core.geo.zone_offset(region, slot);
        core.capacity
            .read_at(off, out)
            .map_err(EngineError::capacity("read-modify-write read", off))?;
        core.stats.capacity_read_bytes += BS;
    }
    match verify_block(core, writer, volume, lba, pba, &out[..]) {
        Err(e) if !rebuilt_block(core, writer, volume, lba, pba, &mut out[..], &e) => Err(e),
        _ => Ok(()),
    }
}

pub(crate) use crate::copies::REBUILD_ATTEMPTS_MAX;

/// A block that failed its check, read again from the device's redundancy into
/// `buf` (an array decodes it from its other members; a mirrored cache reads its
/// other mirrors). True if that copy checks: it is used, and the corrupt copy is
/// repaired: a cache block is written back in place (to every mirror), a capacity
/// block is staged to be written anew so the corrupt copy becomes garbage
/// (`Core::repairs`).
pub(crate) fn rebuilt_block(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    volume: VolumeId,
    lba: Lba,
    pba: Pba,
    buf: &mut [u8],
    e: &EngineError,
) -> bool {
    if !matches!(
        e,
        EngineError::ChecksumMismatch { .. } | EngineError::Misdirected { .. }
    ) {
        return false;
    }
    let Some((in_cache, off)) = core.geo.device_offset(pba) else {
        return false;
    };
    // Each attempt rebuilds from other sources, until one checks or none is left.
    let mut good = false;
    for attempt in 0..REBUILD_ATTEMPTS_MAX {
        if !read_copy(core, in_cache, off, buf, attempt) {
            break;
        }
        if verify_block(core, writer, volume, lba, pba, buf).is_ok() {
            good = true;
            break;
        }
    }
    if !good {
        return false;
    }
    core.stats.crc_rebuilt_fixes += 1;
    if in_cache {
        // The block is live (mapped just now), so its chunk is not being rewritten:
        // the same bytes again on every mirror mend the bad one.
        tracing::warn!(%volume, %lba, %pba, "corrupt cache block read from another mirror");
        if let Err(e) = core.cache.write_at(off, &buf[..BLOCK_SIZE]) {
            tracing::warn!(%pba, error = %e, "rewriting a corrupt cache block failed");
        }
        return true;
    }
    tracing::warn!(%volume, %lba, %pba, "corrupt capacity block rebuilt from redundancy");
    let mut data = Box::new([0u8; BLOCK_SIZE]);
    data.copy_from_slice(&buf[..BLOCK_SIZE]);
    core.repairs.push((pba, data));
    true
}

/// Checks a data block against its md entry.
pub(crate) fn verify_block(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    volume: VolumeId,
    lba: Lba,
    pba: Pba,
    data: &[u8],
) -> Result<(), EngineError> {
    let Some((region, slot)) = core.geo.region_slot(pba) else {
        panic!("verify of {pba} outside the data regions");
    };
    let idx = (slot % shale_format::GROUP_BLOCKS) as usize;
    let got = shale_format::block_crc(data);
    let key = md_key(&core.geo, pba).3;
    if core.md_cache.check(key.0, idx) == Some(Some(md_check(volume, lba, got))) {
        return Ok(());
    }
    // Not cached, or the check failed: the whole entry says what is wrong.
    let md = md_block(core, writer, pba)?;
    let mut e = decode_md_entry(&md[..], idx, 0)
        .map_err(|source| EngineError::MdCorrupt { pba, source })?;
    let names =
        |e: &shale_format::MdEntry| e.kind.holds_data() && e.volume == volume && e.lba == lba;
    if !names(&e) {
        if let Some(other) = md_naming(core, writer, pba, idx, &names) {
            e = other;
        }
    }
    if !names(&e) {
        core.stats.crc_errors += 1;
        return Err(EngineError::Misdirected {
            volume,
            lba,
            pba,
            found_volume: e.volume,
            found_lba: e.lba,
        });
    }
    if e.data_crc != got {
        core.stats.crc_errors += 1;
        tracing::warn!(%volume, %lba, %pba, %region, "data CRC mismatch");
        return Err(EngineError::ChecksumMismatch {
            volume,
            lba,
            pba,
            expected: e.data_crc,
            got,
        });
    }
    Ok(())
}

/// The md entry `idx` of `pba`'s group as another copy of the md holds it, when that
/// copy (this life of the region, this group) has an entry `names` accepts. A cache
/// mirror whose newer md copy is damaged reads as its older copy, which lacks the
/// entries written since; the other mirror's newer copy has them. The copy found
/// replaces the cached md. `None` on a device without other copies.
fn md_naming(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    pba: Pba,
    idx: usize,
    names: &impl Fn(&shale_format::MdEntry) -> bool,
) -> Option<shale_format::MdEntry> {
    let (region, g, md_slot, key) = md_key(&core.geo, pba);
    let chunk = core.geo.is_chunk(region);
    let off = if chunk {
        core.geo.chunk_offset(region, md_slot)
    } else {
        core.geo.zone_offset(region, md_slot)
    };
    let sid = core.regions.get(region).sid;
    let mut two = vec![0u8; 2 * BLOCK_SIZE];
    for attempt in 0..REBUILD_ATTEMPTS_MAX {
        if !read_copy(core, chunk, off, &mut two, attempt) {
            return None;
        }
        for copy in two.chunks(BLOCK_SIZE) {
            let ours = decode_md_header(copy, off)
                .is_ok_and(|h| h.region_sid == sid && h.region == region && h.group == g);
            let Some(e) = decode_md_entry(copy, idx, 0)
                .ok()
                .filter(|e| ours && names(e))
            else {
                continue;
            };
            tracing::warn!(%region, group = g, %pba, "md lacking an entry; another copy has it");
            core.stats.crc_rebuilt_fixes += 1;
            let growing = writer
                .groups
                .iter()
                .any(|x| x.region == region && x.group == g);
            if !growing {
                core.md_cache.insert(key.0, copy);
            }
            return Some(e);
        }
    }
    None
}

/// Reads copy `attempt` of `buf.len()` bytes at `off` from the cache (another mirror's)
/// or the capacity device (an array's rebuild), counting the bytes; false when the
/// device has no such copy.
pub(crate) fn read_copy(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    in_cache: bool,
    off: u64,
    buf: &mut [u8],
    attempt: u32,
) -> bool {
    if in_cache {
        core.stats.cache_read_bytes += buf.len() as u64;
        core.cache.read_rebuilt(off, buf, attempt).is_ok()
    } else {
        core.stats.capacity_read_bytes += buf.len() as u64;
        core.capacity.read_rebuilt(off, buf, attempt).is_ok()
    }
}

/// (region, group, md slot, key = PBA of md copy A) of the group holding `pba`.
pub(crate) fn md_key(geo: &Geometry, pba: Pba) -> (RegionId, u32, u32, Pba) {
    let Some((region, slot)) = geo.region_slot(pba) else {
        panic!("md lookup of {pba} outside the data regions");
    };
    let groups = Groups {
        blocks: geo.region_blocks(region),
    };
    let (g, _) = groups.locate(slot);
    let md_slot = groups.md_slot(g);
    (region, g, md_slot, geo.pba(region, md_slot))
}

/// The valid md block of the group holding `pba` (md cache, else a synchronous read
/// of both copies; only when an asynchronous one was not possible).
pub(crate) fn md_block(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    pba: Pba,
) -> Result<Box<[u8; BLOCK_SIZE]>, EngineError> {
    let (_, _, _, key) = md_key(&core.geo, pba);
    let mut out = Box::new([0u8; BLOCK_SIZE]);
    if let Some(b) = core.md_cache.get(key.0) {
        out.copy_from_slice(b);
        return Ok(out);
    }
    md_block_read_both(core, writer, pba)
}

/// Reads both md copies of the group holding `pba` synchronously and picks one. If
/// neither checks, the device's other copies are tried: another cache mirror's, or
/// (both copies sit in one stripe unit of an array) the array's rebuild. Nothing is
/// written back: a chunk may be written again under us, and a capacity block is
/// repaired by rewriting it elsewhere.
fn md_block_read_both(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    pba: Pba,
) -> Result<Box<[u8; BLOCK_SIZE]>, EngineError> {
    let (region, g, md_slot, key) = md_key(&core.geo, pba);
    core.stats.md_reads_sync += 1;
    let mut two = vec![0u8; 2 * BLOCK_SIZE];
    let chunk = core.geo.is_chunk(region);
    let off = if chunk {
        let off = core.geo.chunk_offset(region, md_slot);
        core.cache
            .read_at(off, &mut two)
            .map_err(EngineError::cache("md read", off))?;
        core.stats.cache_read_bytes += 2 * BS;
        off
    } else {
        let off = core.geo.zone_offset(region, md_slot);
        core.capacity
            .read_at(off, &mut two)
            .map_err(EngineError::capacity("md read", off))?;
        core.stats.capacity_read_bytes += 2 * BS;
        off
    };
    let picked = pick_md(core, writer, region, g, key, &two);
    if picked.is_ok() {
        return picked;
    }
    for attempt in 0..REBUILD_ATTEMPTS_MAX {
        if !read_copy(core, chunk, off, &mut two, attempt) {
            break;
        }
        if let Ok(md) = pick_md(core, writer, region, g, key, &two) {
            core.stats.crc_rebuilt_fixes += 1;
            tracing::warn!(%region, group = g, "corrupt md read from another copy");
            return Ok(md);
        }
    }
    picked
}

/// Takes the valid copy (current SID, higher generation) of md A and B and caches it.
/// `two` may hold copy A alone (a zone group's, see `prefetch_md`): then it is the
/// answer if valid, and an error otherwise.
fn pick_md(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    region: RegionId,
    g: u32,
    key: Pba,
    two: &[u8],
) -> Result<Box<[u8; BLOCK_SIZE]>, EngineError> {
    // A copy left from an earlier life of the region (other SID) is not valid.
    let sid = core.regions.get(region).sid;
    let stale = |h: shale_format::MdHeader, at: u64| {
        if h.region_sid == sid {
            Ok(h)
        } else {
            Err(shale_format::FormatError::InvalidField {
                structure: shale_format::Structure::MdBlock,
                at,
                field: "region_sid",
                reason: format!("{} is not the region's {sid}", h.region_sid),
            })
        }
    };
    let at = md_offset(&core.geo, key);
    let copy = |i: usize| &two[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
    let decode = |i: usize| {
        let at = at + i as u64 * BS;
        decode_md_header(copy(i), at).and_then(|h| stale(h, at))
    };
    // The valid copy of this life of the region with the higher generation wins.
    // The copy claiming the higher generation is checked first: intact and of this
    // life, it is the answer whatever the other holds, so the other's CRC is
    // computed only when it is not (ties go to copy A, as zone groups write both).
    let both = two.len() >= 2 * BLOCK_SIZE;
    let first =
        usize::from(both && md_claimed_generation(copy(1)) > md_claimed_generation(copy(0)));
    let (pick, h) = match decode(first) {
        Ok(h) => (first, h),
        Err(e) if !both => {
            return Err(EngineError::MdCorrupt {
                pba: key,
                source: e,
            })
        }
        Err(e_first) => match decode(1 - first) {
            Ok(h) => (1 - first, h),
            Err(e_other) => {
                return Err(EngineError::MdCorrupt {
                    pba: key,
                    source: if first == 0 { e_first } else { e_other },
                })
            }
        },
    };
    if h.region != region || h.group != g {
        return Err(EngineError::MdCorrupt {
            pba: key,
            source: shale_format::FormatError::InvalidField {
                structure: shale_format::Structure::MdBlock,
                at,
                field: "region/group",
                reason: format!(
                    "names {} group {}, expected {region} group {g}",
                    h.region, h.group
                ),
            },
        });
    }
    let mut out = Box::new([0u8; BLOCK_SIZE]);
    out.copy_from_slice(&two[pick * BLOCK_SIZE..(pick + 1) * BLOCK_SIZE]);
    // A group still in memory grows: its md is not final.
    let cacheable = !writer
        .groups
        .iter()
        .any(|x| x.region == region && x.group == g);
    if cacheable {
        core.md_cache.insert(key.0, &out[..]);
    }
    Ok(out)
}

fn md_offset(geo: &Geometry, key: Pba) -> u64 {
    geo.device_offset(key).map_or(0, |(_, o)| o)
}
