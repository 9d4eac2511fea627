//! Reading the journal written since the checkpoint.
//!
//! Entries are taken from the checkpoint's ring position while their sequence numbers
//! are consecutive and their epoch is the checkpoint's generation or the next one (an
//! incremental checkpoint that had begun but not committed), never decreasing. Each
//! entry is a pair of identical blocks: one damaged copy is reported and the other
//! used. The first entry with no usable copy ends the journal: a durability point
//! writes its entries and then flushes, so only the entries of the last one (whose
//! flush did not complete) can be missing or torn, and they were never acknowledged.
//! Valid entries found after that point are that same interrupted batch: reported and
//! ignored. An entry with neither copy usable is first looked for on the other cache
//! mirrors (damage confined to one mirror is not the end of the journal).

use shale_device::BlockDevice;
use shale_format::{journal_ring_entries, JournalBlock, Superblock, BLOCK_SIZE};

use super::OpenReport;
use crate::copies::reread;
use crate::layout::BS;
use crate::{EngineError, OpenError};

/// The entries since the checkpoint, in order.
#[derive(Debug, Default)]
pub(crate) struct JournalLog {
    pub blocks: Vec<JournalBlock>,
    /// Ring index after the last entry taken.
    pub next: u32,
    /// Sequence number after the last entry taken.
    pub sequence: u64,
    /// Highest epoch seen among the entries taken.
    pub max_epoch: u64,
}

/// Reads the whole ring (it is small) and takes the entries since the checkpoint.
pub(crate) fn read<C: BlockDevice>(
    cache: &mut C,
    sb: &Superblock,
    epoch: u64,
    start: u32,
    sequence: u64,
    report: &mut OpenReport,
    bytes: &mut u64,
) -> Result<JournalLog, OpenError> {
    let entries = journal_ring_entries(sb.layout.journal_blocks).max(1);
    let off = sb.layout.journal_start * BS;
    let mut ring = vec![0u8; 2 * entries as usize * BLOCK_SIZE];
    cache
        .read_at(off, &mut ring)
        .map_err(|e| OpenError::Engine(EngineError::cache("journal read", off)(e)))?;
    *bytes += ring.len() as u64;
    let mut ring = Ring { bytes: ring, off };
    let fits = |blk: &JournalBlock, seq: u64, min_epoch: u64| {
        blk.sequence == seq && blk.epoch >= min_epoch && blk.epoch <= epoch + 1
    };
    let mut log = JournalLog {
        next: start % entries,
        sequence,
        max_epoch: epoch,
        ..Default::default()
    };
    let mut min_epoch = epoch;
    for _ in 0..entries {
        let i = log.next;
        let usable = |r: &Ring| {
            (0..2).any(|c| {
                r.decode(i, c)
                    .is_ok_and(|x| fits(&x, log.sequence, min_epoch))
            })
        };
        if !usable(&ring) {
            // The end of the journal, or both copies damaged on this cache mirror: another
            // mirror's pair, if it has one that fits, is taken (and mended here).
            let at = ring.off + u64::from(2 * i) * BS;
            let mut pair = ring.pair(i).to_vec();
            if reread(cache, "journal entry", at, &mut pair, true, |x| {
                let r = Ring {
                    bytes: x.to_vec(),
                    off: at,
                };
                (0..2).any(|c| {
                    r.decode(0, c)
                        .is_ok_and(|x| fits(&x, log.sequence, min_epoch))
                })
            }) {
                ring.pair_mut(i).copy_from_slice(&pair);
            }
        }
        let a = ring.decode(i, 0);
        let b = ring.decode(i, 1);
        let pick = match (&a, &b) {
            (Ok(x), _) if fits(x, log.sequence, min_epoch) => {
                if let Ok(y) = &b {
                    if y != x && fits(y, log.sequence, min_epoch) {
                        report.warn(format!(
                            "journal entry {i} (sequence {}): the two copies differ; copy A used",
                            log.sequence
                        ));
                    }
                } else if let Err(e) = &b {
                    report.warn(format!(
                        "journal entry {i} (sequence {}): copy B damaged ({e}); copy A used",
                        log.sequence
                    ));
                }
                Some(x.clone())
            }
            (_, Ok(y)) if fits(y, log.sequence, min_epoch) => {
                match &a {
                    Err(e) => report.warn(format!(
                        "journal entry {i} (sequence {}): copy A damaged ({e}); copy B used",
                        log.sequence
                    )),
                    Ok(_) => report.warn(format!(
                        "journal entry {i} (sequence {}): copy A is stale (a torn write); copy B used",
                        log.sequence
                    )),
                }
                Some(y.clone())
            }
            _ => None,
        };
        let Some(blk) = pick else { break };
        min_epoch = blk.epoch;
        log.max_epoch = log.max_epoch.max(blk.epoch);
        log.blocks.push(blk);
        log.next = (log.next + 1) % entries;
        log.sequence += 1;
    }
    warn_damage_outside(&ring, entries, start, log.blocks.len() as u32, report);
    warn_interrupted(&ring, entries, &log, min_epoch, epoch, report);
    Ok(log)
}

/// The journal ring as read: two copies of each entry.
struct Ring {
    bytes: Vec<u8>,
    /// Device offset of the ring.
    off: u64,
}

impl Ring {
    fn raw(&self, i: u32, copy: u32) -> &[u8] {
        let b = (2 * i + copy) as usize;
        &self.bytes[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE]
    }

    /// Both copies of entry `i`.
    fn pair(&self, i: u32) -> &[u8] {
        let b = 2 * i as usize;
        &self.bytes[b * BLOCK_SIZE..(b + 2) * BLOCK_SIZE]
    }

    fn pair_mut(&mut self, i: u32) -> &mut [u8] {
        let b = 2 * i as usize;
        &mut self.bytes[b * BLOCK_SIZE..(b + 2) * BLOCK_SIZE]
    }

    fn decode(&self, i: u32, copy: u32) -> Result<JournalBlock, shale_format::FormatError> {
        let at = self.off + u64::from(2 * i + copy) * BS;
        JournalBlock::decode(self.raw(i, copy), at)
    }
}

/// Entries outside the replayed window are not used, but a damaged copy there is still
/// damage.
fn warn_damage_outside(ring: &Ring, entries: u32, start: u32, taken: u32, report: &mut OpenReport) {
    for k in taken..entries {
        let i = (start % entries + k) % entries;
        let zero = |c: u32| ring.raw(i, c).iter().all(|&x| x == 0);
        match (ring.decode(i, 0), ring.decode(i, 1)) {
            (Ok(_), Err(e)) if !zero(1) => report.warn(format!(
                "journal entry {i} (not replayed): copy B damaged ({e})"
            )),
            (Err(e), Ok(_)) if !zero(0) => report.warn(format!(
                "journal entry {i} (not replayed): copy A damaged ({e})"
            )),
            _ => {}
        }
    }
}

/// Anything valid past the replayed window belongs to the batch the crash interrupted.
fn warn_interrupted(
    ring: &Ring,
    entries: u32,
    log: &JournalLog,
    min_epoch: u64,
    epoch: u64,
    report: &mut OpenReport,
) {
    let taken = log.blocks.len() as u32;
    for k in 1..entries.saturating_sub(taken) {
        let i = (log.next + k) % entries;
        let later = [ring.decode(i, 0), ring.decode(i, 1)]
            .into_iter()
            .flatten()
            .find(|blk| {
                blk.sequence > log.sequence && blk.epoch >= min_epoch && blk.epoch <= epoch + 1
            });
        if let Some(blk) = later {
            report.warn(format!(
                "journal entry {i} (sequence {}) follows a missing entry (sequence {}): the unflushed end of an interrupted durability point; ignored",
                blk.sequence, log.sequence
            ));
            break;
        }
    }
}
