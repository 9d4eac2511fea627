//! Answering a request split over shards once, when its last part completes.
//!
//! The parts complete on their shards' threads; the little state they share (parts
//! left, the first error, the read buffer being filled) sits behind one mutex per
//! split request, which only requests spanning granules pay.

use std::sync::{Arc, Mutex, PoisonError};

use shale_engine::{Completion, EngineError, Extent, Reply};

use crate::map::Piece;

enum Out {
    /// The parts' replies carry nothing: the request answers `Done`.
    Done,
    /// The request's bytes, scattered into place as each shard's part arrives.
    Read {
        buf: Vec<u8>,
        pieces: Arc<Vec<Piece>>,
    },
    /// Each shard's extents (local start, len, mapped), merged in volume order at the
    /// end.
    Allocation {
        pieces: Arc<Vec<Piece>>,
        shards: Vec<Vec<(u64, u64, bool)>>,
    },
}

struct State {
    left: usize,
    done: Option<Completion>,
    err: Option<EngineError>,
    out: Out,
}

pub(crate) struct Join(Mutex<State>);

impl Join {
    fn with(parts: usize, done: Completion, out: Out) -> Arc<Join> {
        Arc::new(Join(Mutex::new(State {
            left: parts,
            done: Some(done),
            err: None,
            out,
        })))
    }

    /// A request whose parts answer nothing but success or failure.
    pub fn new(parts: usize, done: Completion) -> Arc<Join> {
        Self::with(parts, done, Out::Done)
    }

    /// A read of `len` bytes made of `pieces`.
    pub fn read(parts: usize, done: Completion, len: u64, pieces: Arc<Vec<Piece>>) -> Arc<Join> {
        Self::with(
            parts,
            done,
            Out::Read {
                buf: vec![0; len as usize],
                pieces,
            },
        )
    }

    /// An allocation query made of `pieces`.
    pub fn allocation(parts: usize, done: Completion, pieces: Arc<Vec<Piece>>) -> Arc<Join> {
        let shards = pieces.iter().map(|p| p.shard).max().map_or(0, |m| m + 1);
        Self::with(
            parts,
            done,
            Out::Allocation {
                pieces,
                shards: vec![Vec::new(); shards],
            },
        )
    }

    /// A part that answers nothing but success or failure.
    pub fn done_part(&self, r: Result<(), EngineError>) {
        self.finish(|st| {
            if let Err(e) = r {
                st.err.get_or_insert(e);
            }
        });
    }

    /// Shard `shard`'s part, whose local range starts at `local`.
    pub fn done_shard(&self, shard: usize, local: u64, r: Result<Reply, EngineError>) {
        self.finish(|st| match (r, &mut st.out) {
            (Err(e), _) => {
                st.err.get_or_insert(e);
            }
            (Ok(Reply::Read(data)), Out::Read { buf, pieces }) => {
                for p in pieces.iter().filter(|p| p.shard == shard) {
                    let from = (p.local - local) as usize;
                    let (at, len) = (p.at as usize, p.len as usize);
                    match data.get(from..from + len) {
                        Some(src) => buf[at..at + len].copy_from_slice(src),
                        None => {
                            st.err.get_or_insert(short_reply(shard));
                            return;
                        }
                    }
                }
            }
            (Ok(Reply::Allocation(ext)), Out::Allocation { shards, .. }) => {
                let mut at = local;
                shards[shard] = ext
                    .iter()
                    .map(|e| {
                        let x = (at, e.len, e.mapped);
                        at += e.len;
                        x
                    })
                    .collect();
            }
            (Ok(_), Out::Done) => {}
            (Ok(other), _) => {
                st.err.get_or_insert(EngineError::Failed {
                    reason: format!("shard {shard} answered a split request with {other:?}"),
                });
            }
        });
    }

    /// Records one part under the lock; the last one answers (outside it).
    fn finish(&self, record: impl FnOnce(&mut State)) {
        let answer = {
            let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            record(&mut st);
            st.left -= 1;
            if st.left > 0 {
                return;
            }
            let done = st.done.take();
            let r = match st.err.take() {
                Some(e) => Err(e),
                None => Ok(match std::mem::replace(&mut st.out, Out::Done) {
                    Out::Done => Reply::Done,
                    Out::Read { buf, .. } => Reply::Read(buf),
                    Out::Allocation { pieces, shards } => {
                        Reply::Allocation(merge_extents(&pieces, &shards))
                    }
                }),
            };
            done.map(|d| (d, r))
        };
        if let Some((done, r)) = answer {
            done(r);
        }
    }
}

fn short_reply(shard: usize) -> EngineError {
    EngineError::Failed {
        reason: format!("shard {shard} answered a read with fewer bytes than asked"),
    }
}

/// The request's extents in volume order: each piece takes the part of its shard's
/// extents it covers; neighbours alike in `mapped` are joined.
fn merge_extents(pieces: &[Piece], shards: &[Vec<(u64, u64, bool)>]) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let mut push = |len: u64, mapped: bool| match out.last_mut() {
        Some(l) if l.mapped == mapped => l.len += len,
        _ => out.push(Extent { len, mapped }),
    };
    for p in pieces {
        let (start, end) = (p.local, p.local + p.len);
        let mut covered = start;
        for &(s, len, mapped) in shards.get(p.shard).map_or(&[][..], Vec::as_slice) {
            let (a, b) = (s.max(start), (s + len).min(end));
            if a < b {
                push(b - a, mapped);
                covered = b;
            }
        }
        // A shard answers its whole range; should it not, the rest reads as unmapped
        // (zeros), which is what an unwritten block reads as.
        if covered < end {
            push(end - covered, false);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_are_merged_in_volume_order() {
        // Two shards, granule 2: volume [0,8) = shard 0 local [0,2), shard 1 local
        // [0,2), shard 1 local [2,4), shard 0 local [2,4).
        let pieces = vec![
            Piece {
                shard: 0,
                at: 0,
                local: 0,
                len: 2,
            },
            Piece {
                shard: 1,
                at: 2,
                local: 0,
                len: 2,
            },
            Piece {
                shard: 1,
                at: 4,
                local: 2,
                len: 2,
            },
            Piece {
                shard: 0,
                at: 6,
                local: 2,
                len: 2,
            },
        ];
        let shards = vec![
            vec![(0, 3, true), (3, 1, false)],
            vec![(0, 1, false), (1, 3, true)],
        ];
        let e = merge_extents(&pieces, &shards);
        let flat: Vec<(u64, bool)> = e.iter().map(|e| (e.len, e.mapped)).collect();
        // shard0 [0,2) mapped; shard1 [0,1) unmapped [1,2) mapped; shard1 [2,4)
        // mapped; shard0 [2,3) mapped [3,4) unmapped.
        assert_eq!(flat, vec![(2, true), (1, false), (4, true), (1, false)]);
    }
}
