//! Golden images: two tiny pools written by an earlier build and kept under
//! `tests/fixtures/golden/` (gzip-compressed raw device images), opened by this one.
//! A format change that can no longer read old pools fails here.
//!
//! - `formatted`: formatted, one volume written, overwritten and trimmed, flushed and
//!   shut down cleanly.
//! - `crashed`: two volumes written until compaction moved blocks to zones, flushed,
//!   then overwritten without a flush and the power cut (only what was durable kept):
//!   its open must recover (journal replay, md scan).
//!
//! Each test opens its fixture, checks that recovery ran as the fixture needs, reads
//! every block the scenario wrote (flushed blocks exactly; blocks written after the
//! last flush old or new), runs the self-check and the offline checker, then writes,
//! shuts down and reopens.
//!
//! Regenerate (after a deliberate format change, see docs/format.md):
//! `cargo test --release -p shale-engine --test engine -- --ignored write_golden_images`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use shale_device::{
    BlockDevice, CrashMode, FaultDevice, MemDevice, ZoneEmu, ZoneEmuConfig, ZonedDevice,
};
use shale_engine::{
    check, CheckOptions, Clock, Config, Engine, EngineError, ManualClock, Reply, Request, VolumeUid,
};

const BS: u64 = 4096;
/// The smallest geometry the engine formats: 128-block chunks and zones, a 2 MiB
/// cache and a few zones more than the seven it needs, so data reaches zones.
const CACHE_BLOCKS: u64 = 512;
const ZONE_BLOCKS: u64 = 128;
const ZONES: u32 = 10;

fn config() -> Config {
    Config {
        chunk_blocks: 128,
        volumes_max: 2,
        journal_blocks: 8,
        write_buffers_max: 3,
        request_bytes_max: 16 * 1024,
        streams_max: 1,
        gc_free_zones_min: 1,
        ..Config::default()
    }
}

fn zone_config() -> ZoneEmuConfig {
    let mut zc = ZoneEmuConfig::new(ZONE_BLOCKS * BS);
    zc.zone_count_max = ZONES;
    zc
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden")
        .join(name)
}

/// A block of volume slot `vol`, `lba`, version `version`: a 16-byte stamp repeated,
/// so the images compress to almost nothing while every block differs.
fn block(vol: u8, lba: u64, version: u32) -> Vec<u8> {
    let mut stamp = [0u8; 16];
    stamp[..4].copy_from_slice(b"GOLD");
    stamp[4] = vol;
    stamp[8..12].copy_from_slice(&(lba as u32).to_le_bytes());
    stamp[12..16].copy_from_slice(&version.to_le_bytes());
    stamp.iter().copied().cycle().take(BS as usize).collect()
}

/// A block's version: `Some(v)` for `block(.., v)`, `None` for zeros (trimmed).
type Version = Option<u32>;

/// What each written block may read back: the flushed version and, if written after
/// the last flush, the unflushed one too.
#[derive(Default)]
struct Expect {
    blocks: BTreeMap<(u8, u64), (Version, Option<Version>)>,
}

impl Expect {
    fn wrote(&mut self, vol: u8, lba: u64, v: Option<u32>) {
        let e = self.blocks.entry((vol, lba)).or_insert((None, None));
        e.1 = Some(v);
    }
    fn flushed(&mut self) {
        for e in self.blocks.values_mut() {
            if let Some(v) = e.1.take() {
                e.0 = v;
            }
        }
    }
}

fn call<C: BlockDevice, Z: ZonedDevice, K: Clock>(
    e: &mut Engine<C, Z, K>,
    req: Request,
) -> Result<Reply, EngineError> {
    let slot: Arc<Mutex<Option<Result<Reply, EngineError>>>> = Arc::new(Mutex::new(None));
    let s2 = slot.clone();
    e.submit(req, Box::new(move |r| *s2.lock().unwrap() = Some(r)));
    for _ in 0..400_000 {
        if let Some(r) = slot.lock().unwrap().take() {
            return r;
        }
        if !e.poll() {
            e.wait_io();
        }
    }
    panic!("request never completed");
}

/// The two volumes' uids, in slot order.
const ALPHA: VolumeUid = VolumeUid(1);
const BETA: VolumeUid = VolumeUid(2);

fn uid(vol: u8) -> VolumeUid {
    if vol == 0 {
        ALPHA
    } else {
        BETA
    }
}

enum Step {
    Create(&'static str, u64),
    /// Write version `Some(v)` of these blocks, or trim them (`None`).
    Put(u8, std::ops::Range<u64>, Option<u32>),
    Flush,
}

fn formatted_steps() -> Vec<Step> {
    vec![
        Step::Create("alpha", 192),
        Step::Put(0, 0..150, Some(1)),
        Step::Put(0, 20..30, None),
        Step::Put(0, 0..40, Some(2)),
        Step::Flush,
    ]
}

/// Ends with writes after the last flush: the power is cut there.
fn crashed_steps() -> Vec<Step> {
    vec![
        Step::Create("alpha", 192),
        Step::Create("beta", 64),
        Step::Put(0, 0..150, Some(1)),
        Step::Put(1, 0..60, Some(1)),
        Step::Put(0, 0..100, Some(2)),
        Step::Flush,
        Step::Put(0, 50..120, Some(3)),
        Step::Put(1, 30..40, None),
        Step::Flush,
        Step::Put(0, 100..160, Some(4)),
        Step::Put(1, 0..20, Some(2)),
    ]
}

fn expect(steps: &[Step]) -> Expect {
    let mut x = Expect::default();
    for s in steps {
        match s {
            Step::Create(..) => {}
            Step::Put(vol, lbas, v) => lbas.clone().for_each(|l| x.wrote(*vol, l, *v)),
            Step::Flush => x.flushed(),
        }
    }
    x
}

fn apply<C: BlockDevice, Z: ZonedDevice, K: Clock>(e: &mut Engine<C, Z, K>, steps: &[Step]) {
    for s in steps {
        match s {
            Step::Create(name, blocks) => {
                call(
                    e,
                    Request::CreateVolume {
                        name: (*name).into(),
                        size_bytes: blocks * BS,
                    },
                )
                .unwrap();
            }
            Step::Put(vol, lbas, version) => {
                for lba in lbas.clone() {
                    let req = match version {
                        Some(v) => Request::Write {
                            volume: uid(*vol),
                            offset: lba * BS,
                            data: block(*vol, lba, *v),
                            fua: false,
                        },
                        None => Request::Trim {
                            volume: uid(*vol),
                            offset: lba * BS,
                            len: BS,
                        },
                    };
                    call(e, req).unwrap();
                }
            }
            Step::Flush => {
                call(e, Request::Flush).unwrap();
            }
        }
    }
}

/// Every block the scenario wrote reads as it may: flushed exactly, unflushed old or
/// new; what was read becomes the block's flushed version.
fn verify<C: BlockDevice, Z: ZonedDevice, K: Clock>(e: &mut Engine<C, Z, K>, x: &mut Expect) {
    for (&(vol, lba), entry) in x.blocks.iter_mut() {
        let (flushed, unflushed) = *entry;
        let got = match call(
            e,
            Request::Read {
                volume: uid(vol),
                offset: lba * BS,
                len: BS,
            },
        ) {
            Ok(Reply::Read(d)) => d,
            r => panic!("volume {vol} block {lba}: {r:?}"),
        };
        let is = |v: Option<u32>| match v {
            Some(v) => got == block(vol, lba, v),
            None => got.iter().all(|&b| b == 0),
        };
        if !is(flushed) && unflushed.is_some_and(is) {
            entry.0 = unflushed.flatten();
        }
        entry.1 = None;
        assert!(
            is(flushed) || unflushed.is_some_and(is),
            "volume {vol} block {lba}: expected version {flushed:?} (or unflushed {unflushed:?}), read {:02x?}",
            &got[..16]
        );
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(data).unwrap();
    z.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn image_of(dev: &mut FaultDevice) -> Vec<u8> {
    let mut b = vec![0u8; dev.info().size_bytes as usize];
    dev.read_at(0, &mut b).unwrap();
    b
}

fn mem_of(image: &[u8]) -> MemDevice {
    let mut d = MemDevice::new(image.len() as u64, 4096).unwrap();
    for (i, b) in image.chunks(BS as usize).enumerate() {
        if b.iter().any(|&x| x != 0) {
            d.write_at(i as u64 * BS, b).unwrap();
        }
    }
    d
}

type GoldenEngine = Engine<MemDevice, ZoneEmu<MemDevice>, ManualClock>;

/// Opens the fixture `name` (its cache and capacity images) with this build.
fn open_fixture(name: &str) -> GoldenEngine {
    let read = |dev: &str| {
        let path = fixture(&format!("{name}-{dev}.img.gz"));
        gunzip(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    };
    let cache = mem_of(&read("cache"));
    let cap = ZoneEmu::open(mem_of(&read("capacity"))).unwrap();
    Engine::open(cache, cap, ManualClock::new(), config()).unwrap()
}

/// The offline checker on copies of the fixture's images finds no error.
fn offline_check(name: &str) {
    let read =
        |dev: &str| gunzip(&std::fs::read(fixture(&format!("{name}-{dev}.img.gz"))).unwrap());
    let cache = mem_of(&read("cache"));
    let cap = ZoneEmu::open(mem_of(&read("capacity"))).unwrap();
    let opts = CheckOptions {
        config: config(),
        verify_data: true,
        ..CheckOptions::default()
    };
    let rep = check(cache, cap, &opts);
    assert_eq!(rep.errors(), 0, "{name}: {rep:?}");
}

/// After the fixture's checks: the pool takes new writes and reopens cleanly.
fn carries_on(mut e: GoldenEngine, mut x: Expect) {
    apply(&mut e, &[Step::Put(0, 0..8, Some(9)), Step::Flush]);
    (0..8).for_each(|l| x.wrote(0, l, Some(9)));
    x.flushed();
    let (c, z) = e.shutdown().unwrap();
    let z = ZoneEmu::open(z.into_inner()).unwrap();
    let mut e = Engine::open(c, z, ManualClock::new(), config()).unwrap();
    assert!(e.open_report().clean);
    verify(&mut e, &mut x);
    e.self_check().unwrap();
}

/// A pool formatted before volume limits keeps one-block volume table copies: it
/// refuses limits with a reason, and takes "no limits".
#[test]
fn a_pool_from_before_volume_limits_refuses_them() {
    let mut e = open_fixture("formatted");
    let limits = shale_engine::VolumeLimits {
        iops_max: 100,
        bytes_per_sec_max: 0,
        ..shale_engine::VolumeLimits::NONE
    };
    let r = call(
        &mut e,
        Request::SetVolumeLimits {
            volume: ALPHA,
            limits,
        },
    );
    assert!(
        matches!(&r, Err(EngineError::InvalidVolume { reason }) if reason.contains("formatted before volume limits")),
        "{r:?}"
    );
    let r = call(
        &mut e,
        Request::SetVolumeLimits {
            volume: ALPHA,
            limits: shale_engine::VolumeLimits::NONE,
        },
    );
    assert!(matches!(r, Ok(Reply::Volume(v)) if v.limits.is_none()));
    e.self_check().unwrap();
}

#[test]
fn formatted_pool_opens_with_its_data() {
    let mut e = open_fixture("formatted");
    assert!(
        e.open_report().clean,
        "the formatted pool was shut down cleanly"
    );
    let mut x = expect(&formatted_steps());
    verify(&mut e, &mut x);
    e.self_check().unwrap();
    offline_check("formatted");
    carries_on(e, x);
}

#[test]
fn crashed_pool_recovers_its_flushed_data() {
    let mut e = open_fixture("crashed");
    let report = e.open_report().clone();
    assert!(!report.clean, "the crashed pool needs recovery");
    assert!(
        report.replay.journal_entries > 0,
        "recovery replays the journal: {report:?}"
    );
    let mut x = expect(&crashed_steps());
    verify(&mut e, &mut x);
    e.self_check().unwrap();
    offline_check("crashed");
    carries_on(e, x);
}

/// Writes both fixtures with this build.
#[test]
#[ignore = "writes tests/fixtures/golden"]
fn write_golden_images() {
    std::fs::create_dir_all(fixture("")).unwrap();
    for (name, steps, crash) in [
        ("formatted", formatted_steps(), false),
        ("crashed", crashed_steps(), true),
    ] {
        let cache = FaultDevice::new(CACHE_BLOCKS * BS, 4096, 1).unwrap();
        let zc = zone_config();
        let inner = FaultDevice::new(zc.device_bytes_for(ZONES).unwrap(), 4096, 2).unwrap();
        let (cache_ctl, cap_ctl) = (cache.controller(), inner.controller());
        let cap = ZoneEmu::format(inner, &zc).unwrap();
        let mut e = Engine::format(cache, cap, ManualClock::new(), config()).unwrap();
        apply(&mut e, &steps);
        assert!(
            !crash || e.stats().relocated_blocks > 0,
            "{name}: compaction moved data to zones"
        );
        if crash {
            drop(e.abandon());
        } else {
            e.shutdown().unwrap();
        }
        // Only what was durable: a clean shutdown flushed everything; a crash loses
        // the writes after the last flush that no device flush covered.
        let (_, mut cache) = cache_ctl.crash(&CrashMode::DropAll).unwrap();
        let (_, mut inner) = cap_ctl.crash(&CrashMode::DropAll).unwrap();
        for (dev, d) in [("cache", &mut cache), ("capacity", &mut inner)] {
            let z = gzip(&image_of(d));
            std::fs::write(fixture(&format!("{name}-{dev}.img.gz")), &z).unwrap();
            eprintln!("{name}-{dev}: {} bytes compressed", z.len());
        }
    }
}
