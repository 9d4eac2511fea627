//! The scrub: a slow walk over the capacity zones in use, reading every valid block
//! of each group and checking it against its md entry. A block that fails is read
//! again from the capacity device's redundancy (an array's other members) and, if
//! that copy checks, handed to compaction to be written anew, as a user read does
//! (`read::reader::rebuilt_block`). On a single drive a bad block is counted and
//! logged (nothing can rebuild it).
//!
//! It also checks the map from the other side, which the census after each open does
//! not: a valid block's md entry names the (volume, LBA) whose L2P entry must point
//! back at it (what `shale check` verifies for the whole pool at once; here a group at
//! a time, the L2P pages peeked without disturbing the cache). A block that does not
//! is counted (`scrub_mapping_errors`) and logged.
//!
//! Paced by `Config::scrub_bytes_per_sec` in engine-clock time (0: off): one group
//! per step when the pace allows. A step is synchronous on the engine thread (a
//! group read of up to 512 KiB), so it never overlaps a reuse of the zone.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{decode_md_entry, Lba, RegionId, RegionRole, RegionState, BLOCK_SIZE};

use crate::core::Core;
use crate::layout::{Groups, BS};
use crate::read::peek::MapPeek;
use crate::write::chunk_writer::ChunkWriter;
use crate::{Clock, EngineError};

#[derive(Debug, Default)]
pub(crate) struct Scrubber {
    /// The next region and group to look at.
    region: u32,
    group: u32,
    /// Engine-clock time of the last step, and the bytes the pace allows now.
    last_ns: u64,
    credit: f64,
    map: MapPeek,
}

impl Scrubber {
    /// One step: at most one group, if the pace allows. Never counts as progress.
    pub fn step(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &ChunkWriter,
    ) -> Result<(), EngineError> {
        let rate = core.config.scrub_bytes_per_sec;
        if rate == 0 {
            return Ok(());
        }
        let now = core.now();
        let group_bytes = (shale_format::GROUP_BLOCKS as u64 * BS) as f64;
        let dt = now.saturating_sub(self.last_ns) as f64 / 1e9;
        self.last_ns = now;
        self.credit = (self.credit + dt * rate as f64).min(2.0 * group_bytes);
        if self.credit < group_bytes {
            return Ok(());
        }
        let Some((r, g)) = self.next_group(core) else {
            // Nothing to scrub: look again a group's time from now.
            self.credit = 0.0;
            return Ok(());
        };
        self.credit -= group_bytes;
        // Mappings change between steps: each starts from a fresh peek.
        self.map.forget();
        scrub_group(core, writer, &mut self.map, r, g)
    }

    /// The next group with valid blocks in a closed capacity zone, in order.
    fn next_group(
        &mut self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) -> Option<(RegionId, u32)> {
        let count = core.geo.region_count();
        for _ in 0..=count {
            let r = RegionId(self.region % count);
            let reg = core.regions.get(r);
            let groups = Groups {
                blocks: core.geo.region_blocks(r),
            };
            let usable = !core.geo.is_chunk(r)
                && reg.state == RegionState::Closed
                && reg.role != RegionRole::User
                && reg.valid > 0;
            while usable && self.group < groups.count() {
                let g = self.group;
                self.group += 1;
                let start = core.geo.pba(r, groups.start(g));
                if core
                    .regions
                    .validity
                    .count_range(start, groups.data_slots(g))
                    > 0
                {
                    return Some((r, g));
                }
            }
            self.region = (self.region + 1) % count;
            self.group = 0;
        }
        None
    }
}

/// Reads group `g` of zone region `r` and checks its valid blocks.
fn scrub_group(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    map: &mut MapPeek,
    r: RegionId,
    g: u32,
) -> Result<(), EngineError> {
    let groups = Groups {
        blocks: core.geo.region_blocks(r),
    };
    let k = groups.data_slots(g) as usize;
    let slot0 = groups.start(g);
    let off = core.geo.zone_offset(r, slot0);
    let mut data = vec![0u8; k * BLOCK_SIZE];
    core.capacity
        .read_at(off, &mut data)
        .map_err(EngineError::capacity("scrub read", off))?;
    core.stats.capacity_read_bytes += data.len() as u64;
    core.stats.scrub_bytes += data.len() as u64;
    let md = crate::read::reader::md_block(core, writer, core.geo.pba(r, slot0))?;
    for i in 0..k {
        let pba = core.geo.pba(r, slot0 + i as u32);
        if !core.regions.validity.get(pba) {
            continue;
        }
        let Ok(e) = decode_md_entry(&md[..], i, 0) else {
            continue;
        };
        if !e.kind.holds_data() {
            continue;
        }
        let mapped = map.lookup(core, e.volume, e.lba.0)?;
        if mapped != Some(pba) {
            core.stats.scrub_mapping_errors += 1;
            tracing::error!(
                %pba, volume = %e.volume, lba = e.lba.0, mapped = ?mapped,
                "scrub: a valid block's (volume, LBA) does not map to it"
            );
        }
        let block = &mut data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
        if shale_format::block_crc(block) == e.data_crc {
            continue;
        }
        core.stats.scrub_errors += 1;
        let err = EngineError::ChecksumMismatch {
            volume: e.volume,
            lba: e.lba,
            pba,
            expected: e.data_crc,
            got: shale_format::block_crc(block),
        };
        if !crate::read::reader::rebuilt_block(
            core,
            writer,
            e.volume,
            Lba(e.lba.0),
            pba,
            block,
            &err,
        ) {
            core.stats.crc_errors += 1;
            tracing::error!(region = %r, group = g, %pba, "scrub: a block fails its checksum and cannot be rebuilt");
        }
    }
    Ok(())
}
