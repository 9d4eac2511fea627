//! The pread/pwrite engine: the fallback when io_uring is unavailable (old
//! kernels, seccomp-filtered containers) and a second implementation the tests
//! hold the io_uring engine against.
//!
//! `push` only queues (so submission never blocks on I/O); `poll` performs every
//! queued request in submission order and completes them.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;

use crate::{DeviceError, IoBuf, IoCompletion, IoOpKind};

/// What the path names: trims differ (hole punch vs BLKDISCARD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    BlockDevice,
}

/// A request that has passed validation, ready for an engine.
#[derive(Debug)]
pub(crate) enum Job {
    Read {
        tag: u64,
        offset: u64,
        buf: IoBuf,
    },
    Write {
        tag: u64,
        offset: u64,
        buf: IoBuf,
        fua: bool,
    },
    Flush {
        tag: u64,
    },
    Discard {
        tag: u64,
        offset: u64,
        len: u64,
    },
}

// Block-device ioctls (linux/fs.h), for the architectures whose ioctl encoding
// is the generic one (x86_64, aarch64, riscv64).
const BLKDISCARD: libc::Ioctl = 0x1277;
pub(crate) const BLKGETSIZE64: libc::Ioctl = 0x8008_1272u32 as libc::Ioctl;
pub(crate) const BLKSSZGET: libc::Ioctl = 0x1268;

fn io_err(op: IoOpKind, offset: u64, source: io::Error) -> DeviceError {
    DeviceError::Io { op, offset, source }
}

/// Trims a range of a block device.
pub(crate) fn discard_block_device(fd: RawFd, offset: u64, len: u64) -> Result<(), DeviceError> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD reads a [u64; 2] (start, length) through the pointer, which
    // points at a live local array of exactly that type.
    let rc = unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) };
    if rc < 0 {
        return Err(io_err(
            IoOpKind::Discard,
            offset,
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Writes the rest of a write the kernel cut short. A short write to a regular file
/// means the filesystem stopped partway (most often it is full); writing the rest
/// either completes it or returns the errno that says why (ENOSPC), which the short
/// count alone does not.
pub(crate) fn finish_write(fd: RawFd, offset: u64, mut rest: &[u8]) -> io::Result<()> {
    let mut at = offset;
    while !rest.is_empty() {
        let off =
            libc::off_t::try_from(at).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: pwrite reads `rest.len()` bytes from a live slice it does not keep;
        // an invalid fd or offset is reported through the return value.
        let n = unsafe { libc::pwrite(fd, rest.as_ptr().cast(), rest.len(), off) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
        }
        let n = n as usize;
        rest = &rest[n..];
        at += n as u64;
    }
    Ok(())
}

/// Deallocates a range of a regular file, keeping its size; it reads back as zeros.
pub(crate) fn punch_hole(fd: RawFd, offset: u64, len: u64) -> Result<(), DeviceError> {
    let (Ok(off), Ok(l)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io_err(
            IoOpKind::Discard,
            offset,
            io::Error::from_raw_os_error(libc::EFBIG),
        ));
    };
    // SAFETY: fallocate takes plain integers; an invalid fd or range is reported
    // through the return value.
    let rc = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            l,
        )
    };
    if rc < 0 {
        return Err(io_err(
            IoOpKind::Discard,
            offset,
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

pub(crate) fn discard(
    file: &File,
    kind: FileKind,
    offset: u64,
    len: u64,
) -> Result<(), DeviceError> {
    match kind {
        FileKind::Regular => punch_hole(file.as_raw_fd(), offset, len),
        FileKind::BlockDevice => discard_block_device(file.as_raw_fd(), offset, len),
    }
}

/// Synchronous engine over pread/pwrite/fdatasync.
#[derive(Debug, Default)]
pub(crate) struct PsyncEngine {
    queue: VecDeque<Job>,
}

impl PsyncEngine {
    pub(crate) fn new() -> PsyncEngine {
        PsyncEngine::default()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn push(&mut self, job: Job) {
        self.queue.push_back(job);
    }

    /// Performs every queued request (whatever `min_complete` is: nothing else
    /// would ever perform them).
    pub(crate) fn poll(
        &mut self,
        file: &File,
        kind: FileKind,
        out: &mut Vec<IoCompletion>,
    ) -> usize {
        let n = self.queue.len();
        while let Some(job) = self.queue.pop_front() {
            out.push(run(file, kind, job));
        }
        n
    }
}

fn run(file: &File, kind: FileKind, job: Job) -> IoCompletion {
    match job {
        Job::Read {
            tag,
            offset,
            mut buf,
        } => {
            let result = file
                .read_exact_at(&mut buf, offset)
                .map_err(|e| io_err(IoOpKind::Read, offset, e));
            IoCompletion {
                tag,
                buf: Some(buf),
                result,
            }
        }
        Job::Write {
            tag,
            offset,
            buf,
            fua,
        } => {
            let mut result = file
                .write_all_at(&buf, offset)
                .map_err(|e| io_err(IoOpKind::Write, offset, e));
            if fua && result.is_ok() {
                result = file
                    .sync_data()
                    .map_err(|e| io_err(IoOpKind::Write, offset, e));
            }
            IoCompletion {
                tag,
                buf: Some(buf),
                result,
            }
        }
        Job::Flush { tag } => IoCompletion {
            tag,
            buf: None,
            result: file.sync_data().map_err(|e| io_err(IoOpKind::Flush, 0, e)),
        },
        Job::Discard { tag, offset, len } => IoCompletion {
            tag,
            buf: None,
            result: discard(file, kind, offset, len),
        },
    }
}
