//! Files and raw block devices: where bytes live on a real machine.
//!
//! A [`FileDevice`] opens a regular file (possibly sparse) or a block device with
//! O_DIRECT and moves bytes with one of two engines: io_uring (`engine_uring.rs`)
//! or pread/pwrite (`engine_psync.rs`), chosen at open. Every request is validated
//! (alignment, bounds, length) before anything reaches the kernel.
//!
//! Geometry: a block device reports its size (BLKGETSIZE64) and logical block size
//! (BLKSSZGET); a regular file uses its length and a 4096-byte logical block,
//! which every filesystem's O_DIRECT accepts.
//!
//! If the filesystem refuses O_DIRECT, `DirectIo::Auto` falls back to buffered I/O,
//! logs a warning and says so in the device name ("... (buffered)"); durability is
//! unchanged (flush is fdatasync either way), only the page cache is involved.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::check::{check_async_io, check_geometry, check_range};
use crate::engine_psync::{self, FileKind, Job, PsyncEngine, BLKGETSIZE64, BLKSSZGET};
use crate::engine_uring::UringEngine;
use crate::{
    BlockDevice, DeviceError, DeviceInfo, IoBuf, IoCompletion, IoOp, IoOpKind, IoRequest,
    BLOCK_SIZE,
};

/// Largest single asynchronous I/O a file device accepts.
pub const FILE_MAX_IO_BYTES: u32 = 64 * 1024 * 1024;
/// Bounce buffer size of the synchronous helpers (used when a caller's buffer is
/// not aligned for O_DIRECT).
const BOUNCE_BYTES: usize = 1024 * 1024;

/// Which engine moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// io_uring if the kernel allows it, else pread/pwrite.
    #[default]
    Auto,
    /// io_uring or fail to open.
    Uring,
    /// pread/pwrite only.
    Psync,
}

/// The engine a device ended up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Uring,
    Psync,
}

/// Whether to bypass the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIo {
    /// O_DIRECT, or buffered I/O (with a warning) where the filesystem refuses it.
    #[default]
    Auto,
    /// O_DIRECT or fail to open.
    Require,
    /// Buffered I/O.
    Off,
}

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOptions {
    pub engine: EngineChoice,
    pub direct: DirectIo,
    /// Requests the io_uring engine keeps in the kernel at once (more wait in a
    /// backlog); also reported as `DeviceInfo::queue_depth`. 1..=4096.
    pub queue_depth: u32,
}

impl Default for FileOptions {
    fn default() -> FileOptions {
        FileOptions {
            engine: EngineChoice::Auto,
            direct: DirectIo::Auto,
            queue_depth: 128,
        }
    }
}

#[derive(Debug)]
enum Engine {
    Uring(Box<UringEngine>),
    Psync(PsyncEngine),
}

/// A regular file or block device as a [`BlockDevice`].
#[derive(Debug)]
pub struct FileDevice {
    info: DeviceInfo,
    // Declared before `file`: the engine (which may wait for the kernel on drop)
    // must go before the descriptor it uses is closed.
    engine: Engine,
    file: File,
    kind: FileKind,
    direct: bool,
    /// Completions of requests refused before reaching an engine.
    early: VecDeque<IoCompletion>,
    bounce: Option<IoBuf>,
}

fn open_failed(path: &Path, source: io::Error) -> DeviceError {
    DeviceError::OpenFailed {
        path: path.display().to_string(),
        source,
    }
}

fn open_file(path: &Path, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

fn ioctl_u64(file: &File, req: libc::Ioctl) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at a
    // live local u64.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), req, &mut v as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

fn ioctl_int(file: &File, req: libc::Ioctl) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points at a live
    // local c_int.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), req, &mut v as *mut libc::c_int) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

impl FileDevice {
    /// Creates (or truncates) a regular file of `size_bytes`, allocating nothing:
    /// the result is a sparse file that reads as zeros. `size_bytes` must be a
    /// non-zero multiple of 4096. A new file gets mode 0600; an existing one keeps its
    /// mode.
    pub fn create_sparse(path: impl AsRef<Path>, size_bytes: u64) -> Result<(), DeviceError> {
        let path = path.as_ref();
        check_geometry(size_bytes, BLOCK_SIZE as u32)?;
        if let Ok(m) = std::fs::metadata(path) {
            if !m.file_type().is_file() {
                return Err(open_failed(
                    path,
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "exists and is not a regular file; refusing to truncate it",
                    ),
                ));
            }
        }
        // Owner only when created: the file will hold data of every volume on it.
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| open_failed(path, e))?;
        f.set_len(size_bytes).map_err(|e| open_failed(path, e))?;
        Ok(())
    }

    /// Opens with default options (io_uring if available, O_DIRECT if supported).
    pub fn open(path: impl AsRef<Path>) -> Result<FileDevice, DeviceError> {
        FileDevice::open_with(path, &FileOptions::default())
    }

    pub fn open_with(
        path: impl AsRef<Path>,
        opts: &FileOptions,
    ) -> Result<FileDevice, DeviceError> {
        let path = path.as_ref();
        if !(1..=4096).contains(&opts.queue_depth) {
            return Err(DeviceError::InvalidGeometry {
                reason: format!("queue depth {} not in 1..=4096", opts.queue_depth),
            });
        }
        let want_direct = opts.direct != DirectIo::Off;
        let (mut file, mut direct) = match open_file(path, want_direct) {
            Ok(f) => (f, want_direct),
            Err(e)
                if want_direct
                    && opts.direct == DirectIo::Auto
                    && e.raw_os_error() == Some(libc::EINVAL) =>
            {
                (
                    open_file(path, false).map_err(|e| open_failed(path, e))?,
                    false,
                )
            }
            Err(e) => return Err(open_failed(path, e)),
        };
        let meta = file.metadata().map_err(|e| open_failed(path, e))?;
        let (kind, size_bytes, lbs) = if meta.file_type().is_block_device() {
            let size = ioctl_u64(&file, BLKGETSIZE64).map_err(|e| open_failed(path, e))?;
            let lbs = ioctl_int(&file, BLKSSZGET).map_err(|e| open_failed(path, e))?;
            (FileKind::BlockDevice, size, lbs)
        } else if meta.file_type().is_file() {
            (FileKind::Regular, meta.len(), BLOCK_SIZE as u32)
        } else {
            return Err(open_failed(
                path,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "neither a regular file nor a block device",
                ),
            ));
        };
        check_geometry(size_bytes, lbs)?;
        if direct {
            // Some filesystems accept O_DIRECT at open and refuse it at the first I/O.
            let mut probe = IoBuf::zeroed(lbs as usize);
            if let Err(e) = file.read_exact_at(&mut probe, 0) {
                if e.raw_os_error() == Some(libc::EINVAL) && opts.direct == DirectIo::Auto {
                    file = open_file(path, false).map_err(|e| open_failed(path, e))?;
                    direct = false;
                } else {
                    return Err(open_failed(path, e));
                }
            }
        }
        if !direct && want_direct {
            tracing::warn!(
                path = %path.display(),
                "O_DIRECT not supported here; using buffered I/O"
            );
        }
        let engine = match opts.engine {
            EngineChoice::Psync => Engine::Psync(PsyncEngine::new()),
            EngineChoice::Uring => Engine::Uring(Box::new(
                UringEngine::new(file.as_raw_fd(), kind, opts.queue_depth)
                    .map_err(|e| open_failed(path, e))?,
            )),
            EngineChoice::Auto => {
                match UringEngine::new(file.as_raw_fd(), kind, opts.queue_depth) {
                    Ok(u) => Engine::Uring(Box::new(u)),
                    Err(e) => {
                        tracing::warn!(
                            path = %path.display(),
                            error = %e,
                            "io_uring unavailable; using pread/pwrite"
                        );
                        Engine::Psync(PsyncEngine::new())
                    }
                }
            }
        };
        let mut name = path.display().to_string();
        if !direct {
            name.push_str(" (buffered)");
        }
        Ok(FileDevice {
            info: DeviceInfo {
                name,
                size_bytes,
                logical_block_size: lbs,
                max_io_bytes: FILE_MAX_IO_BYTES,
                queue_depth: opts.queue_depth,
            },
            engine,
            file,
            kind,
            direct,
            early: VecDeque::new(),
            bounce: None,
        })
    }

    pub fn engine_kind(&self) -> EngineKind {
        match self.engine {
            Engine::Uring(_) => EngineKind::Uring,
            Engine::Psync(_) => EngineKind::Psync,
        }
    }

    /// Whether I/O bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The open descriptor, for ioctls a wrapper issues (zone management).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    pub fn is_block_device(&self) -> bool {
        self.kind == FileKind::BlockDevice
    }

    /// Whether a caller's buffer must go through the bounce buffer.
    fn needs_bounce(&self, ptr: *const u8) -> bool {
        self.direct && !(ptr as usize).is_multiple_of(self.info.logical_block_size as usize)
    }

    fn bounce(&mut self) -> IoBuf {
        self.bounce
            .take()
            .unwrap_or_else(|| IoBuf::zeroed(BOUNCE_BYTES))
    }

    fn job(&self, req: IoRequest) -> Result<Job, (u64, Option<IoBuf>, DeviceError)> {
        let tag = req.tag;
        match req.op {
            IoOp::Read { offset, buf } => {
                match check_async_io(&self.info, IoOpKind::Read, offset, buf.as_ptr(), buf.len()) {
                    Ok(()) => Ok(Job::Read { tag, offset, buf }),
                    Err(e) => Err((tag, Some(buf), e)),
                }
            }
            IoOp::Write { offset, buf, fua } => {
                match check_async_io(&self.info, IoOpKind::Write, offset, buf.as_ptr(), buf.len()) {
                    Ok(()) => Ok(Job::Write {
                        tag,
                        offset,
                        buf,
                        fua,
                    }),
                    Err(e) => Err((tag, Some(buf), e)),
                }
            }
            IoOp::Flush => Ok(Job::Flush { tag }),
            IoOp::Discard { offset, len } => {
                match check_range(&self.info, IoOpKind::Discard, offset, len) {
                    Ok(()) => Ok(Job::Discard { tag, offset, len }),
                    Err(e) => Err((tag, None, e)),
                }
            }
        }
    }
}

impl BlockDevice for FileDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, req: IoRequest) {
        match self.job(req) {
            Ok(job) => match &mut self.engine {
                Engine::Uring(u) => u.push(job),
                Engine::Psync(p) => p.push(job),
            },
            Err((tag, buf, e)) => self.early.push_back(IoCompletion {
                tag,
                buf,
                result: Err(e),
            }),
        }
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let early = self.early.len();
        out.extend(self.early.drain(..));
        let rest = min_complete.saturating_sub(early);
        let n = match &mut self.engine {
            Engine::Uring(u) => u.poll(out, rest)?,
            Engine::Psync(p) => p.poll(&self.file, self.kind, out),
        };
        Ok(early + n)
    }

    fn in_flight(&self) -> usize {
        self.early.len()
            + match &self.engine {
                Engine::Uring(u) => u.in_flight(),
                Engine::Psync(p) => p.in_flight(),
            }
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Read, offset, buf.len() as u64)?;
        let err = |at: u64, e| DeviceError::Io {
            op: IoOpKind::Read,
            offset: at,
            source: e,
        };
        if !self.needs_bounce(buf.as_ptr()) {
            return self
                .file
                .read_exact_at(buf, offset)
                .map_err(|e| err(offset, e));
        }
        let mut bounce = self.bounce();
        let mut result = Ok(());
        for (i, chunk) in buf.chunks_mut(BOUNCE_BYTES).enumerate() {
            let at = offset + (i * BOUNCE_BYTES) as u64;
            let b = &mut bounce[..chunk.len()];
            if let Err(e) = self.file.read_exact_at(b, at) {
                result = Err(err(at, e));
                break;
            }
            chunk.copy_from_slice(b);
        }
        self.bounce = Some(bounce);
        result
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Write, offset, buf.len() as u64)?;
        let err = |at: u64, e| DeviceError::Io {
            op: IoOpKind::Write,
            offset: at,
            source: e,
        };
        if !self.needs_bounce(buf.as_ptr()) {
            return self
                .file
                .write_all_at(buf, offset)
                .map_err(|e| err(offset, e));
        }
        let mut bounce = self.bounce();
        let mut result = Ok(());
        for (i, chunk) in buf.chunks(BOUNCE_BYTES).enumerate() {
            let at = offset + (i * BOUNCE_BYTES) as u64;
            let b = &mut bounce[..chunk.len()];
            b.copy_from_slice(chunk);
            if let Err(e) = self.file.write_all_at(b, at) {
                result = Err(err(at, e));
                break;
            }
        }
        self.bounce = Some(bounce);
        result
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        self.file.sync_data().map_err(|e| DeviceError::Io {
            op: IoOpKind::Flush,
            offset: 0,
            source: e,
        })
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        check_range(&self.info, IoOpKind::Discard, offset, len)?;
        engine_psync::discard(&self.file, self.kind, offset, len)
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
