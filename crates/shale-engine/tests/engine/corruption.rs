//! One-byte corruption of every kind of metadata block, on a cleanly shut down image
//! and on a crashed one: open either fails with a clear error, or works around the
//! damage and says so when it read the block; reads never return wrong data; and the
//! offline checker reports something it did not report on the intact image. Never a
//! panic.

use crate::common::copy_mem;
use crate::common::rig::{block_of, Model, Rig, BS};
use shale_device::{BlockDevice, CrashMode, FaultDevice, MemDevice, ZoneEmu};
use shale_engine::{check, CheckOptions, Engine, ManualClock, Reply, Request, VolumeUid};
use shale_format::{
    decode_md_header, journal_ring_entries, CacheLayout, Checkpoint, JournalBlock, RegionState,
    Superblock, L2P_SLOT_NONE,
};

const V: VolumeUid = VolumeUid(1);

struct Image {
    cache: MemDevice,
    inner: MemDevice,
    model: Model,
    layout: CacheLayout,
    zone_data_offset: u64,
    zone_bytes: u64,
    chunk_count: u32,
}

fn to_mem(d: &mut FaultDevice) -> MemDevice {
    let size = d.info().size_bytes;
    let mut out = MemDevice::new(size, 4096).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        d.read_at(at, &mut buf[..n]).unwrap();
        if buf[..n].iter().any(|&b| b != 0) {
            out.write_at(at, &buf[..n]).unwrap();
        }
        at += n as u64;
    }
    out
}

/// An image with chunks and zones in use (compaction and GC ran), trims, an open
/// chunk with a partial md; `dirty`: crashed with unflushed writes instead of shut
/// down.
fn build(dirty: bool) -> Image {
    let mut r = Rig::new(77);
    for l in 0..900 {
        r.write(l);
    }
    r.flush();
    let mut rng = 0xABCD;
    r.churn_until(&mut rng, 0, 900, 2500, |_| false);
    r.trim(100, 20);
    r.flush();
    for l in 0..50 {
        r.write(l);
    }
    r.flush();
    let (zone_data_offset, zone_bytes, layout) = (r.zone_data_offset, r.zone_bytes, r.layout);
    let chunk_count = layout.chunk_count;
    let (mut c, mut z) = if dirty {
        for l in 60..70 {
            r.write(l);
        }
        r.sw.cut();
        drop(r.e.take().unwrap().abandon());
        let (_, c) = r.cache_ctl.crash(&CrashMode::KeepAll).unwrap();
        let (_, z) = r.cap_ctl.crash(&CrashMode::KeepAll).unwrap();
        (c, z)
    } else {
        let (c, z) = r.e.take().unwrap().shutdown().unwrap();
        r.model.flushed();
        (c.into_inner(), z.into_inner().into_inner())
    };
    Image {
        cache: to_mem(&mut c),
        inner: to_mem(&mut z),
        model: r.model.clone(),
        layout,
        zone_data_offset,
        zone_bytes,
        chunk_count,
    }
}

#[derive(Debug, Clone, Copy)]
enum Dev {
    Cache,
    Capacity,
}

/// A metadata block to damage: where, and whether open reads it.
#[derive(Debug, Clone)]
struct Target {
    name: String,
    dev: Dev,
    offset: u64,
    open_reads: bool,
}

impl Target {
    fn new(name: &str, dev: Dev, offset: u64, open_reads: bool) -> Target {
        Target {
            name: name.into(),
            dev,
            offset,
            open_reads,
        }
    }
}

fn read_block(d: &mut MemDevice, off: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    d.read_at(off, &mut b).unwrap();
    b
}

fn targets(img: &mut Image, dirty: bool) -> Vec<Target> {
    let l = img.layout;
    let t = Target::new;
    let mut v = vec![
        t("superblock A", Dev::Cache, 0, true),
        t("superblock B", Dev::Cache, BS, true),
        t(
            "volume table copy 0",
            Dev::Cache,
            l.volume_table_start * BS,
            true,
        ),
        t(
            "volume table copy 1",
            Dev::Cache,
            (l.volume_table_start + 1) * BS,
            true,
        ),
        t(
            "capacity label copy 0",
            Dev::Capacity,
            img.zone_data_offset,
            true,
        ),
        t(
            "capacity label copy 1",
            Dev::Capacity,
            img.zone_data_offset + BS,
            true,
        ),
    ];
    // The checkpoint in force and the other area.
    let two = {
        let mut b = vec![0u8; 8192];
        img.cache.read_at(0, &mut b).unwrap();
        b
    };
    let sb = [
        Superblock::decode(&two[..4096], 0),
        Superblock::decode(&two[4096..], BS),
    ]
    .into_iter()
    .flatten()
    .max_by_key(|s| s.generation)
    .unwrap();
    let area_off = |a: u8| l.checkpoint_start(a) * BS;
    let act = sb.active_checkpoint;
    let mut area = vec![0u8; l.checkpoint_blocks as usize * 4096];
    img.cache.read_at(area_off(act), &mut area).unwrap();
    let ck = Checkpoint::decode(&area, area_off(act)).unwrap();
    let payload_blocks = ck.header.payload_bytes.div_ceil(BS);
    v.push(t(
        "checkpoint header (in force)",
        Dev::Cache,
        area_off(act),
        true,
    ));
    v.push(t(
        "checkpoint region table (in force)",
        Dev::Cache,
        area_off(act) + BS,
        true,
    ));
    v.push(t(
        "checkpoint last payload block (L2P directory)",
        Dev::Cache,
        area_off(act) + payload_blocks * BS,
        true,
    ));
    v.push(t(
        "checkpoint header (other area)",
        Dev::Cache,
        area_off(1 - act),
        true,
    ));
    // An L2P page the checkpoint references.
    let slot = ck
        .directories
        .iter()
        .flat_map(|d| d.pages.iter())
        .find(|p| p.slot != L2P_SLOT_NONE)
        .unwrap()
        .slot;
    // A clean open leaves the L2P walk to the background census (open reads no page).
    v.push(t(
        "L2P page",
        Dev::Cache,
        (l.l2p_area_start + u64::from(slot)) * BS,
        dirty,
    ));
    journal_targets(img, &mut v);
    md_targets(img, &ck, dirty, &mut v);
    v
}

/// The newest journal entry, both copies.
fn journal_targets(img: &mut Image, v: &mut Vec<Target>) {
    let l = img.layout;
    let t = Target::new;
    let entries = journal_ring_entries(l.journal_blocks);
    let newest = (0..entries)
        .filter_map(|i| {
            let b = read_block(&mut img.cache, (l.journal_start + 2 * u64::from(i)) * BS);
            JournalBlock::decode(&b, 0).ok().map(|j| (j.sequence, i))
        })
        .max();
    if let Some((_, i)) = newest {
        let at = (l.journal_start + 2 * u64::from(i)) * BS;
        v.push(t("journal entry copy A", Dev::Cache, at, true));
        v.push(t("journal entry copy B", Dev::Cache, at + BS, true));
    }
}

/// md: a closed chunk, the open chunk (replayed when dirty), a closed zone.
fn md_targets(img: &mut Image, ck: &Checkpoint, dirty: bool, v: &mut Vec<Target>) {
    let l = img.layout;
    let t = Target::new;
    let chunk_md = |c: u32, g: u64, copy: u64| {
        (l.data_start + u64::from(c) * u64::from(l.chunk_blocks) + g * 128 + 126 + copy) * BS
    };
    let zone_md = |z: u32, g: u64, copy: u64| {
        img.zone_data_offset + u64::from(z) * img.zone_bytes + (g * 128 + 126 + copy) * BS
    };
    for (i, e) in ck.regions.iter().enumerate() {
        let i = i as u32;
        if i < img.chunk_count && e.state == RegionState::Closed && e.valid_count > 0 {
            for copy in 0..2 {
                let at = chunk_md(i, 0, copy);
                let h = decode_md_header(&read_block(&mut img.cache, at), 0);
                if h.is_ok_and(|h| h.region_sid == e.sid) {
                    v.push(t("md of a closed chunk", Dev::Cache, at, false));
                }
            }
            break;
        }
    }
    for (i, e) in ck.regions.iter().enumerate() {
        let i = i as u32;
        if i < img.chunk_count && e.state == RegionState::Open {
            let g = u64::from(e.write_pointer.saturating_sub(1) / 128);
            for copy in 0..2 {
                let at = chunk_md(i, g, copy);
                let h = decode_md_header(&read_block(&mut img.cache, at), 0);
                if h.is_ok_and(|h| h.region_sid == e.sid) {
                    v.push(t("md of the open chunk", Dev::Cache, at, dirty));
                }
            }
        }
    }
    for (i, e) in ck.regions.iter().enumerate() {
        let i = i as u32;
        if i > img.chunk_count && e.state == RegionState::Closed && e.valid_count > 0 {
            let z = i - img.chunk_count;
            v.push(t(
                "md A of a zone group",
                Dev::Capacity,
                zone_md(z, 0, 0),
                false,
            ));
            v.push(t(
                "md B of a zone group",
                Dev::Capacity,
                zone_md(z, 0, 1),
                false,
            ));
            break;
        }
    }
}

fn devices(img: &mut Image) -> (MemDevice, MemDevice) {
    (copy_mem(&mut img.cache), copy_mem(&mut img.inner))
}

fn flip(dev: &mut MemDevice, at: u64) {
    let mut b = [0u8; 4096];
    let base = at / 4096 * 4096;
    dev.read_at(base, &mut b).unwrap();
    b[(at - base) as usize] ^= 0x10;
    dev.write_at(base, &b).unwrap();
}

fn findings(cache: MemDevice, inner: MemDevice) -> Vec<String> {
    let cap = match ZoneEmu::open(inner) {
        Ok(c) => c,
        Err(e) => return vec![format!("zone emulation: {e}")],
    };
    let rep = check(cache, cap, &CheckOptions::default());
    rep.findings
        .iter()
        .map(|f| format!("{:?} {}: {}", f.severity, f.area, f.message))
        .collect()
}

fn run(dirty: bool) {
    let mut img = build(dirty);
    let base = {
        let (c, z) = devices(&mut img);
        findings(c, z)
    };
    let ts = targets(&mut img, dirty);
    assert!(ts.len() >= 16, "{ts:?}");
    for t in ts {
        for within in [20u64, 3000] {
            let at = t.offset + within;
            let what = format!(
                "{} ({}), byte {within}",
                t.name,
                if dirty { "crashed" } else { "clean" }
            );
            // Open.
            let (mut c, mut z) = devices(&mut img);
            match t.dev {
                Dev::Cache => flip(&mut c, at),
                Dev::Capacity => flip(&mut z, at),
            }
            let opened = ZoneEmu::open(z)
                .map(|cap| Engine::open(c, cap, ManualClock::new(), crate::common::tiny_config()));
            match opened {
                Ok(Ok(mut e)) => {
                    let rep = e.open_report().clone();
                    if t.open_reads {
                        assert!(
                            !rep.warnings.is_empty(),
                            "{what}: open read it, used the engine, and said nothing"
                        );
                    }
                    // One md copy of a zone group damaged: the other is intact and
                    // the same, so every read still works.
                    let other_copy_intact = t.name.starts_with("md A of a zone")
                        || t.name.starts_with("md B of a zone");
                    for (v, lba) in img.model.touched() {
                        let r = crate::common::call(
                            &mut e,
                            Request::Read {
                                volume: v,
                                offset: lba * BS,
                                len: BS,
                            },
                        );
                        assert!(
                            !other_copy_intact || matches!(r, Ok(Reply::Read(_))),
                            "{what}: {v} {lba}: {r:?}"
                        );
                        if let Ok(Reply::Read(d)) = r {
                            let allowed = img.model.allowed(v, lba);
                            assert!(
                                allowed.iter().any(|&s| block_of(s) == d),
                                "{what}: {v} {lba} read wrong data"
                            );
                        }
                    }
                    if t.name == "L2P page" && !dirty {
                        // The census (finished by the self-check) meets the page.
                        assert!(e.self_check().is_err(), "{what}: the census said nothing");
                    }
                }
                Ok(Err(err)) => {
                    assert!(!err.to_string().is_empty());
                }
                Err(err) => assert!(!err.to_string().is_empty(), "{what}"),
            }
            // Check.
            let (mut c, mut z) = devices(&mut img);
            match t.dev {
                Dev::Cache => flip(&mut c, at),
                Dev::Capacity => flip(&mut z, at),
            }
            let got = findings(c, z);
            assert!(
                got.iter().any(|f| !base.contains(f)),
                "{what}: the checker found nothing new ({got:?})"
            );
        }
    }
    let _ = V;
}

#[test]
fn every_metadata_block_flip_is_reported_on_a_clean_image() {
    run(false);
}

#[test]
fn every_metadata_block_flip_is_reported_on_a_crashed_image() {
    run(true);
}
