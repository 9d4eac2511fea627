//! Engine shards: one engine per core, each owning a slice of every volume.
//!
//! - `map` ([`ShardMap`]): which shard owns which bytes of a volume.

pub mod map;

pub use map::{Piece, ShardMap, GRANULE_BYTES_DEFAULT};
