//! Engine shards: one engine per core, each owning a slice of every volume.
//!
//! - `map` ([`ShardMap`]): which shard owns which bytes of a volume.
//! - `pool` ([`Shards`]): the shards on their threads behind one router; volume
//!   changes made in every shard, shard 0's table the pool's.
//! - `join`: answering a request split over shards once.

mod join;
pub mod map;
mod pool;
mod route;
mod volumes;

pub use map::{Piece, ShardMap, GRANULE_BYTES_DEFAULT};
pub use pool::{Shards, ShardsError};
