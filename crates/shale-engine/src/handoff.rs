//! Hand-off: acknowledged writes survive a kill of the process (docs/recovery.md,
//! "Hand-off").
//!
//! A write is acknowledged once its blocks are on the cache device; its md entry and
//! the write pointer that claims it become durable at the next durability point. A
//! power loss may take both (and the client with it: the guest, the host); a kill of
//! the process takes only the second, and the client lives on. So, when a
//! [`Handoff`] store is attached, the engine holds back every acknowledgement until it
//! has stored the image of what its next durability point would write (the md of the
//! groups not yet durable, the pending journal records and a FlushPoint claiming
//! exactly the blocks whose device writes completed). The next open, finding the
//! image valid for the pool and continuing the journal on the device, writes it as
//! that durability point would have and then recovers as after any crash.
//!
//! Invariants: an acknowledgement leaves only after an image covering it is stored;
//! an image claims only blocks whose device writes completed (the ASN watermark);
//! zones are not claimed by it (relocations are redone, their sources are not freed
//! without a real durability point); an image whose journal position the device has
//! moved past is stale and ignored, one partly written is finished.

use std::sync::{Arc, Mutex};

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{
    HandoffImage, HandoffMd, JournalRecord, RegionState, BLOCK_SIZE, FLUSH_POINT_REGIONS_MAX,
};

use crate::core::Core;
use crate::layout::Groups;
use crate::write::chunk_writer::ChunkWriter;
use crate::write::group::MdState;
use crate::Clock;

/// Memory that outlives the process but not the machine (a file on tmpfs), where
/// the engine leaves its hand-off image.
pub trait Handoff: Send {
    /// Opens the store for the pool `pool` and returns the image the last instance
    /// left, if any (none from an earlier boot: the devices' caches may not have kept
    /// what it claims).
    fn open(&mut self, pool: [u8; 16]) -> std::io::Result<Option<Vec<u8>>>;
    /// Replaces the image. Killed during the call, the process leaves either this
    /// image or the one before for the next `open`, never a mix.
    fn store(&mut self, image: &[u8]) -> std::io::Result<()>;
    /// Nothing to hand off (a clean shutdown, an open that made everything durable).
    fn clear(&mut self) -> std::io::Result<()>;
}

/// A [`Handoff`] in this process's memory, for tests and the simulator: clones share
/// the image, which outlives the engine as a tmpfs file outlives a killed process.
#[derive(Debug, Clone, Default)]
pub struct MemHandoff {
    image: Arc<Mutex<Option<Vec<u8>>>>,
}

impl MemHandoff {
    pub fn new() -> MemHandoff {
        MemHandoff::default()
    }

    /// The machine lost power: the image is gone.
    pub fn wipe(&self) {
        *self.lock() = None;
    }

    pub fn image(&self) -> Option<Vec<u8>> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<u8>>> {
        self.image
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Handoff for MemHandoff {
    fn open(&mut self, _pool: [u8; 16]) -> std::io::Result<Option<Vec<u8>>> {
        Ok(self.image())
    }

    fn store(&mut self, image: &[u8]) -> std::io::Result<()> {
        let mut g = self.lock();
        let v = g.get_or_insert_with(Vec::new);
        v.clear();
        v.extend_from_slice(image);
        Ok(())
    }

    fn clear(&mut self) -> std::io::Result<()> {
        *self.lock() = None;
        Ok(())
    }
}

/// What decides an image's content: it is stored again only when one changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    watermark: u64,
    sequence: u64,
    epoch: u64,
    records: usize,
}

/// The attached store and the last image stored.
pub(crate) struct HandoffState {
    pub store: Box<dyn Handoff>,
    buf: Vec<u8>,
    last: Option<Fingerprint>,
}

impl std::fmt::Debug for HandoffState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandoffState")
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

/// What `publish` did.
pub(crate) enum Published {
    /// The image on the store covers every acknowledgement held.
    Stored,
    /// The journal cannot take the image's entries: a durability point must run
    /// instead.
    NeedsDurability,
}

impl HandoffState {
    pub fn new(store: Box<dyn Handoff>) -> HandoffState {
        HandoffState {
            store,
            buf: Vec::new(),
            last: None,
        }
    }

    /// Stores the image of the engine's state now, unless the one stored already
    /// is (its fingerprint matches: the watermark and the journal decide the
    /// content, and both only move forward).
    pub fn publish(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &ChunkWriter,
    ) -> std::io::Result<Published> {
        let fp = Fingerprint {
            watermark: writer.runs.watermark(),
            sequence: core.journal.sequence,
            epoch: core.journal.epoch,
            records: core.journal.pending_len(),
        };
        if self.last == Some(fp) {
            return Ok(Published::Stored);
        }
        let Some(image) = image(core, writer) else {
            return Ok(Published::NeedsDurability);
        };
        if image.encode_into(&mut self.buf).is_none() {
            return Ok(Published::NeedsDurability);
        }
        self.store.store(&self.buf)?;
        self.last = Some(fp);
        core.stats.handoff_stores += 1;
        core.stats.handoff_bytes += self.buf.len() as u64;
        Ok(Published::Stored)
    }
}

/// The image of the durability point the engine would run now, claiming only blocks
/// whose device writes completed; `None` when the journal cannot take it.
pub(crate) fn image(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
) -> Option<HandoffImage> {
    let watermark = writer.runs.watermark();
    let groups = Groups {
        blocks: core.geo.chunk_blocks,
    };
    let mut md = Vec::new();
    let mut blk = Box::new([0u8; BLOCK_SIZE]);
    for g in &writer.groups {
        let copy = match g.md_state {
            MdState::Filling if g.filled > g.md_durable_entries => g.peek_partial(&mut blk),
            MdState::Filling => continue,
            MdState::FinalSubmitted if g.md_newest == Some(g.md_final_copy) => continue,
            MdState::FinalPending | MdState::FinalSubmitted => {
                blk.copy_from_slice(&g.md[..]);
                g.md_final_copy
            }
        };
        md.push(HandoffMd {
            region: g.region,
            group: g.group,
            copy,
            block: blk.clone(),
        });
    }
    // Each open chunk's claim: up to its first block whose write has not completed.
    // Only the chunk being written and those with unsettled groups can have moved
    // since the last durability point (a chunk whose groups all settled is closed,
    // its RegionClosed pending); the others' claims stand. Not a walk over every
    // chunk: that would cost a large cache's chunk count at every store.
    let mut chunks: Vec<shale_format::RegionId> = writer
        .groups
        .iter()
        .map(|g| g.region)
        .chain(writer.open)
        .collect();
    chunks.sort_unstable_by_key(|r| r.0);
    chunks.dedup();
    let mut claims = Vec::new();
    for r in chunks {
        let reg = core.regions.get(r);
        if reg.state != RegionState::Open {
            continue;
        }
        let cut = writer
            .groups
            .iter()
            .filter(|g| g.region == r)
            .find_map(|g| {
                let done = watermark
                    .saturating_sub(g.asn_base)
                    .min(u64::from(g.filled)) as u32;
                (done < g.filled).then_some(g.start_slot + done)
            });
        claims.push((r, cut.unwrap_or(reg.wp).min(groups.end())));
    }
    let extra: Vec<JournalRecord> = claims
        .chunks(FLUSH_POINT_REGIONS_MAX)
        .map(|part| JournalRecord::FlushPoint {
            regions: part.to_vec(),
        })
        .collect();
    let journal = core.journal.blocks_with(&extra)?;
    Some(HandoffImage {
        pool: core.sb.uuid,
        sequence: core.journal.sequence,
        next: core.journal.next,
        md,
        journal,
    })
}

/// Why an image was not written at open.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The device has moved past it: a durability point or checkpoint completed after
    /// it was stored (nothing it claims is missing).
    Stale(String),
    /// It does not fit this pool or its journal: it is left alone (reported).
    Invalid(String),
    /// A device failed while it was written.
    Io(crate::EngineError),
}

/// Writes the image as the durability point it stands for would have: its md
/// blocks, a flush of both devices (the blocks it claims completed before it was
/// stored), then the journal entries the device does not hold yet, then a flush.
/// An image the device already holds part of (an open that wrote it was itself
/// killed) is finished. Returns (md blocks, journal entries) written.
pub(crate) fn apply<C: BlockDevice, Z: ZonedDevice>(
    cache: &mut C,
    capacity: &mut Z,
    sb: &shale_format::Superblock,
    image: &HandoffImage,
    log: &crate::recovery::journal_scan::JournalLog,
    checkpoint_generation: u64,
) -> Result<(usize, usize), Refused> {
    use crate::layout::BS;
    if image.pool != sb.uuid {
        return Err(Refused::Invalid("it was made for another pool".into()));
    }
    let entries = shale_format::journal_ring_entries(sb.layout.journal_blocks).max(1);
    let k = image.journal.len();
    let Some(j) = (0..=k).find(|&j| image.sequence + j as u64 == log.sequence) else {
        return Err(Refused::Stale(format!(
            "the journal on the device ends at sequence {}, the image starts at {}",
            log.sequence, image.sequence
        )));
    };
    if j > log.blocks.len() || log.blocks[log.blocks.len() - j..] != image.journal[..j] {
        return Err(Refused::Stale(
            "the last entries on the device are not the image's".into(),
        ));
    }
    if image.next >= entries || (image.next + j as u32) % entries != log.next {
        return Err(Refused::Invalid(format!(
            "its journal position {} does not follow the device's {}",
            image.next, log.next
        )));
    }
    if log.blocks.len() + (k - j) > entries as usize {
        return Err(Refused::Invalid(
            "its entries would overwrite journal entries recovery needs".into(),
        ));
    }
    let mut min_epoch = log.blocks.last().map_or(checkpoint_generation, |b| b.epoch);
    for b in &image.journal[j..] {
        if b.epoch < min_epoch || b.epoch > checkpoint_generation + 1 {
            return Err(Refused::Invalid(format!(
                "journal entry {} has epoch {}, outside {min_epoch}..={}",
                b.sequence,
                b.epoch,
                checkpoint_generation + 1
            )));
        }
        min_epoch = b.epoch;
    }
    let geo = crate::layout::Geometry::of(sb);
    let groups = Groups {
        blocks: geo.chunk_blocks,
    };
    if let Some(m) = image
        .md
        .iter()
        .find(|m| m.region.0 >= geo.chunk_count || m.group >= groups.count())
    {
        return Err(Refused::Invalid(format!(
            "md for {} group {}, not a chunk group of this pool",
            m.region, m.group
        )));
    }
    if j == k {
        return Ok((0, 0));
    }
    let io =
        |what: &'static str, at: u64| move |e| Refused::Io(crate::EngineError::cache(what, at)(e));
    for m in &image.md {
        let at = geo.chunk_offset(m.region, groups.md_slot(m.group) + m.copy);
        cache
            .write_at(at, &m.block[..])
            .map_err(io("hand-off md write", at))?;
    }
    capacity
        .flush()
        .map_err(|e| Refused::Io(crate::EngineError::capacity("flush", 0)(e)))?;
    cache.flush().map_err(io("flush", 0))?;
    let mut pair = vec![0u8; 2 * BLOCK_SIZE];
    for (i, b) in image.journal[j..].iter().enumerate() {
        let Some(enc) = b.encode() else {
            return Err(Refused::Invalid("a journal entry does not encode".into()));
        };
        pair[..BLOCK_SIZE].copy_from_slice(&enc);
        pair[BLOCK_SIZE..].copy_from_slice(&enc);
        let idx = (log.next + i as u32) % entries;
        let at = (sb.layout.journal_start + 2 * u64::from(idx)) * BS;
        cache
            .write_at(at, &pair)
            .map_err(io("hand-off journal write", at))?;
    }
    cache.flush().map_err(io("flush", 0))?;
    Ok((image.md.len(), k - j))
}
