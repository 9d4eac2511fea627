//! The journal ring: records (region opened/closed, trims, flush points, volume
//! changes) buffered in memory and written as new ring entries at each durability
//! point. An entry is a mirrored pair of identical blocks written in one write.
//!
//! Invariants: an entry is written once per lap and never rewritten in place; the
//! entries written since the committed checkpoint's journal position never exceed the
//! ring (a durability point that would overflow it becomes a checkpoint instead, see
//! `flush.rs`); records pending in memory are bounded (a durability point is forced when
//! they pass 1/8 of the ring); sequence numbers never repeat, so an entry of an earlier
//! lap is never taken for a newer one.

use shale_device::BlockDevice;
use shale_format::{
    journal_ring_entries, JournalBlock, JournalRecord, BLOCK_SIZE, JOURNAL_PAYLOAD_MAX,
};

use crate::layout::BS;
use crate::EngineError;

#[derive(Debug)]
pub(crate) struct Journal {
    /// First block of the journal area.
    start: u64,
    /// Ring entries (the area holds two blocks per entry).
    entries: u32,
    /// Ring index of the next entry to write.
    pub next: u32,
    /// Sequence number of the next entry.
    pub sequence: u64,
    /// Epoch of new entries: the generation of the checkpoint they follow (or of the
    /// checkpoint being taken).
    pub epoch: u64,
    /// Entries written since the committed checkpoint's journal position: they may be
    /// needed by recovery and must not be overwritten.
    since_committed: u32,
    /// Entries written since the latest checkpoint began (committed or in progress).
    since_start: u32,
    records: Vec<JournalRecord>,
    pending_bytes: usize,
    scratch: Vec<u8>,
}

impl Journal {
    /// A journal whose committed checkpoint starts at ring index `next`, sequence
    /// `sequence`, and whose new entries carry `epoch`.
    pub fn new(start: u64, journal_blocks: u32, next: u32, sequence: u64, epoch: u64) -> Journal {
        let entries = journal_ring_entries(journal_blocks).max(1);
        Journal {
            start,
            entries,
            next: next % entries,
            sequence,
            epoch,
            since_committed: 0,
            since_start: 0,
            records: Vec::new(),
            pending_bytes: 0,
            scratch: vec![0u8; 2 * BLOCK_SIZE],
        }
    }

    pub fn append(&mut self, r: JournalRecord) {
        self.pending_bytes += r.encoded_len();
        self.records.push(r);
    }

    /// Entries the pending records need, followed by records of `extra` encoded
    /// lengths (a FlushPoint still to come), packed as `write_pending` packs them.
    pub fn entries_needed(&self, extra: &[usize]) -> u32 {
        let mut entries = 0u32;
        let mut used = 0usize;
        for len in self
            .records
            .iter()
            .map(JournalRecord::encoded_len)
            .chain(extra.iter().copied())
        {
            if used > 0 && used + len > JOURNAL_PAYLOAD_MAX {
                entries += 1;
                used = 0;
            }
            used += len;
        }
        entries + u32::from(used > 0)
    }

    /// True if `n` more entries fit without overwriting anything recovery needs,
    /// keeping `reserve` entries spare.
    pub fn fits(&self, n: u32, reserve: u32) -> bool {
        self.since_committed + n + reserve <= self.entries
    }

    /// Writes the pending records as new entries. Returns bytes written.
    pub fn write_pending<C: BlockDevice>(&mut self, dev: &mut C) -> Result<u64, EngineError> {
        let mut written = 0;
        let records = std::mem::take(&mut self.records);
        self.pending_bytes = 0;
        for records in pack(records) {
            let mut block = JournalBlock {
                epoch: self.epoch,
                sequence: self.sequence,
                records,
            };
            written += self.write_entry(dev, &mut block)?;
        }
        Ok(written)
    }

    fn write_entry<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        block: &mut JournalBlock,
    ) -> Result<u64, EngineError> {
        if self.since_committed >= self.entries {
            return Err(EngineError::JournalFull {
                blocks: self.entries,
            });
        }
        block.epoch = self.epoch;
        block.sequence = self.sequence;
        let Some(bytes) = block.encode() else {
            panic!("journal block over-filled: {} records", block.records.len());
        };
        self.scratch[..BLOCK_SIZE].copy_from_slice(&bytes);
        self.scratch[BLOCK_SIZE..].copy_from_slice(&bytes);
        let off = (self.start + 2 * u64::from(self.next)) * BS;
        dev.write_at(off, &self.scratch)
            .map_err(EngineError::cache("journal write", off))?;
        self.next = (self.next + 1) % self.entries;
        self.sequence += 1;
        self.since_committed += 1;
        self.since_start += 1;
        block.records.clear();
        Ok(2 * BS)
    }

    /// Records waiting in memory.
    pub fn pending_len(&self) -> usize {
        self.records.len()
    }

    /// The entries `write_pending` would write now for the pending records followed
    /// by `extra`, with their sequence numbers and epoch; `None` if writing them could
    /// overwrite entries recovery needs.
    pub fn blocks_with(&self, extra: &[JournalRecord]) -> Option<Vec<JournalBlock>> {
        let packed = pack(self.records.iter().chain(extra).cloned());
        if !self.fits(packed.len() as u32, 0) {
            return None;
        }
        Some(
            packed
                .into_iter()
                .zip(self.sequence..)
                .map(|(records, sequence)| JournalBlock {
                    epoch: self.epoch,
                    sequence,
                    records,
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Half the ring used since the latest checkpoint began: time for the next one.
    pub fn needs_checkpoint(&self) -> bool {
        self.since_start * 2 >= self.entries
    }

    /// Entries that may still be written before three quarters of the ring hold
    /// entries recovery may need (when a checkpoint in progress must be finished).
    pub fn entries_before_full(&self) -> u32 {
        (self.entries * 3 / 4).saturating_sub(self.since_committed)
    }

    /// Too many records waiting in memory: make them durable.
    pub fn pending_large(&self) -> bool {
        self.pending_bytes > (self.entries as usize / 8).max(1) * JOURNAL_PAYLOAD_MAX
    }

    /// A checkpoint of generation `epoch` begins: new entries carry its epoch, and it
    /// will replay from the current position. Returns (ring index, sequence) of it.
    pub fn begin_epoch(&mut self, epoch: u64) -> (u32, u64) {
        self.epoch = epoch;
        self.since_start = 0;
        (self.next, self.sequence)
    }

    /// The checkpoint begun by the last `begin_epoch` is durable: only the entries
    /// written since it began are needed now.
    pub fn committed_since_start(&mut self) {
        self.since_committed = self.since_start;
    }

    /// A checkpoint of generation `epoch` taken at the current position covers
    /// everything so far (records still in memory are reflected in its L2P).
    pub fn after_checkpoint(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.since_committed = 0;
        self.since_start = 0;
        self.records.clear();
        self.pending_bytes = 0;
    }
}

/// Records packed into entries in order, each entry as full as the payload allows.
fn pack(records: impl IntoIterator<Item = JournalRecord>) -> Vec<Vec<JournalRecord>> {
    let mut out: Vec<Vec<JournalRecord>> = Vec::new();
    let mut used = 0;
    for r in records {
        let len = r.encoded_len();
        match out.last_mut() {
            Some(last) if used + len <= JOURNAL_PAYLOAD_MAX => {
                used += len;
                last.push(r);
            }
            _ => {
                used = len;
                out.push(vec![r]);
            }
        }
    }
    out
}
