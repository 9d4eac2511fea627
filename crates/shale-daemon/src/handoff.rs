//! The hand-off store of `shale serve`: two files on tmpfs (`/dev/shm` by default,
//! `[engine] handoff_dir`), so the image a killed daemon left (shale-engine's
//! `handoff.rs`) is there for the next one, and gone after a reboot or power loss,
//! when the devices' caches may not have kept what it claims.
//!
//! Each file holds one image behind a header: magic, version, CRC32C of header and
//! image, image length, a generation, and the boot id it was written under. A store
//! writes the file the newest one is not in; killed half-way it leaves a file whose
//! CRC fails, and the other, older image (which covers every acknowledgement sent:
//! none are sent before a store returns). An open takes the valid image of this boot
//! with the higher generation.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"SHHF";
const VERSION: u16 = 1;
/// magic 4, version 2, reserved 2, crc 4, length 4, generation 8, boot id 36.
const HEADER_LEN: usize = 60;

#[derive(Debug)]
pub struct ShmHandoff {
    dir: PathBuf,
    paths: Option<[PathBuf; 2]>,
    files: Option<[File; 2]>,
    generation: u64,
    boot: [u8; 36],
    buf: Vec<u8>,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
fn boot_id() -> io::Result<[u8; 36]> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let s = s.trim().as_bytes();
    <[u8; 36]>::try_from(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("boot id of {} bytes", s.len()),
        )
    })
}

impl ShmHandoff {
    /// A store in `dir` (created if missing); fails when this boot's id cannot be
    /// read.
    pub fn new(dir: &Path) -> io::Result<ShmHandoff> {
        std::fs::create_dir_all(dir)?;
        Ok(ShmHandoff {
            dir: dir.to_path_buf(),
            paths: None,
            files: None,
            generation: 0,
            boot: boot_id()?,
            buf: Vec::new(),
        })
    }

    /// The two files of the pool, once `open` named it.
    pub fn paths(&self) -> Option<&[PathBuf; 2]> {
        self.paths.as_ref()
    }

    /// The image in `bytes` with its generation, if the header checks and it was
    /// written on this boot.
    fn parse<'a>(&self, bytes: &'a [u8]) -> Option<(u64, &'a [u8])> {
        if bytes.len() < HEADER_LEN || &bytes[..4] != MAGIC {
            return None;
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        let crc = u32::from_le_bytes(bytes[8..12].try_into().ok()?);
        let len = u32::from_le_bytes(bytes[12..16].try_into().ok()?) as usize;
        let generation = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
        let end = HEADER_LEN.checked_add(len)?;
        if version != VERSION || end > bytes.len() || bytes[24..60] != self.boot {
            return None;
        }
        let mut c = shale_format::crc32c(&bytes[..8]);
        c = shale_format::crc32c_append(c, &[0; 4]);
        c = shale_format::crc32c_append(c, &bytes[12..end]);
        (c == crc).then_some((generation, &bytes[HEADER_LEN..end]))
    }

    fn open_files(&mut self) -> io::Result<()> {
        if self.files.is_some() {
            return Ok(());
        }
        let Some(paths) = &self.paths else {
            return Err(io::Error::other("hand-off store used before open"));
        };
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(p)
        };
        self.files = Some([open(&paths[0])?, open(&paths[1])?]);
        Ok(())
    }
}

impl shale_engine::Handoff for ShmHandoff {
    fn open(&mut self, pool: [u8; 16]) -> io::Result<Option<Vec<u8>>> {
        let name = uuid::Uuid::from_bytes(pool).simple().to_string();
        self.paths = Some([
            self.dir.join(format!("shale-{name}.handoff.0")),
            self.dir.join(format!("shale-{name}.handoff.1")),
        ]);
        self.files = None;
        let mut best: Option<(u64, Vec<u8>)> = None;
        for p in self.paths.iter().flatten() {
            let bytes = match std::fs::read(p) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if let Some((g, image)) = self.parse(&bytes) {
                if best.as_ref().is_none_or(|(bg, _)| g > *bg) {
                    best = Some((g, image.to_vec()));
                }
            }
        }
        self.generation = best.as_ref().map_or(0, |b| b.0);
        Ok(best.map(|b| b.1))
    }

    fn store(&mut self, image: &[u8]) -> io::Result<()> {
        self.open_files()?;
        let generation = self.generation + 1;
        let len = u32::try_from(image.len())
            .map_err(|_| io::Error::other(format!("image of {} bytes", image.len())))?;
        self.buf.clear();
        self.buf.extend_from_slice(MAGIC);
        self.buf.extend_from_slice(&VERSION.to_le_bytes());
        self.buf.extend_from_slice(&[0; 2]);
        self.buf.extend_from_slice(&[0; 4]);
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(&generation.to_le_bytes());
        self.buf.extend_from_slice(&self.boot);
        self.buf.extend_from_slice(image);
        let crc = shale_format::crc32c(&self.buf);
        self.buf[8..12].copy_from_slice(&crc.to_le_bytes());
        let Some(files) = &self.files else {
            unreachable!("opened above")
        };
        files[(generation % 2) as usize].write_all_at(&self.buf, 0)?;
        self.generation = generation;
        Ok(())
    }

    fn clear(&mut self) -> io::Result<()> {
        self.files = None;
        for p in self.paths.iter().flatten() {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_engine::Handoff;

    #[test]
    fn the_newest_valid_image_of_this_boot_is_taken() {
        let dir = tempfile::tempdir().expect("hand-off store");
        let mut s = ShmHandoff::new(dir.path()).expect("hand-off store");
        assert_eq!(s.open([1; 16]).expect("hand-off store"), None);
        s.store(b"first image").expect("hand-off store");
        s.store(b"second").expect("hand-off store");
        let mut t = ShmHandoff::new(dir.path()).expect("hand-off store");
        assert_eq!(
            t.open([1; 16]).expect("hand-off store").as_deref(),
            Some(&b"second"[..])
        );
        // Another pool's files are other files.
        assert_eq!(t.open([2; 16]).expect("hand-off store"), None);

        // A store killed half-way (the newer file torn) leaves the older image.
        t.open([1; 16]).expect("hand-off store");
        t.store(b"third, torn").expect("hand-off store");
        let torn = t.paths().expect("hand-off store")[(t.generation % 2) as usize].clone();
        let mut b = std::fs::read(&torn).expect("hand-off store");
        let n = b.len();
        b[n - 2] ^= 0xFF;
        std::fs::write(&torn, &b).expect("hand-off store");
        let mut u = ShmHandoff::new(dir.path()).expect("hand-off store");
        assert_eq!(
            u.open([1; 16]).expect("hand-off store").as_deref(),
            Some(&b"second"[..])
        );
        // The next store goes to the torn file's slot, never over the good one.
        u.store(b"fourth").expect("hand-off store");
        assert_eq!(
            ShmHandoff::new(dir.path())
                .expect("hand-off store")
                .open([1; 16])
                .expect("hand-off store")
                .as_deref(),
            Some(&b"fourth"[..])
        );

        // Another boot's image is not taken; a clear removes the files.
        let mut v = ShmHandoff::new(dir.path()).expect("hand-off store");
        v.boot = *b"00000000-0000-0000-0000-000000000000";
        assert_eq!(v.open([1; 16]).expect("hand-off store"), None);
        u.clear().expect("hand-off store");
        assert!(u
            .paths()
            .expect("hand-off store")
            .iter()
            .all(|p| !p.exists()));
        assert_eq!(
            ShmHandoff::new(dir.path())
                .expect("hand-off store")
                .open([1; 16])
                .expect("hand-off store"),
            None
        );
    }
}
