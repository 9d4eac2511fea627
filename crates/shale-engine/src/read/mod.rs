//! The read path: L2P lookup, then memory (unsettled groups) or an asynchronous device
//! read verified against the block's md entry (CRC32C, volume, LBA).
//!
//! Invariants: every block returned to a client was either never mapped (zeros), taken
//! from an in-memory group buffer, or checked against its md entry; a read in flight
//! keeps its region from being reused (durability points drain all I/O first).

pub(crate) mod block_status;
pub(crate) mod md_cache;
pub(crate) mod peek;
pub(crate) mod reader;
