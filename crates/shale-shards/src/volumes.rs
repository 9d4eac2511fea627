//! Volumes across shards: every change made in shard 0 first, then the others in
//! order (undos too), so shard 0's table is the pool's; an open makes the others
//! agree with it (`reconcile`). A create or grow that fails part-way is undone; a
//! delete or shrink is finished instead (what it dropped cannot come back). Shared by the pool on threads and the pool polled on
//! one thread, each lending a way to call one shard and wait.

use shale_engine::{EngineError, Reply, Request, VolumeInfo, VolumeLayout, VolumeUid};

use crate::map::ShardMap;
use crate::ShardsError;

/// One shard called at a time, through `call`.
pub(crate) struct Volumes<'a> {
    map: &'a ShardMap,
    call: &'a mut dyn FnMut(usize, Request) -> Result<Reply, EngineError>,
}

impl<'a> Volumes<'a> {
    pub fn new(
        map: &'a ShardMap,
        call: &'a mut dyn FnMut(usize, Request) -> Result<Reply, EngineError>,
    ) -> Volumes<'a> {
        Volumes { map, call }
    }

    pub fn available_bytes(&mut self, capacities: &[u64]) -> Result<u64, EngineError> {
        let volumes = self.volumes_of(0)?;
        let free = |s: usize| {
            let used: u64 = volumes
                .iter()
                .map(|v| self.map.local_size(s, v.whole_size_bytes))
                .sum();
            capacities[s].saturating_sub(used)
        };
        let n = self.map.shards();
        if n == 1 {
            return Ok(free(0) / 4096 * 4096);
        }
        let g = self.map.granule();
        let least = (0..n).map(free).min().unwrap_or(0);
        Ok(least / g * g * n as u64)
    }

    fn call_shard(&mut self, shard: usize, req: Request) -> Result<Reply, EngineError> {
        (self.call)(shard, req)
    }

    fn volumes_of(&mut self, shard: usize) -> Result<Vec<VolumeInfo>, EngineError> {
        match self.call_shard(shard, Request::ListVolumes)? {
            Reply::Volumes(v) => Ok(v),
            other => Err(unexpected(&other)),
        }
    }

    /// Volume changes, listings and statistics, across the shards.
    pub fn request(&mut self, req: Request) -> Result<Reply, EngineError> {
        if self.map.shards() == 1 {
            // One shard holds whole volumes: every request is its own.
            return self.call_shard(0, req);
        }
        match req {
            Request::CreateVolume { name, size_bytes } => {
                self.create(name, size_bytes, VolumeLayout::default())
            }
            Request::CreateVolumeWith {
                name,
                size_bytes,
                layout,
            } => self.create(name, size_bytes, layout),
            Request::ResizeVolume { volume, size_bytes } => self.resize(volume, size_bytes),
            Request::DeleteVolume { volume } => {
                self.call_shard(0, Request::DeleteVolume { volume })?;
                for s in 1..self.map.shards() {
                    match self.call_shard(s, Request::DeleteVolume { volume }) {
                        Ok(_) | Err(EngineError::NoSuchVolume { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(Reply::Done)
            }
            Request::SetVolumeLimits { volume, limits } => {
                let info = self.call_shard(0, Request::SetVolumeLimits { volume, limits })?;
                for s in 1..self.map.shards() {
                    self.call_shard(s, Request::SetVolumeLimits { volume, limits })?;
                }
                Ok(whole(info))
            }
            Request::ListVolumes => Ok(Reply::Volumes(
                self.volumes_of(0)?.into_iter().map(whole_info).collect(),
            )),
            Request::Stats => {
                let mut all: Option<shale_engine::Stats> = None;
                for s in 0..self.map.shards() {
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
            Request::GiveZones { .. }
            | Request::TakeZones { .. }
            | Request::ForeignZones
            | Request::GiveChunks { .. }
            | Request::TakeChunks { .. }
            | Request::ForeignChunks => Err(EngineError::ZoneLending {
                reason: "zones and chunks move between a pool's shards, not to a client".into(),
            }),
            other => unreachable!("{other:?} is routed before admin"),
        }
    }

    /// Every shard's slice size of a volume of `size` bytes, or why it cannot be.
    fn slices(&mut self, size: u64) -> Result<Vec<u64>, EngineError> {
        let n = self.map.shards() as u64;
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
        Ok((0..self.map.shards())
            .map(|s| self.map.local_size(s, size))
            .collect())
    }

    fn create(
        &mut self,
        name: String,
        size: u64,
        layout: VolumeLayout,
    ) -> Result<Reply, EngineError> {
        // Each shard's slice is whole granules but for the volume's last one, so it
        // is whole units when the granule and the size are.
        if !self.map.granule().is_multiple_of(layout.map_unit_bytes()) {
            return Err(EngineError::InvalidVolume {
                reason: format!(
                    "a mapping unit of {} bytes is larger than this pool's granule ({})",
                    layout.map_unit_bytes(),
                    self.map.granule()
                ),
            });
        }
        let slices = self.slices(size)?;
        let first = self.call_shard(
            0,
            Request::CreateSlice {
                name: name.clone(),
                uid: None,
                size_bytes: slices[0],
                whole_size_bytes: size,
                layout,
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
                    layout,
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

    fn resize(&mut self, volume: VolumeUid, size: u64) -> Result<Reply, EngineError> {
        let slices = self.slices(size)?;
        let old = self
            .volumes_of(0)?
            .into_iter()
            .find(|v| v.uid == volume)
            .ok_or(EngineError::NoSuchVolume { volume })?
            .whole_size_bytes;
        let map = *self.map;
        let mut resize = |s: usize, size: u64| {
            self.call_shard(
                s,
                Request::ResizeSlice {
                    volume,
                    size_bytes: map.local_size(s, size),
                    whole_size_bytes: size,
                },
            )
        };
        let first = resize(0, size)?;
        if size < old {
            // A shrink drops the tail's blocks in each shard it reaches, and growing
            // back would not bring them back: it is never undone. Shard 0's table
            // (the pool's) says the new size; every other shard is shrunk too, and
            // one that failed is made to agree at the next open.
            let mut failed = None;
            for s in 1..slices.len() {
                if let Err(e) = resize(s, size) {
                    failed.get_or_insert(e);
                }
            }
            return failed.map_or(Ok(whole(first)), Err);
        }
        for s in 1..slices.len() {
            if let Err(e) = resize(s, size) {
                // A grow added nothing yet: undone, shard 0 first.
                for u in 0..s {
                    let _ = resize(u, old);
                }
                return Err(e);
            }
        }
        Ok(whole(first))
    }

    /// Makes every shard's volumes agree with shard 0's: a volume shard 0 lacks is
    /// deleted, one it has is created or resized to match, limits copied.
    pub fn reconcile(&mut self) -> Result<(), ShardsError> {
        if self.map.shards() == 1 {
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
        for s in 1..self.map.shards() {
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
                                layout: t.layout,
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
}

fn unexpected(r: &Reply) -> EngineError {
    EngineError::Failed {
        reason: format!("a shard answered with {r:?}"),
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
