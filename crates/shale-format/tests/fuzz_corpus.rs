//! Stable-toolchain stand-in for the on-disk decoder fuzzers (`fuzz/fuzz_targets/`):
//! the committed seeds, then seeded random and mutated inputs, through the entry
//! points of `shale_format::fuzzing` (driver in `fuzz/standin.rs`).
//!
//! `SHALE_FUZZ_ITERS` raises the number of inputs per target (default 3000).
//! `cargo test -p shale-format --test fuzz_corpus -- --ignored write_seed_corpus`
//! regenerates the seeds from the encoders.

#[path = "../../../fuzz/standin.rs"]
mod standin;

use shale_format::fuzzing;
use shale_format::*;
use standin::Entry;

fn targets() -> [Entry; 8] {
    let e = |name, run, random_len_max| Entry {
        name,
        run,
        random_len_max,
    };
    [
        e("superblock", fuzzing::superblock, BLOCK_SIZE + 1),
        e("capacity_label", fuzzing::capacity_label, BLOCK_SIZE + 1),
        e("md_block", fuzzing::md_block, BLOCK_SIZE + 1),
        e("checkpoint", fuzzing::checkpoint, 3 * BLOCK_SIZE + 1),
        e("journal_block", fuzzing::journal_block, BLOCK_SIZE + 1),
        e("volume_table", fuzzing::volume_table, 2 * BLOCK_SIZE + 1),
        e("array_label", fuzzing::array_label, BLOCK_SIZE + 1),
        e(
            "handoff_image",
            fuzzing::handoff_image,
            3 * BLOCK_SIZE + 100,
        ),
    ]
}

#[test]
fn seed_corpus_replays() {
    standin::replay_seeds(&targets(), 4);
}

/// Every seed is a valid structure as the encoders write it, so mutations start from
/// inputs that reach the deepest checks; a format change that breaks them shows here
/// (regenerate with `write_seed_corpus`).
#[test]
fn seeds_decode() {
    const AT: u64 = 0;
    type Decodes = fn(&[u8]) -> bool;
    let decoders: [(&str, Decodes); 8] = [
        ("superblock", |b| Superblock::decode(b, AT).is_ok()),
        ("capacity_label", |b| CapacityLabel::decode(b, AT).is_ok()),
        ("md_block", |b| decode_md(b, AT).is_ok()),
        ("checkpoint", |b| Checkpoint::decode(b, AT).is_ok()),
        ("journal_block", |b| JournalBlock::decode(b, AT).is_ok()),
        ("volume_table", |b| VolumeTable::decode(b, AT).is_ok()),
        ("array_label", |b| ArrayLabel::decode(b, AT).is_ok()),
        ("handoff_image", |b| HandoffImage::decode(b).is_ok()),
    ];
    for (target, decodes) in decoders {
        for (file, data) in standin::corpus(target) {
            assert!(decodes(&data[1..]), "{target}/{file} does not decode");
        }
    }
}

#[test]
fn random_and_mutated_inputs() {
    standin::random_and_mutated(&targets());
}

/// Control byte 1: the entry point reseals checksums, so mutations reach the fields.
fn resealed(b: &[u8]) -> Vec<u8> {
    [&[1u8][..], b].concat()
}

/// Control byte 0: checksums as stored.
fn as_stored(b: &[u8]) -> Vec<u8> {
    [&[0u8][..], b].concat()
}

/// The superblock of a small pool: 16 chunks of 256 blocks, 8 zones of 512.
fn superblock(clean: bool, active: u8, volumes_max: u32) -> Superblock {
    Superblock {
        uuid: *b"shale-fuzz-seed!",
        generation: 5,
        clean,
        active_checkpoint: active,
        volumes_max,
        user_capacity_blocks: 4096,
        cache_size_blocks: 4300,
        layout: CacheLayout {
            volume_table_start: 2,
            volume_table_blocks: 1,
            checkpoint_a_start: 4,
            checkpoint_b_start: 12,
            checkpoint_blocks: 8,
            journal_blocks: 16,
            journal_start: 20,
            l2p_area_start: 36,
            l2p_pool_pages: 12,
            data_start: 60,
            chunk_blocks: 256,
            chunk_count: 16,
        },
        capacity: CapacityGeometry {
            zone_size_blocks: 512,
            zone_capacity_blocks: 500,
            zone_count: 8,
        },
        l2p: L2pFormat::NARROW,
        shard: ShardTag::ONE,
        cold_zones: 0,
    }
}

/// A pool with a cold tier: the last 3 of its 8 zones (superblock version 4).
fn cold_tier() -> Superblock {
    let mut sb = superblock(true, 1, 8);
    sb.cold_zones = 3;
    sb
}

/// A pool past 2^32 PBAs: 5-byte L2P entries.
fn wide_superblock() -> Superblock {
    let mut sb = superblock(true, 0, 8);
    sb.capacity = CapacityGeometry {
        zone_size_blocks: 1 << 20,
        zone_capacity_blocks: 1 << 20,
        zone_count: 8192,
    };
    sb.l2p = L2pFormat::WIDE;
    sb
}

fn volumes(n: u32) -> VolumeTable {
    VolumeTable {
        generation: 3,
        uid_next: VolumeUid(u64::from(n) + 5),
        entries: (0..n)
            .map(|i| VolumeEntry {
                id: VolumeId(i),
                uid: VolumeUid(u64::from(i) + 2),
                name: format!("vol-{i}"),
                size_blocks: 1024 * (u64::from(i) + 1),
                created_sid: Sid(u64::from(i) + 1),
                created_pos: i * 3,
                limits: shale_format::VolumeLimits::NONE,
                whole_size_blocks: 0,
                map_unit_shift: 0,
                dual_map: false,
            })
            .collect(),
    }
}

/// A pool with two-block volume table copies (superblock version 2).
fn two_block_tables() -> Superblock {
    let mut sb = superblock(true, 1, 8);
    sb.layout.volume_table_blocks = 2;
    sb.layout.checkpoint_a_start = 6;
    sb.layout.checkpoint_blocks = 6;
    sb.layout.checkpoint_b_start = 12;
    sb
}

/// A version-3 volume table: `n` volumes, every other one with rate limits, a cache
/// share and a GC policy.
fn volumes_with_limits(n: u32) -> Vec<u8> {
    let mut t = volumes(n);
    for (i, e) in t.entries.iter_mut().enumerate() {
        if i % 2 == 0 {
            e.limits = VolumeLimits {
                iops_max: 1000 * (i as u64 + 1),
                bytes_per_sec_max: (64 << 20) * (i as u64 + 1),
                cache_share_pct: 10 + i as u8,
                gc: if i % 4 == 0 {
                    shale_format::VolumeGc::CostBenefit
                } else {
                    shale_format::VolumeGc::Greedy
                },
            };
        }
    }
    t.encode_in(2)
}

/// A version-1 volume table (before uids), laid out as docs/format.md draws it.
fn volume_table_v1() -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    b[..4].copy_from_slice(&VOLUME_TABLE_MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&1u16.to_le_bytes());
    b[6..8].copy_from_slice(&2u16.to_le_bytes());
    b[16..24].copy_from_slice(&7u64.to_le_bytes());
    for (i, name) in ["old", "older"].iter().enumerate() {
        let e = &mut b[32 + 64 * i..32 + 64 * (i + 1)];
        e[..4].copy_from_slice(&(i as u32).to_le_bytes());
        e[4] = 1;
        e[5] = name.len() as u8;
        e[8..16].copy_from_slice(&2048u64.to_le_bytes());
        e[16..24].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        e[24..28].copy_from_slice(&9u32.to_le_bytes());
        e[32..32 + name.len()].copy_from_slice(name.as_bytes());
    }
    let crc = {
        let mut c = b.clone();
        c[8..12].fill(0);
        crc32c(&c)
    };
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    b
}

fn md(kind: MdRegionKind, entries: &[MdEntry], generation: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    let h = MdHeader {
        region_kind: kind,
        region: RegionId(if kind == MdRegionKind::Zone { 17 } else { 3 }),
        group: 1,
        entry_count: entries.len() as u16,
        region_sid: Sid(40),
        generation,
    };
    encode_md(&mut b, &h, entries);
    b
}

fn md_entries(n: usize) -> Vec<MdEntry> {
    (0..n)
        .map(|i| {
            let kind = [
                EntryKind::Data,
                EntryKind::Relocated,
                EntryKind::Pad,
                EntryKind::Data,
            ][i % 4];
            let none = kind == EntryKind::Pad;
            MdEntry {
                kind,
                volume: if none {
                    VolumeId::NONE
                } else {
                    VolumeId(i as u32 % 3)
                },
                lba: Lba(i as u64 * 7),
                sid: Sid(30 + i as u64 / 10),
                data_crc: crc32c(&(i as u32).to_le_bytes()),
                source: if kind == EntryKind::Relocated {
                    Pba(1000 + i as u64)
                } else {
                    Pba::NONE
                },
                pos: 0,
            }
        })
        .collect()
}

fn checkpoint(regions: usize, directories: u32, pages: u32) -> Vec<u8> {
    checkpoint_with(regions, directories, pages, |p| p % 3 != 2, 0)
}

/// A checkpoint whose directories have page `p` written when `written(p)`.
fn checkpoint_with(
    regions: usize,
    directories: u32,
    pages: u32,
    written: impl Fn(u32) -> bool,
    switches: u32,
) -> Vec<u8> {
    let states = [
        (RegionState::Free, RegionRole::None),
        (RegionState::Open, RegionRole::User),
        (RegionState::Closed, RegionRole::Compaction),
        (RegionState::PendingFree, RegionRole::Gc),
        (RegionState::Reserved, RegionRole::None),
    ];
    let c = Checkpoint {
        header: CheckpointHeader {
            generation: 6,
            sid_next: 44,
            journal_next_block: 3,
            journal_sequence: 12,
            time: 1_000_000,
            ..Default::default()
        },
        regions: (0..regions)
            .map(|i| {
                let (state, role) = states[i % states.len()];
                RegionEntry {
                    state,
                    role,
                    stream: (i % 2) as u16,
                    sid: Sid(i as u64 + 1),
                    valid_count: if state == RegionState::Free {
                        0
                    } else {
                        i as u32
                    },
                    write_pointer: 2 * i as u32,
                    close_time: 500 + i as u64,
                }
            })
            .collect(),
        volumes: volumes(directories),
        directories: (0..directories)
            .map(|v| L2pDirectory {
                volume: VolumeId(v),
                pages: (0..pages)
                    .map(|p| PageDesc {
                        slot: if written(p) { 2 * p + v } else { L2P_SLOT_NONE },
                        crc32c: p ^ 0x5151,
                    })
                    .collect(),
            })
            .collect(),
        // A few per volume, in (volume, LBA) order: relocations, an unmap.
        switches: (0..directories)
            .flat_map(|v| {
                (0..switches).map(move |i| {
                    let pba = if i == 1 {
                        Pba::NONE
                    } else {
                        Pba(900 + u64::from(i))
                    };
                    L2pSwitch::new(VolumeId(v), Lba(u64::from(i) * 1025 + 3), pba).expect("fits")
                })
            })
            .collect(),
    };
    c.encode()
}

fn journal(records: Vec<JournalRecord>) -> Vec<u8> {
    JournalBlock {
        epoch: 6,
        sequence: 13,
        records,
    }
    .encode()
    .expect("fits one block")
    .to_vec()
}

fn every_record() -> Vec<JournalRecord> {
    vec![
        JournalRecord::RegionOpened {
            region: RegionId(4),
            sid: Sid(41),
        },
        JournalRecord::Trim {
            volume: VolumeId(1),
            lba: Lba(64),
            count: 16,
            key_sid: Sid(41),
            key_pos: 9,
        },
        JournalRecord::FlushPoint {
            regions: vec![(RegionId(4), 10), (RegionId(17), 128)],
        },
        JournalRecord::VolumeChanged {
            volume: VolumeId(2),
            size_blocks: 4096,
            live: true,
        },
        JournalRecord::VolumeChanged {
            volume: VolumeId(0),
            size_blocks: 0,
            live: false,
        },
        JournalRecord::RegionClosed {
            region: RegionId(4),
        },
    ]
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    let sb = superblock(true, 1, 8).encode();
    standin::write_seeds(
        "superblock",
        vec![
            ("clean", resealed(&sb)),
            ("clean-as-stored", as_stored(&sb)),
            ("dirty", resealed(&superblock(false, 0, 1).encode())),
            ("volumes-max", resealed(&superblock(true, 0, 63).encode())),
            ("wide-l2p", resealed(&wide_superblock().encode())),
            ("version-2", resealed(&two_block_tables().encode())),
            ("cold-tier", resealed(&cold_tier().encode())),
        ],
    );
    let label = CapacityLabel {
        uuid: *b"shale-fuzz-seed!",
        geometry: CapacityGeometry {
            zone_size_blocks: 512,
            zone_capacity_blocks: 500,
            zone_count: 8,
        },
    }
    .encode();
    let full = CapacityLabel {
        uuid: [0xa5; 16],
        geometry: CapacityGeometry {
            zone_size_blocks: 1 << 16,
            zone_capacity_blocks: 1 << 16,
            zone_count: 1000,
        },
    }
    .encode();
    standin::write_seeds(
        "capacity_label",
        vec![
            ("label", resealed(&label)),
            ("label-as-stored", as_stored(&label)),
            ("full-zones", resealed(&full)),
            ("full-zones-as-stored", as_stored(&full)),
        ],
    );
    write_array_label_seeds();
    write_md_seeds();
    let cp = checkpoint(24, 2, 5);
    standin::write_seeds(
        "checkpoint",
        vec![
            ("two-volumes", resealed(&cp)),
            ("two-volumes-as-stored", as_stored(&cp)),
            ("empty", resealed(&checkpoint(0, 0, 0))),
            ("one-volume-no-pages", resealed(&checkpoint(3, 1, 0))),
            ("many-pages", resealed(&checkpoint(9, 3, 200))),
            (
                "sparse-directories",
                resealed(&checkpoint_with(9, 2, 5000, |p| p % 97 < 3, 0)),
            ),
            (
                "l2p-switches",
                resealed(&checkpoint_with(9, 2, 5, |p| p % 3 != 2, 4)),
            ),
        ],
    );
    let j = journal(every_record());
    standin::write_seeds(
        "journal_block",
        vec![
            ("every-record", resealed(&j)),
            ("every-record-as-stored", as_stored(&j)),
            ("empty", resealed(&journal(vec![]))),
            (
                "big-flush-point",
                resealed(&journal(vec![JournalRecord::FlushPoint {
                    regions: (0..100).map(|r| (RegionId(r), r * 3)).collect(),
                }])),
            ),
        ],
    );
    let vt = volumes(3).encode();
    standin::write_seeds(
        "volume_table",
        vec![
            ("three", resealed(&vt)),
            ("three-as-stored", as_stored(&vt)),
            ("empty", resealed(&volumes(0).encode())),
            ("full", resealed(&volumes(VOLUMES_MAX).encode())),
            ("version-1", resealed(&volume_table_v1())),
            ("version-3-limits", resealed(&volumes_with_limits(5))),
            ("version-3-as-stored", as_stored(&volumes_with_limits(2))),
        ],
    );
    write_handoff_seeds();
}

/// Seeds of the hand-off image.
fn write_handoff_seeds() {
    let image = handoff_image();
    let empty = HandoffImage {
        md: vec![],
        journal: vec![],
        ..handoff_image()
    };
    let mut two_md = handoff_image();
    two_md.md.push(HandoffMd {
        copy: 0,
        ..two_md.md[0].clone()
    });
    standin::write_seeds(
        "handoff_image",
        vec![
            (
                "md-and-journal",
                resealed(&image.encode().expect("encodes")),
            ),
            (
                "md-and-journal-as-stored",
                as_stored(&image.encode().expect("encodes")),
            ),
            ("empty", resealed(&empty.encode().expect("encodes"))),
            ("two-md", resealed(&two_md.encode().expect("encodes"))),
        ],
    );
}

/// A hand-off image: one partial md block of chunk 3 group 1, and two journal
/// entries ending in a FlushPoint.
fn handoff_image() -> HandoffImage {
    let mut block = Box::new([0u8; BLOCK_SIZE]);
    block.copy_from_slice(&md(MdRegionKind::Chunk, &md_entries(40), 3));
    let entry = |sequence, records| JournalBlock {
        epoch: 6,
        sequence,
        records,
    };
    HandoffImage {
        pool: *b"shale-fuzz-seed!",
        sequence: 13,
        next: 4,
        md: vec![HandoffMd {
            region: RegionId(3),
            group: 1,
            copy: 1,
            block,
        }],
        journal: vec![
            entry(13, every_record()),
            entry(
                14,
                vec![JournalRecord::FlushPoint {
                    regions: vec![(RegionId(3), 168)],
                }],
            ),
        ],
    }
}

/// Seeds of the array member label: a capacity member of a 4+1 array with one member
/// rebuilding, and a cache mirror with one member failed.
fn write_md_seeds() {
    let chunk_full = md(MdRegionKind::Chunk, &md_entries(GROUP_DATA_SLOTS), 2);
    // Relocations from PBAs past 32 bits (the source's high byte in use).
    let wide: Vec<MdEntry> = md_entries(20)
        .into_iter()
        .map(|mut e| {
            if e.kind == EntryKind::Relocated {
                e.source = Pba(e.source.0 + (3 << 36));
            }
            e
        })
        .collect();
    // Direct writes' blocks (a version 3 block): relocations become direct entries.
    let direct: Vec<MdEntry> = md_entries(30)
        .into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            if e.kind == EntryKind::Relocated {
                e.kind = EntryKind::Direct;
                e.source = Pba::NONE;
                e.pos = 17 + i as u32;
            }
            e
        })
        .collect();
    standin::write_seeds(
        "md_block",
        vec![
            ("chunk-full", resealed(&chunk_full)),
            ("chunk-full-as-stored", as_stored(&chunk_full)),
            (
                "chunk-partial",
                resealed(&md(MdRegionKind::Chunk, &md_entries(5), 7)),
            ),
            (
                "zone",
                resealed(&md(MdRegionKind::Zone, &md_entries(40), 1)),
            ),
            ("empty", resealed(&md(MdRegionKind::Chunk, &[], 0))),
            (
                "zone-wide-sources",
                resealed(&md(MdRegionKind::Zone, &wide, 3)),
            ),
            ("zone-direct", resealed(&md(MdRegionKind::Zone, &direct, 1))),
        ],
    );
}

fn write_array_label_seeds() {
    let member = |i: u8, state| ArrayMember {
        uuid: [i; 16],
        state,
        rebuilt: u64::from(i) << 20,
    };
    let capacity_array = ArrayLabel {
        pool: *b"shale-fuzz-seed!",
        role: ArrayRole::Capacity,
        redundancy: ArrayRedundancy::Parity { k: 4, m: 1 },
        unit: 128 << 10,
        generation: 3,
        index: 2,
        members: (0..5)
            .map(|i| {
                member(
                    i,
                    if i == 3 {
                        MemberRecord::Rebuilding
                    } else {
                        MemberRecord::Ok
                    },
                )
            })
            .collect(),
    }
    .encode();
    let cache_mirror = ArrayLabel {
        pool: *b"shale-fuzz-seed!",
        role: ArrayRole::Cache,
        redundancy: ArrayRedundancy::Mirror,
        unit: 0,
        generation: 9,
        index: 0,
        members: vec![member(0, MemberRecord::Ok), member(1, MemberRecord::Failed)],
    }
    .encode();
    standin::write_seeds(
        "array_label",
        vec![
            ("capacity-4+1", resealed(&capacity_array)),
            ("capacity-4+1-as-stored", as_stored(&capacity_array)),
            ("cache-mirror", resealed(&cache_mirror)),
            ("cache-mirror-as-stored", as_stored(&cache_mirror)),
        ],
    );
}
