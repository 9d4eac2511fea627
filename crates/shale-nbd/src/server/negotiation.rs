//! The handshake phase on a real stream: greeting, client flags, then one
//! option at a time through [`Negotiation`], until the client goes to
//! transmission, aborts, or breaks a rule.

use std::io::{self, Read, Write};

use tracing::debug;

use super::transport::Transport;
use super::{ConnError, Shared};
use crate::backend::ExportInfo;
use crate::proto::consts::*;
use crate::proto::handshake::{
    ClientFlags, Greeting, OptionHeader, CLIENT_FLAGS_BYTES, OPTION_HEADER_BYTES,
};
use crate::proto::negotiate::{
    ExportCatalog, ExportView, Negotiation, NegotiationConfig, Session, Step,
};
use crate::proto::option::{parse_option, OptionError, OptionReply};

/// How negotiation ended.
#[derive(Debug)]
pub(crate) enum Negotiated {
    Transmit(Box<Session>),
    Aborted,
}

/// The backend's exports as negotiation sees them, with this server's access
/// policy applied.
pub(crate) struct Catalog<'a> {
    pub shared: &'a Shared,
}

impl Catalog<'_> {
    fn view(&self, info: ExportInfo) -> ExportView {
        let access = self.shared.config.export_access.get(&info.name);
        let caps = info.caps;
        let mut flags = FLAG_SEND_CACHE;
        for (on, flag) in [
            (caps.read_only, FLAG_READ_ONLY),
            (caps.flush, FLAG_SEND_FLUSH),
            (caps.fua, FLAG_SEND_FUA),
            (caps.trim && !caps.read_only, FLAG_SEND_TRIM),
            (caps.write_zeroes && !caps.read_only, FLAG_SEND_WRITE_ZEROES),
            (caps.multi_conn, FLAG_CAN_MULTI_CONN),
        ] {
            if on {
                flags |= flag;
            }
        }
        ExportView {
            id: info.id,
            name: info.name,
            description: info.description,
            size_bytes: info.size_bytes,
            flags,
            block_size_min: info.block_sizes.minimum,
            block_size_preferred: info.block_sizes.preferred,
            payload_bytes_max: info.block_sizes.payload_max,
            tls_only: access.is_some_and(|a| a.tls_only),
            allowed_identities: access.and_then(|a| a.allowed_identities.clone()),
        }
    }
}

impl ExportCatalog for Catalog<'_> {
    fn list(&self) -> Vec<ExportView> {
        self.shared
            .backend
            .exports()
            .into_iter()
            .map(|e| self.view(e))
            .collect()
    }

    fn lookup(&self, name: &str) -> Option<ExportView> {
        let name = if name.is_empty() {
            self.shared.config.default_export.as_deref()?
        } else {
            name
        };
        self.shared.backend.export(name).map(|e| self.view(e))
    }
}

fn read_exact(t: &mut Transport, buf: &mut [u8], step: &'static str) -> Result<(), ConnError> {
    t.read_exact(buf)
        .map_err(|source| ConnError::Io { step, source })
}

fn send(t: &mut Transport, bytes: &[u8], step: &'static str) -> Result<(), ConnError> {
    t.write_all(bytes)
        .and_then(|()| t.flush())
        .map_err(|source| ConnError::Io { step, source })
}

fn discard(t: &mut Transport, mut n: u64) -> io::Result<()> {
    let mut sink = [0u8; 8192];
    while n > 0 {
        let chunk = n.min(sink.len() as u64) as usize;
        t.read_exact(&mut sink[..chunk])?;
        n -= chunk as u64;
    }
    Ok(())
}

fn encode_all(option: u32, replies: &[OptionReply], out: &mut Vec<u8>) {
    for r in replies {
        r.encode(option, out);
    }
}

/// Runs the handshake. Returns the transport (which STARTTLS may have
/// replaced) and the outcome.
pub(crate) fn negotiate(
    mut t: Transport,
    shared: &Shared,
) -> Result<(Transport, Negotiated), ConnError> {
    let greeting = Greeting::SERVER;
    send(&mut t, &greeting.encode(), "greeting")?;
    let mut cf = [0u8; CLIENT_FLAGS_BYTES];
    read_exact(&mut t, &mut cf, "client flags")?;
    let client = ClientFlags::decode(&cf, greeting.handshake_flags)?;
    debug!(?client, "client flags");
    let limits = &shared.config.limits;
    let mut neg = Negotiation::new(
        NegotiationConfig {
            tls_mode: shared.tls_mode(),
            tls_available: shared.tls_available(),
            limits: limits.option_limits(),
            options_max: limits.options_max,
            payload_bytes_max: limits.payload_bytes_max,
        },
        client,
    );
    let catalog = Catalog { shared };
    let mut out = Vec::new();
    loop {
        let mut hb = [0u8; OPTION_HEADER_BYTES];
        read_exact(&mut t, &mut hb, "option header")?;
        let h = OptionHeader::decode(&hb)?;
        let parsed = if h.length > limits.option_bytes_max {
            if h.length > limits.option_discard_bytes_max {
                return Err(ConnError::OptionTooLarge {
                    option: h.option,
                    length: h.length,
                });
            }
            discard(&mut t, u64::from(h.length)).map_err(|source| ConnError::Io {
                step: "discarding oversized option",
                source,
            })?;
            Err(OptionError::TooLong {
                option: h.option,
                len: h.length as usize,
                max: limits.option_bytes_max,
            })
        } else {
            let mut data = vec![0u8; h.length as usize];
            read_exact(&mut t, &mut data, "option data")?;
            parse_option(h.option, &data, &limits.option_limits())
        };
        debug!(option = h.option, length = h.length, parsed = ?parsed, "option");
        let step = neg.handle(h.option, parsed, &catalog);
        out.clear();
        match step {
            Step::Continue(replies) => {
                encode_all(h.option, &replies, &mut out);
                send(&mut t, &out, "option reply")?;
            }
            Step::Abort(replies) => {
                encode_all(h.option, &replies, &mut out);
                // The client may already have closed; the spec allows that.
                let _ = send(&mut t, &out, "abort reply");
                return Ok((t, Negotiated::Aborted));
            }
            Step::StartTls(replies) => {
                encode_all(h.option, &replies, &mut out);
                send(&mut t, &out, "starttls reply")?;
                let (upgraded, identities) = shared.start_tls(t)?;
                debug!(?identities, "TLS established");
                t = upgraded;
                neg.tls_started(identities);
            }
            Step::Transmit {
                replies,
                export_name_reply,
                session,
            } => {
                encode_all(h.option, &replies, &mut out);
                if let Some(r) = export_name_reply {
                    r.encode(neg.client_flags().no_zeroes, &mut out);
                }
                send(&mut t, &out, "final option reply")?;
                return Ok((t, Negotiated::Transmit(session)));
            }
            Step::Close(reason) => return Err(ConnError::Refused(reason)),
        }
    }
}
