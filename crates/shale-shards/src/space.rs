//! The space manager of a pool whose shards share one capacity device
//! (`shale_device::SharedZones`): it moves free zones between shards by message
//! (`Request::GiveZones` to one, `Request::TakeZones` to another, each through the
//! shard's own queue), and at every open hands out the zones no shard holds. On a
//! cache the shards share (`shale_device::SharedCache`) it moves free chunks the same
//! way (`Request::GiveChunks`, `Request::TakeChunks`); what follows of zones holds
//! of chunks too.
//!
//! Each shard sees the device rotated (its zone 0, its label, is the device's zone
//! `index * per`), so a zone has one number per shard; the manager translates. Every
//! zone is held by at most one shard and Foreign in the others (engine
//! `space/lend.rs`): a give is durable before its answer and a take records nothing,
//! so after a crash a zone is either held by one shard or by none (an orphan, which
//! the manager hands out again; the shard that takes it resets it). Two holders would
//! be a defect: the open refuses the pool rather than let two shards write one zone.

use shale_engine::{EngineError, Reply, Request};

/// How the shards of a pool number one shared device's zones (or a shared cache's
/// chunks: `zone_count` is then the chunks').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lending {
    shards: u32,
    zone_count: u32,
    /// Zones between one shard's zone 0 and the next's.
    per: u32,
}

impl Lending {
    pub(crate) fn new(shards: usize, zone_count: u32) -> Lending {
        let shards = shards as u32;
        Lending {
            shards,
            zone_count,
            per: zone_count / shards,
        }
    }

    /// Shards sharing the device.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The device's zones.
    pub fn zone_count(&self) -> u32 {
        self.zone_count
    }

    /// The device zone shard `shard` calls `zone`.
    pub fn device_zone(&self, shard: usize, zone: u32) -> u32 {
        ((u64::from(zone) + u64::from(self.per) * shard as u64) % u64::from(self.zone_count)) as u32
    }

    /// What shard `shard` calls device zone `zone`.
    pub fn shard_zone(&self, shard: usize, zone: u32) -> u32 {
        let n = u64::from(self.zone_count);
        ((u64::from(zone) + n - (u64::from(self.per) * shard as u64) % n) % n) as u32
    }
}

/// A request to shard `s`, answered.
pub(crate) type Call<'a> = dyn FnMut(usize, Request) -> Result<Reply, EngineError> + 'a;

/// What moves: zones of a shared capacity device or chunks of a shared cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Zones,
    Chunks,
}

impl Kind {
    fn give(self, count: u32) -> Request {
        match self {
            Kind::Zones => Request::GiveZones { count },
            Kind::Chunks => Request::GiveChunks { count },
        }
    }

    fn take(self, list: Vec<u32>) -> Request {
        match self {
            Kind::Zones => Request::TakeZones { zones: list },
            Kind::Chunks => Request::TakeChunks { chunks: list },
        }
    }

    fn foreign(self) -> Request {
        match self {
            Kind::Zones => Request::ForeignZones,
            Kind::Chunks => Request::ForeignChunks,
        }
    }

    fn free(self, st: &shale_engine::Stats) -> u64 {
        match self {
            Kind::Zones => st.free_zones,
            Kind::Chunks => st.free_chunks,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Zones => "zone",
            Kind::Chunks => "chunk",
        }
    }

    fn list(self, r: Reply) -> Result<Vec<u32>, EngineError> {
        match (self, r) {
            (Kind::Zones, Reply::Zones(z)) | (Kind::Chunks, Reply::Chunks(z)) => Ok(z),
            (_, other) => Err(EngineError::Failed {
                reason: format!("the space manager got {other:?} for a {} list", self.name()),
            }),
        }
    }
}

fn stats(call: &mut Call<'_>, s: usize) -> Result<shale_engine::Stats, EngineError> {
    match call(s, Request::Stats)? {
        Reply::Stats(st) => Ok(*st),
        other => Err(EngineError::Failed {
            reason: format!("the space manager got {other:?} for stats"),
        }),
    }
}

/// Whether the `n` shards share one capacity device (each holds zones that are
/// others'), and how they number it, from shard 0's counters.
pub(crate) fn detect(n: usize, shard0: &shale_engine::Stats) -> Option<Lending> {
    if n < 2 || shard0.foreign_zones == 0 {
        return None;
    }
    let zone_count = shard0.data_zone_count + shard0.foreign_zones + 1;
    Some(Lending::new(n, zone_count as u32))
}

/// Whether the `n` shards share one cache device, and how they number its chunks.
pub(crate) fn detect_chunks(n: usize, shard0: &shale_engine::Stats) -> Option<Lending> {
    if n < 2 || shard0.foreign_chunks == 0 {
        return None;
    }
    Some(Lending::new(
        n,
        (shard0.chunk_count + shard0.foreign_chunks) as u32,
    ))
}

/// Checks that no zone has two holders and hands every zone without one to the
/// shards in turn, the fewest free zones first. Returns the zones handed out.
pub(crate) fn reconcile(l: &Lending, kind: Kind, call: &mut Call<'_>) -> Result<u32, String> {
    let n = l.shards as usize;
    let mut holders = vec![0u32; l.zone_count as usize];
    let mut free = Vec::with_capacity(n);
    for s in 0..n {
        let foreign = call(s, kind.foreign())
            .and_then(|r| kind.list(r))
            .map_err(|e| format!("shard {s}: {e}"))?;
        let mut theirs = vec![false; l.zone_count as usize];
        for z in foreign {
            theirs[l.device_zone(s, z) as usize] = true;
        }
        for (d, h) in holders.iter_mut().enumerate() {
            if !theirs[d] {
                *h += 1;
            }
        }
        free.push(kind.free(&stats(call, s).map_err(|e| e.to_string())?));
    }
    if let Some(d) = holders.iter().position(|&h| h > 1) {
        return Err(format!(
            "{} {d} of the shared device is held by {} shards",
            kind.name(),
            holders[d]
        ));
    }
    let orphans: Vec<u32> = (0..l.zone_count)
        .filter(|&d| holders[d as usize] == 0)
        .collect();
    for &d in &orphans {
        let s = (0..n).min_by_key(|&s| free[s]).unwrap_or(0);
        let z = l.shard_zone(s, d);
        call(s, kind.take(vec![z]))
            .map_err(|e| format!("shard {s} taking {} {d}: {e}", kind.name()))?;
        free[s] += 1;
    }
    Ok(orphans.len() as u32)
}

/// One move of up to `batch` free zones from the shard with the most to the one with
/// the fewest, when they differ by at least twice the batch. Returns the zones moved.
/// Zones a receiver refuses go back to the giver; were that refused too, they stay
/// orphans until the next open hands them out.
pub(crate) fn rebalance(
    l: &Lending,
    kind: Kind,
    batch: u32,
    call: &mut Call<'_>,
) -> Result<usize, EngineError> {
    let n = l.shards as usize;
    let mut free = Vec::with_capacity(n);
    for s in 0..n {
        free.push(kind.free(&stats(call, s)?));
    }
    let (Some(rich), Some(poor)) = (
        (0..n).max_by_key(|&s| free[s]),
        (0..n).min_by_key(|&s| free[s]),
    ) else {
        return Ok(0);
    };
    if free[rich] < free[poor] + 2 * u64::from(batch) {
        return Ok(0);
    }
    let given = kind.list(call(rich, kind.give(batch))?)?;
    if given.is_empty() {
        return Ok(0);
    }
    let to = |s: usize| {
        given
            .iter()
            .map(|&z| l.shard_zone(s, l.device_zone(rich, z)))
            .collect::<Vec<_>>()
    };
    match call(poor, kind.take(to(poor))) {
        Ok(_) => Ok(given.len()),
        Err(e) => {
            call(rich, kind.take(given.clone()))?;
            Err(e)
        }
    }
}

/// One step for the zones and one for the chunks of whatever the shards share:
/// `batch` zones, and as many chunks up to a quarter of a shard's share. Returns
/// the zones and chunks moved.
pub(crate) fn rebalance_all(
    zones: Option<&Lending>,
    chunks: Option<&Lending>,
    batch: u32,
    call: &mut Call<'_>,
) -> Result<usize, EngineError> {
    let mut moved = 0;
    if let Some(l) = zones {
        moved += rebalance(l, Kind::Zones, batch, call)?;
    }
    if let Some(l) = chunks {
        let batch = batch.min(l.per / 4).max(1);
        moved += rebalance(l, Kind::Chunks, batch, call)?;
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_numbers_the_zones_from_its_own() {
        let l = Lending::new(3, 10);
        assert_eq!(l.per, 3);
        for s in 0..3 {
            assert_eq!(l.device_zone(s, 0), 3 * s as u32);
            for d in 0..10 {
                assert_eq!(l.device_zone(s, l.shard_zone(s, d)), d);
            }
        }
        assert_eq!(l.device_zone(2, 5), 1);
        // The same arithmetic as the device views.
        let emu = {
            let inner = shale_device::MemDevice::new(12 * 65536, 4096).expect("test setup");
            let mut c = shale_device::ZoneEmuConfig::new(65536);
            c.zone_count_max = 10;
            shale_device::ZoneEmu::format(inner, &c).expect("test setup")
        };
        let views = shale_device::SharedZones::split(emu, 3).expect("test setup");
        for (s, v) in views.iter().enumerate() {
            for z in 0..10 {
                assert_eq!(v.device_zone(z), l.device_zone(s, z));
            }
        }
    }
}
