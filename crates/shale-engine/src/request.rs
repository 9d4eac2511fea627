//! What clients ask of the engine, and what they get back.
//!
//! Offsets and lengths are in bytes and may have any alignment: the engine does the
//! read-modify-write of partial blocks. Trim is advisory for partial blocks (only blocks
//! wholly inside the range are unmapped); write-zeroes is exact.

use shale_format::VolumeId;

use crate::{EngineError, Stats};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Read {
        volume: VolumeId,
        offset: u64,
        len: u64,
    },
    /// `fua`: durable when completed (costs a flush: see `flush.rs`).
    Write {
        volume: VolumeId,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Trim {
        volume: VolumeId,
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        volume: VolumeId,
        offset: u64,
        len: u64,
    },
    /// Everything completed before the flush was submitted is durable when it completes.
    Flush,
    CreateVolume {
        name: String,
        size_bytes: u64,
    },
    ResizeVolume {
        volume: VolumeId,
        size_bytes: u64,
    },
    DeleteVolume {
        volume: VolumeId,
    },
    ListVolumes,
    Stats,
    /// Runs the O(n) self-check (L2P vs validity vs counts, region states, free lists).
    SelfCheck,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub id: VolumeId,
    pub name: String,
    pub size_bytes: u64,
}

#[derive(Debug)]
pub enum Reply {
    Done,
    Read(Vec<u8>),
    Volume(VolumeInfo),
    Volumes(Vec<VolumeInfo>),
    Stats(Box<Stats>),
}

/// Called exactly once when a request finishes.
pub type Completion = Box<dyn FnOnce(Result<Reply, EngineError>) + Send>;
