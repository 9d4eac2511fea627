//! Block-trace replay input: parsers for two CSV formats and the mapping of a trace onto a
//! volume of a different size.
//!
//! **MSR Cambridge** (SNIA IOTTA "MSR Cambridge Traces"), one request per line, no header:
//! `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime` where `Timestamp` is a
//! Windows FILETIME (100 ns ticks), `Type` is `Read` or `Write`, `Offset` and `Size` are
//! bytes and `ResponseTime` is in 100 ns ticks (ignored).
//!
//! **Alibaba** (the 2020 Alibaba Cloud block traces, `io_traces.csv`), one request per
//! line: `device_id,opcode,offset,length,timestamp` where `opcode` is `R` or `W`,
//! `offset` and `length` are bytes and `timestamp` is microseconds. A file holds many
//! virtual disks; a trace is one disk's requests: the first disk in the file, or the
//! one asked for (`alibaba:DEVICE`).
//!
//! **Simple**: `op,offset_bytes,len_bytes` with `op` one of `r`, `w`, `t` (read, write,
//! trim; `read`, `write`, `trim` also accepted). An optional header line starting with
//! `op,` is skipped.
//!
//! Both: blank lines and lines starting with `#` are skipped; `\r\n` line ends are fine;
//! whitespace around fields is ignored. Every malformed line is a [`TraceError`] naming
//! its 1-based line number; parsers never panic (a property test feeds them random bytes).

use std::io::{BufRead, Read};
use std::path::Path;

/// Longest accepted line; longer ones are an error rather than an unbounded allocation.
pub const LINE_BYTES_MAX: usize = 4096;
/// Most records one trace may hold (32 bytes each in memory).
pub const TRACE_RECORDS_MAX: usize = 1 << 26;

/// What a traced request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceOp {
    Read,
    Write,
    Trim,
}

/// One traced request, in the trace's own address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    pub op: TraceOp,
    pub offset: u64,
    pub len: u64,
    /// Time since the trace's first record, if the format records time.
    pub at_ns: Option<u64>,
}

/// Which parser to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    Msr,
    /// One disk of an Alibaba trace: `Some(id)`, or the first disk in the file.
    Alibaba(Option<u64>),
    Simple,
}

impl std::str::FromStr for TraceFormat {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<TraceFormat, TraceError> {
        match s.to_ascii_lowercase().as_str() {
            "msr" => Ok(TraceFormat::Msr),
            "alibaba" => Ok(TraceFormat::Alibaba(None)),
            other if other.starts_with("alibaba:") => other["alibaba:".len()..]
                .trim()
                .parse()
                .map(|id| TraceFormat::Alibaba(Some(id)))
                .map_err(|_| TraceError::UnknownFormat { name: s.into() }),
            "simple" | "csv" => Ok(TraceFormat::Simple),
            _ => Err(TraceError::UnknownFormat { name: s.into() }),
        }
    }
}

/// A parsed trace: at least one record, and the highest byte it touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    records: Vec<TraceRecord>,
    extent_bytes: u64,
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: read failed: {source}")]
    Read {
        line: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: longer than {max} bytes")]
    LineTooLong { line: u64, max: usize },
    #[error("line {line}: not valid UTF-8")]
    NotUtf8 { line: u64 },
    #[error("line {line}: expected {expected} comma-separated fields, found {got}")]
    FieldCount {
        line: u64,
        expected: usize,
        got: usize,
    },
    #[error("line {line}: field {field}: {text:?} is not a whole number")]
    BadNumber {
        line: u64,
        field: &'static str,
        text: String,
    },
    #[error("line {line}: unknown operation {text:?}")]
    BadOp { line: u64, text: String },
    #[error("line {line}: request of zero bytes")]
    ZeroLength { line: u64 },
    #[error("line {line}: offset {offset} + length {len} overflows 64 bits")]
    RangeOverflow { line: u64, offset: u64, len: u64 },
    #[error("trace has more than {max} records")]
    TooManyRecords { max: usize },
    #[error("trace holds no requests")]
    Empty,
    #[error("unknown trace format {name:?} (expected msr, alibaba, alibaba:DEVICE or simple)")]
    UnknownFormat { name: String },
}

impl Trace {
    /// Builds a trace from records (offsets in bytes, lengths non-zero).
    pub fn from_records(records: Vec<TraceRecord>) -> Result<Trace, TraceError> {
        if records.is_empty() {
            return Err(TraceError::Empty);
        }
        if records.len() > TRACE_RECORDS_MAX {
            return Err(TraceError::TooManyRecords {
                max: TRACE_RECORDS_MAX,
            });
        }
        let mut extent_bytes = 0u64;
        for (i, r) in records.iter().enumerate() {
            let line = i as u64 + 1;
            if r.len == 0 {
                return Err(TraceError::ZeroLength { line });
            }
            let end = r
                .offset
                .checked_add(r.len)
                .ok_or(TraceError::RangeOverflow {
                    line,
                    offset: r.offset,
                    len: r.len,
                })?;
            extent_bytes = extent_bytes.max(end);
        }
        Ok(Trace {
            records,
            extent_bytes,
        })
    }

    pub fn parse<R: BufRead>(format: TraceFormat, reader: R) -> Result<Trace, TraceError> {
        match format {
            TraceFormat::Msr => parse_msr(reader),
            TraceFormat::Alibaba(device) => parse_alibaba(reader, device),
            TraceFormat::Simple => parse_simple(reader),
        }
    }

    pub fn from_path(format: TraceFormat, path: &Path) -> Result<Trace, TraceError> {
        let f = std::fs::File::open(path).map_err(|source| TraceError::Open {
            path: path.display().to_string(),
            source,
        })?;
        Trace::parse(format, std::io::BufReader::new(f))
    }

    pub fn records(&self) -> &[TraceRecord] {
        &self.records
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Always false: a `Trace` holds at least one record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// One past the highest byte any record touches.
    pub fn extent_bytes(&self) -> u64 {
        self.extent_bytes
    }

    /// Time of the last record relative to the first (0 for untimed traces).
    pub fn span_ns(&self) -> u64 {
        self.records
            .iter()
            .filter_map(|r| r.at_ns)
            .max()
            .unwrap_or(0)
    }
}

/// Reads lines with a length limit, skipping blank and `#` lines; yields
/// `(line_number, text)`.
struct Lines<R> {
    reader: R,
    line: u64,
    buf: Vec<u8>,
}

impl<R: BufRead> Lines<R> {
    fn new(reader: R) -> Self {
        Lines {
            reader,
            line: 0,
            buf: Vec::new(),
        }
    }

    fn next_line(&mut self) -> Result<Option<(u64, String)>, TraceError> {
        loop {
            self.line += 1;
            self.buf.clear();
            let line = self.line;
            let n = (&mut self.reader)
                .take(LINE_BYTES_MAX as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| TraceError::Read { line, source })?;
            if n == 0 {
                return Ok(None);
            }
            if self.buf.last() == Some(&b'\n') {
                self.buf.pop();
            } else if self.buf.len() > LINE_BYTES_MAX {
                return Err(TraceError::LineTooLong {
                    line,
                    max: LINE_BYTES_MAX,
                });
            }
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
            let text = std::str::from_utf8(&self.buf).map_err(|_| TraceError::NotUtf8 { line })?;
            let text = text.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            return Ok(Some((line, text.to_string())));
        }
    }
}

fn number(line: u64, field: &'static str, text: &str) -> Result<u64, TraceError> {
    text.trim()
        .parse::<u64>()
        .map_err(|_| TraceError::BadNumber {
            line,
            field,
            text: text.trim().into(),
        })
}

fn fields(line: u64, text: &str, expected: usize) -> Result<Vec<&str>, TraceError> {
    let f: Vec<&str> = text.split(',').map(str::trim).collect();
    if f.len() != expected {
        return Err(TraceError::FieldCount {
            line,
            expected,
            got: f.len(),
        });
    }
    Ok(f)
}

fn push(records: &mut Vec<TraceRecord>, line: u64, record: TraceRecord) -> Result<(), TraceError> {
    if record.len == 0 {
        return Err(TraceError::ZeroLength { line });
    }
    if record.offset.checked_add(record.len).is_none() {
        return Err(TraceError::RangeOverflow {
            line,
            offset: record.offset,
            len: record.len,
        });
    }
    if records.len() >= TRACE_RECORDS_MAX {
        return Err(TraceError::TooManyRecords {
            max: TRACE_RECORDS_MAX,
        });
    }
    records.push(record);
    Ok(())
}

/// Parses an MSR Cambridge trace. A header line whose first field is `Timestamp` is
/// skipped. Timestamps become nanoseconds since the first record (earlier-than-first
/// timestamps clamp to 0).
pub fn parse_msr<R: BufRead>(reader: R) -> Result<Trace, TraceError> {
    let mut lines = Lines::new(reader);
    let mut records = Vec::new();
    let mut first_ticks: Option<u64> = None;
    while let Some((line, text)) = lines.next_line()? {
        if records.is_empty()
            && first_ticks.is_none()
            && text
                .split(',')
                .next()
                .is_some_and(|f| f.trim().eq_ignore_ascii_case("timestamp"))
        {
            continue;
        }
        let f = fields(line, &text, 7)?;
        let ticks = number(line, "Timestamp", f[0])?;
        number(line, "DiskNumber", f[2])?;
        let op = match f[3].to_ascii_lowercase().as_str() {
            "read" => TraceOp::Read,
            "write" => TraceOp::Write,
            _ => {
                return Err(TraceError::BadOp {
                    line,
                    text: f[3].into(),
                })
            }
        };
        let offset = number(line, "Offset", f[4])?;
        let len = number(line, "Size", f[5])?;
        number(line, "ResponseTime", f[6])?;
        let t0 = *first_ticks.get_or_insert(ticks);
        let at_ns = ticks.saturating_sub(t0).saturating_mul(100);
        push(
            &mut records,
            line,
            TraceRecord {
                op,
                offset,
                len,
                at_ns: Some(at_ns),
            },
        )?;
    }
    Trace::from_records(records)
}

/// Parses one disk of an Alibaba block trace: `device`'s requests, or those of
/// the first disk in the file. A header line starting with `device_id` is skipped.
/// Timestamps become nanoseconds since the disk's first request (earlier ones clamp
/// to 0). Lines of other disks are checked for shape, not kept.
pub fn parse_alibaba<R: BufRead>(reader: R, device: Option<u64>) -> Result<Trace, TraceError> {
    let mut lines = Lines::new(reader);
    let mut records = Vec::new();
    let mut device = device;
    let mut first_us: Option<u64> = None;
    let mut seen_data = false;
    while let Some((line, text)) = lines.next_line()? {
        if !seen_data && text.to_ascii_lowercase().starts_with("device_id") {
            continue;
        }
        seen_data = true;
        let f = fields(line, &text, 5)?;
        let id = number(line, "device_id", f[0])?;
        let op = match f[1] {
            "R" | "r" => TraceOp::Read,
            "W" | "w" => TraceOp::Write,
            _ => {
                return Err(TraceError::BadOp {
                    line,
                    text: f[1].into(),
                })
            }
        };
        let offset = number(line, "offset", f[2])?;
        let len = number(line, "length", f[3])?;
        let us = number(line, "timestamp", f[4])?;
        if *device.get_or_insert(id) != id {
            continue;
        }
        let t0 = *first_us.get_or_insert(us);
        push(
            &mut records,
            line,
            TraceRecord {
                op,
                offset,
                len,
                at_ns: Some(us.saturating_sub(t0).saturating_mul(1000)),
            },
        )?;
    }
    Trace::from_records(records)
}

/// Parses the simple `op,offset_bytes,len_bytes` format.
pub fn parse_simple<R: BufRead>(reader: R) -> Result<Trace, TraceError> {
    let mut lines = Lines::new(reader);
    let mut records = Vec::new();
    while let Some((line, text)) = lines.next_line()? {
        if records.is_empty() && text.to_ascii_lowercase().starts_with("op,") {
            continue;
        }
        let f = fields(line, &text, 3)?;
        let op = match f[0].to_ascii_lowercase().as_str() {
            "r" | "read" => TraceOp::Read,
            "w" | "write" => TraceOp::Write,
            "t" | "trim" => TraceOp::Trim,
            _ => {
                return Err(TraceError::BadOp {
                    line,
                    text: f[0].into(),
                })
            }
        };
        let offset = number(line, "offset_bytes", f[1])?;
        let len = number(line, "len_bytes", f[2])?;
        push(
            &mut records,
            line,
            TraceRecord {
                op,
                offset,
                len,
                at_ns: None,
            },
        )?;
    }
    Trace::from_records(records)
}

/// How trace offsets are brought into a smaller (or larger) volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceFit {
    /// `offset mod volume`: keeps locality at every scale below the volume size.
    #[default]
    Modulo,
    /// `offset × volume / trace extent`: keeps the trace's layout, compresses its spacing.
    Scale,
}

/// Whether a replay follows the trace's recorded timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceTiming {
    /// Issue as fast as the executor (and any rate limit) allows.
    #[default]
    AsFastAsPossible,
    /// An op may not start before its recorded time (untimed traces: no constraint).
    Recorded,
}

/// Maps one record onto a volume of `usable_bytes` (a positive multiple of `align`):
/// the start is aligned down and the end up to `align`; a request longer than the volume
/// is cut to the volume; one that would run past the end is moved back to end there, so
/// the byte count is kept.
pub(crate) fn fit_record(
    r: &TraceRecord,
    fit: TraceFit,
    extent_bytes: u64,
    usable_bytes: u64,
    align: u64,
) -> (u64, u64) {
    let pos = match fit {
        TraceFit::Modulo => r.offset % usable_bytes,
        TraceFit::Scale => {
            let scaled =
                u128::from(r.offset) * u128::from(usable_bytes) / u128::from(extent_bytes.max(1));
            (scaled as u64).min(usable_bytes - 1)
        }
    };
    let start = pos - pos % align;
    let end = pos
        .saturating_add(r.len)
        .div_ceil(align)
        .saturating_mul(align);
    let len = (end - start).min(usable_bytes);
    let start = start.min(usable_bytes - len);
    (start, len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn alibaba_lines_name_their_faults() {
        let e = parse_alibaba("1,X,0,4096,5\n".as_bytes(), None).expect_err("bad op");
        assert!(matches!(e, TraceError::BadOp { line: 1, .. }), "{e}");
        let e = parse_alibaba("1,W,0,4096\n".as_bytes(), None).expect_err("4 fields");
        assert!(
            matches!(
                e,
                TraceError::FieldCount {
                    expected: 5,
                    got: 4,
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_alibaba("1,W,0,0,5\n".as_bytes(), None).expect_err("zero length");
        assert!(matches!(e, TraceError::ZeroLength { line: 1 }), "{e}");
        // Another disk's malformed line is still an error: the file is broken.
        let e = parse_alibaba("1,W,0,4096,5\n2,W,zero,4096,6\n".as_bytes(), None)
            .expect_err("bad offset");
        assert!(
            matches!(
                e,
                TraceError::BadNumber {
                    line: 2,
                    field: "offset",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn msr_lines_parse_with_relative_time() {
        let text = "128166372003061629,hm,0,Write,3872018432,4096,13508\n\
                    128166372016382155,hm,0,Read,1643409408,65536,153473\r\n\
                    \n# comment\n\
                    128166372026382245,hm,1,write,0,512,100\n";
        let t = parse_msr(text.as_bytes()).expect("parse");
        assert_eq!(t.len(), 3);
        assert_eq!(t.records()[0].op, TraceOp::Write);
        assert_eq!(t.records()[0].at_ns, Some(0));
        assert_eq!(
            t.records()[1].at_ns,
            Some((128166372016382155 - 128166372003061629) * 100)
        );
        assert_eq!(t.records()[1].len, 65536);
        assert_eq!(t.extent_bytes(), 3872018432 + 4096);
    }

    #[test]
    fn msr_header_is_skipped() {
        let text =
            "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n1,h,0,Read,0,4096,1\n";
        assert_eq!(parse_msr(text.as_bytes()).expect("parse").len(), 1);
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_msr("1,h,0,Read,0,4096,1\n2,h,0,Erase,0,4096,1\n".as_bytes())
            .expect_err("must fail");
        assert!(matches!(e, TraceError::BadOp { line: 2, .. }), "{e}");
        let e = parse_msr("1,h,0,Read,0,4096\n".as_bytes()).expect_err("must fail");
        assert!(
            matches!(
                e,
                TraceError::FieldCount {
                    line: 1,
                    expected: 7,
                    got: 6
                }
            ),
            "{e}"
        );
        let e = parse_simple("w,0,4096\n\nw,abc,4096\n".as_bytes()).expect_err("must fail");
        assert!(
            matches!(
                e,
                TraceError::BadNumber {
                    line: 3,
                    field: "offset_bytes",
                    ..
                }
            ),
            "{e}"
        );
        let e = parse_simple("w,0,0\n".as_bytes()).expect_err("must fail");
        assert!(matches!(e, TraceError::ZeroLength { line: 1 }), "{e}");
        let e = parse_simple("w,18446744073709551615,2\n".as_bytes()).expect_err("must fail");
        assert!(
            matches!(e, TraceError::RangeOverflow { line: 1, .. }),
            "{e}"
        );
        let e = parse_simple("# nothing\n".as_bytes()).expect_err("must fail");
        assert!(matches!(e, TraceError::Empty), "{e}");
        let long = format!("w,0,{}\n", "1".repeat(LINE_BYTES_MAX));
        let e = parse_simple(long.as_bytes()).expect_err("must fail");
        assert!(matches!(e, TraceError::LineTooLong { line: 1, .. }), "{e}");
        let e = parse_simple(&b"w,0,4096\n\xff\xfe\n"[..]).expect_err("must fail");
        assert!(matches!(e, TraceError::NotUtf8 { line: 2 }), "{e}");
    }

    #[test]
    fn simple_format_with_header_and_all_ops() {
        let t = parse_simple(
            "op,offset_bytes,len_bytes\nr,0,4096\nw, 8192 ,8192\nt,0,1048576\n".as_bytes(),
        )
        .expect("parse");
        let ops: Vec<TraceOp> = t.records().iter().map(|r| r.op).collect();
        assert_eq!(ops, [TraceOp::Read, TraceOp::Write, TraceOp::Trim]);
        assert_eq!(t.records()[1].offset, 8192);
        assert!(t.records().iter().all(|r| r.at_ns.is_none()));
    }

    #[test]
    fn fit_aligns_and_stays_inside() {
        let r = |offset, len| TraceRecord {
            op: TraceOp::Write,
            offset,
            len,
            at_ns: None,
        };
        // Unaligned 512-byte write inside one 4 KiB block.
        assert_eq!(
            fit_record(&r(4096 + 512, 512), TraceFit::Modulo, 0, 1 << 20, 4096),
            (4096, 4096)
        );
        // Straddling two blocks.
        assert_eq!(
            fit_record(&r(4000, 200), TraceFit::Modulo, 0, 1 << 20, 4096),
            (0, 8192)
        );
        // Wraps modulo the volume.
        assert_eq!(
            fit_record(
                &r((1 << 20) + 8192, 4096),
                TraceFit::Modulo,
                0,
                1 << 20,
                4096
            ),
            (8192, 4096)
        );
        // Running past the end moves back.
        assert_eq!(
            fit_record(
                &r((1 << 20) - 4096, 16384),
                TraceFit::Modulo,
                0,
                1 << 20,
                4096
            ),
            ((1 << 20) - 16384, 16384)
        );
        // Longer than the volume is cut.
        assert_eq!(
            fit_record(&r(0, 1 << 30), TraceFit::Modulo, 0, 1 << 20, 4096),
            (0, 1 << 20)
        );
        // Scale compresses the trace's address space.
        assert_eq!(
            fit_record(&r(1 << 29, 4096), TraceFit::Scale, 1 << 30, 1 << 20, 4096),
            (1 << 19, 4096)
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_the_parsers(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse_msr(&bytes[..]);
            let _ = parse_simple(&bytes[..]);
            let _ = parse_alibaba(&bytes[..], None);
        }

        #[test]
        fn csv_shaped_noise_never_panics(s in "([0-9a-zA-Z,\\- ]{0,40}\n){0,20}") {
            let _ = parse_msr(s.as_bytes());
            let _ = parse_simple(s.as_bytes());
            let _ = parse_alibaba(s.as_bytes(), None);
            let _ = parse_alibaba(s.as_bytes(), Some(1));
        }

        #[test]
        fn fitted_requests_are_aligned_and_inside(
            offset in any::<u64>(), len in 1u64..(1 << 26), slots in 1u64..4096,
            scale in any::<bool>(), align_shift in 9u32..17,
        ) {
            let align = 1u64 << align_shift;
            let usable = slots * align;
            let len = len.min(u64::MAX - offset).max(1);
            let rec = TraceRecord { op: TraceOp::Write, offset, len, at_ns: None };
            let fit = if scale { TraceFit::Scale } else { TraceFit::Modulo };
            let extent = offset.saturating_add(len);
            let (s, l) = fit_record(&rec, fit, extent, usable, align);
            prop_assert!(l > 0 && l % align == 0 && s % align == 0);
            prop_assert!(s + l <= usable, "s {} l {} usable {}", s, l, usable);
        }
    }
}
