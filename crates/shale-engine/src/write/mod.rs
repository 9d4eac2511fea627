//! The user write path: blocks are appended at the open chunk's write pointer into
//! in-memory group buffers (group.rs), md entries filled as they arrive, and submitted
//! as one device write per contiguous run per engine loop iteration (chunk_writer.rs).
//!
//! Invariants:
//! - blocks are appended in ASN (append sequence number) order, and groups are kept in
//!   creation order, so runs are submitted in ASN order and a write request completes
//!   when the completed-ASN watermark passes its last block;
//! - a group buffer stays in memory (reads are served from it) until its final md is
//!   written and all its device writes have completed ("settled");
//! - a group's md is rewritten only into the copy (A/B) that does not hold the newest
//!   valid one, with a higher generation.

pub(crate) mod chunk_writer;
pub(crate) mod direct;
pub(crate) mod group;
pub(crate) mod runs;
pub(crate) mod sequential;
pub(crate) mod user_write;
