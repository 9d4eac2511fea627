//! Chunks given to and taken from the space manager (`Request::GiveChunks`,
//! `Request::TakeChunks`): a given chunk is another shard's here across clean
//! reopens and crashes, and what another shard left in it (md blocks of its own
//! lives, whose SIDs may equal or pass this shard's) never reaches this shard's
//! reads or recovery once the chunk is taken back.

use crate::common::*;
use shale_device::{BlockDevice, MemDevice, ZoneEmu};
use shale_engine::{Engine, EngineError, ManualClock, Reply, Request, VolumeUid};
use shale_format::{
    encode_md, EntryKind, Lba, MdEntry, MdHeader, MdRegionKind, Pba, RegionId, Sid, Superblock,
    VolumeId,
};

const CHUNK_BLOCKS: u64 = 256;
const CHUNKS: u64 = 16;

fn config() -> shale_engine::Config {
    shale_engine::Config {
        spare_factor: 0.5,
        ..tiny_config()
    }
}

fn engine() -> Eng {
    let (c, z) = devices(128 + CHUNKS * CHUNK_BLOCKS, 28);
    Engine::format(c, z, ManualClock::new(), config()).unwrap()
}

fn give(e: &mut Eng, count: u32) -> Vec<u32> {
    match call(e, Request::GiveChunks { count }).unwrap() {
        Reply::Chunks(c) => c,
        r => panic!("unexpected {r:?}"),
    }
}

fn take(e: &mut Eng, chunks: &[u32]) -> Result<(), EngineError> {
    call(
        e,
        Request::TakeChunks {
            chunks: chunks.to_vec(),
        },
    )
    .map(|_| ())
}

fn foreign(e: &mut Eng) -> Vec<u32> {
    match call(e, Request::ForeignChunks).unwrap() {
        Reply::Chunks(c) => c,
        r => panic!("unexpected {r:?}"),
    }
}

/// Opens the devices again as after a kill: a recovery.
fn open(c: MemDevice, z: Cap) -> Eng {
    let z = ZoneEmu::open(z.into_inner()).unwrap();
    let mut e = Engine::open(c, z, ManualClock::new(), config()).unwrap();
    e.self_check().unwrap();
    e
}

/// What another shard would leave in `chunk`: data in every data slot, and in both
/// md slots of every group an md block of a life with SID `sid` (and a high
/// generation) naming blocks of volume slot 0.
fn scribble(cache: &mut MemDevice, chunk: u32, sid: u64) {
    let mut sb_buf = vec![0u8; 4096];
    cache.read_at(0, &mut sb_buf).unwrap();
    let sb = Superblock::decode(&sb_buf, 0).unwrap();
    let chunk_blocks = u64::from(sb.layout.chunk_blocks);
    let base = (sb.layout.data_start + u64::from(chunk) * chunk_blocks) * 4096;
    let junk = pattern(0xbad, 4096);
    let mut md = vec![0u8; 4096];
    for g in 0..chunk_blocks.div_ceil(128) {
        let start = g * 128;
        let len = (chunk_blocks - start).min(128);
        if len < 3 {
            break;
        }
        let entries: Vec<MdEntry> = (0..len - 2)
            .map(|i| MdEntry {
                kind: EntryKind::Data,
                volume: VolumeId(0),
                lba: Lba(start + i),
                sid: Sid(sid),
                data_crc: shale_format::block_crc(&junk),
                source: Pba::NONE,
                pos: 0,
            })
            .collect();
        for i in 0..len - 2 {
            cache.write_at(base + (start + i) * 4096, &junk).unwrap();
        }
        encode_md(
            &mut md,
            &MdHeader {
                region_kind: MdRegionKind::Chunk,
                region: RegionId(chunk),
                group: g as u32,
                entry_count: (len - 2) as u16,
                region_sid: Sid(sid),
                generation: 1 << 20,
            },
            &entries,
        );
        for copy in 0..2 {
            cache
                .write_at(base + (start + len - 2 + copy) * 4096, &md)
                .unwrap();
        }
    }
    cache.flush().unwrap();
}

fn put(e: &mut Eng, v: VolumeUid, model: &mut [u64], lba: u64, seed: u64) {
    write(e, v, lba * 4096, &pattern(seed, 4096)).unwrap();
    model[lba as usize] = seed;
}

#[track_caller]
fn verify(e: &mut Eng, v: VolumeUid, model: &[u64], what: &str) {
    for (lba, &seed) in model.iter().enumerate() {
        let want = if seed == 0 {
            vec![0; 4096]
        } else {
            pattern(seed, 4096)
        };
        assert!(
            read(e, v, lba as u64 * 4096, 4096).unwrap() == want,
            "{what}: block {lba}"
        );
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn a_given_chunk_is_another_shards_and_what_it_left_is_never_read_once_taken_back() {
    let mut e = engine();
    let s0 = e.stats();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    let mut rng = Rng(7);
    for i in 0..blocks {
        put(&mut e, v, &mut model, rng.below(blocks), i + 1);
    }
    let given = give(&mut e, 1000);
    assert!(!given.is_empty(), "nothing given");
    let s = e.stats();
    assert_eq!(s.foreign_chunks, given.len() as u64);
    assert_eq!(s.chunks_given, given.len() as u64);
    assert_eq!(s.chunk_count, s0.chunk_count - given.len() as u64);
    assert_eq!(foreign(&mut e), {
        let mut g = given.clone();
        g.sort_unstable();
        g
    });
    // The floors hold: nothing more to give.
    assert!(give(&mut e, 1000).is_empty());
    // Writes and compaction go on in the chunks left.
    for i in 0..3 * blocks {
        put(&mut e, v, &mut model, rng.below(blocks), 10_000 + i);
    }
    e.self_check().unwrap();
    call(&mut e, Request::Flush).unwrap();
    // Another shard writes every given chunk, with SIDs far past this shard's: a
    // crash, then a clean reopen, leave them alone.
    let (mut c, z) = e.abandon();
    for &g in &given {
        scribble(&mut c, g, 1 << 40);
    }
    let mut e = open(c, z);
    verify(&mut e, v, &model, "after a crash with the chunks away");
    let mut e = reopen(e, config());
    assert_eq!(e.stats().foreign_chunks, given.len() as u64);
    // Taken back, every chunk is used again; kills at every few writes land while
    // taken chunks are open, and recovery must read this shard's life in them, not
    // the other shard's newer one.
    take(&mut e, &given).unwrap();
    let s = e.stats();
    assert_eq!((s.foreign_chunks, s.chunks_taken), (0, given.len() as u64));
    assert_eq!(s.chunk_count, s0.chunk_count);
    // A checkpoint records them as this shard's (a kill before one gives them back).
    let mut e = reopen(e, config());
    for round in 0..40 {
        for i in 0..50 {
            put(
                &mut e,
                v,
                &mut model,
                rng.below(blocks),
                100_000 * (round + 1) + i,
            );
        }
        call(&mut e, Request::Flush).unwrap();
        let (c, z) = e.abandon();
        e = open(c, z);
        verify(&mut e, v, &model, &format!("round {round}"));
    }
    assert_eq!(e.stats().foreign_chunks, 0);
}

#[test]
fn giving_keeps_what_writes_need_and_taking_checks_every_chunk_first() {
    let mut e = engine();
    let free = e.stats().free_chunks;
    let given = give(&mut e, 1000);
    // Half the chunks held at format stay, and more free ones than compaction's
    // threshold.
    assert!(
        !given.is_empty() && given.len() as u64 <= CHUNKS / 2,
        "{given:?}"
    );
    assert_eq!(e.stats().free_chunks, free - given.len() as u64);
    let mine = (0..CHUNKS as u32).find(|c| !given.contains(c)).unwrap();
    for bad in [
        vec![given[0], mine],
        vec![CHUNKS as u32],
        vec![u32::MAX],
        vec![given[0], given[0]],
    ] {
        let r = take(&mut e, &bad);
        assert!(
            matches!(r, Err(EngineError::ZoneLending { .. })),
            "{bad:?}: {r:?}"
        );
        assert_eq!(e.stats().foreign_chunks, given.len() as u64, "{bad:?}");
    }
    e.self_check().unwrap();
    // A client of a pool may not move chunks: that is the router's business, and
    // the engine alone answers them (here, to the test).
    take(&mut e, &given).unwrap();
    assert_eq!(e.stats().foreign_chunks, 0);
    e.self_check().unwrap();
}

#[test]
fn a_taken_chunk_is_recorded_once_a_checkpoint_or_its_data_says_so() {
    let mut e = engine();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    let given = give(&mut e, 2);
    assert_eq!(given.len(), 2);
    // Taken and killed before anything recorded it: another shard's again (the
    // pool hands such chunks out at its open).
    take(&mut e, &given).unwrap();
    let (c, z) = e.abandon();
    let mut e = open(c, z);
    assert_eq!(e.stats().foreign_chunks, 2);
    // Taken, then a clean shutdown: this shard's.
    take(&mut e, &given).unwrap();
    let mut e = reopen(e, config());
    assert_eq!(e.stats().foreign_chunks, 0);
    let mut rng = Rng(3);
    for i in 0..2 * blocks {
        put(&mut e, v, &mut model, rng.below(blocks), i + 1);
    }
    call(&mut e, Request::Flush).unwrap();
    let (c, z) = e.abandon();
    let mut e = open(c, z);
    verify(&mut e, v, &model, "after the kill");
}

/// Taken, written and killed before a checkpoint records the take: recovery finds
/// the chunk's life in the journal, and the chunk is this shard's (its counts too).
#[test]
fn a_taken_chunk_written_before_a_kill_is_this_shards_after_recovery() {
    let cfg = shale_engine::Config {
        checkpoint_interval_bytes: Some(1 << 40),
        ..config()
    };
    let (c, z) = devices(128 + CHUNKS * CHUNK_BLOCKS, 28);
    let mut e = Engine::format(c, z, ManualClock::new(), cfg).unwrap();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    let given = give(&mut e, 1000);
    assert!(given.len() > 1);
    take(&mut e, &given).unwrap();
    // Writes until every free chunk has been opened once (the taken ones last),
    // with no checkpoint between: the journal alone records them.
    let mut rng = Rng(17);
    let checkpoints = e.stats().checkpoints;
    let mut i = 0;
    while e.stats().checkpoints == checkpoints && i < 20 * CHUNK_BLOCKS {
        put(&mut e, v, &mut model, rng.below(blocks), i + 1);
        i += 1;
    }
    // Killed without a flush (which could turn into a checkpoint): what the
    // background durability points claimed is recovered, and the open's self-check
    // counts the chunks.
    assert_eq!(
        e.stats().checkpoints,
        checkpoints,
        "a checkpoint recorded the take"
    );
    let (c, z) = e.abandon();
    let mut e = open(c, z);
    let foreign = e.stats().foreign_chunks;
    assert!(
        foreign < given.len() as u64,
        "no taken chunk was used: {foreign}"
    );
    e.self_check().unwrap();
}

#[test]
fn a_shard_formatted_with_some_chunks_uses_only_those() {
    let (c, z) = devices(128 + CHUNKS * CHUNK_BLOCKS, 28);
    let cfg = shale_engine::Config {
        chunks_owned: Some(6),
        ..config()
    };
    let mut e = Engine::format(c, z, ManualClock::new(), cfg).unwrap();
    let s = e.stats();
    assert_eq!((s.chunk_count, s.foreign_chunks), (6, CHUNKS - 6));
    assert_eq!(foreign(&mut e), (6..CHUNKS as u32).collect::<Vec<_>>());
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    let (mut c, z) = e.abandon();
    for ch in 6..CHUNKS as u32 {
        scribble(&mut c, ch, 1 << 40);
    }
    let mut e = open(c, z);
    let mut rng = Rng(11);
    for i in 0..3 * blocks {
        put(&mut e, v, &mut model, rng.below(blocks), i + 1);
    }
    call(&mut e, Request::Flush).unwrap();
    let (c, z) = e.abandon();
    let mut e = open(c, z);
    verify(&mut e, v, &model, "after the kill");
    assert_eq!(e.stats().foreign_chunks, CHUNKS - 6);
    let too_many = shale_engine::Config {
        chunks_owned: Some(CHUNKS as u32 + 1),
        ..config()
    };
    let (c, z) = devices(128 + CHUNKS * CHUNK_BLOCKS, 28);
    assert!(Engine::format(c, z, ManualClock::new(), too_many).is_err());
}

/// Random gives, takes, writes, flushes, kills (with another shard scribbling over
/// the chunks away) and clean reopens: every flushed write reads back, the foreign
/// count follows a model, and the self-check holds after every step.
#[test]
fn random_chunk_lending_keeps_data_and_accounting() {
    let seed: u64 = std::env::var("SHALE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xc4u64);
    eprintln!("seed {seed} (SHALE_SEED={seed} reruns it)");
    let mut rng = Rng(seed);
    let mut e = engine();
    let blocks = e.user_capacity_bytes() / 4096 / 2;
    let v = create(&mut e, "v", blocks * 4096);
    let mut model = vec![0u64; blocks as usize];
    let mut away: Vec<u32> = Vec::new();
    let mut taken_since: Vec<u32> = Vec::new();
    let mut sid = 1u64 << 30;
    for step in 0..400u64 {
        match rng.below(6) {
            0 => {
                let g = give(&mut e, 1 + rng.below(3) as u32);
                away.extend(&g);
                // A give that gave something took a checkpoint.
                if !g.is_empty() {
                    taken_since.clear();
                }
            }
            1 if !away.is_empty() => {
                let n = 1 + rng.below(away.len() as u64) as usize;
                let back: Vec<u32> = away.drain(..n).collect();
                take(&mut e, &back).unwrap();
                taken_since.extend(&back);
            }
            2 => {
                let (mut c, z) = e.abandon();
                for &ch in &away {
                    sid += 1 + rng.below(1 << 20);
                    scribble(
                        &mut c,
                        ch,
                        if rng.below(2) == 0 {
                            sid
                        } else {
                            1 + rng.below(64)
                        },
                    );
                }
                e = open(c, z);
                let foreign = e.stats().foreign_chunks as usize;
                assert!(
                    foreign >= away.len() && foreign <= away.len() + taken_since.len(),
                    "seed {seed} step {step}: {foreign} foreign, {} away",
                    away.len()
                );
                // What came back foreign is taken again (one recorded as this
                // engine's is refused).
                for ch in std::mem::take(&mut taken_since) {
                    if take(&mut e, &[ch]).is_ok() {
                        taken_since.push(ch);
                    }
                }
            }
            3 => {
                e = reopen(e, config());
                taken_since.clear();
            }
            _ => {
                for _ in 0..150 {
                    let lba = rng.below(blocks);
                    put(&mut e, v, &mut model, lba, step * 1000 + lba + 1);
                }
                call(&mut e, Request::Flush).unwrap();
            }
        }
        e.self_check()
            .unwrap_or_else(|err| panic!("seed {seed} step {step}: {err}"));
        assert_eq!(
            e.stats().foreign_chunks as usize,
            away.len(),
            "seed {seed} step {step}"
        );
    }
    verify(&mut e, v, &model, &format!("seed {seed}"));
}
