//! The NBD wire protocol without I/O: fixed-newstyle handshake, options and
//! their replies, transmission requests and replies, and the negotiation state
//! machine. Everything here takes and returns bytes or typed values, never
//! panics on input, and is what the fuzz targets drive.

pub mod consts;
pub mod handshake;
pub mod negotiate;
pub mod option;
pub mod reply;
pub mod request;
pub mod wire;

pub use handshake::{
    ClientFlags, ExportNameReply, Greeting, HandshakeError, OptionHeader, OptionReplyHeader,
};
pub use negotiate::{
    CloseReason, ExportCatalog, ExportView, Negotiation, NegotiationConfig, Session, Step, TlsMode,
};
pub use option::{
    ClientOption, InfoReply, InfoRequest, MetaContextRequest, OptionError, OptionLimits,
    OptionReply,
};
pub use reply::{Chunk, ChunkError, ChunkHeader, Extent, ReplyHeader, SimpleReply};
pub use request::{
    judge, Command, FatalRequest, Judged, Refusal, RefusalCause, RequestHeader, RequestHeaderError,
    SessionView,
};
