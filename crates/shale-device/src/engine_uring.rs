//! The io_uring engine: how bytes move to a file or block device when the kernel
//! offers io_uring.
//!
//! `push` turns a validated request into an SQE whose buffer is owned by a slab
//! slot (keyed by the SQE's user_data) until its CQE is reaped, so the kernel never
//! writes into memory safe code can reach. SQEs are handed to the kernel in `poll`
//! (or when the submission queue fills), and `poll` reaps CQEs.
//!
//! Invariants:
//! - At most `entries` requests are in the kernel or its submission queue at once
//!   (the rest wait in a backlog), so neither the submission queue nor the
//!   completion queue (twice the size) can overflow.
//! - A slot is freed only when its CQE has been reaped; dropping the engine waits
//!   for every request still in the kernel (and leaks their buffers if it cannot).
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};

use crate::engine_psync::{discard_block_device, finish_write, FileKind, Job};
use crate::{DeviceError, IoBuf, IoCompletion, IoOpKind};

#[derive(Debug)]
struct Slot {
    tag: u64,
    op: IoOpKind,
    offset: u64,
    /// Bytes a read or write must move; 0 for flush and discard.
    expect_bytes: u64,
    /// A discard's length (for the synchronous fallback on a block device).
    discard_len: u64,
    buf: Option<IoBuf>,
}

/// `BLOCK_URING_CMD_DISCARD` (`_IO(0x12, 0)`, linux/blkdev.h, Linux 6.12): an
/// asynchronous BLKDISCARD through `IORING_OP_URING_CMD`, with the start in `addr`
/// and the length in `addr3`.
const BLOCK_URING_CMD_DISCARD: u32 = 0x12 << 8;

pub(crate) struct UringEngine {
    ring: IoUring,
    fd: RawFd,
    kind: FileKind,
    entries: usize,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Requests waiting for room in the kernel, in submission order.
    backlog: VecDeque<Job>,
    /// Requests in the kernel (pushed to the SQ, CQE not yet reaped).
    in_kernel: usize,
    /// Completions produced without the kernel's ring (block-device discard on a
    /// kernel without `BLOCK_URING_CMD_DISCARD`).
    done: VecDeque<IoCompletion>,
    /// Block-device discards go through the ring until the kernel refuses the command.
    block_discard_cmd: bool,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("entries", &self.entries)
            .field("in_kernel", &self.in_kernel)
            .field("backlog", &self.backlog.len())
            .finish()
    }
}

impl UringEngine {
    /// Sets up a ring of `entries` (rounded up to a power of two by the kernel).
    /// `fd` must stay open for the engine's lifetime (the owning device holds it).
    pub(crate) fn new(fd: RawFd, kind: FileKind, entries: u32) -> io::Result<UringEngine> {
        let entries = entries.clamp(1, 4096).next_power_of_two();
        // Completions of work the kernel ran in its workers (buffered files) are posted
        // by task work in the submitting thread. By default the kernel interrupts that
        // thread for it (an IPI each, costly in a VM); cooperatively, it only raises a
        // flag, and `poll` enters the kernel when it sees it. Kernels before 5.19 lack
        // both flags: plain ring there.
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)
            .or_else(|_| IoUring::builder().setup_cqsize(entries * 2).build(entries))?;
        Ok(UringEngine {
            ring,
            fd,
            kind,
            entries: entries as usize,
            slots: Vec::with_capacity(entries as usize),
            free: Vec::new(),
            backlog: VecDeque::new(),
            in_kernel: 0,
            done: VecDeque::new(),
            block_discard_cmd: true,
        })
    }

    /// True while block-device discards go through the ring (the kernel has not
    /// refused `BLOCK_URING_CMD_DISCARD`).
    #[cfg(test)]
    pub(crate) fn discards_through_ring(&self) -> bool {
        self.block_discard_cmd
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_kernel + self.backlog.len() + self.done.len()
    }

    pub(crate) fn push(&mut self, job: Job) {
        if let (Job::Discard { tag, offset, len }, FileKind::BlockDevice, false) =
            (&job, self.kind, self.block_discard_cmd)
        {
            // The kernel has no BLOCK_URING_CMD_DISCARD: the ioctl runs here and its
            // completion waits in `done`.
            let result = discard_block_device(self.fd, *offset, *len);
            self.done.push_back(IoCompletion {
                tag: *tag,
                buf: None,
                result,
            });
            return;
        }
        // Only queued here: the kernel sees a whole batch at the next poll, one
        // system call for many requests.
        self.backlog.push_back(job);
        self.fill_sq();
    }

    /// Moves backlog jobs into the submission queue while the kernel has room.
    fn fill_sq(&mut self) {
        while self.in_kernel < self.entries {
            if self.ring.submission().is_full() {
                break;
            }
            let Some(job) = self.backlog.pop_front() else {
                break;
            };
            let slot = self.alloc();
            let fd = types::Fd(self.fd);
            let (entry, s) = match job {
                Job::Read {
                    tag,
                    offset,
                    mut buf,
                } => (
                    opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32)
                        .offset(offset)
                        .build(),
                    Slot {
                        tag,
                        op: IoOpKind::Read,
                        offset,
                        expect_bytes: buf.len() as u64,
                        discard_len: 0,
                        buf: Some(buf),
                    },
                ),
                Job::Write {
                    tag,
                    offset,
                    buf,
                    fua,
                } => (
                    opcode::Write::new(fd, buf.as_ptr(), buf.len() as u32)
                        .offset(offset)
                        .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                        .build(),
                    Slot {
                        tag,
                        op: IoOpKind::Write,
                        offset,
                        expect_bytes: buf.len() as u64,
                        discard_len: 0,
                        buf: Some(buf),
                    },
                ),
                Job::Flush { tag } => (
                    opcode::Fsync::new(fd)
                        .flags(types::FsyncFlags::DATASYNC)
                        .build(),
                    Slot {
                        tag,
                        op: IoOpKind::Flush,
                        offset: 0,
                        expect_bytes: 0,
                        discard_len: 0,
                        buf: None,
                    },
                ),
                Job::Discard { tag, offset, len } => (
                    match self.kind {
                        FileKind::Regular => opcode::Fallocate::new(fd, len)
                            .offset(offset)
                            .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                            .build(),
                        FileKind::BlockDevice => {
                            #[allow(
                                clippy::host_endian_bytes,
                                reason = "a kernel ABI field: the SQE's addr3, a native u64"
                            )]
                            let len_bytes = len.to_ne_bytes();
                            let mut cmd = [0u8; 16];
                            cmd[..8].copy_from_slice(&len_bytes);
                            opcode::UringCmd16::new(fd, BLOCK_URING_CMD_DISCARD)
                                .addr(Some(offset))
                                .cmd(cmd)
                                .build()
                        }
                    },
                    Slot {
                        tag,
                        op: IoOpKind::Discard,
                        offset,
                        expect_bytes: 0,
                        discard_len: len,
                        buf: None,
                    },
                ),
            };
            let entry = entry.user_data(slot as u64);
            self.slots[slot] = Some(s);
            // SAFETY: the SQE points at the heap allocation of an IoBuf now owned by
            // `slots[slot]`, which is neither touched nor dropped until this SQE's
            // CQE is reaped (or the engine's Drop has waited for it); the fd is kept
            // open by the owning FileDevice for the engine's lifetime.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            assert!(
                pushed.is_ok(),
                "submission queue full after is_full() was false"
            );
            self.in_kernel += 1;
        }
    }

    fn alloc(&mut self) -> usize {
        match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let mut n = 0;
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let idx = cqe.user_data() as usize;
            let Some(slot) = self.slots.get_mut(idx).and_then(Option::take) else {
                panic!("io_uring returned unknown user_data {idx}");
            };
            self.free.push(idx);
            self.in_kernel -= 1;
            let res = cqe.result();
            let refused = matches!(-res, libc::EOPNOTSUPP | libc::EINVAL | libc::ENOTTY);
            let result =
                if slot.op == IoOpKind::Discard && self.kind == FileKind::BlockDevice && refused {
                    // A kernel before 6.12 (or a driver without the command): the
                    // ioctl from now on, this discard included. Its own error, if any,
                    // is the real one.
                    self.block_discard_cmd = false;
                    discard_block_device(self.fd, slot.offset, slot.discard_len)
                } else if res < 0 {
                    Err(DeviceError::Io {
                        op: slot.op,
                        offset: slot.offset,
                        source: io::Error::from_raw_os_error(-res),
                    })
                } else if slot.op == IoOpKind::Write
                    && (res as u64) < slot.expect_bytes
                    && self.kind == FileKind::Regular
                {
                    // Finished here, synchronously: rare (a filesystem filling up),
                    // and the rest's own result names the cause.
                    let done = res as usize;
                    let rest = slot.buf.as_deref().map_or(&[][..], |b| &b[done..]);
                    finish_write(self.fd, slot.offset + done as u64, rest).map_err(|source| {
                        DeviceError::Io {
                            op: slot.op,
                            offset: slot.offset,
                            source,
                        }
                    })
                } else if (res as u64) != slot.expect_bytes && slot.expect_bytes != 0 {
                    // Ranges are validated against the device size, so a short transfer
                    // means the device or file changed under us.
                    Err(DeviceError::Io {
                        op: slot.op,
                        offset: slot.offset,
                        source: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("short {}: {res} of {} bytes", slot.op, slot.expect_bytes),
                        ),
                    })
                } else {
                    Ok(())
                };
            out.push(IoCompletion {
                tag: slot.tag,
                buf: slot.buf,
                result,
            });
            n += 1;
        }
        n
    }

    pub(crate) fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let target = min_complete.min(self.in_flight());
        let mut added = self.done.len();
        out.extend(self.done.drain(..));
        loop {
            added += self.reap(out);
            self.fill_sq();
            let pending_sq = !self.ring.submission().is_empty();
            // Completions waiting in task work (`IORING_SQ_TASKRUN`): an enter runs it.
            let taskrun = self.ring.submission().taskrun();
            if added >= target && !pending_sq && !taskrun {
                return Ok(added);
            }
            let want = if added >= target {
                0
            } else {
                (target - added).min(self.in_kernel)
            };
            match self.ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The kernel is short of memory or the CQ is backed up: reap and retry.
                Err(e)
                    if e.raw_os_error() == Some(libc::EAGAIN)
                        || e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(source) => {
                    return Err(DeviceError::Io {
                        op: IoOpKind::Submit,
                        offset: 0,
                        source,
                    })
                }
            }
        }
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // The kernel may still write into buffers owned by live slots: wait for all
        // of them before the slots (and their buffers) are freed.
        let mut sink = Vec::new();
        while self.in_kernel > 0 {
            let want = self.in_kernel;
            match self.ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(_) => {
                    // Cannot tell what the kernel still holds: leak rather than free
                    // memory it might write into.
                    for s in self.slots.drain(..).flatten() {
                        std::mem::forget(s.buf);
                    }
                    return;
                }
            }
            self.reap(&mut sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// A kernel or driver that refuses `BLOCK_URING_CMD_DISCARD` (here: a regular
    /// file posing as a block device, which has no uring_cmd) sends this discard and
    /// every later one to the ioctl, whose answer is the one reported.
    #[test]
    fn a_refused_discard_command_falls_back_to_the_ioctl() {
        let file = tempfile::tempfile().expect("tempfile");
        file.set_len(1 << 20).expect("size");
        let Ok(mut e) = UringEngine::new(file.as_raw_fd(), FileKind::BlockDevice, 8) else {
            eprintln!("io_uring unavailable on this kernel: nothing to fall back from");
            return;
        };
        assert!(e.discards_through_ring());
        let mut out = Vec::new();
        for tag in [1, 2] {
            e.push(Job::Discard {
                tag,
                offset: 0,
                len: 4096,
            });
            out.clear();
            assert_eq!(e.poll(&mut out, 1).expect("poll"), 1);
            assert_eq!(out[0].tag, tag);
            // BLKDISCARD on a regular file: ENOTTY from the ioctl, not the ring's
            // refusal.
            match &out[0].result {
                Err(DeviceError::Io {
                    op: IoOpKind::Discard,
                    source,
                    ..
                }) => assert_eq!(source.raw_os_error(), Some(libc::ENOTTY), "{source}"),
                r => panic!("{r:?}"),
            }
            assert!(!e.discards_through_ring());
        }
    }
}
