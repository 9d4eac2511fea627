//! The block-status query behind NBD BLOCK_STATUS (`Request::Allocation`): which bytes
//! of a range are mapped.
//!
//! A block is mapped when its L2P entry names a PBA: written and not since trimmed.
//! Write-zeroes unmaps whole blocks (DESIGN.md: "unmap; invalidate"), so they report
//! unmapped; its partial edge blocks are read-modify-written and stay mapped.
//!
//! Cost: an L2P page never written answers its 1024 blocks without I/O; a cached page
//! is copied; any other page is read from the cache device (CRC-checked) without
//! entering the page cache, so a wide scan does not evict the working set. At most
//! `ALLOCATION_QUERY_BYTES_MAX` per query bounds both the I/O (256 page reads) and the
//! reply.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Pba, VolumeId};

use crate::core::Core;
use crate::layout::BS;
use crate::request::{Extent, ALLOCATION_QUERY_BYTES_MAX};
use crate::{Clock, EngineError};

/// Appends `len` bytes of `mapped` state, merging with the previous extent.
fn push(out: &mut Vec<Extent>, len: u64, mapped: bool) {
    if len == 0 {
        return;
    }
    match out.last_mut() {
        Some(last) if last.mapped == mapped => last.len += len,
        _ => out.push(Extent { len, mapped }),
    }
}

/// Extents covering exactly `[offset, offset + len)`, in order, adjacent extents
/// of equal state merged.
pub(crate) fn block_status(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    volume: VolumeId,
    offset: u64,
    len: u64,
) -> Result<Vec<Extent>, EngineError> {
    core.validate_range(volume, offset, len, false)?;
    if len > ALLOCATION_QUERY_BYTES_MAX {
        return Err(EngineError::TooLarge {
            volume,
            len,
            max: ALLOCATION_QUERY_BYTES_MAX,
        });
    }
    let end = offset + len;
    if core.volumes.is_dual(volume) {
        return dual_block_status(core, volume, offset, end);
    }
    // An L2P entry maps a block, or a unit of a volume mapped in units.
    let unit = BS << core.volumes.shift(volume);
    // Bytes of entries [a, b) that lie inside the request.
    let bytes = |a: u64, b: u64| (b * unit).min(end) - (a * unit).max(offset);
    let mut out = Vec::new();
    let mut page = Box::new([Pba::NONE; crate::l2p::MAX_EPP]);
    let epp = core.l2p.format().entries_per_page();
    let first = offset / unit;
    let last = (end - 1) / unit;
    let mut lba = first;
    while lba <= last {
        let p = lba / epp;
        let stop = ((p + 1) * epp).min(last + 1);
        if !core
            .l2p
            .peek_page(&mut core.cache, volume, p as usize, &mut page)?
        {
            push(&mut out, bytes(lba, stop), false);
            lba = stop;
            continue;
        }
        while lba < stop {
            let mapped = !page[(lba % epp) as usize].is_none();
            let mut run_end = lba + 1;
            while run_end < stop && page[(run_end % epp) as usize].is_none() != mapped {
                run_end += 1;
            }
            push(&mut out, bytes(lba, run_end), mapped);
            lba = run_end;
        }
    }
    core.stats.allocation_queries += 1;
    Ok(out)
}

/// [`block_status`] of a dual volume: block by block, through both its maps.
fn dual_block_status(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    volume: VolumeId,
    offset: u64,
    end: u64,
) -> Result<Vec<Extent>, EngineError> {
    let mut peek = crate::read::peek::MapPeek::default();
    let mut out = Vec::new();
    for lba in offset / BS..end.div_ceil(BS) {
        let mapped = peek
            .lookup(core, volume, lba)?
            .is_some_and(|p| !p.is_none());
        let bytes = ((lba + 1) * BS).min(end) - (lba * BS).max(offset);
        push(&mut out, bytes, mapped);
    }
    core.stats.allocation_queries += 1;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use shale_device::{MemDevice, ZoneEmu, ZoneEmuConfig};

    use super::*;
    use crate::{Config, Engine, ManualClock, Reply, Request};
    use shale_format::VolumeUid;

    type E = Engine<MemDevice, ZoneEmu<MemDevice>, ManualClock>;

    fn devices(cache_blocks: u64, zones: u64, zone_blocks: u64) -> (MemDevice, ZoneEmu<MemDevice>) {
        let cache = MemDevice::new(cache_blocks * BS, 4096).unwrap();
        let inner = MemDevice::new((zones + 2) * zone_blocks * BS, 4096).unwrap();
        let mut zc = ZoneEmuConfig::new(zone_blocks * BS);
        zc.zone_count_max = zones as u32;
        zc.max_open_zones = 8;
        zc.max_active_zones = 8;
        (cache, ZoneEmu::format(inner, &zc).unwrap())
    }

    fn config() -> Config {
        Config {
            chunk_blocks: 256,
            volumes_max: 4,
            spare_factor: 0.2,
            journal_blocks: 16,
            l2p_cache_bytes_max: Some(16 * 4096),
            l2p_reserved_pages: 2,
            write_buffers_max: 4,
            request_bytes_max: 64 * 1024,
            streams_max: 2,
            ..Config::default()
        }
    }

    fn call(e: &mut E, req: Request) -> Result<Reply, EngineError> {
        let slot = Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        e.submit(req, Box::new(move |r| *s2.lock().unwrap() = Some(r)));
        for _ in 0..1_000_000 {
            if let Some(r) = slot.lock().unwrap().take() {
                return r;
            }
            if !e.poll() {
                e.wait_io();
            }
        }
        panic!("request never completed");
    }

    fn create(e: &mut E, size_bytes: u64) -> VolumeUid {
        let r = call(
            e,
            Request::CreateVolume {
                name: "v".into(),
                size_bytes,
            },
        );
        match r.unwrap() {
            Reply::Volume(v) => v.uid,
            r => panic!("unexpected {r:?}"),
        }
    }

    fn alloc(
        e: &mut E,
        volume: VolumeUid,
        offset: u64,
        len: u64,
    ) -> Result<Vec<Extent>, EngineError> {
        match call(
            e,
            Request::Allocation {
                volume,
                offset,
                len,
            },
        )? {
            Reply::Allocation(x) => Ok(x),
            r => panic!("unexpected {r:?}"),
        }
    }

    fn req(e: &mut E, r: Request) {
        call(e, r).unwrap();
    }

    fn write(e: &mut E, volume: VolumeUid, offset: u64, len: usize) {
        req(
            e,
            Request::Write {
                volume,
                offset,
                data: vec![0xA5; len],
                fua: false,
            },
        );
    }

    /// What the query must answer, from a per-block model, byte by byte.
    fn expected(mapped: &[bool], offset: u64, len: u64) -> Vec<Extent> {
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let b = at / BS;
            let stop = ((b + 1) * BS).min(offset + len);
            push(&mut out, stop - at, mapped[b as usize]);
            at = stop;
        }
        out
    }

    fn check_all(e: &mut E, v: VolumeUid, mapped: &[bool]) {
        let size = mapped.len() as u64 * BS;
        let ranges = [
            (0, size),
            (1, size - 1),
            (100, 3 * BS),
            (BS - 1, 2),
            (4 * BS + 7, 1500 * BS + 9),
            (1023 * BS + 4000, 2 * BS),
            (size - 5000, 5000),
        ];
        for (offset, len) in ranges {
            let got = alloc(e, v, offset, len).unwrap();
            assert_eq!(got, expected(mapped, offset, len), "range {offset}+{len}");
            assert_eq!(got.iter().map(|x| x.len).sum::<u64>(), len);
            assert!(got.windows(2).all(|w| w[0].mapped != w[1].mapped));
        }
    }

    /// Writes, trims (whole and partial blocks) and write-zeroes (whole and partial
    /// blocks), checked against a per-block model before and after a clean reopen.
    #[test]
    fn extents_follow_writes_trims_and_write_zeroes() {
        let (c, z) = devices(128 + 8 * 256, 28, 256);
        let mut e = E::format(c, z, ManualClock::new(), config()).unwrap();
        let blocks = 3000u64; // three L2P pages, the last one partial
        let v = create(&mut e, blocks * BS);
        let mut mapped = vec![false; blocks as usize];
        check_all(&mut e, v, &mapped);
        assert_eq!(
            alloc(&mut e, v, 0, blocks * BS).unwrap(),
            vec![Extent {
                len: blocks * BS,
                mapped: false
            }]
        );

        // An unaligned write maps every block it touches.
        write(&mut e, v, 10 * BS + 100, 2 * 4096);
        mapped[10..13].fill(true);
        write(&mut e, v, 1020 * BS, 8 * 4096); // across a page boundary
        mapped[1020..1028].fill(true);
        write(&mut e, v, (blocks - 1) * BS, 4096);
        mapped[blocks as usize - 1] = true;
        for b in (1500..1600).step_by(3) {
            write(&mut e, v, b * BS, 4096);
            mapped[b as usize] = true;
        }
        check_all(&mut e, v, &mapped);

        // Trim unmaps whole blocks only.
        req(
            &mut e,
            Request::Trim {
                volume: v,
                offset: 11 * BS,
                len: BS,
            },
        );
        mapped[11] = false;
        req(
            &mut e,
            Request::Trim {
                volume: v,
                offset: 1021 * BS + 1,
                len: BS,
            },
        );
        check_all(&mut e, v, &mapped);

        // Write-zeroes unmaps whole blocks; a partial edge is written (zeros), so mapped.
        req(
            &mut e,
            Request::WriteZeroes {
                volume: v,
                offset: 1022 * BS,
                len: 3 * BS + 10,
            },
        );
        mapped[1022..1025].fill(false);
        mapped[1025] = true;
        req(
            &mut e,
            Request::WriteZeroes {
                volume: v,
                offset: 200 * BS + 5,
                len: 10,
            },
        );
        mapped[200] = true;
        check_all(&mut e, v, &mapped);

        req(&mut e, Request::Flush);
        let (c, z) = e.shutdown().unwrap();
        let z = ZoneEmu::open(z.into_inner()).unwrap();
        let mut e = E::open(c, z, ManualClock::new(), config()).unwrap();
        check_all(&mut e, v, &mapped);
        e.self_check().unwrap();
    }

    /// Never-written L2P pages answer without I/O; other pages are read without
    /// entering the page cache (no eviction, no hit/miss accounting).
    #[test]
    fn never_written_pages_cost_no_io_and_scans_do_not_pollute_the_cache() {
        let (c, z) = devices(128 + 8 * 256, 48, 256);
        let mut e = E::format(c, z, ManualClock::new(), config()).unwrap();
        let v = create(&mut e, 5 * 1024 * BS);
        write(&mut e, v, 2 * 1024 * BS + 77 * BS, 4096);
        req(&mut e, Request::Flush);
        let (c, z) = e.shutdown().unwrap();
        let z = ZoneEmu::open(z.into_inner()).unwrap();
        // The census's own page reads (in the background otherwise) would be counted.
        let sync_census = Config {
            census_in_background: false,
            ..config()
        };
        let mut e = E::open(c, z, ManualClock::new(), sync_census).unwrap();
        let before = e.stats();
        // Pages 0, 1, 3 and 4 were never written.
        let got = alloc(&mut e, v, 0, 2 * 1024 * BS).unwrap();
        assert_eq!(
            got,
            vec![Extent {
                len: 2048 * BS,
                mapped: false
            }]
        );
        let got = alloc(&mut e, v, 3 * 1024 * BS, 2 * 1024 * BS).unwrap();
        assert_eq!(got.len(), 1);
        let mid = e.stats();
        assert_eq!(mid.l2p_page_reads, before.l2p_page_reads);
        // Page 2 is on the device only: one read, and it stays out of the cache.
        let got = alloc(&mut e, v, 0, 5 * 1024 * BS).unwrap();
        let b = 2048 + 77;
        assert_eq!(
            got,
            vec![
                Extent {
                    len: b * BS,
                    mapped: false
                },
                Extent {
                    len: BS,
                    mapped: true
                },
                Extent {
                    len: (5 * 1024 - b - 1) * BS,
                    mapped: false
                },
            ]
        );
        let after = e.stats();
        assert_eq!(after.l2p_page_reads, mid.l2p_page_reads + 1);
        assert_eq!(after.l2p_cached_pages, mid.l2p_cached_pages);
        assert_eq!(
            after.l2p_hits + after.l2p_misses,
            mid.l2p_hits + mid.l2p_misses
        );
        assert_eq!(after.allocation_queries, before.allocation_queries + 3);
    }

    #[test]
    fn bad_ranges_are_refused() {
        // A sparse 2 GiB capacity, so a volume can exceed the per-query cap.
        let (c, z) = devices(4 * 1024 + 16 * 1024, 512, 1024);
        let cfg = Config {
            chunk_blocks: 1024,
            l2p_cache_bytes_max: None,
            ..config()
        };
        let mut e = E::format(c, z, ManualClock::new(), cfg).unwrap();
        let size = ALLOCATION_QUERY_BYTES_MAX + 8 * BS;
        let v = create(&mut e, size);
        assert!(matches!(
            alloc(&mut e, VolumeUid(99), 0, 1),
            Err(EngineError::NoSuchVolume { .. })
        ));
        assert!(matches!(
            alloc(&mut e, v, 0, 0),
            Err(EngineError::ZeroLength { .. })
        ));
        assert!(matches!(
            alloc(&mut e, v, size - 1, 2),
            Err(EngineError::OutOfRange { .. })
        ));
        assert!(matches!(
            alloc(&mut e, v, u64::MAX, 2),
            Err(EngineError::OutOfRange { .. })
        ));
        assert!(matches!(
            alloc(&mut e, v, 0, ALLOCATION_QUERY_BYTES_MAX + 1),
            Err(EngineError::TooLarge { .. })
        ));
        let whole = alloc(&mut e, v, 8 * BS - 1, ALLOCATION_QUERY_BYTES_MAX).unwrap();
        assert_eq!(
            whole,
            vec![Extent {
                len: ALLOCATION_QUERY_BYTES_MAX,
                mapped: false
            }]
        );
    }

    #[test]
    fn push_merges_equal_neighbours_and_drops_empty() {
        let mut v = Vec::new();
        push(&mut v, 0, true);
        push(&mut v, 5, false);
        push(&mut v, 3, false);
        push(&mut v, 2, true);
        push(&mut v, 0, false);
        push(&mut v, 1, true);
        assert_eq!(
            v,
            vec![
                Extent {
                    len: 8,
                    mapped: false
                },
                Extent {
                    len: 3,
                    mapped: true
                }
            ]
        );
    }
}
