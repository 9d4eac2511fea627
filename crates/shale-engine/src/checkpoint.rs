//! Checkpoints: all dirty L2P pages, then the checkpoint area not holding the latest
//! checkpoint, then the superblock naming it.
//!
//! Invariants: the superblock is written only after the checkpoint it names is durable;
//! L2P pages are written only to slots the previous checkpoint does not reference; a
//! region freed since the last durability point is reused only after the superblock
//! write (it is recorded as Free in the new checkpoint).

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Checkpoint, CheckpointHeader, L2pDirectory, RegionState, VolumeId};

use crate::layout::BS;
use crate::{Clock, Engine, EngineError};

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    pub(crate) fn checkpoint(&mut self, clean: bool) -> Result<(), EngineError> {
        self.make_durable(false)?;
        self.durable_asn = self.asn_next;
        self.stats.cache_md_write_bytes += self.l2p.write_back_all(&mut self.cache)?;
        self.stats.l2p_page_writes_total = self.l2p.counters.page_writes;
        self.cache.flush().map_err(EngineError::cache("flush", 0))?;

        let generation = self.journal.epoch + 1;
        let mut regions = self.regions.entries();
        for e in regions.iter_mut() {
            if e.state == RegionState::PendingFree {
                *e = shale_format::RegionEntry::default();
            }
        }
        let directories = self
            .l2p
            .vols
            .iter()
            .enumerate()
            .filter_map(|(v, m)| {
                m.as_ref().map(|m| L2pDirectory {
                    volume: VolumeId(v as u32),
                    pages: m.dir.clone(),
                })
            })
            .collect();
        let ck = Checkpoint {
            header: CheckpointHeader {
                generation,
                sid_next: self.sid_next,
                journal_next_block: self.journal.next,
                journal_sequence: self.journal.sequence,
                time: self.now(),
                ..Default::default()
            },
            regions,
            volumes: self.volumes.table.clone(),
            directories,
        };
        let bytes = ck.encode();
        let blocks = bytes.len() as u64 / BS;
        let area = 1 - self.sb.active_checkpoint;
        if blocks > u64::from(self.sb.layout.checkpoint_blocks) {
            return Err(EngineError::CheckpointTooLarge {
                needed: blocks,
                area: self.sb.layout.checkpoint_blocks,
            });
        }
        let off = self.sb.layout.checkpoint_start(area) * BS;
        self.cache
            .write_at(off, &bytes)
            .map_err(EngineError::cache("checkpoint write", off))?;
        self.cache.flush().map_err(EngineError::cache("flush", 0))?;
        self.stats.cache_md_write_bytes += bytes.len() as u64;

        self.sb.active_checkpoint = area;
        self.sb.clean = clean;
        self.write_superblock()?;

        self.l2p.checkpoint_committed();
        self.journal.after_checkpoint(generation);
        self.release_pending()?;
        self.stats.checkpoints += 1;
        self.complete_durable_waiters();
        Ok(())
    }

    /// Writes the superblock with generation + 1 to the copy that generation selects.
    pub(crate) fn write_superblock(&mut self) -> Result<(), EngineError> {
        self.sb.generation += 1;
        let copy = self.sb.generation % 2;
        let off = copy * BS;
        self.cache
            .write_at(off, &self.sb.encode())
            .map_err(EngineError::cache("superblock write", off))?;
        self.cache.flush().map_err(EngineError::cache("flush", 0))?;
        self.stats.cache_md_write_bytes += BS;
        Ok(())
    }
}
