//! One cache device shared by the engine shards of a pool, each through a view of its
//! own. The device holds every shard's metadata (superblock, volume table,
//! checkpoints, journal, L2P pages) in a window of its own, then one area of chunks
//! all the shards share:
//!
//! ```text
//! [shard 0's metadata][shard 1's metadata]...[chunk 0][chunk 1]...[chunk n-1]
//!  meta bytes each                            chunk bytes each
//! ```
//!
//! View `i` is its metadata window, then every chunk, rotated so that its chunk 0 is
//! the device's chunk `i * (chunks / shards)`: the run a shard owns at format starts
//! at its chunk 0. Which chunks a shard may write is the engine's business (region
//! state Foreign for the others: `shale-engine`'s `space/lend.rs`); the view only
//! translates addresses and routes each completion to the view that submitted it.
//! The engine places its chunks right after its metadata (`data_start` = the
//! window), so the split is found again from shard 0's superblock alone.
//!
//! The views share the device behind a mutex, held for one submission, one poll or
//! one synchronous call, as `SharedZones` does for a capacity device
//! ([`SharedCache::split`]). A cache has no state of its own to share (no zones), so
//! where the device can be opened once per view (a file), each view may have a
//! handle of its own instead ([`SharedCache::own_handles`]): no lock at all, each
//! shard its own I/O ring, as in windows.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use crate::tags::Tags;
use crate::{BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoOpKind, IoRequest};

/// Non-blocking polls a waiting view makes before it blocks at the device.
const SPINS: u32 = 256;

/// How a shared cache device is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSplit {
    pub shards: u32,
    /// Each shard's metadata window: where its chunks begin in its view.
    pub meta_bytes: u64,
    pub chunk_bytes: u64,
    /// Chunks in the shared area.
    pub chunks: u32,
    /// The size each view reports (what the engine's superblock records): its
    /// window, the chunks, and a tail no request reaches.
    pub view_bytes: u64,
}

impl CacheSplit {
    /// Bytes of the device the split uses.
    pub fn device_bytes(&self) -> u64 {
        u64::from(self.shards) * self.meta_bytes + u64::from(self.chunks) * self.chunk_bytes
    }

    /// Chunks between one shard's chunk 0 and the next's.
    pub fn per(&self) -> u32 {
        self.chunks / self.shards.max(1)
    }

    /// The device chunk view `view` calls `chunk`.
    pub fn device_chunk(&self, view: usize, chunk: u32) -> u32 {
        ((u64::from(chunk) + u64::from(self.per()) * view as u64) % u64::from(self.chunks)) as u32
    }

    /// What view `view` calls device chunk `chunk`.
    pub fn view_chunk(&self, view: usize, chunk: u32) -> u32 {
        let n = u64::from(self.chunks);
        ((u64::from(chunk) + n - (u64::from(self.per()) * view as u64) % n) % n) as u32
    }

    fn check(&self, size: u64, lbs: u64) -> Result<(), String> {
        let aligned = [self.meta_bytes, self.chunk_bytes, self.view_bytes]
            .iter()
            .all(|b| b % lbs == 0);
        if self.shards == 0
            || self.chunks < self.shards
            || self.meta_bytes == 0
            || self.chunk_bytes == 0
            || !aligned
            || self.view_bytes < self.meta_bytes + u64::from(self.chunks) * self.chunk_bytes
            || self.device_bytes() > size
        {
            return Err(format!(
                "{self:?} does not fit a device of {size} bytes in blocks of {lbs}"
            ));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Shared<D> {
    inner: D,
    /// The inner tag of each request in flight: its view and the view's own tag.
    tags: Tags<(usize, u64)>,
    /// Completions polled from the device, waiting for their view's next poll.
    done: Vec<VecDeque<IoCompletion>>,
}

/// How a view reaches the device.
#[derive(Debug)]
enum Backend<D> {
    /// One device for all views, behind a mutex; completions routed by view.
    Shared(Arc<Mutex<Shared<D>>>),
    /// A handle of the view's own.
    Own(D),
}

/// One shard's view of a shared cache device (see the module docs).
#[derive(Debug)]
pub struct SharedCache<D: BlockDevice> {
    backend: Backend<D>,
    view: usize,
    split: CacheSplit,
    info: DeviceInfo,
    /// Requests refused before reaching the device, answered by the next poll.
    early: VecDeque<IoCompletion>,
    /// This view's requests at the device.
    in_flight: usize,
}

impl<D: BlockDevice> SharedCache<D> {
    /// `split.shards` views of `inner`.
    pub fn split(inner: D, split: CacheSplit) -> Result<Vec<SharedCache<D>>, String> {
        let i = inner.info().clone();
        split.check(i.size_bytes, u64::from(i.logical_block_size))?;
        let n = split.shards as usize;
        let shared = Arc::new(Mutex::new(Shared {
            inner,
            tags: Tags::new(),
            done: (0..n).map(|_| VecDeque::new()).collect(),
        }));
        Ok((0..n)
            .map(|view| SharedCache {
                backend: Backend::Shared(Arc::clone(&shared)),
                view,
                split,
                info: DeviceInfo {
                    name: format!("{}[shard {view}]", i.name),
                    size_bytes: split.view_bytes,
                    ..i.clone()
                },
                early: VecDeque::new(),
                in_flight: 0,
            })
            .collect())
    }

    /// One view on each of `handles`, each a handle of its own on the same device
    /// (view `i` on `handles[i]`): nothing is shared between them.
    pub fn own_handles(handles: Vec<D>, split: CacheSplit) -> Result<Vec<SharedCache<D>>, String> {
        if handles.len() != split.shards as usize {
            return Err(format!(
                "{} handles for {} shards",
                handles.len(),
                split.shards
            ));
        }
        handles
            .into_iter()
            .enumerate()
            .map(|(view, d)| {
                let i = d.info().clone();
                split.check(i.size_bytes, u64::from(i.logical_block_size))?;
                Ok(SharedCache {
                    backend: Backend::Own(d),
                    view,
                    split,
                    info: DeviceInfo {
                        name: format!("{}[shard {view}]", i.name),
                        size_bytes: split.view_bytes,
                        ..i
                    },
                    early: VecDeque::new(),
                    in_flight: 0,
                })
            })
            .collect()
    }

    /// How the device is divided.
    pub fn layout(&self) -> CacheSplit {
        self.split
    }

    /// The device back: this view's own handle, or the shared device once every
    /// other view is dropped (this view back if not).
    pub fn into_inner(self) -> Result<D, Box<SharedCache<D>>> {
        match self.backend {
            Backend::Own(d) => Ok(d),
            Backend::Shared(s) => match Arc::try_unwrap(s) {
                Ok(m) => Ok(m.into_inner().unwrap_or_else(PoisonError::into_inner).inner),
                Err(shared) => Err(Box::new(SharedCache {
                    backend: Backend::Shared(shared),
                    ..self
                })),
            },
        }
    }

    /// Runs `f` on the device: this view's own, or the shared one under its lock.
    fn with<T>(&mut self, f: impl FnOnce(&mut D) -> T) -> T {
        match &mut self.backend {
            Backend::Own(d) => f(d),
            Backend::Shared(s) => f(&mut s.lock().unwrap_or_else(PoisonError::into_inner).inner),
        }
    }

    /// The device offset of `offset..offset + len`, which must lie in this view's
    /// metadata window or in one chunk (its chunks are contiguous on the device only
    /// up to the wrap).
    fn offset(&self, op: IoOpKind, offset: u64, len: u64) -> Result<u64, DeviceError> {
        let s = &self.split;
        let out = || DeviceError::OutOfRange {
            op,
            offset,
            len,
            size: s.view_bytes,
        };
        let end = offset.checked_add(len).ok_or_else(out)?;
        if end <= s.meta_bytes {
            return Ok(self.view as u64 * s.meta_bytes + offset);
        }
        if offset < s.meta_bytes || end > s.meta_bytes + u64::from(s.chunks) * s.chunk_bytes {
            return Err(out());
        }
        let rel = offset - s.meta_bytes;
        let chunk = rel / s.chunk_bytes;
        if len > 0 && (end - s.meta_bytes - 1) / s.chunk_bytes != chunk {
            return Err(out());
        }
        let device = s.device_chunk(self.view, chunk as u32);
        Ok(u64::from(s.shards) * s.meta_bytes
            + u64::from(device) * s.chunk_bytes
            + rel % s.chunk_bytes)
    }

    /// Moves this view's routed completions into `out`, after one poll of the device
    /// for at least `wait` completions (0: without blocking).
    fn collect(&mut self, out: &mut Vec<IoCompletion>, wait: usize) -> Result<usize, DeviceError> {
        let shared = match &self.backend {
            Backend::Shared(s) => Arc::clone(s),
            Backend::Own(_) => return Ok(0),
        };
        let mut polled = Vec::new();
        let mine: Vec<IoCompletion> = {
            let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
            let wait = if s.done[self.view].is_empty() {
                wait
            } else {
                0
            };
            s.inner.poll(&mut polled, wait)?;
            for mut c in polled {
                let Some((view, tag)) = s.tags.take(c.tag) else {
                    continue;
                };
                c.tag = tag;
                s.done[view].push_back(c);
            }
            s.done[self.view].drain(..).collect()
        };
        let n = mine.len();
        out.extend(mine);
        self.in_flight -= n;
        Ok(n)
    }
}

impl<D: BlockDevice> BlockDevice for SharedCache<D> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        let tag = req.tag;
        let op = match req.op {
            IoOp::Read { offset, buf } => {
                match self.offset(IoOpKind::Read, offset, buf.len() as u64) {
                    Ok(at) => IoOp::Read { offset: at, buf },
                    Err(e) => return self.refuse(tag, Some(buf), e),
                }
            }
            IoOp::Write { offset, buf, fua } => {
                match self.offset(IoOpKind::Write, offset, buf.len() as u64) {
                    Ok(at) => IoOp::Write {
                        offset: at,
                        buf,
                        fua,
                    },
                    Err(e) => return self.refuse(tag, Some(buf), e),
                }
            }
            IoOp::Discard { offset, len } => match self.offset(IoOpKind::Discard, offset, len) {
                Ok(at) => IoOp::Discard { offset: at, len },
                Err(e) => return self.refuse(tag, None, e),
            },
            IoOp::Flush => IoOp::Flush,
        };
        let view = self.view;
        match &mut self.backend {
            Backend::Own(d) => d.submit(IoRequest { tag, op }),
            Backend::Shared(shared) => {
                let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                let inner_tag = s.tags.insert((view, tag));
                s.inner.submit(IoRequest { tag: inner_tag, op });
                drop(s);
                self.in_flight += 1;
            }
        }
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let early = self.early.len();
        out.extend(self.early.drain(..));
        if let Backend::Own(d) = &mut self.backend {
            return Ok(early + d.poll(out, min_complete.saturating_sub(early))?);
        }
        let want = min_complete.saturating_sub(early).min(self.in_flight);
        let mut n = self.collect(out, 0)?;
        let mut tries = 0;
        while n < want {
            tries += 1;
            let wait = if tries > SPINS { 1 } else { 0 };
            if wait == 0 {
                std::thread::yield_now();
            }
            n += self.collect(out, wait)?;
        }
        Ok(early + n)
    }

    fn in_flight(&self) -> usize {
        let own = match &self.backend {
            Backend::Own(d) => d.in_flight(),
            Backend::Shared(_) => self.in_flight,
        };
        own + self.early.len()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let at = self.offset(IoOpKind::Read, offset, buf.len() as u64)?;
        self.with(|d| d.read_at(at, buf))
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        let at = self.offset(IoOpKind::Write, offset, buf.len() as u64)?;
        self.with(|d| d.write_at(at, buf))
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        self.with(|d| d.flush())
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let at = self.offset(IoOpKind::Discard, offset, len)?;
        self.with(|d| d.discard(at, len))
    }

    fn maintain(&mut self) -> u64 {
        self.with(|d| d.maintain())
    }

    fn read_rebuilt(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        attempt: u32,
    ) -> Result<(), DeviceError> {
        let at = self.offset(IoOpKind::Read, offset, buf.len() as u64)?;
        self.with(|d| d.read_rebuilt(at, buf, attempt))
    }
}

impl<D: BlockDevice> SharedCache<D> {
    fn refuse(&mut self, tag: u64, buf: Option<crate::IoBuf>, e: DeviceError) {
        self.early.push_back(IoCompletion {
            tag,
            buf,
            result: Err(e),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, MemDevice};

    const K: u64 = 4096;

    fn split() -> CacheSplit {
        CacheSplit {
            shards: 3,
            meta_bytes: 4 * K,
            chunk_bytes: 2 * K,
            chunks: 7,
            view_bytes: 4 * K + 7 * 2 * K + K,
        }
    }

    fn views() -> Vec<SharedCache<MemDevice>> {
        let dev = MemDevice::new(3 * 4 * K + 7 * 2 * K, 4096).expect("test setup");
        SharedCache::split(dev, split()).expect("test setup")
    }

    #[test]
    fn each_view_has_its_own_metadata_and_shares_the_rotated_chunks() {
        let mut v = views();
        assert_eq!(v[1].info().size_bytes, split().view_bytes);
        assert_eq!(split().per(), 2);
        // Metadata: the same view offset is a different place for each view.
        for (i, view) in v.iter_mut().enumerate() {
            view.write_at(0, &[i as u8 + 1; 4096]).expect("test setup");
        }
        for (i, view) in v.iter_mut().enumerate() {
            let mut b = [0u8; 4096];
            view.read_at(0, &mut b).expect("test setup");
            assert_eq!(b, [i as u8 + 1; 4096]);
        }
        // View 1's chunk 0 is the device's chunk 2, which view 0 calls chunk 2 and
        // view 2 calls chunk 5 ((5 + 4) % 7).
        v[1].write_at(4 * K, &[9u8; 8192]).expect("test setup");
        let mut b = [0u8; 8192];
        v[0].read_at(4 * K + 2 * 2 * K, &mut b).expect("test setup");
        assert_eq!(b, [9u8; 8192]);
        v[2].read_at(4 * K + 5 * 2 * K, &mut b).expect("test setup");
        assert_eq!(b, [9u8; 8192]);
        for view in 0..3 {
            for c in 0..7 {
                assert_eq!(split().view_chunk(view, split().device_chunk(view, c)), c);
            }
        }
    }

    #[test]
    fn views_with_their_own_handles_address_the_device_alike() {
        // A file opened once per view: each view's writes land where a shared
        // view's would, and nothing is locked.
        let dir = tempfile::tempdir().expect("test setup");
        let path = dir.path().join("cache");
        let size = 3 * 4 * K + 7 * 2 * K;
        std::fs::write(&path, vec![0u8; size as usize]).expect("test setup");
        let open = || crate::FileDevice::open(&path).expect("test setup");
        let mut own =
            SharedCache::own_handles(vec![open(), open(), open()], split()).expect("test setup");
        assert!(SharedCache::own_handles(vec![open()], split()).is_err());
        own[1].write_at(4 * K, &[9u8; 8192]).expect("test setup");
        own[2].write_at(0, &[3u8; 4096]).expect("test setup");
        own[1].flush().expect("test setup");
        let mut b = [0u8; 8192];
        own[0]
            .read_at(4 * K + 2 * 2 * K, &mut b)
            .expect("test setup");
        assert_eq!(b, [9u8; 8192]);
        let raw = std::fs::read(&path).expect("test setup");
        assert_eq!(
            &raw[(2 * 4 * K) as usize..(2 * 4 * K + K) as usize],
            &[3u8; 4096][..]
        );
        // Asynchronous requests complete on the view that made them.
        own[2].submit(IoRequest {
            tag: 5,
            op: IoOp::Read {
                offset: 4 * K + 5 * 2 * K,
                buf: IoBuf::zeroed(8192),
            },
        });
        let mut out = Vec::new();
        assert_eq!(own[2].poll(&mut out, 1).expect("test setup"), 1);
        assert_eq!(out[0].tag, 5);
        assert_eq!(
            &out[0].buf.as_ref().expect("test setup")[..],
            &[9u8; 8192][..]
        );
        assert!(own.pop().expect("test setup").into_inner().is_ok());
    }

    #[test]
    fn io_across_a_chunk_edge_or_past_the_chunks_is_refused_and_completions_are_routed() {
        let mut v = views();
        let mut b = vec![0u8; 8192];
        assert!(
            v[0].read_at(3 * K, &mut b).is_err(),
            "metadata into chunk 0"
        );
        assert!(v[0].read_at(5 * K, &mut b).is_err(), "chunk 0 into chunk 1");
        assert!(
            v[0].read_at(4 * K + 14 * K, &mut b[..4096]).is_err(),
            "the tail"
        );
        for (i, view) in v.iter_mut().enumerate() {
            view.submit(IoRequest {
                tag: 100 + i as u64,
                op: IoOp::Write {
                    offset: 4 * K,
                    buf: IoBuf::from_slice(&[i as u8; 4096]),
                    fua: false,
                },
            });
        }
        v[2].submit(IoRequest {
            tag: 7,
            op: IoOp::Read {
                offset: 5 * K,
                buf: IoBuf::zeroed(8192),
            },
        });
        let mut out = Vec::new();
        assert_eq!(v[2].poll(&mut out, 2).expect("test setup"), 2);
        let mut tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
        tags.sort_unstable();
        assert_eq!(tags, vec![7, 102]);
        assert!(out.iter().any(|c| c.tag == 7 && c.result.is_err()));
        out.clear();
        assert_eq!(v[0].poll(&mut out, 1).expect("test setup"), 1);
        assert_eq!(out[0].tag, 100);
        assert!(
            SharedCache::split(MemDevice::new(K * 8, 4096).expect("test setup"), split()).is_err()
        );
        drop(v.pop());
        drop(v.pop());
        assert!(v.pop().expect("test setup").into_inner().is_ok());
    }
}
