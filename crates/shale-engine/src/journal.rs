//! The journal ring: records (region opened/closed, trims, flush points, volume
//! changes) buffered in memory and written as new blocks at each durability point.
//!
//! Invariants: a block is written once per lap and never rewritten in place; blocks
//! written since the last checkpoint never exceed the ring (a checkpoint is forced at
//! 3/4 full, and checkpoints themselves need no journal space); records pending in
//! memory are bounded (a durability point is forced when they pass 1/8 of the ring).

use shale_device::BlockDevice;
use shale_format::{JournalBlock, JournalRecord, JOURNAL_PAYLOAD_MAX};

use crate::layout::BS;
use crate::EngineError;

#[derive(Debug)]
pub(crate) struct Journal {
    start: u64,
    blocks: u32,
    pub next: u32,
    pub sequence: u64,
    pub epoch: u64,
    pub since_checkpoint: u32,
    records: Vec<JournalRecord>,
    pending_bytes: usize,
}

impl Journal {
    pub fn new(start: u64, blocks: u32, next: u32, sequence: u64, epoch: u64) -> Journal {
        Journal {
            start,
            blocks,
            next,
            sequence,
            epoch,
            since_checkpoint: 0,
            records: Vec::new(),
            pending_bytes: 0,
        }
    }

    pub fn append(&mut self, r: JournalRecord) {
        self.pending_bytes += r.encoded_len();
        self.records.push(r);
    }

    /// Writes the pending records as new blocks. Returns bytes written.
    pub fn write_pending<C: BlockDevice>(&mut self, dev: &mut C) -> Result<u64, EngineError> {
        let mut written = 0;
        let records = std::mem::take(&mut self.records);
        self.pending_bytes = 0;
        let mut block = JournalBlock {
            epoch: self.epoch,
            sequence: self.sequence,
            records: Vec::new(),
        };
        let mut used = 0;
        let mut it = records.into_iter().peekable();
        while let Some(r) = it.next() {
            used += r.encoded_len();
            block.records.push(r);
            let next_fits = it
                .peek()
                .is_some_and(|n| used + n.encoded_len() <= JOURNAL_PAYLOAD_MAX);
            if !next_fits {
                written += self.write_block(dev, &mut block)?;
                used = 0;
            }
        }
        Ok(written)
    }

    fn write_block<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        block: &mut JournalBlock,
    ) -> Result<u64, EngineError> {
        if self.since_checkpoint >= self.blocks {
            return Err(EngineError::JournalFull {
                blocks: self.blocks,
            });
        }
        block.epoch = self.epoch;
        block.sequence = self.sequence;
        let Some(bytes) = block.encode() else {
            panic!("journal block over-filled: {} records", block.records.len());
        };
        let off = (self.start + u64::from(self.next)) * BS;
        dev.write_at(off, &bytes)
            .map_err(EngineError::cache("journal write", off))?;
        self.next = (self.next + 1) % self.blocks;
        self.sequence += 1;
        self.since_checkpoint += 1;
        block.records.clear();
        Ok(BS)
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn needs_checkpoint(&self) -> bool {
        self.since_checkpoint * 4 >= self.blocks * 3
    }

    /// Too many records waiting in memory: make them durable.
    pub fn pending_large(&self) -> bool {
        self.pending_bytes > (self.blocks as usize / 8).max(1) * JOURNAL_PAYLOAD_MAX
    }

    /// The checkpoint of generation `epoch` covers everything so far.
    pub fn after_checkpoint(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.since_checkpoint = 0;
        self.records.clear();
        self.pending_bytes = 0;
    }
}
