//! [`MemTarget`]: a [`BlockTarget`] over a `Vec<u8>` behind a mutex, the
//! reference for what a target must do and the target of the tests.
//!
//! By default a request completes inside `submit`. With
//! [`MemTarget::with_delays`] it completes on a worker thread after a per-request
//! delay drawn from a seeded generator, so completions come back out of order
//! and from a foreign thread, as they do from the engine. Discard and
//! write-zeroes zero the range (a discarded range reads as zeroes).

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::target::{BlockTarget, TargetDone, TargetError, TargetReply, TargetRequest};

/// Counters of what the target was asked, for tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemTargetStats {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub write_zeroes: u64,
}

#[derive(Debug)]
struct Store {
    bytes: Vec<u8>,
    stats: MemTargetStats,
    /// Offsets of the writes in the order they were carried out.
    write_offsets: Vec<u64>,
}

struct Delayed {
    due: Instant,
    req: TargetRequest,
    done: TargetDone,
}

/// An in-memory block target.
pub struct MemTarget {
    store: Arc<Mutex<Store>>,
    read_only: bool,
    /// With delays: the worker's queue, the delay range and the generator state.
    delays: Option<DelayLine>,
}

struct DelayLine {
    tx: Sender<Delayed>,
    delay_max: Duration,
    rng: Mutex<u64>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MemTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTarget")
            .field("size_bytes", &self.size_bytes())
            .field("read_only", &self.read_only)
            .field("delayed", &self.delays.is_some())
            .finish()
    }
}

impl MemTarget {
    /// A zeroed target of `size_bytes` that completes requests inside `submit`.
    pub fn new(size_bytes: usize) -> MemTarget {
        MemTarget {
            store: Arc::new(Mutex::new(Store {
                bytes: vec![0; size_bytes],
                stats: MemTargetStats::default(),
                write_offsets: Vec::new(),
            })),
            read_only: false,
            delays: None,
        }
    }

    /// A read-only target holding `bytes`.
    pub fn read_only(bytes: Vec<u8>) -> MemTarget {
        let mut t = MemTarget::new(0);
        t.lock().bytes = bytes;
        t.read_only = true;
        t
    }

    /// Requests complete on a worker thread after a delay in `[0, delay_max]`
    /// drawn from `seed`: several requests in flight complete out of order. A
    /// request's effect on the bytes happens when it completes.
    pub fn with_delays(mut self, delay_max: Duration, seed: u64) -> MemTarget {
        let (tx, rx) = crossbeam_channel::unbounded();
        let store = self.store.clone();
        let worker = std::thread::Builder::new()
            .name("mem-target".into())
            .spawn(move || delay_worker(&rx, &store))
            .ok();
        self.delays = Some(DelayLine {
            tx,
            delay_max,
            rng: Mutex::new(seed | 1),
            worker,
        });
        self
    }

    /// A copy of the bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock().bytes.clone()
    }

    /// Overwrites bytes at `offset` directly (test set-up).
    pub fn fill(&self, offset: usize, data: &[u8]) {
        let mut s = self.lock();
        if let Some(dst) = s.bytes.get_mut(offset..offset.saturating_add(data.len())) {
            dst.copy_from_slice(data);
        }
    }

    pub fn stats(&self) -> MemTargetStats {
        self.lock().stats
    }

    /// Offsets of the writes carried out, in the order they were.
    pub fn write_order(&self) -> Vec<u64> {
        self.lock().write_offsets.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for MemTarget {
    fn drop(&mut self) {
        if let Some(DelayLine { tx, worker, .. }) = self.delays.take() {
            // Closing the channel ends the worker once it has run what is queued.
            drop(tx);
            if let Some(w) = worker {
                let _ = w.join();
            }
        }
    }
}

fn delay_worker(rx: &Receiver<Delayed>, store: &Mutex<Store>) {
    let mut pending: Vec<Delayed> = Vec::new();
    loop {
        let next_due = pending.iter().map(|d| d.due).min();
        let got = match next_due {
            None => rx.recv().ok(),
            Some(due) => match rx.recv_deadline(due) {
                Ok(d) => Some(d),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    // Run the rest now, then stop.
                    for d in pending.drain(..) {
                        let r = execute(store, d.req);
                        (d.done)(r);
                    }
                    return;
                }
            },
        };
        match got {
            Some(d) => pending.push(d),
            None if next_due.is_none() => return,
            None => {}
        }
        let now = Instant::now();
        let mut i = 0;
        while i < pending.len() {
            if pending.get(i).is_some_and(|d| d.due <= now) {
                let d = pending.swap_remove(i);
                let r = execute(store, d.req);
                (d.done)(r);
            } else {
                i += 1;
            }
        }
    }
}

fn range(len_total: usize, offset: u64, len: u64) -> Result<std::ops::Range<usize>, TargetError> {
    let out = TargetError::OutOfRange { offset, len };
    let start = usize::try_from(offset).map_err(|_| out.clone())?;
    let n = usize::try_from(len).map_err(|_| out.clone())?;
    let end = start.checked_add(n).ok_or(out.clone())?;
    if end > len_total {
        return Err(out);
    }
    Ok(start..end)
}

fn execute(store: &Mutex<Store>, req: TargetRequest) -> Result<TargetReply, TargetError> {
    let mut s = store.lock().unwrap_or_else(PoisonError::into_inner);
    let total = s.bytes.len();
    match req {
        TargetRequest::Read { offset, len } => {
            let r = range(total, offset, len)?;
            s.stats.reads += 1;
            Ok(TargetReply::Data(
                s.bytes.get(r).unwrap_or_default().to_vec(),
            ))
        }
        TargetRequest::Write { offset, data, fua } => {
            let r = range(total, offset, data.len() as u64)?;
            s.stats.writes += 1;
            s.stats.fua_writes += u64::from(fua);
            s.write_offsets.push(offset);
            if let Some(dst) = s.bytes.get_mut(r) {
                dst.copy_from_slice(&data);
            }
            Ok(TargetReply::Done)
        }
        TargetRequest::Flush => {
            s.stats.flushes += 1;
            Ok(TargetReply::Done)
        }
        TargetRequest::Discard { offset, len, .. } => {
            let r = range(total, offset, len)?;
            s.stats.discards += 1;
            s.bytes.get_mut(r).unwrap_or_default().fill(0);
            Ok(TargetReply::Done)
        }
        TargetRequest::WriteZeroes { offset, len, .. } => {
            let r = range(total, offset, len)?;
            s.stats.write_zeroes += 1;
            s.bytes.get_mut(r).unwrap_or_default().fill(0);
            Ok(TargetReply::Done)
        }
    }
}

impl BlockTarget for MemTarget {
    fn size_bytes(&self) -> u64 {
        self.lock().bytes.len() as u64
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn submit(&self, req: TargetRequest, done: TargetDone) {
        if self.read_only && !matches!(req, TargetRequest::Read { .. } | TargetRequest::Flush) {
            done(Err(TargetError::ReadOnly));
            return;
        }
        match &self.delays {
            None => done(execute(&self.store, req)),
            Some(d) => {
                let delay = {
                    // xorshift64: cheap, seeded, good enough to shuffle completions.
                    let mut x = d.rng.lock().unwrap_or_else(PoisonError::into_inner);
                    *x ^= *x << 13;
                    *x ^= *x >> 7;
                    *x ^= *x << 17;
                    let span = d.delay_max.as_micros().max(1) as u64;
                    Duration::from_micros(*x % (span + 1))
                };
                let item = Delayed {
                    due: Instant::now() + delay,
                    req,
                    done,
                };
                if let Err(e) = d.tx.send(item) {
                    let item = e.into_inner();
                    (item.done)(Err(TargetError::ShuttingDown));
                }
            }
        }
    }
}
