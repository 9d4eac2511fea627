//! Volumes: create, resize, delete, list. Each change rewrites the volume table (the
//! copy its generation selects), journals a VolumeChanged record and takes a
//! checkpoint, so a volume's L2P pages can be recycled safely.
//!
//! Invariants: the sum of volume sizes never exceeds the user capacity (no thin
//! provisioning); names are unique, 1..=32 bytes; ids are table slots < volumes_max;
//! uids are issued from the table's `uid_next` and never reused, so a request naming
//! a deleted volume's uid finds nothing even after its slot is taken again.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{JournalRecord, VolumeEntry, VolumeId, VolumeTable, VolumeUid, VOLUME_NAME_MAX};

use crate::layout::BS;
use crate::{Clock, Engine, EngineError, VolumeInfo};

#[derive(Debug, Clone)]
pub(crate) struct Volumes {
    pub table: VolumeTable,
    pub user_capacity_blocks: u64,
    pub volumes_max: u32,
}

impl Volumes {
    pub fn allocated_blocks(&self) -> u64 {
        self.table.entries.iter().map(|e| e.size_blocks).sum()
    }

    pub fn get(&self, id: VolumeId) -> Option<&VolumeEntry> {
        self.table.entries.iter().find(|e| e.id == id)
    }

    /// The slot of the live volume `uid`, if it exists (at most `VOLUMES_MAX` entries:
    /// a scan is cheaper than keeping an index in step).
    pub fn resolve(&self, uid: VolumeUid) -> Option<VolumeId> {
        self.table
            .entries
            .iter()
            .find(|e| e.uid == uid)
            .map(|e| e.id)
    }

    fn info(e: &VolumeEntry) -> VolumeInfo {
        VolumeInfo {
            id: e.id,
            uid: e.uid,
            name: e.name.clone(),
            size_bytes: e.size_blocks * BS,
        }
    }
}

fn size_blocks(size_bytes: u64) -> Result<u64, EngineError> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(BS) {
        return Err(EngineError::InvalidVolume {
            reason: format!("size {size_bytes} is not a positive multiple of 4096"),
        });
    }
    Ok(size_bytes / BS)
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    pub(crate) fn create_volume(
        &mut self,
        name: &str,
        size_bytes: u64,
    ) -> Result<VolumeInfo, EngineError> {
        let blocks = size_blocks(size_bytes)?;
        if name.is_empty() || name.len() > VOLUME_NAME_MAX {
            return Err(EngineError::InvalidVolume {
                reason: format!("name {name:?} must be 1..={VOLUME_NAME_MAX} bytes"),
            });
        }
        if self
            .core
            .volumes
            .table
            .entries
            .iter()
            .any(|e| e.name == name)
        {
            return Err(EngineError::InvalidVolume {
                reason: format!("a volume named {name:?} exists"),
            });
        }
        let available =
            self.core.volumes.user_capacity_blocks - self.core.volumes.allocated_blocks();
        if blocks > available {
            return Err(EngineError::NoSpace {
                what: "volume create",
                needed: blocks,
                available,
            });
        }
        let Some(id) = (0..self.core.volumes.volumes_max)
            .map(VolumeId)
            .find(|&id| self.core.volumes.get(id).is_none())
        else {
            return Err(EngineError::InvalidVolume {
                reason: format!("all {} volume slots in use", self.core.volumes.volumes_max),
            });
        };
        let Some(uid) = self.core.volumes.table.issue_uid() else {
            return Err(EngineError::InvalidVolume {
                reason: "every volume uid has been issued".into(),
            });
        };
        let (created_sid, created_pos) = self.writer.write_position(&self.core);
        let e = VolumeEntry {
            id,
            uid,
            name: name.to_string(),
            size_blocks: blocks,
            created_sid,
            created_pos,
        };
        let info = Volumes::info(&e);
        self.core.volumes.table.entries.push(e);
        self.core.l2p.add_volume(id, blocks);
        self.volume_changed(id, blocks, true)?;
        Ok(info)
    }

    pub(crate) fn resize_volume(
        &mut self,
        uid: VolumeUid,
        size_bytes: u64,
    ) -> Result<VolumeInfo, EngineError> {
        let blocks = size_blocks(size_bytes)?;
        let Some(id) = self.core.volumes.resolve(uid) else {
            return Err(EngineError::NoSuchVolume { volume: uid });
        };
        let Some(old) = self.core.volumes.get(id).map(|e| e.size_blocks) else {
            unreachable!("resolved above");
        };
        if blocks > old {
            let available =
                self.core.volumes.user_capacity_blocks - self.core.volumes.allocated_blocks();
            if blocks - old > available {
                return Err(EngineError::NoSpace {
                    what: "volume grow",
                    needed: blocks - old,
                    available,
                });
            }
        } else if blocks < old {
            self.writer
                .unmap_range(&mut self.core, id, blocks, old - blocks)?;
        }
        self.core.l2p.resize_volume(id, blocks);
        let Some(e) = self
            .core
            .volumes
            .table
            .entries
            .iter_mut()
            .find(|e| e.id == id)
        else {
            unreachable!("volume checked above");
        };
        e.size_blocks = blocks;
        let info = Volumes::info(e);
        self.volume_changed(id, blocks, true)?;
        Ok(info)
    }

    pub(crate) fn delete_volume(&mut self, uid: VolumeUid) -> Result<(), EngineError> {
        let Some(id) = self.core.volumes.resolve(uid) else {
            return Err(EngineError::NoSuchVolume { volume: uid });
        };
        let Some(size) = self.core.volumes.get(id).map(|e| e.size_blocks) else {
            unreachable!("resolved above");
        };
        self.writer.unmap_range(&mut self.core, id, 0, size)?;
        self.core.l2p.remove_volume(id);
        self.core.volumes.table.entries.retain(|e| e.id != id);
        self.volume_changed(id, 0, false)
    }

    /// Persists a volume change made in memory. If that fails, what is on media no
    /// longer matches the engine, so it stops rather than carry on from there.
    fn volume_changed(
        &mut self,
        id: VolumeId,
        size_blocks: u64,
        live: bool,
    ) -> Result<(), EngineError> {
        self.persist_volume_change(id, size_blocks, live)
            .inspect_err(|e| {
                self.fail(EngineError::Failed {
                    reason: format!("persisting a volume change: {e}"),
                })
            })
    }

    fn persist_volume_change(
        &mut self,
        id: VolumeId,
        size_blocks: u64,
        live: bool,
    ) -> Result<(), EngineError> {
        self.core.volumes.table.generation += 1;
        self.core.volumes.table.entries.sort_by_key(|e| e.id);
        let copy = self.core.volumes.table.generation % 2;
        let off = (self.core.sb.layout.volume_table_start + copy) * BS;
        self.core
            .cache
            .write_at(off, &self.core.volumes.table.encode())
            .map_err(EngineError::cache("volume table write", off))?;
        self.core.stats.cache_md_write_bytes += BS;
        self.core.journal.append(JournalRecord::VolumeChanged {
            volume: id,
            size_blocks,
            live,
        });
        self.checkpoint(false)
    }

    pub(crate) fn volume_list(&self) -> Vec<VolumeInfo> {
        self.core
            .volumes
            .table
            .entries
            .iter()
            .map(Volumes::info)
            .collect()
    }
}
