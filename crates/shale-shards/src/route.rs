//! Routing a request to the shards that own its bytes: shared by the pool on
//! threads (`pool.rs`) and the pool polled on one thread (`local.rs`).

use std::sync::Arc;

use shale_engine::{Completion, EngineError, Request};

use crate::join::Join;
use crate::map::{Piece, ShardMap};

/// What `route` did with a request.
pub(crate) enum Routed {
    /// Its parts went to the shards; its completion will be called.
    Sent,
    /// A volume change, listing or statistics: the caller runs it across shards.
    Admin(Request, Completion),
}

/// Sends a request's parts with `send(shard, part, completion)`. A request inside one
/// granule goes whole, with only its offset changed (an error from `send` is then
/// returned, as a shard's own submit would); a larger one is split and joined, and a
/// flush or self-check goes to every shard, their parts answered once (a part `send`
/// refuses is answered with its error through the join).
pub(crate) fn route(
    map: &ShardMap,
    req: Request,
    done: Completion,
    send: &mut dyn FnMut(usize, Request, Completion) -> Result<(), EngineError>,
) -> Result<Routed, EngineError> {
    if let Some((offset, len)) = span(&req) {
        if let Some((shard, local)) = map.single(offset, len) {
            send(shard, relocate(req, local), done)?;
            return Ok(Routed::Sent);
        }
        if len == 0 {
            // Nothing to split: shard 0 answers (an empty read, a no-op).
            send(0, req, done)?;
            return Ok(Routed::Sent);
        }
        split(map, &req, offset, len, done, send);
        return Ok(Routed::Sent);
    }
    match req {
        Request::Flush | Request::SelfCheck => {
            let join = Join::new(map.shards(), done);
            for shard in 0..map.shards() {
                let part = match req {
                    Request::SelfCheck => Request::SelfCheck,
                    _ => Request::Flush,
                };
                let j = Arc::clone(&join);
                if let Err(e) = send(shard, part, Box::new(move |r| j.done_part(r.map(|_| ())))) {
                    join.done_part(Err(e));
                }
            }
            Ok(Routed::Sent)
        }
        other => Ok(Routed::Admin(other, done)),
    }
}

fn split(
    map: &ShardMap,
    req: &Request,
    offset: u64,
    len: u64,
    done: Completion,
    send: &mut dyn FnMut(usize, Request, Completion) -> Result<(), EngineError>,
) {
    let ranges = map.ranges(offset, len);
    let parts = ranges.iter().filter(|r| !r.is_empty()).count();
    let pieces: Arc<Vec<Piece>> = Arc::new(map.pieces(offset, len).collect());
    let join = match req {
        Request::Read { .. } => Join::read(parts, done, len, Arc::clone(&pieces)),
        Request::Allocation { .. } => Join::allocation(parts, done, Arc::clone(&pieces)),
        _ => Join::new(parts, done),
    };
    for (shard, r) in ranges.into_iter().enumerate() {
        if r.is_empty() {
            continue;
        }
        let data = match req {
            Request::Write { data, .. } => {
                let mut d = Vec::with_capacity((r.end - r.start) as usize);
                for p in pieces.iter().filter(|p| p.shard == shard) {
                    d.extend_from_slice(&data[p.at as usize..(p.at + p.len) as usize]);
                }
                Some(d)
            }
            _ => None,
        };
        let j = Arc::clone(&join);
        let local = r.start;
        let p = part(req, r.start, r.end - r.start, data);
        if let Err(e) = send(
            shard,
            p,
            Box::new(move |res| j.done_shard(shard, local, res)),
        ) {
            join.done_shard(shard, local, Err(e));
        }
    }
}

/// A request's slice of volume bytes, where the router splits it.
fn span(r: &Request) -> Option<(u64, u64)> {
    match r {
        Request::Read { offset, len, .. }
        | Request::Trim { offset, len, .. }
        | Request::WriteZeroes { offset, len, .. }
        | Request::Allocation { offset, len, .. } => Some((*offset, *len)),
        Request::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
        _ => None,
    }
}

/// A copy of `r` for one shard: the same request at `local`, `len` bytes (`data`
/// for a write).
fn part(r: &Request, local: u64, len: u64, data: Option<Vec<u8>>) -> Request {
    match r {
        Request::Read { volume, .. } => Request::Read {
            volume: *volume,
            offset: local,
            len,
        },
        Request::Write { volume, fua, .. } => Request::Write {
            volume: *volume,
            offset: local,
            data: data.unwrap_or_default(),
            fua: *fua,
        },
        Request::Trim { volume, .. } => Request::Trim {
            volume: *volume,
            offset: local,
            len,
        },
        Request::WriteZeroes { volume, .. } => Request::WriteZeroes {
            volume: *volume,
            offset: local,
            len,
        },
        Request::Allocation { volume, .. } => Request::Allocation {
            volume: *volume,
            offset: local,
            len,
        },
        _ => unreachable!("only requests with a span are split"),
    }
}

/// `r` with its offset replaced by the shard-local one.
fn relocate(r: Request, local: u64) -> Request {
    match r {
        Request::Read { volume, len, .. } => Request::Read {
            volume,
            offset: local,
            len,
        },
        Request::Write {
            volume, data, fua, ..
        } => Request::Write {
            volume,
            offset: local,
            data,
            fua,
        },
        Request::Trim { volume, len, .. } => Request::Trim {
            volume,
            offset: local,
            len,
        },
        Request::WriteZeroes { volume, len, .. } => Request::WriteZeroes {
            volume,
            offset: local,
            len,
        },
        Request::Allocation { volume, len, .. } => Request::Allocation {
            volume,
            offset: local,
            len,
        },
        other => other,
    }
}
