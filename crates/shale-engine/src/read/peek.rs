//! Where blocks map, looked up without disturbing the L2P cache: pages are peeked
//! (read if not cached, never entering the cache), the last one of each map kept,
//! since nearby blocks mostly share one. For walks and queries that range wide (the
//! scrub, block status), which must not evict the working set.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Pba, VolumeId};

use crate::core::Core;
use crate::l2p::MAX_EPP;
use crate::{Clock, EngineError};

/// One map's last peeked page.
#[derive(Debug, Default)]
struct Peeked {
    page: Option<(VolumeId, u64)>,
    entries: Option<Box<[Pba; MAX_EPP]>>,
    /// The page was never written: every entry unmapped.
    empty: bool,
}

impl Peeked {
    /// Entry `entry` of L2P map `map` (`None` past its end or for no such map).
    fn entry(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        map: VolumeId,
        entry: u64,
    ) -> Result<Option<Pba>, EngineError> {
        if core.l2p.volume_size(map).is_none_or(|size| entry >= size) {
            return Ok(None);
        }
        let (p, i) = core.l2p.format().locate(entry);
        let entries = self
            .entries
            .get_or_insert_with(|| Box::new([Pba::NONE; MAX_EPP]));
        if self.page != Some((map, p)) {
            self.page = None;
            self.empty = !core
                .l2p
                .peek_page(&mut core.cache, map, p as usize, entries)?;
            self.page = Some((map, p));
        }
        Ok(Some(if self.empty { Pba::NONE } else { entries[i] }))
    }
}

/// Looks blocks up through peeked pages: a dual volume's sparse map first, then the
/// unit (or block) map.
#[derive(Debug, Default)]
pub(crate) struct MapPeek {
    coarse: Peeked,
    fine: Peeked,
}

impl MapPeek {
    /// Drops the pages kept: the maps may have changed since.
    pub fn forget(&mut self) {
        self.coarse.page = None;
        self.fine.page = None;
    }

    /// Entry `unit` of `volume`'s unit (or block) map: its first block's place.
    pub fn unit_entry(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        unit: u64,
    ) -> Result<Option<Pba>, EngineError> {
        self.coarse.entry(core, volume, unit)
    }

    /// Dual volume `volume`'s sparse-map entry for block `lba`, if it has one.
    pub fn sparse_entry(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        lba: u64,
    ) -> Result<Option<Pba>, EngineError> {
        let fine = core.volumes.fine_map(volume);
        Ok(self.fine.entry(core, fine, lba)?.filter(|p| !p.is_none()))
    }

    /// Where `lba` of `volume` maps (`Pba::NONE`: unmapped); `None` past the
    /// volume's end or for a volume that does not exist.
    pub fn lookup(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        lba: u64,
    ) -> Result<Option<Pba>, EngineError> {
        if core.volumes.is_dual(volume) {
            let fine = core.volumes.fine_map(volume);
            if let Some(p) = self.fine.entry(core, fine, lba)?.filter(|p| !p.is_none()) {
                return Ok(Some(p));
            }
        }
        // The entry is the block's, or its unit's first block's.
        let shift = core.volumes.shift(volume);
        let (entry, j) = (lba >> shift, lba & ((1u64 << shift) - 1));
        let Some(base) = self.coarse.entry(core, volume, entry)? else {
            return Ok(None);
        };
        if base.is_none() || j == 0 {
            return Ok(Some(base));
        }
        Ok(core.geo.data_advance(base, j))
    }
}
