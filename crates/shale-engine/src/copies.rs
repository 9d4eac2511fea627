//! Metadata read again from a device's other copies.
//!
//! Every structure Shale reads is checked (CRC32C, magic, generation). On a mirrored
//! cache, a structure failing its check on one mirror may be intact on another, and in
//! a capacity array it can be decoded from the other shards: `BlockDevice::read_rebuilt`
//! and `ZonedDevice::read_rebuilt` read the `attempt`-th other copy. A device without
//! redundancy answers `Unsupported` at once, so on one device these paths cost nothing.

use shale_device::{BlockDevice, ZonedDevice};

/// Copies tried before giving up (a mirror has one per member; an array one per
/// member it can leave out).
pub(crate) const REBUILD_ATTEMPTS_MAX: u32 = 8;

/// Reads copy after copy into `buf` (`read(attempt, buf)`, false when none is left)
/// until `ok` accepts one; returns the attempt that did.
fn first_good(
    buf: &mut [u8],
    mut read: impl FnMut(u32, &mut [u8]) -> bool,
    mut ok: impl FnMut(&[u8]) -> bool,
) -> Option<u32> {
    for attempt in 0..REBUILD_ATTEMPTS_MAX {
        if !read(attempt, buf) {
            return None;
        }
        if ok(buf) {
            return Some(attempt);
        }
    }
    None
}

/// Reads `buf` at `off` from the cache's other copies in turn until `ok` accepts one
/// (`buf` then holds it) and returns whether one did. With `mend`, the accepted bytes
/// are written back in place on every mirror, so the copy that failed is repaired;
/// callers mend only where nothing else may be writing that range.
pub(crate) fn reread<C: BlockDevice + ?Sized>(
    dev: &mut C,
    what: &'static str,
    off: u64,
    buf: &mut [u8],
    mend: bool,
    ok: impl FnMut(&[u8]) -> bool,
) -> bool {
    let read = |attempt, b: &mut [u8]| dev.read_rebuilt(off, b, attempt).is_ok();
    let Some(attempt) = first_good(buf, read, ok) else {
        return false;
    };
    tracing::warn!(
        what,
        offset = off,
        attempt,
        "damaged on one cache mirror; read from another"
    );
    if mend {
        if let Err(e) = dev.write_at(off, buf) {
            tracing::warn!(what, offset = off, error = %e, "mending a damaged copy failed");
        }
    }
    true
}

/// [`reread`] for the capacity device: copies decoded from an array's other shards.
/// Nothing is written back (a capacity block is repaired by rewriting it elsewhere).
pub(crate) fn reread_capacity<Z: ZonedDevice + ?Sized>(
    dev: &mut Z,
    what: &'static str,
    off: u64,
    buf: &mut [u8],
    ok: impl FnMut(&[u8]) -> bool,
) -> bool {
    let read = |attempt, b: &mut [u8]| dev.read_rebuilt(off, b, attempt).is_ok();
    let Some(attempt) = first_good(buf, read, ok) else {
        return false;
    };
    tracing::warn!(
        what,
        offset = off,
        attempt,
        "damaged on the capacity device; rebuilt from its redundancy"
    );
    true
}
