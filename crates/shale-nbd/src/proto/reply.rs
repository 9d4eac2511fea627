//! Transmission replies: the simple reply and structured reply chunks.
//!
//! ```text
//! simple:     NBD_SIMPLE_REPLY_MAGIC (u32) error (u32) cookie (u64) [read data]
//! structured: NBD_STRUCTURED_REPLY_MAGIC (u32) flags (u16) type (u16) cookie (u64) length (u32) payload
//! ```
//!
//! Encoders write into a caller's buffer; read data can be sent after
//! [`offset_data_prefix`] without copying it. Decoders (the client side) check
//! every length rule of the spec.

use super::consts::*;
use super::wire::{
    clamp_message, len32, protocol_string, put_u16, put_u32, put_u64, Cursor, StringError,
};

pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
pub const CHUNK_HEADER_BYTES: usize = 20;
/// Chunk header plus the 8-byte offset of an OFFSET_DATA chunk.
pub const OFFSET_DATA_PREFIX_BYTES: usize = CHUNK_HEADER_BYTES + 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
        let mut out = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        out[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..].copy_from_slice(&self.cookie.to_be_bytes());
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub length: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_BYTES] {
        let mut out = [0u8; CHUNK_HEADER_BYTES];
        out[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    pub fn done(&self) -> bool {
        self.flags & REPLY_FLAG_DONE != 0
    }
}

/// Either reply header, as a client reads it off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple(SimpleReply),
    Chunk(ChunkHeader),
}

impl ReplyHeader {
    /// Bytes a header starting with `magic` occupies.
    pub fn bytes_for_magic(magic: u32) -> Option<usize> {
        match magic {
            SIMPLE_REPLY_MAGIC => Some(SIMPLE_REPLY_HEADER_BYTES),
            STRUCTURED_REPLY_MAGIC => Some(CHUNK_HEADER_BYTES),
            _ => None,
        }
    }

    pub fn decode(buf: &[u8]) -> Result<ReplyHeader, ChunkError> {
        let mut c = Cursor::new(buf);
        let magic = c.u32().ok_or(ChunkError::Truncated { have: buf.len() })?;
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let (Some(error), Some(cookie)) = (c.u32(), c.u64()) else {
                    return Err(ChunkError::Truncated { have: buf.len() });
                };
                Ok(ReplyHeader::Simple(SimpleReply { error, cookie }))
            }
            STRUCTURED_REPLY_MAGIC => {
                let (Some(flags), Some(kind), Some(cookie), Some(length)) =
                    (c.u16(), c.u16(), c.u64(), c.u32())
                else {
                    return Err(ChunkError::Truncated { have: buf.len() });
                };
                Ok(ReplyHeader::Chunk(ChunkHeader {
                    flags,
                    kind,
                    cookie,
                    length,
                }))
            }
            got => Err(ChunkError::BadMagic { got }),
        }
    }
}

/// One `base:allocation` (or other context) descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    pub flags: u32,
}

/// A structured reply chunk's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    None,
    OffsetData {
        offset: u64,
        data: Vec<u8>,
    },
    OffsetHole {
        offset: u64,
        size: u32,
    },
    BlockStatus {
        context_id: u32,
        extents: Vec<Extent>,
    },
    Error {
        error: u32,
        message: String,
    },
    ErrorOffset {
        error: u32,
        message: String,
        offset: u64,
    },
    /// An error chunk of a type this side does not know: still an error.
    UnknownError {
        kind: u16,
        error: u32,
        message: String,
    },
}

impl Chunk {
    pub fn kind(&self) -> u16 {
        match self {
            Chunk::None => REPLY_TYPE_NONE,
            Chunk::OffsetData { .. } => REPLY_TYPE_OFFSET_DATA,
            Chunk::OffsetHole { .. } => REPLY_TYPE_OFFSET_HOLE,
            Chunk::BlockStatus { .. } => REPLY_TYPE_BLOCK_STATUS,
            Chunk::Error { .. } => REPLY_TYPE_ERROR,
            Chunk::ErrorOffset { .. } => REPLY_TYPE_ERROR_OFFSET,
            Chunk::UnknownError { kind, .. } => *kind,
        }
    }

    /// Encodes header and payload. `done` marks the final chunk of a reply
    /// (always set for `None`, as the spec requires).
    pub fn encode(&self, cookie: u64, done: bool, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        let err_prefix = |p: &mut Vec<u8>, error: u32, message: &str| {
            let m = clamp_message(message);
            put_u32(p, error);
            put_u16(p, u16::try_from(m.len()).unwrap_or(u16::MAX));
            p.extend_from_slice(m.as_bytes());
        };
        match self {
            Chunk::None => {}
            Chunk::OffsetData { offset, data } => {
                put_u64(&mut p, *offset);
                p.extend_from_slice(data);
            }
            Chunk::OffsetHole { offset, size } => {
                put_u64(&mut p, *offset);
                put_u32(&mut p, *size);
            }
            Chunk::BlockStatus {
                context_id,
                extents,
            } => {
                put_u32(&mut p, *context_id);
                for e in extents {
                    put_u32(&mut p, e.length);
                    put_u32(&mut p, e.flags);
                }
            }
            Chunk::Error { error, message } => err_prefix(&mut p, *error, message),
            Chunk::ErrorOffset {
                error,
                message,
                offset,
            } => {
                err_prefix(&mut p, *error, message);
                put_u64(&mut p, *offset);
            }
            Chunk::UnknownError { error, message, .. } => err_prefix(&mut p, *error, message),
        }
        let done = done || matches!(self, Chunk::None);
        let h = ChunkHeader {
            flags: if done { REPLY_FLAG_DONE } else { 0 },
            kind: self.kind(),
            cookie,
            length: len32(p.len()),
        };
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(&p);
    }

    /// Decodes a chunk's payload, enforcing the spec's length rules.
    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    pub fn decode(h: &ChunkHeader, payload: &[u8]) -> Result<Chunk, ChunkError> {
        let kind = h.kind;
        let len = payload.len();
        if len != h.length as usize {
            return Err(ChunkError::LengthMismatch {
                kind,
                header: h.length,
                payload: len,
            });
        }
        let bad = ChunkError::BadLength { kind, len };
        let mut c = Cursor::new(payload);
        let s =
            |b: &[u8]| protocol_string(b).map_err(|source| ChunkError::BadMessage { kind, source });
        let err_fields = |c: &mut Cursor<'_>| -> Result<(u32, String), ChunkError> {
            let (Some(error), Some(mlen)) = (c.u32(), c.u16()) else {
                return Err(ChunkError::BadLength { kind, len });
            };
            if error == 0 {
                return Err(ChunkError::ZeroError { kind });
            }
            let m = c
                .bytes(usize::from(mlen))
                .ok_or(ChunkError::MessageOverrun {
                    kind,
                    message: mlen,
                    len,
                })?;
            Ok((error, s(m)?))
        };
        let chunk = match kind {
            REPLY_TYPE_NONE => {
                if len != 0 {
                    return Err(bad);
                }
                if !h.done() {
                    return Err(ChunkError::NoneWithoutDone);
                }
                Chunk::None
            }
            REPLY_TYPE_OFFSET_DATA => {
                if len < 9 {
                    return Err(bad);
                }
                let offset = c.u64().ok_or(bad)?;
                Chunk::OffsetData {
                    offset,
                    data: c.rest().to_vec(),
                }
            }
            REPLY_TYPE_OFFSET_HOLE => {
                if len != 12 {
                    return Err(bad);
                }
                let (Some(offset), Some(size)) = (c.u64(), c.u32()) else {
                    return Err(bad);
                };
                if size == 0 {
                    return Err(ChunkError::ZeroLengthHole { offset });
                }
                Chunk::OffsetHole { offset, size }
            }
            REPLY_TYPE_BLOCK_STATUS => {
                if len < 12 || !(len - 4).is_multiple_of(8) {
                    return Err(bad);
                }
                let context_id = c.u32().ok_or(bad)?;
                let mut extents = Vec::with_capacity((len - 4) / 8);
                while let (Some(length), Some(flags)) = (c.u32(), c.u32()) {
                    if length == 0 {
                        return Err(ChunkError::ZeroLengthExtent {
                            index: extents.len(),
                        });
                    }
                    extents.push(Extent { length, flags });
                }
                Chunk::BlockStatus {
                    context_id,
                    extents,
                }
            }
            REPLY_TYPE_ERROR => {
                let (error, message) = err_fields(&mut c)?;
                if c.remaining() != 0 {
                    return Err(bad);
                }
                Chunk::Error { error, message }
            }
            REPLY_TYPE_ERROR_OFFSET => {
                let (error, message) = err_fields(&mut c)?;
                let offset = c.u64().ok_or(bad.clone())?;
                if c.remaining() != 0 {
                    return Err(bad);
                }
                Chunk::ErrorOffset {
                    error,
                    message,
                    offset,
                }
            }
            k if k & REPLY_TYPE_FLAG_ERROR != 0 => {
                let (error, message) = err_fields(&mut c)?;
                Chunk::UnknownError {
                    kind: k,
                    error,
                    message,
                }
            }
            k => return Err(ChunkError::UnknownType { kind: k }),
        };
        Ok(chunk)
    }
}

/// Header and offset of an OFFSET_DATA chunk whose `data_len` bytes of data
/// the caller sends next, straight from its buffer.
pub fn offset_data_prefix(
    cookie: u64,
    done: bool,
    offset: u64,
    data_len: u32,
) -> [u8; OFFSET_DATA_PREFIX_BYTES] {
    let mut out = [0u8; OFFSET_DATA_PREFIX_BYTES];
    let h = ChunkHeader {
        flags: if done { REPLY_FLAG_DONE } else { 0 },
        kind: REPLY_TYPE_OFFSET_DATA,
        cookie,
        length: data_len.saturating_add(8),
    };
    out[..CHUNK_HEADER_BYTES].copy_from_slice(&h.encode());
    out[CHUNK_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    out
}

/// Why a reply could not be decoded (client side).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("reply header truncated ({have} bytes)")]
    Truncated { have: usize },
    #[error("reply magic {got:#010x} unknown")]
    BadMagic { got: u32 },
    #[error("chunk type {kind}: header says {header} bytes, payload has {payload}")]
    LengthMismatch {
        kind: u16,
        header: u32,
        payload: usize,
    },
    #[error("chunk type {kind}: invalid payload length {len}")]
    BadLength { kind: u16, len: usize },
    #[error("NBD_REPLY_TYPE_NONE without NBD_REPLY_FLAG_DONE")]
    NoneWithoutDone,
    #[error("hole at offset {offset} has zero size")]
    ZeroLengthHole { offset: u64 },
    #[error("block status descriptor {index} has zero length")]
    ZeroLengthExtent { index: usize },
    #[error("error chunk type {kind} with error value 0")]
    ZeroError { kind: u16 },
    #[error("error chunk type {kind}: message length {message} overruns payload of {len}")]
    MessageOverrun { kind: u16, message: u16, len: usize },
    #[error("error chunk type {kind}: message: {source}")]
    BadMessage { kind: u16, source: StringError },
    #[error("unknown non-error chunk type {kind}")]
    UnknownType { kind: u16 },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round(chunk: &Chunk, cookie: u64, done: bool) -> (ChunkHeader, Result<Chunk, ChunkError>) {
        let mut buf = Vec::new();
        chunk.encode(cookie, done, &mut buf);
        let ReplyHeader::Chunk(h) = ReplyHeader::decode(&buf).expect("header") else {
            panic!("not a chunk header");
        };
        (h, Chunk::decode(&h, &buf[CHUNK_HEADER_BYTES..]))
    }

    #[test]
    fn simple_reply_layout() {
        let b = SimpleReply {
            error: NBD_EINVAL,
            cookie: 0x0102_0304_0506_0708,
        }
        .encode();
        assert_eq!(&b[..4], &[0x67, 0x44, 0x66, 0x98]);
        assert_eq!(&b[4..8], &[0, 0, 0, 22]);
        assert_eq!(
            ReplyHeader::decode(&b),
            Ok(ReplyHeader::Simple(SimpleReply {
                error: 22,
                cookie: 0x0102_0304_0506_0708
            }))
        );
    }

    #[test]
    fn none_always_done() {
        let (h, c) = round(&Chunk::None, 1, false);
        assert!(h.done());
        assert_eq!(c, Ok(Chunk::None));
        let h2 = ChunkHeader {
            flags: 0,
            kind: REPLY_TYPE_NONE,
            cookie: 1,
            length: 0,
        };
        assert_eq!(Chunk::decode(&h2, &[]), Err(ChunkError::NoneWithoutDone));
    }

    #[test]
    fn offset_data_prefix_matches_encoder() {
        let data = vec![9u8; 100];
        let mut full = Vec::new();
        Chunk::OffsetData {
            offset: 4096,
            data: data.clone(),
        }
        .encode(5, true, &mut full);
        let mut split = offset_data_prefix(5, true, 4096, 100).to_vec();
        split.extend_from_slice(&data);
        assert_eq!(full, split);
    }

    #[test]
    fn malformed_chunks_rejected() {
        let h = |kind, length| ChunkHeader {
            flags: REPLY_FLAG_DONE,
            kind,
            cookie: 0,
            length,
        };
        assert!(Chunk::decode(&h(REPLY_TYPE_OFFSET_DATA, 8), &[0; 8]).is_err());
        assert!(Chunk::decode(&h(REPLY_TYPE_OFFSET_HOLE, 11), &[0; 11]).is_err());
        assert_eq!(
            Chunk::decode(&h(REPLY_TYPE_OFFSET_HOLE, 12), &[0; 12]),
            Err(ChunkError::ZeroLengthHole { offset: 0 })
        );
        assert!(Chunk::decode(&h(REPLY_TYPE_BLOCK_STATUS, 4), &[0; 4]).is_err());
        assert!(Chunk::decode(&h(REPLY_TYPE_BLOCK_STATUS, 13), &[0; 13]).is_err());
        assert_eq!(
            Chunk::decode(&h(REPLY_TYPE_BLOCK_STATUS, 12), &[0; 12]),
            Err(ChunkError::ZeroLengthExtent { index: 0 })
        );
        assert_eq!(
            Chunk::decode(&h(REPLY_TYPE_ERROR, 6), &[0; 6]),
            Err(ChunkError::ZeroError {
                kind: REPLY_TYPE_ERROR
            })
        );
        assert!(matches!(
            Chunk::decode(&h(REPLY_TYPE_ERROR, 6), &[0, 0, 0, 5, 0, 1]),
            Err(ChunkError::MessageOverrun { .. })
        ));
        assert!(Chunk::decode(&h(REPLY_TYPE_ERROR_OFFSET, 6), &[0, 0, 0, 5, 0, 0]).is_err());
        assert_eq!(
            Chunk::decode(&h(77, 0), &[]),
            Err(ChunkError::UnknownType { kind: 77 })
        );
        assert_eq!(
            Chunk::decode(&h(REPLY_TYPE_FLAG_ERROR | 9, 6), &[0, 0, 0, 5, 0, 0]),
            Ok(Chunk::UnknownError {
                kind: REPLY_TYPE_FLAG_ERROR | 9,
                error: 5,
                message: String::new()
            })
        );
        assert!(matches!(
            Chunk::decode(&h(REPLY_TYPE_NONE, 1), &[]),
            Err(ChunkError::LengthMismatch { .. })
        ));
    }

    fn arb_chunk() -> impl Strategy<Value = Chunk> {
        prop_oneof![
            Just(Chunk::None),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 1..64))
                .prop_map(|(offset, data)| Chunk::OffsetData { offset, data }),
            (any::<u64>(), 1u32..).prop_map(|(offset, size)| Chunk::OffsetHole { offset, size }),
            (
                any::<u32>(),
                proptest::collection::vec((1u32.., any::<u32>()), 1..16)
            )
                .prop_map(|(context_id, e)| Chunk::BlockStatus {
                    context_id,
                    extents: e
                        .into_iter()
                        .map(|(length, flags)| Extent { length, flags })
                        .collect()
                }),
            (1u32.., "[ -~]{0,32}").prop_map(|(error, message)| Chunk::Error { error, message }),
            (1u32.., "[ -~]{0,32}", any::<u64>()).prop_map(|(error, message, offset)| {
                Chunk::ErrorOffset {
                    error,
                    message,
                    offset,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn chunk_round_trip(chunk in arb_chunk(), cookie: u64, done: bool) {
            let (h, back) = round(&chunk, cookie, done);
            prop_assert_eq!(h.cookie, cookie);
            prop_assert_eq!(back, Ok(chunk));
        }

        #[test]
        fn simple_round_trip(error: u32, cookie: u64) {
            let r = SimpleReply { error, cookie };
            prop_assert_eq!(ReplyHeader::decode(&r.encode()), Ok(ReplyHeader::Simple(r)));
        }

        #[test]
        fn decoders_never_panic(flags: u16, kind: u16, bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = ReplyHeader::decode(&bytes);
            let h = ChunkHeader { flags, kind, cookie: 0, length: len32(bytes.len()) };
            let _ = Chunk::decode(&h, &bytes);
        }
    }
}
