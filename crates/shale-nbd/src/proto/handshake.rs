//! Fixed-length messages of the fixed-newstyle handshake: the server greeting,
//! the client flags, option request and reply headers, and the reply that ends
//! `NBD_OPT_EXPORT_NAME`.
//!
//! ```text
//! S: NBDMAGIC (u64) IHAVEOPT (u64) handshake flags (u16)
//! C: client flags (u32)
//! C: IHAVEOPT (u64) option (u32) length (u32) data[length]      -- repeated
//! S: OPTION_REPLY_MAGIC (u64) option (u32) type (u32) length (u32) data[length]
//! ```

use super::consts::*;
use super::wire::Cursor;

/// Bytes of the server greeting.
pub const GREETING_BYTES: usize = 18;
/// Bytes of the client flags.
pub const CLIENT_FLAGS_BYTES: usize = 4;
/// Bytes of an option request header.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of an option reply header.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;

/// Errors in the fixed-length handshake messages. All are fatal: the spec
/// leaves no way to resynchronise, so the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("{what}: truncated, need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{what}: bad magic {got:#x}, expected {expected:#x}")]
    BadMagic {
        what: &'static str,
        got: u64,
        expected: u64,
    },
    #[error("client flags {flags:#x} set bits the server does not know or did not offer (offered {offered:#x})")]
    UnknownClientFlags { flags: u32, offered: u16 },
}

/// The server's first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    pub handshake_flags: u16,
}

impl Greeting {
    /// What this server offers: fixed newstyle and no zero padding.
    pub const SERVER: Greeting = Greeting {
        handshake_flags: FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES,
    };

    pub fn encode(&self) -> [u8; GREETING_BYTES] {
        let mut out = [0u8; GREETING_BYTES];
        out[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        out[16..].copy_from_slice(&self.handshake_flags.to_be_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Greeting, HandshakeError> {
        let mut c = Cursor::new(buf);
        let truncated = HandshakeError::Truncated {
            what: "greeting",
            need: GREETING_BYTES,
            have: buf.len(),
        };
        let (Some(m1), Some(m2), Some(flags)) = (c.u64(), c.u64(), c.u16()) else {
            return Err(truncated);
        };
        if m1 != NBDMAGIC {
            return Err(HandshakeError::BadMagic {
                what: "greeting NBDMAGIC",
                got: m1,
                expected: NBDMAGIC,
            });
        }
        if m2 != IHAVEOPT {
            return Err(HandshakeError::BadMagic {
                what: "greeting IHAVEOPT (oldstyle servers are not supported)",
                got: m2,
                expected: IHAVEOPT,
            });
        }
        Ok(Greeting {
            handshake_flags: flags,
        })
    }
}

/// The client's flags, after checking them against what the server offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

impl ClientFlags {
    pub fn encode(&self) -> [u8; CLIENT_FLAGS_BYTES] {
        let mut v = 0u32;
        if self.fixed_newstyle {
            v |= FLAG_C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            v |= FLAG_C_NO_ZEROES;
        }
        v.to_be_bytes()
    }

    /// The server MUST drop the connection when the client sets an unknown
    /// flag or one the server did not advertise.
    pub fn decode(buf: &[u8], offered: u16) -> Result<ClientFlags, HandshakeError> {
        let flags = Cursor::new(buf).u32().ok_or(HandshakeError::Truncated {
            what: "client flags",
            need: CLIENT_FLAGS_BYTES,
            have: buf.len(),
        })?;
        let mut allowed = 0u32;
        if offered & FLAG_FIXED_NEWSTYLE != 0 {
            allowed |= FLAG_C_FIXED_NEWSTYLE;
        }
        if offered & FLAG_NO_ZEROES != 0 {
            allowed |= FLAG_C_NO_ZEROES;
        }
        if flags & !allowed != 0 {
            return Err(HandshakeError::UnknownClientFlags { flags, offered });
        }
        Ok(ClientFlags {
            fixed_newstyle: flags & FLAG_C_FIXED_NEWSTYLE != 0,
            no_zeroes: flags & FLAG_C_NO_ZEROES != 0,
        })
    }
}

/// Header of one option request; `length` bytes of data follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

impl OptionHeader {
    pub fn encode(&self) -> [u8; OPTION_HEADER_BYTES] {
        let mut out = [0u8; OPTION_HEADER_BYTES];
        out[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        out[8..12].copy_from_slice(&self.option.to_be_bytes());
        out[12..].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<OptionHeader, HandshakeError> {
        let mut c = Cursor::new(buf);
        let (Some(magic), Some(option), Some(length)) = (c.u64(), c.u32(), c.u32()) else {
            return Err(HandshakeError::Truncated {
                what: "option header",
                need: OPTION_HEADER_BYTES,
                have: buf.len(),
            });
        };
        if magic != IHAVEOPT {
            return Err(HandshakeError::BadMagic {
                what: "option header IHAVEOPT",
                got: magic,
                expected: IHAVEOPT,
            });
        }
        Ok(OptionHeader { option, length })
    }
}

/// Header of one option reply; `length` bytes of data follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

impl OptionReplyHeader {
    pub fn encode(&self) -> [u8; OPTION_REPLY_HEADER_BYTES] {
        let mut out = [0u8; OPTION_REPLY_HEADER_BYTES];
        out[..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        out[8..12].copy_from_slice(&self.option.to_be_bytes());
        out[12..16].copy_from_slice(&self.reply_type.to_be_bytes());
        out[16..].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<OptionReplyHeader, HandshakeError> {
        let mut c = Cursor::new(buf);
        let (Some(magic), Some(option), Some(reply_type), Some(length)) =
            (c.u64(), c.u32(), c.u32(), c.u32())
        else {
            return Err(HandshakeError::Truncated {
                what: "option reply header",
                need: OPTION_REPLY_HEADER_BYTES,
                have: buf.len(),
            });
        };
        if magic != OPTION_REPLY_MAGIC {
            return Err(HandshakeError::BadMagic {
                what: "option reply magic",
                got: magic,
                expected: OPTION_REPLY_MAGIC,
            });
        }
        Ok(OptionReplyHeader {
            option,
            reply_type,
            length,
        })
    }
}

/// The reply to a successful `NBD_OPT_EXPORT_NAME`: export size, transmission
/// flags and, unless NO_ZEROES was agreed, 124 bytes of zeroes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportNameReply {
    pub size_bytes: u64,
    pub transmission_flags: u16,
}

impl ExportNameReply {
    pub fn encode(&self, no_zeroes: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.size_bytes.to_be_bytes());
        out.extend_from_slice(&self.transmission_flags.to_be_bytes());
        if !no_zeroes {
            out.extend_from_slice(&[0u8; EXPORT_NAME_ZEROES_BYTES]);
        }
    }

    /// Decodes the first 10 bytes; the padding (if any) is the caller's to skip.
    pub fn decode(buf: &[u8]) -> Result<ExportNameReply, HandshakeError> {
        let mut c = Cursor::new(buf);
        let (Some(size_bytes), Some(transmission_flags)) = (c.u64(), c.u16()) else {
            return Err(HandshakeError::Truncated {
                what: "export name reply",
                need: 10,
                have: buf.len(),
            });
        };
        Ok(ExportNameReply {
            size_bytes,
            transmission_flags,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greeting_bytes_match_spec() {
        let g = Greeting::SERVER.encode();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..], &[0, 3]);
        assert_eq!(Greeting::decode(&g), Ok(Greeting::SERVER));
        assert!(matches!(
            Greeting::decode(&g[..17]),
            Err(HandshakeError::Truncated { .. })
        ));
        let mut old = g;
        old[8..16].copy_from_slice(&0x0000_4202_8186_1253_u64.to_be_bytes());
        assert!(matches!(
            Greeting::decode(&old),
            Err(HandshakeError::BadMagic { .. })
        ));
    }

    #[test]
    fn client_flags_checked_against_offer() {
        let offered = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
        assert_eq!(
            ClientFlags::decode(&[0, 0, 0, 3], offered),
            Ok(ClientFlags {
                fixed_newstyle: true,
                no_zeroes: true
            })
        );
        assert_eq!(
            ClientFlags::decode(&[0, 0, 0, 0], offered),
            Ok(ClientFlags::default())
        );
        assert!(matches!(
            ClientFlags::decode(&[0, 0, 0, 4], offered),
            Err(HandshakeError::UnknownClientFlags { flags: 4, .. })
        ));
        // NO_ZEROES is only legal when offered.
        assert!(matches!(
            ClientFlags::decode(&[0, 0, 0, 2], FLAG_FIXED_NEWSTYLE),
            Err(HandshakeError::UnknownClientFlags { .. })
        ));
        assert!(matches!(
            ClientFlags::decode(&[0, 0], offered),
            Err(HandshakeError::Truncated { .. })
        ));
    }

    #[test]
    fn option_header_magic_checked() {
        let h = OptionHeader {
            option: OPT_GO,
            length: 7,
        };
        let b = h.encode();
        assert_eq!(&b[..8], b"IHAVEOPT");
        assert_eq!(OptionHeader::decode(&b), Ok(h));
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(
            OptionHeader::decode(&bad),
            Err(HandshakeError::BadMagic { .. })
        ));
    }

    #[test]
    fn export_name_reply_padding() {
        let r = ExportNameReply {
            size_bytes: 1 << 30,
            transmission_flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
        };
        let mut with = Vec::new();
        r.encode(false, &mut with);
        assert_eq!(with.len(), 10 + EXPORT_NAME_ZEROES_BYTES);
        assert!(with[10..].iter().all(|&b| b == 0));
        let mut without = Vec::new();
        r.encode(true, &mut without);
        assert_eq!(without.len(), 10);
        assert_eq!(ExportNameReply::decode(&without), Ok(r));
    }

    proptest! {
        #[test]
        fn headers_round_trip(option: u32, length: u32, reply_type: u32, flags: u16) {
            let h = OptionHeader { option, length };
            prop_assert_eq!(OptionHeader::decode(&h.encode()), Ok(h));
            let r = OptionReplyHeader { option, reply_type, length };
            prop_assert_eq!(OptionReplyHeader::decode(&r.encode()), Ok(r));
            let g = Greeting { handshake_flags: flags };
            prop_assert_eq!(Greeting::decode(&g.encode()), Ok(g));
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40), offered: u16) {
            let _ = Greeting::decode(&bytes);
            let _ = ClientFlags::decode(&bytes, offered);
            let _ = OptionHeader::decode(&bytes);
            let _ = OptionReplyHeader::decode(&bytes);
            let _ = ExportNameReply::decode(&bytes);
        }
    }
}
