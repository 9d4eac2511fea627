//! The cold tier's device (`--cold`). All its zones but the last are the pool's cold
//! tier (behind the capacity device's zones, `ZonedConcat::tiers`); the last zone holds
//! the device's label: two copies of a `CapacityLabel` naming the pool (the
//! superblock's UUID) and the zones the tier has. So a pool started with another
//! pool's cold device is refused (`OpenError::ForeignDevice`) instead of reading, and
//! later resetting, zones that are not its own; a blank device does not have the
//! tier's zone count and is refused by the engine's geometry check.
//!
//! Tiers formatted before the label existed use every zone of the device; a device
//! without a label is opened that way (with a warning), and the engine's geometry
//! check still holds it to the pool's zone count.

use shale_device::{ZoneAction, ZoneRange, ZoneState, ZonedDevice};
use shale_format::{CapacityGeometry, CapacityLabel, BLOCK_SIZE, LABEL_COPIES};

use crate::backend::CapacityDevice;

/// The cold device as the pool sees it, and the pool its label names (`None`: an
/// unlabelled device, opened whole).
pub(crate) struct ColdTier {
    pub device: CapacityDevice,
    pub pool: Option<[u8; 16]>,
}

fn geometry_of(dev: &CapacityDevice, zones: u32) -> CapacityGeometry {
    let g = dev.geometry();
    CapacityGeometry {
        zone_size_blocks: (g.zone_size / BLOCK_SIZE as u64) as u32,
        zone_capacity_blocks: (g.zone_capacity / BLOCK_SIZE as u64) as u32,
        zone_count: zones,
    }
}

/// The device's zones, if a cold tier fits: its label's and 2 data zones at least.
fn enough_zones(dev: &CapacityDevice) -> Result<u32, String> {
    let zones = dev.geometry().zone_count;
    if zones < 3 {
        return Err(format!(
            "{zones} zones; a cold tier needs at least 3 (its label's and 2 data zones)"
        ));
    }
    Ok(zones)
}

/// The tier's zones of `dev`: all but the label's.
fn tier_zones(dev: CapacityDevice) -> Result<CapacityDevice, String> {
    let zones = enough_zones(&dev)?;
    let range = ZoneRange::new(dev, 0, zones - 1, 0, 0).map_err(|e| e.to_string())?;
    Ok(Box::new(range))
}

/// Format: labels the device's last zone for `pool` and returns the tier.
pub(crate) fn format(mut dev: CapacityDevice, pool: [u8; 16]) -> Result<ColdTier, String> {
    let last = enough_zones(&dev)? - 1;
    let mut info = Vec::new();
    dev.report_zones(last, 1, &mut info)
        .map_err(|e| format!("reporting the label zone: {e}"))?;
    if info.first().is_some_and(|z| z.state != ZoneState::Empty) {
        dev.manage(last, ZoneAction::Reset)
            .map_err(|e| format!("resetting the label zone: {e}"))?;
    }
    let label = CapacityLabel {
        uuid: pool,
        geometry: geometry_of(&dev, last),
    }
    .encode();
    // Padded with zeros to the device's write unit.
    let unit = (dev.geometry().write_unit as usize).max(BLOCK_SIZE);
    let mut copies = vec![0u8; (LABEL_COPIES * BLOCK_SIZE).next_multiple_of(unit)];
    for c in copies.chunks_exact_mut(BLOCK_SIZE).take(LABEL_COPIES) {
        c.copy_from_slice(&label);
    }
    let at = dev.geometry().zone_start(last);
    dev.write_at(at, &copies)
        .map_err(|e| format!("writing the label: {e}"))?;
    dev.manage(last, ZoneAction::Finish)
        .map_err(|e| format!("finishing the label zone: {e}"))?;
    dev.flush()
        .map_err(|e| format!("flushing the label: {e}"))?;
    Ok(ColdTier {
        device: tier_zones(dev)?,
        pool: Some(pool),
    })
}

/// Open: the tier as its label says, or the whole device when it has none.
pub(crate) fn open(mut dev: CapacityDevice) -> Result<ColdTier, String> {
    let zones = dev.geometry().zone_count;
    if zones < 2 {
        return Err(format!("{zones} zones: not a cold tier"));
    }
    let last = zones - 1;
    let at = dev.geometry().zone_start(last);
    // Copy by copy: a copy unreadable (or never written) leaves the other.
    let mut b = [0u8; BLOCK_SIZE];
    let label = (0..LABEL_COPIES as u64).find_map(|i| {
        let at = at + i * BLOCK_SIZE as u64;
        dev.read_at(at, &mut b).ok()?;
        CapacityLabel::decode(&b, at).ok()
    });
    let Some(label) = label else {
        tracing::warn!(
            "the cold device has no label: opened whole, as a tier formatted before cold labels"
        );
        return Ok(ColdTier {
            device: dev,
            pool: None,
        });
    };
    let want = geometry_of(&dev, last);
    if label.geometry != want {
        return Err(format!(
            "its label says {} zones of {} blocks ({} writable), the device has {} of {} ({}) before the label's",
            label.geometry.zone_count,
            label.geometry.zone_size_blocks,
            label.geometry.zone_capacity_blocks,
            want.zone_count,
            want.zone_size_blocks,
            want.zone_capacity_blocks
        ));
    }
    Ok(ColdTier {
        device: tier_zones(dev)?,
        pool: Some(label.uuid),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_device::{FileDevice, ZoneEmu, ZoneEmuConfig};

    const ZONE: u64 = 1 << 20;

    fn blank(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        FileDevice::create_sparse(&p, 8 * ZONE + (1 << 20)).expect("file");
        p
    }

    fn emulated(path: &std::path::Path, format: bool) -> CapacityDevice {
        let f = FileDevice::open(path).expect("open");
        if format {
            Box::new(ZoneEmu::format(f, &ZoneEmuConfig::new(ZONE)).expect("emulation"))
        } else {
            Box::new(ZoneEmu::open(f).expect("emulation"))
        }
    }

    #[test]
    fn a_labelled_device_opens_as_its_pool_and_an_unlabelled_one_whole() {
        let dir = tempfile::tempdir().expect("dir");
        let a = blank(dir.path(), "a.img");
        let zones = emulated(&a, true).geometry().zone_count;
        let tier = format(emulated(&a, false), [7; 16]).expect("format");
        assert_eq!(tier.pool, Some([7; 16]));
        assert_eq!(tier.device.geometry().zone_count, zones - 1);
        drop(tier);
        let tier = open(emulated(&a, false)).expect("open");
        assert_eq!(tier.pool, Some([7; 16]), "the label names the pool");
        assert_eq!(tier.device.geometry().zone_count, zones - 1);
        // A device never labelled opens whole: the engine's geometry check decides.
        let b = blank(dir.path(), "b.img");
        drop(emulated(&b, true));
        let tier = open(emulated(&b, false)).expect("open");
        assert_eq!(
            (tier.pool, tier.device.geometry().zone_count),
            (None, zones)
        );
    }

    #[test]
    fn a_label_of_another_geometry_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let a = blank(dir.path(), "a.img");
        drop(emulated(&a, true));
        let mut dev = emulated(&a, false);
        let last = dev.geometry().zone_count - 1;
        let mut geometry = geometry_of(&dev, last);
        geometry.zone_count += 1;
        let label = CapacityLabel {
            uuid: [1; 16],
            geometry,
        }
        .encode();
        let at = dev.geometry().zone_start(last);
        dev.write_at(at, &label).expect("label");
        dev.flush().expect("flush");
        drop(dev);
        let err = open(emulated(&a, false)).err().expect("refused");
        assert!(err.contains("its label says"), "{err}");
        assert!(
            format(emulated(&a, false), [2; 16]).is_ok(),
            "format relabels"
        );
    }
}
