//! Asynchronous L2P page I/O, driven from the request loop (`l2p/inflight.rs` keeps
//! the state).
//!
//! Requests still run one at a time in queue order, each with its pages cached, as
//! before. What changes is when a page gets there: the loop looks ahead in the queue
//! and starts a read for every stored page a waiting request will need that is not
//! cached, many at once, and holds the head request back while one of its pages is
//! loading. With the queue at depth 128 a page miss costs the pipeline a device read
//! in parallel with others rather than one synchronous read each on the engine
//! thread. Likewise dirty pages near the LRU tail are written back asynchronously, so
//! an eviction finds a clean frame instead of writing one on the spot. Pages beyond
//! what is looked at, and every other user of the map (admin requests, checkpoints,
//! relocations), fault synchronously as before.

use std::collections::VecDeque;

use shale_device::{BlockDevice, IoOp, IoRequest, ZonedDevice};
use shale_format::{L2pFormat, VolumeId};

use crate::core::Core;
use crate::engine::InflightIo;
use crate::layout::BS;
use crate::request::Answer;
use crate::volume::Volumes;
use crate::{Clock, EngineError, Request};

/// Queued requests looked at for pages to load.
const PREFETCH_REQUESTS_MAX: usize = 256;
/// Pages of one request loaded ahead (a larger request faults the rest itself).
const PREFETCH_PAGES_PER_REQUEST: u64 = 4;
/// Page loads in flight at most (and at most a quarter of the page budget).
const LOADS_MAX: usize = 64;
/// Write-backs in flight at most (and at most a quarter of the page budget).
const WRITE_BACKS_MAX: usize = 32;

/// The L2P pages of a user request that prefetching covers: (volume, first, end).
fn request_pages(volumes: &Volumes, fmt: L2pFormat, req: &Request) -> Option<(VolumeId, u64, u64)> {
    let (volume, offset, len) = match req {
        Request::Read {
            volume,
            offset,
            len,
        }
        | Request::Trim {
            volume,
            offset,
            len,
        }
        | Request::WriteZeroes {
            volume,
            offset,
            len,
        } => (*volume, *offset, *len),
        Request::Write {
            volume,
            offset,
            data,
            ..
        } => (*volume, *offset, data.len() as u64),
        _ => return None,
    };
    if len == 0 {
        return None;
    }
    // A request for a volume gone fails when dispatched; it needs no pages.
    let volume = volumes.resolve(volume)?;
    let per_page = (fmt.entries_per_page() * BS) << volumes.shift(volume);
    let first = offset / per_page;
    let last = offset.checked_add(len - 1)? / per_page;
    Some((
        volume,
        first,
        (last + 1).min(first + PREFETCH_PAGES_PER_REQUEST),
    ))
}

/// L2P prefetch's state.
#[derive(Debug, Default)]
pub(crate) struct Prefetch {
    /// Requests at the front of the queue whose L2P pages were looked at for loading.
    pub looked: usize,
    /// Scratch for the L2P write-backs started in one loop iteration.
    pub write_backs: Vec<(u32, crate::l2p::WriteBackTarget)>,
}

impl Prefetch {
    /// A quarter of the budget for pages arriving and a quarter for pages leaving,
    /// so the frames the requests in progress use stay cached.
    fn loads_max(core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> usize {
        (core.l2p.frames_max() / 4).clamp(1, LOADS_MAX)
    }

    /// Starts loads for the pages of queued requests not looked at yet. Returns true
    /// if it started any.
    pub fn run(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        queue: &VecDeque<(Request, Answer)>,
    ) -> Result<bool, EngineError> {
        core.l2p.install_arrived(&mut core.cache)?;
        let mut started = false;
        let loads_max = Self::loads_max(core);
        let end = queue.len().min(PREFETCH_REQUESTS_MAX);
        while self.looked < end && core.l2p.loads_in_flight() < loads_max {
            let Some((volume, first, last)) =
                request_pages(&core.volumes, core.l2p.format(), &queue[self.looked].0)
            else {
                self.looked += 1;
                continue;
            };
            if last - first > (loads_max - core.l2p.loads_in_flight()) as u64 {
                // Not all of them fit now: look again next time.
                break;
            }
            for p in first..last {
                if let Some(offset) = core.l2p.start_load(volume, p as usize) {
                    let tag = core.io.insert(InflightIo::L2pLoad {
                        volume: volume.0,
                        page: p as u32,
                    });
                    let buf = core.bufs.take(1);
                    core.cache.submit(IoRequest {
                        tag,
                        op: IoOp::Read { offset, buf },
                    });
                    started = true;
                }
            }
            self.looked += 1;
        }
        self.start_l2p_write_backs(core);
        Ok(started)
    }

    /// True when the head request `req` should wait for page loads: one of its pages
    /// is loading, or it was not looked at yet because the loads in flight were at
    /// their limit (its own start as those complete).
    pub fn waits_for_l2p(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        req: &Request,
    ) -> bool {
        if core.l2p.loads_in_flight() == 0 {
            return false;
        }
        request_pages(&core.volumes, core.l2p.format(), req).is_some_and(|(v, first, last)| {
            self.looked == 0 || (first..last).any(|p| core.l2p.is_loading(v, p as usize))
        })
    }

    /// Keeps clean frames at the LRU tail for the loads in flight and those to come.
    fn start_l2p_write_backs(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) {
        if !core.l2p.is_full() {
            return;
        }
        let max_writes = (core.l2p.frames_max() / 4).clamp(1, WRITE_BACKS_MAX);
        if core.l2p.writes_in_flight() >= max_writes {
            return;
        }
        let want = core.l2p.loads_in_flight() + 4;
        let mut started = std::mem::take(&mut self.write_backs);
        core.l2p.start_write_backs(want, max_writes, &mut started);
        for (frame, target) in started.drain(..) {
            let mut buf = core.bufs.take(1);
            buf.copy_from_slice(core.l2p.page_bytes(frame));
            let tag = core.io.insert(InflightIo::L2pWriteBack { frame, target });
            core.cache.submit(IoRequest {
                tag,
                op: IoOp::Write {
                    offset: core.l2p.target_offset(&target),
                    buf,
                    fua: false,
                },
            });
        }
        self.write_backs = started;
    }
}
