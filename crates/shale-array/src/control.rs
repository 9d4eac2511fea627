//! An array seen from other threads: a status snapshot and a queue of operator
//! commands. The array owns its devices on its owner's thread (the engine's); it
//! applies queued commands and refreshes the snapshot in `maintain`, which the
//! owner calls on every loop iteration. A command's answer comes back on its own
//! channel, so the operator's tool can wait for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use crate::member::MemberStatus;

/// How often an idle array with a handle wants `maintain`, to pick up commands.
pub const COMMAND_POLL_NS: u64 = 100_000_000;

/// What `shale device list` shows of one array.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArrayStatus {
    /// "cache" or "capacity".
    pub role: String,
    pub redundancy: String,
    /// Label generation (0 without labels).
    pub generation: u64,
    pub members: Vec<MemberStatus>,
    pub rebuild: Option<RebuildStatus>,
    /// What a replacement member must be like (so a tool creating one sizes it as
    /// the array's members are, whatever its own defaults say).
    pub member_shape: MemberShape,
}

/// The shape of an array's members.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum MemberShape {
    #[default]
    Unknown,
    /// A block device of at least `bytes` (a cache mirror).
    Block { bytes: u64 },
    /// A zoned device of this geometry (a capacity member).
    Zoned(shale_device::ZoneGeometry),
}

/// A rebuild in progress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RebuildStatus {
    pub member: u32,
    /// Bytes rebuilt so far, and the bytes it will take in all (live data only).
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Recent rate, bytes per second.
    pub bytes_per_sec: f64,
}

/// An operator's command.
#[derive(Debug)]
pub enum Command<D> {
    /// Take a member out of service (`member`: its name as shown, or its slot).
    Fail { member: String },
    /// Put `new` in `old`'s slot and rebuild it.
    Replace { old: String, new: D, name: String },
}

/// The answer to a command: a sentence for the operator, or why it was refused.
pub type CommandResult = Result<String, String>;

pub(crate) struct Pending<D> {
    pub command: Command<D>,
    pub reply: Sender<CommandResult>,
}

struct Shared<D> {
    status: ArrayStatus,
    commands: Vec<Pending<D>>,
}

/// A cloneable handle on one array.
pub struct ArrayHandle<D> {
    shared: Arc<Mutex<Shared<D>>>,
    pending: Arc<AtomicBool>,
}

impl<D> Clone for ArrayHandle<D> {
    fn clone(&self) -> Self {
        ArrayHandle {
            shared: Arc::clone(&self.shared),
            pending: Arc::clone(&self.pending),
        }
    }
}

impl<D> std::fmt::Debug for ArrayHandle<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayHandle")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl<D> ArrayHandle<D> {
    pub(crate) fn new(status: ArrayStatus) -> ArrayHandle<D> {
        ArrayHandle {
            shared: Arc::new(Mutex::new(Shared {
                status,
                commands: Vec::new(),
            })),
            pending: Arc::new(AtomicBool::new(false)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared<D>> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The array as of its owner's last refresh.
    pub fn status(&self) -> ArrayStatus {
        self.lock().status.clone()
    }

    /// Queues a command; the answer arrives on the receiver once the owner's thread
    /// has applied it (the owner must be woken to run its loop).
    pub fn submit(&self, command: Command<D>) -> Receiver<CommandResult> {
        let (tx, rx) = channel();
        self.lock().commands.push(Pending { command, reply: tx });
        self.pending.store(true, Ordering::Release);
        rx
    }

    pub(crate) fn take_commands(&self) -> Vec<Pending<D>> {
        if !self.pending.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut self.lock().commands)
    }

    pub(crate) fn publish(&self, status: ArrayStatus) {
        self.lock().status = status;
    }
}

/// The slot a command names: a member's name as shown, or its slot number.
pub(crate) fn find_member(members: &[MemberStatus], which: &str) -> Result<u32, String> {
    if let Some(m) = members.iter().find(|m| m.name == which) {
        return Ok(m.index);
    }
    match which.parse::<u32>() {
        Ok(i) if (i as usize) < members.len() => Ok(i),
        _ => Err(format!(
            "no member {which:?}; members: {}",
            members
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
