use shale_device::{DeviceError, ZoneError};

/// Which host operation a model error refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelOp {
    Read,
    Write,
    Discard,
}

impl std::fmt::Display for ModelOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelOp::Read => "read",
            ModelOp::Write => "write",
            ModelOp::Discard => "discard",
        })
    }
}

/// Errors of the flash simulator: bad configuration, unknown presets, requests the
/// model cannot place, and failures of the device underneath a build helper.
#[derive(Debug, thiserror::Error)]
pub enum FlashSimError {
    #[error("unknown flash preset {name:?}; valid presets: {valid}")]
    UnknownPreset { name: String, valid: String },
    #[error("preset {name:?} is {kind}, not {wanted}")]
    PresetKind {
        name: String,
        kind: &'static str,
        wanted: &'static str,
    },
    #[error("indirection unit of {iu_bytes} bytes: must be a power of two in 512..=1 MiB")]
    IuSize { iu_bytes: u64 },
    #[error("capacity {capacity_bytes} bytes is not a positive multiple of the {iu_bytes}-byte indirection unit")]
    CapacityNotIuMultiple { capacity_bytes: u64, iu_bytes: u64 },
    #[error("capacity {capacity_bytes} bytes holds {iu_count} indirection units; the model maps at most {max}")]
    TooManyIus {
        capacity_bytes: u64,
        iu_count: u64,
        max: u64,
    },
    #[error("superblock of {superblock_bytes} bytes: must be a positive multiple of the {iu_bytes}-byte indirection unit")]
    SuperblockSize {
        superblock_bytes: u64,
        iu_bytes: u64,
    },
    #[error("superblock divisor {divisor}: must be at least 1")]
    SuperblockDivisor { divisor: u64 },
    #[error("spare factor {spare_factor}: must be in [0, 0.9]")]
    SpareFactor { spare_factor: f64 },
    #[error("physical space {physical_bytes} bytes is too small for {logical_bytes} logical bytes: GC needs at least {needed_bytes}")]
    PhysicalTooSmall {
        physical_bytes: u64,
        logical_bytes: u64,
        needed_bytes: u64,
    },
    #[error(
        "{op} at offset {offset} length {len}: outside the modelled capacity {capacity_bytes}"
    )]
    OutOfRange {
        op: ModelOp,
        offset: u64,
        len: u64,
        capacity_bytes: u64,
    },
    #[error("timing parameter {name} = {value}: must be finite and positive")]
    Timing { name: &'static str, value: f64 },
    #[error("zone erase unit of {erase_unit_bytes} bytes: must be positive")]
    EraseUnit { erase_unit_bytes: u64 },
    #[error("building the inner device: {0}")]
    Device(#[from] DeviceError),
    #[error("building the inner zoned device: {0}")]
    Zone(#[from] ZoneError),
}
