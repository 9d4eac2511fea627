//! What clients ask of the engine, and what they get back.
//!
//! Offsets and lengths are in bytes and may have any alignment: the engine does the
//! read-modify-write of partial blocks. A request names its volume by uid, the
//! identity no later volume shares: a request for a deleted volume fails with
//! `NoSuchVolume` even when a new volume took its slot. Trim is advisory for partial blocks (only blocks
//! wholly inside the range are unmapped); write-zeroes is exact.

use shale_format::{VolumeId, VolumeLimits, VolumeUid};

use crate::{EngineError, Stats};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Read {
        volume: VolumeUid,
        offset: u64,
        len: u64,
    },
    /// `fua`: durable when completed (costs a flush: see `flush.rs`).
    Write {
        volume: VolumeUid,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Trim {
        volume: VolumeUid,
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        volume: VolumeUid,
        offset: u64,
        len: u64,
    },
    /// Everything completed before the flush was submitted is durable when it completes.
    Flush,
    CreateVolume {
        name: String,
        size_bytes: u64,
    },
    /// `CreateVolume` with a layout other than the default (a mapping unit above one
    /// block). Pools formatted before volume limits existed refuse it.
    CreateVolumeWith {
        name: String,
        size_bytes: u64,
        layout: VolumeLayout,
    },
    /// Creates a shard's slice of a volume (`shale-shards`; refused by a pool of one
    /// shard): `size_bytes` of the volume's `whole_size_bytes` live here. `uid` is
    /// the one another shard issued (`None`: issue one); refused when this engine has
    /// issued it or a later one.
    CreateSlice {
        name: String,
        uid: Option<VolumeUid>,
        size_bytes: u64,
        whole_size_bytes: u64,
        layout: VolumeLayout,
    },
    /// Resizes a shard's slice of a volume (as `ResizeVolume`).
    ResizeSlice {
        volume: VolumeUid,
        size_bytes: u64,
        whole_size_bytes: u64,
    },
    ResizeVolume {
        volume: VolumeUid,
        size_bytes: u64,
    },
    DeleteVolume {
        volume: VolumeUid,
    },
    /// Sets a volume's rate limits (`VolumeLimits::NONE` removes them); answered with
    /// the volume. Pools formatted before limits existed refuse limits.
    SetVolumeLimits {
        volume: VolumeUid,
        limits: VolumeLimits,
    },
    ListVolumes,
    /// Which bytes of `[offset, offset + len)` are mapped (NBD BLOCK_STATUS
    /// `base:allocation`): answered by [`Reply::Allocation`]. `len` is at most
    /// [`ALLOCATION_QUERY_BYTES_MAX`] (larger is refused with `TooLarge`; NBD lets a
    /// server answer a prefix, so front-ends clamp). Any alignment.
    Allocation {
        volume: VolumeUid,
        offset: u64,
        len: u64,
    },
    Stats,
    /// Runs the O(n) self-check (L2P vs validity vs counts, region states, free lists).
    SelfCheck,
    /// Gives up to `count` free zones of the capacity device to the space manager
    /// (`shale-shards`), keeping what this engine's GC needs: answered with
    /// [`Reply::Zones`] once a checkpoint records them as another shard's.
    GiveZones {
        count: u32,
    },
    /// Takes `zones` (indices on the capacity device, each another shard's here) from
    /// the space manager: each is reset unless empty and becomes free here. All or
    /// none.
    TakeZones {
        zones: Vec<u32>,
    },
    /// The zones that are another shard's here ([`Reply::Zones`]): what the space
    /// manager reconciles at a pool's open.
    ForeignZones,
    /// Gives up to `count` free chunks of a cache the shards share to the space
    /// manager, keeping what this engine's writes and compaction need: answered
    /// with [`Reply::Chunks`] once a checkpoint records them as another shard's.
    GiveChunks {
        count: u32,
    },
    /// Takes `chunks` (each another shard's here) from the space manager: each has
    /// its md blocks zeroed and becomes free here. All or none are checked first.
    TakeChunks {
        chunks: Vec<u32>,
    },
    /// The chunks that are another shard's here ([`Reply::Chunks`]).
    ForeignChunks,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The volume's slot (reused after a delete).
    pub id: VolumeId,
    /// The volume's identity (never reused): what requests name.
    pub uid: VolumeUid,
    pub name: String,
    pub size_bytes: u64,
    /// The whole volume's size where this engine holds a shard's slice of it
    /// (`size_bytes` of it); `size_bytes` otherwise.
    pub whole_size_bytes: u64,
    /// Rate limits (none by default).
    pub limits: VolumeLimits,
    /// How the volume is mapped (fixed at creation).
    pub layout: VolumeLayout,
}

/// How a volume's blocks are mapped, chosen when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeLayout {
    /// The mapping unit is `1 << map_unit_shift` blocks (0: 4 KiB, the default; up to
    /// `shale_format::MAP_UNIT_SHIFT_MAX`, 64 KiB). The volume's L2P holds one entry
    /// per unit, so it is that many times smaller; writes of less than a unit are
    /// read-modify-write of the whole unit.
    pub map_unit_shift: u8,
    /// Dual mapping (SALSA's dual-mapping controller; needs a unit above one block):
    /// whole units go to the unit map, and blocks written apart from their unit to
    /// a sparse map of 4 KiB entries that overrides it, so small writes are not
    /// read-modify-write and data written in runs keeps the small map.
    pub dual: bool,
}

impl VolumeLayout {
    /// The mapping unit in bytes.
    pub fn map_unit_bytes(self) -> u64 {
        4096 << self.map_unit_shift
    }

    /// The layout whose mapping unit is `bytes` (a power of two from 4 KiB to
    /// 64 KiB), or why not.
    pub fn with_map_unit(bytes: u64) -> Result<VolumeLayout, String> {
        let max = 4096u64 << shale_format::MAP_UNIT_SHIFT_MAX;
        if !bytes.is_power_of_two() || !(4096..=max).contains(&bytes) {
            return Err(format!(
                "a mapping unit of {bytes} bytes: it must be a power of two from 4096 to {max}"
            ));
        }
        Ok(VolumeLayout {
            map_unit_shift: (bytes / 4096).trailing_zeros() as u8,
            dual: false,
        })
    }
}

#[derive(Debug)]
pub enum Reply {
    Done,
    Read(Vec<u8>),
    Volume(VolumeInfo),
    Volumes(Vec<VolumeInfo>),
    /// Extents in order, covering exactly the requested range; neighbours differ in
    /// `mapped`.
    Allocation(Vec<Extent>),
    Stats(Box<Stats>),
    /// The zones given (`Request::GiveZones`): indices on the capacity device.
    Zones(Vec<u32>),
    /// The chunks given (`Request::GiveChunks`) or another shard's
    /// (`Request::ForeignChunks`): chunk indices of the cache.
    Chunks(Vec<u32>),
}

/// Largest range one `Request::Allocation` may ask about: 256 L2P pages, so at most
/// 256 page reads and 262,144 extents.
pub const ALLOCATION_QUERY_BYTES_MAX: u64 = 1 << 30;

/// A stretch of bytes that is all mapped or all unmapped.
///
/// Mapped: the 4 KiB block holding these bytes has an L2P entry (written, not trimmed
/// since). Unmapped bytes read as zeros. Write-zeroes unmaps whole blocks, so they are
/// unmapped afterwards; partial blocks it zeroes are written, so they stay mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub mapped: bool,
}

/// Called exactly once when a request finishes.
pub type Completion = Box<dyn FnOnce(Result<Reply, EngineError>) + Send>;

/// A request's completion while the engine holds it. Dropped without an answer (an
/// error path that forgot it, or an engine dropped with requests in it) it answers
/// `Failed`, so no request can be lost and leave its client waiting forever; only
/// `Engine::abandon` (a simulated crash) silences the ones still held.
pub(crate) struct Answer(Option<Completion>);

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Answer"
        } else {
            "Answer(sent)"
        })
    }
}

impl Answer {
    pub fn new(done: Completion) -> Answer {
        Answer(Some(done))
    }

    /// Answers the request.
    pub fn send(mut self, r: Result<Reply, EngineError>) {
        if let Some(done) = self.0.take() {
            done(r);
        }
    }

    /// Drops the completion without calling it (the process "crashed").
    pub fn disarm(mut self) {
        self.0 = None;
    }

    /// An answer nobody waits for (tests).
    #[cfg(test)]
    pub fn none() -> Answer {
        Answer(None)
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(EngineError::Failed {
                reason: "the engine dropped this request without answering it".into(),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    type Log = Arc<Mutex<Vec<Result<Reply, EngineError>>>>;

    fn recorder() -> (Completion, Log) {
        let got: Log = Arc::new(Mutex::new(Vec::new()));
        let g = Arc::clone(&got);
        let c: Completion = Box::new(move |r| g.lock().unwrap().push(r));
        (c, got)
    }

    #[test]
    fn an_answer_is_sent_once_and_a_dropped_one_says_failed() {
        let (c, got) = recorder();
        Answer::new(c).send(Ok(Reply::Done));
        assert!(matches!(got.lock().unwrap()[..], [Ok(Reply::Done)]));

        let (c, got) = recorder();
        drop(Answer::new(c));
        assert!(matches!(
            got.lock().unwrap()[..],
            [Err(EngineError::Failed { .. })]
        ));

        let (c, got) = recorder();
        Answer::new(c).disarm();
        assert!(got.lock().unwrap().is_empty());
    }
}
