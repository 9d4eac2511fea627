//! Bounds-checked big-endian cursor over untrusted bytes, and the string rules
//! every protocol string obeys. Nothing here panics on any input.

use super::consts::STRING_BYTES_MAX;

/// A read cursor that never indexes out of bounds: every getter returns `None`
/// when too few bytes remain.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let out = self.buf.get(self.pos..).unwrap_or(&[]);
        self.pos = self.buf.len();
        out
    }

    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let b = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Some(out)
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.array::<2>().map(u16::from_be_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.array::<4>().map(u32::from_be_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.array::<8>().map(u64::from_be_bytes)
    }
}

/// Why a byte string is not a valid protocol string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StringError {
    #[error("{len} bytes, longer than the {STRING_BYTES_MAX}-byte limit")]
    TooLong { len: usize },
    #[error("not UTF-8 (first bad byte at {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
    #[error("contains NUL at byte {at}")]
    Nul { at: usize },
}

/// Applies the spec's string rules: UTF-8, no NUL, at most 4096 bytes.
pub fn protocol_string(bytes: &[u8]) -> Result<String, StringError> {
    if bytes.len() > STRING_BYTES_MAX {
        return Err(StringError::TooLong { len: bytes.len() });
    }
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Err(StringError::Nul { at });
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(e) => Err(StringError::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        }),
    }
}

/// Truncates a message to the string limit on a character boundary, for
/// messages the server itself composes.
pub fn clamp_message(msg: &str) -> &str {
    if msg.len() <= STRING_BYTES_MAX {
        return msg;
    }
    let mut end = STRING_BYTES_MAX;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    &msg[..end]
}

pub fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Length of a byte string as a 32-bit wire field. Callers only pass strings
/// already clamped to the string limit or buffers bounded by the payload limit,
/// so saturation never happens in practice; it keeps the encoder total.
pub fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_never_reads_past_end() {
        let mut c = Cursor::new(&[1, 2, 3]);
        assert_eq!(c.u16(), Some(0x0102));
        assert_eq!(c.u16(), None);
        assert_eq!(c.remaining(), 1);
        assert_eq!(c.bytes(usize::MAX), None);
        assert_eq!(c.rest(), &[3]);
        assert_eq!(c.u32(), None);
    }

    #[test]
    fn string_rules() {
        assert_eq!(protocol_string(b"disk0").as_deref(), Ok("disk0"));
        assert_eq!(protocol_string(b"a\0b"), Err(StringError::Nul { at: 1 }));
        assert_eq!(
            protocol_string(&[0x61, 0xff]),
            Err(StringError::NotUtf8 { valid_up_to: 1 })
        );
        let long = vec![b'x'; STRING_BYTES_MAX + 1];
        assert_eq!(
            protocol_string(&long),
            Err(StringError::TooLong {
                len: STRING_BYTES_MAX + 1
            })
        );
        assert!(protocol_string(&long[..STRING_BYTES_MAX]).is_ok());
    }

    #[test]
    fn clamp_keeps_char_boundary() {
        let s = "é".repeat(STRING_BYTES_MAX);
        let c = clamp_message(&s);
        assert!(c.len() <= STRING_BYTES_MAX);
        assert!(s.is_char_boundary(c.len()));
        assert_eq!(clamp_message("short"), "short");
    }
}
