//! Entry points shared by the cargo-fuzz targets (`fuzz/` at the repository root) and
//! the stable stand-in (`tests/fuzz_corpus.rs`), so both exercise the same code.
//!
//! [`zone_table`] takes the start of a conventional device under zone emulation (its
//! geometry copies and zone table slots) behind one control byte: bit 0 reseals the
//! checksums before anything reads them (a mutated field would otherwise almost never
//! get past the CRC32C), bit 1 picks a 512-byte instead of a 4 KiB logical block, and
//! bits 2..8 add that many zero 4 KiB blocks behind the image, so the zones a geometry
//! describes can fit without the input holding them.

use crate::zone_meta::{
    decode_geometry, decode_table, decode_table_block, reseal_table_block, table_blocks,
    META_BLOCK_BYTES, META_VERSION_WHOLE, TABLE_ENTRY_BYTES, TABLE_HEADER_BYTES,
    TABLE_SLOT0_OFFSET,
};
use crate::{BlockDevice, MemDevice, ZoneEmu, ZoneState, ZonedDevice};

/// Reseals both geometry copies, then both table slots as the first valid geometry
/// places them.
fn reseal(image: &mut [u8]) {
    let block = META_BLOCK_BYTES as usize;
    for copy in 0..2 {
        if let Some(b) = image.get_mut(copy * block..(copy + 1) * block) {
            let crc = crc_fast::crc32_iscsi(&b[..124]);
            b[124..128].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let geometry = (0..2).find_map(|copy| {
        image
            .get(copy * block..(copy + 1) * block)
            .and_then(|b| decode_geometry(b).ok())
    });
    let Some(g) = geometry else {
        return;
    };
    let Ok(slot_bytes) = usize::try_from(g.table_slot_bytes) else {
        return;
    };
    for i in 0..2usize {
        let start = TABLE_SLOT0_OFFSET as usize + i.saturating_mul(slot_bytes);
        let Some(slot) = start
            .checked_add(slot_bytes)
            .and_then(|end| image.get_mut(start..end))
        else {
            continue;
        };
        if g.version != META_VERSION_WHOLE {
            for b in slot.chunks_exact_mut(block) {
                reseal_table_block(b);
            }
            continue;
        }
        let n = g.zone_count as usize;
        let body_end = TABLE_HEADER_BYTES + n * TABLE_ENTRY_BYTES;
        if body_end <= slot.len() {
            let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
            d.update(&slot[..60]);
            d.update(&slot[TABLE_HEADER_BYTES..body_end]);
            let crc = d.finalize() as u32;
            slot[60..64].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

/// The zone emulation metadata: each geometry copy and table slot through the
/// decoders, then the image as a device through the checker and `ZoneEmu::open`. A
/// device that opens must take a write at a zone's write pointer and a flush, and
/// reopen with that write pointer.
pub fn zone_table(data: &[u8]) {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let mut image = rest.to_vec();
    if control & 1 == 1 {
        reseal(&mut image);
    }
    let lbs: u32 = if control & 2 == 2 { 512 } else { 4096 };
    let block = META_BLOCK_BYTES as usize;
    for copy in 0..2 {
        let Some(b) = image.get(copy * block..(copy + 1) * block) else {
            continue;
        };
        if let Ok(g) = decode_geometry(b) {
            for i in 0..2u64 {
                let start = TABLE_SLOT0_OFFSET.saturating_add(i.saturating_mul(g.table_slot_bytes));
                let end = start.saturating_add(g.table_slot_bytes);
                let slot = usize::try_from(start)
                    .ok()
                    .zip(usize::try_from(end).ok())
                    .and_then(|(s, e)| image.get(s..e));
                let Some(slot) = slot else { continue };
                if g.version == META_VERSION_WHOLE {
                    if let Ok((_, entries)) = decode_table(&g, slot) {
                        assert_eq!(entries.len(), g.zone_count as usize);
                    }
                    continue;
                }
                let blocks = table_blocks(u64::from(g.zone_count));
                for (b, bytes) in (0..blocks).zip(slot.chunks_exact(block)) {
                    if let Ok((_, entries)) = decode_table_block(&g, b, bytes) {
                        assert!(entries.len() <= crate::zone_meta::ENTRIES_PER_BLOCK);
                    }
                }
            }
        }
    }

    let image_len = (image.len() as u64).next_multiple_of(u64::from(lbs));
    image.resize(image_len as usize, 0);
    let size = image_len + u64::from(control >> 2) * META_BLOCK_BYTES;
    let Ok(mut dev) = MemDevice::new(size, lbs) else {
        return;
    };
    if !image.is_empty() && dev.write_at(0, &image).is_err() {
        return;
    }
    let _ = ZoneEmu::verify_metadata(&mut dev);
    let Ok(mut emu) = ZoneEmu::open(dev) else {
        return;
    };
    let geo = emu.geometry().clone();
    let mut zones = Vec::new();
    if let Err(e) = emu.report_zones(0, geo.zone_count, &mut zones) {
        panic!("an opened device cannot report its zones: {e}");
    }
    assert_eq!(zones.len(), geo.zone_count as usize);
    let mut target = None;
    for z in &zones {
        assert!(
            z.write_pointer >= z.start && z.write_pointer <= z.start + z.capacity,
            "zone {} write pointer outside the zone: {z:?}",
            z.index
        );
        assert!(
            !matches!(
                z.state,
                ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen
            ),
            "zone {} reopened open: {z:?}",
            z.index
        );
        if target.is_none()
            && matches!(z.state, ZoneState::Empty | ZoneState::Closed)
            && z.write_pointer < z.start + z.capacity
        {
            target = Some(z.clone());
        }
    }
    let Some(z) = target else {
        return;
    };
    let buf = vec![0x5a; lbs as usize];
    if emu.write_at(z.write_pointer, &buf).is_err() || emu.flush().is_err() {
        return;
    }
    let dev = emu.into_inner();
    let reopened = ZoneEmu::open(dev);
    let Ok(emu) = reopened else {
        panic!("a device that took a write and a flush does not reopen: {reopened:?}");
    };
    let after = emu.zone_info(z.index);
    assert_eq!(
        after.as_ref().map(|i| i.write_pointer).ok(),
        Some(z.write_pointer + u64::from(lbs)),
        "zone {} after a flushed write and a reopen: {after:?}",
        z.index
    );
}
