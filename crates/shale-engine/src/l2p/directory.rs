//! A volume's L2P directory and which pages are cached.

use shale_format::{L2pFormat, PageDesc, L2P_SLOT_NONE};

pub(crate) const FRAME_NONE: u32 = u32::MAX;
/// A `frame` value with this bit set (other than `FRAME_NONE`) is not a frame but the
/// head of the page's deferred-switch chain: a page is never both cached and deferred.
pub(crate) const DEFERRED_BIT: u32 = 1 << 31;

#[derive(Debug, Clone)]
pub(crate) struct VolumeMap {
    /// Newest durable-or-written copy of each page.
    pub dir: Vec<PageDesc>,
    /// The slot the last durable checkpoint references for each page.
    pub ckpt_slot: Vec<u32>,
    /// Cache frame holding each page, or `DEFERRED_BIT` | the head of its deferred
    /// switches, or FRAME_NONE.
    pub frame: Vec<u32>,
    /// Entries of the volume's map: one per block, or per mapping unit.
    pub entries: u64,
}

impl VolumeMap {
    pub fn new(fmt: L2pFormat, entries: u64) -> VolumeMap {
        let pages = fmt.pages_for(entries) as usize;
        VolumeMap {
            dir: vec![PageDesc::NONE; pages],
            ckpt_slot: vec![L2P_SLOT_NONE; pages],
            frame: vec![FRAME_NONE; pages],
            entries,
        }
    }

    pub fn from_dir(dir: Vec<PageDesc>, entries: u64) -> VolumeMap {
        let n = dir.len();
        VolumeMap {
            ckpt_slot: dir.iter().map(|d| d.slot).collect(),
            dir,
            frame: vec![FRAME_NONE; n],
            entries,
        }
    }
}
