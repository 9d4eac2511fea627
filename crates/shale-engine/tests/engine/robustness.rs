//! Budgets, corruption, bad media, foreign devices, unclean stops, other capacity
//! devices, and the engine thread.

use crate::common::*;
use shale_device::{BlockDevice, MemDevice, ZoneEmu, ZoneEmuConfig};
use shale_engine::{
    Config, ConfigError, Engine, EngineError, EngineThread, FormatDeviceError, Lba, ManualClock,
    OpenError, Reply, Request, Tier,
};
use shale_flashsim::{preset, simulated_block_device, simulated_zoned_device, Backing};

#[test]
fn a_handful_of_l2p_pages_is_enough() {
    let cfg = Config {
        l2p_cache_bytes_max: Some(tiny_config().l2p_min_pages() * 4096),
        ..tiny_config()
    };
    let (c, z) = devices(128 + 8 * 256, 64);
    let mut e = Engine::format(c, z, ManualClock::new(), cfg.clone()).unwrap();
    let blocks = e.user_capacity_bytes() / 4096;
    assert!(
        blocks / 1024 > cfg.l2p_min_pages(),
        "table must be larger than the budget"
    );
    let v = create(&mut e, "a", blocks * 4096);
    let mut model = std::collections::HashMap::new();
    let mut x = 3u64;
    for i in 0..6000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lba = (x >> 33) % blocks;
        write(&mut e, v, lba * 4096, &pattern(i, 4096)).unwrap();
        model.insert(lba, i);
    }
    e.self_check().unwrap();
    let s = e.stats();
    assert!(
        s.l2p_misses > 0 && s.l2p_page_writes > 0 && s.l2p_page_reads > 0,
        "{s:?}"
    );
    assert!(s.l2p_cached_pages <= cfg.l2p_min_pages());
    let mut e = reopen(e, cfg);
    for (&lba, &i) in &model {
        assert_eq!(read(&mut e, v, lba * 4096, 4096).unwrap(), pattern(i, 4096));
    }
    e.self_check().unwrap();
}

#[test]
fn a_too_small_l2p_budget_is_refused() {
    let cfg = Config {
        l2p_cache_bytes_max: Some(2 * 4096),
        ..tiny_config()
    };
    let (c, z) = devices(128 + 8 * 256, 28);
    let r = Engine::format(c, z, ManualClock::new(), cfg);
    assert!(
        matches!(
            r,
            Err(FormatDeviceError::Config(
                ConfigError::L2pBudgetTooSmall { .. }
            ))
        ),
        "{r:?}"
    );
}

#[test]
fn invalid_configs_are_refused() {
    for cfg in [
        Config {
            chunk_blocks: 100,
            ..tiny_config()
        },
        Config {
            volumes_max: 0,
            ..tiny_config()
        },
        Config {
            volumes_max: 64,
            ..tiny_config()
        },
        Config {
            spare_factor: 1.5,
            ..tiny_config()
        },
        Config {
            write_buffers_max: 1,
            ..tiny_config()
        },
        Config {
            request_bytes_max: 0,
            ..tiny_config()
        },
    ] {
        let (c, z) = devices(128 + 8 * 256, 28);
        assert!(matches!(
            Engine::format(c, z, ManualClock::new(), cfg),
            Err(FormatDeviceError::Config(_))
        ));
    }
    // Devices too small for the layout.
    let (c, z) = devices(200, 28);
    assert!(matches!(
        Engine::format(c, z, ManualClock::new(), tiny_config()),
        Err(FormatDeviceError::TooSmall { .. })
    ));
    let (c, z) = devices(128 + 8 * 256, 6);
    assert!(matches!(
        Engine::format(c, z, ManualClock::new(), tiny_config()),
        Err(FormatDeviceError::TooSmall { .. })
    ));
}

fn shutdown_raw(e: Eng) -> (MemDevice, MemDevice) {
    let (c, z) = e.shutdown().unwrap();
    (c, z.into_inner())
}

fn open_raw(c: MemDevice, z: MemDevice) -> Result<Eng, OpenError> {
    Engine::open(
        c,
        ZoneEmu::open(z).unwrap(),
        ManualClock::new(),
        tiny_config(),
    )
}

#[test]
fn corrupt_superblocks_labels_and_foreign_devices() {
    let mut e = tiny_engine();
    create(&mut e, "a", 1 << 20);
    let (mut c, z) = shutdown_raw(e);
    // One bad copy: the other one takes over (it may say "needs recovery").
    let good = {
        let mut b = vec![0u8; 8192];
        c.read_at(0, &mut b).unwrap();
        b
    };
    c.write_at(0, &[0xAB; 4096]).unwrap();
    match open_raw(c, z) {
        Ok(e) => {
            let (c2, z2) = shutdown_raw(e);
            c = c2;
            drop(z2);
        }
        Err(OpenError::NeedsRecovery) => return,
        Err(e) => panic!("{e}"),
    }
    c.write_at(0, &[0u8; 8192]).unwrap();
    let (_, z) = devices(128 + 8 * 256, 28);
    let r = Engine::open(c, z, ManualClock::new(), tiny_config());
    assert!(matches!(r, Err(OpenError::NoSuperblock { .. })), "{r:?}");
    drop(good);
}

/// `Config::pool_uuid`: format gives the superblock that UUID; open refuses a pool
/// whose superblock has another (a device labelled for another pool came with it).
#[test]
fn a_device_labelled_for_another_pool_is_refused() {
    let (c, z) = devices(128 + 8 * 256, 28);
    let config = Config {
        pool_uuid: Some([5; 16]),
        ..tiny_config()
    };
    let e = Engine::format(c, z, ManualClock::new(), config.clone()).unwrap();
    let (c, z) = e.shutdown().unwrap();
    let other = Config {
        pool_uuid: Some([6; 16]),
        ..tiny_config()
    };
    let r = Engine::open(c, z, ManualClock::new(), other);
    let Err(OpenError::ForeignDevice) = r else {
        panic!("{r:?}");
    };
    let (c, z) = devices(128 + 8 * 256, 28);
    let e = Engine::format(c, z, ManualClock::new(), config.clone()).unwrap();
    let (c, z) = e.shutdown().unwrap();
    let e = Engine::open(c, z, ManualClock::new(), config).expect("its own pool");
    let (c, z) = e.shutdown().unwrap();
    Engine::open(c, z, ManualClock::new(), tiny_config()).expect("no label to match");
}

#[test]
fn foreign_capacity_is_refused_and_unclean_stop_recovers() {
    let mut e = tiny_engine();
    create(&mut e, "a", 1 << 20);
    let (c, _z) = e.shutdown().unwrap();
    let other = tiny_engine();
    let (_c2, z2) = other.shutdown().unwrap();
    let r = Engine::open(c, z2, ManualClock::new(), tiny_config());
    assert!(matches!(r, Err(OpenError::ForeignCapacity)), "{r:?}");

    let mut e = tiny_engine();
    let v = create(&mut e, "a", 1 << 20);
    write(&mut e, v, 0, &[1; 4096]).unwrap();
    call(&mut e, Request::Flush).unwrap();
    write(&mut e, v, 4096, &[2; 4096]).unwrap();
    let (c, z) = e.abandon();
    let (mut c, mut z) = (c, z.into_inner());
    // Told not to recover, open refuses; by default it recovers.
    let no = Config {
        recover: false,
        ..tiny_config()
    };
    let r = Engine::open(
        copy_mem(&mut c),
        ZoneEmu::open(copy_mem(&mut z)).unwrap(),
        ManualClock::new(),
        no,
    );
    assert!(matches!(r, Err(OpenError::NeedsRecovery)), "{r:?}");
    let mut e = open_raw(c, z).unwrap();
    assert!(!e.open_report().clean);
    assert_eq!(
        read(&mut e, v, 0, 4096).unwrap(),
        vec![1; 4096],
        "flushed data survives"
    );
    let unflushed = read(&mut e, v, 4096, 4096).unwrap();
    assert!(unflushed == vec![2; 4096] || unflushed == vec![0; 4096]);

    // A capacity device that was never formatted for Shale.
    let (c, _) = tiny_engine().shutdown().unwrap();
    let (_, z) = devices(128, 28);
    let r = Engine::open(c, z, ManualClock::new(), tiny_config());
    assert!(matches!(r, Err(OpenError::LabelUnreadable { .. })), "{r:?}");
}

/// Flips a byte of the block holding `lba` on whichever device holds it.
fn corrupt(e: Eng, v: shale_engine::VolumeUid, lba: u64) -> (Eng, Tier, shale_engine::Pba) {
    let mut e = e;
    let loc = e.locate(v, Lba(lba)).unwrap().unwrap();
    let (mut c, mut z) = shutdown_raw(e);
    match loc.tier {
        Tier::Cache => {
            let mut b = vec![0u8; 4096];
            c.read_at(loc.offset, &mut b).unwrap();
            b[17] ^= 0x40;
            c.write_at(loc.offset, &b).unwrap();
        }
        Tier::Capacity => {
            let emu = ZoneEmu::open(z).unwrap();
            let off = emu.data_offset() + loc.offset;
            z = emu.into_inner();
            let mut b = vec![0u8; 4096];
            z.read_at(off, &mut b).unwrap();
            b[17] ^= 0x40;
            z.write_at(off, &b).unwrap();
        }
    }
    (open_raw(c, z).unwrap(), loc.tier, loc.pba)
}

#[test]
fn crc_mismatch_on_read_names_the_location() {
    let mut e = tiny_engine();
    let v = create(&mut e, "a", 4 << 20);
    // Enough data that early blocks are compacted to the capacity device.
    for i in 0..1024u64 {
        write(&mut e, v, i * 4096, &pattern(i, 4096)).unwrap();
    }
    for _ in 0..3 {
        for i in 512..1024u64 {
            write(&mut e, v, i * 4096, &pattern(i, 4096)).unwrap();
        }
    }
    let mut tiers = Vec::new();
    for lba in [0u64, 1023] {
        let (e2, tier, pba) = corrupt(e, v, lba);
        e = e2;
        tiers.push(tier);
        let r = read(&mut e, v, lba * 4096, 4096);
        match r {
            Err(EngineError::ChecksumMismatch {
                volume,
                lba: l,
                pba: p,
                ..
            }) => {
                assert_eq!((volume, l, p), (shale_engine::VolumeId(0), Lba(lba), pba));
            }
            r => panic!("expected a checksum mismatch, got {r:?}"),
        }
        // A read of several blocks around it (one device read for blocks that lie
        // side by side) fails on that block too.
        let first = lba.saturating_sub(3);
        let last = (lba + 3).min(1023);
        match read(&mut e, v, first * 4096, (last - first + 1) * 4096) {
            Err(EngineError::ChecksumMismatch { lba: l, pba: p, .. }) => {
                assert_eq!((l, p), (Lba(lba), pba));
            }
            r => panic!("expected a checksum mismatch, got {r:?}"),
        }
        // Neighbours are fine, and the engine keeps serving.
        assert_eq!(
            read(&mut e, v, (lba ^ 1) * 4096, 4096).unwrap(),
            pattern(lba ^ 1, 4096)
        );
        assert!(e.stats().crc_errors > 0);
    }
    assert!(
        tiers.contains(&Tier::Cache) && tiers.contains(&Tier::Capacity),
        "{tiers:?}"
    );
}

fn churn<Z: shale_device::ZonedDevice>(
    e: &mut Engine<MemDevice, Z, ManualClock>,
    rounds: u64,
) -> u64 {
    let blocks = e.user_capacity_bytes() / 4096 * 9 / 10;
    let done = std::sync::Arc::new(std::sync::Mutex::new(0u64));
    let vol = {
        let d = done.clone();
        let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
        let s2 = slot.clone();
        e.submit(
            Request::CreateVolume {
                name: "q".into(),
                size_bytes: blocks * 4096,
            },
            Box::new(move |r| *s2.lock().unwrap() = Some(r)),
        );
        e.run_until_idle().unwrap();
        drop(d);
        let r = slot.lock().unwrap().take().unwrap().unwrap();
        match r {
            Reply::Volume(v) => v.uid,
            r => panic!("{r:?}"),
        }
    };
    let mut x = 5u64;
    let mut last = vec![u64::MAX; blocks as usize];
    for i in 0..rounds {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lba = (x >> 33) % blocks;
        last[lba as usize] = i;
        let d = done.clone();
        e.submit(
            Request::Write {
                volume: vol,
                offset: lba * 4096,
                data: pattern(i, 4096),
                fua: false,
            },
            Box::new(move |r| {
                r.unwrap();
                *d.lock().unwrap() += 1;
            }),
        );
        if i % 64 == 63 {
            e.run_until_idle().unwrap();
        }
    }
    e.run_until_idle().unwrap();
    e.self_check().unwrap();
    for (lba, &i) in last.iter().enumerate().step_by(7) {
        let want = if i == u64::MAX {
            vec![0; 4096]
        } else {
            pattern(i, 4096)
        };
        let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
        let s2 = slot.clone();
        e.submit(
            Request::Read {
                volume: vol,
                offset: lba as u64 * 4096,
                len: 4096,
            },
            Box::new(move |r| *s2.lock().unwrap() = Some(r)),
        );
        e.run_until_idle().unwrap();
        let r = slot.lock().unwrap().take().unwrap().unwrap();
        match r {
            Reply::Read(d) => assert_eq!(d, want, "lba {lba}"),
            r => panic!("{r:?}"),
        }
    }
    let n = *done.lock().unwrap();
    n
}

#[test]
fn capacity_on_simulated_qlc_with_zone_emulation() {
    // ZoneEmu over a conventional QLC model: a zone reset is a TRIM of its range.
    let qlc = simulated_block_device(&preset("qlc-p5316").unwrap(), 34 * 256 * 4096, Backing::Mem)
        .unwrap();
    let handle = qlc.stats_handle();
    let mut zc = ZoneEmuConfig::new(256 * 4096);
    zc.zone_count_max = 32;
    zc.max_open_zones = 8;
    zc.max_active_zones = 8;
    let cap = ZoneEmu::format(qlc, &zc).unwrap();
    let cache = MemDevice::new((128 + 8 * 256) * 4096, 4096).unwrap();
    let mut e = Engine::format(cache, cap, ManualClock::new(), tiny_config()).unwrap();
    handle.reset();
    assert_eq!(churn(&mut e, 12_000), 12_000);
    let s = e.stats();
    let f = handle.stats();
    assert!(s.zone_resets > 0 && s.gc_victims > 0, "{s:?}");
    assert!(
        f.host_bytes_written >= s.capacity_write_bytes(),
        "{f:?} {s:?}"
    );
    assert!(
        f.host_bytes_discarded > 0,
        "zone resets must reach the drive as trims: {f:?}"
    );
    assert!(f.nand_bytes_written >= f.host_bytes_written);
}

#[test]
fn capacity_on_simulated_zns() {
    let zns =
        simulated_zoned_device(&preset("zns-qlc").unwrap(), 256 * 4096, 32, Backing::Mem).unwrap();
    let cache = MemDevice::new((128 + 8 * 256) * 4096, 4096).unwrap();
    let mut e = Engine::format(cache, zns, ManualClock::new(), tiny_config()).unwrap();
    assert_eq!(churn(&mut e, 12_000), 12_000);
    let s = e.stats();
    assert!(s.zone_resets > 0 && s.gc_victims > 0, "{s:?}");
    e.shutdown().unwrap();
}

#[test]
fn engine_thread_serves_concurrent_clients() {
    let e = tiny_engine();
    let t = EngineThread::spawn(e, 64).unwrap();
    let v = match t
        .call(Request::CreateVolume {
            name: "a".into(),
            size_bytes: 2 << 20,
        })
        .unwrap()
    {
        Reply::Volume(v) => v.uid,
        r => panic!("{r:?}"),
    };
    let t = std::sync::Arc::new(t);
    let handles: Vec<_> = (0..2u64)
        .map(|k| {
            let t = t.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let lba = k * 256 + i;
                    t.call(Request::Write {
                        volume: v,
                        offset: lba * 4096,
                        data: pattern(lba, 4096),
                        fua: i % 50 == 0,
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    t.call(Request::Flush).unwrap();
    for lba in (0..200).chain(256..456) {
        match t
            .call(Request::Read {
                volume: v,
                offset: lba * 4096,
                len: 4096,
            })
            .unwrap()
        {
            Reply::Read(d) => assert_eq!(d, pattern(lba, 4096)),
            r => panic!("{r:?}"),
        }
    }
    match t.call(Request::Stats).unwrap() {
        Reply::Stats(s) => assert_eq!(s.user_write_bytes, 400 * 4096),
        r => panic!("{r:?}"),
    }
    t.call(Request::SelfCheck).unwrap();
    match t.call(Request::ListVolumes).unwrap() {
        Reply::Volumes(v) => assert_eq!(v.len(), 1),
        r => panic!("{r:?}"),
    }
    let t = std::sync::Arc::try_unwrap(t).unwrap();
    let (c, z) = t.shutdown().unwrap();
    let z = ZoneEmu::open(z.into_inner()).unwrap();
    let mut e = Engine::open(c, z, ManualClock::new(), tiny_config()).unwrap();
    assert_eq!(
        read(&mut e, v, 4096 * 300, 4096).unwrap(),
        pattern(300, 4096)
    );
}

mod arbitrary_requests {
    use super::*;
    use proptest::prelude::*;

    fn req() -> impl Strategy<Value = Request> {
        let vol = prop_oneof![0u64..4, any::<u64>()].prop_map(shale_engine::VolumeUid);
        let off = prop_oneof![0u64..(2 << 20), any::<u64>()];
        let len = prop_oneof![0u64..70_000, any::<u64>()];
        prop_oneof![
            (vol.clone(), off.clone(), len.clone()).prop_map(|(volume, offset, len)| {
                Request::Read {
                    volume,
                    offset,
                    len,
                }
            }),
            (vol.clone(), off.clone(), 0usize..70_000, any::<bool>()).prop_map(
                |(volume, offset, n, fua)| Request::Write {
                    volume,
                    offset,
                    data: vec![0xA5; n],
                    fua
                }
            ),
            (vol.clone(), off.clone(), len.clone()).prop_map(|(volume, offset, len)| {
                Request::Trim {
                    volume,
                    offset,
                    len,
                }
            }),
            (vol.clone(), off, len).prop_map(|(volume, offset, len)| Request::WriteZeroes {
                volume,
                offset,
                len
            }),
            Just(Request::Flush),
            ("[a-z]{0,40}", prop_oneof![0u64..(4 << 20), any::<u64>()])
                .prop_map(|(name, size_bytes)| Request::CreateVolume { name, size_bytes }),
            (vol.clone(), prop_oneof![0u64..(4 << 20), any::<u64>()])
                .prop_map(|(volume, size_bytes)| Request::ResizeVolume { volume, size_bytes }),
            vol.prop_map(|volume| Request::DeleteVolume { volume }),
            Just(Request::ListVolumes),
            Just(Request::Stats),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        /// Whatever clients send, the engine answers each request (maybe with an error),
        /// never panics, and keeps its invariants.
        #[test]
        fn strangers_requests_never_break_the_engine(reqs in proptest::collection::vec(req(), 1..60)) {
            let mut e = tiny_engine();
            create(&mut e, "base", 2 << 20);
            for r in reqs {
                let _ = call(&mut e, r);
            }
            prop_assert!(e.self_check().is_ok());
            e.shutdown().unwrap();
        }
    }
}

/// Opens `c` and `z` with the scrub on, lets engine-clock time pass with no request,
/// and returns the engine.
fn scrubbed(c: MemDevice, z: MemDevice) -> Eng {
    let clock = ManualClock::new();
    let config = Config {
        scrub_bytes_per_sec: 1 << 30,
        ..tiny_config()
    };
    let mut e = Engine::open(c, ZoneEmu::open(z).unwrap(), clock.clone(), config).unwrap();
    for _ in 0..500 {
        clock.advance_ns(1_000_000);
        e.poll();
    }
    e
}

/// The scrub checks the map from the P2L side: two md entries of a capacity group
/// whose LBAs are swapped (CRC-valid, as a misdirected or buggy metadata write would
/// leave them) are found before any read meets them.
#[test]
fn the_scrub_finds_md_entries_the_l2p_does_not_map_back() {
    use shale_format::{decode_md, encode_md, GROUP_BLOCKS};
    let mut e = tiny_engine();
    let v = create(&mut e, "a", 14 << 20);
    let blocks = 3000u64;
    for b in (0..blocks).step_by(16) {
        let data: Vec<u8> = (b..b + 16).flat_map(|l| pattern(l, 4096)).collect();
        write(&mut e, v, b * 4096, &data).unwrap();
    }
    let (c, z) = shutdown_raw(e);
    // Untouched, the scrub finds nothing.
    let mut e = scrubbed(c, z);
    let s = e.stats();
    assert!(s.scrub_bytes > 0, "the scrub never ran");
    assert_eq!(s.scrub_mapping_errors, 0);
    let loc = (0..blocks)
        .map(|l| e.locate(v, Lba(l)).unwrap().unwrap())
        .find(|l| l.tier == Tier::Capacity && !l.in_memory)
        .expect("some block went to the capacity device");
    let (c, z) = shutdown_raw(e);
    let emu = ZoneEmu::open(z).unwrap();
    let base = emu.data_offset();
    let mut z = emu.into_inner();
    let slot = loc.offset / 4096;
    let group_start = slot / u64::from(GROUP_BLOCKS) * u64::from(GROUP_BLOCKS);
    let md_at = (group_start + u64::from(GROUP_BLOCKS) - 2) * 4096 + base;
    let mut md = vec![0u8; 4096];
    z.read_at(md_at, &mut md).unwrap();
    let (h, mut entries) = decode_md(&md, 0).unwrap();
    let data: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].kind.holds_data())
        .collect();
    assert!(data.len() >= 2, "a group of the capacity holds data");
    let (i, j) = (data[0], data[1]);
    let (a, b) = (entries[i].lba, entries[j].lba);
    entries[i].lba = b;
    entries[j].lba = a;
    encode_md(&mut md, &h, &entries);
    // Both copies, so whichever the read picks is the swapped one.
    z.write_at(md_at, &md).unwrap();
    z.write_at(md_at + 4096, &md).unwrap();
    let mut e = scrubbed(c, z);
    assert!(
        e.stats().scrub_mapping_errors >= 2,
        "the swapped entries were not found: {}",
        e.stats().scrub_mapping_errors
    );
    // A read of either block meets the same disagreement and says so.
    for l in [a.0, b.0] {
        assert!(matches!(
            read(&mut e, v, l * 4096, 4096),
            Err(EngineError::Misdirected { .. })
        ));
    }
}
