//! A pool of shards over memory devices: volume changes a crash cut short are
//! finished or undone at the next open (shard 0's table is the pool's), shards of
//! another pool or in the wrong order are refused, and split requests land where
//! the deal says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shale_device::MemDevice;
use shale_engine::{Config, Engine, EngineError, ManualClock, Reply, Request, VolumeUid};
use shale_shards::{ShardMap, Shards, ShardsError};
use shale_testkit::{call, pattern};

mod common;

use common::{mem_devices, MemCap as Cap};

type Pool = Shards<MemDevice, Cap>;

const GRANULE: u64 = 8192;

fn devices() -> (MemDevice, Cap) {
    mem_devices(6, 32)
}

fn config() -> Config {
    Config {
        chunk_blocks: 256,
        volumes_max: 4,
        journal_blocks: 16,
        write_buffers_max: 8,
        request_bytes_max: 1 << 20,
        streams_max: 1,
        ..Config::default()
    }
}

fn pool(n: usize) -> Pool {
    Shards::format(
        (0..n).map(|_| devices()).collect(),
        ManualClock::new,
        &config(),
        GRANULE,
        64,
    )
    .unwrap()
}

fn reopen(devices: Vec<(MemDevice, Cap)>) -> Pool {
    Shards::open(devices, ManualClock::new, &config(), 64)
        .unwrap()
        .0
}

fn create(p: &Pool, name: &str, size: u64) -> VolumeUid {
    match p.call(Request::CreateVolume {
        name: name.into(),
        size_bytes: size,
    }) {
        Ok(Reply::Volume(v)) => {
            assert_eq!(v.size_bytes, size);
            v.uid
        }
        r => panic!("create: {r:?}"),
    }
}

fn read(p: &Pool, volume: VolumeUid, offset: u64, len: u64) -> Vec<u8> {
    match p.call(Request::Read {
        volume,
        offset,
        len,
    }) {
        Ok(Reply::Read(d)) => d,
        r => panic!("read: {r:?}"),
    }
}

fn sizes(p: &Pool) -> Vec<(String, u64)> {
    match p.call(Request::ListVolumes) {
        Ok(Reply::Volumes(v)) => v.into_iter().map(|v| (v.name, v.size_bytes)).collect(),
        r => panic!("list: {r:?}"),
    }
}

/// Runs `f` on shard `shard` alone (as a crash between two shards' changes leaves
/// it), then hands the devices back.
fn on_shard(
    mut devices: Vec<(MemDevice, Cap)>,
    shard: usize,
    f: impl FnOnce(&mut Engine<MemDevice, Cap, ManualClock>),
) -> Vec<(MemDevice, Cap)> {
    let (c, z) = devices.remove(shard);
    let mut e = Engine::open(c, z, ManualClock::new(), config()).unwrap();
    f(&mut e);
    devices.insert(shard, e.shutdown().unwrap());
    devices
}

/// Every shard's own table after a reconciling open: (name, slice, whole size).
/// (name, slice bytes, whole bytes) of each volume of one shard's table.
type Table = Vec<(String, u64, u64)>;

fn tables(devices: Vec<(MemDevice, Cap)>) -> (Vec<Table>, Vec<(MemDevice, Cap)>) {
    let mut out = Vec::new();
    let mut back = Vec::new();
    for (c, z) in devices {
        let mut e = Engine::open(c, z, ManualClock::new(), config()).unwrap();
        let Ok(Reply::Volumes(v)) = call(&mut e, Request::ListVolumes) else {
            panic!("list")
        };
        out.push(
            v.into_iter()
                .map(|v| (v.name, v.size_bytes, v.whole_size_bytes))
                .collect(),
        );
        back.push(e.shutdown().unwrap());
    }
    (out, back)
}

#[test]
fn a_request_spanning_shards_is_split_and_joined() {
    let p = pool(3);
    let map = *p.map();
    assert_eq!(map, ShardMap::new(3, GRANULE).unwrap());
    let v = create(&p, "a", 1 << 20);
    let data = pattern(1, 200_000);
    p.call(Request::Write {
        volume: v,
        offset: 5000,
        data: data.clone(),
        fua: true,
    })
    .unwrap();
    assert_eq!(read(&p, v, 5000, 200_000), data);
    // Each shard holds its pieces at their local addresses.
    let devices = p.shutdown().unwrap();
    let mut engines: Vec<_> = devices
        .into_iter()
        .map(|(c, z)| Engine::open(c, z, ManualClock::new(), config()).unwrap())
        .collect();
    for piece in map.pieces(5000, 200_000) {
        let got = match call(
            &mut engines[piece.shard],
            Request::Read {
                volume: v,
                offset: piece.local,
                len: piece.len,
            },
        ) {
            Ok(Reply::Read(d)) => d,
            r => panic!("{r:?}"),
        };
        assert_eq!(
            got,
            data[piece.at as usize..(piece.at + piece.len) as usize]
        );
    }
    // Every shard's slice and the whole size are recorded in each table.
    for (s, e) in engines.iter_mut().enumerate() {
        let Ok(Reply::Volumes(list)) = call(e, Request::ListVolumes) else {
            panic!()
        };
        assert_eq!(list[0].whole_size_bytes, 1 << 20);
        assert_eq!(list[0].size_bytes, map.local_size(s, 1 << 20));
    }
}

#[test]
fn small_or_unaligned_volumes_are_refused_with_the_reason() {
    let p = pool(4);
    for size in [4096, 4 * GRANULE - 4096, 4 * GRANULE + 100] {
        let r = p.call(Request::CreateVolume {
            name: "x".into(),
            size_bytes: size,
        });
        assert!(
            matches!(&r, Err(EngineError::InvalidVolume { reason }) if reason.contains("4 shards")),
            "{size}: {r:?}"
        );
    }
    assert!(sizes(&p).is_empty(), "nothing was created");
    // A client may not make slices itself.
    let r = p.call(Request::CreateSlice {
        name: "x".into(),
        uid: None,
        size_bytes: 4096,
        whole_size_bytes: 4096,
        layout: Default::default(),
    });
    assert!(matches!(r, Err(EngineError::InvalidVolume { .. })), "{r:?}");
}

/// A crash after shard 0 created a volume and before the others did: the open
/// creates it in the others.
#[test]
fn a_create_cut_short_is_finished() {
    let p = pool(3);
    let a = create(&p, "a", 256 << 10);
    let map = *p.map();
    let devices = p.shutdown().unwrap();
    let size = 1 << 20;
    let devices = on_shard(devices, 0, |e| {
        call(
            e,
            Request::CreateSlice {
                name: "b".into(),
                uid: None,
                size_bytes: map.local_size(0, size),
                whole_size_bytes: size,
                layout: Default::default(),
            },
        )
        .unwrap();
    });
    let p = reopen(devices);
    assert_eq!(
        sizes(&p),
        vec![("a".to_string(), 256 << 10), ("b".to_string(), size)]
    );
    let Ok(Reply::Volumes(list)) = p.call(Request::ListVolumes) else {
        panic!()
    };
    let b = list[1].uid;
    assert_ne!(a, b);
    let data = pattern(2, size as usize);
    p.call(Request::Write {
        volume: b,
        offset: 0,
        data: data.clone(),
        fua: false,
    })
    .unwrap();
    assert_eq!(read(&p, b, 0, size), data);
    let (t, _) = tables(p.shutdown().unwrap());
    for (s, table) in t.iter().enumerate() {
        assert_eq!(
            table[1],
            ("b".into(), map.local_size(s, size), size),
            "shard {s}"
        );
    }
}

/// A crash after shard 0 deleted a volume and before the others did: the open
/// deletes it from the others.
#[test]
fn a_delete_cut_short_is_finished() {
    let p = pool(2);
    let a = create(&p, "a", 256 << 10);
    create(&p, "b", 512 << 10);
    let devices = p.shutdown().unwrap();
    let devices = on_shard(devices, 0, |e| {
        call(e, Request::DeleteVolume { volume: a }).unwrap();
    });
    let p = reopen(devices);
    assert_eq!(sizes(&p), vec![("b".to_string(), 512 << 10)]);
    let (t, _) = tables(p.shutdown().unwrap());
    assert!(
        t.iter().all(|table| table.len() == 1 && table[0].0 == "b"),
        "{t:?}"
    );
}

/// A crash after shard 0 resized a volume and before the others did: the open
/// resizes the others; data below both sizes survives, the grown part reads zero.
#[test]
fn a_resize_cut_short_is_finished() {
    let p = pool(3);
    let old = 384 << 10;
    let a = create(&p, "a", old);
    let data = pattern(3, old as usize);
    p.call(Request::Write {
        volume: a,
        offset: 0,
        data: data.clone(),
        fua: false,
    })
    .unwrap();
    let map = *p.map();
    let devices = p.shutdown().unwrap();
    let new = 1 << 20;
    let devices = on_shard(devices, 0, |e| {
        call(
            e,
            Request::ResizeSlice {
                volume: a,
                size_bytes: map.local_size(0, new),
                whole_size_bytes: new,
            },
        )
        .unwrap();
    });
    let p = reopen(devices);
    assert_eq!(sizes(&p), vec![("a".to_string(), new)]);
    assert_eq!(read(&p, a, 0, old), data);
    assert!(read(&p, a, old, new - old).iter().all(|&b| b == 0));
    // And a shrink through the pool cuts every shard's slice.
    p.call(Request::ResizeVolume {
        volume: a,
        size_bytes: 256 << 10,
    })
    .unwrap();
    assert_eq!(read(&p, a, 0, 256 << 10), data[..256 << 10]);
    let (t, _) = tables(p.shutdown().unwrap());
    for (s, table) in t.iter().enumerate() {
        assert_eq!(table[0].1, map.local_size(s, 256 << 10), "shard {s}");
    }
}

/// Shards in another order, a shard missing, or a shard of another pool are refused
/// before anything is served; a pool of one shard opens as an ordinary engine.
#[test]
fn shards_of_another_pool_or_order_are_refused() {
    let mut d = pool(3).shutdown().unwrap();
    d.swap(0, 1);
    let r = Shards::open(d, ManualClock::new, &config(), 64);
    assert!(
        matches!(r, Err(ShardsError::Mismatch { position: 0, .. })),
        "{r:?}"
    );
    assert!(r.unwrap_err().to_string().contains("out of order"));
    let mut d = pool(3).shutdown().unwrap();
    d.pop();
    let r = Shards::open(d, ManualClock::new, &config(), 64);
    assert!(matches!(r, Err(ShardsError::Mismatch { .. })), "{r:?}");
    let e = r.unwrap_err().to_string();
    assert!(e.contains("3 shards") && e.contains("2 device sets"), "{e}");
    let mut a = pool(2).shutdown().unwrap();
    let mut b = pool(2).shutdown().unwrap();
    a[1] = b.pop().unwrap();
    let r = Shards::open(a, ManualClock::new, &config(), 64);
    assert!(
        matches!(r, Err(ShardsError::Mismatch { position: 1, .. })),
        "{r:?}"
    );
    let e = r.unwrap_err().to_string();
    assert!(e.contains("device set 1"), "{e}");
    // One shard: an ordinary pool, opened by the engine alone too.
    let one = pool(1);
    let v = create(&one, "solo", 4096);
    let (c, z) = one.shutdown().unwrap().pop().unwrap();
    let mut e = Engine::open(c, z, ManualClock::new(), config()).unwrap();
    assert_eq!(e.shard(), shale_format::ShardTag::ONE);
    call(
        &mut e,
        Request::Read {
            volume: v,
            offset: 0,
            len: 4096,
        },
    )
    .unwrap();
}

/// A flush and statistics cover every shard.
#[test]
fn stats_and_flush_cover_every_shard() {
    let p = pool(4);
    let v = create(&p, "a", 1 << 20);
    p.call(Request::Write {
        volume: v,
        offset: 0,
        data: pattern(4, 1 << 20),
        fua: false,
    })
    .unwrap();
    p.call(Request::Flush).unwrap();
    p.call(Request::SelfCheck).unwrap();
    let Ok(Reply::Stats(st)) = p.call(Request::Stats) else {
        panic!()
    };
    assert_eq!(st.user_write_bytes, 1 << 20);
    assert_eq!(st.volumes.len(), 1);
    assert_eq!(st.volumes[0].user_write_bytes, 1 << 20);
    assert!(p.failure().is_none());
    // A request split over the shards counts once, like one inside a granule.
    assert_eq!(read(&p, v, 0, 1 << 20).len(), 1 << 20);
    assert_eq!(read(&p, v, 4096, 4096).len(), 4096);
    p.call(Request::Trim {
        volume: v,
        offset: 0,
        len: 3 * GRANULE,
    })
    .unwrap();
    let Ok(Reply::Stats(st)) = p.call(Request::Stats) else {
        panic!()
    };
    let vs = &st.volumes[0];
    assert_eq!(
        (vs.write_ops, vs.read_ops, vs.trim_ops),
        (1, 2, 1),
        "{vs:?}"
    );
    assert_eq!(vs.user_read_bytes, (1 << 20) + 4096);
}

/// The pool stepped on one thread keeps the same deal and volumes: what it wrote,
/// the pool on threads reads back after it shut down, and the other way round.
#[test]
fn the_pool_on_one_thread_and_on_threads_share_the_format() {
    let mut local = shale_shards::LocalShards::format(
        (0..3).map(|_| devices()).collect(),
        ManualClock::new,
        &config(),
        GRANULE,
    )
    .unwrap();
    let Ok(Reply::Volume(v)) = local.call(Request::CreateVolume {
        name: "a".into(),
        size_bytes: 1 << 20,
    }) else {
        panic!("create")
    };
    let data = pattern(5, 300_000);
    local
        .call(Request::Write {
            volume: v.uid,
            offset: 12_345,
            data: data.clone(),
            fua: false,
        })
        .unwrap();
    assert_eq!(local.stats().user_write_bytes, 300_000);
    let threaded = reopen(local.shutdown().unwrap());
    assert_eq!(read(&threaded, v.uid, 12_345, 300_000), data);
    let more = pattern(6, 70_000);
    threaded
        .call(Request::Write {
            volume: v.uid,
            offset: 500_000,
            data: more.clone(),
            fua: false,
        })
        .unwrap();
    let (mut local, _) =
        shale_shards::LocalShards::open(threaded.shutdown().unwrap(), ManualClock::new, &config())
            .unwrap();
    let Ok(Reply::Read(got)) = local.call(Request::Read {
        volume: v.uid,
        offset: 500_000,
        len: 70_000,
    }) else {
        panic!("read")
    };
    assert_eq!(got, more);
    local.call(Request::SelfCheck).unwrap();
}

/// A shrink that fails in one shard is finished, never undone: growing the shards
/// that had shrunk back would not bring their dropped tail back, so the pool (shard
/// 0's table) keeps the new size, and the next open shrinks the shard that failed.
#[test]
fn a_shrink_failing_in_one_shard_is_finished_not_undone() {
    use shale_device::{FaultDevice, ZoneEmu};
    use shale_shards::LocalShards;
    type Local = LocalShards<FaultDevice, Cap, ManualClock>;
    let caches: Vec<FaultDevice> = (1..=2)
        .map(|i| FaultDevice::new((128 + 6 * 256) * 4096, 4096, i).unwrap())
        .collect();
    let ctls: Vec<_> = caches.iter().map(FaultDevice::controller).collect();
    let devs = caches.into_iter().map(|c| (c, devices().1)).collect();
    let mut p = Local::format(devs, ManualClock::new, &config(), GRANULE).unwrap();
    let (old, new) = (512 << 10, 256 << 10);
    let a = match p.call(Request::CreateVolume {
        name: "a".into(),
        size_bytes: old,
    }) {
        Ok(Reply::Volume(v)) => v.uid,
        r => panic!("create: {r:?}"),
    };
    let data = pattern(5, old as usize);
    p.call(Request::Write {
        volume: a,
        offset: 0,
        data: data.clone(),
        fua: true,
    })
    .unwrap();
    // Shard 1 fails persisting its part of the shrink, after shard 0 made it.
    ctls[1].fail_flushes(0, 1);
    let r = p.call(Request::ResizeVolume {
        volume: a,
        size_bytes: new,
    });
    assert!(r.is_err(), "{r:?}");
    let listed = match p.call(Request::ListVolumes) {
        Ok(Reply::Volumes(v)) => v,
        r => panic!("list: {r:?}"),
    };
    assert_eq!(listed[0].size_bytes, new, "the pool keeps the shrink");
    let devices: Vec<_> = p
        .abandon()
        .into_iter()
        .map(|(c, z)| {
            let (_, c) = c
                .controller()
                .crash(&shale_device::CrashMode::KeepAll)
                .unwrap();
            (c, ZoneEmu::open(z.into_inner()).unwrap())
        })
        .collect();
    let (mut p, _) = Local::open(devices, ManualClock::new, &config()).unwrap();
    let read = |p: &mut Local, offset: u64, len: u64| match p.call(Request::Read {
        volume: a,
        offset,
        len,
    }) {
        Ok(Reply::Read(d)) => d,
        r => panic!("read: {r:?}"),
    };
    assert_eq!(read(&mut p, 0, new), data[..new as usize]);
    p.call(Request::ResizeVolume {
        volume: a,
        size_bytes: old,
    })
    .unwrap();
    assert!(
        read(&mut p, new, old - new).iter().all(|&b| b == 0),
        "the dropped tail stays dropped in every shard"
    );
    for (s, e) in p.engines_mut().iter_mut().enumerate() {
        e.self_check()
            .unwrap_or_else(|err| panic!("shard {s}: {err}"));
    }
}

/// Direct writes choose by the client's request, not by a shard's part of it: each
/// shard takes its share of `direct_write_min_bytes` and of the sequential run, so a
/// run of 1 MiB in 128 KiB writes (64 KiB per shard) sends what follows to zones.
#[test]
fn direct_writes_choose_by_the_whole_request() {
    let cfg = Config {
        direct_write_min_bytes: 128 << 10,
        direct_write_policy: shale_engine::DirectWritePolicy::Sequential,
        ..config()
    };
    let p = Shards::format(
        (0..2).map(|_| devices()).collect(),
        ManualClock::new,
        &cfg,
        GRANULE,
        64,
    )
    .unwrap();
    let v = create(&p, "a", 2 << 20);
    let data = pattern(9, 2 << 20);
    let direct = |p: &Pool| match p.call(Request::Stats) {
        Ok(Reply::Stats(st)) => st.direct_write_bytes,
        r => panic!("{r:?}"),
    };
    for (i, part) in data.chunks(128 << 10).enumerate() {
        p.call(Request::Write {
            volume: v,
            offset: i as u64 * (128 << 10),
            data: part.to_vec(),
            fua: false,
        })
        .unwrap();
        // The first MiB is the run; every write after it is direct.
        let want = (i as u64 + 1).saturating_sub(8) * (128 << 10);
        assert_eq!(direct(&p), want, "after write {i}");
    }
    assert!(read(&p, v, 0, 2 << 20) == data);
    p.call(Request::SelfCheck).unwrap();
    // Reopened, the shards take their shares again.
    let p = Shards::open(p.shutdown().unwrap(), ManualClock::new, &cfg, 64)
        .unwrap()
        .0;
    assert!(read(&p, v, 0, 2 << 20) == data);
    p.call(Request::Write {
        volume: v,
        offset: 0,
        data: data[..128 << 10].to_vec(),
        fua: false,
    })
    .unwrap();
    assert_eq!(direct(&p), 0, "a new run after the reopen");
}
