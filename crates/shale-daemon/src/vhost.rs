//! Volumes served to virtual machines over vhost-user-blk (`shale-vhost`).
//!
//! Each configured `VOLUME=SOCKET` gets a [`VolumeTarget`]: the virtio-blk device's
//! requests go through the same [`EngineBackend`] as NBD's (the same engine queue,
//! latency figures and error mapping), bound to the volume's export id, which is its
//! uid. A served volume that is deleted therefore answers every later request with
//! an error; it never reaches a volume created after it, whatever its name or slot.

use std::sync::Arc;

use shale_nbd::backend::{Backend, BackendError, BackendReply, BackendRequest, ExportId};
use shale_vhost::{BlockTarget, TargetDone, TargetError, TargetReply, TargetRequest};

use crate::backend::EngineBackend;

/// One volume as a virtio-blk device.
#[derive(Debug)]
pub struct VolumeTarget {
    backend: Arc<EngineBackend>,
    export: ExportId,
    size_bytes: u64,
}

impl VolumeTarget {
    /// The volume named `name` as it is now; `None` if there is none.
    pub fn new(backend: Arc<EngineBackend>, name: &str) -> Option<VolumeTarget> {
        let info = backend.export(name)?;
        Some(VolumeTarget {
            backend,
            export: info.id,
            size_bytes: info.size_bytes,
        })
    }
}

fn target_error(e: BackendError) -> TargetError {
    match e {
        BackendError::Io { offset, message } => TargetError::Io { offset, message },
        BackendError::NoSpace { offset } => TargetError::NoSpace { offset },
        other => TargetError::Io {
            offset: 0,
            message: other.to_string(),
        },
    }
}

/// Lengths the NBD-shaped backend takes are 32-bit; the device's limits keep every
/// request far below (16 MiB of data, 1 GiB to discard), so this only guards them.
fn len32(len: u64) -> Result<u32, TargetError> {
    u32::try_from(len).map_err(|_| TargetError::Unsupported {
        what: "a request over 4 GiB",
    })
}

impl BlockTarget for VolumeTarget {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_only(&self) -> bool {
        false
    }

    fn submit(&self, req: TargetRequest, done: TargetDone) {
        let request = match req {
            TargetRequest::Read { offset, len } => {
                len32(len).map(|len| BackendRequest::Read { offset, len })
            }
            TargetRequest::Write { offset, data, fua } => {
                Ok(BackendRequest::Write { offset, data, fua })
            }
            TargetRequest::Flush => Ok(BackendRequest::Flush),
            TargetRequest::Discard { offset, len, fua } => {
                len32(len).map(|len| BackendRequest::Trim { offset, len, fua })
            }
            // Unmapped blocks read as zeros, and the engine never writes zeros in
            // place: `unmap` or not, the range is unmapped.
            TargetRequest::WriteZeroes {
                offset, len, fua, ..
            } => len32(len).map(|len| BackendRequest::WriteZeroes {
                offset,
                len,
                no_hole: false,
                fua,
            }),
        };
        let request = match request {
            Ok(r) => r,
            Err(e) => return done(Err(e)),
        };
        self.backend.submit(
            self.export,
            request,
            Box::new(move |r| {
                done(match r {
                    Ok(BackendReply::Data(d)) => Ok(TargetReply::Data(d)),
                    Ok(_) => Ok(TargetReply::Done),
                    Err(e) => Err(target_error(e)),
                });
            }),
        );
    }
}
