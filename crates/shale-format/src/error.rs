use std::fmt;

/// Which structure a decoder was reading; carried by every [`FormatError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    Superblock,
    CapacityLabel,
    MdBlock,
    RegionTable,
    L2pDirectory,
    L2pSwitches,
    VolumeTable,
    JournalBlock,
    CheckpointHeader,
    ArrayLabel,
    Handoff,
}

impl fmt::Display for Structure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Structure::Superblock => "superblock",
            Structure::CapacityLabel => "capacity label",
            Structure::MdBlock => "md block",
            Structure::RegionTable => "region state table",
            Structure::L2pDirectory => "L2P directory",
            Structure::L2pSwitches => "L2P switch table",
            Structure::VolumeTable => "volume table",
            Structure::JournalBlock => "journal block",
            Structure::CheckpointHeader => "checkpoint header",
            Structure::ArrayLabel => "array member label",
            Structure::Handoff => "hand-off image",
        };
        f.write_str(s)
    }
}

/// Decoding errors. `at` is the byte offset of the structure on its device as given by the
/// caller (decoders do no I/O and only echo it), so a log line names the place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{structure} at byte {at}: bad magic {found:#010x} (expected {expected:#010x})")]
    BadMagic {
        structure: Structure,
        at: u64,
        expected: u32,
        found: u32,
    },
    #[error(
        "{structure} at byte {at}: unsupported version {found} (this build reads {supported})"
    )]
    UnsupportedVersion {
        structure: Structure,
        at: u64,
        supported: u16,
        found: u16,
    },
    #[error(
        "{structure} at byte {at}: CRC32C mismatch (stored {expected:#010x}, computed {got:#010x})"
    )]
    ChecksumMismatch {
        structure: Structure,
        at: u64,
        expected: u32,
        got: u32,
    },
    #[error("{structure} at byte {at}: truncated ({len} bytes, need {need})")]
    Truncated {
        structure: Structure,
        at: u64,
        len: usize,
        need: usize,
    },
    #[error("{structure} at byte {at}: invalid field {field}: {reason}")]
    InvalidField {
        structure: Structure,
        at: u64,
        field: &'static str,
        reason: String,
    },
}
