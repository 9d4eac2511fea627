//! Entry points shared by the cargo-fuzz targets (`fuzz/` at the repository
//! root) and the stable corpus-replay test (`tests/fuzz_corpus.rs`), so both
//! exercise exactly the same code. Each takes arbitrary bytes as if a
//! stranger sent them and panics only on a broken invariant.

use crate::proto::consts::*;
use crate::proto::handshake::{
    ClientFlags, Greeting, OptionHeader, OptionReplyHeader, OPTION_HEADER_BYTES,
};
use crate::proto::negotiate::{
    ExportCatalog, ExportView, Negotiation, NegotiationConfig, Step, TlsMode,
};
use crate::proto::option::{parse_option, InfoReply, OptionLimits, OptionReply};
use crate::proto::reply::{Chunk, ReplyHeader, CHUNK_HEADER_BYTES};
use crate::proto::request::{
    judge, Command, FatalRequest, RequestHeader, SessionView, REQUEST_HEADER_BYTES,
};
use crate::proto::wire::Cursor;

/// Options per input at most, so one input stays fast.
const OPTIONS_PER_INPUT_MAX: usize = 64;
/// Requests per input at most.
const REQUESTS_PER_INPUT_MAX: usize = 256;

struct FuzzCatalog(Vec<ExportView>);

impl ExportCatalog for FuzzCatalog {
    fn list(&self) -> Vec<ExportView> {
        self.0.clone()
    }
    fn lookup(&self, name: &str) -> Option<ExportView> {
        if name.is_empty() {
            return self.0.first().cloned();
        }
        self.0.iter().find(|e| e.name == name).cloned()
    }
}

fn catalog() -> FuzzCatalog {
    let e =
        |name: &str, size: u64, flags: u16, tls_only: bool, ids: Option<Vec<String>>| ExportView {
            id: crate::backend::ExportId(size),
            name: name.into(),
            description: format!("{name} export"),
            size_bytes: size,
            flags,
            block_size_min: 1,
            block_size_preferred: 4096,
            payload_bytes_max: PAYLOAD_BYTES_DEFAULT,
            tls_only,
            allowed_identities: ids,
        };
    let all =
        FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_CACHE;
    FuzzCatalog(vec![
        e("disk", 1 << 30, all, false, None),
        e("ro", 10_000, FLAG_READ_ONLY | FLAG_SEND_CACHE, false, None),
        e("secret", 1 << 20, all, true, None),
        e("fuzz", 1 << 20, all, false, Some(vec!["fuzz".into()])),
    ])
}

/// Checks that a reply the server would send decodes as the spec says.
fn check_reply(option: u32, r: &OptionReply) {
    let mut buf = Vec::new();
    r.encode(option, &mut buf);
    let h = match OptionReplyHeader::decode(&buf) {
        Ok(h) => h,
        Err(e) => panic!("server option reply header does not decode: {e}"),
    };
    assert_eq!(h.option, option);
    assert_eq!(h.length as usize + 20, buf.len(), "reply length field");
    if let Err(e) = OptionReply::decode(h.reply_type, buf.get(20..).unwrap_or(&[])) {
        panic!("server option reply {r:?} does not decode: {e}");
    }
}

/// Client bytes of a whole session: one mode byte (TLS mode), 4 bytes of
/// client flags, then option requests; if negotiation reaches transmission,
/// the rest is a request stream judged against the negotiated session.
pub fn handshake(data: &[u8]) {
    let mut c = Cursor::new(data);
    let Some(mode) = c.bytes(1).and_then(|b| b.first().copied()) else {
        return;
    };
    let tls_mode = match mode % 3 {
        0 => TlsMode::Off,
        1 => TlsMode::Optional,
        _ => TlsMode::Required,
    };
    let Some(flags) = c.bytes(4) else {
        return;
    };
    let Ok(client) = ClientFlags::decode(flags, Greeting::SERVER.handshake_flags) else {
        return;
    };
    let limits = OptionLimits::default();
    let mut neg = Negotiation::new(
        NegotiationConfig {
            tls_mode,
            tls_available: tls_mode != TlsMode::Off,
            limits,
            options_max: 32,
            payload_bytes_max: PAYLOAD_BYTES_DEFAULT,
        },
        client,
    );
    let catalog = catalog();
    for _ in 0..OPTIONS_PER_INPUT_MAX {
        let Some(hb) = c.bytes(OPTION_HEADER_BYTES) else {
            return;
        };
        let Ok(h) = OptionHeader::decode(hb) else {
            return;
        };
        let take = (h.length as usize).min(c.remaining());
        let payload = c.bytes(take).unwrap_or(&[]);
        let parsed = parse_option(h.option, payload, &limits);
        if let Ok(opt) = &parsed {
            // A parsed option re-encodes to something that parses the same.
            let mut again = Vec::new();
            opt.encode(&mut again);
            let reparsed = parse_option(opt.code(), again.get(16..).unwrap_or(&[]), &limits);
            assert_eq!(reparsed.as_ref(), Ok(opt), "option round trip");
        }
        match neg.handle(h.option, parsed, &catalog) {
            Step::Continue(replies) | Step::Abort(replies) | Step::StartTls(replies)
                if replies.is_empty() =>
            {
                panic!("an option got no reply");
            }
            Step::Continue(replies) => {
                let last = replies.last().map(OptionReply::reply_type);
                assert!(
                    last == Some(REP_ACK) || last.is_some_and(|t| t & REP_FLAG_ERROR != 0),
                    "final reply must be ACK or an error"
                );
                for r in &replies {
                    if neg.tls_active() || tls_mode == TlsMode::Off || !client.fixed_newstyle {
                        assert_ne!(
                            r.reply_type(),
                            REP_ERR_TLS_REQD,
                            "TLS_REQD outside a TLS mode or after TLS"
                        );
                    }
                    check_reply(h.option, r);
                }
            }
            Step::Abort(replies) => {
                replies.iter().for_each(|r| check_reply(h.option, r));
                return;
            }
            Step::StartTls(replies) => {
                replies.iter().for_each(|r| check_reply(h.option, r));
                neg.tls_started(vec!["fuzz".into()]);
            }
            Step::Transmit {
                replies,
                export_name_reply,
                session,
            } => {
                if export_name_reply.is_none() {
                    assert!(
                        replies
                            .iter()
                            .any(|r| matches!(r, OptionReply::Info(InfoReply::Export { .. }))),
                        "GO without NBD_INFO_EXPORT"
                    );
                    assert_eq!(replies.last(), Some(&OptionReply::Ack));
                }
                replies.iter().for_each(|r| check_reply(h.option, r));
                request_stream(c.rest(), &session.view());
                return;
            }
            Step::Close(_) => return,
        }
    }
}

/// A request stream judged against a session chosen by the first byte; the
/// same bytes are also fed to the client-side reply decoders.
pub fn requests(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let structured = sel & 1 != 0;
    let size = match (sel >> 1) & 3 {
        0 => 0,
        1 => 4096,
        2 => 1 << 30,
        _ => u64::MAX,
    };
    let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_CACHE;
    if sel & 0x08 != 0 {
        flags |= FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES;
    }
    if sel & 0x10 != 0 {
        flags |= FLAG_READ_ONLY;
    }
    if structured {
        flags |= FLAG_SEND_DF;
    }
    let view = SessionView {
        export_size_bytes: size,
        transmission_flags: flags,
        structured_replies: structured,
        base_allocation: (structured && sel & 0x20 != 0).then_some(1),
        payload_bytes_max: if sel & 0x40 != 0 {
            4096
        } else {
            PAYLOAD_BYTES_DEFAULT
        },
    };
    request_stream(rest, &view);
    replies(rest);
}

fn request_stream(data: &[u8], view: &SessionView) {
    let mut c = Cursor::new(data);
    for _ in 0..REQUESTS_PER_INPUT_MAX {
        let Some(hb) = c.bytes(REQUEST_HEADER_BYTES) else {
            return;
        };
        let Ok(h) = RequestHeader::decode(hb) else {
            return;
        };
        match judge(&h, view) {
            Err(FatalRequest::WritePayloadTooLarge { length, max }) => {
                assert!(h.kind == CMD_WRITE && length > max);
                return;
            }
            Ok(j) => {
                assert_eq!(j.payload_bytes != 0, h.kind == CMD_WRITE && h.length != 0);
                if let Ok(cmd) = j.verdict {
                    check_command(&h, &cmd, view);
                }
                let skip = (j.payload_bytes as usize).min(c.remaining());
                let _ = c.bytes(skip);
            }
        }
    }
}

fn check_command(h: &RequestHeader, cmd: &Command, view: &SessionView) {
    let in_range = h
        .offset
        .checked_add(u64::from(h.length))
        .is_some_and(|end| end <= view.export_size_bytes);
    match cmd {
        Command::Disconnect | Command::Flush => {}
        Command::Read { length, .. } => {
            assert!(in_range && *length <= view.payload_bytes_max);
        }
        Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. } => {
            assert!(in_range);
            assert_eq!(
                view.transmission_flags & FLAG_READ_ONLY,
                0,
                "write on read-only export"
            );
        }
        Command::Cache { .. } => assert!(in_range),
        Command::BlockStatus { .. } => {
            assert!(in_range && view.structured_replies && view.base_allocation.is_some());
        }
    }
}

/// Client-side reply decoding over arbitrary bytes.
fn replies(data: &[u8]) {
    let mut c = Cursor::new(data);
    for _ in 0..REQUESTS_PER_INPUT_MAX {
        let Some(head) = c.bytes(CHUNK_HEADER_BYTES.min(c.remaining())) else {
            return;
        };
        match ReplyHeader::decode(head) {
            Ok(ReplyHeader::Chunk(h)) => {
                let take = (h.length as usize).min(c.remaining());
                let payload = c.bytes(take).unwrap_or(&[]);
                if let Ok(chunk) = Chunk::decode(&h, payload) {
                    // Whatever decodes re-encodes to the same bytes.
                    let mut again = Vec::new();
                    chunk.encode(h.cookie, h.done(), &mut again);
                    if !matches!(chunk, Chunk::UnknownError { .. }) {
                        assert_eq!(
                            again.get(CHUNK_HEADER_BYTES..),
                            Some(payload),
                            "chunk round trip"
                        );
                    }
                }
            }
            Ok(ReplyHeader::Simple(_)) | Err(_) => {
                if head.is_empty() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_inputs_do_not_panic() {
        for len in 0..64 {
            let v: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            handshake(&v);
            requests(&v);
        }
    }
}
