//! The ZoneCleaner is the Mover in the GC role (see `compaction/compactor.rs`): victims
//! are closed zones chosen by the GC policy; live blocks go to the volume stream's own
//! GC zone; emptied zones are reset after the next durability point.

use shale_format::RegionRole;

use crate::compaction::compactor::Mover;
use crate::gc::policy::GcPolicyKind;

pub(crate) fn zone_cleaner(policy: GcPolicyKind, streams: u32) -> Mover {
    Mover::new(RegionRole::Gc, policy.policy(), streams)
}
