//! Shale's ublk server: a [`BlockTarget`] as a kernel block device, `/dev/ublkbN`,
//! through the kernel's ublk driver (Linux 6.0+, `ublk_drv`) and the libublk crate.
//!
//! Any filesystem, database or cluster store then runs on a Shale volume as on a
//! disk. The kernel hands each request to one of the device's queues; every queue
//! has its own thread and io_uring (libublk's), and a request goes to the target
//! without that thread waiting for it: the target's completion, from any thread,
//! lands in the queue's channel and wakes the queue's ring through an eventfd the
//! ring polls. The queue thread then copies read data into the request's buffer and
//! commits the result to the kernel.
//!
//! The device advertises a volatile write cache and FUA, so the kernel sends
//! flushes (mkfs and fsync need them), 4 KiB logical blocks, discard and write
//! zeroes.

#![forbid(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{BufDesc, UblkFlags, UblkIORes};
use rustix::event::{eventfd, EventfdFlags};
use shale_vhost::{BlockTarget, TargetError, TargetReply, TargetRequest};

/// How the device is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UblkOptions {
    /// Name in logs and in the ublk driver's device info.
    pub name: String,
    /// Hardware queues (each with its own thread). 1..=64.
    pub queues: u16,
    /// Requests in flight per queue. 1..=1024.
    pub depth: u16,
    /// Largest request in bytes; a power of two from 64 KiB to 1 MiB.
    pub max_io_bytes: u32,
}

impl Default for UblkOptions {
    fn default() -> UblkOptions {
        UblkOptions {
            name: "shale".into(),
            queues: 1,
            depth: 64,
            max_io_bytes: 512 << 10,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UblkServeError {
    #[error("ublk options: {0}")]
    Options(String),
    #[error("the target's size {size} is not a non-zero multiple of 4096")]
    Size { size: u64 },
    #[error("ublk: {what}: {error} (is the ublk_drv module loaded, and is this root?)")]
    Driver {
        what: &'static str,
        error: libublk::UblkError,
    },
    #[error("ublk: {0}")]
    Io(#[from] std::io::Error),
    #[error("ublk: the device thread ended before the device started")]
    NotStarted,
}

/// A served device; [`UblkHandle::stop`] removes it.
#[derive(Debug)]
pub struct UblkHandle {
    dev_id: u32,
    thread: Option<JoinHandle<()>>,
}

/// `/dev/ublkbN` of a device id.
pub fn block_device_path(dev_id: u32) -> String {
    format!("/dev/ublkb{dev_id}")
}

impl UblkHandle {
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// The block device the kernel made.
    pub fn block_device(&self) -> String {
        block_device_path(self.dev_id)
    }

    /// Stops the device (requests in flight in the kernel fail), waits for its
    /// queues and removes it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let id = self.dev_id as i32;
        match UblkCtrl::new_simple(id) {
            Ok(ctrl) => {
                if let Err(e) = ctrl.kill_dev() {
                    tracing::warn!(dev_id = id, error = %e, "ublk: stopping the device");
                }
                let _ = thread.join();
                if let Err(e) = ctrl.del_dev() {
                    tracing::warn!(dev_id = id, error = %e, "ublk: removing the device");
                }
            }
            Err(e) => tracing::warn!(dev_id = id, error = %e, "ublk: no control of the device"),
        }
    }
}

impl Drop for UblkHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn check(opts: &UblkOptions, size: u64) -> Result<(), UblkServeError> {
    if !(1..=64).contains(&opts.queues) {
        return Err(UblkServeError::Options(format!(
            "queues {} not in 1..=64",
            opts.queues
        )));
    }
    if !(1..=1024).contains(&opts.depth) {
        return Err(UblkServeError::Options(format!(
            "depth {} not in 1..=1024",
            opts.depth
        )));
    }
    if !opts.max_io_bytes.is_power_of_two() || !(64 << 10..=1 << 20).contains(&opts.max_io_bytes) {
        return Err(UblkServeError::Options(format!(
            "max I/O {} bytes is not a power of two from 64 KiB to 1 MiB",
            opts.max_io_bytes
        )));
    }
    if size == 0 || !size.is_multiple_of(4096) {
        return Err(UblkServeError::Size { size });
    }
    Ok(())
}

/// Adds a ublk device serving `target` and starts its queues; returns once the
/// kernel has made `/dev/ublkbN`.
pub fn serve(
    target: Arc<dyn BlockTarget>,
    opts: &UblkOptions,
) -> Result<UblkHandle, UblkServeError> {
    let size = target.size_bytes();
    check(opts, size)?;
    // libublk keeps the control ring in a thread-local: the device is added, run
    // and stopped on its own thread, which reports its id (or why not) back here.
    let (started_tx, started_rx) = crossbeam_channel::bounded::<Result<u32, UblkServeError>>(1);
    let read_only = target.read_only();
    let opts = opts.clone();
    let thread = std::thread::Builder::new()
        .name(format!("ublk-{}", opts.name))
        .spawn(move || {
            let ctrl = match UblkCtrlBuilder::default()
                .name(&opts.name)
                .id(-1)
                .nr_queues(opts.queues)
                .depth(opts.depth)
                .io_buf_bytes(opts.max_io_bytes)
                .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
                .build()
            {
                Ok(c) => c,
                Err(error) => {
                    let _ = started_tx.send(Err(UblkServeError::Driver {
                        what: "adding a device",
                        error,
                    }));
                    return;
                }
            };
            let dev_id = ctrl.dev_info().dev_id;
            let tgt_init = move |dev: &mut UblkDev| {
                set_params(dev, size, read_only);
                Ok(())
            };
            let queue = move |qid: u16, dev: &UblkDev| {
                if let Err(e) = run_queue(qid, dev, target.clone()) {
                    tracing::error!(dev_id, qid, error = %e, "ublk queue failed");
                }
            };
            let started_ok = started_tx.clone();
            let started = move |_: &UblkCtrl| {
                let _ = started_ok.send(Ok(dev_id));
            };
            if let Err(error) = ctrl.run_target(tgt_init, queue, started) {
                let _ = started_tx.send(Err(UblkServeError::Driver {
                    what: "starting the device",
                    error,
                }));
                let _ = ctrl.del_dev();
            }
            tracing::info!(dev_id, "ublk device stopped");
        })?;
    match started_rx.recv() {
        Ok(Ok(dev_id)) => Ok(UblkHandle {
            dev_id,
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(UblkServeError::NotStarted)
        }
    }
}

/// The device's parameters: size, 4 KiB blocks, a volatile cache with FUA (so the
/// kernel sends flushes), discard and write zeroes.
fn set_params(dev: &mut UblkDev, size: u64, read_only: bool) {
    use libublk::sys;
    dev.set_default_params(size);
    // One slot of the ring for the eventfd poll that brings completions back.
    dev.tgt.extra_ios = 1;
    let p = &mut dev.tgt.params;
    p.basic.logical_bs_shift = 12;
    p.basic.physical_bs_shift = 12;
    p.basic.io_min_shift = 12;
    p.basic.io_opt_shift = 12;
    p.basic.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    if read_only {
        p.basic.attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
    p.discard.discard_alignment = 0;
    p.discard.discard_granularity = 4096;
    p.discard.max_discard_sectors = u32::MAX >> 9;
    p.discard.max_write_zeroes_sectors = u32::MAX >> 9;
    p.discard.max_discard_segments = 1;
}

/// A completed target request on its way back to the queue's thread.
struct Done {
    tag: u16,
    len: u32,
    result: Result<TargetReply, TargetError>,
}

/// The user data of the eventfd poll (a target I/O, so libublk passes its CQE on).
const WAKE_OP: u32 = 0xfe;

fn run_queue(qid: u16, dev: &UblkDev, target: Arc<dyn BlockTarget>) -> Result<(), String> {
    let mut bufs = dev.alloc_queue_io_bufs();
    let wake: Arc<OwnedFd> = Arc::new(
        eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| format!("eventfd: {e}"))?,
    );
    let (tx, rx): (Sender<Done>, Receiver<Done>) = crossbeam_channel::unbounded();
    let queue = UblkQueue::new(qid, dev)
        .map_err(|e| format!("queue {qid}: {e}"))?
        .submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs)))
        .map_err(|e| format!("queue {qid}: fetch commands: {e}"))?;
    arm_wake(&queue, &wake)?;
    let handler = |q: &UblkQueue, tag: u16, ctx: &UblkIOCtx| {
        if ctx.is_tgt_io() {
            // The eventfd fired: drain it, commit what completed, poll again.
            let mut word = [0u8; 8];
            let _ = rustix::io::read(wake.as_fd(), &mut word);
            while let Ok(d) = rx.try_recv() {
                let res = match d.result {
                    Ok(TargetReply::Data(data)) => {
                        let n = data.len().min(d.len as usize);
                        bufs[d.tag as usize].as_mut_slice()[..n].copy_from_slice(&data[..n]);
                        d.len as i32
                    }
                    Ok(TargetReply::Done) => d.len as i32,
                    Err(e) => errno(&e),
                };
                commit(q, &bufs, d.tag, res);
            }
            if let Err(e) = arm_wake(q, &wake) {
                tracing::error!(qid, error = %e, "ublk: re-arming the wake-up poll");
            }
            return;
        }
        let iod = q.get_iod(tag);
        let op = iod.op_flags & 0xff;
        let flags = iod.op_flags;
        let offset = iod.start_sector << 9;
        let len = iod.nr_sectors << 9;
        let fua = flags & libublk::sys::UBLK_IO_F_FUA != 0;
        let req = match op {
            libublk::sys::UBLK_IO_OP_READ => TargetRequest::Read {
                offset,
                len: u64::from(len),
            },
            libublk::sys::UBLK_IO_OP_WRITE => TargetRequest::Write {
                offset,
                data: bufs[tag as usize].as_slice()[..len as usize].to_vec(),
                fua,
            },
            libublk::sys::UBLK_IO_OP_FLUSH => TargetRequest::Flush,
            libublk::sys::UBLK_IO_OP_DISCARD => TargetRequest::Discard {
                offset,
                len: u64::from(len),
                fua,
            },
            libublk::sys::UBLK_IO_OP_WRITE_ZEROES => TargetRequest::WriteZeroes {
                offset,
                len: u64::from(len),
                unmap: flags & libublk::sys::UBLK_IO_F_NOUNMAP == 0,
                fua,
            },
            _ => return commit(q, &bufs, tag, -libc::EOPNOTSUPP),
        };
        let tx = tx.clone();
        let wake = wake.clone();
        target.submit(
            req,
            Box::new(move |result| {
                // The queue may be gone (the device stopping): nothing to tell.
                if tx.send(Done { tag, len, result }).is_ok() {
                    // An eventfd counter is a native-endian u64 by definition.
                    #[allow(clippy::host_endian_bytes)]
                    let one = 1u64.to_ne_bytes();
                    let _ = rustix::io::write(wake.as_fd(), &one);
                }
            }),
        );
    };
    queue.wait_and_handle_io(handler);
    Ok(())
}

/// Commits a request's result (bytes done, or a negative errno) to the kernel,
/// which then fetches the tag's next request.
fn commit(q: &UblkQueue, bufs: &[libublk::helpers::IoBuf<u8>], tag: u16, res: i32) {
    let desc = BufDesc::Slice(bufs[tag as usize].as_slice());
    if let Err(e) = q.complete_io_cmd_unified(tag, desc, Ok(UblkIORes::Result(res))) {
        tracing::error!(tag, error = %e, "ublk: committing a request");
    }
}

/// Polls the eventfd from the queue's ring, as a target I/O.
fn arm_wake(q: &UblkQueue, wake: &OwnedFd) -> Result<(), String> {
    let sqe =
        io_uring::opcode::PollAdd::new(io_uring::types::Fd(wake.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(UblkIOCtx::build_user_data(0, WAKE_OP, 0, true));
    q.ublk_submit_sqe_sync(sqe)
        .map_err(|e| format!("submitting the eventfd poll: {e}"))
}

/// The errno the kernel gets for a failed request.
fn errno(e: &TargetError) -> i32 {
    -match e {
        TargetError::NoSpace { .. } => libc::ENOSPC,
        TargetError::ReadOnly => libc::EROFS,
        TargetError::OutOfRange { .. } => libc::EINVAL,
        TargetError::Unsupported { .. } => libc::EOPNOTSUPP,
        TargetError::Io { .. } | TargetError::ShuttingDown => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_before_the_driver_is_asked() {
        let ok = UblkOptions::default();
        assert!(check(&ok, 1 << 30).is_ok());
        assert!(matches!(
            check(&ok, 1000),
            Err(UblkServeError::Size { size: 1000 })
        ));
        let bad_queues = UblkOptions {
            queues: 0,
            ..UblkOptions::default()
        };
        assert!(check(&bad_queues, 1 << 30).is_err());
        let bad_io = UblkOptions {
            max_io_bytes: 3 << 16,
            ..UblkOptions::default()
        };
        assert!(check(&bad_io, 1 << 30).is_err());
    }

    #[test]
    fn errors_become_errnos() {
        assert_eq!(errno(&TargetError::NoSpace { offset: 0 }), -libc::ENOSPC);
        assert_eq!(errno(&TargetError::ReadOnly), -libc::EROFS);
        assert_eq!(
            errno(&TargetError::Unsupported { what: "x" }),
            -libc::EOPNOTSUPP
        );
        assert_eq!(errno(&TargetError::ShuttingDown), -libc::EIO);
    }

    #[test]
    fn without_the_driver_serve_is_an_error_not_a_hang() {
        // This machine's kernel may lack ublk; then adding a device fails cleanly.
        if std::path::Path::new("/dev/ublk-control").exists() {
            return;
        }
        let t = Arc::new(shale_vhost::MemTarget::new(1 << 20));
        assert!(matches!(
            serve(t, &UblkOptions::default()),
            Err(UblkServeError::Driver { .. })
        ));
    }
}
