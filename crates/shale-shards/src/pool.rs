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

use std::sync::{Mutex, PoisonError};

use shale_device::{BlockDevice, ZonedDevice};
use shale_engine::{
    Clock, Completion, Config, Engine, EngineError, EngineThread, FormatDeviceError, Handoff,
    OpenError, OpenProgress, OpenReport, Reply, Request,
};
use shale_format::{ShardTag, SHARDS_MAX};

use crate::map::ShardMap;
use crate::route::{route, Routed, SplitParts};
use crate::volumes::Volumes;

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
    #[error("{}", mismatch(*position, *expected, found))]
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
    #[error("the shared capacity device: {reason}")]
    Space { reason: String },
}

/// What is wrong with device set `position`, which holds `found`, in a pool given
/// `expected` device sets.
fn mismatch(position: usize, expected: usize, found: &ShardTag) -> String {
    if usize::from(found.count) != expected {
        format!(
            "device set {position} belongs to a pool of {} shards, and {expected} device \
             sets were given",
            found.count
        )
    } else if usize::from(found.index) != position {
        format!(
            "device set {position} holds shard {} of its pool: the device sets are out of order",
            found.index
        )
    } else {
        format!(
            "device set {position} holds a shard of another pool (tag {:#010x}, granule {} \
             blocks) than device set 0",
            found.pool, found.granule_blocks
        )
    }
}

/// N engines on their threads and the deal of volume bytes to them.
pub struct Shards<C, Z> {
    map: ShardMap,
    threads: Vec<EngineThread<C, Z>>,
    /// Each shard's user capacity (what its slices of all volumes may add up to).
    capacities: Vec<u64>,
    /// Serialises volume changes (each spans every shard).
    admin: Mutex<()>,
    splits: SplitParts,
    /// How the shards number the capacity device they share (`space.rs`); `None`
    /// when each has its own.
    lending: Option<crate::Lending>,
    /// How the shards number the chunks of a cache they share.
    chunk_lending: Option<crate::Lending>,
}

impl<C, Z> std::fmt::Debug for Shards<C, Z> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("map", &self.map)
            .field("threads", &self.threads)
            .finish()
    }
}

/// The deal of `n` shards of `granule` bytes, or why there is none.
pub(crate) fn check_shape(n: usize, granule: u64) -> Result<ShardMap, ShardsError> {
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

/// What one of `n` shards runs with: sizes that describe a client's request, not a
/// shard's part of it, shrink to the part. A large write is cut into one part per
/// shard (granules are dealt in turn), so a 256 KiB write or a 1 MiB run is, on each
/// of 4 shards, 64 KiB or 256 KiB: direct writes keep choosing the same writes.
pub(crate) fn shard_share(config: &Config, n: usize) -> Config {
    let mut cfg = config.clone();
    let part = |bytes: u64| bytes.div_ceil(n as u64).div_ceil(4096) * 4096;
    if n > 1 {
        if cfg.direct_write_min_bytes != 0 {
            cfg.direct_write_min_bytes = part(cfg.direct_write_min_bytes);
        }
        cfg.direct_run_min_bytes = part(cfg.direct_run_min_bytes);
    }
    cfg
}

/// Shard `i` of `n`'s format-time configuration.
pub(crate) fn shard_config(config: &Config, i: usize, n: usize, granule: u64, pool: u32) -> Config {
    let mut cfg = shard_share(config, n);
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
    cfg
}

/// The space manager's thread (`Shards::spawn_space_manager`).
#[derive(Debug)]
pub struct SpaceManager {
    stop: crossbeam_channel::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

impl SpaceManager {
    /// Stops the thread and waits for it (a step under way finishes first), so the
    /// pool's owner holds the only reference again.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.handle.join();
    }
}

impl<C, Z> Shards<C, shale_device::SharedZones<Z>>
where
    C: BlockDevice + Send + 'static,
    Z: ZonedDevice + Send + 'static,
{
    /// Formats one shard on each cache, all over one capacity device they share
    /// (`SharedZones` views): shard `i` starts with the run of zones from its view's
    /// zone 0, and the space manager hands out the remainder.
    pub fn format_shared<K: Clock + Send + 'static>(
        caches: Vec<C>,
        capacity: Z,
        clock: impl Fn() -> K + Sync,
        config: &Config,
        granule: u64,
        queue_depth: usize,
    ) -> Result<Self, ShardsError> {
        let n = caches.len().max(1);
        let per = capacity.geometry().zone_count / n as u32;
        let views = shale_device::SharedZones::split(capacity, n)
            .map_err(|reason| ShardsError::Space { reason })?;
        let config = Config {
            zones_owned: Some(per),
            ..config.clone()
        };
        let devices = caches.into_iter().zip(views).collect();
        Self::format(devices, clock, &config, granule, queue_depth)
    }

    /// Opens a pool formatted by [`Shards::format_shared`]: cache `i` holds shard
    /// `i`; zones no shard holds after a crash are handed out.
    pub fn open_shared<K: Clock + Send + 'static>(
        caches: Vec<C>,
        capacity: Z,
        clock: impl Fn() -> K + Sync,
        config: &Config,
        queue_depth: usize,
    ) -> Result<(Self, Vec<OpenReport>), ShardsError> {
        let n = caches.len().max(1);
        let views = shale_device::SharedZones::split(capacity, n)
            .map_err(|reason| ShardsError::Space { reason })?;
        let devices = caches.into_iter().zip(views).collect();
        Self::open(devices, clock, config, queue_depth)
    }
}

impl<C, Z> Shards<shale_device::SharedCache<C>, shale_device::SharedZones<Z>>
where
    C: BlockDevice + Send + 'static,
    Z: ZonedDevice + Send + 'static,
{
    /// Formats `shards` shards over one cache and one capacity device, sharing both
    /// (`cache::pooled_devices`): the space manager lends zones and chunks.
    pub fn format_pooled<K: Clock + Send + 'static>(
        cache: C,
        capacity: Z,
        shards: usize,
        clock: impl Fn() -> K + Sync,
        config: &Config,
        granule: u64,
        queue_depth: usize,
    ) -> Result<Self, ShardsError> {
        let (devices, config) = crate::cache::pooled_devices(cache, capacity, config, shards)?;
        Self::format(devices, clock, &config, granule, queue_depth)
    }

    /// Opens a pool formatted by [`Shards::format_pooled`].
    pub fn open_pooled<K: Clock + Send + 'static>(
        cache: C,
        capacity: Z,
        clock: impl Fn() -> K + Sync,
        config: &Config,
        queue_depth: usize,
    ) -> Result<(Self, Vec<OpenReport>), ShardsError> {
        let devices = crate::cache::pooled_devices_recorded(cache, capacity)?;
        Self::open(devices, clock, config, queue_depth)
    }
}

/// The deal the shards' superblocks record, once they are checked to be one pool's,
/// each in its place: device set `i` must hold shard `i` of as many as there are.
pub(crate) fn check_tags(tags: &[ShardTag]) -> Result<ShardMap, ShardsError> {
    let n = tags.len();
    let first = tags.first().copied().unwrap_or(ShardTag::ONE);
    for (i, &t) in tags.iter().enumerate() {
        let same_pool = t.pool == first.pool && t.granule_blocks == first.granule_blocks;
        if usize::from(t.index) != i || usize::from(t.count) != n || !same_pool {
            return Err(ShardsError::Mismatch {
                position: i,
                expected: n,
                found: t,
            });
        }
    }
    check_shape(n, u64::from(first.granule_blocks) * 4096)
}

pub(crate) fn pool_tag() -> u32 {
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
        let map = check_shape(n, granule)?;
        let pool = pool_tag();
        let engines = parallel(devices, |i, (c, z)| {
            let cfg = shard_config(config, i, n, granule, pool);
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
            Engine::open_with(c, z, clock(), shard_share(config, n), p, h)
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
        let tags: Vec<_> = engines.iter().map(Engine::shard).collect();
        let map = check_tags(&tags)?;
        let reports = engines.iter().map(|e| e.open_report().clone()).collect();
        let pool = Self::start(map, engines, queue_depth)?;
        pool.reconcile()?;
        Ok((pool, reports))
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
        let mut pool = Shards {
            map,
            threads,
            capacities,
            admin: Mutex::new(()),
            splits: SplitParts::default(),
            lending: None,
            chunk_lending: None,
        };
        pool.start_lending()?;
        Ok(pool)
    }

    /// On a shared capacity device: finds how the shards number it, checks that no
    /// zone has two holders and hands out the zones none holds.
    fn start_lending(&mut self) -> Result<(), ShardsError> {
        let threads = &self.threads;
        let call = &mut |s: usize, r| threads[s].call(r);
        let space = |reason: String| ShardsError::Space { reason };
        let shard0 = match call(0, Request::Stats) {
            Ok(Reply::Stats(st)) => *st,
            Ok(other) => return Err(space(format!("shard 0 answered stats with {other:?}"))),
            Err(e) => return Err(space(e.to_string())),
        };
        self.lending = crate::space::detect(threads.len(), &shard0);
        self.chunk_lending = crate::space::detect_chunks(threads.len(), &shard0);
        for (l, kind) in [
            (&self.lending, crate::space::Kind::Zones),
            (&self.chunk_lending, crate::space::Kind::Chunks),
        ] {
            if let Some(l) = l {
                let handed = crate::space::reconcile(l, kind, call).map_err(space)?;
                if handed > 0 {
                    tracing::info!(
                        count = handed,
                        what = kind.name(),
                        "space no shard held handed out"
                    );
                }
            }
        }
        Ok(())
    }

    /// How the shards number the capacity device they share; `None` when each has
    /// its own.
    pub fn lending(&self) -> Option<crate::Lending> {
        self.lending
    }

    /// How the shards number the chunks of the cache they share; `None` when each
    /// has its own.
    pub fn chunk_lending(&self) -> Option<crate::Lending> {
        self.chunk_lending
    }

    /// Runs the space manager's step (`rebalance(batch)`) every `interval` on a
    /// thread of its own until [`SpaceManager::stop`]; `None` on a pool without a
    /// shared device. The thread holds the pool only while a step runs.
    pub fn spawn_space_manager(
        self: &std::sync::Arc<Self>,
        interval: std::time::Duration,
        batch: u32,
    ) -> std::io::Result<Option<SpaceManager>> {
        if self.lending.is_none() && self.chunk_lending.is_none() {
            return Ok(None);
        }
        let pool = std::sync::Arc::downgrade(self);
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let handle = std::thread::Builder::new()
            .name("shale-space".into())
            .spawn(move || {
                // A failed shard fails every step alike: said once, not each step.
                let mut said = String::new();
                loop {
                    match stopped.recv_timeout(interval) {
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let Some(p) = pool.upgrade() else { return };
                    match p.rebalance(batch) {
                        Err(e) if e.to_string() != said => {
                            said = e.to_string();
                            tracing::warn!(error = %e, "space manager: moving free zones");
                        }
                        Err(_) => {}
                        Ok(moved) => {
                            if moved > 0 {
                                tracing::debug!(moved, "space manager: free zones moved");
                            }
                            said.clear();
                        }
                    }
                }
            })?;
        Ok(Some(SpaceManager { stop, handle }))
    }

    /// The space manager's step: up to `batch` free zones from the shard with the
    /// most to the one with the fewest, when they differ by at least twice that
    /// (`space.rs`). Returns the zones moved (none on a pool without a shared
    /// device).
    pub fn rebalance(&self, batch: u32) -> Result<usize, EngineError> {
        let _g = self.admin.lock().unwrap_or_else(PoisonError::into_inner);
        crate::space::rebalance_all(
            self.lending.as_ref(),
            self.chunk_lending.as_ref(),
            batch,
            &mut |s, r| self.threads[s].call(r),
        )
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
        Volumes::new(&self.map, &mut |s, r| self.threads[s].call(r))
            .available_bytes(&self.capacities)
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
        let mut send = |shard: usize, r: Request, d: Completion| self.threads[shard].submit(r, d);
        match route(&self.map, &self.splits, req, done, &mut send)? {
            Routed::Sent => Ok(()),
            Routed::Admin(req, done) => {
                done(self.admin(req));
                Ok(())
            }
        }
    }

    /// Volume changes, listings and statistics, across the shards (each call waits
    /// for its shard), one at a time.
    fn admin(&self, req: Request) -> Result<Reply, EngineError> {
        let _g = self.admin.lock().unwrap_or_else(PoisonError::into_inner);
        let mut r = Volumes::new(&self.map, &mut |s, r| self.threads[s].call(r)).request(req);
        if let Ok(Reply::Stats(st)) = &mut r {
            self.splits.correct(st);
        }
        r
    }

    /// Makes every shard's volumes agree with shard 0's (`Volumes::reconcile`).
    fn reconcile(&self) -> Result<(), ShardsError> {
        Volumes::new(&self.map, &mut |s, r| self.threads[s].call(r)).reconcile()
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
