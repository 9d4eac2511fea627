use super::*;
use shale_testkit::pattern;
use std::os::unix::fs::MetadataExt;

const MIB: u64 = 1024 * 1024;

fn opts(engine: EngineChoice) -> FileOptions {
    FileOptions {
        engine,
        direct: DirectIo::Auto,
        queue_depth: 32,
    }
}

/// Both engines, so each test holds them to the same behaviour. io_uring is
/// required where the kernel offers it; if it does not, the test says so and the
/// Auto choice (psync fallback) stands in.
fn engines() -> Vec<EngineChoice> {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("probe");
    FileDevice::create_sparse(&p, 4096).expect("create");
    let uring = FileDevice::open_with(&p, &opts(EngineChoice::Uring)).is_ok();
    if uring {
        vec![EngineChoice::Uring, EngineChoice::Psync]
    } else {
        eprintln!("io_uring unavailable on this kernel: only the psync engine is tested");
        vec![EngineChoice::Auto, EngineChoice::Psync]
    }
}

fn wait_all(dev: &mut FileDevice, n: usize) -> Vec<IoCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        dev.poll(&mut out, 1).expect("poll");
    }
    assert_eq!(dev.in_flight(), 0);
    out
}

#[test]
fn write_flush_reopen_read_back() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dev.img");
        FileDevice::create_sparse(&path, 16 * MIB).expect("create");
        {
            let mut d = FileDevice::open_with(&path, &opts(engine)).expect("open");
            assert_eq!(d.size_bytes(), 16 * MIB);
            assert_eq!(d.info().logical_block_size, 4096);
            for i in 0..8u64 {
                d.submit(IoRequest {
                    tag: i,
                    op: IoOp::Write {
                        offset: i * MIB,
                        buf: IoBuf::from_slice(&pattern(i, 64 * 1024)),
                        fua: i == 7,
                    },
                });
            }
            let done = wait_all(&mut d, 8);
            assert!(
                done.iter().all(|c| c.result.is_ok()),
                "{engine:?}: {done:?}"
            );
            d.submit(IoRequest {
                tag: 99,
                op: IoOp::Flush,
            });
            let done = wait_all(&mut d, 1);
            assert!(matches!(done[0].result, Ok(())) && done[0].tag == 99);
        }
        let mut d = FileDevice::open_with(&path, &opts(engine)).expect("reopen");
        for i in 0..8u64 {
            d.submit(IoRequest {
                tag: i,
                op: IoOp::Read {
                    offset: i * MIB,
                    buf: IoBuf::zeroed(64 * 1024),
                },
            });
        }
        for c in wait_all(&mut d, 8) {
            assert!(c.result.is_ok());
            assert!(
                c.buf.as_deref() == Some(&pattern(c.tag, 64 * 1024)[..]),
                "{engine:?} tag {} read back wrong data",
                c.tag
            );
        }
    }
}

#[test]
fn many_in_flight_any_completion_order() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dev.img");
        FileDevice::create_sparse(&path, 320 * MIB).expect("create");
        // Queue depth 32 with 300 requests: most wait in the backlog.
        let mut d = FileDevice::open_with(&path, &opts(engine)).expect("open");
        let n = 300u64;
        // Mixed sizes so large and small requests race in the kernel.
        let size = |i: u64| {
            if i.is_multiple_of(7) {
                1 << 20
            } else {
                4096 * (1 + i % 4)
            }
        };
        let off = |i: u64| i * MIB;
        for i in 0..n {
            d.submit(IoRequest {
                tag: i,
                op: IoOp::Write {
                    offset: off(i),
                    buf: IoBuf::from_slice(&pattern(i, size(i) as usize)),
                    fua: false,
                },
            });
        }
        assert_eq!(d.in_flight(), n as usize);
        let done = wait_all(&mut d, n as usize);
        let mut seen = vec![false; n as usize];
        for c in &done {
            assert!(c.result.is_ok(), "{engine:?} tag {}: {:?}", c.tag, c.result);
            assert_eq!(c.buf.as_ref().map(|b| b.len() as u64), Some(size(c.tag)));
            assert!(!std::mem::replace(&mut seen[c.tag as usize], true));
        }
        let in_order = done.windows(2).all(|w| w[0].tag < w[1].tag);
        eprintln!("{engine:?}: completions in submission order: {in_order}");
        // Reads back, all in flight at once.
        for i in 0..n {
            d.submit(IoRequest {
                tag: i,
                op: IoOp::Read {
                    offset: off(i),
                    buf: IoBuf::zeroed(size(i) as usize),
                },
            });
        }
        for c in wait_all(&mut d, n as usize) {
            assert!(
                c.buf.as_deref() == Some(&pattern(c.tag, size(c.tag) as usize)[..]),
                "{engine:?} tag {} read back wrong data",
                c.tag
            );
        }
    }
}

#[test]
fn argument_errors_never_reach_the_kernel() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dev.img");
        FileDevice::create_sparse(&path, MIB).expect("create");
        let mut d = FileDevice::open_with(&path, &opts(engine)).expect("open");
        let reqs = vec![
            IoOp::Write {
                offset: 512,
                buf: IoBuf::zeroed(4096),
                fua: false,
            },
            IoOp::Read {
                offset: 0,
                buf: IoBuf::zeroed(4096 + 512),
            },
            IoOp::Read {
                offset: MIB,
                buf: IoBuf::zeroed(4096),
            },
            IoOp::Write {
                offset: 0,
                buf: IoBuf::zeroed(0),
                fua: false,
            },
            IoOp::Discard {
                offset: 4096,
                len: 100,
            },
            IoOp::Discard {
                offset: MIB - 4096,
                len: 8192,
            },
        ];
        for (tag, op) in reqs.into_iter().enumerate() {
            d.submit(IoRequest {
                tag: tag as u64,
                op,
            });
        }
        let mut done = wait_all(&mut d, 6);
        done.sort_by_key(|c| c.tag);
        let kinds: Vec<&str> = done
            .iter()
            .map(|c| match &c.result {
                Err(DeviceError::Misaligned { .. }) => "misaligned",
                Err(DeviceError::OutOfRange { .. }) => "range",
                Err(DeviceError::ZeroLength { .. }) => "zero",
                other => panic!("{engine:?}: unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "misaligned",
                "misaligned",
                "range",
                "zero",
                "misaligned",
                "range"
            ]
        );
        assert!(
            done[0].buf.is_some(),
            "a refused request returns its buffer"
        );
        assert!(matches!(
            d.write_at(100, &[0u8; 4096]),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            d.read_at(MIB, &mut [0u8; 4096]),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.discard(0, 0),
            Err(DeviceError::ZeroLength { .. })
        ));
    }
}

#[test]
fn sync_helpers_bounce_unaligned_buffers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dev.img");
    FileDevice::create_sparse(&path, 8 * MIB).expect("create");
    let mut d = FileDevice::open(&path).expect("open");
    // A Vec slice starting one byte into its allocation is never 4096-aligned.
    let len = 3 * MIB as usize + 8192;
    let mut backing = vec![0u8; len + 1];
    backing[1..].copy_from_slice(&pattern(5, len));
    d.write_at(4096, &backing[1..]).expect("write");
    d.flush().expect("flush");
    let mut back = vec![0u8; len + 1];
    d.read_at(4096, &mut back[1..]).expect("read");
    assert!(back[1..] == backing[1..], "bounced read differs");
    // Async read of the same range sees the same bytes.
    d.submit(IoRequest {
        tag: 1,
        op: IoOp::Read {
            offset: 4096,
            buf: IoBuf::zeroed(8192),
        },
    });
    let c = wait_all(&mut d, 1);
    assert!(c[0].buf.as_deref() == Some(&backing[1..8193]));
}

#[test]
fn discard_punches_holes_that_read_as_zeros() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dev.img");
        FileDevice::create_sparse(&path, 8 * MIB).expect("create");
        let mut d = FileDevice::open_with(&path, &opts(engine)).expect("open");
        d.write_at(0, &pattern(1, 4 * MIB as usize)).expect("write");
        d.flush().expect("flush");
        let allocated = std::fs::metadata(&path).expect("meta").blocks() * 512;
        assert!(allocated >= 4 * MIB, "{allocated}");
        d.submit(IoRequest {
            tag: 1,
            op: IoOp::Discard {
                offset: MIB,
                len: 2 * MIB,
            },
        });
        let c = wait_all(&mut d, 1);
        assert!(c[0].result.is_ok(), "{:?}", c[0].result);
        d.discard(3 * MIB, 4096).expect("sync discard");
        let mut back = vec![1u8; 4 * MIB as usize];
        d.read_at(0, &mut back).expect("read");
        let want = pattern(1, 4 * MIB as usize);
        assert!(back[..MIB as usize] == want[..MIB as usize]);
        assert!(back[MIB as usize..(3 * MIB + 4096) as usize]
            .iter()
            .all(|&b| b == 0));
        assert!(back[(3 * MIB + 4096) as usize..] == want[(3 * MIB + 4096) as usize..]);
        let after = std::fs::metadata(&path).expect("meta").blocks() * 512;
        assert!(
            after + 2 * MIB <= allocated,
            "{engine:?}: {after} vs {allocated}"
        );
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), 8 * MIB);
    }
}

#[test]
fn one_tib_sparse_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.img");
    let tib = 1u64 << 40;
    FileDevice::create_sparse(&path, tib).expect("create 1 TiB");
    let mut d = FileDevice::open(&path).expect("open");
    eprintln!(
        "1 TiB sparse file in {}: engine {:?}, direct {}",
        dir.path().display(),
        d.engine_kind(),
        d.is_direct()
    );
    assert_eq!(d.size_bytes(), tib);
    let offsets = [0, tib / 2 + 4096, tib - 65536];
    for (i, &off) in offsets.iter().enumerate() {
        d.submit(IoRequest {
            tag: i as u64,
            op: IoOp::Write {
                offset: off,
                buf: IoBuf::from_slice(&pattern(i as u64, 65536)),
                fua: false,
            },
        });
    }
    assert!(wait_all(&mut d, 3).iter().all(|c| c.result.is_ok()));
    d.flush().expect("flush");
    for (i, &off) in offsets.iter().enumerate() {
        let mut b = vec![0u8; 65536];
        d.read_at(off, &mut b).expect("read");
        assert!(b == pattern(i as u64, 65536), "offset {off} differs");
    }
    let mut b = vec![1u8; 4096];
    d.read_at(tib / 4, &mut b).expect("read hole");
    assert!(b.iter().all(|&x| x == 0));
    let used = std::fs::metadata(&path).expect("meta").blocks() * 512;
    assert!(used < 16 * MIB, "sparse file uses {used} bytes");
    assert!(matches!(
        d.read_at(tib, &mut b),
        Err(DeviceError::OutOfRange { .. })
    ));
}

#[test]
fn open_errors_are_typed() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(matches!(
        FileDevice::open(dir.path().join("missing")),
        Err(DeviceError::OpenFailed { .. })
    ));
    assert!(matches!(
        FileDevice::open(dir.path()),
        Err(DeviceError::OpenFailed { .. })
    ));
    assert!(matches!(
        FileDevice::create_sparse(dir.path(), 4096),
        Err(DeviceError::OpenFailed { .. })
    ));
    let p = dir.path().join("odd");
    assert!(matches!(
        FileDevice::create_sparse(&p, 4096 + 512),
        Err(DeviceError::InvalidGeometry { .. })
    ));
    assert!(matches!(
        FileDevice::create_sparse(&p, 0),
        Err(DeviceError::TooSmall { .. })
    ));
    std::fs::write(&p, vec![0u8; 4096 + 512]).expect("write");
    assert!(matches!(
        FileDevice::open(&p),
        Err(DeviceError::InvalidGeometry { .. })
    ));
    std::fs::write(&p, b"").expect("write");
    assert!(matches!(
        FileDevice::open(&p),
        Err(DeviceError::TooSmall { .. })
    ));
    FileDevice::create_sparse(&p, 4096).expect("create");
    assert!(matches!(
        FileDevice::open_with(
            &p,
            &FileOptions {
                queue_depth: 0,
                ..FileOptions::default()
            }
        ),
        Err(DeviceError::InvalidGeometry { .. })
    ));
}

#[test]
fn buffered_mode_works_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dev.img");
    FileDevice::create_sparse(&path, MIB).expect("create");
    let mut d = FileDevice::open_with(
        &path,
        &FileOptions {
            direct: DirectIo::Off,
            ..FileOptions::default()
        },
    )
    .expect("open");
    assert!(!d.is_direct());
    assert!(d.info().name.ends_with("(buffered)"));
    d.write_at(8192, &pattern(3, 4096)).expect("write");
    let mut b = vec![0u8; 4096];
    d.read_at(8192, &mut b).expect("read");
    assert_eq!(b, pattern(3, 4096));
}

#[test]
fn dropping_with_io_in_flight_is_safe() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dev.img");
        FileDevice::create_sparse(&path, 16 * MIB).expect("create");
        let mut d = FileDevice::open_with(&path, &opts(engine)).expect("open");
        for i in 0..64u64 {
            d.submit(IoRequest {
                tag: i,
                op: IoOp::Read {
                    offset: i * 128 * 1024,
                    buf: IoBuf::zeroed(128 * 1024),
                },
            });
        }
        drop(d);
    }
}

/// Needs root and a free loop device; run with `cargo test -- --ignored`.
#[test]
#[ignore]
fn loop_block_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("backing.img");
    FileDevice::create_sparse(&path, 64 * MIB).expect("create");
    let out = std::process::Command::new("losetup")
        .args(["-f", "--show", "--sector-size", "512"])
        .arg(&path)
        .output()
        .expect("losetup");
    assert!(out.status.success(), "losetup failed: {out:?}");
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let result = std::panic::catch_unwind(|| {
        for engine in engines() {
            let mut d = FileDevice::open_with(&loopdev, &opts(engine)).expect("open loop");
            assert!(d.is_block_device());
            assert_eq!(d.size_bytes(), 64 * MIB);
            assert_eq!(d.info().logical_block_size, 512);
            d.submit(IoRequest {
                tag: 1,
                op: IoOp::Write {
                    offset: 512,
                    buf: IoBuf::from_slice(&pattern(9, 1536)),
                    fua: true,
                },
            });
            assert!(wait_all(&mut d, 1)[0].result.is_ok());
            let mut b = vec![0u8; 1536];
            d.read_at(512, &mut b).expect("read");
            assert_eq!(b, pattern(9, 1536));
            d.discard(0, MIB).expect("discard");
            // An asynchronous discard (BLOCK_URING_CMD_DISCARD through the ring on
            // Linux 6.12 and later, the ioctl before) reads back as zeros on a loop
            // device over a sparse file.
            d.write_at(2 * MIB, &pattern(3, 8192)).expect("write");
            d.submit(IoRequest {
                tag: 2,
                op: IoOp::Discard {
                    offset: 2 * MIB,
                    len: 8192,
                },
            });
            let c = wait_all(&mut d, 1);
            assert_eq!(c[0].tag, 2);
            assert!(c[0].result.is_ok(), "{:?}", c[0].result);
            let mut z = vec![1u8; 8192];
            d.read_at(2 * MIB, &mut z).expect("read");
            assert!(z.iter().all(|&b| b == 0), "discarded range not zero");
            if let Engine::Uring(u) = &d.engine {
                eprintln!(
                    "block discards through the ring: {}",
                    u.discards_through_ring()
                );
            }
        }
    });
    let _ = std::process::Command::new("losetup")
        .args(["-d", &loopdev])
        .status();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn zone_emulation_over_a_file_with_real_async_io() {
    use crate::{ZoneEmu, ZoneEmuConfig, ZoneOp, ZoneRequest, ZoneState, ZonedDevice};
    for engine in engines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("zoned.img");
        FileDevice::create_sparse(&path, 64 * MIB).expect("create");
        let dev = FileDevice::open_with(&path, &opts(engine)).expect("open");
        let mut emu = ZoneEmu::format(dev, &ZoneEmuConfig::new(4 * MIB)).expect("format");
        // 64 appends to 4 zones all in flight, then a flush behind them.
        for i in 0..64u64 {
            emu.submit(ZoneRequest {
                tag: i,
                op: ZoneOp::Append {
                    zone: (i % 4) as u32,
                    buf: IoBuf::from_slice(&pattern(i, 16384)),
                    fua: false,
                },
            });
        }
        emu.submit(ZoneRequest {
            tag: 1000,
            op: ZoneOp::Flush,
        });
        let mut out = Vec::new();
        while emu.in_flight() > 0 {
            emu.poll(&mut out, 1).expect("poll");
        }
        assert_eq!(out.len(), 65);
        assert_eq!(
            out.last().map(|c| c.tag),
            Some(1000),
            "flush completes last"
        );
        let mut landed = Vec::new();
        for c in &out[..64] {
            let at = c.result.as_ref().expect("ok").expect("landed");
            landed.push((c.tag, at));
        }
        drop(emu);
        let dev = FileDevice::open_with(&path, &opts(engine)).expect("reopen");
        let mut emu = ZoneEmu::open(dev).expect("open zones");
        for z in 0..4 {
            let info = emu.zone_info(z).expect("zone");
            assert_eq!(info.state, ZoneState::Closed);
            assert_eq!(info.write_pointer - info.start, 16 * 16384);
        }
        for (tag, at) in landed {
            let mut b = vec![0u8; 16384];
            emu.read_at(at, &mut b).expect("read");
            assert!(b == pattern(tag, 16384), "{engine:?}: append {tag} at {at}");
        }
    }
}

/// A device file holds every volume's data: only its owner may open it.
#[test]
fn create_sparse_makes_an_owner_only_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("dev");
    FileDevice::create_sparse(&p, 4096).expect("create");
    let mode = std::fs::metadata(&p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
}
