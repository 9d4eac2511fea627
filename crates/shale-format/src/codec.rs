//! Bounds-checked little-endian cursors. Readers never panic: reading past the end
//! yields a `Truncated` error.

use crate::{FormatError, Structure};

pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }
    pub(crate) fn at(buf: &'a mut [u8], pos: usize) -> Self {
        Writer { buf, pos }
    }
    // Encoders size their buffers from the value being encoded, so overrunning is a bug.
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn skip(&mut self, n: usize) {
        self.pos += n;
    }
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    structure: Structure,
    at: u64,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], structure: Structure, at: u64) -> Self {
        Reader {
            buf,
            pos: 0,
            structure,
            at,
        }
    }
    pub(crate) fn at(buf: &'a [u8], pos: usize, structure: Structure, at: u64) -> Self {
        Reader {
            buf,
            pos,
            structure,
            at,
        }
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(FormatError::Truncated {
                structure: self.structure,
                at: self.at,
                len: self.buf.len(),
                need: self.pos.saturating_add(n),
            }),
        }
    }
    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        let mut a = [0u8; 2];
        a.copy_from_slice(self.bytes(2)?);
        Ok(u16::from_le_bytes(a))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.bytes(4)?);
        Ok(u32::from_le_bytes(a))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }
    pub(crate) fn skip(&mut self, n: usize) -> Result<(), FormatError> {
        self.bytes(n).map(|_| ())
    }
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
    pub(crate) fn invalid(&self, field: &'static str, reason: String) -> FormatError {
        FormatError::InvalidField {
            structure: self.structure,
            at: self.at,
            field,
            reason,
        }
    }
}

/// The common 12-byte header of every structure: magic u32, version u16, a
/// structure-specific u16, CRC32C u32. The CRC covers `buf[..len]` with bytes 8..12
/// taken as zero.
pub(crate) fn seal(buf: &mut [u8], len: usize) {
    let crc = crc_of(&buf[..len]);
    buf[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// Emits a sealed structure without building it: `body` produces its bytes after
/// `header` (whose CRC field is zero) twice, once for the CRC `seal` would write and
/// once into `f`, behind the sealed header.
pub(crate) fn sealed_chunks(
    header: &mut [u8],
    body: impl Fn(&mut dyn FnMut(&[u8])),
    f: &mut dyn FnMut(&[u8]),
) {
    debug_assert_eq!(&header[8..12], &[0; 4]);
    let mut crc = crate::crc32c(header);
    body(&mut |b| crc = crate::crc32c_append(crc, b));
    header[8..12].copy_from_slice(&crc.to_le_bytes());
    f(header);
    body(f);
}

pub(crate) fn crc_of(buf: &[u8]) -> u32 {
    let c = crate::crc32c(&buf[..8]);
    let c = crate::crc32c_append(c, &[0u8; 4]);
    crate::crc32c_append(c, &buf[12..])
}

/// Checks magic, version, then CRC over `buf[..len]` (`len` already known to fit).
pub(crate) fn check_header(
    buf: &[u8],
    structure: Structure,
    at: u64,
    magic: u32,
    version: u16,
    min_len: usize,
) -> Result<(), FormatError> {
    if buf.len() < min_len.max(12) {
        return Err(FormatError::Truncated {
            structure,
            at,
            len: buf.len(),
            need: min_len.max(12),
        });
    }
    let mut r = Reader::new(buf, structure, at);
    let found = r.u32()?;
    if found != magic {
        return Err(FormatError::BadMagic {
            structure,
            at,
            expected: magic,
            found,
        });
    }
    let v = r.u16()?;
    if v != version {
        return Err(FormatError::UnsupportedVersion {
            structure,
            at,
            supported: version,
            found: v,
        });
    }
    Ok(())
}

/// Checks that `buf` holds the structure's `len` bytes, then its CRC over them.
pub(crate) fn check_len_crc(
    buf: &[u8],
    len: usize,
    structure: Structure,
    at: u64,
) -> Result<(), FormatError> {
    if buf.len() < len {
        return Err(FormatError::Truncated {
            structure,
            at,
            len: buf.len(),
            need: len,
        });
    }
    check_crc(&buf[..len], structure, at)
}

pub(crate) fn check_crc(buf: &[u8], structure: Structure, at: u64) -> Result<(), FormatError> {
    let mut r = Reader::at(buf, 8, structure, at);
    let expected = r.u32()?;
    let got = crc_of(buf);
    if expected != got {
        return Err(FormatError::ChecksumMismatch {
            structure,
            at,
            expected,
            got,
        });
    }
    Ok(())
}
