//! EngineThread: one thread running the engine loop behind a bounded request queue.
//! Completions are callbacks run on the engine thread; admin calls (volumes, stats,
//! flush, self-check) travel the same queue, so no locks touch the data path.
//!
//! A failed engine keeps its thread and answers every request with `Failed`; the
//! owner learns of the failure from [`EngineThread::failure`] (set once, by the
//! thread, when it sees the engine fail or dies), so a daemon can report it and exit
//! instead of serving errors forever.

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};
use shale_device::{BlockDevice, ZonedDevice};

use crate::{Clock, Completion, Engine, EngineError, Reply, Request};

/// Longest the idle loop sleeps while a device has work of its own pending.
const DEVICE_WAKE_MAX_NS: u64 = 200_000_000;

enum Msg {
    Req(Request, Completion),
    Shutdown,
}

/// Handle to an engine running on its own thread.
pub struct EngineThread<C, Z> {
    tx: Sender<Msg>,
    handle: Option<JoinHandle<Result<(C, Z), EngineError>>>,
    failure: Arc<Mutex<Option<String>>>,
}

impl<C, Z> std::fmt::Debug for EngineThread<C, Z> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineThread")
            .field("queued", &self.tx.len())
            .finish()
    }
}

impl<C, Z> EngineThread<C, Z>
where
    C: BlockDevice + Send + 'static,
    Z: ZonedDevice + Send + 'static,
{
    /// Moves `engine` onto a new thread with a request queue of `queue_depth`.
    #[allow(
        clippy::disallowed_methods,
        reason = "the engine's one thread, spawned outside the engine by its owner"
    )]
    pub fn spawn<K: Clock + Send + 'static>(
        engine: Engine<C, Z, K>,
        queue_depth: usize,
    ) -> std::io::Result<Self> {
        let (tx, rx) = bounded(queue_depth.max(1));
        let failure: Arc<Mutex<Option<String>>> = Arc::default();
        let failure2 = Arc::clone(&failure);
        let handle = std::thread::Builder::new()
            .name("shale-engine".into())
            .spawn(move || run(engine, rx, &failure2))?;
        Ok(EngineThread {
            tx,
            handle: Some(handle),
            failure,
        })
    }

    /// Why the engine stopped serving, once it has: a fatal error (every request
    /// fails from then on, and nothing more reaches the devices) or a dead thread.
    pub fn failure(&self) -> Option<String> {
        let f = self
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        f.or_else(|| {
            self.handle
                .as_ref()
                .filter(|h| h.is_finished())
                .map(|_| "the engine thread ended unexpectedly".to_string())
        })
    }

    /// Queues a request, blocking while the queue is full (backpressure).
    pub fn submit(&self, req: Request, done: Completion) -> Result<(), EngineError> {
        self.tx
            .send(Msg::Req(req, done))
            .map_err(|_| EngineError::ShuttingDown)
    }

    /// Queues a request unless the queue is full; gives the completion back if so.
    pub fn try_submit(&self, req: Request, done: Completion) -> Result<(), (Request, Completion)> {
        match self.tx.try_send(Msg::Req(req, done)) {
            Ok(()) => Ok(()),
            Err(
                TrySendError::Full(Msg::Req(r, d)) | TrySendError::Disconnected(Msg::Req(r, d)),
            ) => Err((r, d)),
            Err(_) => unreachable!("only requests are sent here"),
        }
    }

    /// Submits and waits for the reply.
    pub fn call(&self, req: Request) -> Result<Reply, EngineError> {
        let (tx, rx) = bounded(1);
        self.submit(
            req,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        rx.recv().map_err(|_| EngineError::ShuttingDown)?
    }

    /// Drains, shuts the engine down cleanly and returns the devices.
    pub fn shutdown(mut self) -> Result<(C, Z), EngineError> {
        let _ = self.tx.send(Msg::Shutdown);
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => Err(EngineError::Failed {
                reason: "engine thread panicked".into(),
            }),
        }
    }
}

fn run<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    mut engine: Engine<C, Z, K>,
    rx: Receiver<Msg>,
    failure: &Mutex<Option<String>>,
) -> Result<(C, Z), EngineError> {
    let batch = engine.config().requests_per_poll_max as usize;
    let mut reported = false;
    loop {
        if !reported {
            if let Some(reason) = engine.failure() {
                *failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.into());
                reported = true;
            }
        }
        let mut shutdown = false;
        // Block for work only when the engine has nothing to do, and only as long
        // as the devices' own work allows.
        if engine.is_idle() {
            let msg = match engine.device_wake_ns() {
                shale_device::MAINTAIN_IDLE => {
                    rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                }
                0 => Err(RecvTimeoutError::Timeout),
                ns => rx.recv_timeout(Duration::from_nanos(ns.min(DEVICE_WAKE_MAX_NS))),
            };
            match msg {
                Ok(Msg::Req(r, d)) => engine.submit(r, d),
                Ok(Msg::Shutdown) | Err(RecvTimeoutError::Disconnected) => shutdown = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        while !shutdown && engine.queued() < batch {
            match rx.try_recv() {
                Ok(Msg::Req(r, d)) => engine.submit(r, d),
                Ok(Msg::Shutdown) | Err(TryRecvError::Disconnected) => shutdown = true,
                Err(TryRecvError::Empty) => break,
            }
        }
        if shutdown {
            // Requests still in the channel are failed; queued ones complete first.
            while let Ok(m) = rx.try_recv() {
                if let Msg::Req(_, d) = m {
                    d(Err(EngineError::ShuttingDown));
                }
            }
            return engine.shutdown();
        }
        if !engine.poll() && !engine.is_idle() {
            engine.wait_io();
        }
    }
}
