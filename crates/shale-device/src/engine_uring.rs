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

use crate::engine_psync::{discard_block_device, FileKind, Job};
use crate::{DeviceError, IoBuf, IoCompletion, IoOpKind};

#[derive(Debug)]
struct Slot {
    tag: u64,
    op: IoOpKind,
    offset: u64,
    /// Bytes a read or write must move; 0 for flush and discard.
    expect_bytes: u64,
    buf: Option<IoBuf>,
}

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
    /// Completions produced without the kernel's ring (block-device discard).
    done: VecDeque<IoCompletion>,
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
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .build(entries)?;
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
        })
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_kernel + self.backlog.len() + self.done.len()
    }

    pub(crate) fn push(&mut self, job: Job) {
        if let (Job::Discard { tag, offset, len }, FileKind::BlockDevice) = (&job, self.kind) {
            // There is no io_uring opcode for BLKDISCARD on the kernels we target;
            // it runs here and its completion waits in `done`.
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
                        buf: None,
                    },
                ),
                Job::Discard { tag, offset, len } => (
                    opcode::Fallocate::new(fd, len)
                        .offset(offset)
                        .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                        .build(),
                    Slot {
                        tag,
                        op: IoOpKind::Discard,
                        offset,
                        expect_bytes: 0,
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
            let result = if res < 0 {
                Err(DeviceError::Io {
                    op: slot.op,
                    offset: slot.offset,
                    source: io::Error::from_raw_os_error(-res),
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
            if added >= target && !pending_sq {
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
