//! One type per address. Each is a plain integer on media (little-endian).

use std::fmt;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty), $tag:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl $name {
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($tag, "{}"), self.0)
            }
        }
    };
}

newtype!(
    /// A volume block number (4 KiB units).
    Lba(u64), "lba:"
);
newtype!(
    /// A physical block address over both devices: `0..cache_data_blocks` are cache data
    /// region blocks, the rest capacity blocks. [`Pba::NONE`] means unmapped. On media
    /// a PBA takes 4 or 5 bytes (see [`crate::L2pFormat`]); in memory always 64 bits.
    Pba(u64), "pba:"
);
newtype!(
    /// Sequence id, incremented when a chunk or zone opens.
    Sid(u64), "sid:"
);
newtype!(
    /// A volume's slot in the volume table.
    VolumeId(u32), "vol:"
);
newtype!(
    /// A volume's identity: issued once per pool from the volume table's `uid_next`,
    /// never reused, unlike its slot ([`VolumeId`]).
    VolumeUid(u64), "uid:"
);
newtype!(
    /// A cache chunk.
    ChunkId(u32), "chunk:"
);
newtype!(
    /// A capacity zone (zone 0 holds the capacity label).
    ZoneId(u32), "zone:"
);
newtype!(
    /// Chunks and zones in one index: `0..chunk_count` are chunks, then zones.
    RegionId(u32), "region:"
);

impl Pba {
    /// The unmapped marker (on media: all ones at the field's width).
    pub const NONE: Pba = Pba(u64::MAX);

    pub const fn is_none(self) -> bool {
        self.0 == u64::MAX
    }
}

impl VolumeUid {
    /// The first uid a pool issues (0 is never a volume's).
    pub const FIRST: VolumeUid = VolumeUid(1);
}

impl VolumeId {
    /// Marks "no volume" in md entries of padding and empty slots.
    pub const NONE: VolumeId = VolumeId(u32::MAX);
}
