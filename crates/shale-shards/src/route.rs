//! Routing a request to the shards that own its bytes: shared by the pool on
//! threads (`pool.rs`) and the pool polled on one thread (`local.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use shale_engine::{Completion, EngineError, Request, Stats};
use shale_format::VolumeUid;

use crate::join::Join;
use crate::map::{Piece, ShardMap};

/// What `route` did with a request.
pub(crate) enum Routed {
    /// Its parts went to the shards; its completion will be called.
    Sent,
    /// A volume change, listing or statistics: the caller runs it across shards.
    Admin(Request, Completion),
}

/// Per volume, the engine requests beyond one that split reads, writes and trims
/// became. Each shard counts its part as a request of the volume, so the pool's
/// per-volume op counts are the shards' sums less these.
#[derive(Debug, Default)]
pub(crate) struct SplitParts(Mutex<HashMap<VolumeUid, [u64; 3]>>);

impl SplitParts {
    fn note(&self, req: &Request, parts: usize) {
        let (volume, i) = match req {
            Request::Read { volume, .. } => (volume, 0),
            Request::Write { volume, .. } => (volume, 1),
            Request::Trim { volume, .. } => (volume, 2),
            _ => return,
        };
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        m.entry(*volume).or_default()[i] += parts.saturating_sub(1) as u64;
    }

    /// Takes the extra parts out of summed statistics (and forgets deleted volumes:
    /// a uid is never reused).
    pub fn correct(&self, stats: &mut Stats) {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        m.retain(|uid, _| stats.volumes.iter().any(|v| v.uid == *uid));
        for v in &mut stats.volumes {
            if let Some([r, w, t]) = m.get(&v.uid) {
                v.read_ops = v.read_ops.saturating_sub(*r);
                v.write_ops = v.write_ops.saturating_sub(*w);
                v.trim_ops = v.trim_ops.saturating_sub(*t);
            }
        }
    }
}

/// Sends a request's parts with `send(shard, part, completion)`. A request inside one
/// granule goes whole, with only its offset changed (an error from `send` is then
/// returned, as a shard's own submit would); a larger one is split and joined, and a
/// flush or self-check goes to every shard, their parts answered once (a part `send`
/// refuses is answered with its error through the join).
pub(crate) fn route(
    map: &ShardMap,
    splits: &SplitParts,
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
        split(map, splits, &req, offset, len, done, send);
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
    splits: &SplitParts,
    req: &Request,
    offset: u64,
    len: u64,
    done: Completion,
    send: &mut dyn FnMut(usize, Request, Completion) -> Result<(), EngineError>,
) {
    let ranges = map.ranges(offset, len);
    let parts = ranges.iter().filter(|r| !r.is_empty()).count();
    splits.note(req, parts);
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
