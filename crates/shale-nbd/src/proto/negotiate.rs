//! The option-haggling state machine, without I/O: each parsed option goes in,
//! the replies to send and what to do next come out.
//!
//! Invariants:
//! - `NBD_REP_ERR_TLS_REQD` is only ever sent before TLS is active and only in
//!   a TLS mode other than `Off` (the spec forbids it otherwise).
//! - A successful `NBD_OPT_INFO`/`NBD_OPT_GO` always carries `NBD_INFO_EXPORT`.
//! - A successful `NBD_OPT_STARTTLS` forgets structured replies and metadata
//!   contexts negotiated before it.
//! - `NBD_CMD_BLOCK_STATUS` is enabled only when the last
//!   `NBD_OPT_SET_META_CONTEXT` named the export finally chosen.

use super::consts::*;
use super::handshake::{ClientFlags, ExportNameReply};
use super::option::{
    ClientOption, InfoReply, MetaContextRequest, OptionError, OptionLimits, OptionReply,
};
use super::request::SessionView;

/// The server's TLS policy for a connection (the spec's three modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// NOTLS: `NBD_OPT_STARTTLS` is refused.
    #[default]
    Off,
    /// SELECTIVETLS: TLS at the client's choice; some exports may demand it.
    Optional,
    /// FORCEDTLS: every option but STARTTLS and ABORT gets `NBD_REP_ERR_TLS_REQD`.
    Required,
}

/// What negotiation needs to know about one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportView {
    /// The backend's id of the export this view describes.
    pub id: crate::backend::ExportId,
    /// Canonical name.
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    /// Transmission flags the export supports (READ_ONLY, SEND_FLUSH, ...);
    /// HAS_FLAGS and SEND_DF are added by negotiation.
    pub flags: u16,
    pub block_size_min: u32,
    pub block_size_preferred: u32,
    pub payload_bytes_max: u32,
    /// Only reachable over TLS.
    pub tls_only: bool,
    /// If set, only TLS clients whose certificate names one of these may use it.
    pub allowed_identities: Option<Vec<String>>,
}

/// Where the export list comes from.
pub trait ExportCatalog {
    /// Every export, in listing order.
    fn list(&self) -> Vec<ExportView>;
    /// One export by the name the client used; `""` means the default export.
    fn lookup(&self, name: &str) -> Option<ExportView>;
}

/// Fixed parameters of negotiation on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiationConfig {
    pub tls_mode: TlsMode,
    /// A TLS configuration exists for this listener.
    pub tls_available: bool,
    pub limits: OptionLimits,
    /// Options accepted before the client is deemed abusive.
    pub options_max: u32,
    /// Server-wide cap on READ/WRITE payload, applied over each export's own.
    pub payload_bytes_max: u32,
}

/// The id this server gives `base:allocation` when selected.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Everything the transmission phase needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub export: ExportView,
    pub transmission_flags: u16,
    pub structured_replies: bool,
    pub base_allocation: Option<u32>,
    pub payload_bytes_max: u32,
    pub tls: bool,
}

impl Session {
    pub fn view(&self) -> SessionView {
        SessionView {
            export_size_bytes: self.export.size_bytes,
            transmission_flags: self.transmission_flags,
            structured_replies: self.structured_replies,
            base_allocation: self.base_allocation,
            payload_bytes_max: self.payload_bytes_max,
        }
    }
}

/// Why the server ends the session without a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloseReason {
    #[error("NBD_OPT_EXPORT_NAME for unknown export {name:?}")]
    ExportNameUnknown { name: String },
    #[error("NBD_OPT_EXPORT_NAME for export {name:?} needs TLS first")]
    ExportNameNeedsTls { name: String },
    #[error("NBD_OPT_EXPORT_NAME for export {name:?} refused to this TLS identity")]
    ExportNameDenied { name: String },
    #[error("NBD_OPT_EXPORT_NAME malformed: {0}")]
    ExportNameInvalid(OptionError),
    #[error("more than {max} options; treating the client as abusive")]
    TooManyOptions { max: u32 },
}

/// What the I/O layer does after one option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send the replies, then read the next option.
    Continue(Vec<OptionReply>),
    /// Send the replies (an ACK), run the TLS handshake, then call
    /// [`Negotiation::tls_started`].
    StartTls(Vec<OptionReply>),
    /// Send the replies (an ACK) and close.
    Abort(Vec<OptionReply>),
    /// Send the replies (GO) or the export-name reply, then enter transmission.
    Transmit {
        replies: Vec<OptionReply>,
        export_name_reply: Option<ExportNameReply>,
        session: Box<Session>,
    },
    /// Hard disconnect.
    Close(CloseReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Granted,
    NeedsTls,
    Denied,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MetaSelection {
    export: String,
    base_allocation: bool,
}

/// Negotiation state of one connection.
#[derive(Debug, Clone)]
pub struct Negotiation {
    config: NegotiationConfig,
    client: ClientFlags,
    tls_active: bool,
    identities: Vec<String>,
    structured: bool,
    meta: Option<MetaSelection>,
    options_seen: u32,
}

impl Negotiation {
    pub fn new(config: NegotiationConfig, client: ClientFlags) -> Negotiation {
        Negotiation {
            config,
            client,
            tls_active: false,
            identities: Vec::new(),
            structured: false,
            meta: None,
            options_seen: 0,
        }
    }

    pub fn client_flags(&self) -> ClientFlags {
        self.client
    }

    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// The TLS handshake succeeded; `identities` are the names in the client
    /// certificate (empty without one). Earlier negotiation state is dropped.
    pub fn tls_started(&mut self, identities: Vec<String>) {
        self.tls_active = true;
        self.identities = identities;
        self.structured = false;
        self.meta = None;
    }

    fn effective_mode(&self) -> TlsMode {
        // TLS needs fixed newstyle from both sides; otherwise NOTLS.
        if self.client.fixed_newstyle {
            self.config.tls_mode
        } else {
            TlsMode::Off
        }
    }

    fn access(&self, e: &ExportView) -> Access {
        let needs_tls = e.tls_only
            || e.allowed_identities.is_some()
            || self.effective_mode() == TlsMode::Required;
        if needs_tls && !self.tls_active {
            // In NOTLS mode TLS_REQD must never be sent: the export is simply
            // not available on this connection.
            return if self.effective_mode() == TlsMode::Off {
                Access::Denied
            } else {
                Access::NeedsTls
            };
        }
        match &e.allowed_identities {
            Some(allowed) if !self.identities.iter().any(|id| allowed.contains(id)) => {
                Access::Denied
            }
            _ => Access::Granted,
        }
    }

    fn transmission_flags(&self, e: &ExportView) -> u16 {
        let mut f = e.flags | FLAG_HAS_FLAGS;
        // Options this server never implements must not be advertised.
        f &= !(FLAG_SEND_RESIZE | FLAG_BLOCK_STATUS_PAYLOAD | FLAG_SEND_FAST_ZERO | FLAG_SEND_DF);
        if self.structured {
            // Every read is answered with at most one data chunk.
            f |= FLAG_SEND_DF;
        }
        f
    }

    fn session(&self, e: ExportView) -> Session {
        let base_allocation = match &self.meta {
            Some(m) if m.base_allocation && m.export == e.name && self.structured => {
                Some(BASE_ALLOCATION_ID)
            }
            _ => None,
        };
        Session {
            transmission_flags: self.transmission_flags(&e),
            structured_replies: self.structured,
            base_allocation,
            payload_bytes_max: e.payload_bytes_max.min(self.config.payload_bytes_max),
            tls: self.tls_active,
            export: e,
        }
    }

    /// Handles one option. `parsed` is [`super::option::parse_option`]'s result
    /// for option code `option`.
    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    pub fn handle(
        &mut self,
        option: u32,
        parsed: Result<ClientOption, OptionError>,
        catalog: &dyn ExportCatalog,
    ) -> Step {
        self.options_seen = self.options_seen.saturating_add(1);
        if self.options_seen > self.config.options_max {
            return Step::Close(CloseReason::TooManyOptions {
                max: self.config.options_max,
            });
        }
        let err = |t: u32, m: String| Step::Continue(vec![OptionReply::error(t, m)]);
        if self.effective_mode() == TlsMode::Required
            && !self.tls_active
            && option != OPT_STARTTLS
            && option != OPT_ABORT
        {
            if option == OPT_EXPORT_NAME {
                let name = match parsed {
                    Ok(ClientOption::ExportName { name }) => name,
                    _ => String::new(),
                };
                return Step::Close(CloseReason::ExportNameNeedsTls { name });
            }
            return err(
                REP_ERR_TLS_REQD,
                "TLS is required: send NBD_OPT_STARTTLS first".into(),
            );
        }
        let opt = match parsed {
            Ok(o) => o,
            Err(e) if option == OPT_EXPORT_NAME => {
                return Step::Close(CloseReason::ExportNameInvalid(e));
            }
            Err(e) => return err(e.reply_type(), e.to_string()),
        };
        match opt {
            ClientOption::ExportName { name } => self.export_name(name, catalog),
            ClientOption::Abort => Step::Abort(vec![OptionReply::Ack]),
            ClientOption::List => {
                let mut replies: Vec<OptionReply> = catalog
                    .list()
                    .into_iter()
                    .filter(|e| self.access(e) == Access::Granted)
                    .map(|e| OptionReply::Server {
                        name: e.name,
                        description: e.description,
                    })
                    .collect();
                replies.push(OptionReply::Ack);
                Step::Continue(replies)
            }
            ClientOption::StartTls => {
                if self.tls_active {
                    err(REP_ERR_INVALID, "TLS is already active".into())
                } else if !self.config.tls_available || self.effective_mode() == TlsMode::Off {
                    err(REP_ERR_POLICY, "TLS is not enabled on this server".into())
                } else {
                    self.structured = false;
                    self.meta = None;
                    Step::StartTls(vec![OptionReply::Ack])
                }
            }
            ClientOption::Info(req) | ClientOption::Go(req) => {
                let go = option == OPT_GO;
                let Some(e) = catalog.lookup(&req.name) else {
                    return err(REP_ERR_UNKNOWN, format!("no export named {:?}", req.name));
                };
                match self.access(&e) {
                    Access::Granted => {}
                    Access::NeedsTls => {
                        return err(
                            REP_ERR_TLS_REQD,
                            format!("export {:?} requires TLS", e.name),
                        )
                    }
                    Access::Denied => {
                        return err(
                            REP_ERR_POLICY,
                            format!("export {:?} is not available to this TLS identity", e.name),
                        )
                    }
                }
                let session = self.session(e);
                let e = &session.export;
                let mut replies = vec![OptionReply::Info(InfoReply::Export {
                    size_bytes: e.size_bytes,
                    transmission_flags: session.transmission_flags,
                })];
                if req.info_requests.contains(&INFO_NAME) {
                    replies.push(OptionReply::Info(InfoReply::Name(e.name.clone())));
                }
                if req.info_requests.contains(&INFO_DESCRIPTION) && !e.description.is_empty() {
                    replies.push(OptionReply::Info(InfoReply::Description(
                        e.description.clone(),
                    )));
                }
                // Sent whether asked for or not: it documents the preferred
                // size, and clients ignore what they did not ask for.
                replies.push(OptionReply::Info(InfoReply::BlockSize {
                    minimum: e.block_size_min,
                    preferred: e.block_size_preferred,
                    maximum_payload: session.payload_bytes_max,
                }));
                replies.push(OptionReply::Ack);
                if go {
                    Step::Transmit {
                        replies,
                        export_name_reply: None,
                        session: Box::new(session),
                    }
                } else {
                    Step::Continue(replies)
                }
            }
            ClientOption::StructuredReply => {
                self.structured = true;
                Step::Continue(vec![OptionReply::Ack])
            }
            ClientOption::ListMetaContext(req) => self.meta_context(req, false, catalog),
            ClientOption::SetMetaContext(req) => self.meta_context(req, true, catalog),
            ClientOption::Unknown { option } => {
                err(REP_ERR_UNSUP, format!("option {option} is not supported"))
            }
        }
    }

    fn export_name(&mut self, name: String, catalog: &dyn ExportCatalog) -> Step {
        let Some(e) = catalog.lookup(&name) else {
            return Step::Close(CloseReason::ExportNameUnknown { name });
        };
        match self.access(&e) {
            Access::Granted => {}
            Access::NeedsTls => return Step::Close(CloseReason::ExportNameNeedsTls { name }),
            Access::Denied => return Step::Close(CloseReason::ExportNameDenied { name }),
        }
        let session = self.session(e);
        Step::Transmit {
            replies: Vec::new(),
            export_name_reply: Some(ExportNameReply {
                size_bytes: session.export.size_bytes,
                transmission_flags: session.transmission_flags,
            }),
            session: Box::new(session),
        }
    }

    fn meta_context(
        &mut self,
        req: MetaContextRequest,
        set: bool,
        catalog: &dyn ExportCatalog,
    ) -> Step {
        if set {
            // SET replaces the selection even when it fails.
            self.meta = None;
        }
        let err = |t: u32, m: String| Step::Continue(vec![OptionReply::error(t, m)]);
        if !self.structured {
            return err(
                REP_ERR_INVALID,
                "metadata contexts need NBD_OPT_STRUCTURED_REPLY first".into(),
            );
        }
        let Some(e) = catalog.lookup(&req.export) else {
            return err(REP_ERR_UNKNOWN, format!("no export named {:?}", req.export));
        };
        if self.access(&e) != Access::Granted {
            return err(
                REP_ERR_POLICY,
                format!("export {:?} is not available on this connection", e.name),
            );
        }
        let selected = if set {
            // "base:" selects nothing in SET; unknown namespaces and leaves are ignored.
            req.queries.iter().any(|q| q == META_BASE_ALLOCATION)
        } else {
            req.queries.is_empty()
                || req
                    .queries
                    .iter()
                    .any(|q| q == "base:" || q == META_BASE_ALLOCATION)
        };
        let mut replies = Vec::new();
        if selected {
            replies.push(OptionReply::MetaContext {
                id: if set { BASE_ALLOCATION_ID } else { 0 },
                name: META_BASE_ALLOCATION.into(),
            });
        }
        replies.push(OptionReply::Ack);
        if set {
            self.meta = Some(MetaSelection {
                export: e.name,
                base_allocation: selected,
            });
        }
        Step::Continue(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::option::{InfoRequest, MetaContextRequest};

    pub(crate) struct Catalog(pub Vec<ExportView>);

    impl ExportCatalog for Catalog {
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

    fn export(name: &str) -> ExportView {
        ExportView {
            id: crate::backend::ExportId(0),
            name: name.into(),
            description: format!("{name} desc"),
            size_bytes: 1 << 20,
            flags: FLAG_SEND_FLUSH | FLAG_SEND_TRIM | FLAG_SEND_CACHE,
            block_size_min: 512,
            block_size_preferred: 4096,
            payload_bytes_max: 1 << 25,
            tls_only: false,
            allowed_identities: None,
        }
    }

    fn catalog() -> Catalog {
        let mut secret = export("secret");
        secret.tls_only = true;
        let mut alice = export("alice");
        alice.allowed_identities = Some(vec!["alice".into()]);
        Catalog(vec![export("disk0"), export("disk1"), secret, alice])
    }

    fn neg(mode: TlsMode) -> Negotiation {
        Negotiation::new(
            NegotiationConfig {
                tls_mode: mode,
                tls_available: mode != TlsMode::Off,
                limits: OptionLimits::default(),
                options_max: 32,
                payload_bytes_max: 1 << 25,
            },
            ClientFlags {
                fixed_newstyle: true,
                no_zeroes: true,
            },
        )
    }

    fn run(n: &mut Negotiation, opt: ClientOption) -> Step {
        n.handle(opt.code(), Ok(opt), &catalog())
    }

    fn go(name: &str) -> ClientOption {
        ClientOption::Go(InfoRequest {
            name: name.into(),
            info_requests: vec![INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
        })
    }

    fn replies(step: Step) -> Vec<OptionReply> {
        match step {
            Step::Continue(r) | Step::StartTls(r) | Step::Abort(r) => r,
            Step::Transmit { replies, .. } => replies,
            Step::Close(c) => panic!("closed: {c}"),
        }
    }

    fn types(step: Step) -> Vec<u32> {
        replies(step).iter().map(|r| r.reply_type()).collect()
    }

    fn set_meta(export: &str, q: &[&str]) -> ClientOption {
        ClientOption::SetMetaContext(MetaContextRequest {
            export: export.into(),
            queries: q.iter().map(|s| s.to_string()).collect(),
        })
    }

    #[test]
    fn list_hides_tls_only_exports_without_tls() {
        let mut n = neg(TlsMode::Optional);
        let r = replies(run(&mut n, ClientOption::List));
        let names: Vec<_> = r
            .iter()
            .filter_map(|r| match r {
                OptionReply::Server { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["disk0", "disk1"]);
        assert_eq!(r.last(), Some(&OptionReply::Ack));
        n.tls_started(vec!["alice".into()]);
        let r = replies(run(&mut n, ClientOption::List));
        assert_eq!(r.len(), 5);
    }

    #[test]
    fn go_replies_and_session() {
        let mut n = neg(TlsMode::Off);
        assert_eq!(types(run(&mut n, ClientOption::StructuredReply)), [REP_ACK]);
        assert_eq!(
            types(run(
                &mut n,
                set_meta("disk1", &["base:", "x-foo:bar", "base:allocation"])
            )),
            [REP_META_CONTEXT, REP_ACK]
        );
        let Step::Transmit {
            replies,
            export_name_reply,
            session,
        } = run(&mut n, go("disk1"))
        else {
            panic!("no transmit");
        };
        assert!(export_name_reply.is_none());
        assert!(matches!(
            replies[0],
            OptionReply::Info(InfoReply::Export {
                size_bytes: 1048576,
                ..
            })
        ));
        assert!(replies.contains(&OptionReply::Info(InfoReply::Name("disk1".into()))));
        assert!(replies.contains(&OptionReply::Info(InfoReply::BlockSize {
            minimum: 512,
            preferred: 4096,
            maximum_payload: 1 << 25
        })));
        assert_eq!(replies.last(), Some(&OptionReply::Ack));
        assert_eq!(session.base_allocation, Some(BASE_ALLOCATION_ID));
        assert!(session.structured_replies);
        assert_ne!(session.transmission_flags & FLAG_SEND_DF, 0);
        assert_ne!(session.transmission_flags & FLAG_HAS_FLAGS, 0);
    }

    #[test]
    fn meta_context_for_other_export_is_not_active() {
        let mut n = neg(TlsMode::Off);
        run(&mut n, ClientOption::StructuredReply);
        run(&mut n, set_meta("disk0", &["base:allocation"]));
        let Step::Transmit { session, .. } = run(&mut n, go("disk1")) else {
            panic!()
        };
        assert_eq!(session.base_allocation, None);
    }

    #[test]
    fn meta_context_needs_structured_replies() {
        let mut n = neg(TlsMode::Off);
        assert_eq!(
            types(run(&mut n, set_meta("disk0", &["base:allocation"]))),
            [REP_ERR_INVALID]
        );
        run(&mut n, ClientOption::StructuredReply);
        // "base:" lists in LIST, selects nothing in SET.
        let list = ClientOption::ListMetaContext(MetaContextRequest {
            export: "disk0".into(),
            queries: vec!["base:".into()],
        });
        assert_eq!(types(run(&mut n, list)), [REP_META_CONTEXT, REP_ACK]);
        assert_eq!(types(run(&mut n, set_meta("disk0", &["base:"]))), [REP_ACK]);
        assert_eq!(
            types(run(&mut n, set_meta("nope", &["base:allocation"]))),
            [REP_ERR_UNKNOWN]
        );
    }

    #[test]
    fn unknown_and_invalid_options() {
        let mut n = neg(TlsMode::Off);
        assert_eq!(
            types(run(&mut n, ClientOption::Unknown { option: 99 })),
            [REP_ERR_UNSUP]
        );
        assert_eq!(types(run(&mut n, go("missing"))), [REP_ERR_UNKNOWN]);
        assert_eq!(types(run(&mut n, ClientOption::StartTls)), [REP_ERR_POLICY]);
        let e = crate::proto::option::parse_option(OPT_LIST, &[1], &OptionLimits::default());
        assert_eq!(types(n.handle(OPT_LIST, e, &catalog())), [REP_ERR_INVALID]);
        let e = crate::proto::option::parse_option(OPT_EXPORT_NAME, &[0], &OptionLimits::default());
        assert!(matches!(
            n.handle(OPT_EXPORT_NAME, e, &catalog()),
            Step::Close(CloseReason::ExportNameInvalid(_))
        ));
    }

    #[test]
    fn export_name_unknown_closes() {
        let mut n = neg(TlsMode::Off);
        assert!(matches!(
            run(&mut n, ClientOption::ExportName { name: "zz".into() }),
            Step::Close(CloseReason::ExportNameUnknown { .. })
        ));
        let Step::Transmit {
            export_name_reply: Some(r),
            ..
        } = run(
            &mut n,
            ClientOption::ExportName {
                name: String::new(),
            },
        )
        else {
            panic!()
        };
        assert_eq!(r.size_bytes, 1 << 20);
    }

    #[test]
    fn forced_tls() {
        let mut n = neg(TlsMode::Required);
        assert_eq!(types(run(&mut n, ClientOption::List)), [REP_ERR_TLS_REQD]);
        assert_eq!(types(run(&mut n, go("disk0"))), [REP_ERR_TLS_REQD]);
        assert_eq!(
            types(run(&mut n, ClientOption::Unknown { option: 77 })),
            [REP_ERR_TLS_REQD]
        );
        assert!(matches!(
            run(
                &mut n,
                ClientOption::ExportName {
                    name: "disk0".into()
                }
            ),
            Step::Close(CloseReason::ExportNameNeedsTls { .. })
        ));
        run(&mut n, ClientOption::StructuredReply);
        assert!(matches!(
            run(&mut n, ClientOption::StartTls),
            Step::StartTls(_)
        ));
        n.tls_started(Vec::new());
        assert_eq!(
            types(run(&mut n, ClientOption::StartTls)),
            [REP_ERR_INVALID]
        );
        let Step::Transmit { session, .. } = run(&mut n, go("disk0")) else {
            panic!()
        };
        // Structured replies negotiated before STARTTLS are forgotten.
        assert!(!session.structured_replies);
        assert!(session.tls);
        assert_eq!(types(run(&mut n, ClientOption::Abort)), [REP_ACK]);
    }

    #[test]
    fn selective_tls_and_identities() {
        let mut n = neg(TlsMode::Optional);
        assert_eq!(types(run(&mut n, go("secret"))), [REP_ERR_TLS_REQD]);
        assert_eq!(types(run(&mut n, go("alice"))), [REP_ERR_TLS_REQD]);
        assert!(matches!(run(&mut n, go("disk0")), Step::Transmit { .. }));
        let mut n = neg(TlsMode::Optional);
        n.tls_started(vec!["bob".into()]);
        assert_eq!(types(run(&mut n, go("alice"))), [REP_ERR_POLICY]);
        assert!(matches!(
            run(
                &mut n,
                ClientOption::ExportName {
                    name: "alice".into()
                }
            ),
            Step::Close(CloseReason::ExportNameDenied { .. })
        ));
        let mut n = neg(TlsMode::Optional);
        n.tls_started(vec!["alice".into()]);
        assert!(matches!(run(&mut n, go("alice")), Step::Transmit { .. }));
    }

    #[test]
    fn tls_needs_fixed_newstyle() {
        let mut n = Negotiation::new(
            NegotiationConfig {
                tls_mode: TlsMode::Required,
                tls_available: true,
                limits: OptionLimits::default(),
                options_max: 8,
                payload_bytes_max: 1 << 25,
            },
            ClientFlags::default(),
        );
        // NOTLS applies, so TLS_REQD must never be sent and STARTTLS is refused.
        assert_eq!(types(run(&mut n, ClientOption::StartTls)), [REP_ERR_POLICY]);
        assert_eq!(
            types(run(&mut n, ClientOption::List)).last(),
            Some(&REP_ACK)
        );
    }

    /// Found by fuzzing: a TLS-only export asked for by a client without
    /// fixed newstyle (so NOTLS applies) was answered NBD_REP_ERR_TLS_REQD,
    /// which the spec forbids in NOTLS mode.
    #[test]
    fn regression_tls_only_export_in_notls_mode_is_policy_not_tls_reqd() {
        let mut n = Negotiation::new(
            NegotiationConfig {
                tls_mode: TlsMode::Optional,
                tls_available: true,
                limits: OptionLimits::default(),
                options_max: 8,
                payload_bytes_max: 1 << 25,
            },
            ClientFlags::default(),
        );
        assert_eq!(types(run(&mut n, go("secret"))), [REP_ERR_POLICY]);
        assert_eq!(types(run(&mut n, go("alice"))), [REP_ERR_POLICY]);
        let mut off = neg(TlsMode::Off);
        assert_eq!(types(run(&mut off, go("secret"))), [REP_ERR_POLICY]);
    }

    #[test]
    fn option_count_is_bounded() {
        let mut n = neg(TlsMode::Off);
        for _ in 0..32 {
            assert!(matches!(run(&mut n, ClientOption::List), Step::Continue(_)));
        }
        assert!(matches!(
            run(&mut n, ClientOption::List),
            Step::Close(CloseReason::TooManyOptions { max: 32 })
        ));
    }
}
