//! The back-end driven end to end through `vhost::vhost_user::Frontend` over a
//! unix socket, with memfd guest memory and split virtqueues written by a
//! small driver (`common/`): what QEMU and a Linux guest would do, without them.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use shale_vhost::{serve, BlockTarget, MemTarget, ServeHandle, VhostOptions};

const DISK_BYTES: usize = 64 << 20;
const SECTORS_PER_BLOCK: u64 = 8;

struct Server {
    handle: Option<ServeHandle>,
    target: Arc<MemTarget>,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(target: MemTarget, options: VhostOptions) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("blk.sock");
        let target = Arc::new(target);
        let handle = serve(
            Arc::clone(&target) as Arc<dyn BlockTarget>,
            &socket,
            options,
        )
        .expect("serve");
        Server {
            handle: Some(handle),
            target,
            socket,
            _dir: dir,
        }
    }

    fn guest(&self, setup: Setup) -> Guest {
        Guest::connect(&self.socket, setup)
    }

    fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop();
            h.join().expect("serve ended cleanly");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn mem_server() -> Server {
    Server::start(MemTarget::new(DISK_BYTES), VhostOptions::default())
}

#[test]
fn write_then_read_back_4k_and_1m() {
    let server = mem_server();
    let mut g = server.guest(Setup::default());
    let small = pattern(1, 4096);
    assert_eq!(g.write(0, 8, &small, 1), S_OK);
    assert_eq!(g.read(0, 8, 4096, 1), (S_OK, small.clone()));
    // 12 KiB in three segments, read back in two.
    let mid = pattern(2, 12288);
    assert_eq!(g.write(0, 64, &mid, 3), S_OK);
    assert_eq!(g.read(0, 64, 12288, 2), (S_OK, mid.clone()));
    // 1 MiB in sixteen 64 KiB segments.
    let big = pattern(3, 1 << 20);
    assert_eq!(g.write(0, 2048, &big, 16), S_OK);
    assert_eq!(g.read(0, 2048, 1 << 20, 16), (S_OK, big.clone()));
    // The target holds the bytes.
    let snap = server.target.snapshot();
    assert_eq!(&snap[4096..8192], &small[..]);
    assert_eq!(&snap[2048 * 512..2048 * 512 + (1 << 20)], &big[..]);
    assert!(g.queues[0].signals > 0, "completions were signalled");
}

#[test]
fn flush_and_write_cache_mode() {
    let server = mem_server();
    let mut g = server.guest(Setup::default());
    assert_eq!(g.config(32, 1), vec![1], "write-back by default");
    assert_eq!(g.write(0, 0, &pattern(4, 4096), 1), S_OK);
    assert_eq!(g.simple(0, T_FLUSH, None), S_OK);
    let st = server.target.stats();
    assert_eq!((st.writes, st.fua_writes, st.flushes), (1, 0, 1));
    // The driver switches to write-through: every write is FUA.
    use vhost::vhost_user::message::VhostUserConfigFlags;
    use vhost::vhost_user::VhostUserFrontend;
    g.frontend
        .set_config(32, VhostUserConfigFlags::WRITABLE, &[0])
        .expect("set writeback");
    assert_eq!(g.config(32, 1), vec![0]);
    assert_eq!(g.write(0, 0, &pattern(5, 4096), 1), S_OK);
    assert_eq!(server.target.stats().fua_writes, 1);
    // Anything but the writeback byte is read-only.
    assert!(g
        .frontend
        .set_config(0, VhostUserConfigFlags::WRITABLE, &[0; 8])
        .is_err());
}

#[test]
fn write_through_without_flush_negotiated() {
    let server = mem_server();
    let mut g = server.guest(Setup {
        mask_off: VIRTIO_BLK_F_FLUSH | VIRTIO_BLK_F_CONFIG_WCE,
        ..Setup::default()
    });
    assert_eq!(g.write(0, 0, &pattern(6, 8192), 2), S_OK);
    assert_eq!(server.target.stats().fua_writes, 1);
}

#[test]
fn discard_and_write_zeroes_read_back_zeroes() {
    let server = mem_server();
    let mut g = server.guest(Setup::default());
    assert_ne!(g.features & VIRTIO_BLK_F_DISCARD, 0);
    assert_ne!(g.features & VIRTIO_BLK_F_WRITE_ZEROES, 0);
    let data = pattern(7, 64 << 10);
    assert_eq!(g.write(0, 0, &data, 4), S_OK);
    // Discard the second 16 KiB, write-zeroes (with unmap) the fourth.
    assert_eq!(g.simple(0, T_DISCARD, Some((32, 32, 0))), S_OK);
    assert_eq!(g.simple(0, T_WRITE_ZEROES, Some((96, 32, 1))), S_OK);
    let (st, back) = g.read(0, 0, 64 << 10, 4);
    assert_eq!(st, S_OK);
    let mut want = data.clone();
    want[16 << 10..32 << 10].fill(0);
    want[48 << 10..64 << 10].fill(0);
    assert_eq!(back, want);
    // Discard with the unmap flag, and an unknown flag: unsupported.
    assert_eq!(g.simple(0, T_DISCARD, Some((0, 8, 1))), S_UNSUPP);
    assert_eq!(g.simple(0, T_WRITE_ZEROES, Some((0, 8, 4))), S_UNSUPP);
    // Past the end, or unaligned: I/O error.
    let end = DISK_BYTES as u64 / 512;
    assert_eq!(g.simple(0, T_DISCARD, Some((end - 8, 16, 0))), S_IOERR);
    assert_eq!(g.simple(0, T_WRITE_ZEROES, Some((3, 8, 0))), S_IOERR);
    let st = server.target.stats();
    assert_eq!((st.discards, st.write_zeroes), (1, 1));
}

#[test]
fn get_id_returns_the_serial() {
    let server = Server::start(
        MemTarget::new(DISK_BYTES),
        VhostOptions {
            serial: "vol-0123".into(),
            ..VhostOptions::default()
        },
    );
    let mut g = server.guest(Setup::default());
    let h = g.header(T_GET_ID, 0);
    let id = g.data(20, 1, true);
    let s = g.status();
    g.submit(0, &[vec![h, id[0], s]]);
    let used = g.wait_used(0, 1);
    assert_eq!(g.status_of(&s), S_OK);
    assert_eq!(used[0].1, 21);
    let mut want = b"vol-0123".to_vec();
    want.resize(20, 0);
    assert_eq!(g.read_mem(id[0].addr, 20), want);
}

#[test]
fn out_of_range_and_unaligned_io_fail() {
    let server = mem_server();
    let mut g = server.guest(Setup::default());
    let end = DISK_BYTES as u64 / 512;
    assert_eq!(g.read(0, end, 4096, 1).0, S_IOERR);
    assert_eq!(g.read(0, end - SECTORS_PER_BLOCK, 8192, 1).0, S_IOERR);
    assert_eq!(g.read(0, u64::MAX / 512, 4096, 1).0, S_IOERR);
    assert_eq!(g.write(0, u64::MAX - 7, &[1; 4096], 1), S_IOERR);
    assert_eq!(
        g.read(0, 1, 4096, 1).0,
        S_IOERR,
        "sector not on a 4 KiB block"
    );
    assert_eq!(
        g.read(0, 0, 512, 1).0,
        S_IOERR,
        "512 bytes on a 4 KiB device"
    );
    // The last block is fine.
    assert_eq!(g.read(0, end - SECTORS_PER_BLOCK, 4096, 1).0, S_OK);
    assert_eq!(server.target.stats().reads, 1);
}

#[test]
fn garbage_chains_do_not_stop_the_queue() {
    let server = mem_server();
    let mut g = server.guest(Setup::default());
    let good = pattern(8, 4096);
    assert_eq!(g.write(0, 0, &good, 1), S_OK);

    // 1. A read whose data is readable (wrong direction): IOERR.
    let h = g.header(T_IN, 0);
    let d = g.data(4096, 1, false);
    let s1 = g.status();
    // 2. A write of 100 bytes (not a block multiple): IOERR.
    let h2 = g.header(T_OUT, 0);
    let d2 = g.data(100, 1, false);
    let s2 = g.status();
    // 3. An unknown type: UNSUPP.
    let h3 = g.header(99, 0);
    let s3 = g.status();
    g.submit(0, &[vec![h, d[0], s1], vec![h2, d2[0], s2], vec![h3, s3]]);
    g.wait_used(0, 3);
    assert_eq!(g.status_of(&s1), S_IOERR);
    assert_eq!(g.status_of(&s2), S_IOERR);
    assert_eq!(g.status_of(&s3), S_UNSUPP);

    // 4. A loop: 120 -> 121 -> 120. 5. No status: the last descriptor is
    // readable. 6. A head past the table's end. 7. A descriptor outside guest
    // memory.
    let h4 = g.header(T_IN, 0);
    g.raw_descriptor(0, 120, h4.addr, 16, NEXT, 121);
    g.raw_descriptor(0, 121, h4.addr, 16, NEXT | WRITE, 120);
    let h5 = g.header(T_FLUSH, 0);
    g.raw_descriptor(0, 122, h5.addr, 16, NEXT, 123);
    g.raw_descriptor(0, 123, h5.addr, 1, 0, 0);
    let h7 = g.header(T_IN, 0);
    let s7 = g.status();
    g.raw_descriptor(0, 124, h7.addr, 16, NEXT, 125);
    g.raw_descriptor(0, 125, 1 << 50, 4096, NEXT | WRITE, 126);
    g.raw_descriptor(0, 126, s7.addr, 1, WRITE, 0);
    for head in [120, 122, 500, 124] {
        g.publish(0, head);
    }
    g.kick(0);
    // The out-of-table head cannot be returned; the other three are.
    let used = g.wait_used(0, 3);
    let heads: Vec<u16> = used.iter().map(|u| u.0).collect();
    assert_eq!(heads, vec![120, 122, 124]);
    assert_eq!(used[0].1, 0, "a looping chain is returned without a status");
    assert_eq!(
        used[1].1, 0,
        "a chain without a status byte is returned untouched"
    );
    assert_eq!(used[2].1, 1, "only the status byte was written");
    assert_eq!(g.status_of(&s7), S_IOERR);
    g.reset_buffers();

    // And the queue still serves.
    assert_eq!(g.read(0, 0, 4096, 1), (S_OK, good));
    assert!(g.quiet(0, Duration::from_millis(50)));
}

/// The target finishes requests out of order; the used ring still gets them in
/// the order the guest made them, so its used index counts exactly the requests
/// finished before the first unfinished one (what QEMU rewinds to when Shale
/// dies).
#[test]
fn out_of_order_completions_reach_the_used_ring_in_order() {
    let server = Server::start(
        MemTarget::new(DISK_BYTES).with_delays(Duration::from_millis(20), 42),
        VhostOptions {
            num_queues: 2,
            ..VhostOptions::default()
        },
    );
    let mut g = server.guest(Setup {
        queues: 2,
        ..Setup::default()
    });
    let n = 24u64;
    let mut statuses = Vec::new();
    for q in 0..2usize {
        let mut chains = Vec::new();
        for i in 0..n {
            let sector = (q as u64 * n + i) * 16;
            let h = g.header(T_OUT, sector);
            let d = g.data(8192, 2, false);
            let bytes = pattern(sector, 8192);
            g.write_mem(d[0].addr, &bytes[..4096]);
            g.write_mem(d[1].addr, &bytes[4096..]);
            let s = g.status();
            statuses.push(s);
            chains.push(vec![h, d[0], d[1], s]);
        }
        g.submit(q, &chains);
    }
    for q in 0..2usize {
        let used: Vec<u16> = g.wait_used(q, n as usize).iter().map(|u| u.0).collect();
        assert!(
            used.windows(2).all(|w| w[0] < w[1]),
            "queue {q}: the used ring is not in submission order: {used:?}"
        );
    }
    for s in &statuses {
        assert_eq!(g.status_of(s), S_OK);
    }
    let done = server.target.write_order();
    assert_eq!(done.len(), 2 * n as usize);
    assert!(
        done.windows(2).any(|w| w[0] > w[1]),
        "the target finished the writes in submission order, so nothing was tested: {done:?}"
    );
    g.reset_buffers();
    // Read everything back, many in flight again, through both queues.
    for q in 0..2usize {
        for i in 0..n {
            let sector = (q as u64 * n + i) * 16;
            let (st, back) = g.read(1 - q, sector, 8192, 1);
            assert_eq!(st, S_OK);
            assert_eq!(back, pattern(sector, 8192), "sector {sector}");
        }
    }
}

#[test]
fn config_space_and_features() {
    let server = Server::start(
        MemTarget::new(DISK_BYTES + 1000),
        VhostOptions {
            num_queues: 3,
            ..VhostOptions::default()
        },
    );
    let mut g = server.guest(Setup {
        queues: 3,
        ..Setup::default()
    });
    use vhost::vhost_user::VhostUserFrontend;
    assert_eq!(g.frontend.get_queue_num().expect("queue num"), 3);
    let c = g.config(0, 60);
    let u32_at = |at: usize| u32::from_le_bytes(c[at..at + 4].try_into().expect("4"));
    let capacity = u64::from_le_bytes(c[0..8].try_into().expect("8"));
    assert_eq!(capacity, DISK_BYTES as u64 / 512, "whole blocks only");
    assert_eq!(u32_at(8), 128 << 10, "size_max");
    assert_eq!(u32_at(12), 126, "seg_max");
    assert_eq!(u32_at(20), 4096, "blk_size");
    assert_eq!(c[24], 0, "physical_block_exp");
    assert_eq!(u16::from_le_bytes([c[26], c[27]]), 1, "min_io_size");
    assert_eq!(c[32], 1, "writeback");
    assert_eq!(u16::from_le_bytes([c[34], c[35]]), 3, "num_queues");
    assert_eq!(u32_at(36), 1 << 21, "max_discard_sectors");
    assert_eq!(u32_at(40), 1, "max_discard_seg");
    assert_eq!(u32_at(44), 8, "discard_sector_alignment");
    assert_eq!(u32_at(48), 1 << 21, "max_write_zeroes_sectors");
    assert_eq!(u32_at(52), 1, "max_write_zeroes_seg");
    assert_eq!(c[56], 1, "write_zeroes_may_unmap");
    // A window in the middle, and past what the device fills.
    assert_eq!(g.config(20, 4), 4096u32.to_le_bytes().to_vec());
    assert_eq!(g.config(200, 8), vec![0; 8]);
    assert_eq!(g.features & VIRTIO_BLK_F_RO, 0);
    // Every queue serves.
    for q in 0..3 {
        assert_eq!(g.write(q, q as u64 * 8, &pattern(q as u64, 4096), 1), S_OK);
    }
}

#[test]
fn read_only_target() {
    let mut bytes = vec![0u8; 1 << 20];
    bytes[..4096].copy_from_slice(&pattern(9, 4096));
    let server = Server::start(MemTarget::read_only(bytes), VhostOptions::default());
    let mut g = server.guest(Setup::default());
    assert_ne!(g.features & VIRTIO_BLK_F_RO, 0);
    assert_eq!(g.features & VIRTIO_BLK_F_DISCARD, 0);
    assert_eq!(g.read(0, 0, 4096, 1), (S_OK, pattern(9, 4096)));
    assert_eq!(g.write(0, 0, &[1; 4096], 1), S_IOERR);
    assert_eq!(g.simple(0, T_DISCARD, Some((0, 8, 0))), S_UNSUPP);
    assert_eq!(g.simple(0, T_FLUSH, None), S_OK);
}

#[test]
fn without_event_idx() {
    let server = mem_server();
    let mut g = server.guest(Setup {
        event_idx: false,
        ..Setup::default()
    });
    for i in 0..40u64 {
        assert_eq!(g.write(0, i * 8, &pattern(i, 4096), 1), S_OK);
    }
    for i in 0..40u64 {
        assert_eq!(g.read(0, i * 8, 4096, 1), (S_OK, pattern(i, 4096)));
    }
}

#[test]
fn ring_wraps_and_fills() {
    // More requests than the ring holds, in several rounds, so the indices wrap
    // and the ring is full at times.
    let server = Server::start(
        MemTarget::new(DISK_BYTES).with_delays(Duration::from_millis(2), 7),
        VhostOptions::default(),
    );
    let mut g = server.guest(Setup {
        queue_size: 16,
        ..Setup::default()
    });
    for round in 0..6u64 {
        let mut chains = Vec::new();
        for i in 0..5u64 {
            let sector = (round * 5 + i) * 8;
            let h = g.header(T_OUT, sector);
            let d = g.data(4096, 1, false);
            g.write_mem(d[0].addr, &pattern(sector, 4096));
            let s = g.status();
            chains.push(vec![h, d[0], s]);
        }
        g.submit(0, &chains);
        g.wait_used(0, 5);
        g.reset_buffers();
    }
    for k in 0..30u64 {
        assert_eq!(g.read(0, k * 8, 4096, 1), (S_OK, pattern(k * 8, 4096)));
    }
}

#[test]
fn reconnect_keeps_the_data() {
    let server = mem_server();
    let data = pattern(10, 256 << 10);
    {
        let mut g = server.guest(Setup::default());
        assert_eq!(g.write(0, 512, &data, 4), S_OK);
        // Dropped: the frontend closes the socket, as a VM that quits.
    }
    let mut g = server.guest(Setup::default());
    assert_eq!(g.read(0, 512, 256 << 10, 4), (S_OK, data.clone()));
    drop(g);
    // A frontend that vanishes with requests still at the target.
    let slow = Server::start(
        MemTarget::new(DISK_BYTES).with_delays(Duration::from_millis(50), 3),
        VhostOptions::default(),
    );
    {
        let mut g = slow.guest(Setup::default());
        let chains: Vec<Vec<Buf>> = (0..8u64)
            .map(|i| {
                let h = g.header(T_OUT, i * 8);
                let d = g.data(4096, 1, false);
                g.write_mem(d[0].addr, &pattern(100 + i, 4096));
                let s = g.status();
                vec![h, d[0], s]
            })
            .collect();
        g.submit(0, &chains);
    }
    let mut g = slow.guest(Setup::default());
    assert_eq!(g.write(0, 0, &pattern(200, 4096), 1), S_OK);
    assert_eq!(g.read(0, 0, 4096, 1), (S_OK, pattern(200, 4096)));
    let handle = slow.handle.as_ref().expect("running");
    assert_eq!(handle.connections(), 2);
    assert_eq!(handle.outstanding(), 0);
}

#[test]
fn stop_cuts_a_live_connection() {
    let mut server = mem_server();
    let mut g = server.guest(Setup::default());
    assert_eq!(g.write(0, 0, &pattern(11, 4096), 1), S_OK);
    let stopper = server.handle.as_ref().expect("running").stopper();
    let t = std::thread::spawn(move || stopper.stop());
    t.join().expect("stop thread");
    server.stop();
    assert!(!server.socket.exists(), "the socket is removed");
    drop(g);
}

#[test]
fn stop_while_idle_and_socket_rules() {
    let mut server = mem_server();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&server.socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "only the owner reaches the socket");
    // A second server on a live socket is refused.
    let again = serve(
        Arc::new(MemTarget::new(1 << 20)),
        &server.socket,
        VhostOptions::default(),
    );
    assert!(again.is_err());
    server.stop();
    // A regular file in the way is refused, not removed.
    std::fs::write(&server.socket, b"x").expect("file");
    let r = serve(
        Arc::new(MemTarget::new(1 << 20)),
        &server.socket,
        VhostOptions::default(),
    );
    assert!(r.is_err());
    assert!(server.socket.exists());
}

#[test]
fn in_flight_bound_pauses_and_resumes_popping() {
    let server = Server::start(
        MemTarget::new(DISK_BYTES).with_delays(Duration::from_millis(5), 11),
        VhostOptions {
            queue_inflight_max: 2,
            queue_inflight_bytes_max: 8192,
            ..VhostOptions::default()
        },
    );
    let mut g = server.guest(Setup::default());
    let chains: Vec<Vec<Buf>> = (0..20u64)
        .map(|i| {
            let h = g.header(T_OUT, i * 8);
            let d = g.data(4096, 1, false);
            g.write_mem(d[0].addr, &pattern(300 + i, 4096));
            let s = g.status();
            vec![h, d[0], s]
        })
        .collect();
    g.submit(0, &chains);
    assert_eq!(g.wait_used(0, 20).len(), 20);
    g.reset_buffers();
    for i in 0..20u64 {
        assert_eq!(g.read(0, i * 8, 4096, 1), (S_OK, pattern(300 + i, 4096)));
    }
}

#[test]
fn get_vring_base_waits_for_requests_in_flight() {
    let server = Server::start(
        MemTarget::new(DISK_BYTES).with_delays(Duration::from_millis(30), 5),
        VhostOptions::default(),
    );
    let mut g = server.guest(Setup::default());
    let chains: Vec<Vec<Buf>> = (0..10u64)
        .map(|i| {
            let h = g.header(T_OUT, i * 8);
            let d = g.data(4096, 1, false);
            let s = g.status();
            vec![h, d[0], s]
        })
        .collect();
    g.submit(0, &chains);
    // Give the queue's thread a moment to pop them, then stop the ring: the
    // answer must come after every popped chain is in the used ring.
    std::thread::sleep(Duration::from_millis(5));
    use vhost::VhostBackend;
    let base = g.frontend.get_vring_base(0).expect("get_vring_base");
    let used = g.read_mem(0x8000 + 2, 2);
    let used_idx = u16::from_le_bytes([used[0], used[1]]);
    assert_eq!(u32::from(used_idx), base, "everything popped was completed");
    assert_eq!(base, 10);
}
