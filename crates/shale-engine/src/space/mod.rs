//! Space accounting: region states, validity bitmaps and free lists.
//!
//! Invariants (checked by the self-check):
//! - a PBA's validity bit is set iff exactly one L2P entry points at it;
//! - a region's `valid` equals its set bits;
//! - every Free region is on its free list exactly once, with no valid blocks and
//!   nothing in flight; PendingFree regions have no valid blocks and no relocations
//!   in flight, and are reused only after the next durability point.

pub(crate) mod lend;
mod regions;
mod shares;
mod validity;

pub(crate) use regions::{Region, Regions};
pub(crate) use shares::CacheShares;
pub(crate) use validity::Validity;
