//! Stable-toolchain stand-in for the NBD fuzzers: replays the committed seed
//! corpus (`fuzz/corpus/<target>/`) through the same entry points the
//! cargo-fuzz targets use, then random inputs and random mutations of the
//! seeds (driver in `fuzz/standin.rs`). A failing input is printed with the
//! seed that made it.
//!
//! `SHALE_FUZZ_ITERS` raises the number of random inputs (default 3000 per
//! target). `cargo test -p shale-nbd --test fuzz_corpus -- --ignored
//! write_seed_corpus` regenerates the seeds.

#[path = "../../../fuzz/standin.rs"]
mod standin;

use shale_nbd::fuzzing;
use shale_nbd::proto::consts::*;
use shale_nbd::proto::{
    ClientFlags, ClientOption, InfoRequest, MetaContextRequest, OptionHeader, RequestHeader,
};
use standin::Entry;

fn targets() -> [Entry; 2] {
    [
        Entry {
            name: "handshake",
            run: fuzzing::handshake,
            random_len_max: 511,
        },
        Entry {
            name: "request",
            run: fuzzing::requests,
            random_len_max: 511,
        },
    ]
}

#[test]
fn seed_corpus_replays() {
    standin::replay_seeds(&targets(), 5);
}

#[test]
fn random_and_mutated_inputs() {
    standin::random_and_mutated(&targets());
}

fn opt(o: &ClientOption) -> Vec<u8> {
    let mut v = Vec::new();
    o.encode(&mut v);
    v
}

fn go(name: &str) -> ClientOption {
    ClientOption::Go(InfoRequest {
        name: name.into(),
        info_requests: vec![INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION],
    })
}

fn req(kind: u16, flags: u16, offset: u64, length: u32) -> Vec<u8> {
    let mut v = RequestHeader {
        flags,
        kind,
        cookie: 0x1122_3344,
        offset,
        length,
    }
    .encode()
    .to_vec();
    if kind == CMD_WRITE {
        v.extend(std::iter::repeat_n(0xab, length.min(8192) as usize));
    }
    v
}

fn session(mode: u8, fixed: bool, options: &[ClientOption], tail: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    v.extend_from_slice(
        &ClientFlags {
            fixed_newstyle: fixed,
            no_zeroes: fixed,
        }
        .encode(),
    );
    for o in options {
        v.extend(opt(o));
    }
    v.extend_from_slice(tail);
    v
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
fn write_seed_corpus() {
    let meta = |q: &[&str]| {
        ClientOption::SetMetaContext(MetaContextRequest {
            export: "disk".into(),
            queries: q.iter().map(|s| s.to_string()).collect(),
        })
    };
    let traffic: Vec<u8> = [
        req(CMD_WRITE, CMD_FLAG_FUA, 4096, 4096),
        req(CMD_READ, CMD_FLAG_DF, 0, 65536),
        req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20),
        req(CMD_TRIM, 0, 8192, 4096),
        req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 1 << 20),
        req(CMD_CACHE, 0, 0, 4096),
        req(CMD_FLUSH, 0, 0, 0),
        req(CMD_DISC, 0, 0, 0),
    ]
    .concat();
    let mut bad_option = session(0, true, &[], &[]);
    bad_option.extend_from_slice(
        &OptionHeader {
            option: OPT_GO,
            length: 6,
        }
        .encode(),
    );
    bad_option.extend_from_slice(&[0, 0, 0, 50, 0, 0]);
    let handshake: Vec<(&str, Vec<u8>)> = vec![
        (
            "list",
            session(0, true, &[ClientOption::List, ClientOption::Abort], &[]),
        ),
        ("go-simple", session(0, true, &[go("disk")], &traffic)),
        (
            "go-structured-meta",
            session(
                0,
                true,
                &[
                    ClientOption::StructuredReply,
                    meta(&["base:allocation"]),
                    go("disk"),
                ],
                &traffic,
            ),
        ),
        (
            "list-meta",
            session(
                0,
                true,
                &[
                    ClientOption::StructuredReply,
                    ClientOption::ListMetaContext(MetaContextRequest {
                        export: "disk".into(),
                        queries: vec![],
                    }),
                    meta(&["base:", "x-a:b"]),
                ],
                &[],
            ),
        ),
        (
            "export-name",
            session(
                0,
                false,
                &[ClientOption::ExportName { name: "ro".into() }],
                &traffic,
            ),
        ),
        (
            "export-name-unknown",
            session(
                0,
                true,
                &[ClientOption::ExportName { name: "zzz".into() }],
                &[],
            ),
        ),
        (
            "starttls-forced",
            session(
                2,
                true,
                &[ClientOption::List, ClientOption::StartTls, go("fuzz")],
                &traffic,
            ),
        ),
        (
            "selective-secret",
            session(
                1,
                true,
                &[go("secret"), ClientOption::StartTls, go("secret")],
                &[],
            ),
        ),
        (
            "info-unknown",
            session(
                0,
                true,
                &[
                    ClientOption::Info(InfoRequest {
                        name: "nope".into(),
                        info_requests: vec![],
                    }),
                    ClientOption::Unknown { option: 0xdead },
                    ClientOption::Unknown {
                        option: OPT_EXTENDED_HEADERS,
                    },
                    go(""),
                ],
                &[],
            ),
        ),
        ("bad-go-length", bad_option),
    ];
    let request: Vec<(&str, Vec<u8>)> = vec![
        ("all-simple", [vec![0x0c], traffic.clone()].concat()),
        ("all-structured", [vec![0x2d], traffic.clone()].concat()),
        ("read-only", [vec![0x1c], traffic.clone()].concat()),
        (
            "small-payload",
            [
                vec![0x4c],
                req(CMD_WRITE, 0, 0, 8192),
                req(CMD_READ, 0, 0, 8192),
            ]
            .concat(),
        ),
        (
            "bad",
            [
                vec![0x0d],
                req(42, 0, 0, 0),
                req(CMD_READ, 0xffff, u64::MAX, u32::MAX),
                vec![0xde; 28],
            ]
            .concat(),
        ),
        ("reply-chunks", {
            let mut v = vec![0x01];
            for c in [
                shale_nbd::proto::Chunk::OffsetData {
                    offset: 0,
                    data: vec![1, 2, 3],
                },
                shale_nbd::proto::Chunk::OffsetHole {
                    offset: 9,
                    size: 4096,
                },
                shale_nbd::proto::Chunk::BlockStatus {
                    context_id: 1,
                    extents: vec![shale_nbd::proto::Extent {
                        length: 4096,
                        flags: 3,
                    }],
                },
                shale_nbd::proto::Chunk::ErrorOffset {
                    error: 5,
                    message: "bad".into(),
                    offset: 7,
                },
                shale_nbd::proto::Chunk::None,
            ] {
                c.encode(1, false, &mut v);
            }
            v
        }),
    ];
    standin::write_seeds("handshake", handshake);
    standin::write_seeds("request", request);
}
