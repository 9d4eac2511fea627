//! A pool of shards: N engines, each on its own thread with its own devices, behind
//! one router that speaks the engine's requests.
//!
//! Data requests go straight to the shards that own their bytes ([`ShardMap`]): a
//! request inside one granule is passed through untouched (the common case: no copy,
//! no allocation beyond the engine's); a larger one becomes at most one request per
//! shard, gathered (writes) or scattered (reads) and answered once, when the last
//! part is. A flush goes to every shard and completes when all have: each shard's
//! flush covers what it completed, so the pool's covers what the pool completed.
//!
//! Volumes exist in every shard under one uid, each shard holding its slice and the
//! whole size. Shard 0's volume table is the pool's: every volume change is made
//! there first and then in the others, under one lock (volume changes are rare; the
//! data path takes none), and an open makes the other shards agree with shard 0
//! (`reconcile`), finishing or undoing a change a crash cut short.

use std::sync::{Arc, Mutex, PoisonError};

use shale_device::{BlockDevice, ZonedDevice};
use shale_engine::{
    Clock, Completion, Config, Engine, EngineError, EngineThread, FormatDeviceError, Handoff,
    OpenError, OpenProgress, OpenReport, Reply, Request, VolumeInfo, VolumeUid,
};
use shale_format::{ShardTag, SHARDS_MAX};

use crate::join::Join;
use crate::map::ShardMap;

/// Why a pool of shards could not be formatted or opened.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    #[error("{count} shards: a pool has 1..={SHARDS_MAX}")]
    Count { count: usize },
    #[error("granule of {granule} bytes: a positive multiple of 4096 below 16 GiB")]
    Granule { granule: u64 },
    #[error("formatting shard {shard}: {source}")]
    Format {
        shard: usize,
        source: FormatDeviceError,
    },
    #[error("opening shard {shard}: {source}")]
    Open { shard: usize, source: OpenError },
    #[error(
        "device set {position} holds shard {} of {} of pool {:#010x} (granule {} blocks), \
         not shard {position} of {expected} like device set 0's pool",
        found.index, found.count, found.pool, found.granule_blocks
    )]
    Mismatch {
        position: usize,
        expected: usize,
        found: ShardTag,
    },
    #[error("shard {shard}: {reason}")]
    Volumes { shard: usize, reason: String },
    #[error("starting shard {shard}'s thread: {source}")]
    Spawn {
        shard: usize,
        source: std::io::Error,
    },
    #[error("shard {shard}: {source}")]
    Engine { shard: usize, source: EngineError },
}

/// N engines on their threads and the deal of volume bytes to them.
pub struct Shards<C, Z> {
    map: ShardMap,
    threads: Vec<EngineThread<C, Z>>,
    /// Each shard's user capacity (what its slices of all volumes may add up to).
    capacities: Vec<u64>,
    /// Serialises volume changes (each spans every shard).
    admin: Mutex<()>,
}

impl<C, Z> std::fmt::Debug for Shards<C, Z> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("map", &self.map)
            .field("threads", &self.threads)
            .finish()
    }
}

/// A request's slice of volume bytes, where the router splits it.
fn span(r: &Request) -> Option<(u64, u64)> {
    match r {
        Request::Read { offset, len, .. }
        | Request::Trim { offset, len, .. }
        | Request::WriteZeroes { offset, len, .. }
        | Request::Allocation { offset, len, .. } => Some((*offset, *len)),
        Request::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
        _ => None,
    }
}

/// A copy of `r` for one shard: the same request at `local`, `len` bytes (`data`
/// for a write).
fn part(r: &Request, local: u64, len: u64, data: Option<Vec<u8>>) -> Request {
    match r {
        Request::Read { volume, .. } => Request::Read {
            volume: *volume,
            offset: local,
            len,
        },
        Request::Write { volume, fua, .. } => Request::Write {
            volume: *volume,
            offset: local,
            data: data.unwrap_or_default(),
            fua: *fua,
        },
        Request::Trim { volume, .. } => Request::Trim {
            volume: *volume,
            offset: local,
            len,
        },
        Request::WriteZeroes { volume, .. } => Request::WriteZeroes {
            volume: *volume,
            offset: local,
            len,
        },
        Request::Allocation { volume, .. } => Request::Allocation {
            volume: *volume,
            offset: local,
            len,
        },
        _ => unreachable!("only requests with a span are split"),
    }
}

fn pool_tag() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // A random-keyed hasher over the time: enough to tell two pools apart.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() as u32).max(1)
}

impl<C, Z> Shards<C, Z>
where
    C: BlockDevice + Send + 'static,
    Z: ZonedDevice + Send + 'static,
{
    /// Formats one shard on each device pair (in parallel) and starts the pool with
    /// no volumes. One pair formats an ordinary pool.
    pub fn format<K: Clock + Send + 'static>(
        devices: Vec<(C, Z)>,
        clock: impl Fn() -> K + Sync,
        config: &Config,
        granule: u64,
        queue_depth: usize,
    ) -> Result<Shards<C, Z>, ShardsError> {
        let n = devices.len();
        let map = Self::check_shape(n, granule)?;
        let pool = pool_tag();
        let engines = parallel(devices, |i, (c, z)| {
            let mut cfg = config.clone();
            cfg.shard = if n == 1 {
                ShardTag::ONE
            } else {
                ShardTag {
                    index: i as u8,
                    count: n as u8,
                    granule_blocks: (granule / 4096) as u32,
                    pool,
                }
            };
            Engine::format(c, z, clock(), cfg)
                .map_err(|source| ShardsError::Format { shard: i, source })
        })?;
        Self::start(map, engines, queue_depth)
    }

    /// Opens (recovering where needed) a pool's shards in parallel, device pair `i`
    /// holding shard `i`; then makes the shards' volumes agree with shard 0's.
    pub fn open<K: Clock + Send + 'static>(
        devices: Vec<(C, Z)>,
        clock: impl Fn() -> K + Sync,
        config: &Config,
        queue_depth: usize,
    ) -> Result<(Shards<C, Z>, Vec<OpenReport>), ShardsError> {
        let handoffs = devices.iter().map(|_| None).collect();
        Self::open_with(
            devices,
            clock,
            config,
            queue_depth,
            handoffs,
            &mut shale_engine::NoProgress,
        )
    }

    /// [`Shards::open`] with a hand-off store per shard (`Engine::open_with`), and
    /// `progress` seeing shard 0's steps (it opens on this thread while the others
    /// open on their own).
    pub fn open_with<K: Clock + Send + 'static>(
        devices: Vec<(C, Z)>,
        clock: impl Fn() -> K + Sync,
        config: &Config,
        queue_depth: usize,
        handoffs: Vec<Option<Box<dyn Handoff>>>,
        progress: &mut dyn OpenProgress,
    ) -> Result<(Shards<C, Z>, Vec<OpenReport>), ShardsError> {
        let n = devices.len();
        let mut handoffs = handoffs;
        handoffs.resize_with(n, || None);
        let open = |i: usize, (c, z): (C, Z), h, p: &mut dyn OpenProgress| {
            // Each shard's open logs its steps under its index.
            let _span = (n > 1).then(|| tracing::info_span!("shard", index = i).entered());
            Engine::open_with(c, z, clock(), config.clone(), p, h)
                .map_err(|source| ShardsError::Open { shard: i, source })
        };
        let mut items: Vec<_> = devices.into_iter().zip(handoffs).collect();
        let Some((first_devices, first_handoff)) = (!items.is_empty()).then(|| items.remove(0))
        else {
            return Err(ShardsError::Count { count: 0 });
        };
        let engines = std::thread::scope(|scope| {
            let open = &open;
            let others: Vec<_> = items
                .into_iter()
                .enumerate()
                .map(|(i, (d, h))| {
                    scope.spawn(move || open(i + 1, d, h, &mut shale_engine::NoProgress))
                })
                .collect();
            let first = open(0, first_devices, first_handoff, progress);
            let mut engines = vec![first];
            for h in others {
                engines.push(match h.join() {
                    Ok(r) => r,
                    Err(p) => std::panic::resume_unwind(p),
                });
            }
            engines.into_iter().collect::<Result<Vec<_>, _>>()
        })?;
        let first = engines.first().map_or(ShardTag::ONE, Engine::shard);
        for (i, e) in engines.iter().enumerate() {
            let t = e.shard();
            let same_pool = t.pool == first.pool && t.granule_blocks == first.granule_blocks;
            if usize::from(t.index) != i || usize::from(t.count) != n || !same_pool {
                return Err(ShardsError::Mismatch {
                    position: i,
                    expected: n,
                    found: t,
                });
            }
        }
        let granule = u64::from(first.granule_blocks) * 4096;
        let map = Self::check_shape(n, granule)?;
        let reports = engines.iter().map(|e| e.open_report().clone()).collect();
        let pool = Self::start(map, engines, queue_depth)?;
        pool.reconcile()?;
        Ok((pool, reports))
    }

    fn check_shape(n: usize, granule: u64) -> Result<ShardMap, ShardsError> {
        if n == 0 || n > usize::from(SHARDS_MAX) {
            return Err(ShardsError::Count { count: n });
        }
        // One shard owns everything: no granule is recorded, any would do.
        let granule = if n == 1 {
            crate::GRANULE_BYTES_DEFAULT
        } else {
            granule
        };
        if granule >= 16 << 30 {
            return Err(ShardsError::Granule { granule });
        }
        ShardMap::new(n, granule).ok_or(ShardsError::Granule { granule })
    }

    fn start<K: Clock + Send + 'static>(
        map: ShardMap,
        engines: Vec<Engine<C, Z, K>>,
        queue_depth: usize,
    ) -> Result<Shards<C, Z>, ShardsError> {
        let capacities = engines.iter().map(Engine::user_capacity_bytes).collect();
        let mut threads = Vec::with_capacity(engines.len());
        for (shard, e) in engines.into_iter().enumerate() {
            let t = EngineThread::spawn(e, queue_depth)
                .map_err(|source| ShardsError::Spawn { shard, source })?;
            threads.push(t);
        }
        Ok(Shards {
            map,
            threads,
            capacities,
            admin: Mutex::new(()),
        })
    }

    /// The deal of volume bytes to the shards.
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    pub fn shards(&self) -> usize {
        self.threads.len()
    }

    /// Each shard's user capacity in bytes: a volume fits while every shard's slices
    /// of all volumes fit in its own.
    pub fn shard_capacities(&self) -> &[u64] {
        &self.capacities
    }

    /// The pool's user capacity: what volumes dealt evenly over the shards can add up
    /// to (the smallest shard's, times the shards).
    pub fn user_capacity_bytes(&self) -> u64 {
        self.capacities.iter().min().copied().unwrap_or(0) * self.capacities.len() as u64
    }

    /// The largest volume that fits beside those that exist: every shard's slice of
    /// it must fit what that shard has left (a multiple of a group of granules, whose
    /// slices are equal, on a pool of several).
    pub fn available_bytes(&self) -> Result<u64, EngineError> {
        let volumes = self.volumes_of(0)?;
        let free = |s: usize| {
            let used: u64 = volumes
                .iter()
                .map(|v| self.map.local_size(s, v.whole_size_bytes))
                .sum();
            self.capacities[s].saturating_sub(used)
        };
        let n = self.threads.len();
        if n == 1 {
            return Ok(free(0) / 4096 * 4096);
        }
        let g = self.map.granule();
        let least = (0..n).map(free).min().unwrap_or(0);
        Ok(least / g * g * n as u64)
    }

    /// Why the pool stopped serving, once any shard has: the pool is one failure
    /// domain (a volume lives on every shard).
    pub fn failure(&self) -> Option<String> {
        self.threads.iter().enumerate().find_map(|(i, t)| {
            t.failure().map(|f| {
                if self.threads.len() == 1 {
                    f
                } else {
                    format!("shard {i}: {f}")
                }
            })
        })
    }

    /// Submits and waits for the reply.
    pub fn call(&self, req: Request) -> Result<Reply, EngineError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.submit(
            req,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        rx.recv().map_err(|_| EngineError::ShuttingDown)?
    }

    /// Queues a request (blocking while a shard's queue is full). Volume changes,
    /// listings, statistics and self-checks run here, on the caller's thread, and
    /// `done` is called before this returns.
    pub fn submit(&self, req: Request, done: Completion) -> Result<(), EngineError> {
        if self.threads.len() == 1 {
            return self.threads[0].submit(req, done);
        }
        if let Some((offset, len)) = span(&req) {
            return self.submit_data(req, offset, len, done);
        }
        match req {
            Request::Flush | Request::SelfCheck => {
                let join = Join::new(self.threads.len(), done, Reply::Done);
                for t in &self.threads {
                    let j = Arc::clone(&join);
                    t.submit(
                        req_clone(&req),
                        Box::new(move |r| j.done_part(r.map(|_| ()))),
                    )?;
                }
                Ok(())
            }
            other => {
                done(self.admin(other));
                Ok(())
            }
        }
    }

    fn submit_data(
        &self,
        req: Request,
        offset: u64,
        len: u64,
        done: Completion,
    ) -> Result<(), EngineError> {
        let map = &self.map;
        if let Some((shard, local)) = map.single(offset, len) {
            return self.threads[shard].submit(relocate(req, local), done);
        }
        if len == 0 {
            // Nothing to split: shard 0 answers (an empty read, a no-op).
            return self.threads[0].submit(req, done);
        }
        let ranges = map.ranges(offset, len);
        let parts = ranges.iter().filter(|r| !r.is_empty()).count();
        let pieces: Arc<Vec<crate::map::Piece>> = Arc::new(map.pieces(offset, len).collect());
        let join = match &req {
            Request::Read { .. } => Join::read(parts, done, len, Arc::clone(&pieces)),
            Request::Allocation { .. } => Join::allocation(parts, done, Arc::clone(&pieces)),
            _ => Join::new(parts, done, Reply::Done),
        };
        for (shard, r) in ranges.into_iter().enumerate() {
            if r.is_empty() {
                continue;
            }
            let data = match &req {
                Request::Write { data, .. } => {
                    let mut d = Vec::with_capacity((r.end - r.start) as usize);
                    for p in pieces.iter().filter(|p| p.shard == shard) {
                        d.extend_from_slice(&data[p.at as usize..(p.at + p.len) as usize]);
                    }
                    Some(d)
                }
                _ => None,
            };
            let j = Arc::clone(&join);
            let local = r.start;
            self.threads[shard].submit(
                part(&req, r.start, r.end - r.start, data),
                Box::new(move |res| j.done_shard(shard, local, res)),
            )?;
        }
        Ok(())
    }

    /// Calls one shard and waits.
    fn call_shard(&self, shard: usize, req: Request) -> Result<Reply, EngineError> {
        self.threads[shard].call(req)
    }

    fn volumes_of(&self, shard: usize) -> Result<Vec<VolumeInfo>, EngineError> {
        match self.call_shard(shard, Request::ListVolumes)? {
            Reply::Volumes(v) => Ok(v),
            other => Err(unexpected(&other)),
        }
    }

    /// Volume changes, listings and statistics, across the shards.
    fn admin(&self, req: Request) -> Result<Reply, EngineError> {
        let _g = self.admin.lock().unwrap_or_else(PoisonError::into_inner);
        match req {
            Request::CreateVolume { name, size_bytes } => self.create(name, size_bytes),
            Request::ResizeVolume { volume, size_bytes } => self.resize(volume, size_bytes),
            Request::DeleteVolume { volume } => {
                self.call_shard(0, Request::DeleteVolume { volume })?;
                for s in 1..self.threads.len() {
                    match self.call_shard(s, Request::DeleteVolume { volume }) {
                        Ok(_) | Err(EngineError::NoSuchVolume { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(Reply::Done)
            }
            Request::SetVolumeLimits { volume, limits } => {
                let info = self.call_shard(0, Request::SetVolumeLimits { volume, limits })?;
                for s in 1..self.threads.len() {
                    self.call_shard(s, Request::SetVolumeLimits { volume, limits })?;
                }
                Ok(whole(info))
            }
            Request::ListVolumes => Ok(Reply::Volumes(
                self.volumes_of(0)?.into_iter().map(whole_info).collect(),
            )),
            Request::Stats => {
                let mut all: Option<shale_engine::Stats> = None;
                for s in 0..self.threads.len() {
                    let st = match self.call_shard(s, Request::Stats)? {
                        Reply::Stats(st) => st,
                        other => return Err(unexpected(&other)),
                    };
                    match &mut all {
                        None => all = Some(*st),
                        Some(a) => a.absorb(&st),
                    }
                }
                Ok(Reply::Stats(Box::new(all.unwrap_or_default())))
            }
            Request::CreateSlice { .. } | Request::ResizeSlice { .. } => {
                Err(EngineError::InvalidVolume {
                    reason: "slices are the router's to make, not a client's".into(),
                })
            }
            other => unreachable!("{other:?} is routed before admin"),
        }
    }

    /// Every shard's slice size of a volume of `size` bytes, or why it cannot be.
    fn slices(&self, size: u64) -> Result<Vec<u64>, EngineError> {
        let n = self.threads.len() as u64;
        let min = n * self.map.granule();
        if size < min || !size.is_multiple_of(4096) {
            return Err(EngineError::InvalidVolume {
                reason: format!(
                    "size {size} on a pool of {n} shards: a multiple of 4096 of at least \
                     {min} (one granule of {} bytes per shard)",
                    self.map.granule()
                ),
            });
        }
        Ok((0..self.threads.len())
            .map(|s| self.map.local_size(s, size))
            .collect())
    }

    fn create(&self, name: String, size: u64) -> Result<Reply, EngineError> {
        let slices = self.slices(size)?;
        let first = self.call_shard(
            0,
            Request::CreateSlice {
                name: name.clone(),
                uid: None,
                size_bytes: slices[0],
                whole_size_bytes: size,
            },
        )?;
        let Reply::Volume(info) = first else {
            return Err(unexpected(&first));
        };
        for (s, &slice) in slices.iter().enumerate().skip(1) {
            let r = self.call_shard(
                s,
                Request::CreateSlice {
                    name: name.clone(),
                    uid: Some(info.uid),
                    size_bytes: slice,
                    whole_size_bytes: size,
                },
            );
            if let Err(e) = r {
                // Undone in the order of every change, shard 0 first: after a crash
                // here the open deletes what the others still hold.
                for u in 0..s {
                    let _ = self.call_shard(u, Request::DeleteVolume { volume: info.uid });
                }
                return Err(e);
            }
        }
        Ok(Reply::Volume(whole_info(info)))
    }

    fn resize(&self, volume: VolumeUid, size: u64) -> Result<Reply, EngineError> {
        let slices = self.slices(size)?;
        let old = self
            .volumes_of(0)?
            .into_iter()
            .find(|v| v.uid == volume)
            .ok_or(EngineError::NoSuchVolume { volume })?
            .whole_size_bytes;
        let resize = |s: usize, size: u64, slice: u64| {
            self.call_shard(
                s,
                Request::ResizeSlice {
                    volume,
                    size_bytes: slice,
                    whole_size_bytes: size,
                },
            )
        };
        let first = resize(0, size, slices[0])?;
        for (s, &slice) in slices.iter().enumerate().skip(1) {
            if let Err(e) = resize(s, size, slice) {
                for u in 0..s {
                    let _ = resize(u, old, self.map.local_size(u, old));
                }
                return Err(e);
            }
        }
        Ok(whole(first))
    }

    /// Makes every shard's volumes agree with shard 0's: a volume shard 0 lacks is
    /// deleted, one it has is created or resized to match, limits copied.
    fn reconcile(&self) -> Result<(), ShardsError> {
        if self.threads.len() == 1 {
            return Ok(());
        }
        let engine = |shard| move |source| ShardsError::Engine { shard, source };
        let truth = self.volumes_of(0).map_err(engine(0))?;
        for v in &truth {
            if self.map.local_size(0, v.whole_size_bytes) != v.size_bytes {
                return Err(ShardsError::Volumes {
                    shard: 0,
                    reason: format!(
                        "volume {} holds {} bytes of {}, not its share {}",
                        v.name,
                        v.size_bytes,
                        v.whole_size_bytes,
                        self.map.local_size(0, v.whole_size_bytes)
                    ),
                });
            }
        }
        for s in 1..self.threads.len() {
            let have = self.volumes_of(s).map_err(engine(s))?;
            for h in &have {
                if !truth.iter().any(|t| t.uid == h.uid) {
                    tracing::warn!(shard = s, volume = %h.name, "deleting a volume shard 0 does not have (a delete cut short)");
                    self.call_shard(s, Request::DeleteVolume { volume: h.uid })
                        .map_err(engine(s))?;
                }
            }
            for t in &truth {
                let slice = self.map.local_size(s, t.whole_size_bytes);
                match have.iter().find(|h| h.uid == t.uid) {
                    None => {
                        tracing::warn!(shard = s, volume = %t.name, "creating a volume only shard 0 has (a create cut short)");
                        self.call_shard(
                            s,
                            Request::CreateSlice {
                                name: t.name.clone(),
                                uid: Some(t.uid),
                                size_bytes: slice,
                                whole_size_bytes: t.whole_size_bytes,
                            },
                        )
                        .map_err(|e| ShardsError::Volumes {
                            shard: s,
                            reason: format!("cannot create volume {}: {e}", t.name),
                        })?;
                    }
                    Some(h)
                        if h.whole_size_bytes != t.whole_size_bytes || h.size_bytes != slice =>
                    {
                        tracing::warn!(shard = s, volume = %t.name, "resizing a volume to shard 0's size (a resize cut short)");
                        self.call_shard(
                            s,
                            Request::ResizeSlice {
                                volume: t.uid,
                                size_bytes: slice,
                                whole_size_bytes: t.whole_size_bytes,
                            },
                        )
                        .map_err(engine(s))?;
                    }
                    Some(_) => {}
                }
                if have.iter().any(|h| h.uid == t.uid && h.limits != t.limits)
                    || !have.iter().any(|h| h.uid == t.uid) && !t.limits.is_none()
                {
                    self.call_shard(
                        s,
                        Request::SetVolumeLimits {
                            volume: t.uid,
                            limits: t.limits,
                        },
                    )
                    .map_err(engine(s))?;
                }
            }
        }
        Ok(())
    }

    /// Shuts every shard down cleanly and returns their devices, in shard order;
    /// the first error is returned (after every shard was asked to stop).
    pub fn shutdown(self) -> Result<Vec<(C, Z)>, EngineError> {
        let mut out = Vec::with_capacity(self.threads.len());
        let mut first_err = None;
        for t in self.threads {
            match t.shutdown() {
                Ok(d) => out.push(d),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// Runs `f` on each item on its own thread (opens and recoveries of the shards run
/// side by side); the results in order, or the first error.
fn parallel<T: Send, R: Send, E: Send>(
    items: Vec<T>,
    f: impl Fn(usize, T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    if items.len() == 1 {
        return items.into_iter().map(|t| f(0, t)).collect();
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = items
            .into_iter()
            .enumerate()
            .map(|(i, t)| scope.spawn(move || f(i, t)))
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    })
}

fn req_clone(r: &Request) -> Request {
    match r {
        Request::Flush => Request::Flush,
        Request::SelfCheck => Request::SelfCheck,
        _ => unreachable!("only flushes and self-checks are sent to every shard"),
    }
}

/// `r` with its offset replaced by the shard-local one.
fn relocate(r: Request, local: u64) -> Request {
    match r {
        Request::Read { volume, len, .. } => Request::Read {
            volume,
            offset: local,
            len,
        },
        Request::Write {
            volume, data, fua, ..
        } => Request::Write {
            volume,
            offset: local,
            data,
            fua,
        },
        Request::Trim { volume, len, .. } => Request::Trim {
            volume,
            offset: local,
            len,
        },
        Request::WriteZeroes { volume, len, .. } => Request::WriteZeroes {
            volume,
            offset: local,
            len,
        },
        Request::Allocation { volume, len, .. } => Request::Allocation {
            volume,
            offset: local,
            len,
        },
        other => other,
    }
}

/// A volume as the pool shows it: its whole size.
fn whole_info(v: VolumeInfo) -> VolumeInfo {
    VolumeInfo {
        size_bytes: v.whole_size_bytes,
        ..v
    }
}

fn whole(r: Reply) -> Reply {
    match r {
        Reply::Volume(v) => Reply::Volume(whole_info(v)),
        other => other,
    }
}

fn unexpected(r: &Reply) -> EngineError {
    EngineError::Failed {
        reason: format!("a shard answered with {r:?}"),
    }
}
