//! A pool of shards polled on one thread: the same deal, routing and volume rules
//! as [`crate::Shards`], with the engines stepped in turn by their owner instead of
//! on threads of their own. For what must run deterministically on one thread: the
//! benchmark runner's simulated drives and clock, simulations, tests.

use std::sync::{Arc, Mutex, PoisonError};

use shale_device::{BlockDevice, ZonedDevice};
use shale_engine::{
    Clock, Completion, Config, Engine, EngineError, Handoff, NoProgress, OpenReport, Reply,
    Request, SelfCheckError, Stats,
};

use crate::map::ShardMap;
use crate::pool::{check_shape, check_tags, shard_config, shard_share};
use crate::route::{route, Routed, SplitParts};
use crate::volumes::Volumes;
use crate::ShardsError;

/// N engines stepped on the caller's thread.
pub struct LocalShards<C: BlockDevice, Z: ZonedDevice, K: Clock> {
    map: ShardMap,
    engines: Vec<Engine<C, Z, K>>,
    capacities: Vec<u64>,
    splits: SplitParts,
    /// How the shards number the capacity device they share (`space.rs`).
    lending: Option<crate::Lending>,
    chunk_lending: Option<crate::Lending>,
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> std::fmt::Debug for LocalShards<C, Z, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalShards")
            .field("map", &self.map)
            .field("shards", &self.engines.len())
            .finish_non_exhaustive()
    }
}

/// Polls `e` until `slot` holds an answer (or the engine fails).
fn wait_answer<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    e: &mut Engine<C, Z, K>,
    slot: &Mutex<Option<Result<Reply, EngineError>>>,
) -> Result<Reply, EngineError> {
    loop {
        if let Some(r) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
            return r;
        }
        let progress = e.poll();
        if !progress {
            if e.is_idle() {
                // Idle without an answer: the request was dropped, which answers
                // `Failed` (`Answer`), so this is not reached; stay safe anyway.
                if let Some(r) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                    return r;
                }
                return Err(EngineError::Failed {
                    reason: "a shard went idle without answering".into(),
                });
            }
            e.wait_io();
        }
    }
}

/// Submits `req` to `e` and polls it until answered.
fn call_engine<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    e: &mut Engine<C, Z, K>,
    req: Request,
) -> Result<Reply, EngineError> {
    let slot: Arc<Mutex<Option<Result<Reply, EngineError>>>> = Arc::default();
    let s2 = Arc::clone(&slot);
    e.submit(
        req,
        Box::new(move |r| *s2.lock().unwrap_or_else(PoisonError::into_inner) = Some(r)),
    );
    wait_answer(e, &slot)
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> LocalShards<C, Z, K> {
    /// Formats one shard on each device pair, in turn.
    pub fn format(
        devices: Vec<(C, Z)>,
        clock: impl Fn() -> K,
        config: &Config,
        granule: u64,
    ) -> Result<Self, ShardsError> {
        let n = devices.len();
        let map = check_shape(n, granule)?;
        let pool = crate::pool::pool_tag();
        let mut engines = Vec::with_capacity(n);
        for (i, (c, z)) in devices.into_iter().enumerate() {
            let cfg = shard_config(config, i, n, granule, pool);
            engines.push(
                Engine::format(c, z, clock(), cfg)
                    .map_err(|source| ShardsError::Format { shard: i, source })?,
            );
        }
        let mut pool = Self::assemble(map, engines);
        pool.start_lending()?;
        Ok(pool)
    }

    /// As `Shards::start_lending`: on a shared capacity device, every zone held
    /// once and those none holds handed out.
    fn start_lending(&mut self) -> Result<(), ShardsError> {
        // Read off shard 0 directly: a pool that shares nothing is not polled here.
        let n = self.engines.len();
        let shard0 = self.engines[0].stats();
        self.lending = crate::space::detect(n, &shard0);
        self.chunk_lending = crate::space::detect_chunks(n, &shard0);
        let engines = &mut self.engines;
        let call = &mut |s: usize, r| call_engine(&mut engines[s], r);
        for (l, kind) in [
            (&self.lending, crate::space::Kind::Zones),
            (&self.chunk_lending, crate::space::Kind::Chunks),
        ] {
            if let Some(l) = l {
                crate::space::reconcile(l, kind, call)
                    .map_err(|reason| ShardsError::Space { reason })?;
            }
        }
        Ok(())
    }

    /// How the shards number the capacity device they share; `None` when each has
    /// its own.
    pub fn lending(&self) -> Option<crate::Lending> {
        self.lending
    }

    /// The space manager's step (as `Shards::rebalance`).
    pub fn rebalance(&mut self, batch: u32) -> Result<usize, EngineError> {
        let engines = &mut self.engines;
        crate::space::rebalance_all(
            self.lending.as_ref(),
            self.chunk_lending.as_ref(),
            batch,
            &mut |s, r| call_engine(&mut engines[s], r),
        )
    }

    /// How the shards number the chunks of the cache they share.
    pub fn chunk_lending(&self) -> Option<crate::Lending> {
        self.chunk_lending
    }

    /// Opens (recovering where needed) the shards in turn and makes their volumes
    /// agree with shard 0's.
    pub fn open(
        devices: Vec<(C, Z)>,
        clock: impl Fn() -> K,
        config: &Config,
    ) -> Result<(Self, Vec<OpenReport>), ShardsError> {
        Self::open_with(devices, clock, config, Vec::new())
    }

    /// [`Self::open`], each shard with its hand-off store (`handoffs[i]` for shard
    /// `i`; missing ones are none).
    pub fn open_with(
        devices: Vec<(C, Z)>,
        clock: impl Fn() -> K,
        config: &Config,
        handoffs: Vec<Option<Box<dyn Handoff>>>,
    ) -> Result<(Self, Vec<OpenReport>), ShardsError> {
        let mut handoffs = handoffs;
        handoffs.resize_with(devices.len(), || None);
        let n = devices.len();
        let mut engines = Vec::with_capacity(n);
        for (i, ((c, z), h)) in devices.into_iter().zip(handoffs).enumerate() {
            engines.push(
                Engine::open_with(c, z, clock(), shard_share(config, n), &mut NoProgress, h)
                    .map_err(|source| ShardsError::Open { shard: i, source })?,
            );
        }
        let tags: Vec<_> = engines.iter().map(Engine::shard).collect();
        let map = check_tags(&tags)?;
        let reports = engines.iter().map(|e| e.open_report().clone()).collect();
        let mut pool = Self::assemble(map, engines);
        let (map, engines) = (&pool.map, &mut pool.engines);
        Volumes::new(map, &mut |s, r| call_engine(&mut engines[s], r)).reconcile()?;
        pool.start_lending()?;
        Ok((pool, reports))
    }

    fn assemble(map: ShardMap, engines: Vec<Engine<C, Z, K>>) -> Self {
        let capacities = engines.iter().map(Engine::user_capacity_bytes).collect();
        LocalShards {
            map,
            engines,
            capacities,
            splits: SplitParts::default(),
            lending: None,
            chunk_lending: None,
        }
    }

    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    pub fn engines(&self) -> &[Engine<C, Z, K>] {
        &self.engines
    }

    pub fn engines_mut(&mut self) -> &mut [Engine<C, Z, K>] {
        &mut self.engines
    }

    /// The pool's user capacity (as [`crate::Shards::user_capacity_bytes`]).
    pub fn user_capacity_bytes(&self) -> u64 {
        self.capacities.iter().min().copied().unwrap_or(0) * self.capacities.len() as u64
    }

    /// Queues a request on the shards owning its bytes. Volume changes, listings and
    /// statistics across several shards run to completion here (polling the shards
    /// they call), and `done` is called before this returns; a pool of one queues
    /// every request on its engine, as the engine alone would.
    pub fn submit(&mut self, req: Request, done: Completion) {
        let (map, engines, splits) = (&self.map, &mut self.engines, &self.splits);
        if let [only] = engines.as_mut_slice() {
            only.submit(req, done);
            return;
        }
        let mut send = |s: usize, r: Request, d: Completion| {
            engines[s].submit(r, d);
            Ok(())
        };
        match route(map, splits, req, done, &mut send) {
            Ok(Routed::Sent) => {}
            Ok(Routed::Admin(req, done)) => {
                let mut r =
                    Volumes::new(map, &mut |s, r| call_engine(&mut engines[s], r)).request(req);
                if let Ok(Reply::Stats(st)) = &mut r {
                    splits.correct(st);
                }
                done(r);
            }
            Err(_) => unreachable!("an engine's submit cannot fail"),
        }
    }

    /// Submits and polls until answered.
    pub fn call(&mut self, req: Request) -> Result<Reply, EngineError> {
        let slot: Arc<Mutex<Option<Result<Reply, EngineError>>>> = Arc::default();
        let s2 = Arc::clone(&slot);
        self.submit(
            req,
            Box::new(move |r| *s2.lock().unwrap_or_else(PoisonError::into_inner) = Some(r)),
        );
        loop {
            if let Some(r) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                return r;
            }
            if !self.poll() {
                if self.is_idle() {
                    return Err(EngineError::Failed {
                        reason: "the shards went idle without answering".into(),
                    });
                }
                self.wait_io();
            }
        }
    }

    /// One loop iteration of every shard; true if any moved.
    pub fn poll(&mut self) -> bool {
        let mut any = false;
        for e in &mut self.engines {
            any |= e.poll();
        }
        any
    }

    /// Waits for a device completion of each shard with I/O in flight.
    pub fn wait_io(&mut self) {
        for e in &mut self.engines {
            e.wait_io();
        }
    }

    pub fn is_idle(&self) -> bool {
        self.engines.iter().all(Engine::is_idle)
    }

    /// Polls every shard until all are idle.
    pub fn run_until_idle(&mut self) -> Result<(), EngineError> {
        for e in &mut self.engines {
            e.run_until_idle()?;
        }
        Ok(())
    }

    /// Every shard's self-check, in shard order; the first failure names its shard.
    pub fn self_check(&mut self) -> Result<(), (usize, SelfCheckError)> {
        for (i, e) in self.engines.iter_mut().enumerate() {
            e.self_check().map_err(|err| (i, err))?;
        }
        Ok(())
    }

    /// Why the first failed shard failed, if one has.
    pub fn failure(&self) -> Option<(usize, &str)> {
        self.engines
            .iter()
            .enumerate()
            .find_map(|(i, e)| e.failure().map(|f| (i, f)))
    }

    /// The shards' counters summed.
    pub fn stats(&self) -> Stats {
        let mut all = Stats::default();
        for (i, e) in self.engines.iter().enumerate() {
            if i == 0 {
                all = e.stats();
            } else {
                all.absorb(&e.stats());
            }
        }
        self.splits.correct(&mut all);
        all
    }

    /// Drops every shard without a shutdown (as a process that died would leave
    /// them) and returns their devices, in shard order.
    pub fn abandon(self) -> Vec<(C, Z)> {
        self.engines.into_iter().map(Engine::abandon).collect()
    }

    /// Shuts every shard down cleanly and returns their devices, in shard order.
    pub fn shutdown(self) -> Result<Vec<(C, Z)>, EngineError> {
        self.engines.into_iter().map(Engine::shutdown).collect()
    }
}
