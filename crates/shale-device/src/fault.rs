//! A block device for testing the durability boundary: it keeps what the host has
//! written (the volatile image) apart from what would survive a power loss (the
//! durable image), and can crash, tear writes, fail I/O and delay completions, all
//! reproducibly from a seed.
//!
//! Model:
//! - A write is applied to the volatile image when submitted (unless an error is
//!   injected for it) and recorded as *pending*.
//! - A write *completes* when its completion is released by `poll` (or at once for
//!   `write_at`). A completed FUA write is durable. A flush, when it completes,
//!   makes durable every write that had completed when the flush was submitted;
//!   a synchronous `flush` does so for every completed write.
//! - Durable pending writes are folded into the durable image once no older
//!   non-durable write precedes them, so a crash replays pending writes in
//!   submission order and a durable write is never overwritten by an older one.
//! - A crash builds the post-power-loss image: the durable image plus a chosen
//!   subset of the non-durable pending writes (possibly one torn), in submission
//!   order. Requests still in flight vanish (their completions never arrive), every
//!   handle of the old "power cycle" fails with `DeviceError::Crashed`, and a new
//!   handle sees volatile = durable = the post-crash image.
//!
//! State lives behind an `Arc<Mutex<..>>` shared by the device handle and any
//! number of [`FaultController`]s, so a simulator can crash or reconfigure a device
//! after handing the device itself to an engine.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::check::{check_async_io, check_geometry, check_range};
use crate::mem::{MEM_MAX_IO_BYTES, MEM_QUEUE_DEPTH};
use crate::sparse::SparseImage;
use crate::{BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoOpKind, IoRequest};

/// Identifies one pending write (or discard) for the life of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

/// The granularity at which a torn write is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TearUnit {
    Sector512,
    Block4096,
}

impl TearUnit {
    pub fn bytes(self) -> u64 {
        match self {
            TearUnit::Sector512 => 512,
            TearUnit::Block4096 => 4096,
        }
    }
}

/// Which non-durable pending writes survive a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashMode {
    /// None: only what was durable.
    DropAll,
    /// All of them, as if a flush had completed just before the power loss.
    KeepAll,
    /// Each one independently with probability 1/2.
    KeepRandomSubset { seed: u64 },
    /// Exactly these (ids from [`FaultController::pending_writes`]).
    Keep(Vec<WriteId>),
    /// A random subset as in `KeepRandomSubset`, and one randomly chosen pending
    /// write longer than `unit` applied only in part: a prefix of 1..n-1 units.
    Tear { seed: u64, unit: TearUnit },
    /// The writes in `keep`, and write `id` cut after its first `keep_bytes`
    /// bytes (a multiple of 512 smaller than its length).
    TearWrite {
        keep: Vec<WriteId>,
        id: WriteId,
        keep_bytes: u64,
    },
}

/// What a crash did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Non-durable pending writes applied in full.
    pub applied: Vec<WriteId>,
    /// The torn write and how many of its bytes were applied.
    pub torn: Option<(WriteId, u64)>,
    /// Non-durable pending writes lost.
    pub dropped: Vec<WriteId>,
    /// Requests in flight at the crash whose completions were never delivered.
    pub lost_in_flight: usize,
}

/// Bad arguments to [`FaultController::crash`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CrashError {
    #[error("write {id:?} is not pending (durable, never written, or already gone)")]
    UnknownWrite { id: WriteId },
    #[error("cannot tear write {id:?} of {len} bytes after {keep_bytes} bytes (need a multiple of 512 below {len})")]
    TearOutOfRange {
        id: WriteId,
        keep_bytes: u64,
        len: u64,
    },
}

/// One pending (not yet folded into the durable image) write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingWriteInfo {
    pub id: WriteId,
    pub offset: u64,
    pub len: u64,
    /// Its completion has been delivered.
    pub completed: bool,
    /// Made durable by FUA or a flush (it survives every crash).
    pub durable: bool,
    pub fua: bool,
    /// A discard (applies zeros) rather than a write.
    pub discard: bool,
}

/// An injected I/O error: requests of the chosen kinds overlapping
/// `offset..offset+len` fail with [`DeviceError::Injected`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorRule {
    pub reads: bool,
    pub writes: bool,
    pub offset: u64,
    pub len: u64,
    /// How many more requests fail; `None` for all of them.
    pub remaining: Option<u32>,
}

/// How long completions are held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Latency {
    #[default]
    None,
    /// Each completion is held for a number of `poll` calls drawn from
    /// `min..=max` (a waiting poll advances this clock itself, without sleeping).
    Polls { min: u32, max: u32 },
    /// Each completion is held for a wall-clock duration drawn from `min..=max`.
    Duration { min: Duration, max: Duration },
}

/// Counters since the device was created (across crashes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounters {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub bytes_written: u64,
    pub injected_errors: u64,
    pub crashes: u64,
    /// Writes (and discards) currently pending, durable or not.
    pub writes_pending: u64,
    /// Requests currently in flight.
    pub in_flight: u64,
}

#[derive(Debug)]
struct Pending {
    id: WriteId,
    offset: u64,
    len: u64,
    /// `None` for a discard.
    data: Option<Box<[u8]>>,
    completed: bool,
    durable: bool,
    fua: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    Tick(u64),
    At(Instant),
}

#[derive(Debug)]
enum Effect {
    None,
    /// A write completing: it becomes completed (and durable if FUA).
    Write(WriteId),
    /// A flush completing: these writes become durable.
    Flush(Vec<WriteId>),
}

#[derive(Debug)]
struct Held {
    seq: u64,
    release: Release,
    completion: IoCompletion,
    effect: Effect,
}

#[derive(Debug)]
struct State {
    info: DeviceInfo,
    epoch: u64,
    volatile: SparseImage,
    durable: SparseImage,
    pending: VecDeque<Pending>,
    next_write_id: u64,
    rng: ChaCha8Rng,
    rules: Vec<ErrorRule>,
    read_error_ppm: u32,
    write_error_ppm: u32,
    flush_skip: u32,
    flush_failures: u32,
    latency: Latency,
    held: Vec<Held>,
    next_seq: u64,
    tick: u64,
    counters: FaultCounters,
}

/// A fault-injecting in-memory [`BlockDevice`].
#[derive(Debug)]
pub struct FaultDevice {
    shared: Arc<Mutex<State>>,
    epoch: u64,
    info: DeviceInfo,
}

/// Controls a [`FaultDevice`] from outside (crash, faults, inspection); cloneable.
#[derive(Debug, Clone)]
pub struct FaultController {
    shared: Arc<Mutex<State>>,
}

fn lock(shared: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock can only come from a bug in this module; the
    // state is still the best information there is.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn overlaps(a_off: u64, a_len: u64, b_off: u64, b_len: u64) -> bool {
    a_off < b_off.saturating_add(b_len) && b_off < a_off.saturating_add(a_len)
}

impl State {
    /// Decides whether this request fails by injection (rules first, then rate).
    fn inject(&mut self, op: IoOpKind, offset: u64, len: u64) -> bool {
        let is_read = op == IoOpKind::Read;
        let hit = self.rules.iter_mut().position(|r| {
            (if is_read { r.reads } else { r.writes })
                && r.remaining != Some(0)
                && overlaps(offset, len, r.offset, r.len)
        });
        let fail = if let Some(i) = hit {
            if let Some(n) = self.rules[i].remaining.as_mut() {
                *n -= 1;
            }
            true
        } else {
            let ppm = if is_read {
                self.read_error_ppm
            } else {
                self.write_error_ppm
            };
            ppm > 0 && self.rng.gen_range(0..1_000_000u32) < ppm
        };
        if fail {
            self.counters.injected_errors += 1;
        }
        fail
    }

    /// Decides whether this flush fails by injection.
    fn inject_flush(&mut self) -> bool {
        if self.flush_skip > 0 {
            self.flush_skip -= 1;
            return false;
        }
        if self.flush_failures > 0 {
            self.flush_failures -= 1;
            self.counters.injected_errors += 1;
            return true;
        }
        false
    }

    fn release_time(&mut self) -> Release {
        match self.latency {
            Latency::None => Release::Tick(self.tick),
            Latency::Polls { min, max } => {
                let hold = if max > min {
                    self.rng.gen_range(min..=max)
                } else {
                    min
                };
                Release::Tick(self.tick + u64::from(hold))
            }
            Latency::Duration { min, max } => {
                let hold = if max > min {
                    let span = (max - min).as_nanos() as u64;
                    min + Duration::from_nanos(self.rng.gen_range(0..=span))
                } else {
                    min
                };
                Release::At(Instant::now() + hold)
            }
        }
    }

    fn hold(&mut self, completion: IoCompletion, effect: Effect) {
        let release = self.release_time();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.held.push(Held {
            seq,
            release,
            completion,
            effect,
        });
    }

    fn record_write(&mut self, offset: u64, data: Option<&[u8]>, len: u64, fua: bool) -> WriteId {
        let id = WriteId(self.next_write_id);
        self.next_write_id += 1;
        match data {
            Some(d) => self.volatile.write(offset, d),
            None => self.volatile.zero(offset, len),
        }
        self.pending.push_back(Pending {
            id,
            offset,
            len,
            data: data.map(Box::from),
            completed: false,
            durable: false,
            fua,
        });
        id
    }

    fn pending_mut(&mut self, id: WriteId) -> Option<&mut Pending> {
        // Ids increase along the queue.
        let i = self.pending.partition_point(|p| p.id < id);
        self.pending.get_mut(i).filter(|p| p.id == id)
    }

    fn complete_write(&mut self, id: WriteId) {
        if let Some(p) = self.pending_mut(id) {
            p.completed = true;
            if p.fua {
                p.durable = true;
            }
        }
        self.fold();
    }

    fn completed_ids(&self) -> Vec<WriteId> {
        self.pending
            .iter()
            .filter(|p| p.completed && !p.durable)
            .map(|p| p.id)
            .collect()
    }

    fn make_durable(&mut self, ids: &[WriteId]) {
        for &id in ids {
            if let Some(p) = self.pending_mut(id) {
                p.durable = true;
            }
        }
        self.fold();
    }

    /// Moves the durable prefix of the pending queue into the durable image.
    fn fold(&mut self) {
        while self.pending.front().is_some_and(|p| p.durable) {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            apply(&mut self.durable, &p, p.len);
        }
    }

    /// Moves released completions to `out`, applying their effects in release
    /// order. Returns how many.
    fn release(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let now = match self.latency {
            Latency::Duration { .. } => Some(Instant::now()),
            _ => None,
        };
        let tick = self.tick;
        let due = |r: &Release| match *r {
            Release::Tick(t) => t <= tick,
            Release::At(at) => now.is_none_or(|n| at <= n),
        };
        let mut ready: Vec<Held> = Vec::new();
        let mut i = 0;
        while i < self.held.len() {
            if due(&self.held[i].release) {
                ready.push(self.held.swap_remove(i));
            } else {
                i += 1;
            }
        }
        ready.sort_by_key(|h| {
            (
                match h.release {
                    Release::Tick(t) => (t, None),
                    Release::At(at) => (0, Some(at)),
                },
                h.seq,
            )
        });
        let n = ready.len();
        for h in ready {
            match h.effect {
                Effect::None => {}
                Effect::Write(id) => self.complete_write(id),
                Effect::Flush(ids) => self.make_durable(&ids),
            }
            out.push(h.completion);
        }
        n
    }

    fn crash(&mut self, mode: &CrashMode) -> Result<CrashReport, CrashError> {
        let n = self.pending.len();
        let optional: Vec<usize> = (0..n).filter(|&i| !self.pending[i].durable).collect();
        let mut keep = vec![false; n];
        let mut torn: Option<(usize, u64)> = None;
        let index_of = |pending: &VecDeque<Pending>, id: WriteId| {
            pending
                .iter()
                .position(|p| p.id == id && !p.durable)
                .ok_or(CrashError::UnknownWrite { id })
        };
        match mode {
            CrashMode::DropAll => {}
            CrashMode::KeepAll => optional.iter().for_each(|&i| keep[i] = true),
            CrashMode::KeepRandomSubset { seed } => {
                let mut rng = ChaCha8Rng::seed_from_u64(*seed);
                optional.iter().for_each(|&i| keep[i] = rng.gen_bool(0.5));
            }
            CrashMode::Keep(ids) => {
                for &id in ids {
                    keep[index_of(&self.pending, id)?] = true;
                }
            }
            CrashMode::Tear { seed, unit } => {
                let mut rng = ChaCha8Rng::seed_from_u64(*seed);
                optional.iter().for_each(|&i| keep[i] = rng.gen_bool(0.5));
                let unit = unit.bytes();
                let candidates: Vec<usize> = optional
                    .iter()
                    .copied()
                    .filter(|&i| self.pending[i].len > unit)
                    .collect();
                if !candidates.is_empty() {
                    let i = candidates[rng.gen_range(0..candidates.len())];
                    let units = self.pending[i].len.div_ceil(unit);
                    let kept = rng.gen_range(1..units) * unit;
                    torn = Some((i, kept));
                }
            }
            CrashMode::TearWrite {
                keep: ids,
                id,
                keep_bytes,
            } => {
                for &k in ids {
                    keep[index_of(&self.pending, k)?] = true;
                }
                let i = index_of(&self.pending, *id)?;
                let len = self.pending[i].len;
                if *keep_bytes >= len || keep_bytes % 512 != 0 {
                    return Err(CrashError::TearOutOfRange {
                        id: *id,
                        keep_bytes: *keep_bytes,
                        len,
                    });
                }
                torn = Some((i, *keep_bytes));
            }
        }
        let mut report = CrashReport {
            lost_in_flight: self.held.len(),
            ..CrashReport::default()
        };
        for (i, p) in self.pending.iter().enumerate() {
            if let Some((t, kept)) = torn.filter(|&(t, _)| t == i) {
                debug_assert_eq!(t, i);
                apply(&mut self.durable, p, kept);
                report.torn = Some((p.id, kept));
            } else if p.durable || keep[i] {
                apply(&mut self.durable, p, p.len);
                if !p.durable {
                    report.applied.push(p.id);
                }
            } else {
                report.dropped.push(p.id);
            }
        }
        self.pending.clear();
        self.held.clear();
        self.volatile = self.durable.clone();
        self.epoch += 1;
        self.counters.crashes += 1;
        Ok(report)
    }
}

/// Applies the first `bytes` of a pending write (or discard) to an image.
fn apply(img: &mut SparseImage, p: &Pending, bytes: u64) {
    match &p.data {
        Some(d) => img.write(p.offset, &d[..bytes as usize]),
        None if bytes > 0 => img.zero(p.offset, bytes),
        None => {}
    }
}

impl FaultDevice {
    /// A zero-filled device (same geometry rules as [`crate::MemDevice::new`]);
    /// every random choice it makes derives from `seed`.
    pub fn new(
        size_bytes: u64,
        logical_block_size: u32,
        seed: u64,
    ) -> Result<FaultDevice, DeviceError> {
        check_geometry(size_bytes, logical_block_size)?;
        let info = DeviceInfo {
            name: "fault".to_string(),
            size_bytes,
            logical_block_size,
            max_io_bytes: MEM_MAX_IO_BYTES,
            queue_depth: MEM_QUEUE_DEPTH,
        };
        let state = State {
            info: info.clone(),
            epoch: 0,
            volatile: SparseImage::new(size_bytes),
            durable: SparseImage::new(size_bytes),
            pending: VecDeque::new(),
            next_write_id: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            rules: Vec::new(),
            read_error_ppm: 0,
            write_error_ppm: 0,
            flush_skip: 0,
            flush_failures: 0,
            latency: Latency::None,
            held: Vec::new(),
            next_seq: 0,
            tick: 0,
            counters: FaultCounters::default(),
        };
        Ok(FaultDevice {
            shared: Arc::new(Mutex::new(state)),
            epoch: 0,
            info,
        })
    }

    /// A handle for crashing and reconfiguring this device from outside.
    pub fn controller(&self) -> FaultController {
        FaultController {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Simulates a power loss (see [`CrashMode`]); afterwards this handle is the
    /// restarted device, and any other handle fails with `Crashed`.
    pub fn crash(&mut self, mode: &CrashMode) -> Result<CrashReport, CrashError> {
        let mut st = lock(&self.shared);
        let report = st.crash(mode)?;
        self.epoch = st.epoch;
        Ok(report)
    }

    pub fn counters(&self) -> FaultCounters {
        self.controller().counters()
    }

    pub fn pending_writes(&self) -> Vec<PendingWriteInfo> {
        self.controller().pending_writes()
    }

    fn state(&self, op: IoOpKind) -> Result<MutexGuard<'_, State>, DeviceError> {
        let st = lock(&self.shared);
        if st.epoch != self.epoch {
            return Err(DeviceError::Crashed { op });
        }
        Ok(st)
    }
}

impl FaultController {
    /// Simulates a power loss; returns what happened and the restarted device.
    /// Every existing handle fails with `Crashed` from now on.
    pub fn crash(&self, mode: &CrashMode) -> Result<(CrashReport, FaultDevice), CrashError> {
        let mut st = lock(&self.shared);
        let report = st.crash(mode)?;
        let dev = FaultDevice {
            shared: Arc::clone(&self.shared),
            epoch: st.epoch,
            info: st.info.clone(),
        };
        Ok((report, dev))
    }

    pub fn add_error_rule(&self, rule: ErrorRule) {
        lock(&self.shared).rules.push(rule);
    }

    /// Removes every error rule and rate and pending flush failure.
    pub fn clear_errors(&self) {
        let mut st = lock(&self.shared);
        st.rules.clear();
        st.read_error_ppm = 0;
        st.write_error_ppm = 0;
        st.flush_skip = 0;
        st.flush_failures = 0;
    }

    /// Fails reads / writes at random at these rates (parts per million; seeded).
    pub fn set_error_rate(&self, read_ppm: u32, write_ppm: u32) {
        let mut st = lock(&self.shared);
        st.read_error_ppm = read_ppm.min(1_000_000);
        st.write_error_ppm = write_ppm.min(1_000_000);
    }

    /// After `skip` more successful flushes, the next `count` flushes fail (and
    /// make nothing durable). Lets a test fail exactly the second flush of a
    /// flush-write-flush sequence.
    pub fn fail_flushes(&self, skip: u32, count: u32) {
        let mut st = lock(&self.shared);
        st.flush_skip = skip;
        st.flush_failures = count;
    }

    pub fn set_latency(&self, latency: Latency) {
        lock(&self.shared).latency = latency;
    }

    pub fn counters(&self) -> FaultCounters {
        let st = lock(&self.shared);
        FaultCounters {
            writes_pending: st.pending.len() as u64,
            in_flight: st.held.len() as u64,
            ..st.counters
        }
    }

    /// Pending writes in submission order (the candidates a crash may keep or drop).
    pub fn pending_writes(&self) -> Vec<PendingWriteInfo> {
        lock(&self.shared)
            .pending
            .iter()
            .map(|p| PendingWriteInfo {
                id: p.id,
                offset: p.offset,
                len: p.len,
                completed: p.completed,
                durable: p.durable,
                fua: p.fua,
                discard: p.data.is_none(),
            })
            .collect()
    }

    /// Reads what a crash with `CrashMode::DropAll` would leave (for oracles).
    pub fn read_durable(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let st = lock(&self.shared);
        check_range(&st.info, IoOpKind::Read, offset, buf.len() as u64)?;
        // Durable-but-unfolded pending writes belong to the durable state too.
        let mut img_bytes = vec![0u8; buf.len()];
        st.durable.read(offset, &mut img_bytes);
        for p in st.pending.iter().filter(|p| p.durable) {
            if !overlaps(p.offset, p.len, offset, buf.len() as u64) {
                continue;
            }
            let from = p.offset.max(offset);
            let to = (p.offset + p.len).min(offset + buf.len() as u64);
            let dst = &mut img_bytes[(from - offset) as usize..(to - offset) as usize];
            match &p.data {
                Some(d) => {
                    dst.copy_from_slice(&d[(from - p.offset) as usize..(to - p.offset) as usize])
                }
                None => dst.fill(0),
            }
        }
        buf.copy_from_slice(&img_bytes);
        Ok(())
    }
}

impl BlockDevice for FaultDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        let Ok(mut st) = self.state(IoOpKind::Submit) else {
            // A handle from before a crash: the request goes nowhere, as on a
            // machine that lost power; `poll` reports the crash.
            return;
        };
        let tag = req.tag;
        let (completion, effect) = match req.op {
            IoOp::Read { offset, mut buf } => {
                st.counters.reads += 1;
                let mut r =
                    check_async_io(&st.info, IoOpKind::Read, offset, buf.as_ptr(), buf.len());
                if r.is_ok() {
                    if st.inject(IoOpKind::Read, offset, buf.len() as u64) {
                        r = Err(DeviceError::Injected {
                            op: IoOpKind::Read,
                            offset,
                        });
                    } else {
                        st.volatile.read(offset, &mut buf);
                    }
                }
                (
                    IoCompletion {
                        tag,
                        buf: Some(buf),
                        result: r,
                    },
                    Effect::None,
                )
            }
            IoOp::Write { offset, buf, fua } => {
                st.counters.writes += 1;
                let len = buf.len() as u64;
                let mut r =
                    check_async_io(&st.info, IoOpKind::Write, offset, buf.as_ptr(), buf.len());
                let mut effect = Effect::None;
                if r.is_ok() {
                    if st.inject(IoOpKind::Write, offset, len) {
                        r = Err(DeviceError::Injected {
                            op: IoOpKind::Write,
                            offset,
                        });
                    } else {
                        st.counters.bytes_written += len;
                        st.counters.fua_writes += u64::from(fua);
                        effect = Effect::Write(st.record_write(offset, Some(&buf), len, fua));
                    }
                }
                (
                    IoCompletion {
                        tag,
                        buf: Some(buf),
                        result: r,
                    },
                    effect,
                )
            }
            IoOp::Flush => {
                st.counters.flushes += 1;
                if st.inject_flush() {
                    (
                        IoCompletion {
                            tag,
                            buf: None,
                            result: Err(DeviceError::Injected {
                                op: IoOpKind::Flush,
                                offset: 0,
                            }),
                        },
                        Effect::None,
                    )
                } else {
                    let ids = st.completed_ids();
                    (
                        IoCompletion {
                            tag,
                            buf: None,
                            result: Ok(()),
                        },
                        Effect::Flush(ids),
                    )
                }
            }
            IoOp::Discard { offset, len } => {
                st.counters.discards += 1;
                let r = check_range(&st.info, IoOpKind::Discard, offset, len);
                let effect = match r {
                    Ok(()) => Effect::Write(st.record_write(offset, None, len, false)),
                    Err(_) => Effect::None,
                };
                (
                    IoCompletion {
                        tag,
                        buf: None,
                        result: r,
                    },
                    effect,
                )
            }
        };
        st.hold(completion, effect);
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let mut st = self.state(IoOpKind::Submit)?;
        let target = min_complete.min(st.held.len());
        let mut added = st.release(out);
        while added < target {
            // Waiting: advance the poll clock, or sleep until the next release.
            match st.latency {
                Latency::Duration { .. } => {
                    let next = st
                        .held
                        .iter()
                        .filter_map(|h| match h.release {
                            Release::At(at) => Some(at),
                            Release::Tick(_) => None,
                        })
                        .min();
                    let wait = next.map(|at| at.saturating_duration_since(Instant::now()));
                    drop(st);
                    if let Some(w) = wait.filter(|w| !w.is_zero()) {
                        std::thread::sleep(w);
                    }
                    st = self.state(IoOpKind::Submit)?;
                    if wait.is_none() {
                        // Only tick-released requests are left (latency was
                        // changed while they were held): let the clock run.
                        st.tick += 1;
                    }
                }
                _ => st.tick += 1,
            }
            added += st.release(out);
        }
        st.tick += 1;
        Ok(added)
    }

    fn in_flight(&self) -> usize {
        self.state(IoOpKind::Submit).map_or(0, |st| st.held.len())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let mut st = self.state(IoOpKind::Read)?;
        check_range(&st.info, IoOpKind::Read, offset, buf.len() as u64)?;
        st.counters.reads += 1;
        if st.inject(IoOpKind::Read, offset, buf.len() as u64) {
            return Err(DeviceError::Injected {
                op: IoOpKind::Read,
                offset,
            });
        }
        st.volatile.read(offset, buf);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        let mut st = self.state(IoOpKind::Write)?;
        let len = buf.len() as u64;
        check_range(&st.info, IoOpKind::Write, offset, len)?;
        st.counters.writes += 1;
        if st.inject(IoOpKind::Write, offset, len) {
            return Err(DeviceError::Injected {
                op: IoOpKind::Write,
                offset,
            });
        }
        st.counters.bytes_written += len;
        let id = st.record_write(offset, Some(buf), len, false);
        st.complete_write(id);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        let mut st = self.state(IoOpKind::Flush)?;
        st.counters.flushes += 1;
        if st.inject_flush() {
            return Err(DeviceError::Injected {
                op: IoOpKind::Flush,
                offset: 0,
            });
        }
        let ids = st.completed_ids();
        st.make_durable(&ids);
        Ok(())
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let mut st = self.state(IoOpKind::Discard)?;
        check_range(&st.info, IoOpKind::Discard, offset, len)?;
        st.counters.discards += 1;
        let id = st.record_write(offset, None, len, false);
        st.complete_write(id);
        Ok(())
    }
}

#[cfg(test)]
#[path = "fault_tests.rs"]
mod tests;
