//! Transmission requests: the 28-byte header and the judgement of a request
//! against the negotiated session (flags, range, size limits).
//!
//! ```text
//! C: NBD_REQUEST_MAGIC (u32) flags (u16) type (u16) cookie (u64) offset (u64) length (u32)
//! C: length bytes of data, for NBD_CMD_WRITE only
//! ```
//!
//! [`judge`] is pure: it returns how many payload bytes follow the header (so
//! the connection stays in step even for refused writes) and either a
//! [`Command`] to execute or a [`Refusal`] carrying the error to reply with.

use super::consts::*;
use super::wire::Cursor;

/// Bytes of a request header.
pub const REQUEST_HEADER_BYTES: usize = 28;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Errors in a request header. All are fatal: without a valid header the
/// stream cannot be resynchronised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestHeaderError {
    #[error("request header truncated: {have} of {REQUEST_HEADER_BYTES} bytes")]
    Truncated { have: usize },
    #[error("request magic {got:#010x}, expected {REQUEST_MAGIC:#010x}")]
    BadMagic { got: u32 },
    #[error("extended request header sent, but extended headers were not negotiated")]
    ExtendedNotNegotiated,
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<RequestHeader, RequestHeaderError> {
        let mut c = Cursor::new(buf);
        let (Some(magic), Some(flags), Some(kind), Some(cookie), Some(offset), Some(length)) =
            (c.u32(), c.u16(), c.u16(), c.u64(), c.u64(), c.u32())
        else {
            return Err(RequestHeaderError::Truncated { have: buf.len() });
        };
        match magic {
            REQUEST_MAGIC => Ok(RequestHeader {
                flags,
                kind,
                cookie,
                offset,
                length,
            }),
            EXTENDED_REQUEST_MAGIC => Err(RequestHeaderError::ExtendedNotNegotiated),
            got => Err(RequestHeaderError::BadMagic { got }),
        }
    }
}

/// What the server agreed with the client, as far as judging requests goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionView {
    pub export_size_bytes: u64,
    /// Transmission flags as sent to the client.
    pub transmission_flags: u16,
    pub structured_replies: bool,
    /// Id of the selected `base:allocation` context, if any.
    pub base_allocation: Option<u32>,
    /// Largest READ/WRITE payload accepted.
    pub payload_bytes_max: u32,
}

impl SessionView {
    fn has(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }
}

/// A request that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
        df: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Disconnect,
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    /// A hint; answered with success without touching the backend.
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        no_hole: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
}

/// Why a well-formed request is refused; the connection goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefusalCause {
    #[error("unknown command type {kind}")]
    UnknownCommand { kind: u16 },
    #[error("command {kind}: flags {flags:#x} not valid here (allowed {allowed:#x})")]
    BadFlags { kind: u16, flags: u16, allowed: u16 },
    #[error("command {kind} was not negotiated")]
    NotNegotiated { kind: u16 },
    #[error("command {kind} on a read-only export")]
    ReadOnly { kind: u16 },
    #[error("command {kind}: offset {offset} length {length} beyond export size {size}")]
    OutOfRange {
        kind: u16,
        offset: u64,
        length: u32,
        size: u64,
    },
    #[error("command {kind}: length {length} exceeds maximum payload {max}")]
    TooLarge { kind: u16, length: u32, max: u32 },
    #[error("command {kind}: reserved offset {offset} / length {length} must be zero")]
    ReservedNotZero { kind: u16, offset: u64, length: u32 },
}

/// A refused request and the NBD error to reply with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: u32,
    pub cause: RefusalCause,
}

/// The outcome of judging a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// Data bytes that follow the header and must be read (NBD_CMD_WRITE).
    pub payload_bytes: u32,
    pub verdict: Result<Command, Refusal>,
}

/// A request the connection cannot survive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FatalRequest {
    /// A write payload above the limit would have to be read and discarded;
    /// the spec lets the server disconnect instead.
    #[error("write of {length} bytes exceeds maximum payload {max}; closing")]
    WritePayloadTooLarge { length: u32, max: u32 },
}

/// Flags each command may carry in this session.
fn allowed_flags(kind: u16, s: &SessionView) -> u16 {
    let mut allowed = 0;
    if s.has(FLAG_SEND_FUA) {
        allowed |= CMD_FLAG_FUA;
    }
    match kind {
        CMD_READ if s.has(FLAG_SEND_DF) => allowed | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => {
            let mut a = allowed | CMD_FLAG_NO_HOLE;
            if s.has(FLAG_SEND_FAST_ZERO) {
                a |= CMD_FLAG_FAST_ZERO;
            }
            a
        }
        CMD_BLOCK_STATUS => allowed | CMD_FLAG_REQ_ONE,
        _ => allowed,
    }
}

fn refuse(error: u32, cause: RefusalCause) -> Result<Command, Refusal> {
    Err(Refusal { error, cause })
}

/// Judges one request header against the session.
pub fn judge(h: &RequestHeader, s: &SessionView) -> Result<Judged, FatalRequest> {
    let payload_bytes = if h.kind == CMD_WRITE {
        if h.length > s.payload_bytes_max {
            return Err(FatalRequest::WritePayloadTooLarge {
                length: h.length,
                max: s.payload_bytes_max,
            });
        }
        h.length
    } else {
        0
    };
    Ok(Judged {
        payload_bytes,
        verdict: verdict(h, s),
    })
}

#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
fn verdict(h: &RequestHeader, s: &SessionView) -> Result<Command, Refusal> {
    let kind = h.kind;
    let known = matches!(
        kind,
        CMD_READ
            | CMD_WRITE
            | CMD_DISC
            | CMD_FLUSH
            | CMD_TRIM
            | CMD_CACHE
            | CMD_WRITE_ZEROES
            | CMD_BLOCK_STATUS
    );
    if !known {
        return refuse(NBD_EINVAL, RefusalCause::UnknownCommand { kind });
    }
    if kind == CMD_DISC {
        // Nothing to refuse: the client will send nothing more either way.
        return Ok(Command::Disconnect);
    }
    let allowed = allowed_flags(kind, s);
    if h.flags & !allowed != 0 {
        return refuse(
            NBD_EINVAL,
            RefusalCause::BadFlags {
                kind,
                flags: h.flags,
                allowed,
            },
        );
    }
    let negotiated = match kind {
        CMD_FLUSH => s.has(FLAG_SEND_FLUSH),
        CMD_TRIM => s.has(FLAG_SEND_TRIM),
        CMD_WRITE_ZEROES => s.has(FLAG_SEND_WRITE_ZEROES),
        CMD_CACHE => s.has(FLAG_SEND_CACHE),
        CMD_BLOCK_STATUS => s.structured_replies && s.base_allocation.is_some(),
        _ => true,
    };
    if !negotiated {
        return refuse(NBD_EINVAL, RefusalCause::NotNegotiated { kind });
    }
    let writes = matches!(kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && s.has(FLAG_READ_ONLY) {
        return refuse(NBD_EPERM, RefusalCause::ReadOnly { kind });
    }
    if kind == CMD_FLUSH {
        if h.offset != 0 || h.length != 0 {
            return refuse(
                NBD_EINVAL,
                RefusalCause::ReservedNotZero {
                    kind,
                    offset: h.offset,
                    length: h.length,
                },
            );
        }
        return Ok(Command::Flush);
    }
    let in_range = h
        .offset
        .checked_add(u64::from(h.length))
        .is_some_and(|end| end <= s.export_size_bytes);
    if !in_range {
        // Writes past the end are "no space"; everything else is invalid.
        let error = if matches!(kind, CMD_WRITE | CMD_WRITE_ZEROES) {
            NBD_ENOSPC
        } else {
            NBD_EINVAL
        };
        return refuse(
            error,
            RefusalCause::OutOfRange {
                kind,
                offset: h.offset,
                length: h.length,
                size: s.export_size_bytes,
            },
        );
    }
    if kind == CMD_READ && h.length > s.payload_bytes_max {
        // Structured replies may reject large reads up front with EOVERFLOW;
        // simple replies can only fail.
        let error = if s.structured_replies {
            NBD_EOVERFLOW
        } else {
            NBD_EINVAL
        };
        return refuse(
            error,
            RefusalCause::TooLarge {
                kind,
                length: h.length,
                max: s.payload_bytes_max,
            },
        );
    }
    let fua = h.flags & CMD_FLAG_FUA != 0;
    let (offset, length) = (h.offset, h.length);
    Ok(match kind {
        CMD_READ => Command::Read {
            offset,
            length,
            df: h.flags & CMD_FLAG_DF != 0,
        },
        CMD_WRITE => Command::Write {
            offset,
            length,
            fua,
        },
        CMD_TRIM => Command::Trim {
            offset,
            length,
            fua,
        },
        CMD_CACHE => Command::Cache { offset, length },
        CMD_WRITE_ZEROES => {
            if h.flags & CMD_FLAG_FAST_ZERO != 0 {
                // Only reachable if FAST_ZERO was advertised; this server
                // cannot promise speed in advance, which the spec answers
                // with a quick ENOTSUP.
                return refuse(NBD_ENOTSUP, RefusalCause::NotNegotiated { kind });
            }
            Command::WriteZeroes {
                offset,
                length,
                fua,
                no_hole: h.flags & CMD_FLAG_NO_HOLE != 0,
            }
        }
        CMD_BLOCK_STATUS => Command::BlockStatus {
            offset,
            length,
            req_one: h.flags & CMD_FLAG_REQ_ONE != 0,
        },
        _ => return refuse(NBD_EINVAL, RefusalCause::UnknownCommand { kind }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: u16 = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_DF
        | FLAG_SEND_CACHE;

    fn session() -> SessionView {
        SessionView {
            export_size_bytes: 1 << 20,
            transmission_flags: ALL,
            structured_replies: true,
            base_allocation: Some(1),
            payload_bytes_max: 1 << 16,
        }
    }

    fn hdr(kind: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            cookie: 7,
            offset,
            length,
        }
    }

    fn err_of(h: RequestHeader, s: &SessionView) -> u32 {
        judge(&h, s)
            .expect("not fatal")
            .verdict
            .expect_err("refused")
            .error
    }

    #[test]
    fn header_layout_and_magic() {
        let h = hdr(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        let b = h.encode();
        assert_eq!(&b[..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(RequestHeader::decode(&b), Ok(h));
        let mut bad = b;
        bad[0] = 0;
        assert!(matches!(
            RequestHeader::decode(&bad),
            Err(RequestHeaderError::BadMagic { .. })
        ));
        bad[..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        assert_eq!(
            RequestHeader::decode(&bad),
            Err(RequestHeaderError::ExtendedNotNegotiated)
        );
        assert_eq!(
            RequestHeader::decode(&b[..27]),
            Err(RequestHeaderError::Truncated { have: 27 })
        );
    }

    #[test]
    fn valid_commands() {
        let s = session();
        let j = judge(&hdr(CMD_WRITE, CMD_FLAG_FUA, 0, 4096), &s).expect("ok");
        assert_eq!(j.payload_bytes, 4096);
        assert_eq!(
            j.verdict,
            Ok(Command::Write {
                offset: 0,
                length: 4096,
                fua: true
            })
        );
        assert_eq!(
            judge(&hdr(CMD_READ, CMD_FLAG_DF, 100, 3), &s)
                .expect("ok")
                .verdict,
            Ok(Command::Read {
                offset: 100,
                length: 3,
                df: true
            })
        );
        assert_eq!(
            judge(&hdr(CMD_FLUSH, 0, 0, 0), &s).expect("ok").verdict,
            Ok(Command::Flush)
        );
        assert_eq!(
            judge(&hdr(CMD_DISC, 0, 0, 0), &s).expect("ok").verdict,
            Ok(Command::Disconnect)
        );
        assert_eq!(
            judge(&hdr(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 1 << 20), &s)
                .expect("ok")
                .verdict,
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 1 << 20,
                fua: false,
                no_hole: true
            })
        );
        // Trim and write-zeroes carry no payload, so they may exceed the payload limit.
        assert!(judge(&hdr(CMD_TRIM, 0, 0, 1 << 20), &s)
            .expect("ok")
            .verdict
            .is_ok());
        assert_eq!(
            judge(&hdr(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20), &s)
                .expect("ok")
                .verdict,
            Ok(Command::BlockStatus {
                offset: 0,
                length: 1 << 20,
                req_one: true
            })
        );
        // A zero-length request at the very end is in range.
        assert!(judge(&hdr(CMD_READ, 0, 1 << 20, 0), &s)
            .expect("ok")
            .verdict
            .is_ok());
    }

    #[test]
    fn refusals_carry_spec_errors() {
        let s = session();
        assert_eq!(err_of(hdr(42, 0, 0, 0), &s), NBD_EINVAL);
        assert_eq!(err_of(hdr(CMD_READ, 0x8000, 0, 1), &s), NBD_EINVAL);
        assert_eq!(
            err_of(hdr(CMD_READ, CMD_FLAG_REQ_ONE, 0, 1), &s),
            NBD_EINVAL
        );
        assert_eq!(
            err_of(hdr(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 1), &s),
            NBD_EINVAL
        );
        assert_eq!(err_of(hdr(CMD_READ, 0, (1 << 20) - 1, 2), &s), NBD_EINVAL);
        assert_eq!(err_of(hdr(CMD_WRITE, 0, 1 << 20, 1), &s), NBD_ENOSPC);
        assert_eq!(
            err_of(hdr(CMD_WRITE_ZEROES, 0, u64::MAX, 1), &s),
            NBD_ENOSPC
        );
        assert_eq!(err_of(hdr(CMD_TRIM, 0, 1 << 20, 1), &s), NBD_EINVAL);
        assert_eq!(err_of(hdr(CMD_BLOCK_STATUS, 0, 1 << 20, 1), &s), NBD_EINVAL);
        assert_eq!(err_of(hdr(CMD_FLUSH, 0, 1, 0), &s), NBD_EINVAL);
        assert_eq!(
            err_of(hdr(CMD_READ, 0, 0, (1 << 16) + 1), &s),
            NBD_EOVERFLOW
        );
        let simple = SessionView {
            structured_replies: false,
            transmission_flags: ALL & !FLAG_SEND_DF,
            ..s
        };
        assert_eq!(
            err_of(hdr(CMD_READ, 0, 0, (1 << 16) + 1), &simple),
            NBD_EINVAL
        );
        assert_eq!(err_of(hdr(CMD_BLOCK_STATUS, 0, 0, 1), &simple), NBD_EINVAL);
        assert_eq!(
            err_of(hdr(CMD_READ, CMD_FLAG_DF, 0, 1), &simple),
            NBD_EINVAL
        );
        let ro = SessionView {
            transmission_flags: ALL | FLAG_READ_ONLY,
            ..s
        };
        assert_eq!(err_of(hdr(CMD_WRITE, 0, 0, 1), &ro), NBD_EPERM);
        assert_eq!(err_of(hdr(CMD_TRIM, 0, 0, 1), &ro), NBD_EPERM);
        let bare = SessionView {
            transmission_flags: FLAG_HAS_FLAGS,
            ..s
        };
        assert_eq!(err_of(hdr(CMD_FLUSH, 0, 0, 0), &bare), NBD_EINVAL);
        assert_eq!(err_of(hdr(CMD_TRIM, 0, 0, 1), &bare), NBD_EINVAL);
        assert_eq!(
            err_of(hdr(CMD_WRITE, CMD_FLAG_FUA, 0, 1), &bare),
            NBD_EINVAL
        );
        assert_eq!(err_of(hdr(CMD_WRITE_ZEROES, 0, 0, 1), &bare), NBD_EINVAL);
        assert_eq!(
            err_of(hdr(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1), &s),
            NBD_EINVAL
        );
    }

    #[test]
    fn refused_write_still_consumes_payload() {
        let s = session();
        let j = judge(&hdr(CMD_WRITE, 0x4000, 0, 512), &s).expect("not fatal");
        assert_eq!(j.payload_bytes, 512);
        assert!(j.verdict.is_err());
        assert_eq!(
            judge(&hdr(CMD_WRITE, 0, 0, (1 << 16) + 1), &s),
            Err(FatalRequest::WritePayloadTooLarge {
                length: (1 << 16) + 1,
                max: 1 << 16
            })
        );
    }

    proptest! {
        #[test]
        fn header_round_trip(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32) {
            let h = RequestHeader { flags, kind, cookie, offset, length };
            prop_assert_eq!(RequestHeader::decode(&h.encode()), Ok(h));
        }

        /// Whatever the header, an accepted command lies inside the export and
        /// only writes carry payload.
        #[test]
        fn accepted_commands_are_in_range(flags: u16, kind in 0u16..12, offset: u64, length: u32,
                                          size in 0u64..(1 << 40), structured: bool, tflags: u16) {
            let s = SessionView {
                export_size_bytes: size,
                transmission_flags: tflags | FLAG_HAS_FLAGS,
                structured_replies: structured,
                base_allocation: if structured { Some(1) } else { None },
                payload_bytes_max: 1 << 25,
            };
            let h = RequestHeader { flags, kind, cookie: 0, offset, length };
            match judge(&h, &s) {
                Err(FatalRequest::WritePayloadTooLarge { .. }) => prop_assert!(kind == CMD_WRITE && length > 1 << 25),
                Ok(j) => {
                    prop_assert_eq!(j.payload_bytes != 0, kind == CMD_WRITE && length != 0);
                    if let Ok(cmd) = j.verdict {
                        if !matches!(cmd, Command::Disconnect | Command::Flush) {
                            prop_assert!(offset.checked_add(u64::from(length)).is_some_and(|e| e <= size));
                        }
                        if matches!(cmd, Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }) {
                            prop_assert!(tflags & FLAG_READ_ONLY == 0);
                        }
                    }
                }
            }
        }
    }
}
