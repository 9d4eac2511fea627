//! Stable-toolchain stand-in for the configuration file fuzzer
//! (`fuzz/fuzz_targets/config.rs`): the committed seeds, then seeded random and
//! mutated inputs, through `shale_daemon::fuzzing::config` (driver in
//! `fuzz/standin.rs`).
//!
//! `SHALE_FUZZ_ITERS` raises the number of inputs (default 3000).
//! `cargo test -p shale-daemon --test fuzz_corpus -- --ignored write_seed_corpus`
//! regenerates the seeds.

#[path = "../../../fuzz/standin.rs"]
mod standin;

use std::path::Path;

use shale_daemon::config::{Config, ExportAcl, TlsConfig};
use shale_daemon::fuzzing;
use standin::Entry;

fn targets() -> [Entry; 1] {
    [Entry {
        name: "config",
        run: fuzzing::config,
        random_len_max: 512,
    }]
}

#[test]
fn seed_corpus_replays() {
    standin::replay_seeds(&targets(), 4);
}

/// Every seed parses, so mutations start from files that reach the field checks.
#[test]
fn seeds_parse() {
    for (file, data) in standin::corpus("config") {
        let text = String::from_utf8(data).expect("UTF-8");
        if let Err(e) = Config::from_toml(&text, Path::new(&file)) {
            panic!("config/{file}: {e}");
        }
    }
}

#[test]
fn random_and_mutated_inputs() {
    standin::random_and_mutated(&targets());
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    let mut tls = Config {
        data_dir: "/var/lib/shale".into(),
        ..Config::default()
    };
    tls.nbd.tcp = "[::]:10809".into();
    tls.nbd.tls = Some(TlsConfig {
        cert: "/etc/shale/server.pem".into(),
        key: "/etc/shale/server.key".into(),
        client_ca: Some("/etc/shale/clients-ca.pem".into()),
        required: true,
        exports: vec![ExportAcl {
            name: "default".into(),
            allowed_identities: vec!["backup.example".into(), "db-1".into()],
        }],
    });
    tls.metrics.listen = "127.0.0.1:9477".into();
    tls.log.format = "json".into();
    let mut zoned = Config::default();
    zoned.devices.capacity_mode = shale_daemon::config::CapacityMode::Zoned;
    zoned.devices.drive = Some("zns-qlc".into());
    zoned.devices.default_volume_size = Some(shale_daemon::config::Size("8GiB".into()));
    zoned.devices.spare_factor = 0.3;
    zoned.memory.l2p_cache_size = shale_daemon::config::Size("64m".into());
    zoned.engine.gc_policy = shale_daemon::config::GcPolicy::CostBenefit;
    zoned.engine.compaction_policy = shale_daemon::config::CompactionPolicy::FewestValid;
    zoned.engine.compaction_free_chunks_pct = 35;
    zoned.engine.gc_free_zones_min = 12;
    zoned.engine.checkpoint_interval = shale_daemon::config::Size("512MiB".into());
    standin::write_seeds(
        "config",
        vec![
            ("default", Config::default().to_toml().into_bytes()),
            ("tls-required", tls.to_toml().into_bytes()),
            ("zoned-drive", zoned.to_toml().into_bytes()),
            (
                "partial",
                b"data_dir = \"/srv/shale\"\n\n[devices]\ncache = \"/dev/nvme0n1\"\n\
                  capacity = \"/dev/sda\"\nchunk_size = \"32MiB\"\n\n[nbd]\n\
                  tcp = \"127.0.0.1:10809\"\nconnections_max = 8\n"
                    .to_vec(),
            ),
            (
                "inline-tables",
                b"log = { format = \"text\", level = \"shale_engine=debug,info\" }\n\
                  memory = { md_cache_size = \"16 MiB\" }\n\
                  nbd = { unix_socket = \"\", tcp = \"0.0.0.0:10809\", insecure_tcp = true }\n"
                    .to_vec(),
            ),
        ],
    );
}
