//! The serve loop: one unix socket, one frontend (QEMU, cloud-hypervisor) at a
//! time, for as long as the caller wants.
//!
//! vhost-user is one connection per device. Each accepted connection gets a
//! fresh [`BlkBackend`] and `VhostUserDaemon` (fresh vrings and threads); when
//! the frontend goes away the vring threads are told to exit, whatever the old
//! connection still has at the target is waited for (so a write of the old
//! connection cannot land after a write of the next one), and the loop
//! listens again. The target and its data outlive connections.
//!
//! The caller (the daemon) starts one server per exported volume, keeps the
//! [`ServeHandle`], and at shutdown calls `stop` (from any thread, through a
//! [`Stopper`] if need be) and then `join`, before it stops the target.
//! Dropping the handle stops and joins too. A frontend then connects with,
//! for QEMU (guest RAM must be shared):
//!
//! ```text
//! -object memory-backend-memfd,id=mem,size=4G,share=on -machine memory-backend=mem
//! -chardev socket,id=vol0,path=/run/shale/vol0.sock
//! -device vhost-user-blk-pci,chardev=vol0,num-queues=4
//! ```
//!
//! and for cloud-hypervisor `--memory size=4G,shared=on --disk
//! vhost_user=true,socket=/run/shale/vol0.sock,num_queues=4`. `num-queues` must
//! not exceed [`VhostOptions::num_queues`](crate::VhostOptions).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use shale_vhost::{serve, MemTarget, VhostOptions};
//! let target = Arc::new(MemTarget::new(1 << 30));
//! let handle = serve(target, "/run/shale/vol0.sock".as_ref(), VhostOptions::default())?;
//! // ... from any thread, when the daemon shuts down:
//! handle.stop();
//! handle.join()?;
//! # Ok::<(), shale_vhost::ServeError>(())
//! ```

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use thiserror::Error;
use tracing::{debug, info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::backend::{BlkBackend, Outstanding};
use crate::config::{OptionsError, VhostOptions};
use crate::target::BlockTarget;

/// Why serving could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("options: {0}")]
    Options(#[from] OptionsError),
    #[error("binding {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("{path} is in use by a live server")]
    SocketInUse { path: PathBuf },
    #[error("{path} exists and is not a socket")]
    NotASocket { path: PathBuf },
    #[error("creating the stop eventfd or the accept epoll: {0}")]
    Setup(io::Error),
    #[error("waiting for a connection: {0}")]
    Accept(io::Error),
    #[error("starting the vhost-user device: {0}")]
    Device(String),
    #[error("the serve thread panicked")]
    Panicked,
}

/// What the serve thread shares with [`ServeHandle`]s.
struct Control {
    stop: AtomicBool,
    wake: EventFd,
    /// The live connection, to cut it on stop.
    conn: Mutex<Option<ShutdownHandle>>,
    connections: AtomicU64,
    outstanding: Arc<Outstanding>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("stop", &self.stop)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

impl Control {
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self.wake.write(1) {
            warn!("vhost stop eventfd: {e}");
        }
        if let Some(c) = self
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            c.shutdown();
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Stops a server from any thread; cheap to clone.
#[derive(Debug, Clone)]
pub struct Stopper(Arc<Control>);

impl Stopper {
    /// Asks the server to stop: the live connection (if any) is cut, nothing
    /// new is accepted. Returns at once; `ServeHandle::join` waits.
    pub fn stop(&self) {
        self.0.stop();
    }
}

/// A running server.
#[derive(Debug)]
pub struct ServeHandle {
    control: Arc<Control>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
    path: PathBuf,
}

impl ServeHandle {
    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.control))
    }

    /// See [`Stopper::stop`].
    pub fn stop(&self) {
        self.control.stop();
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.control.connections.load(Ordering::Acquire)
    }

    /// Target requests submitted and not yet completed.
    pub fn outstanding(&self) -> u64 {
        self.control.outstanding.get()
    }

    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// Waits for the server to end (after `stop`, or on a fatal error). The
    /// socket file is removed.
    pub fn join(mut self) -> Result<(), ServeError> {
        self.join_inner()
    }

    fn join_inner(&mut self) -> Result<(), ServeError> {
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        t.join().map_err(|_| ServeError::Panicked)?
    }
}

impl Drop for ServeHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.control.stop();
            if let Err(e) = self.join_inner() {
                warn!("vhost server: {e}");
            }
        }
    }
}

/// Serves `target` as a vhost-user-blk device on the unix socket `socket`
/// (created mode 0600; a stale socket is replaced, a live one refused) until
/// stopped. Returns once the socket is listening.
pub fn serve(
    target: Arc<dyn BlockTarget>,
    socket: &Path,
    options: VhostOptions,
) -> Result<ServeHandle, ServeError> {
    options.validate(target.size_bytes())?;
    let listener = bind_unix(socket)?;
    let control = Arc::new(Control {
        stop: AtomicBool::new(false),
        wake: EventFd::new(EFD_NONBLOCK).map_err(ServeError::Setup)?,
        conn: Mutex::new(None),
        connections: AtomicU64::new(0),
        outstanding: Arc::new(Outstanding::default()),
    });
    let c = Arc::clone(&control);
    let path = socket.to_owned();
    let thread = std::thread::Builder::new()
        .name("vhost-serve".into())
        .spawn(move || {
            let r = serve_loop(&target, listener, &options, &c);
            let _ = std::fs::remove_file(&path);
            r
        })
        .map_err(ServeError::Setup)?;
    Ok(ServeHandle {
        control,
        thread: Some(thread),
        path: socket.to_owned(),
    })
}

/// Binds like the NBD server does: refuse a live socket and anything that is
/// not a socket, replace a stale one, and create it 0600 under a temporary
/// name so it is never reachable with looser permissions.
fn bind_unix(path: &Path) -> Result<UnixListener, ServeError> {
    let err = |source| ServeError::Bind {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(ServeError::SocketInUse {
                    path: path.to_owned(),
                });
            }
            info!(path = %path.display(), "removing stale vhost-user socket");
            std::fs::remove_file(path).map_err(err)?;
        }
        Ok(_) => {
            return Err(ServeError::NotASocket {
                path: path.to_owned(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = tempfile_dir(parent).map_err(err)?;
    let tmp = dir.join("s");
    let bound = (|| {
        let listener = UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir(&dir);
    bound.map_err(err)
}

/// A private directory next to the socket for binding under a temporary name.
fn tempfile_dir(parent: &Path) -> io::Result<PathBuf> {
    for n in 0..100u32 {
        let dir = parent.join(format!(".shale-vhost-{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary directory name",
    ))
}

const EVENT_LISTENER: u64 = 0;
const EVENT_STOP: u64 = 1;

fn serve_loop(
    target: &Arc<dyn BlockTarget>,
    listener: UnixListener,
    options: &VhostOptions,
    control: &Control,
) -> Result<(), ServeError> {
    let mut listener = Listener::from(listener);
    let epoll = Epoll::new().map_err(ServeError::Setup)?;
    for (fd, id) in [
        (listener.as_raw_fd(), EVENT_LISTENER),
        (control.wake.as_raw_fd(), EVENT_STOP),
    ] {
        epoll
            .ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, id))
            .map_err(ServeError::Setup)?;
    }
    let mut events = [EpollEvent::default(); 2];
    while !control.stopped() {
        // Wait for a frontend (or a stop) before building a device.
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ServeError::Accept(e)),
        };
        if control.stopped() {
            break;
        }
        if !events.iter().take(n).any(|e| e.data() == EVENT_LISTENER) {
            continue;
        }
        serve_one(target, &mut listener, options, control)?;
    }
    Ok(())
}

/// Serves one connection (the listener has one pending) until it ends.
fn serve_one(
    target: &Arc<dyn BlockTarget>,
    listener: &mut Listener,
    options: &VhostOptions,
    control: &Control,
) -> Result<(), ServeError> {
    let device = |e: String| ServeError::Device(e);
    let backend = Arc::new(
        BlkBackend::new(
            Arc::clone(target),
            options.clone(),
            Arc::clone(&control.outstanding),
        )
        .map_err(|e| device(e.to_string()))?,
    );
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::<()>::new());
    let mut daemon = VhostUserDaemon::new("vhost-blk".into(), Arc::clone(&backend), mem)
        .map_err(|e| device(e.to_string()))?;
    let handlers = daemon.get_epoll_handlers();
    let exit_threads = || handlers.iter().for_each(|h| h.send_exit_event());
    if let Err(e) = backend.register_completions(&handlers) {
        exit_threads();
        return Err(device(e.to_string()));
    }
    if let Err(e) = daemon.start(listener) {
        // A frontend that connected and vanished before accept is not fatal.
        exit_threads();
        warn!("vhost-user accept: {e}");
        return Ok(());
    }
    let n = control.connections.fetch_add(1, Ordering::AcqRel) + 1;
    info!(connection = n, "vhost-user frontend connected");
    {
        let mut conn = control.conn.lock().unwrap_or_else(PoisonError::into_inner);
        *conn = daemon.shutdown_handle();
        // A stop that came before the handle was published cuts it now.
        if control.stopped() {
            if let Some(c) = conn.as_ref() {
                c.shutdown();
            }
        }
    }
    let r = daemon.wait();
    control
        .conn
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    match r {
        Ok(()) => info!(connection = n, "vhost-user frontend disconnected"),
        Err(e) => info!(connection = n, "vhost-user connection ended: {e}"),
    }
    exit_threads();
    backend.close();
    drop(handlers);
    drop(daemon);
    let inflight = control.outstanding.get();
    if inflight > 0 {
        debug!(
            inflight,
            "waiting for the old connection's requests at the target"
        );
        if !control.outstanding.wait_idle(options.drain_timeout) {
            warn!(
                outstanding = control.outstanding.get(),
                "requests of a closed vhost-user connection are still at the target"
            );
        }
    }
    Ok(())
}
