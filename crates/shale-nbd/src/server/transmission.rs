//! The transmission phase of one connection: a reader thread that parses
//! requests and submits them to the backend without waiting, and a writer
//! thread that sends replies in completion order.
//!
//! Invariants:
//! - At most `inflight_requests_max` requests (and about `inflight_bytes_max`
//!   bytes of payload) are between "header read" and "reply written". A client
//!   that stops reading replies therefore stops its own reader, never another
//!   connection or the backend: completions only push onto an unbounded
//!   channel whose length the gate already bounds.
//! - Every acquired slot is released exactly once, by the writer, whether the
//!   reply was written or the connection is dead.
//! - Completions that arrive after the client left are dropped by the writer.

use std::io::{self, BufReader, BufWriter, IoSlice, Read, Write};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use tracing::{debug, trace, warn};

use super::transport::{Closer, Transport, WriteHalf};
use super::{ConnError, Shared};
use crate::backend::{BackendError, BackendReply, BackendRequest, ExportInfo};
use crate::proto::consts::*;
use crate::proto::negotiate::Session;
use crate::proto::reply::{offset_data_prefix, Chunk, Extent, SimpleReply};
use crate::proto::request::{judge, Command, RequestHeader, REQUEST_HEADER_BYTES};

/// Bounds the requests (and payload bytes) in flight on one connection.
#[derive(Debug)]
struct Gate {
    /// (requests, bytes, closed)
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
    requests_max: usize,
    bytes_max: u64,
}

impl Gate {
    fn new(requests_max: usize, bytes_max: u64) -> Gate {
        Gate {
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
            requests_max: requests_max.max(1),
            bytes_max,
        }
    }

    /// Waits for room. A request larger than the byte budget still goes
    /// through once nothing else is in flight. `false` once the connection is
    /// dead: the reader stops instead of feeding the backend work whose
    /// replies nobody will read.
    fn acquire(&self, cost: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while !s.2
            && (s.0 >= self.requests_max || (s.0 > 0 && s.1.saturating_add(cost) > self.bytes_max))
        {
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if s.2 {
            return false;
        }
        s.0 += 1;
        s.1 += cost;
        true
    }

    fn close(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.2 = true;
        self.cv.notify_all();
    }

    fn release(&self, cost: u64) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 = s.0.saturating_sub(1);
        s.1 = s.1.saturating_sub(cost);
        self.cv.notify_all();
    }
}

/// What a reply answers, as far as encoding goes.
#[derive(Debug, Clone, Copy)]
enum What {
    Read {
        offset: u64,
        len: u32,
        df: bool,
    },
    BlockStatus {
        offset: u64,
        len: u32,
        req_one: bool,
    },
    /// Commands whose success is an empty reply; offset/len bound ERROR_OFFSET.
    Other {
        offset: u64,
        len: u32,
    },
}

#[derive(Debug)]
struct Failure {
    error: u32,
    message: String,
    offset: Option<u64>,
}

impl From<BackendError> for Failure {
    fn from(e: BackendError) -> Failure {
        Failure {
            error: e.nbd_error(),
            offset: e.offset(),
            message: e.to_string(),
        }
    }
}

#[derive(Debug)]
struct Reply {
    cookie: u64,
    cost: u64,
    what: What,
    outcome: Result<BackendReply, Failure>,
}

/// Counters for the closing log line.
#[derive(Debug, Default, Clone, Copy)]
struct ReaderStats {
    requests: u64,
    refused: u64,
    write_bytes: u64,
}

/// Runs transmission until the client disconnects or breaks the protocol.
pub(crate) fn run(
    transport: Transport,
    session: Session,
    export: ExportInfo,
    shared: &Arc<Shared>,
    closer: Arc<Closer>,
    conn_id: u64,
) -> Result<(), ConnError> {
    let io = |step: &'static str| move |source| ConnError::Io { step, source };
    transport
        .socket()
        .set_read_timeout(None)
        .map_err(io("clearing handshake timeout"))?;
    let (rh, wh) = transport.split().map_err(io("splitting transport"))?;
    let limits = &shared.config.limits;
    let gate = Arc::new(Gate::new(
        limits.inflight_requests_max,
        limits.inflight_bytes_max,
    ));
    let (tx, rx) = crossbeam_channel::unbounded::<Reply>();
    let ctx = WriterCtx {
        structured: session.structured_replies,
        context_id: session.base_allocation,
        read_holes: shared.config.read_holes,
    };
    let writer = {
        let gate = Arc::clone(&gate);
        let closer = Arc::clone(&closer);
        std::thread::Builder::new()
            .name(format!("nbd-{conn_id}-tx"))
            .spawn(move || writer_loop(wh, rx, &gate, ctx, &closer))
            .map_err(io("spawning writer thread"))?
    };
    let mut stats = ReaderStats::default();
    let result = reader_loop(rh, &session, &export, shared, &gate, tx, &mut stats);
    if result.is_err() {
        // A protocol violation or a broken socket: hard disconnect. In-flight
        // requests still complete; the writer drops their replies.
        closer.close();
    }
    let written = writer.join().unwrap_or_default();
    debug!(
        requests = stats.requests,
        refused = stats.refused,
        write_bytes = stats.write_bytes,
        read_bytes = written,
        "transmission finished"
    );
    result
}

#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
fn reader_loop(
    rh: Box<dyn Read + Send>,
    session: &Session,
    export: &ExportInfo,
    shared: &Arc<Shared>,
    gate: &Gate,
    tx: Sender<Reply>,
    stats: &mut ReaderStats,
) -> Result<(), ConnError> {
    let view = session.view();
    let mut r = BufReader::with_capacity(64 * 1024, rh);
    let mut hb = [0u8; REQUEST_HEADER_BYTES];
    loop {
        match read_header(&mut r, &mut hb) {
            Ok(true) => {}
            Ok(false) => {
                debug!("client closed the connection without NBD_CMD_DISC");
                return Ok(());
            }
            Err(source) => {
                return Err(ConnError::Io {
                    step: "request header",
                    source,
                })
            }
        }
        let h = RequestHeader::decode(&hb)?;
        let judged = judge(&h, &view)?;
        stats.requests += 1;
        trace!(?h, "request");
        let cmd = match judged.verdict {
            Ok(Command::Disconnect) => {
                debug!("NBD_CMD_DISC");
                return Ok(());
            }
            Ok(cmd) => cmd,
            Err(refusal) => {
                stats.refused += 1;
                debug!(cookie = h.cookie, cause = %refusal.cause, error = refusal.error, "request refused");
                discard(&mut r, u64::from(judged.payload_bytes)).map_err(|source| {
                    ConnError::Io {
                        step: "discarding refused write payload",
                        source,
                    }
                })?;
                let what = match h.kind {
                    CMD_READ => What::Read {
                        offset: h.offset,
                        len: h.length,
                        df: false,
                    },
                    _ => What::Other {
                        offset: h.offset,
                        len: h.length,
                    },
                };
                if !gate.acquire(0) {
                    return Ok(());
                }
                let _ = tx.send(Reply {
                    cookie: h.cookie,
                    cost: 0,
                    what,
                    outcome: Err(Failure {
                        error: refusal.error,
                        message: refusal.cause.to_string(),
                        offset: None,
                    }),
                });
                continue;
            }
        };
        let (what, cost, req) = match cmd {
            Command::Read { offset, length, df } => (
                What::Read {
                    offset,
                    len: length,
                    df,
                },
                u64::from(length),
                Some(BackendRequest::Read {
                    offset,
                    len: length,
                }),
            ),
            Command::Write { offset, length, .. } => (
                What::Other {
                    offset,
                    len: length,
                },
                u64::from(length),
                None,
            ),
            Command::Flush => (
                What::Other { offset: 0, len: 0 },
                0,
                Some(BackendRequest::Flush),
            ),
            Command::Trim {
                offset,
                length,
                fua,
            } => (
                What::Other {
                    offset,
                    len: length,
                },
                0,
                Some(BackendRequest::Trim {
                    offset,
                    len: length,
                    fua,
                }),
            ),
            Command::WriteZeroes {
                offset,
                length,
                fua,
                no_hole,
            } => (
                What::Other {
                    offset,
                    len: length,
                },
                0,
                Some(BackendRequest::WriteZeroes {
                    offset,
                    len: length,
                    no_hole,
                    fua,
                }),
            ),
            Command::BlockStatus {
                offset,
                length,
                req_one,
            } => (
                What::BlockStatus {
                    offset,
                    len: length,
                    req_one,
                },
                0,
                Some(BackendRequest::BlockStatus {
                    offset,
                    len: length,
                }),
            ),
            Command::Cache { offset, length } => (
                What::Other {
                    offset,
                    len: length,
                },
                0,
                None,
            ),
            Command::Disconnect => return Ok(()),
        };
        if !gate.acquire(cost) {
            // The writer found the connection dead; it has closed the socket.
            return Ok(());
        }
        let req = match (cmd, req) {
            (
                Command::Write {
                    offset,
                    length,
                    fua,
                },
                _,
            ) => {
                let data = match read_payload(&mut r, length) {
                    Ok(data) => data,
                    Err(source) => {
                        gate.release(cost);
                        return Err(ConnError::Io {
                            step: "write payload",
                            source,
                        });
                    }
                };
                stats.write_bytes += u64::from(length);
                BackendRequest::Write { offset, data, fua }
            }
            (_, Some(req)) => req,
            (_, None) => {
                // NBD_CMD_CACHE: a hint this server does not act on.
                let _ = tx.send(Reply {
                    cookie: h.cookie,
                    cost,
                    what,
                    outcome: Ok(BackendReply::Done),
                });
                continue;
            }
        };
        let empty = match &req {
            BackendRequest::Read { len, .. }
            | BackendRequest::Trim { len, .. }
            | BackendRequest::WriteZeroes { len, .. } => *len == 0,
            BackendRequest::Write { data, .. } => data.is_empty(),
            BackendRequest::Flush | BackendRequest::BlockStatus { .. } => false,
        };
        if empty {
            // Zero-length requests are legal but pointless; answer without
            // troubling the backend.
            let outcome = match req {
                BackendRequest::Read { .. } => BackendReply::Data(Vec::new()),
                _ => BackendReply::Done,
            };
            let _ = tx.send(Reply {
                cookie: h.cookie,
                cost,
                what,
                outcome: Ok(outcome),
            });
            continue;
        }
        let tx = tx.clone();
        let cookie = h.cookie;
        shared.backend.submit(
            export.id,
            req,
            Box::new(move |result| {
                // Fails only when the writer is gone (connection torn down).
                let _ = tx.send(Reply {
                    cookie,
                    cost,
                    what,
                    outcome: result.map_err(Failure::from),
                });
            }),
        );
    }
}

/// Reads one header. `Ok(false)` is a clean end of stream between requests.
fn read_header(r: &mut impl Read, buf: &mut [u8; REQUEST_HEADER_BYTES]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads a write payload into a fresh buffer without zero-filling it first: plain
/// sockets read into uninitialised memory (`read_buf`), and zeroing would cost about
/// as much as the copy out of the socket.
fn read_payload(r: &mut impl Read, length: u32) -> io::Result<Vec<u8>> {
    let mut data = Vec::with_capacity(length as usize);
    let got = r.take(u64::from(length)).read_to_end(&mut data)?;
    if got != length as usize {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(data)
}

fn discard(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut sink = [0u8; 8192];
    while n > 0 {
        let chunk = n.min(sink.len() as u64) as usize;
        r.read_exact(&mut sink[..chunk])?;
        n -= chunk as u64;
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
struct WriterCtx {
    structured: bool,
    context_id: Option<u32>,
    read_holes: bool,
}

/// Sends replies until every sender (the reader and all in-flight
/// completions) is gone. Returns the read payload bytes sent.
fn writer_loop(
    wh: WriteHalf,
    rx: Receiver<Reply>,
    gate: &Gate,
    ctx: WriterCtx,
    closer: &Closer,
) -> u64 {
    let mut w = BufWriter::with_capacity(256 * 1024, wh);
    let mut scratch = Vec::new();
    let mut dead = false;
    let mut sent_bytes = 0u64;
    loop {
        let reply = match rx.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => {
                // Nothing queued: push out what is buffered before blocking.
                if !dead && w.flush().is_err() {
                    dead = true;
                    gate.close();
                    closer.close();
                }
                match rx.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        if !dead {
            match write_reply(&mut w, &reply, ctx, &mut scratch) {
                Ok(n) => sent_bytes += n,
                Err(e) => {
                    debug!(error = %e, "writing reply failed; dropping further replies");
                    dead = true;
                    gate.close();
                    closer.close();
                }
            }
        }
        gate.release(reply.cost);
    }
    gate.close();
    if !dead {
        let _ = w.flush();
        if let Ok(mut inner) = w.into_inner() {
            let _ = inner.flush();
            drop(inner);
        }
    }
    closer.close();
    sent_bytes
}

fn error_chunk(cookie: u64, what: What, f: &Failure, out: &mut Vec<u8>) {
    let (start, len) = match what {
        What::Read { offset, len, .. }
        | What::BlockStatus { offset, len, .. }
        | What::Other { offset, len } => (offset, len),
    };
    let end = start.saturating_add(u64::from(len));
    let chunk = match f.offset {
        // ERROR_OFFSET only for an offset inside the request, as required.
        Some(o) if o >= start && o < end => Chunk::ErrorOffset {
            error: f.error,
            message: f.message.clone(),
            offset: o,
        },
        _ => Chunk::Error {
            error: f.error,
            message: f.message.clone(),
        },
    };
    chunk.encode(cookie, true, out);
}

/// Encodes and writes one reply; returns read data bytes sent.
fn write_reply(
    w: &mut impl Write,
    r: &Reply,
    ctx: WriterCtx,
    scratch: &mut Vec<u8>,
) -> io::Result<u64> {
    scratch.clear();
    let cookie = r.cookie;
    let fail = |f: &Failure, scratch: &mut Vec<u8>| {
        if ctx.structured {
            error_chunk(cookie, r.what, f, scratch);
        } else {
            scratch.extend_from_slice(
                &SimpleReply {
                    error: f.error,
                    cookie,
                }
                .encode(),
            );
        }
    };
    match (&r.outcome, r.what) {
        (Err(f), _) => fail(f, scratch),
        (Ok(BackendReply::Data(d)), What::Read { offset, len, df }) => {
            if d.len() != len as usize {
                warn!(got = d.len(), want = len, "backend returned a short read");
                fail(
                    &Failure {
                        error: NBD_EIO,
                        message: format!("backend returned {} of {len} bytes", d.len()),
                        offset: None,
                    },
                    scratch,
                );
            } else if !ctx.structured {
                w.write_all(&SimpleReply { error: 0, cookie }.encode())?;
                w.write_all(d)?;
                return Ok(d.len() as u64);
            } else if d.is_empty() {
                Chunk::None.encode(cookie, true, scratch);
            } else if ctx.read_holes && !df && d.iter().all(|&b| b == 0) {
                Chunk::OffsetHole { offset, size: len }.encode(cookie, true, scratch);
            } else {
                let prefix = offset_data_prefix(cookie, true, offset, len);
                write_all_vectored(w, &prefix, d)?;
                return Ok(d.len() as u64);
            }
        }
        (Ok(BackendReply::Extents(e)), What::BlockStatus { len, req_one, .. }) => {
            match (ctx.context_id, sanitize_extents(e, len, req_one)) {
                (Some(context_id), Some(extents)) => Chunk::BlockStatus {
                    context_id,
                    extents,
                }
                .encode(cookie, true, scratch),
                _ => fail(
                    &Failure {
                        error: NBD_EINVAL,
                        message: "no block status for this request".into(),
                        offset: None,
                    },
                    scratch,
                ),
            }
        }
        (Ok(BackendReply::Done), What::Other { .. }) => {
            scratch.extend_from_slice(&SimpleReply { error: 0, cookie }.encode());
        }
        (Ok(other), what) => {
            warn!(?what, reply = ?std::mem::discriminant(other), "backend reply does not match the request");
            fail(
                &Failure {
                    error: NBD_EIO,
                    message: "backend reply does not match the request".into(),
                    offset: None,
                },
                scratch,
            );
        }
    }
    w.write_all(scratch)?;
    Ok(0)
}

/// Writes the prefix and the data; BufWriter passes large data straight
/// through, so a big read is not copied.
fn write_all_vectored(w: &mut impl Write, prefix: &[u8], data: &[u8]) -> io::Result<()> {
    if data.len() < 64 * 1024 {
        w.write_all(prefix)?;
        return w.write_all(data);
    }
    let bufs = [IoSlice::new(prefix), IoSlice::new(data)];
    let n = w.write_vectored(&bufs)?;
    if n < prefix.len() {
        w.write_all(&prefix[n..])?;
        w.write_all(data)
    } else {
        w.write_all(&data[n - prefix.len()..])
    }
}

/// Applies the spec's rules to a backend's extent list: no zero lengths, at
/// most 2^20 descriptors, exactly one (and not past the request) with
/// REQ_ONE, and every descriptor but the last ending before the request's end.
/// `None` if nothing usable remains.
fn sanitize_extents(e: &[Extent], len: u32, req_one: bool) -> Option<Vec<Extent>> {
    if len == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut sum = 0u64;
    for x in e.iter().filter(|x| x.length != 0) {
        if req_one {
            return Some(vec![Extent {
                length: x.length.min(len),
                flags: x.flags,
            }]);
        }
        out.push(*x);
        sum += u64::from(x.length);
        if sum >= u64::from(len) || out.len() >= BLOCK_STATUS_EXTENTS_MAX {
            break;
        }
    }
    if out.is_empty() {
        None
    } else {
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(length: u32, flags: u32) -> Extent {
        Extent { length, flags }
    }

    #[test]
    fn extents_sanitized() {
        assert_eq!(sanitize_extents(&[], 10, false), None);
        assert_eq!(sanitize_extents(&[ext(0, 1)], 10, false), None);
        assert_eq!(sanitize_extents(&[ext(5, 0)], 0, false), None);
        assert_eq!(
            sanitize_extents(&[ext(0, 1), ext(20, 3), ext(5, 0)], 10, true),
            Some(vec![ext(10, 3)])
        );
        // Stops once the request is covered; the last may extend past it.
        assert_eq!(
            sanitize_extents(&[ext(4, 0), ext(8, 3), ext(5, 0)], 10, false),
            Some(vec![ext(4, 0), ext(8, 3)])
        );
        assert_eq!(
            sanitize_extents(&[ext(4, 0), ext(0, 3), ext(5, 1)], 100, false),
            Some(vec![ext(4, 0), ext(5, 1)])
        );
    }

    #[test]
    fn gate_bounds_requests_and_bytes() {
        let g = Arc::new(Gate::new(2, 100));
        assert!(g.acquire(60));
        assert!(g.acquire(0));
        let g2 = Arc::clone(&g);
        let waiter = std::thread::spawn(move || {
            assert!(g2.acquire(50));
            g2.release(50);
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished());
        g.release(0);
        // One slot free, but 60 + 50 > 100 bytes: still waiting.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished());
        g.release(60);
        waiter.join().expect("waiter");
        // An oversized request passes when alone.
        assert!(g.acquire(1000));
        g.release(1000);
        // A closed gate wakes and refuses waiters.
        assert!(g.acquire(0));
        assert!(g.acquire(0));
        let g3 = Arc::clone(&g);
        let blocked = std::thread::spawn(move || g3.acquire(0));
        std::thread::sleep(std::time::Duration::from_millis(20));
        g.close();
        assert!(!blocked.join().expect("blocked"));
    }

    #[test]
    fn simple_and_structured_read_replies() {
        let r = Reply {
            cookie: 9,
            cost: 4,
            what: What::Read {
                offset: 512,
                len: 4,
                df: false,
            },
            outcome: Ok(BackendReply::Data(vec![1, 2, 3, 4])),
        };
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        let simple = WriterCtx {
            structured: false,
            context_id: None,
            read_holes: true,
        };
        write_reply(&mut out, &r, simple, &mut scratch).expect("write");
        assert_eq!(out.len(), 16 + 4);
        assert_eq!(&out[16..], &[1, 2, 3, 4]);
        out.clear();
        let structured = WriterCtx {
            structured: true,
            ..simple
        };
        write_reply(&mut out, &r, structured, &mut scratch).expect("write");
        assert_eq!(out.len(), 20 + 8 + 4);
        out.clear();
        let zeros = Reply {
            outcome: Ok(BackendReply::Data(vec![0; 4])),
            ..r
        };
        write_reply(&mut out, &zeros, structured, &mut scratch).expect("write");
        let crate::proto::ReplyHeader::Chunk(h) =
            crate::proto::ReplyHeader::decode(&out).expect("h")
        else {
            panic!()
        };
        assert_eq!(h.kind, REPLY_TYPE_OFFSET_HOLE);
        out.clear();
        let short = Reply {
            outcome: Ok(BackendReply::Data(vec![0; 3])),
            ..r
        };
        write_reply(&mut out, &short, simple, &mut scratch).expect("write");
        assert_eq!(&out[4..8], &NBD_EIO.to_be_bytes());
    }
}
