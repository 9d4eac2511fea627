//! `MemBackend`: a thread-safe in-memory [`Backend`] with several exports,
//! executing requests on worker threads. It is the reference for what the
//! engine must do behind the seam, and the backend of the end-to-end tests.
//!
//! Storage is sparse, in 4 KiB blocks: an absent block is a hole that reads as
//! zeroes, so block status reports real holes. Trim and write-zeroes punch
//! holes for whole blocks (write-zeroes with `no_hole` allocates instead) and
//! zero the partial blocks at the edges. Everything is "durable" at once, so
//! flush is a no-op and `multi_conn` is safe.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::backend::{
    Backend, BackendError, BackendReply, BackendRequest, BlockSizes, Completion, ExportCaps,
    ExportId, ExportInfo,
};
use crate::proto::consts::{STATE_HOLE, STATE_ZERO};
use crate::proto::reply::Extent;

/// Granularity of allocation.
pub const MEM_BLOCK_BYTES: u64 = 4096;
/// Extents returned per block status request at most (fewer is always legal).
pub const MEM_EXTENTS_MAX: usize = 1024;

/// One export to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemExportSpec {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub read_only: bool,
}

impl MemExportSpec {
    pub fn new(name: &str, size_bytes: u64) -> MemExportSpec {
        MemExportSpec {
            name: name.into(),
            description: format!("in-memory export {name}"),
            size_bytes,
            read_only: false,
        }
    }
}

/// Worker threads and an optional artificial latency per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemBackendConfig {
    pub workers: usize,
    pub latency: Duration,
}

impl Default for MemBackendConfig {
    fn default() -> Self {
        MemBackendConfig {
            workers: 2,
            latency: Duration::ZERO,
        }
    }
}

#[derive(Debug, Default)]
struct Store {
    blocks: BTreeMap<u64, Box<[u8]>>,
    /// Byte ranges whose requests fail with EIO (fault injection for tests).
    faults: Vec<Range<u64>>,
}

#[derive(Debug)]
struct MemExport {
    info: ExportInfo,
    store: Mutex<Store>,
}

struct Job {
    export: usize,
    req: BackendRequest,
    done: Completion,
}

#[derive(Debug)]
struct Shared {
    exports: Vec<MemExport>,
    latency: Duration,
}

/// See the module documentation.
#[derive(Debug)]
pub struct MemBackend {
    shared: Arc<Shared>,
    // Unbounded on purpose: submit must never block, and each connection
    // already bounds its own in-flight requests.
    tx: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("export", &self.export)
            .field("req", &self.req)
            .finish()
    }
}

impl MemBackend {
    pub fn new(specs: Vec<MemExportSpec>, config: MemBackendConfig) -> MemBackend {
        let exports = specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| MemExport {
                info: ExportInfo {
                    id: ExportId(i as u64),
                    name: s.name,
                    description: s.description,
                    size_bytes: s.size_bytes,
                    caps: ExportCaps {
                        read_only: s.read_only,
                        multi_conn: true,
                        ..ExportCaps::default()
                    },
                    block_sizes: BlockSizes::default(),
                },
                store: Mutex::new(Store::default()),
            })
            .collect();
        let shared = Arc::new(Shared {
            exports,
            latency: config.latency,
        });
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let workers = (0..config.workers.max(1))
            .map(|i| {
                let rx: Receiver<Job> = rx.clone();
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("mem-backend-{i}"))
                    .spawn(move || {
                        for job in rx.iter() {
                            if !shared.latency.is_zero() {
                                std::thread::sleep(shared.latency);
                            }
                            let result = match shared.exports.get(job.export) {
                                Some(e) => e.execute(job.req),
                                None => Err(BackendError::Invalid {
                                    message: "export index out of range".into(),
                                }),
                            };
                            (job.done)(result);
                        }
                    })
                    .expect("spawning a backend worker thread")
            })
            .collect();
        MemBackend {
            shared,
            tx: Some(tx),
            workers,
        }
    }

    fn find(&self, name: &str) -> Option<&MemExport> {
        self.shared.exports.iter().find(|e| e.info.name == name)
    }

    /// Requests touching `range` of export `name` fail with EIO from now on.
    pub fn inject_io_error(&self, name: &str, range: Range<u64>) -> bool {
        match self.find(name) {
            Some(e) => {
                e.lock().faults.push(range);
                true
            }
            None => false,
        }
    }

    pub fn clear_faults(&self, name: &str) {
        if let Some(e) = self.find(name) {
            e.lock().faults.clear();
        }
    }

    /// Reads bytes straight from the store, bypassing the queue (for checks).
    pub fn read_direct(&self, name: &str, offset: u64, len: u32) -> Option<Vec<u8>> {
        let e = self.find(name)?;
        let store = e.lock();
        Some(read(&store, offset, len))
    }

    /// Bytes of memory held in allocated blocks, across all exports.
    pub fn allocated_bytes(&self) -> u64 {
        self.shared
            .exports
            .iter()
            .map(|e| e.lock().blocks.len() as u64 * MEM_BLOCK_BYTES)
            .sum()
    }
}

impl Drop for MemBackend {
    fn drop(&mut self) {
        self.tx = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Backend for MemBackend {
    fn exports(&self) -> Vec<ExportInfo> {
        self.shared.exports.iter().map(|e| e.info.clone()).collect()
    }

    fn export(&self, name: &str) -> Option<ExportInfo> {
        self.find(name).map(|e| e.info.clone())
    }

    fn submit(&self, export: ExportId, req: BackendRequest, done: Completion) {
        let index = export.0 as usize;
        if index >= self.shared.exports.len() {
            done(Err(BackendError::UnknownExport { id: export }));
            return;
        }
        match &self.tx {
            Some(tx) => {
                if let Err(crossbeam_channel::SendError(job)) = tx.send(Job {
                    export: index,
                    req,
                    done,
                }) {
                    (job.done)(Err(BackendError::ShuttingDown));
                }
            }
            None => done(Err(BackendError::ShuttingDown)),
        }
    }
}

impl MemExport {
    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        // A panic in another worker cannot leave the map half-updated in a
        // way that breaks memory safety; keep serving.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn execute(&self, req: BackendRequest) -> Result<BackendReply, BackendError> {
        let size = self.info.size_bytes;
        let (offset, len) = match &req {
            BackendRequest::Read { offset, len }
            | BackendRequest::Trim { offset, len, .. }
            | BackendRequest::WriteZeroes { offset, len, .. }
            | BackendRequest::BlockStatus { offset, len } => (*offset, u64::from(*len)),
            BackendRequest::Write { offset, data, .. } => (*offset, data.len() as u64),
            BackendRequest::Flush => (0, 0),
        };
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= size)
            .ok_or_else(|| BackendError::Invalid {
                message: format!("offset {offset} length {len} beyond size {size}"),
            })?;
        let writes = matches!(
            req,
            BackendRequest::Write { .. }
                | BackendRequest::Trim { .. }
                | BackendRequest::WriteZeroes { .. }
        );
        if writes && self.info.caps.read_only {
            return Err(BackendError::ReadOnly);
        }
        let mut store = self.lock();
        if let Some(f) = store
            .faults
            .iter()
            .find(|f| f.start < end && offset < f.end)
        {
            return Err(BackendError::Io {
                offset: f.start.max(offset),
                message: "injected fault".into(),
            });
        }
        Ok(match req {
            BackendRequest::Read { offset, len } => BackendReply::Data(read(&store, offset, len)),
            BackendRequest::Write { offset, data, .. } => {
                write(&mut store, offset, &data);
                BackendReply::Done
            }
            BackendRequest::Flush => BackendReply::Done,
            BackendRequest::Trim { offset, len, .. } => {
                zero(&mut store, offset, u64::from(len), false);
                BackendReply::Done
            }
            BackendRequest::WriteZeroes {
                offset,
                len,
                no_hole,
                ..
            } => {
                zero(&mut store, offset, u64::from(len), no_hole);
                BackendReply::Done
            }
            BackendRequest::BlockStatus { offset, len } => {
                BackendReply::Extents(block_status(&store, offset, u64::from(len)))
            }
        })
    }
}

/// Splits `[offset, offset+len)` into per-block pieces: (block, start in block, bytes).
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> {
    let end = offset.saturating_add(len);
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let block = pos / MEM_BLOCK_BYTES;
        let within = pos % MEM_BLOCK_BYTES;
        let n = (MEM_BLOCK_BYTES - within).min(end - pos);
        pos += n;
        Some((block, within as usize, n as usize))
    })
}

fn read(store: &Store, offset: u64, len: u32) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    let mut at = 0usize;
    for (block, within, n) in pieces(offset, u64::from(len)) {
        if let Some(b) = store.blocks.get(&block) {
            out[at..at + n].copy_from_slice(&b[within..within + n]);
        }
        at += n;
    }
    out
}

fn write(store: &mut Store, offset: u64, data: &[u8]) {
    let mut at = 0usize;
    for (block, within, n) in pieces(offset, data.len() as u64) {
        let b = store
            .blocks
            .entry(block)
            .or_insert_with(|| vec![0u8; MEM_BLOCK_BYTES as usize].into_boxed_slice());
        b[within..within + n].copy_from_slice(&data[at..at + n]);
        at += n;
    }
}

fn zero(store: &mut Store, offset: u64, len: u64, allocate: bool) {
    for (block, within, n) in pieces(offset, len) {
        let whole = within == 0 && n as u64 == MEM_BLOCK_BYTES;
        if whole && !allocate {
            store.blocks.remove(&block);
        } else if let Some(b) = store.blocks.get_mut(&block) {
            b[within..within + n].fill(0);
        } else if allocate {
            store.blocks.insert(
                block,
                vec![0u8; MEM_BLOCK_BYTES as usize].into_boxed_slice(),
            );
        }
    }
}

fn push_extent(out: &mut Vec<Extent>, length: u64, flags: u32) {
    if length == 0 {
        return;
    }
    // Lengths come from a u32 request, so they always fit.
    let length = u32::try_from(length).unwrap_or(u32::MAX);
    match out.last_mut() {
        Some(last) if last.flags == flags => last.length = last.length.saturating_add(length),
        _ => out.push(Extent { length, flags }),
    }
}

fn block_status(store: &Store, offset: u64, len: u64) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let end = offset.saturating_add(len);
    let mut pos = offset;
    let first = offset / MEM_BLOCK_BYTES;
    let last = end.div_ceil(MEM_BLOCK_BYTES);
    for (&block, _) in store.blocks.range(first..last) {
        let start = (block * MEM_BLOCK_BYTES).max(pos);
        push_extent(&mut out, start - pos, STATE_HOLE | STATE_ZERO);
        let stop = ((block + 1) * MEM_BLOCK_BYTES).min(end);
        push_extent(&mut out, stop - start, 0);
        pos = stop;
        if out.len() >= MEM_EXTENTS_MAX {
            return out;
        }
    }
    push_extent(&mut out, end - pos, STATE_HOLE | STATE_ZERO);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn backend() -> MemBackend {
        MemBackend::new(
            vec![
                MemExportSpec::new("a", 1 << 20),
                MemExportSpec::new("b", 10_000),
            ],
            MemBackendConfig::default(),
        )
    }

    fn call(b: &MemBackend, id: u64, req: BackendRequest) -> Result<BackendReply, BackendError> {
        let (tx, rx) = mpsc::channel();
        b.submit(ExportId(id), req, Box::new(move |r| drop(tx.send(r))));
        rx.recv().expect("completion")
    }

    #[test]
    fn unaligned_write_read_back() {
        let b = backend();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            call(
                &b,
                0,
                BackendRequest::Write {
                    offset: 1000,
                    data: data.clone(),
                    fua: false
                }
            ),
            Ok(BackendReply::Done)
        );
        let Ok(BackendReply::Data(got)) = call(
            &b,
            0,
            BackendRequest::Read {
                offset: 1000,
                len: 10_000,
            },
        ) else {
            panic!("read failed");
        };
        assert_eq!(got, data);
        let Ok(BackendReply::Data(edge)) = call(
            &b,
            0,
            BackendRequest::Read {
                offset: 0,
                len: 1001,
            },
        ) else {
            panic!("read failed");
        };
        assert!(edge[..1000].iter().all(|&x| x == 0));
        assert_eq!(edge[1000], data[0]);
    }

    #[test]
    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn trim_and_zero_make_holes() {
        let b = backend();
        call(
            &b,
            0,
            BackendRequest::Write {
                offset: 0,
                data: vec![7; 16384],
                fua: false,
            },
        )
        .expect("write");
        assert_eq!(
            call(
                &b,
                0,
                BackendRequest::BlockStatus {
                    offset: 0,
                    len: 32768
                }
            ),
            Ok(BackendReply::Extents(vec![
                Extent {
                    length: 16384,
                    flags: 0
                },
                Extent {
                    length: 16384,
                    flags: STATE_HOLE | STATE_ZERO
                },
            ]))
        );
        call(
            &b,
            0,
            BackendRequest::Trim {
                offset: 2048,
                len: 8192,
                fua: false,
            },
        )
        .expect("trim");
        // Block 1 removed, blocks 0 and 2 partially zeroed.
        assert_eq!(
            call(
                &b,
                0,
                BackendRequest::BlockStatus {
                    offset: 0,
                    len: 16384
                }
            ),
            Ok(BackendReply::Extents(vec![
                Extent {
                    length: 4096,
                    flags: 0
                },
                Extent {
                    length: 4096,
                    flags: STATE_HOLE | STATE_ZERO
                },
                Extent {
                    length: 8192,
                    flags: 0
                },
            ]))
        );
        let Ok(BackendReply::Data(d)) = call(
            &b,
            0,
            BackendRequest::Read {
                offset: 0,
                len: 16384,
            },
        ) else {
            panic!()
        };
        assert!(d[..2048].iter().all(|&x| x == 7));
        assert!(d[2048..10240].iter().all(|&x| x == 0));
        assert!(d[10240..].iter().all(|&x| x == 7));
        call(
            &b,
            0,
            BackendRequest::WriteZeroes {
                offset: 0,
                len: 16384,
                no_hole: true,
                fua: false,
            },
        )
        .expect("zero");
        assert_eq!(
            call(
                &b,
                0,
                BackendRequest::BlockStatus {
                    offset: 100,
                    len: 200
                }
            ),
            Ok(BackendReply::Extents(vec![Extent {
                length: 200,
                flags: 0
            }]))
        );
    }

    #[test]
    fn errors() {
        let b = MemBackend::new(
            vec![MemExportSpec {
                read_only: true,
                ..MemExportSpec::new("ro", 4096)
            }],
            MemBackendConfig::default(),
        );
        assert_eq!(
            call(
                &b,
                0,
                BackendRequest::Write {
                    offset: 0,
                    data: vec![1],
                    fua: false
                }
            ),
            Err(BackendError::ReadOnly)
        );
        assert!(matches!(
            call(
                &b,
                0,
                BackendRequest::Read {
                    offset: 4000,
                    len: 200
                }
            ),
            Err(BackendError::Invalid { .. })
        ));
        assert_eq!(
            call(&b, 9, BackendRequest::Flush),
            Err(BackendError::UnknownExport { id: ExportId(9) })
        );
        assert!(b.inject_io_error("ro", 100..200));
        assert_eq!(
            call(
                &b,
                0,
                BackendRequest::Read {
                    offset: 0,
                    len: 4096
                }
            ),
            Err(BackendError::Io {
                offset: 100,
                message: "injected fault".into()
            })
        );
        b.clear_faults("ro");
        assert!(call(
            &b,
            0,
            BackendRequest::Read {
                offset: 0,
                len: 4096
            }
        )
        .is_ok());
    }

    #[test]
    fn exports_listed_with_caps() {
        let b = backend();
        let e = b.exports();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].id, ExportId(1));
        assert!(e[0].caps.multi_conn);
        assert_eq!(b.export("b").map(|e| e.size_bytes), Some(10_000));
        assert!(b.export("zz").is_none());
    }
}
