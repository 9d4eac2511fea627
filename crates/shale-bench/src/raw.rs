//! `raw`: tenants straight on the capacity drive, each on its own partition.
//!
//! The baseline the seeds compare against (seed 004 §4.1: "QLC only"). The drive is a
//! [`FlashSim`] over a count-only [`NullDevice`], so no data is stored and the paper
//! configuration runs in seconds. The seeds' drives were "10% over provisioned": the
//! partitions cover 90% of the drive's logical capacity by default and the rest is never
//! written, which the drive's FTL uses as extra spare space.

use shale_device::{BlockDevice, NullDevice};
use shale_flashsim::{FlashSim, StatsHandle};
use shale_workload::{IoKind, IoOp};

use crate::config::SetupError;
use crate::system::{DeviceReport, DeviceRole, RunError, SystemUnderTest};

/// Partitions start and end on this boundary (a multiple of every preset's IU, and of
/// the 1 MiB preconditioning writes).
pub const PARTITION_ALIGN_BYTES: u64 = 1 << 20;
/// The seeds' host over-provisioning (seed 004 §4.1: "all 10% over provisioned").
pub const DEFAULT_HOST_SPARE_PCT: u8 = 10;
/// Logical block size of the simulated drive: the smallest any I/O may be.
const SECTOR_BYTES: u32 = 512;
/// Largest host-spare percentage accepted.
const HOST_SPARE_PCT_MAX: u8 = 90;

/// How the raw drive is carved up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawConfig {
    /// Flash preset of the drive (`qlc-p5316`, `tlc`, ...).
    pub preset: String,
    /// Logical capacity of the drive.
    pub capacity_bytes: u64,
    /// One partition per tenant.
    pub tenants: u32,
    /// Percentage of the logical capacity left unpartitioned.
    pub host_spare_pct: u8,
}

/// The size of each of `tenants` equal partitions of `capacity_bytes` less
/// `host_spare_pct` percent, rounded down to `align_bytes`.
pub(crate) fn partition_bytes(
    capacity_bytes: u64,
    host_spare_pct: u8,
    tenants: u32,
    align_bytes: u64,
) -> Result<u64, SetupError> {
    if host_spare_pct > HOST_SPARE_PCT_MAX {
        return Err(SetupError::HostSpareOutOfRange {
            pct: host_spare_pct,
        });
    }
    let keep = u64::from(100 - host_spare_pct);
    let usable = capacity_bytes / 100 * keep + capacity_bytes % 100 * keep / 100;
    let tenants = tenants.max(1);
    let volume_bytes = usable / u64::from(tenants) / align_bytes.max(1) * align_bytes.max(1);
    if volume_bytes == 0 {
        return Err(SetupError::VolumesDoNotFit {
            tenants,
            usable_bytes: usable,
            align_bytes,
        });
    }
    Ok(volume_bytes)
}

/// Tenants on partitions of one simulated drive.
#[derive(Debug)]
pub struct RawSystem {
    drive: FlashSim<NullDevice>,
    stats: StatsHandle,
    preset: String,
    tenants: u32,
    volume_bytes: u64,
    /// Zeros to write from (the null device stores nothing) and to read into.
    buf: Vec<u8>,
}

impl RawSystem {
    pub fn new(cfg: &RawConfig) -> Result<RawSystem, SetupError> {
        if cfg.host_spare_pct > HOST_SPARE_PCT_MAX {
            return Err(SetupError::HostSpareOutOfRange {
                pct: cfg.host_spare_pct,
            });
        }
        let preset = shale_flashsim::preset(&cfg.preset)?;
        let inner = NullDevice::new(cfg.capacity_bytes, SECTOR_BYTES)?;
        let drive = FlashSim::from_preset(inner, &preset)?;
        let tenants = cfg.tenants.max(1);
        let volume_bytes = partition_bytes(
            cfg.capacity_bytes,
            cfg.host_spare_pct,
            tenants,
            PARTITION_ALIGN_BYTES,
        )?;
        Ok(RawSystem {
            stats: drive.stats_handle(),
            drive,
            preset: preset.name.to_string(),
            tenants,
            volume_bytes,
            buf: Vec::new(),
        })
    }
}

impl SystemUnderTest for RawSystem {
    fn name(&self) -> &str {
        "raw"
    }

    fn volume_count(&self) -> u32 {
        self.tenants
    }

    fn volume_bytes(&self) -> u64 {
        self.volume_bytes
    }

    fn sector_bytes(&self) -> u64 {
        u64::from(SECTOR_BYTES)
    }

    fn submit(&mut self, op: &IoOp) -> Result<(), RunError> {
        if op.tenant >= self.tenants {
            return Err(RunError::NoSuchVolume {
                tenant: op.tenant,
                volumes: self.tenants,
            });
        }
        let device_err = |source| RunError::Device {
            tenant: op.tenant,
            kind: op.kind,
            offset: op.offset,
            len: op.len,
            source,
        };
        // The workload keeps ops inside the volume; the device checks the range again.
        let base = u64::from(op.tenant) * self.volume_bytes;
        let offset = base + op.offset.min(self.volume_bytes);
        let len = usize::try_from(op.len).unwrap_or(usize::MAX);
        match op.kind {
            IoKind::Write | IoKind::Read => {
                if self.buf.len() < len {
                    self.buf.resize(len, 0);
                }
                let buf = &mut self.buf[..len];
                let r = if op.kind == IoKind::Write {
                    self.drive.write_at(offset, buf)
                } else {
                    self.drive.read_at(offset, buf)
                };
                r.map_err(device_err)
            }
            IoKind::Trim => self.drive.discard(offset, op.len).map_err(device_err),
        }
    }

    fn drain(&mut self) -> Result<(), RunError> {
        // Every request above completed synchronously.
        Ok(())
    }

    fn reset_counters(&mut self) {
        self.stats.reset();
    }

    fn devices(&self) -> Vec<DeviceReport> {
        vec![DeviceReport {
            role: DeviceRole::Capacity,
            preset: self.preset.clone(),
            stats: self.stats.stats(),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RawConfig {
        RawConfig {
            preset: "qlc-p5316".into(),
            capacity_bytes: 64 << 20,
            tenants: 8,
            host_spare_pct: 10,
        }
    }

    fn op(tenant: u32, kind: IoKind, offset: u64, len: u64) -> IoOp {
        IoOp {
            tenant,
            kind,
            offset,
            len,
            not_before_ns: 0,
        }
    }

    #[test]
    fn partitions_are_aligned_and_leave_the_host_spare() {
        let s = RawSystem::new(&cfg()).expect("valid");
        assert_eq!(s.volume_bytes() % PARTITION_ALIGN_BYTES, 0);
        let used = s.volume_bytes() * u64::from(s.volume_count());
        assert!(used <= (64 << 20) * 9 / 10, "{used}");
        assert!(used > (64 << 20) * 8 / 10, "{used}");
        let all = RawSystem::new(&RawConfig {
            host_spare_pct: 0,
            ..cfg()
        })
        .expect("valid");
        assert_eq!(all.volume_bytes(), 8 << 20);
    }

    #[test]
    fn writes_reach_the_drive_at_the_partition_and_reset_zeroes_counts() {
        let mut s = RawSystem::new(&cfg()).expect("valid");
        let last = s.volume_bytes() - 65536;
        s.submit(&op(7, IoKind::Write, last, 65536)).expect("write");
        s.submit(&op(0, IoKind::Read, 0, 4096)).expect("read");
        s.submit(&op(3, IoKind::Trim, 0, 65536)).expect("trim");
        let d = &s.devices()[0];
        assert_eq!(d.role, DeviceRole::Capacity);
        assert_eq!(d.stats.host_bytes_written, 65536);
        assert_eq!(d.stats.host_bytes_read, 4096);
        assert_eq!(d.stats.host_bytes_discarded, 65536);
        s.reset_counters();
        assert_eq!(s.devices()[0].stats.host_bytes_written, 0);
    }

    #[test]
    fn bad_requests_and_setups_are_typed_errors() {
        let mut s = RawSystem::new(&cfg()).expect("valid");
        assert!(matches!(
            s.submit(&op(8, IoKind::Write, 0, 4096)),
            Err(RunError::NoSuchVolume { tenant: 8, .. })
        ));
        assert!(matches!(
            s.submit(&op(0, IoKind::Write, 100, 4096)),
            Err(RunError::Device { .. })
        ));
        assert!(matches!(
            RawSystem::new(&RawConfig {
                host_spare_pct: 95,
                ..cfg()
            }),
            Err(SetupError::HostSpareOutOfRange { pct: 95 })
        ));
        assert!(matches!(
            RawSystem::new(&RawConfig {
                preset: "floppy".into(),
                ..cfg()
            }),
            Err(SetupError::Flash(_))
        ));
        assert!(matches!(
            RawSystem::new(&RawConfig {
                tenants: 200,
                ..cfg()
            }),
            Err(SetupError::VolumesDoNotFit { .. })
        ));
    }
}
