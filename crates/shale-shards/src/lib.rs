//! Engine shards: one engine per core, each owning a slice of every volume.
//!
//! - `map` ([`ShardMap`]): which shard owns which bytes of a volume.
//! - `pool` ([`Shards`]): the shards on their threads behind one router; volume
//!   changes made in every shard, shard 0's table the pool's.
//! - `local` ([`LocalShards`]): the same pool stepped on the caller's thread, for
//!   deterministic runs (the benchmark runner, simulations).
//! - `route`, `volumes`: routing requests and volume changes, shared by both.
//! - `join`: answering a request split over shards once.
//! - `space`: the space manager of shards sharing one capacity device or cache
//!   (zones and chunks given and taken by message, orphans handed out at open).
//! - `cache`: one cache device divided between shards (metadata windows, shared
//!   chunks).

pub mod cache;
mod join;
mod local;
pub mod map;
mod pool;
mod route;
mod space;
mod volumes;

pub use local::LocalShards;
pub use map::{Piece, ShardMap, GRANULE_BYTES_DEFAULT};
pub use pool::{Shards, ShardsError, SpaceManager};
pub use space::Lending;
