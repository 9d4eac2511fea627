//! The seam between the NBD server and the engine: every volume is an export.
//!
//! Requests go straight into the engine thread's bounded queue; completions run on the
//! engine thread and hand the reply to the connection's writer. A full queue makes the
//! submitting connection wait (backpressure), never the engine.
//!
//! An export's id is its volume's uid, which no later volume shares: a connection
//! keeps naming the volume it negotiated, and the engine refuses its requests once
//! that volume is deleted, whatever volume took the slot or the name since.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use shale_device::{BlockDevice, ZonedDevice};
use shale_engine::{
    EngineError, Reply, Request, VolumeInfo, VolumeUid, ALLOCATION_QUERY_BYTES_MAX,
};
use shale_nbd::backend::{
    Backend, BackendError, BackendReply, BackendRequest, BlockSizes, Completion, ExportCaps,
    ExportId, ExportInfo,
};
use shale_nbd::proto::consts::{STATE_HOLE, STATE_ZERO};
use shale_nbd::proto::reply::Extent;

use crate::latency::Histogram;

pub type CacheDevice = Box<dyn BlockDevice + Send>;
pub type CapacityDevice = Box<dyn ZonedDevice + Send>;
/// The engine's shards on their threads (one shard: the one engine thread).
pub type Engine = shale_shards::Shards<CacheDevice, CapacityDevice>;

/// The engine, seen as a set of NBD exports.
#[derive(Debug)]
pub struct EngineBackend {
    engine: Arc<Engine>,
    volumes: RwLock<Vec<VolumeInfo>>,
    /// Volumes no new connection may negotiate (being deleted or shrunk).
    hidden: Mutex<HashSet<VolumeUid>>,
    /// Client-visible latency per volume, kept until the daemon stops.
    latency: RwLock<HashMap<VolumeUid, Arc<VolumeLatency>>>,
    payload_bytes_max: u32,
}

/// Latency of one volume's reads and writes, submit to completion.
#[derive(Debug, Default)]
pub struct VolumeLatency {
    pub read: Histogram,
    pub write: Histogram,
}

/// Keeps a volume hidden from new connections while it lives (see
/// [`EngineBackend::hide`]).
#[derive(Debug)]
pub struct Hidden<'a> {
    backend: &'a EngineBackend,
    uid: VolumeUid,
}

impl Drop for Hidden<'_> {
    fn drop(&mut self) {
        self.backend.hidden_set().remove(&self.uid);
    }
}

impl EngineBackend {
    pub fn new(engine: Arc<Engine>, payload_bytes_max: u32) -> Result<Self, EngineError> {
        let b = EngineBackend {
            engine,
            volumes: RwLock::new(Vec::new()),
            hidden: Mutex::default(),
            latency: RwLock::default(),
            payload_bytes_max,
        };
        b.refresh()?;
        Ok(b)
    }

    /// Re-reads the volume list (after an admin change).
    pub fn refresh(&self) -> Result<(), EngineError> {
        let list = match self.engine.call(Request::ListVolumes)? {
            Reply::Volumes(v) => v,
            other => {
                return Err(EngineError::Failed {
                    reason: format!("list volumes answered {other:?}"),
                })
            }
        };
        match self.volumes.write() {
            Ok(mut v) => *v = list,
            Err(p) => *p.into_inner() = list,
        }
        Ok(())
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    fn hidden_set(&self) -> std::sync::MutexGuard<'_, HashSet<VolumeUid>> {
        self.hidden.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hides volume `uid` from new connections until the guard drops. A connection
    /// is bound to its export before the server looks the export up a last time, so
    /// once this returns, every connection to `uid` is either counted by the server
    /// already or will fail to start.
    pub fn hide(&self, uid: VolumeUid) -> Hidden<'_> {
        self.hidden_set().insert(uid);
        Hidden { backend: self, uid }
    }

    /// The latency histograms of volume `uid` (created on first use).
    pub fn latency(&self, uid: VolumeUid) -> Arc<VolumeLatency> {
        if let Some(l) = self
            .latency
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&uid)
        {
            return Arc::clone(l);
        }
        Arc::clone(
            self.latency
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(uid)
                .or_default(),
        )
    }

    /// The export id of a volume.
    pub fn export_id(uid: VolumeUid) -> ExportId {
        ExportId(uid.0)
    }

    fn info(&self, v: &VolumeInfo) -> ExportInfo {
        ExportInfo {
            id: Self::export_id(v.uid),
            name: v.name.clone(),
            description: format!("Shale volume {} ({})", v.name, v.id),
            size_bytes: v.size_bytes,
            caps: ExportCaps {
                read_only: false,
                flush: true,
                fua: true,
                trim: true,
                write_zeroes: true,
                // One engine thread serves every connection and a flush is a barrier
                // over every write completed before it, whichever connection sent it.
                multi_conn: true,
            },
            // Any byte offset and length works: the engine does read-modify-write of
            // partial 4 KiB blocks (of partial units, on a volume mapped in units,
            // whose unit is what it prefers). A larger minimum would make strict
            // clients (libnbd) refuse byte-granular I/O the engine handles.
            block_sizes: BlockSizes {
                minimum: 1,
                // A dual volume takes blocks as they come (its sparse map).
                preferred: if v.layout.dual {
                    4096
                } else {
                    v.layout.map_unit_bytes() as u32
                },
                payload_max: self.payload_bytes_max,
            },
        }
    }

    fn volumes(&self) -> Vec<VolumeInfo> {
        match self.volumes.read() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

fn backend_error(offset: u64, e: EngineError) -> BackendError {
    match e {
        EngineError::NoSpace { .. } => BackendError::NoSpace { offset },
        EngineError::OutOfRange { .. }
        | EngineError::ZeroLength { .. }
        | EngineError::TooLarge { .. }
        | EngineError::NoSuchVolume { .. } => BackendError::Invalid {
            message: e.to_string(),
        },
        EngineError::ShuttingDown => BackendError::ShuttingDown,
        // The engine logged its failure once; each request failing after it is not
        // news.
        EngineError::Failed { .. } => BackendError::Io {
            offset,
            message: e.to_string(),
        },
        other => {
            tracing::error!(offset, error = %other, "I/O error");
            BackendError::Io {
                offset,
                message: other.to_string(),
            }
        }
    }
}

impl Backend for EngineBackend {
    fn exports(&self) -> Vec<ExportInfo> {
        let hidden = self.hidden_set();
        self.volumes()
            .iter()
            .filter(|v| !hidden.contains(&v.uid))
            .map(|v| self.info(v))
            .collect()
    }

    fn export(&self, name: &str) -> Option<ExportInfo> {
        let hidden = self.hidden_set();
        self.volumes()
            .iter()
            .find(|v| v.name == name && !hidden.contains(&v.uid))
            .map(|v| self.info(v))
    }

    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn submit(&self, export: ExportId, req: BackendRequest, done: Completion) {
        let volume = VolumeUid(export.0);
        // Trim and write-zeroes with FUA are a request followed by a flush: the engine
        // executes its queue in order, so the flush covers the request before it.
        let (request, offset, then_flush) = match req {
            BackendRequest::Read { offset, len } => (
                Request::Read {
                    volume,
                    offset,
                    len: u64::from(len),
                },
                offset,
                false,
            ),
            BackendRequest::Write { offset, data, fua } => (
                Request::Write {
                    volume,
                    offset,
                    data,
                    fua,
                },
                offset,
                false,
            ),
            BackendRequest::Flush => (Request::Flush, 0, false),
            BackendRequest::Trim { offset, len, fua } => (
                Request::Trim {
                    volume,
                    offset,
                    len: u64::from(len),
                },
                offset,
                fua,
            ),
            BackendRequest::WriteZeroes {
                offset, len, fua, ..
            } => (
                // NO_HOLE needs no special case: unmapped blocks read as zeros and
                // every later write allocates afresh (log-structured).
                Request::WriteZeroes {
                    volume,
                    offset,
                    len: u64::from(len),
                },
                offset,
                fua,
            ),
            BackendRequest::BlockStatus { offset, len } => (
                // NBD lets a server describe a prefix of the range; the client asks
                // again from where the reply ended.
                Request::Allocation {
                    volume,
                    offset,
                    len: u64::from(len).min(ALLOCATION_QUERY_BYTES_MAX),
                },
                offset,
                false,
            ),
        };
        let done = OnceCompletion::new(done);
        if then_flush {
            // The engine runs its queue in order and a flush waits for everything
            // queued before it, so the request's result is known when the flush ends.
            let first: Arc<std::sync::Mutex<Option<Result<(), EngineError>>>> = Arc::default();
            let first2 = Arc::clone(&first);
            let queued = self.engine.submit(
                request,
                Box::new(move |r| {
                    if let Ok(mut slot) = first2.lock() {
                        *slot = Some(r.map(|_| ()));
                    }
                }),
            );
            if let Err(e) = queued {
                done.call(Err(backend_error(offset, e)));
                return;
            }
            let done2 = done.clone();
            let queued = self.engine.submit(
                Request::Flush,
                Box::new(move |flush| {
                    let req = first
                        .lock()
                        .ok()
                        .and_then(|mut s| s.take())
                        .unwrap_or(Ok(()));
                    done2.call(match req.and(flush.map(|_| ())) {
                        Ok(()) => Ok(BackendReply::Done),
                        Err(e) => Err(backend_error(offset, e)),
                    });
                }),
            );
            if let Err(e) = queued {
                done.call(Err(backend_error(offset, e)));
            }
            return;
        }
        let done2 = done.clone();
        let timed = match &request {
            Request::Read { .. } => Some((self.latency(volume), false)),
            Request::Write { .. } => Some((self.latency(volume), true)),
            _ => None,
        };
        let started = Instant::now();
        let queued = self.engine.submit(
            request,
            Box::new(move |r| {
                if let Some((l, write)) = timed {
                    let h = if write { &l.write } else { &l.read };
                    h.record(started.elapsed());
                }
                done2.call(match r {
                    Ok(Reply::Read(data)) => Ok(BackendReply::Data(data)),
                    Ok(Reply::Allocation(extents)) => Ok(BackendReply::Extents(
                        extents.iter().filter_map(allocation_extent).collect(),
                    )),
                    Ok(_) => Ok(BackendReply::Done),
                    Err(e) => Err(backend_error(offset, e)),
                })
            }),
        );
        if let Err(e) = queued {
            // The engine is gone (shutting down): answer here, since the completion
            // handed to it was dropped with the request.
            done.call(Err(backend_error(offset, e)));
        }
    }
}

/// `base:allocation` flags (`NBD_STATE_HOLE`, `NBD_STATE_ZERO`) for one engine extent: unmapped blocks are holes that read
/// as zeros; mapped ones are data. `None` for a length NBD cannot carry (the engine
/// answers at most `ALLOCATION_QUERY_BYTES_MAX`, well inside `u32`).
fn allocation_extent(e: &shale_engine::Extent) -> Option<Extent> {
    Some(Extent {
        length: u32::try_from(e.len).ok()?,
        flags: if e.mapped { 0 } else { STATE_HOLE | STATE_ZERO },
    })
}

/// A completion that can be reached from two places (the engine's callback, or the
/// submitter when the engine refused the request) and runs once.
#[derive(Clone)]
struct OnceCompletion(Arc<std::sync::Mutex<Option<Completion>>>);

impl OnceCompletion {
    fn new(done: Completion) -> Self {
        OnceCompletion(Arc::new(std::sync::Mutex::new(Some(done))))
    }

    fn call(&self, r: Result<BackendReply, BackendError>) {
        let taken = match self.0.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(d) = taken {
            d(r);
        }
    }
}
