//! Pacing of background work: when compaction and GC run, how many bounded steps per
//! loop iteration, and when durability points and checkpoints are forced.
//!
//! Each mover step reads at most one victim group and writes at most one group per
//! stream. Below a threshold the number of steps grows with the deficit; with no free
//! chunk (user writes waiting) the maximum runs every iteration. Checkpoints start by
//! bytes written, journal use or SIDs handed out, and write a bounded number of L2P
//! pages per iteration (`checkpoint.rs`).

use shale_device::{BlockDevice, ZonedDevice};

use crate::{Clock, Engine, EngineError};

/// The smallest batch of PendingFree regions released while space is not short.
const PENDING_FREE_BATCH: usize = 4;

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    pub(crate) fn compaction_threshold(&self) -> usize {
        ((self.core.geo.chunk_count as usize
            * self.core.config.compaction_free_chunks_pct as usize)
            .div_ceil(100))
        .max(1)
    }

    pub(crate) fn gc_threshold(&self) -> usize {
        (self.core.config.gc_free_zones_min as usize).max(self.gc.gc_reserve() + 1)
    }

    fn steps_for(&self, free: usize, threshold: usize, urgent: bool) -> u32 {
        let max = self.core.config.background_steps_per_poll_max;
        if urgent || free == 0 {
            max
        } else if free < threshold {
            1 + ((threshold - free) as u32 * (max - 1)) / threshold as u32
        } else {
            0
        }
    }

    /// PendingFree chunks and zones: space the next durability point makes free.
    fn pending_counts(&self) -> (usize, usize) {
        let chunks = self
            .core
            .regions
            .pending_free
            .iter()
            .filter(|&&r| self.core.geo.is_chunk(r))
            .count();
        (chunks, self.core.regions.pending_free.len() - chunks)
    }

    pub(crate) fn background(&mut self) -> Result<bool, EngineError> {
        let mut progress = false;
        let blocked = self.compaction.zone_blocked;
        self.compaction.zone_blocked = false;

        // Pacing counts PendingFree regions as free: the next durability point frees
        // them, and running the movers ahead for them would only cost spare space.
        let (pending_chunks, pending_zones) = self.pending_counts();
        let free_zones = self.core.regions.free_zones.len() + pending_zones;
        let gc_steps = self.steps_for(free_zones, self.gc_threshold(), blocked);
        for _ in 0..gc_steps {
            if !self.gc.step(&mut self.core, 0)? {
                break;
            }
            progress = true;
        }

        let free_chunks = self.core.regions.free_chunks.len() + pending_chunks;
        let steps = self.steps_for(
            free_chunks,
            self.compaction_threshold(),
            self.health.user_blocked,
        );
        for _ in 0..steps {
            let (mover, core, floor) = self.mover_with_core(false);
            if !mover.step(core, floor)? {
                break;
            }
            progress = true;
        }

        // Each durability point drains the pipeline and flushes both devices, so freed
        // regions are released in batches: when a writer needs the space, when free
        // space is about to run out, or when the batch is large.
        let (pending_chunks, pending_zones) = self.pending_counts();
        let chunks_short = pending_chunks > 0
            && (self.health.user_blocked
                || self.core.regions.free_chunks.len()
                    < self.compaction_threshold().div_ceil(4).max(2));
        let zones_short = pending_zones > 0
            && (blocked
                || self.compaction.zone_blocked
                || self.core.regions.free_zones.len() <= self.gc.gc_reserve() + 1);
        let batch_full = pending_chunks
            >= (self.core.geo.chunk_count as usize / 8).max(PENDING_FREE_BATCH)
            || pending_zones
                >= (self.core.geo.zone_count as usize / 64).clamp(PENDING_FREE_BATCH, 64);
        if chunks_short || zones_short || batch_full || self.core.journal.pending_large() {
            self.durability_point()?;
            progress = true;
        }
        if self.checkpoint_due() {
            self.checkpoint_begin()?;
            progress = true;
        }
        progress |= self.checkpoint_step()?;
        Ok(progress)
    }

    /// Breaks a stall: pads every partial batch and makes freed space reusable.
    pub(crate) fn force_background(&mut self) -> Result<bool, EngineError> {
        let mut progress = self.gc.pad_streams(&mut self.core, 0)?;
        let (mover, core, floor) = self.mover_with_core(false);
        progress |= mover.pad_streams(core, floor)?;
        self.drain_io()?;
        if !self.core.regions.pending_free.is_empty() {
            self.durability_point()?;
            progress = true;
        }
        Ok(progress)
    }
}
