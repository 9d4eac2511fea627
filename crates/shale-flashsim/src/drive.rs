//! Simulated drives built from a preset and a capacity, over memory (data kept) or
//! over nothing (counts only).

use shale_device::{BlockDevice, MemDevice, NullDevice, ZoneEmu, ZoneEmuConfig};

use crate::preset::{Preset, PresetKind};
use crate::{FlashSim, FlashSimError, ZnsSim};

/// Logical block size of the devices the helpers build: Shale's 4 KiB block.
pub const SIM_LOGICAL_BLOCK_BYTES: u32 = 4096;

/// Where a simulated drive's data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// A [`NullDevice`]: writes are dropped, reads return zeros. For count-only runs
    /// of drives larger than memory.
    Null,
    /// A sparse [`MemDevice`]: data is kept and reads return it.
    Mem,
}

/// The device type the helpers put under a simulated drive.
pub type SimBacking = Box<dyn BlockDevice + Send>;

fn backing_device(backing: Backing, size_bytes: u64) -> Result<SimBacking, FlashSimError> {
    Ok(match backing {
        Backing::Null => Box::new(NullDevice::new(size_bytes, SIM_LOGICAL_BLOCK_BYTES)?),
        Backing::Mem => Box::new(MemDevice::new(size_bytes, SIM_LOGICAL_BLOCK_BYTES)?),
    })
}

/// A conventional (or in-place) simulated drive of `capacity_bytes` as `preset`
/// describes it.
pub fn simulated_block_device(
    preset: &Preset,
    capacity_bytes: u64,
    backing: Backing,
) -> Result<FlashSim<SimBacking>, FlashSimError> {
    if let PresetKind::Zoned { .. } = preset.kind {
        return Err(FlashSimError::PresetKind {
            name: preset.name.to_string(),
            kind: preset.kind.describe(),
            wanted: "a block device",
        });
    }
    FlashSim::from_preset(backing_device(backing, capacity_bytes)?, preset)
}

/// A zoned simulated drive with `zone_count` zones of `zone_size` bytes (fully
/// writable, no open-zone limit), emulated over memory or nothing with
/// [`ZoneEmu`] and counted as `preset` describes.
pub fn simulated_zoned_device(
    preset: &Preset,
    zone_size: u64,
    zone_count: u32,
    backing: Backing,
) -> Result<ZnsSim<ZoneEmu<SimBacking>>, FlashSimError> {
    if !matches!(preset.kind, PresetKind::Zoned { .. }) {
        return Err(FlashSimError::PresetKind {
            name: preset.name.to_string(),
            kind: preset.kind.describe(),
            wanted: "a zoned drive",
        });
    }
    let config = ZoneEmuConfig {
        zone_count_max: zone_count,
        ..ZoneEmuConfig::new(zone_size)
    };
    let bytes = config.device_bytes_for(zone_count).ok_or_else(|| {
        FlashSimError::Device(shale_device::DeviceError::InvalidGeometry {
            reason: format!("{zone_count} zones of {zone_size} bytes overflow"),
        })
    })?;
    let inner = backing_device(backing, bytes)?;
    let emu = ZoneEmu::format(inner, &config)?;
    ZnsSim::from_preset(emu, preset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;
    use shale_device::ZonedDevice;

    #[test]
    fn block_helpers_build_every_block_preset() {
        for name in ["qlc-p5316", "tlc", "optane"] {
            let p = preset(name).expect("preset");
            for backing in [Backing::Null, Backing::Mem] {
                let mut d = simulated_block_device(&p, 64 << 20, backing).expect("builds");
                assert_eq!(d.size_bytes(), 64 << 20);
                d.write_at(0, &[7u8; 4096]).expect("write");
                let mut buf = [0u8; 4096];
                d.read_at(0, &mut buf).expect("read");
                let expected = if backing == Backing::Mem { 7 } else { 0 };
                assert!(buf.iter().all(|&b| b == expected), "{name} {backing:?}");
                assert!(d.info().name.starts_with(name));
                assert_eq!(d.stats().host_bytes_written, 4096);
            }
        }
        let zns = preset("zns-qlc").expect("preset");
        assert!(matches!(
            simulated_block_device(&zns, 64 << 20, Backing::Null),
            Err(FlashSimError::PresetKind { .. })
        ));
    }

    #[test]
    fn zoned_helper_builds_the_zns_preset() {
        let p = preset("zns-qlc").expect("preset");
        let mut z = simulated_zoned_device(&p, 1 << 20, 16, Backing::Mem).expect("builds");
        assert_eq!(z.geometry().zone_count, 16);
        assert_eq!(z.geometry().zone_size, 1 << 20);
        let at = z.append(3, &[1u8; 8192]).expect("append");
        assert_eq!(at, z.geometry().zone_start(3));
        assert_eq!(z.stats().nand_bytes_written, 8192);
        let qlc = preset("qlc-p5316").expect("preset");
        assert!(matches!(
            simulated_zoned_device(&qlc, 1 << 20, 16, Backing::Null),
            Err(FlashSimError::PresetKind { .. })
        ));
        assert!(simulated_zoned_device(&p, 1 << 20, 16, Backing::Null).is_ok());
    }

    #[test]
    fn simulated_drives_can_move_to_an_engine_thread() {
        let block = simulated_block_device(&preset("tlc").expect("preset"), 1 << 20, Backing::Mem)
            .expect("builds");
        let zoned = simulated_zoned_device(
            &preset("zns-qlc").expect("preset"),
            1 << 20,
            4,
            Backing::Mem,
        )
        .expect("builds");
        let (hb, hz) = (block.stats_handle(), zoned.stats_handle());
        std::thread::spawn(move || {
            let (mut block, mut zoned) = (block, zoned);
            block.write_at(0, &[1u8; 4096]).expect("write");
            zoned.append(0, &[1u8; 4096]).expect("append");
        })
        .join()
        .expect("thread");
        assert_eq!(hb.stats().host_bytes_written, 4096);
        assert_eq!(hz.stats().nand_bytes_written, 4096);
    }
}
