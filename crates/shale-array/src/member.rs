//! One device of an array: what it is, how healthy it is, what it has done.

use std::fmt;

/// A member's state, as `shale device list` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberState {
    /// Serving reads and writes.
    Ok,
    /// Out of service: nothing is read from it or written to it.
    Failed,
    /// Written like a healthy member, read only where it has been rebuilt.
    Rebuilding,
    /// Not present at open.
    Missing,
}

impl MemberState {
    /// How a label records this state (a missing member is recorded failed).
    pub fn record(self) -> shale_format::MemberRecord {
        use shale_format::MemberRecord;
        match self {
            MemberState::Ok => MemberRecord::Ok,
            MemberState::Failed | MemberState::Missing => MemberRecord::Failed,
            MemberState::Rebuilding => MemberRecord::Rebuilding,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Ok => "ok",
            MemberState::Failed => "failed",
            MemberState::Rebuilding => "rebuilding",
            MemberState::Missing => "missing",
        }
    }
}

impl fmt::Display for MemberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a member has done since the array was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberCounters {
    pub read_errors: u64,
    pub write_errors: u64,
    /// Flush and zone management errors.
    pub other_errors: u64,
    /// Reads of this member's data served by reconstruction from the others.
    pub reconstructed_reads: u64,
    /// Reads of this member's data that failed their checksum and were rebuilt from
    /// the others (silent corruption found).
    pub corrupt_reads: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// A member as reported to operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub index: u32,
    pub name: String,
    pub state: MemberState,
    /// Why it failed, when it did.
    pub reason: Option<String>,
    pub counters: MemberCounters,
}

/// A member inside an array.
#[derive(Debug)]
pub(crate) struct Member<D> {
    /// `None` when missing.
    pub dev: Option<D>,
    pub name: String,
    pub state: MemberState,
    pub reason: Option<String>,
    pub counters: MemberCounters,
    /// Requests submitted to the device and not yet polled back.
    pub in_flight: usize,
}

impl<D> Member<D> {
    pub fn new(dev: Option<D>, name: String) -> Member<D> {
        let state = if dev.is_some() {
            MemberState::Ok
        } else {
            MemberState::Missing
        };
        Member {
            dev,
            name,
            state,
            reason: None,
            counters: MemberCounters::default(),
            in_flight: 0,
        }
    }

    /// Reads may be served from it.
    pub fn readable(&self) -> bool {
        self.state == MemberState::Ok && self.dev.is_some()
    }

    /// Writes go to it.
    pub fn writable(&self) -> bool {
        matches!(self.state, MemberState::Ok | MemberState::Rebuilding) && self.dev.is_some()
    }

    pub fn status(&self, index: u32) -> MemberStatus {
        MemberStatus {
            index,
            name: self.name.clone(),
            state: self.state,
            reason: self.reason.clone(),
            counters: self.counters,
        }
    }

    /// Takes it out of service (once; the first reason is kept).
    pub fn fail(&mut self, reason: String) {
        if matches!(self.state, MemberState::Failed | MemberState::Missing) {
            return;
        }
        tracing::error!(member = %self.name, %reason, "array member failed");
        self.state = MemberState::Failed;
        self.reason = Some(reason);
    }
}

/// Every member's status, in slot order.
pub(crate) fn statuses<D>(members: &[Member<D>]) -> Vec<MemberStatus> {
    members
        .iter()
        .enumerate()
        .map(|(i, m)| m.status(i as u32))
        .collect()
}
