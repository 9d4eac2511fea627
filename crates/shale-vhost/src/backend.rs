//! [`BlkBackend`]: the virtio-blk device behind one vhost-user connection.
//!
//! Each virtqueue has its own thread (the library's vring worker, one queue per
//! thread) and its own `QueueCtx`. On a kick the thread pops descriptor
//! chains, parses them (`request.rs`), copies write payloads out of guest
//! memory and submits to the [`BlockTarget`] without waiting. The target's
//! callback, from whatever thread, puts the outcome on the queue's channel and
//! writes the queue's completion eventfd, which is registered on the same
//! thread's epoll; on that event the thread copies read data into guest memory,
//! writes the status byte, adds the chain to the used ring and signals the
//! guest (EVENT_IDX-aware). So the rings are only touched from their own thread
//! and the target never waits on the guest.
//!
//! Chains go to the used ring in the order they were popped, whatever order
//! the target finishes them in: a finished chain waits for the ones before it.
//! That keeps the used index exact for a restart. When Shale dies, QEMU rewinds
//! each queue to its used index and hands out again what lies beyond it; with
//! out-of-order completions a request finished late would be handed out twice
//! and one still in flight would be lost, hanging the guest's I/O. The cost is
//! head-of-line waiting behind a slow request of the same queue.
//!
//! Invariants:
//! - A popped chain is returned to the used ring exactly once, and after
//!   every chain popped before it, unless its queue's epoch moved on (device
//!   reset, a ring stop that timed out): then the outcome is dropped, because
//!   the ring belongs to a new driver state.
//! - `inflight` counts chains popped and not yet retired; popping pauses at
//!   `queue_inflight_max` / `queue_inflight_bytes_max` and resumes on completion.
//! - Lock order: `QueueCtx::ring`, then the vring's own lock.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tracing::{debug, warn};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringState, VringT};
use virtio_bindings::bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::{config_window, VhostOptions, CONFIG_WRITEBACK_OFFSET};
use crate::request::{
    self, gather, scatter, write_status, Op, Request, RequestLimits, Segment, STATUS_IOERR,
    STATUS_OK, STATUS_UNSUPP,
};
use crate::target::{BlockTarget, TargetError, TargetReply, TargetRequest};

/// Guest memory as the vhost-user library maps it (no dirty-page bitmap).
pub type GuestMem = GuestMemoryAtomic<GuestMemoryMmap<()>>;

/// Target requests submitted and not yet called back, across a server's
/// connections: a new connection waits for the old one's to finish, so a
/// stale write cannot land after a newer one.
#[derive(Debug, Default)]
pub(crate) struct Outstanding {
    count: Mutex<u64>,
    idle: Condvar,
}

impl Outstanding {
    fn lock(&self) -> MutexGuard<'_, u64> {
        self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self) {
        *self.lock() += 1;
    }

    fn done(&self) {
        let mut c = self.lock();
        *c = c.saturating_sub(1);
        if *c == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until nothing is outstanding or `timeout` passes; true if idle.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = self.lock();
        while *c > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            c = self
                .idle
                .wait_timeout(c, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    pub(crate) fn get(&self) -> u64 {
        *self.lock()
    }
}

/// What the completion path needs to finish a chain.
#[derive(Debug)]
struct Token {
    head: u16,
    epoch: u64,
    /// Position in the epoch's pop order.
    seq: u64,
    status: GuestAddress,
    /// Data bytes held (for the in-flight bound).
    bytes: u64,
    /// For reads: where the data goes and how much is expected.
    read: Option<(Vec<Segment>, u64)>,
}

#[derive(Debug)]
struct Done {
    token: Token,
    result: Result<TargetReply, TargetError>,
}

#[derive(Debug, Default)]
struct Inflight {
    requests: usize,
    bytes: u64,
}

/// A queue's side of its ring: the epoch, and chains finished out of order
/// waiting for the ones popped before them.
#[derive(Debug, Default)]
struct Ring {
    epoch: u64,
    /// Sequence number of the next chain popped in this epoch.
    popped: u64,
    /// Sequence number of the next chain to go to the used ring.
    published: u64,
    /// `(head, used_len)` of chains `published..`, `None` while unfinished.
    waiting: VecDeque<Option<(u16, u32)>>,
}

impl Ring {
    fn pop(&mut self) -> u64 {
        self.popped += 1;
        self.popped - 1
    }

    fn finished(&mut self, seq: u64, head: u16, used_len: u32) {
        let Some(at) = seq
            .checked_sub(self.published)
            .filter(|_| seq < self.popped)
        else {
            debug!(seq, head, "finished a chain the ring does not know");
            return;
        };
        let at = at as usize;
        if self.waiting.len() <= at {
            self.waiting.resize(at + 1, None);
        }
        self.waiting[at] = Some((head, used_len));
    }

    /// Hands `to` every finished chain whose predecessors have all gone, in
    /// pop order; true if there was any.
    fn release(&mut self, mut to: impl FnMut(u16, u32)) -> bool {
        let mut any = false;
        while let Some(Some((head, used_len))) = self.waiting.front().copied() {
            self.waiting.pop_front();
            self.published += 1;
            to(head, used_len);
            any = true;
        }
        any
    }

    /// Adds to the used ring what [`Ring::release`] lets go.
    fn publish(&mut self, queue: u16, state: &mut VringState<GuestMem>) -> bool {
        self.release(|head, used_len| add_used(queue, state, head, used_len))
    }

    /// A new epoch: what is in flight will be dropped when it finishes.
    fn abandon(&mut self) {
        *self = Ring {
            epoch: self.epoch + 1,
            ..Ring::default()
        };
    }
}

/// One virtqueue's state beside the library's vring.
#[derive(Debug)]
pub(crate) struct QueueCtx {
    index: u16,
    tx: Sender<Done>,
    rx: Receiver<Done>,
    /// Written by target callbacks; read on the queue's thread.
    wake: EventFd,
    /// The epoch (outcomes of chains popped in an older one are dropped) and
    /// the publication order. Held while popping and while adding to the used
    /// ring.
    ring: Mutex<Ring>,
    inflight: Mutex<Inflight>,
    drained: Condvar,
    /// Popping paused at the in-flight bound; a completion resumes it.
    starved: AtomicBool,
}

impl QueueCtx {
    fn new(index: u16) -> io::Result<QueueCtx> {
        // Unbounded, but never holds more than `inflight` (bounded) outcomes.
        let (tx, rx) = crossbeam_channel::unbounded();
        Ok(QueueCtx {
            index,
            tx,
            rx,
            wake: EventFd::new(EFD_NONBLOCK)?,
            ring: Mutex::new(Ring::default()),
            inflight: Mutex::new(Inflight::default()),
            drained: Condvar::new(),
            starved: AtomicBool::new(false),
        })
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn inflight(&self) -> MutexGuard<'_, Inflight> {
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn at_limit(&self, o: &VhostOptions) -> bool {
        let f = self.inflight();
        f.requests >= o.queue_inflight_max
            || (f.requests > 0 && f.bytes >= o.queue_inflight_bytes_max)
    }

    fn admit(&self, bytes: u64) {
        let mut f = self.inflight();
        f.requests += 1;
        f.bytes += bytes;
    }

    fn retire(&self, requests: usize, bytes: u64) {
        if requests == 0 {
            return;
        }
        let mut f = self.inflight();
        f.requests = f.requests.saturating_sub(requests);
        f.bytes = f.bytes.saturating_sub(bytes);
        if f.requests == 0 {
            self.drained.notify_all();
        }
    }

    /// Waits until every popped chain is retired or `timeout` passes.
    fn wait_drained(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut f = self.inflight();
        while f.requests > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            f = self
                .drained
                .wait_timeout(f, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Moves to a new epoch: outcomes of what is in flight will be dropped.
    fn abandon_inflight(&self) {
        self.ring().abandon();
    }
}

/// What to do with a parsed request.
enum Prepared {
    Submit(TargetRequest, Token),
    /// Finished on the spot (GET_ID, zero-length I/O, a payload that could not
    /// be read): `used_len` bytes were written to the guest.
    Immediate {
        head: u16,
        used_len: u32,
    },
}

/// The device behind one connection. Cheap to share: the library clones an
/// `Arc<BlkBackend>` into every vring thread.
pub struct BlkBackend {
    target: Arc<dyn BlockTarget>,
    options: VhostOptions,
    size_bytes: u64,
    read_only: bool,
    serial: [u8; request::ID_BYTES],
    acked: AtomicU64,
    event_idx: AtomicBool,
    writeback: AtomicBool,
    mem: RwLock<Option<GuestMem>>,
    queues: Vec<Arc<QueueCtx>>,
    outstanding: Arc<Outstanding>,
    /// The connection is over: nothing more is popped.
    closed: AtomicBool,
}

impl std::fmt::Debug for BlkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkBackend")
            .field("size_bytes", &self.size_bytes)
            .field("read_only", &self.read_only)
            .field("num_queues", &self.queues.len())
            .finish_non_exhaustive()
    }
}

impl BlkBackend {
    /// A device for `target`; `options` must have passed `validate`.
    pub(crate) fn new(
        target: Arc<dyn BlockTarget>,
        options: VhostOptions,
        outstanding: Arc<Outstanding>,
    ) -> io::Result<BlkBackend> {
        let queues = (0..options.num_queues)
            .map(|i| QueueCtx::new(i).map(Arc::new))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(BlkBackend {
            size_bytes: target.size_bytes(),
            read_only: target.read_only(),
            serial: options.serial_bytes(),
            writeback: AtomicBool::new(options.writeback),
            target,
            options,
            acked: AtomicU64::new(0),
            event_idx: AtomicBool::new(false),
            mem: RwLock::new(None),
            queues,
            outstanding,
            closed: AtomicBool::new(false),
        })
    }

    /// The epoll id of the completion eventfd on every vring thread: ids up to
    /// `num_queues` belong to the library.
    pub(crate) fn completion_event(&self) -> u16 {
        self.options.num_queues + 1
    }

    /// Registers each queue's completion eventfd on its thread's epoll.
    pub(crate) fn register_completions(
        &self,
        handlers: &[Arc<vhost_user_backend::VringEpollHandler<Arc<BlkBackend>>>],
    ) -> io::Result<()> {
        for (q, h) in self.queues.iter().zip(handlers) {
            h.register_listener(
                q.wake.as_raw_fd(),
                EventSet::IN,
                u64::from(self.completion_event()),
            )?;
        }
        Ok(())
    }

    /// Chains popped and not yet retired, per queue.
    pub fn inflight(&self) -> Vec<usize> {
        self.queues.iter().map(|q| q.inflight().requests).collect()
    }

    /// Drops whatever is in flight on every queue (device reset).
    fn abandon_inflight(&self) {
        self.queues.iter().for_each(|q| q.abandon_inflight());
    }

    /// The connection is gone: no chain is popped from now on, and the outcomes
    /// of those in flight are dropped. On return every chain ever popped is
    /// counted in `Outstanding` (popping and counting happen under the queue's
    /// ring lock, which this takes), so waiting for it to empty covers them.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.abandon_inflight();
    }

    /// The write cache mode in force: write-back only if the driver can flush.
    fn writeback_now(&self) -> bool {
        self.acked.load(Ordering::Acquire) & (1 << VIRTIO_BLK_F_FLUSH) != 0
            && self.writeback.load(Ordering::Acquire)
    }

    fn limits(&self) -> RequestLimits {
        self.options.limits(
            self.size_bytes,
            self.read_only,
            self.acked.load(Ordering::Acquire),
        )
    }

    fn memory(&self) -> Option<GuestMem> {
        self.mem
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Pops, parses and submits until the ring is empty (or the in-flight bound
    /// is reached), then re-enables notifications (EVENT_IDX) and checks again.
    fn process_queue(&self, q: &Arc<QueueCtx>, vring: &VringRwLock<GuestMem>) {
        let Some(atomic) = self.memory() else {
            return;
        };
        let mem = atomic.memory();
        let limits = self.limits();
        let event_idx = self.event_idx.load(Ordering::Acquire);
        loop {
            let mut submits = Vec::new();
            let mut more = false;
            {
                let mut ring = q.ring();
                if self.closed.load(Ordering::Acquire) {
                    return;
                }
                let mut state = vring.get_mut();
                if !state.get_queue().ready() || !state.is_enabled() {
                    return;
                }
                if event_idx {
                    if let Err(e) = state.disable_notification() {
                        debug!(queue = q.index, "disable_notification: {e}");
                    }
                }
                loop {
                    if q.at_limit(&self.options) {
                        q.starved.store(true, Ordering::Release);
                        break;
                    }
                    let Some(chain) = state.get_queue_mut().pop_descriptor_chain(mem.clone())
                    else {
                        break;
                    };
                    let head = chain.head_index();
                    let seq = ring.pop();
                    let prepared = match request::parse(head, chain, &*mem, &limits) {
                        Ok(req) => self.prepare(req, &mem, ring.epoch, seq),
                        Err(rej) => {
                            debug!(queue = q.index, head, "refused: {}", rej.error);
                            let written =
                                rej.status.is_some_and(|s| write_status(&*mem, s, rej.code));
                            Prepared::Immediate {
                                head,
                                used_len: u32::from(written),
                            }
                        }
                    };
                    match prepared {
                        Prepared::Submit(req, token) => {
                            // Counted here, under the ring lock (see `close`).
                            self.outstanding.add();
                            q.admit(token.bytes);
                            submits.push((req, token));
                        }
                        Prepared::Immediate { head, used_len } => {
                            ring.finished(seq, head, used_len);
                        }
                    }
                }
                let used = ring.publish(q.index, &mut state);
                if event_idx && !q.starved.load(Ordering::Acquire) {
                    more = state.enable_notification().unwrap_or(false);
                }
                if used {
                    notify(q.index, &mut state);
                }
            }
            for (req, token) in submits {
                self.submit(q, req, token);
            }
            if !more {
                return;
            }
        }
    }

    /// Turns a parsed request into a target request, or finishes it here.
    fn prepare(&self, req: Request, mem: &GuestMemoryMmap<()>, epoch: u64, seq: u64) -> Prepared {
        let Request { head, op, status } = req;
        let token = |bytes, read| Token {
            head,
            epoch,
            seq,
            status,
            bytes,
            read,
        };
        let immediate = |code: u8, data_len: u32| Prepared::Immediate {
            head,
            used_len: if write_status(mem, status, code) {
                data_len + 1
            } else {
                0
            },
        };
        match op {
            Op::Read { len: 0, .. }
            | Op::Write { len: 0, .. }
            | Op::Discard { len: 0, .. }
            | Op::WriteZeroes { len: 0, .. } => immediate(STATUS_OK, 0),
            Op::Read {
                offset,
                len,
                segments,
            } => Prepared::Submit(
                TargetRequest::Read { offset, len },
                token(len, Some((segments, len))),
            ),
            Op::Write {
                offset,
                len,
                segments,
            } => {
                // `len` is bounded by seg_max * size_max (checked by the parser).
                let mut data = vec![0u8; len as usize];
                if let Err(e) = gather(mem, &segments, &mut data) {
                    debug!(head, "write payload: {e}");
                    return immediate(STATUS_IOERR, 0);
                }
                let fua = !self.writeback_now();
                Prepared::Submit(TargetRequest::Write { offset, data, fua }, token(len, None))
            }
            Op::Flush => Prepared::Submit(TargetRequest::Flush, token(0, None)),
            Op::GetId { segments } => {
                let n: u32 = segments.iter().map(|s| s.len).sum();
                match scatter(mem, &segments, &self.serial) {
                    Ok(()) => immediate(STATUS_OK, n),
                    Err(_) => immediate(STATUS_IOERR, 0),
                }
            }
            // Write-through: durable when they complete, like writes.
            Op::Discard { offset, len } => Prepared::Submit(
                TargetRequest::Discard {
                    offset,
                    len,
                    fua: !self.writeback_now(),
                },
                token(0, None),
            ),
            Op::WriteZeroes { offset, len, unmap } => Prepared::Submit(
                TargetRequest::WriteZeroes {
                    offset,
                    len,
                    unmap,
                    fua: !self.writeback_now(),
                },
                token(0, None),
            ),
        }
    }

    /// Hands an admitted request to the target (already counted in `outstanding`).
    fn submit(&self, q: &Arc<QueueCtx>, req: TargetRequest, token: Token) {
        let q = Arc::clone(q);
        let outstanding = Arc::clone(&self.outstanding);
        self.target.submit(
            req,
            Box::new(move |result| {
                // The target is done with it: counted off first, so whoever
                // sees the used entry also sees the count without it.
                outstanding.done();
                // The receiver lives as long as the connection's backend; after
                // that the outcome has nowhere to go and is dropped.
                let _ = q.tx.send(Done { token, result });
                if let Err(e) = q.wake.write(1) {
                    warn!(queue = q.index, "completion eventfd: {e}");
                }
            }),
        );
    }

    /// Finishes every completed request of `q`: data and status into guest
    /// memory, chains to the used ring in pop order, one signal for the batch.
    fn complete(&self, q: &Arc<QueueCtx>, vring: &VringRwLock<GuestMem>) {
        // Consume the eventfd first: a completion sent after this read writes
        // it again, so none is left behind.
        let _ = q.wake.read();
        let mem = self.memory().map(|m| m.memory());
        let (mut retired, mut bytes) = (0usize, 0u64);
        {
            let mut ring = q.ring();
            let mut state = vring.get_mut();
            while let Ok(done) = q.rx.try_recv() {
                retired += 1;
                bytes += done.token.bytes;
                let Some(mem) = mem.as_ref() else {
                    continue;
                };
                if done.token.epoch != ring.epoch {
                    debug!(
                        queue = q.index,
                        head = done.token.head,
                        "dropping a stale completion"
                    );
                    continue;
                }
                let (head, seq) = (done.token.head, done.token.seq);
                let used_len = finish(mem, done);
                ring.finished(seq, head, used_len);
            }
            if ring.publish(q.index, &mut state) {
                notify(q.index, &mut state);
            }
        }
        q.retire(retired, bytes);
        if q.starved.swap(false, Ordering::AcqRel) {
            self.process_queue(q, vring);
        }
    }
}

/// Writes a target's outcome into guest memory; returns the bytes written.
fn finish(mem: &GuestMemoryMmap<()>, done: Done) -> u32 {
    let Done { token, result } = done;
    let (code, data_len) = match (token.read, result) {
        (Some((segments, len)), Ok(TargetReply::Data(data))) if data.len() as u64 == len => {
            match scatter(mem, &segments, &data) {
                Ok(()) => (STATUS_OK, u32::try_from(len).unwrap_or(u32::MAX - 1)),
                Err(e) => {
                    debug!(head = token.head, "read data: {e}");
                    (STATUS_IOERR, 0)
                }
            }
        }
        (Some((_, len)), Ok(reply)) => {
            warn!(
                head = token.head,
                len, "target answered a read with {reply:?}-shaped data of the wrong length"
            );
            (STATUS_IOERR, 0)
        }
        (None, Ok(_)) => (STATUS_OK, 0),
        (_, Err(TargetError::Unsupported { .. })) => (STATUS_UNSUPP, 0),
        (_, Err(e)) => {
            debug!(head = token.head, "target: {e}");
            (STATUS_IOERR, 0)
        }
    };
    if write_status(mem, token.status, code) {
        data_len + 1
    } else {
        0
    }
}

fn add_used(queue: u16, state: &mut VringState<GuestMem>, head: u16, len: u32) {
    if let Err(e) = state.add_used(head, len) {
        debug!(queue, head, "add_used: {e}");
    }
}

/// Signals the guest if it asked to be (EVENT_IDX) or always (without it).
fn notify(queue: u16, state: &mut VringState<GuestMem>) {
    match state.needs_notification() {
        Ok(false) => {}
        Ok(true) | Err(_) => {
            if let Err(e) = state.signal_used_queue() {
                debug!(queue, "signal_used_queue: {e}");
            }
        }
    }
}

impl VhostUserBackend for BlkBackend {
    type Bitmap = ();
    type Vring = VringRwLock<GuestMem>;

    fn num_queues(&self) -> usize {
        self.queues.len()
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.options.queue_size_max)
    }

    fn features(&self) -> u64 {
        self.options.features(self.read_only)
    }

    fn acked_features(&self, features: u64) {
        self.acked.store(features, Ordering::Release);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostOptions::protocol_features()
    }

    fn reset_device(&self) {
        self.abandon_inflight();
        self.acked.store(0, Ordering::Release);
        self.event_idx.store(false, Ordering::Release);
        self.writeback
            .store(self.options.writeback, Ordering::Release);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let space = self
            .options
            .config_space(self.size_bytes, self.writeback.load(Ordering::Acquire));
        config_window(&space, offset, size)
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        // Only `writeback` is writable (with VIRTIO_BLK_F_CONFIG_WCE).
        match buf {
            [wce] if offset == CONFIG_WRITEBACK_OFFSET => {
                self.writeback.store(*wce != 0, Ordering::Release);
                debug!(writeback = *wce != 0, "write cache mode set by the driver");
                Ok(())
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "config bytes {offset}..{} are read-only",
                    u64::from(offset) + buf.len() as u64
                ),
            )),
        }
    }

    fn update_memory(&self, mem: GuestMem) -> io::Result<()> {
        *self.mem.write().unwrap_or_else(PoisonError::into_inner) = Some(mem);
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One thread per queue, so each queue's completions run on its thread.
        (0..self.queues.len()).map(|i| 1u64 << i).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => Some(pair),
            Err(e) => {
                warn!("vring thread exit eventfd: {e}");
                None
            }
        }
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // GET_VRING_BASE: the frontend reads the ring's position after this, so
        // everything popped must be in the used ring first.
        let Some(q) = self.queues.get(queue_index as usize) else {
            return Ok(());
        };
        if !q.wait_drained(self.options.drain_timeout) {
            warn!(
                queue = queue_index,
                inflight = q.inflight().requests,
                "ring stopped with requests still at the target; their outcomes will be dropped"
            );
            q.abandon_inflight();
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Self::Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        // One queue per thread: the thread's only vring is the queue `thread_id`.
        let (Some(q), Some(vring)) = (self.queues.get(thread_id), vrings.first()) else {
            return Ok(());
        };
        match device_event {
            0 => self.process_queue(q, vring),
            e if e == self.completion_event() => self.complete(q, vring),
            other => debug!(queue = q.index, event = other, "unexpected event"),
        }
        // Errors stay here: an error would end the queue's thread.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;
    use proptest::prelude::*;

    proptest! {
        /// Whatever order chains finish in, they leave in the order they were
        /// popped, each once, and none before all earlier ones finished.
        #[test]
        fn chains_leave_in_pop_order(
            order in (1usize..64).prop_flat_map(|n| Just((0..n as u64).collect::<Vec<_>>()).prop_shuffle()),
        ) {
            let mut ring = Ring::default();
            for _ in 0..order.len() {
                ring.pop();
            }
            let mut out = Vec::new();
            let mut finished = vec![false; order.len()];
            for &seq in &order {
                ring.finished(seq, seq as u16, seq as u32 * 10);
                finished[seq as usize] = true;
                let before = out.len();
                ring.release(|h, l| out.push((h, l)));
                for &(h, _) in &out[before..] {
                    prop_assert!(finished[..=usize::from(h)].iter().all(|f| *f));
                }
            }
            let want: Vec<(u16, u32)> = (0..order.len() as u64).map(|s| (s as u16, s as u32 * 10)).collect();
            prop_assert_eq!(out, want);
        }
    }

    #[test]
    fn a_new_epoch_forgets_what_was_waiting() {
        let mut ring = Ring::default();
        let (a, b) = (ring.pop(), ring.pop());
        ring.finished(b, 7, 1);
        ring.abandon();
        assert_eq!(ring.epoch, 1);
        // Outcomes of the old epoch are not the ring's any more.
        ring.finished(a, 6, 1);
        assert!(!ring.release(|_, _| panic!("released a stale chain")));
        let c = ring.pop();
        assert_eq!(c, 0);
        ring.finished(c, 9, 2);
        let mut out = Vec::new();
        ring.release(|h, l| out.push((h, l)));
        assert_eq!(out, vec![(9, 2)]);
    }
}
