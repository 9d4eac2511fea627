//! Arrays of devices that look like one device.
//!
//! [`ZoneArray`] puts zoned members behind one `ZonedDevice`: striped (`none`),
//! mirrored, or Reed–Solomon `K+M`, written in full stripes only. [`MirrorDevice`]
//! puts cache devices behind one `BlockDevice`, every write on every mirror. Shale's log
//! structure always writes whole zone groups in order, so a stripe is written once
//! and never updated: no read-modify-write, no write hole. docs/arrays.md has the
//! layout, the failure model and what is promised.

pub mod codec;
pub mod control;
pub mod label;
pub mod layout;
mod member;
mod mirror;
mod zoned;

pub use codec::{CodecError, ErasureCodec, ReedSolomon};
pub use control::{ArrayHandle, ArrayStatus, Command, CommandResult, MemberShape, RebuildStatus};
pub use layout::{LayoutError, Redundancy, StripeLayout, LABEL_ZONES, STRIPE_BYTES_MAX};
pub use member::{MemberCounters, MemberState, MemberStatus};
pub use mirror::{MirrorDevice, MIRROR_RESERVED_BYTES};
pub use zoned::{ArrayError, RebuildLimits, ZoneArray, READ_ERROR_LIMIT};
