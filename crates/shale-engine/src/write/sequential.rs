//! Which large writes continue a sequential stream (`DirectWritePolicy::Sequential`).
//!
//! Data written in long sequential runs (copies, backups, images, logs rolled over a
//! volume) tends to die together and late: sending it straight to a zone saves the
//! cache two writes and a read per byte and leaves GC little to copy. Large writes
//! at random places are often hot (a database's extents): the cache absorbs their
//! overwrites, and sending them to zones costs write amplification
//! (docs/engine.md, "Direct writes"). So under this policy a large write goes
//! direct only when it continues a run of large writes of its volume, each starting
//! where the one before ended, already `Config::direct_run_min_bytes` long (1 MiB by
//! default; a shard's share of that in a pool of shards): a random write lands
//! at the end of a recent one now and then (often, inside a small hot set), a run
//! of several in order is what sequential clients write.
//!
//! The table holds the ends of the last `STREAMS` large writes, over all volumes,
//! replaced least recently used first: enough for a handful of interleaved
//! sequential clients, and a fixed cost per large write.

use shale_format::VolumeId;

/// Sequential streams followed at once.
const STREAMS: usize = 32;

#[derive(Debug, Clone, Copy)]
struct Stream {
    volume: VolumeId,
    /// The block after the stream's last write.
    end: u64,
    /// Blocks written in the run so far.
    run: u64,
    /// When it last grew (a counter of noted writes), for the replacement.
    used: u64,
}

#[derive(Debug, Default)]
pub(crate) struct SequentialStreams {
    streams: Vec<Stream>,
    clock: u64,
}

impl SequentialStreams {
    /// Whether a write of `volume` starting at block `start` continues a run at
    /// least `run_min` blocks long.
    pub fn continues(&self, volume: VolumeId, start: u64, run_min: u64) -> bool {
        self.run_before(volume, start) >= run_min
    }

    /// The length of the run a write at `start` would continue (0: none).
    fn run_before(&self, volume: VolumeId, start: u64) -> u64 {
        self.streams
            .iter()
            .find(|s| s.volume == volume && s.end == start)
            .map_or(0, |s| s.run)
    }

    /// A large write of blocks `start..end` of `volume` was taken: the stream it
    /// continues (or a new one, in the least recently used place) now ends at `end`.
    pub fn note(&mut self, volume: VolumeId, start: u64, end: u64) {
        self.clock += 1;
        let fresh = Stream {
            volume,
            end,
            run: self.run_before(volume, start) + (end - start),
            used: self.clock,
        };
        let at = |e: u64| {
            self.streams
                .iter()
                .position(|s| s.volume == volume && s.end == e)
        };
        // One entry per end: a stream that catches up with another merges into it.
        match (at(start), at(end)) {
            (Some(i), Some(j)) if i != j => {
                self.streams[i] = fresh;
                self.streams.swap_remove(j);
            }
            (Some(i), _) | (None, Some(i)) => self.streams[i] = fresh,
            (None, None) if self.streams.len() < STREAMS => self.streams.push(fresh),
            (None, None) => {
                if let Some(s) = self.streams.iter_mut().min_by_key(|s| s.used) {
                    *s = fresh;
                }
            }
        }
    }

    /// A volume was deleted: a new volume in its slot starts with no streams.
    pub fn forget(&mut self, volume: VolumeId) {
        self.streams.retain(|s| s.volume != volume);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// 1 MiB of blocks, the default.
    const RUN: u64 = 256;

    #[test]
    fn a_run_continues_and_a_jump_does_not() {
        let mut t = SequentialStreams::default();
        let v = VolumeId(1);
        assert!(!t.continues(v, 0, RUN));
        t.note(v, 0, 64);
        assert!(
            !t.continues(v, 64, RUN),
            "a run of one write is not yet sequential"
        );
        t.note(v, 64, 128);
        t.note(v, 128, 192);
        assert!(!t.continues(v, 192, RUN));
        t.note(v, 192, 256);
        assert!(t.continues(v, 256, RUN), "1 MiB in order");
        assert!(
            !t.continues(VolumeId(2), 256, RUN),
            "another volume's stream"
        );
        assert!(!t.continues(v, 257, RUN));
        t.note(v, 256, 300);
        assert!(t.continues(v, 300, RUN));
        assert!(!t.continues(v, 256, RUN), "the stream moved on");
        t.note(v, 1000, 1300);
        assert!(
            t.continues(v, 1300, RUN),
            "one write as long as a run is one"
        );
        t.forget(v);
        assert!(!t.continues(v, 300, RUN));
    }

    proptest! {
        /// Against a model that keeps every stream: the table holds at most
        /// `STREAMS`, each end once, and exactly the most recently grown streams
        /// with their runs (so the newest is always found, and none it dropped
        /// comes back).
        #[test]
        fn the_table_keeps_the_most_recent_streams(
            ops in proptest::collection::vec((0u32..3, 0u64..200, 1u64..100, any::<bool>()), 1..400),
        ) {
            let mut t = SequentialStreams::default();
            // (volume, end) -> (when it last grew, run).
            let mut model: HashMap<(u32, u64), (u64, u64)> = HashMap::new();
            let recent = |model: &HashMap<(u32, u64), (u64, u64)>, n: usize| {
                let mut all: Vec<_> = model.iter().map(|(&k, &(u, r))| (u, k, r)).collect();
                all.sort_unstable_by(|a, b| b.cmp(a));
                let mut top: Vec<_> = all.into_iter().take(n).map(|(_, k, r)| (k, r)).collect();
                top.sort_unstable();
                top
            };
            for (i, (v, start, len, follow)) in ops.into_iter().enumerate() {
                // Half the writes continue the volume's newest stream, when it has one.
                let newest = model
                    .iter()
                    .filter(|(k, _)| k.0 == v)
                    .max_by_key(|(_, &(u, _))| u)
                    .map(|(k, _)| k.1);
                let start = match newest {
                    Some(end) if follow => end,
                    _ => start,
                };
                // A stream the table dropped is not continued.
                let kept = recent(&model, t.streams.len());
                let before = kept.iter().find(|(k, _)| *k == (v, start)).map_or(0, |x| x.1);
                prop_assert_eq!(t.continues(VolumeId(v), start, RUN), before >= RUN);
                t.note(VolumeId(v), start, start + len);
                model.remove(&(v, start));
                model.insert((v, start + len), (i as u64, before + len));
                prop_assert!(t.streams.len() <= STREAMS);
                let mut have: Vec<((u32, u64), u64)> =
                    t.streams.iter().map(|s| ((s.volume.0, s.end), s.run)).collect();
                have.sort_unstable();
                prop_assert_eq!(have, recent(&model, t.streams.len()));
            }
        }
    }
}
