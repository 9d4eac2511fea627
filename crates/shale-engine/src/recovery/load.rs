//! Loading the mirrored and double-buffered structures: the superblock (A/B by
//! generation), the capacity label (two identical copies), the checkpoint areas (A/B
//! by generation) and the volume table copies. A damaged copy is reported and the
//! other one used when that is safe; when it is not, the open fails with the copy's
//! decoding error. A copy that fails its check on one cache mirror is read from the
//! others first (`crate::copies`).

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{
    CapacityLabel, Checkpoint, FormatError, Superblock, VolumeTable, BLOCK_SIZE, LABEL_COPIES,
};

use super::{Meter, OpenReport};
use crate::copies::reread;
use crate::layout::BS;
use crate::{EngineError, OpenError};

/// The superblock copy with the higher generation among the valid ones.
pub(crate) fn superblock<C: BlockDevice>(
    cache: &mut C,
    report: &mut OpenReport,
) -> Result<Superblock, OpenError> {
    let mut b = vec![0u8; 2 * BLOCK_SIZE];
    cache
        .read_at(0, &mut b)
        .map_err(|e| OpenError::Engine(EngineError::cache("superblock read", 0)(e)))?;
    // A copy damaged here may be intact on another cache mirror.
    for (i, copy) in b.chunks_mut(BLOCK_SIZE).enumerate() {
        let at = i as u64 * BS;
        if Superblock::decode(copy, at).is_err() {
            reread(cache, "superblock", at, copy, true, |x| {
                Superblock::decode(x, at).is_ok()
            });
        }
    }
    let a = Superblock::decode(&b[..BLOCK_SIZE], 0);
    let bb = Superblock::decode(&b[BLOCK_SIZE..], BS);
    Ok(match (a, bb) {
        (Ok(x), Ok(y)) => {
            if x.uuid != y.uuid {
                report.warn(format!(
                    "superblock copies name different devices (generations {} and {}): an interrupted format? using the newer",
                    x.generation, y.generation
                ));
            }
            if y.generation > x.generation {
                y
            } else {
                x
            }
        }
        (Ok(x), Err(e)) | (Err(e), Ok(x)) => {
            report.warn(format!(
                "superblock copy damaged ({e}); using the other copy (generation {})",
                x.generation
            ));
            x
        }
        (Err(a), Err(b)) => return Err(OpenError::NoSuperblock { a, b }),
    })
}

/// The capacity label (both copies must agree when both are valid).
pub(crate) fn label<Z: ZonedDevice>(
    capacity: &mut Z,
    report: &mut OpenReport,
) -> Result<CapacityLabel, OpenError> {
    let mut b = vec![0u8; LABEL_COPIES * BLOCK_SIZE];
    capacity
        .read_at(0, &mut b)
        .map_err(|source| OpenError::LabelUnreadable { source })?;
    let a = CapacityLabel::decode(&b[..BLOCK_SIZE], 0);
    let bb = CapacityLabel::decode(&b[BLOCK_SIZE..2 * BLOCK_SIZE], BS);
    match (a, bb) {
        (Ok(x), Ok(y)) => {
            if x != y {
                return Err(OpenError::BadLabel(FormatError::InvalidField {
                    structure: shale_format::Structure::CapacityLabel,
                    at: BS,
                    field: "copy",
                    reason: "the two label copies differ".into(),
                }));
            }
            Ok(x)
        }
        (Ok(x), Err(e)) | (Err(e), Ok(x)) => {
            report.warn(format!(
                "capacity label copy damaged ({e}); using the other copy"
            ));
            Ok(x)
        }
        (Err(a), Err(_)) => {
            // Both copies sit in one stripe unit of an array: the device may rebuild
            // them from its redundancy.
            for attempt in 0..crate::read::reader::REBUILD_ATTEMPTS_MAX {
                if capacity.read_rebuilt(0, &mut b, attempt).is_err() {
                    break;
                }
                if let Ok(x) = CapacityLabel::decode(&b[..BLOCK_SIZE], 0)
                    .or_else(|_| CapacityLabel::decode(&b[BLOCK_SIZE..2 * BLOCK_SIZE], BS))
                {
                    report.warn(format!(
                        "capacity label damaged on the device ({a}); rebuilt from its redundancy"
                    ));
                    return Ok(x);
                }
            }
            Err(OpenError::BadLabel(a))
        }
    }
}

/// The checkpoint to load and its area.
///
/// The area the superblock names must be valid: it was durable before the superblock
/// was written, so damage to it is corruption, never a crash. The other area is taken
/// instead when it holds a valid checkpoint of a higher generation: it was complete and
/// its L2P pages durable before it was written, whether the crash came before the
/// superblock naming it, or that superblock copy is the damaged one.
pub(crate) fn checkpoint<C: BlockDevice>(
    cache: &mut C,
    sb: &Superblock,
    report: &mut OpenReport,
    bytes: &mut u64,
    meter: &mut Meter<'_>,
) -> Result<(Checkpoint, u8), OpenError> {
    let named = sb.active_checkpoint;
    // The volumes have at most as many L2P pages as the L2P area has pool pages.
    let max_pages = u64::from(sb.layout.l2p_pool_pages);
    let read_err = |off| move |e| OpenError::Engine(EngineError::cache("checkpoint read", off)(e));
    // Both headers first: an unwritten area need not be read in full, and the two
    // payloads are the step's total.
    let header = |cache: &mut C, area: u8, bytes: &mut u64| -> Result<Area, OpenError> {
        let off = sb.layout.checkpoint_start(area) * BS;
        let mut head = vec![0u8; BLOCK_SIZE];
        cache.read_at(off, &mut head).map_err(read_err(off))?;
        *bytes += BS;
        if shale_format::CheckpointHeader::decode(&head, off).is_err() {
            reread(cache, "checkpoint header", off, &mut head, true, |x| {
                shale_format::CheckpointHeader::decode(x, off).is_ok()
            });
        }
        let payload_blocks = shale_format::CheckpointHeader::decode(&head, off).map(|h| {
            h.payload_bytes
                .div_ceil(BS)
                .min(u64::from(sb.layout.checkpoint_blocks) - 1)
        });
        Ok(Area {
            off,
            head,
            payload_blocks,
        })
    };
    let read = |cache: &mut C,
                area: Area,
                bytes: &mut u64,
                meter: &mut Meter<'_>|
     -> Result<Result<Checkpoint, FormatError>, OpenError> {
        let payload_blocks = match area.payload_blocks {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        let end = (1 + payload_blocks as usize) * BLOCK_SIZE;
        let mut cb = vec![0u8; end];
        cb[..BLOCK_SIZE].copy_from_slice(&area.head);
        // In pieces, so that the L2P directories of a large pool show progress.
        for (i, piece) in cb[BLOCK_SIZE..]
            .chunks_mut(CHECKPOINT_READ_PIECE_BYTES)
            .enumerate()
        {
            let off = area.off + BS + (i * CHECKPOINT_READ_PIECE_BYTES) as u64;
            cache.read_at(off, piece).map_err(read_err(off))?;
            meter.add((piece.len() / BLOCK_SIZE) as u64);
        }
        *bytes += payload_blocks * BS;
        let mut c = decode_area(&cb, area.off, max_pages);
        if c.is_err()
            && reread(cache, "checkpoint", area.off, &mut cb, true, |x| {
                decode_area(x, area.off, max_pages).is_ok()
            })
        {
            c = decode_area(&cb, area.off, max_pages);
        }
        Ok(c)
    };
    let a = header(cache, named, bytes)?;
    let mut b = header(cache, 1 - named, bytes)?;
    // The other area's payload matters only if its header claims a newer
    // generation: otherwise it is an older checkpoint (or a torn one), and reading
    // it would double the step at scale (the directories are 128 MiB at 64 TiB).
    let generation = |x: &Area| {
        shale_format::CheckpointHeader::decode(&x.head, x.off)
            .ok()
            .map(|h| h.generation)
    };
    let newer = match (generation(&a), generation(&b)) {
        (Some(x), Some(y)) => y > x,
        _ => true,
    };
    if !newer {
        b.payload_blocks = Ok(0);
    }
    meter.start(
        [&a, &b]
            .iter()
            .map(|x| x.payload_blocks.as_ref().map_or(0, |&n| n))
            .sum(),
    );
    let a = read(cache, a, bytes, meter)?;
    let b = if newer {
        Some(read(cache, b, bytes, meter)?)
    } else {
        None
    };
    choose(a, b, named, report)
}

/// The checkpoint to open from: the one the superblock names (`a`), unless the other
/// (`b`, read only when its header claims to be newer) decodes and is newer.
fn choose(
    a: Result<Checkpoint, FormatError>,
    b: Option<Result<Checkpoint, FormatError>>,
    named: u8,
    report: &mut OpenReport,
) -> Result<(Checkpoint, u8), OpenError> {
    match (a, b) {
        (Ok(x), Some(Ok(y))) if y.header.generation > x.header.generation => {
            report.warn(format!(
                "checkpoint area {} (generation {}) is newer than the one the superblock names (generation {}): the crash came before the superblock write, or that superblock copy is damaged; using the newer",
                1 - named,
                y.header.generation,
                x.header.generation
            ));
            Ok((y, 1 - named))
        }
        (Ok(x), None | Some(Ok(_))) => Ok((x, named)),
        (Ok(x), Some(Err(e))) => {
            // Torn by a crash during a checkpoint, or damaged: not in use either way.
            report.warn(format!(
                "checkpoint area {} (not in use) does not decode: {e}",
                1 - named
            ));
            Ok((x, named))
        }
        (Err(source), _) => Err(OpenError::BadCheckpoint {
            area: named,
            source,
        }),
    }
}

/// Bytes of a checkpoint area read at once (the area is megabytes at TiB scale).
const CHECKPOINT_READ_PIECE_BYTES: usize = 1 << 20;

/// A checkpoint area's header block and how many payload blocks follow it.
struct Area {
    off: u64,
    head: Vec<u8>,
    payload_blocks: Result<u64, FormatError>,
}

/// Decodes a checkpoint area read up to the end of its payload's last block. That
/// block is zero past the payload: anything else there is damage the payload CRC
/// does not cover.
pub(crate) fn decode_area(cb: &[u8], off: u64, max_pages: u64) -> Result<Checkpoint, FormatError> {
    let c = Checkpoint::decode_bounded(cb, off, max_pages)?;
    let used = BLOCK_SIZE + c.header.payload_bytes as usize;
    if let Some(i) = cb[used.min(cb.len())..].iter().position(|&x| x != 0) {
        return Err(FormatError::InvalidField {
            structure: shale_format::Structure::CheckpointHeader,
            at: off + (used + i) as u64,
            field: "padding",
            reason: "non-zero byte after the payload".into(),
        });
    }
    Ok(c)
}

/// Checks the standalone volume table copies against the checkpoint's (which is the
/// one in force: a volume change is complete when its checkpoint is).
pub(crate) fn volume_tables<C: BlockDevice>(
    cache: &mut C,
    sb: &Superblock,
    ck: &Checkpoint,
    report: &mut OpenReport,
    bytes: &mut u64,
) -> Result<(), OpenError> {
    let off = sb.layout.volume_table_start * BS;
    let copy_len = sb.layout.volume_table_copy_blocks() as usize * BLOCK_SIZE;
    let mut b = vec![0u8; 2 * copy_len];
    cache
        .read_at(off, &mut b)
        .map_err(|e| OpenError::Engine(EngineError::cache("volume table read", off)(e)))?;
    *bytes += 2 * copy_len as u64;
    for (i, copy) in b.chunks_mut(copy_len).enumerate() {
        let at = off + (i * copy_len) as u64;
        if VolumeTable::decode(copy, at).is_err() {
            reread(cache, "volume table", at, copy, true, |x| {
                VolumeTable::decode(x, at).is_ok()
            });
        }
    }
    let copies = [
        VolumeTable::decode(&b[..copy_len], off),
        VolumeTable::decode(&b[copy_len..], off + copy_len as u64),
    ];
    let mut newest: Option<&VolumeTable> = None;
    for (i, c) in copies.iter().enumerate() {
        match c {
            Ok(t) => {
                if newest.is_none_or(|n| t.generation > n.generation) {
                    newest = Some(t);
                }
            }
            Err(e) => report.warn(format!(
                "volume table copy {i} damaged ({e}); the checkpoint's copy is used"
            )),
        }
    }
    let ckg = ck.volumes.generation;
    match newest {
        Some(t) if t.generation > ckg => report.warn(format!(
            "volume table copy generation {} is newer than the checkpoint's ({ckg}): a volume change the crash interrupted; it did not take effect",
            t.generation
        )),
        Some(t) if t.generation == ckg && *t != ck.volumes => report.warn(format!(
            "volume table copy generation {ckg} differs from the checkpoint's copy; the checkpoint's is used"
        )),
        Some(t) if t.generation < ckg => report.warn(format!(
            "volume table copies (newest generation {}) are older than the checkpoint's ({ckg}); the checkpoint's is used",
            t.generation
        )),
        _ => {}
    }
    Ok(())
}
