//! One group of a cache chunk being filled: its data slots and md in memory.

use shale_format::{
    seal_md, write_md_entry, MdEntry, MdHeader, MdRegionKind, RegionId, Sid, BLOCK_SIZE,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MdState {
    /// Entries still being added.
    Filling,
    /// Group full, final md sealed in `md`, not yet submitted.
    FinalPending,
    /// Final md write submitted.
    FinalSubmitted,
}

#[derive(Debug)]
pub(crate) struct GroupBuf {
    pub id: u32,
    pub region: RegionId,
    pub group: u32,
    /// Region slot of data slot 0.
    pub start_slot: u32,
    pub data_slots: u32,
    pub sid: Sid,
    /// Data slots, `data_slots * 4096` bytes used.
    pub data: Vec<u8>,
    /// md block being built: entries written in place as blocks arrive.
    pub md: Box<[u8; BLOCK_SIZE]>,
    pub filled: u32,
    pub submitted: u32,
    /// Entries made durable by the last partial md write.
    pub md_durable_entries: u32,
    pub md_gen: u64,
    /// Which copy (0 = A, 1 = B) holds the newest valid md, if any was written.
    pub md_newest: Option<u32>,
    pub md_state: MdState,
    /// Copy the final md goes to.
    pub md_final_copy: u32,
    pub inflight: u32,
    /// ASN of data slot 0.
    pub asn_base: u64,
}

impl GroupBuf {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u32,
        region: RegionId,
        group: u32,
        start_slot: u32,
        data_slots: u32,
        sid: Sid,
        data: Vec<u8>,
        asn_base: u64,
    ) -> GroupBuf {
        let mut g = GroupBuf {
            id,
            region,
            group,
            start_slot,
            data_slots,
            sid,
            data,
            md: Box::new([0; BLOCK_SIZE]),
            filled: 0,
            submitted: 0,
            md_durable_entries: 0,
            md_gen: 0,
            md_newest: None,
            md_state: MdState::Filling,
            md_final_copy: 0,
            inflight: 0,
            asn_base,
        };
        for i in 0..data_slots as usize {
            write_md_entry(&mut g.md[..], i, &MdEntry::EMPTY);
        }
        g
    }

    pub fn is_full(&self) -> bool {
        self.filled == self.data_slots
    }

    /// Copies a block in and records its md entry; returns the data slot index.
    pub fn append(&mut self, block: &[u8], entry: &MdEntry) -> u32 {
        let i = self.filled;
        debug_assert!(i < self.data_slots);
        let o = i as usize * BLOCK_SIZE;
        self.data[o..o + BLOCK_SIZE].copy_from_slice(block);
        write_md_entry(&mut self.md[..], i as usize, entry);
        self.filled += 1;
        i
    }

    pub fn block(&self, i: u32) -> &[u8] {
        let o = i as usize * BLOCK_SIZE;
        &self.data[o..o + BLOCK_SIZE]
    }

    fn header(&self, entries: u32) -> MdHeader {
        MdHeader {
            region_kind: MdRegionKind::Chunk,
            region: self.region,
            group: self.group,
            entry_count: entries as u16,
            region_sid: self.sid,
            generation: self.md_gen,
        }
    }

    /// The copy a new md write goes to: never the one holding the newest valid copy.
    fn next_copy(&self) -> u32 {
        match self.md_newest {
            Some(0) => 1,
            _ => 0,
        }
    }

    /// Seals a partial md of the entries so far into `out`; returns the copy to write.
    pub fn seal_partial(&mut self, out: &mut [u8; BLOCK_SIZE]) -> u32 {
        self.md_gen += 1;
        out.copy_from_slice(&self.md[..]);
        seal_md(&mut out[..], &self.header(self.filled));
        self.next_copy()
    }

    /// What `seal_partial` would write now, without recording that it was written
    /// (the hand-off image); returns the copy it would go to.
    pub fn peek_partial(&self, out: &mut [u8; BLOCK_SIZE]) -> u32 {
        out.copy_from_slice(&self.md[..]);
        let mut h = self.header(self.filled);
        h.generation = self.md_gen + 1;
        seal_md(&mut out[..], &h);
        self.next_copy()
    }

    /// Seals the final md in place once the group is full.
    pub fn seal_final(&mut self) {
        self.md_gen += 1;
        self.md_final_copy = self.next_copy();
        let h = self.header(self.filled);
        seal_md(&mut self.md[..], &h);
        self.md_state = MdState::FinalPending;
    }

    pub fn settled(&self) -> bool {
        self.md_state == MdState::FinalSubmitted
            && self.inflight == 0
            && self.submitted == self.filled
    }
}
