//! A small vhost-user frontend and virtio-blk driver for the tests: it plays
//! QEMU (feature negotiation, the memory table, vring set-up over the socket)
//! and the guest's driver (split virtqueues in memfd-backed guest memory,
//! kicks, the used ring, EVENT_IDX's `used_event`).

#![allow(dead_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub const NEXT: u16 = 1;
pub const WRITE: u16 = 2;

pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const T_FLUSH: u32 = 4;
pub const T_GET_ID: u32 = 8;
pub const T_DISCARD: u32 = 11;
pub const T_WRITE_ZEROES: u32 = 13;

pub const S_OK: u8 = 0;
pub const S_IOERR: u8 = 1;
pub const S_UNSUPP: u8 = 2;

pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
pub const VIRTIO_BLK_F_DISCARD: u64 = 1 << 13;
pub const VIRTIO_BLK_F_WRITE_ZEROES: u64 = 1 << 14;
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;
pub const VIRTIO_BLK_F_CONFIG_WCE: u64 = 1 << 11;

/// Guest memory: one memfd region at address 0.
pub const GUEST_BYTES: usize = 48 << 20;
/// Per queue: descriptor table, avail ring, used ring in a 64 KiB window.
const RING_WINDOW: u64 = 0x1_0000;
/// Request buffers live above this.
const BUFFERS_AT: u64 = 0x10_0000;

pub fn init_tracing() {}

/// One guest buffer of a request: where it is, how long, device-writable or not.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

pub struct GuestQueue {
    pub size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    kick: EventFd,
    call: EventFd,
    epoll: Epoll,
    avail_idx: u16,
    used_seen: u16,
    free: Vec<u16>,
    /// Descriptors of each chain in flight, by head.
    chains: Vec<Vec<u16>>,
    /// Times the backend signalled this queue.
    pub signals: u64,
}

impl GuestQueue {
    /// Sets up queue `q` (size `size`) in its window of guest memory.
    fn start(frontend: &mut Frontend, q: u16, size: u16, host_base: u64) -> GuestQueue {
        let base = u64::from(q) * RING_WINDOW;
        let (desc, avail, used) = (base, base + 0x4000, base + 0x8000);
        let i = usize::from(q);
        frontend.set_vring_num(i, size).expect("set_vring_num");
        frontend
            .set_vring_addr(
                i,
                &VringConfigData {
                    queue_max_size: size,
                    queue_size: size,
                    flags: 0,
                    desc_table_addr: host_base + desc,
                    used_ring_addr: host_base + used,
                    avail_ring_addr: host_base + avail,
                    log_addr: None,
                },
            )
            .expect("set_vring_addr");
        frontend.set_vring_base(i, 0).expect("set_vring_base");
        let kick = EventFd::new(EFD_NONBLOCK).expect("kick");
        let call = EventFd::new(EFD_NONBLOCK).expect("call");
        frontend.set_vring_call(i, &call).expect("set_vring_call");
        frontend.set_vring_kick(i, &kick).expect("set_vring_kick");
        frontend
            .set_vring_enable(i, true)
            .expect("set_vring_enable");
        let epoll = Epoll::new().expect("epoll");
        epoll
            .ctl(
                ControlOperation::Add,
                call.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )
            .expect("epoll add");
        GuestQueue {
            size,
            desc,
            avail,
            used,
            kick,
            call,
            epoll,
            avail_idx: 0,
            used_seen: 0,
            free: (0..size).rev().collect(),
            chains: vec![Vec::new(); usize::from(size)],
            signals: 0,
        }
    }
}

pub struct Guest {
    pub mem: GuestMemoryMmap<()>,
    _file: File,
    pub frontend: Frontend,
    pub queues: Vec<GuestQueue>,
    pub features: u64,
    next_buf: u64,
}

/// Negotiation choices.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub queues: u16,
    pub queue_size: u16,
    pub event_idx: bool,
    /// Feature bits to turn off before acking.
    pub mask_off: u64,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            queues: 1,
            queue_size: 128,
            event_idx: true,
            mask_off: 0,
        }
    }
}

fn memfd(bytes: usize) -> File {
    let fd = rustix::fs::memfd_create("shale-vhost-guest", rustix::fs::MemfdFlags::CLOEXEC)
        .expect("memfd_create");
    let f = File::from(fd);
    f.set_len(bytes as u64).expect("memfd size");
    f
}

impl Guest {
    /// Connects to `socket` and brings the device up the way QEMU does.
    pub fn connect(socket: &Path, setup: Setup) -> Guest {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut frontend = loop {
            match Frontend::connect(socket, u64::from(setup.queues)) {
                Ok(f) => break f,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("connect {}: {e}", socket.display()),
            }
        };
        // Ask for an acknowledgement of every message (REPLY_ACK), as QEMU does,
        // so a refused message is an error here.
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let file = memfd(GUEST_BYTES);
        let dup = file.try_clone().expect("dup memfd");
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            GUEST_BYTES,
            Some(FileOffset::new(dup, 0)),
        )])
        .expect("guest memory");
        let host_base = mem.get_host_address(GuestAddress(0)).expect("host address") as u64;

        frontend.set_owner().expect("set_owner");
        let offered = frontend.get_features().expect("get_features");
        let mut features = offered & !setup.mask_off;
        if !setup.event_idx {
            features &= !VIRTIO_RING_F_EVENT_IDX;
        }
        frontend.set_features(features).expect("set_features");
        let proto = frontend
            .get_protocol_features()
            .expect("get_protocol_features");
        assert!(proto.contains(VhostUserProtocolFeatures::CONFIG));
        assert!(proto.contains(VhostUserProtocolFeatures::MQ));
        frontend
            .set_protocol_features(
                proto
                    & (VhostUserProtocolFeatures::CONFIG
                        | VhostUserProtocolFeatures::MQ
                        | VhostUserProtocolFeatures::REPLY_ACK
                        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS),
            )
            .expect("set_protocol_features");
        let region = mem.find_region(GuestAddress(0)).expect("region");
        let fd = region
            .file_offset()
            .expect("file offset")
            .file()
            .as_raw_fd();
        let regions = [VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: region.len(),
            userspace_addr: host_base,
            mmap_offset: 0,
            mmap_handle: fd,
        }];
        frontend.set_mem_table(&regions).expect("set_mem_table");

        let queues = (0..setup.queues)
            .map(|q| GuestQueue::start(&mut frontend, q, setup.queue_size, host_base))
            .collect();
        Guest {
            mem,
            _file: file,
            frontend,
            queues,
            features,
            next_buf: BUFFERS_AT,
        }
    }

    /// The config space bytes `offset..offset + size`.
    pub fn config(&mut self, offset: u32, size: u32) -> Vec<u8> {
        let buf = vec![0u8; size as usize];
        let (_, data) = self
            .frontend
            .get_config(offset, size, VhostUserConfigFlags::WRITABLE, &buf)
            .expect("get_config");
        data
    }

    /// A fresh buffer of `len` bytes (released by `reset_buffers`).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let at = self.next_buf;
        self.next_buf = (at + len + 4095) & !4095;
        assert!(
            self.next_buf <= GUEST_BYTES as u64,
            "guest buffers exhausted"
        );
        at
    }

    pub fn reset_buffers(&mut self) {
        self.next_buf = BUFFERS_AT;
    }

    pub fn write_mem(&self, addr: u64, data: &[u8]) {
        self.mem
            .write_slice(data, GuestAddress(addr))
            .expect("guest write");
    }

    pub fn read_mem(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(&mut v, GuestAddress(addr))
            .expect("guest read");
        v
    }

    /// A header buffer for `kind` at `sector`.
    pub fn header(&mut self, kind: u32, sector: u64) -> Buf {
        let at = self.alloc(16);
        let mut h = kind.to_le_bytes().to_vec();
        h.extend_from_slice(&[0; 4]);
        h.extend_from_slice(&sector.to_le_bytes());
        self.write_mem(at, &h);
        Buf {
            addr: at,
            len: 16,
            write: false,
        }
    }

    /// A status buffer preset to 0xff (so an untouched status is visible).
    pub fn status(&mut self) -> Buf {
        let at = self.alloc(1);
        self.write_mem(at, &[0xff]);
        Buf {
            addr: at,
            len: 1,
            write: true,
        }
    }

    /// Places raw descriptors (addr, len, flags, next) in free table slots
    /// chosen by the caller's indices: for malformed chains. Returns nothing;
    /// publish the head with `publish`.
    pub fn raw_descriptor(
        &mut self,
        q: usize,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let qu = &mut self.queues[q];
        qu.free.retain(|&i| i != index);
        let at = qu.desc + u64::from(index) * 16;
        let mut d = addr.to_le_bytes().to_vec();
        d.extend_from_slice(&len.to_le_bytes());
        d.extend_from_slice(&flags.to_le_bytes());
        d.extend_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&d, GuestAddress(at))
            .expect("descriptor");
        self.queues[q].chains[usize::from(index)].push(index);
    }

    /// Writes a chain of `bufs` into free descriptors and returns its head.
    pub fn chain(&mut self, q: usize, bufs: &[Buf]) -> u16 {
        let n = bufs.len();
        let qu = &mut self.queues[q];
        assert!(qu.free.len() >= n, "queue {q} out of descriptors");
        let idx: Vec<u16> = (0..n).map(|_| qu.free.pop().expect("free")).collect();
        for (k, b) in bufs.iter().enumerate() {
            let mut flags = if b.write { WRITE } else { 0 };
            let next = if k + 1 < n {
                flags |= NEXT;
                idx[k + 1]
            } else {
                0
            };
            let at = qu.desc + u64::from(idx[k]) * 16;
            let mut d = b.addr.to_le_bytes().to_vec();
            d.extend_from_slice(&b.len.to_le_bytes());
            d.extend_from_slice(&flags.to_le_bytes());
            d.extend_from_slice(&next.to_le_bytes());
            self.mem
                .write_slice(&d, GuestAddress(at))
                .expect("descriptor");
        }
        let head = idx[0];
        self.queues[q].chains[usize::from(head)] = idx;
        head
    }

    /// Puts `head` in the avail ring (not kicked yet).
    pub fn publish(&mut self, q: usize, head: u16) {
        let qu = &mut self.queues[q];
        let slot = qu.avail + 4 + 2 * u64::from(qu.avail_idx % qu.size);
        self.mem
            .write_slice(&head.to_le_bytes(), GuestAddress(slot))
            .expect("avail slot");
        qu.avail_idx = qu.avail_idx.wrapping_add(1);
        let idx = qu.avail_idx;
        self.mem
            .write_slice(&idx.to_le_bytes(), GuestAddress(qu.avail + 2))
            .expect("avail idx");
    }

    pub fn kick(&self, q: usize) {
        self.queues[q].kick.write(1).expect("kick");
    }

    /// Chains, published and kicked; returns the heads.
    pub fn submit(&mut self, q: usize, chains: &[Vec<Buf>]) -> Vec<u16> {
        let heads: Vec<u16> = chains
            .iter()
            .map(|c| {
                let h = self.chain(q, c);
                self.publish(q, h);
                h
            })
            .collect();
        self.kick(q);
        heads
    }

    /// Waits for `n` more used entries on `q` (signalled through the call
    /// eventfd); returns them as (head, len) and frees their descriptors.
    pub fn wait_used(&mut self, q: usize, n: usize) -> Vec<(u16, u32)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut out = Vec::new();
        loop {
            let (used_idx, size, used_addr) = {
                let qu = &self.queues[q];
                let mut b = [0u8; 2];
                self.mem
                    .read_slice(&mut b, GuestAddress(qu.used + 2))
                    .expect("used idx");
                (u16::from_le_bytes(b), qu.size, qu.used)
            };
            while self.queues[q].used_seen != used_idx && out.len() < n {
                let slot = used_addr + 4 + 8 * u64::from(self.queues[q].used_seen % size);
                let mut e = [0u8; 8];
                self.mem
                    .read_slice(&mut e, GuestAddress(slot))
                    .expect("used elem");
                let id = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as u16;
                let len = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
                out.push((id, len));
                let qu = &mut self.queues[q];
                qu.used_seen = qu.used_seen.wrapping_add(1);
                let chain = std::mem::take(&mut qu.chains[usize::from(id)]);
                qu.free.extend(chain);
            }
            // EVENT_IDX: ask to be signalled at the next used entry.
            let (avail, size, seen) = {
                let qu = &self.queues[q];
                (qu.avail, qu.size, qu.used_seen)
            };
            self.mem
                .write_slice(
                    &seen.to_le_bytes(),
                    GuestAddress(avail + 4 + 2 * u64::from(size)),
                )
                .expect("used_event");
            if out.len() >= n {
                // A signal that came before we looked is still in the eventfd.
                let qu = &mut self.queues[q];
                if qu.call.read().is_ok() {
                    qu.signals += 1;
                }
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "queue {q}: {} of {n} used entries after 20 s",
                out.len()
            );
            let qu = &mut self.queues[q];
            let mut ev = [EpollEvent::default(); 1];
            if qu.epoll.wait(100, &mut ev).unwrap_or(0) > 0 && qu.call.read().is_ok() {
                qu.signals += 1;
            }
        }
    }

    /// True if nothing more arrives on the used ring within `wait`.
    pub fn quiet(&mut self, q: usize, wait: Duration) -> bool {
        std::thread::sleep(wait);
        let qu = &self.queues[q];
        let mut b = [0u8; 2];
        self.mem
            .read_slice(&mut b, GuestAddress(qu.used + 2))
            .expect("used idx");
        u16::from_le_bytes(b) == qu.used_seen
    }

    pub fn status_of(&self, b: &Buf) -> u8 {
        self.read_mem(b.addr, 1)[0]
    }

    /// Data buffers of `len` bytes split in `pieces`, device-writable or not.
    pub fn data(&mut self, len: u32, pieces: u32, write: bool) -> Vec<Buf> {
        let each = len / pieces;
        (0..pieces)
            .map(|i| {
                let l = if i + 1 == pieces {
                    len - each * i
                } else {
                    each
                };
                // A gap between pieces, so they are really separate.
                let at = self.alloc(u64::from(l) + 4096);
                Buf {
                    addr: at,
                    len: l,
                    write,
                }
            })
            .collect()
    }

    /// Reads `len` bytes at `sector` through queue `q`; (status, data).
    pub fn read(&mut self, q: usize, sector: u64, len: u32, pieces: u32) -> (u8, Vec<u8>) {
        let h = self.header(T_IN, sector);
        let data = self.data(len, pieces, true);
        let s = self.status();
        let mut c = vec![h];
        c.extend(data.iter().copied());
        c.push(s);
        self.submit(q, &[c]);
        let used = self.wait_used(q, 1);
        let st = self.status_of(&s);
        if st == S_OK {
            assert_eq!(used[0].1, len + 1, "used length of a read");
        }
        let mut out = Vec::new();
        for b in &data {
            out.extend(self.read_mem(b.addr, b.len as usize));
        }
        self.reset_buffers();
        (st, out)
    }

    /// Writes `bytes` at `sector` through queue `q`; the status.
    pub fn write(&mut self, q: usize, sector: u64, bytes: &[u8], pieces: u32) -> u8 {
        let h = self.header(T_OUT, sector);
        let data = self.data(bytes.len() as u32, pieces, false);
        let mut at = 0usize;
        for b in &data {
            self.write_mem(b.addr, &bytes[at..at + b.len as usize]);
            at += b.len as usize;
        }
        let s = self.status();
        let mut c = vec![h];
        c.extend(data.iter().copied());
        c.push(s);
        self.submit(q, &[c]);
        self.wait_used(q, 1);
        let st = self.status_of(&s);
        self.reset_buffers();
        st
    }

    /// A request without data (flush) or with a discard/write-zeroes segment.
    pub fn simple(&mut self, q: usize, kind: u32, segment: Option<(u64, u32, u32)>) -> u8 {
        let mut h = self.header(kind, 0);
        if let Some((sector, sectors, flags)) = segment {
            // Header and segment in one buffer, as Linux does it in two; both work.
            let at = self.alloc(32);
            let mut b = kind.to_le_bytes().to_vec();
            b.extend_from_slice(&[0; 12]);
            b.extend_from_slice(&sector.to_le_bytes());
            b.extend_from_slice(&sectors.to_le_bytes());
            b.extend_from_slice(&flags.to_le_bytes());
            self.write_mem(at, &b);
            h = Buf {
                addr: at,
                len: 32,
                write: false,
            };
        }
        let s = self.status();
        self.submit(q, &[vec![h, s]]);
        self.wait_used(q, 1);
        let st = self.status_of(&s);
        self.reset_buffers();
        st
    }
}

/// Deterministic test bytes (the suite's shared generator).
pub use shale_testkit::pattern;
