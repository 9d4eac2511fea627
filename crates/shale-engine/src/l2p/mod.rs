//! The logical-to-physical map: per-volume directories in DRAM (directory.rs) and
//! 4 KiB pages of 1024 or 816 PBAs (the pool's entry width) cached in DRAM under a budget (page_cache.rs).
//!
//! Invariants:
//! - a page's newest copy is in the cache frame if cached, else at `dir[p].slot` with
//!   CRC `dir[p].crc32c`, else (slot NONE) all unmapped;
//! - a dirty page is written only to the slot not referenced by the last durable
//!   checkpoint (`ckpt_slot`), so the checkpointed copy is never overwritten;
//! - pool pages are owned by at most one (volume, page); pages released by a volume
//!   delete or shrink return to the pool only after the checkpoint that forgets them.
//! - a relocation switch for a page not cached waits in the page's deferred chain
//!   (deferred.rs) and is applied when the page is next faulted in; the switches
//!   waiting when a checkpoint begins are recorded in it (its L2P switch table), or,
//!   past the room its area has for them, their pages are written (updated) before it
//!   commits; no page is cached and deferred at once;
//! - No page is pinned across engine loop iterations: a fault may evict any page, so
//!   the budget only has to cover one request plus the reserve.
//! - Loads ahead of queued requests and write-backs near the LRU tail run
//!   asynchronously (inflight.rs); a page's stored copy changes only when a write-back
//!   of its cached frame completes, and a frame being written is never evicted or
//!   written again.

mod deferred;
mod directory;
mod inflight;
mod page_cache;
mod pool;

pub(crate) use directory::VolumeMap;
pub(crate) use page_cache::{L2p, WriteBackTarget, MAX_EPP};

/// Switches a new pool's checkpoint areas have room for: one per L2P pool page (what
/// the L2P lets wait by default), within what the switch slab can address.
pub(crate) fn switch_room_at_format(pool_pages: u32) -> usize {
    (pool_pages as usize).min(deferred::DEFERRED_MAX_LIMIT)
}
