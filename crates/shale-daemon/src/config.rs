//! Configuration of `shale serve`.
//!
//! Precedence: built-in defaults < config file < command-line flags. Paths that
//! are not absolute are relative to the working directory; `{data_dir}` in a path
//! is replaced by the data directory, so the defaults follow `--data-dir`.
//!
//! Invariant: a [`Config`] returned by [`Config::validate`] has passed every check
//! here; the daemon does not re-check fields.
//!
//! Exposure (docs/security.md): by default the daemon listens on nothing but unix
//! sockets (mode 0600), so only the data directory's owner reaches the volumes. NBD
//! over TCP is off until an address is given; a non-loopback address must have TLS
//! required ([`TcpExposure::check`]) unless `nbd.insecure_tcp` says the exposure is
//! intended.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shale_workload::parse_size;

/// Size strings in the config are parsed like the CLI's (`16GiB`, `64m`, `4096`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Size(pub String);

impl Size {
    /// `"auto"`: the engine picks (memory budgets only).
    pub fn is_auto(&self) -> bool {
        self.0.trim().eq_ignore_ascii_case("auto")
    }

    /// The size, or `None` for `"auto"`.
    pub fn bytes_or_auto(&self, field: &'static str) -> Result<Option<u64>, ConfigError> {
        if self.is_auto() {
            Ok(None)
        } else {
            self.bytes(field).map(Some)
        }
    }

    pub fn bytes(&self, field: &'static str) -> Result<u64, ConfigError> {
        parse_size(&self.0).map_err(|e| ConfigError::BadSize {
            field,
            reason: e.to_string(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config field `{field}`: {reason}")]
    BadSize { field: &'static str, reason: String },
    #[error("config field `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(
        "nbd.tcp = \"{addr}\" is not a loopback address and TLS is not configured: anyone \
         who can reach it could read and write every volume, in plaintext. Configure TLS \
         with client certificates (--tls-cert, --tls-key, --tls-client-ca, --tls-required; \
         [nbd.tls] in the config file), listen on loopback (--tcp 127.0.0.1:10809) or on \
         the unix socket only (no --tcp), or accept the exposure with --insecure-tcp \
         (nbd.insecure_tcp = true)"
    )]
    TcpWithoutTls { addr: SocketAddr },
    #[error(
        "nbd.tcp = \"{addr}\" is not a loopback address and TLS is optional there, so \
         plaintext clients would be served: add --tls-required (nbd.tls.required = true), \
         or accept plaintext clients with --insecure-tcp (nbd.insecure_tcp = true)"
    )]
    TcpTlsOptional { addr: SocketAddr },
}

/// How the capacity device presents zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityMode {
    /// Zone emulation over a conventional device (CSAL-BLK).
    Emulated,
    /// A zoned device (ZNS); here, simulated ZNS over a conventional file.
    Zoned,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the embedded default keeps its files and sockets.
    pub data_dir: PathBuf,
    pub devices: DevicesConfig,
    pub nbd: NbdConfig,
    pub admin: AdminConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
    pub memory: MemoryConfig,
    pub engine: EngineKnobs,
    pub vhost: VhostConfig,
    pub ublk: UblkConfig,
}

/// How the engine chooses GC victims among the capacity zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GcPolicy {
    /// `fifo` when the capacity is zones emulated on a conventional device (its own
    /// garbage collection then finds its erase units empty), `greedy` on a zoned drive.
    Auto,
    /// The zone with the fewest valid blocks.
    Greedy,
    /// The zone with the best (1 - u) * age / (1 + u): old, mostly invalid zones
    /// first, so cold data is not moved again and again.
    CostBenefit,
    /// The zone opened first: on a conventional drive the drive's erase units empty
    /// whole, so it copies nothing of its own.
    Fifo,
}

/// Where compaction and GC put the blocks they move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// A stream (an open zone for compaction, one for GC) per volume.
    Volume,
    /// Per group of volumes, a stream per lifetime class: a write's lifetime is
    /// guessed from the block it overwrites, GC splits by age (SepBIT).
    Lifetime,
}

/// Which writes of at least `direct_write_min` go straight to a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirectWritePolicy {
    /// Those that continue a run of large writes of their volume, each where the one
    /// before ended, at least 1 MiB long: sequential data is cold, large writes at
    /// random places are often overwritten soon.
    Sequential,
    /// Every one.
    Any,
}

/// How the engine chooses which cache chunk to compact next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompactionPolicy {
    /// The oldest closed chunk: every block gets the longest time in the cache to
    /// be overwritten.
    Fifo,
    /// The chunk with the fewest valid blocks (starves on skewed workloads).
    FewestValid,
    /// Space freed weighed by the chunk's age since it closed.
    CostBenefit,
}

/// The engine's policies and thresholds. Each takes effect at the next start;
/// `gc_free_zones_min` given at format also sizes the zones held in reserve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineKnobs {
    pub gc_policy: GcPolicy,
    pub compaction_policy: CompactionPolicy,
    pub placement: Placement,
    /// Compaction runs while fewer than this percentage of the cache's chunks are
    /// free (1 to 90).
    pub compaction_free_chunks_pct: u32,
    /// GC runs while fewer capacity zones than this are free (at least the zones
    /// the open streams need in reserve, whatever is set here).
    pub gc_free_zones_min: u32,
    /// Placement streams (1 to 64): each holds a compaction zone and a GC zone open;
    /// volumes share them past this many. Given at format, it also sizes the zones
    /// held in reserve (two per stream).
    pub streams: u32,
    /// Engine shards (1 to 64), each on its own thread with an equal share of the
    /// cache and capacity devices and a slice of every volume. Given at format (the
    /// count is recorded; an open takes the recorded one).
    pub shards: u32,
    /// With several shards on a capacity file: whether the shards share the whole
    /// device, each holding some of its zones and a space manager moving free zones
    /// to the shard that runs short (`true`), or each has a fixed window of it
    /// (`false`, the default: each shard its own I/O ring, no lock on the data path).
    /// Given at format (an open finds which from the devices). Arrays and simulated
    /// drives are always shared; a zoned drive's zones are divided in fixed runs.
    pub shared_capacity: bool,
    /// With several shards: whether they share the cache too, each shard's metadata
    /// in a window of its own and the chunks in one area, free chunks moved to the
    /// shard that writes most (`true`; the capacity is then shared as well), or each
    /// has a fixed window of the cache (`false`, the default). Given at format (an
    /// open finds which from the cache).
    pub shared_cache: bool,
    /// User bytes written between periodic checkpoints (a shorter interval bounds
    /// the journal replayed after a crash); `auto` is 1/16 of the user capacity.
    pub checkpoint_interval: Size,
    /// Where the engine leaves, before it acknowledges writes, what recovers them
    /// after a kill of the daemon: a directory on tmpfs, or `off`.
    pub handoff_dir: String,
    /// Writes at least this large (whole 4 KiB blocks) go straight to a capacity
    /// zone instead of through the cache, answered at the next durability point;
    /// `off` sends every write through the cache. Saves the cache's writes and
    /// reads on large cold data; costs write amplification on data overwritten
    /// soon, which the cache would have absorbed (docs/engine.md, "Direct writes").
    pub direct_write_min: Size,
    /// Which of those writes: `sequential` or `any`.
    pub direct_write_policy: DirectWritePolicy,
    /// With a cold tier (`devices.cold`): reads of a 1 MiB extent that bring the
    /// blocks read from it back to the fast tier; 0 never does.
    pub promote_reads: u32,
}

impl Default for EngineKnobs {
    fn default() -> EngineKnobs {
        let e = shale_engine::Config::default();
        EngineKnobs {
            gc_policy: GcPolicy::Auto,
            compaction_policy: match e.compaction_policy {
                shale_engine::CompactionPolicyKind::FifoOldestClosed => CompactionPolicy::Fifo,
                shale_engine::CompactionPolicyKind::FewestValid => CompactionPolicy::FewestValid,
                shale_engine::CompactionPolicyKind::CostBenefit => CompactionPolicy::CostBenefit,
            },
            placement: match e.placement {
                shale_engine::PlacementKind::Volume => Placement::Volume,
                shale_engine::PlacementKind::Lifetime => Placement::Lifetime,
            },
            compaction_free_chunks_pct: e.compaction_free_chunks_pct,
            gc_free_zones_min: e.gc_free_zones_min,
            streams: e.streams_max,
            shards: 1,
            shared_capacity: false,
            shared_cache: false,
            checkpoint_interval: Size("auto".into()),
            handoff_dir: "/dev/shm".into(),
            direct_write_min: Size(DIRECT_WRITE_MIN_DEFAULT.into()),
            direct_write_policy: match e.direct_write_policy {
                shale_engine::DirectWritePolicy::Sequential => DirectWritePolicy::Sequential,
                shale_engine::DirectWritePolicy::Any => DirectWritePolicy::Any,
            },
            promote_reads: e.promote_reads,
        }
    }
}

/// `direct_write_min` by default: under the sequential policy, runs of writes this
/// large skip the cache (docs/engine.md, "Direct writes": neutral on random
/// workloads, a fifth of the cache's writes on sequential ones).
pub const DIRECT_WRITE_MIN_DEFAULT: &str = "256KiB";

/// Smallest checkpoint interval: each checkpoint writes the dirty part of the
/// L2P, so a tiny interval would spend the cache device on checkpoints.
pub const CHECKPOINT_INTERVAL_MIN: u64 = 16 << 20;
/// Most placement streams taken: each holds two zones open, and more than this
/// spreads a pool's writes over more open zones than a drive keeps active.
pub const STREAMS_MAX: u32 = 64;
/// Largest `gc_free_zones_min` taken: beyond it the reserve swallows small pools
/// and GC never rests on large ones.
pub const GC_FREE_ZONES_MIN_MAX: u32 = 1024;

impl EngineKnobs {
    /// Checks the values; `Ok(Some(bytes))` is an explicit checkpoint interval.
    pub fn validate(&self) -> Result<Option<u64>, ConfigError> {
        let bad = |field, reason: String| Err(ConfigError::Invalid { field, reason });
        if !(1..=90).contains(&self.compaction_free_chunks_pct) {
            return bad(
                "engine.compaction_free_chunks_pct",
                format!(
                    "{} is not between 1 and 90",
                    self.compaction_free_chunks_pct
                ),
            );
        }
        if !(1..=GC_FREE_ZONES_MIN_MAX).contains(&self.gc_free_zones_min) {
            return bad(
                "engine.gc_free_zones_min",
                format!(
                    "{} is not between 1 and {GC_FREE_ZONES_MIN_MAX}",
                    self.gc_free_zones_min
                ),
            );
        }
        if !(1..=STREAMS_MAX).contains(&self.streams) {
            return bad(
                "engine.streams",
                format!("{} is not between 1 and {STREAMS_MAX}", self.streams),
            );
        }
        if !(1..=u32::from(shale_format::SHARDS_MAX)).contains(&self.shards) {
            return bad(
                "engine.shards",
                format!(
                    "{} is not between 1 and {}",
                    self.shards,
                    shale_format::SHARDS_MAX
                ),
            );
        }
        if self.handoff_dir.is_empty() || self.handoff_dir.contains('\0') {
            return bad(
                "engine.handoff_dir",
                "give a directory on tmpfs, or off".into(),
            );
        }
        self.direct_write_min_bytes()?;
        let interval = self
            .checkpoint_interval
            .bytes_or_auto("engine.checkpoint_interval")?;
        if let Some(b) = interval.filter(|&b| b < CHECKPOINT_INTERVAL_MIN) {
            return bad(
                "engine.checkpoint_interval",
                format!(
                    "{b} bytes is below the smallest interval, {} MiB",
                    CHECKPOINT_INTERVAL_MIN >> 20
                ),
            );
        }
        Ok(interval)
    }
}

impl EngineKnobs {
    /// `direct_write_min` in bytes, 0 for `off`.
    pub fn direct_write_min_bytes(&self) -> Result<u64, ConfigError> {
        let field = "engine.direct_write_min";
        if self.direct_write_min.0.trim().eq_ignore_ascii_case("off") {
            return Ok(0);
        }
        let b = self.direct_write_min.bytes(field)?;
        if b == 0 || !b.is_multiple_of(4096) {
            return Err(ConfigError::Invalid {
                field,
                reason: format!("{b} bytes is not a positive multiple of 4 KiB (or off)"),
            });
        }
        Ok(b)
    }
}

/// Volumes served as kernel block devices (`/dev/ublkbN`) through ublk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UblkConfig {
    /// Volume names; each becomes a ublk device (Linux 6.0+, module ublk_drv, root).
    pub volumes: Vec<String>,
    /// Hardware queues per device, each served by its own thread.
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
}

impl Default for UblkConfig {
    fn default() -> UblkConfig {
        UblkConfig {
            volumes: Vec::new(),
            queues: 1,
            depth: 64,
        }
    }
}

/// Volumes served to virtual machines over vhost-user-blk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VhostConfig {
    /// `VOLUME=SOCKET` pairs: each volume is served on its own unix socket (0600),
    /// which QEMU or cloud-hypervisor connects to. `{data_dir}` expands in SOCKET.
    pub user_blk: Vec<String>,
    /// Virtqueues per device (multi-queue), each served by its own thread.
    pub queues: u16,
}

impl Default for VhostConfig {
    fn default() -> VhostConfig {
        VhostConfig {
            user_blk: Vec::new(),
            queues: 1,
        }
    }
}

/// One `vhost.user_blk` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostExport {
    pub volume: String,
    pub socket: PathBuf,
}

/// One device, or the members of an array (`cache = ["a", "b"]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Paths {
    One(String),
    Many(Vec<String>),
}

impl Paths {
    pub fn list(&self) -> Vec<&str> {
        match self {
            Paths::One(p) => vec![p.as_str()],
            Paths::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.list().iter().all(|p| p.is_empty())
    }
}

impl From<&str> for Paths {
    fn from(p: &str) -> Paths {
        Paths::One(p.to_string())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesConfig {
    /// Cache device: a file or block device; two or more are mirrors.
    pub cache: Paths,
    /// Capacity device: a file or block device; two or more are an array (see
    /// `capacity_redundancy`).
    pub capacity: Paths,
    /// How an array of capacity devices keeps its data: `none` (striped), `mirror`,
    /// or `K+M` (Reed–Solomon, K data and M parity shards, one per device).
    pub capacity_redundancy: Option<String>,
    /// Rebuild pace while the array is busy, per second (md's `speed_limit_min`).
    pub rebuild_speed_min: Size,
    /// Rebuild pace while idle, per second; unset for no limit (md's
    /// `speed_limit_max`).
    pub rebuild_speed_max: Option<Size>,
    /// Pace of the background scrub (every valid capacity block read and checked
    /// against its md entry and the L2P, corrupt ones rebuilt from an array's
    /// redundancy), per second; "0" turns it off. Unset: 8MiB.
    pub scrub_speed: Option<Size>,
    /// Sizes used only when the embedded default creates sparse files.
    pub cache_size: Size,
    pub capacity_size: Size,
    pub capacity_mode: CapacityMode,
    /// Optional simulated-drive preset wrapped around the capacity device.
    pub drive: Option<String>,
    /// A cold tier behind the capacity device: a slower file or block device (an SMR
    /// or conventional disk) with zones of the same size; GC moves what it relocates
    /// there and blocks read often come back (docs/engine.md, "Tiers"). One device.
    pub cold: Option<Paths>,
    /// Size of a cold file created by format.
    pub cold_size: Size,
    /// Optional simulated-drive preset wrapped around the cold device (hdd, smr-hm).
    pub cold_drive: Option<String>,
    pub chunk_size: Size,
    pub zone_size: Size,
    /// Spare space as a fraction of the capacity (0.18 = 18%).
    pub spare_factor: f64,
    /// Size of the `default` volume created on first start; unset = all of the user
    /// capacity.
    pub default_volume_size: Option<Size>,
    /// Volumes the first start (and `shale format` without `--volume`) creates instead
    /// of `default`: `NAME[:SIZE][,key=value…]` as `shale format --volume` takes them.
    pub volumes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NbdConfig {
    /// Unix socket path; empty disables it.
    pub unix_socket: String,
    /// TCP listen address; empty (the default) disables it. A non-loopback address
    /// needs TLS required, or `insecure_tcp`.
    pub tcp: String,
    /// Serve NBD over TCP on a non-loopback address without TLS, or with TLS
    /// optional: an explicit opt-in to letting whoever reaches it read and write
    /// every volume.
    pub insecure_tcp: bool,
    pub connections_max: u32,
    pub inflight_per_connection_max: u32,
    pub tls: Option<TlsConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA bundle used to verify client certificates (enables client identities).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// Refuse clients that do not negotiate TLS, and, with `client_ca`, clients that
    /// do not present a certificate it signed.
    #[serde(default)]
    pub required: bool,
    /// Per-export allow lists of client identities (certificate CN or SAN).
    #[serde(default)]
    pub exports: Vec<ExportAcl>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportAcl {
    pub name: String,
    pub allowed_identities: Vec<String>,
}

/// Who can reach the NBD TCP listener, as configured: a pure reading of the config
/// that [`Config::validate`] checks and the daemon logs at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpExposure {
    pub addr: SocketAddr,
    /// 127.0.0.0/8 or ::1: every local user, whatever their uid, and no other host.
    /// Anything else (0.0.0.0, ::, a LAN address, an IPv4-mapped ::ffff:127.0.0.1)
    /// counts as reachable from other hosts.
    pub loopback: bool,
    pub tls: TlsPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    Off,
    /// Clients choose; plaintext clients reach every export without an identity list.
    /// A client CA verifies the certificates clients offer (identities).
    Optional {
        client_ca: bool,
    },
    /// Every client negotiates TLS. With a client CA every client must also present a
    /// certificate it signed (its identities); without one, no client is
    /// authenticated.
    Required {
        client_ca: bool,
    },
}

impl TcpExposure {
    /// Refuses a non-loopback listener that would serve plaintext clients, unless
    /// `insecure_ok` (`nbd.insecure_tcp`). Stricter than asking for TLS alone: with
    /// TLS optional a plaintext client is served as if there were none.
    pub fn check(&self, insecure_ok: bool) -> Result<(), ConfigError> {
        if self.loopback || insecure_ok {
            return Ok(());
        }
        match self.tls {
            TlsPolicy::Off => Err(ConfigError::TcpWithoutTls { addr: self.addr }),
            TlsPolicy::Optional { .. } => Err(ConfigError::TcpTlsOptional { addr: self.addr }),
            TlsPolicy::Required { .. } => Ok(()),
        }
    }

    /// What the daemon warns about at start: the listener is allowed but reaches
    /// further than the unix socket (its owner only). `None` when every client
    /// must present a certificate the client CA signed.
    pub fn warning(&self) -> Option<String> {
        let who = if self.loopback {
            "any local user (any uid)"
        } else {
            "anyone who can reach it"
        };
        let place = if self.loopback {
            "on loopback"
        } else {
            "on a non-loopback address (--insecure-tcp)"
        };
        match self.tls {
            TlsPolicy::Off => Some(format!(
                "NBD over TCP {place} without TLS: {who} can read and write every volume \
                 through it; the unix socket (mode 0600) admits only the data directory's owner"
            )),
            TlsPolicy::Optional { .. } => Some(format!(
                "NBD over TCP {place} with TLS optional: {who} can connect in plaintext and \
                 read and write every export without an identity list"
            )),
            TlsPolicy::Required { client_ca: false } => Some(format!(
                "NBD over TCP with TLS but no client CA (--tls-client-ca): no client is \
                 authenticated, so {who} can read and write every volume, encrypted"
            )),
            TlsPolicy::Required { client_ca: true } => None,
        }
    }
}

/// DRAM the engine may use for its caches. Both fill only as pages are touched, so a
/// budget larger than what it caches costs nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Cached L2P pages. The whole table is 1/1024 of the user capacity (4 bytes per
    /// 4 KiB block; 5 in pools past 16 TiB). `auto` (the default) is the engine's
    /// budget: the whole table up to 32 MiB (32 GiB of volumes), else 5% of it, which
    /// keeps the daemon within 100 MiB per TiB. A miss is a 4 KiB read, a synchronous
    /// one on the engine thread unless a queued request asked for it ahead.
    pub l2p_cache_size: Size,
    /// Cached metadata blocks, used to verify reads (one per 126 data blocks);
    /// `auto` (the default) is the engine's 4 MiB.
    pub md_cache_size: Size,
}

impl Default for MemoryConfig {
    fn default() -> MemoryConfig {
        MemoryConfig {
            l2p_cache_size: Size("auto".into()),
            md_cache_size: Size("auto".into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub socket: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Prometheus text endpoint, e.g. "127.0.0.1:9477"; empty disables it.
    pub listen: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    /// A tracing filter such as `info` or `shale_engine=debug`.
    pub level: String,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            data_dir: PathBuf::from("./shale-data"),
            devices: DevicesConfig::default(),
            nbd: NbdConfig::default(),
            admin: AdminConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
            memory: MemoryConfig::default(),
            engine: EngineKnobs::default(),
            vhost: VhostConfig::default(),
            ublk: UblkConfig::default(),
        }
    }
}

impl Default for DevicesConfig {
    fn default() -> DevicesConfig {
        DevicesConfig {
            cache: "{data_dir}/cache.img".into(),
            capacity: "{data_dir}/capacity.img".into(),
            capacity_redundancy: None,
            rebuild_speed_min: Size("32MiB".into()),
            rebuild_speed_max: None,
            scrub_speed: None,
            cache_size: Size("1GiB".into()),
            capacity_size: Size("16GiB".into()),
            capacity_mode: CapacityMode::Emulated,
            drive: None,
            cold: None,
            cold_size: Size("64GiB".into()),
            cold_drive: None,
            chunk_size: Size("16MiB".into()),
            zone_size: Size("64MiB".into()),
            spare_factor: 0.18,
            default_volume_size: None,
            volumes: Vec::new(),
        }
    }
}

impl Default for NbdConfig {
    fn default() -> NbdConfig {
        NbdConfig {
            unix_socket: "{data_dir}/nbd.sock".into(),
            // Off: a TCP listener on loopback is open to every local user, and the
            // unix socket (0600) only to the data directory's owner.
            tcp: String::new(),
            insecure_tcp: false,
            connections_max: 64,
            inflight_per_connection_max: 256,
            tls: None,
        }
    }
}

impl Default for AdminConfig {
    fn default() -> AdminConfig {
        AdminConfig {
            socket: "{data_dir}/admin.sock".into(),
        }
    }
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            format: "text".into(),
            level: "info".into(),
        }
    }
}

impl Config {
    /// Parses a config file's text; `path` only labels errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text, path)
    }

    pub fn to_toml(&self) -> String {
        // Serialising our own plain structs cannot fail.
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// The `vhost.user_blk` entries, parsed: `VOLUME=SOCKET`, each volume and each
    /// socket at most once.
    pub fn vhost_exports(&self) -> Result<Vec<VhostExport>, ConfigError> {
        let bad = |reason: String| ConfigError::Invalid {
            field: "vhost.user_blk",
            reason,
        };
        if self.vhost.queues == 0 || self.vhost.queues > 64 {
            return Err(ConfigError::Invalid {
                field: "vhost.queues",
                reason: format!("{} (1 to 64)", self.vhost.queues),
            });
        }
        let mut out: Vec<VhostExport> = Vec::new();
        for e in &self.vhost.user_blk {
            let Some((volume, socket)) = e.split_once('=') else {
                return Err(bad(format!("{e:?} is not VOLUME=SOCKET")));
            };
            let (volume, socket) = (volume.trim(), socket.trim());
            let socket = match self.expand(socket) {
                Some(p) if !volume.is_empty() => p,
                _ => return Err(bad(format!("{e:?}: empty volume or socket"))),
            };
            if out.iter().any(|x| x.volume == volume) {
                return Err(bad(format!("volume {volume:?} given twice")));
            }
            if out.iter().any(|x| x.socket == socket) {
                return Err(bad(format!("socket {} given twice", socket.display())));
            }
            out.push(VhostExport {
                volume: volume.to_string(),
                socket,
            });
        }
        Ok(out)
    }

    /// The `ublk.volumes` entries, checked: each volume at most once, queues and
    /// depth in range.
    pub fn ublk_volumes(&self) -> Result<Vec<String>, ConfigError> {
        if !(1..=64).contains(&self.ublk.queues) {
            return Err(ConfigError::Invalid {
                field: "ublk.queues",
                reason: format!("{} (1 to 64)", self.ublk.queues),
            });
        }
        if !(1..=1024).contains(&self.ublk.depth) {
            return Err(ConfigError::Invalid {
                field: "ublk.depth",
                reason: format!("{} (1 to 1024)", self.ublk.depth),
            });
        }
        let mut out: Vec<String> = Vec::new();
        for v in &self.ublk.volumes {
            let v = v.trim();
            if v.is_empty() || out.iter().any(|x| x == v) {
                return Err(ConfigError::Invalid {
                    field: "ublk.volumes",
                    reason: format!("{v:?} is empty or given twice"),
                });
            }
            out.push(v.to_string());
        }
        Ok(out)
    }

    /// Expands `{data_dir}` in a configured path; empty stays empty (= disabled).
    pub fn expand(&self, path: &str) -> Option<PathBuf> {
        if path.is_empty() {
            return None;
        }
        let dir = self.data_dir.to_string_lossy();
        Some(PathBuf::from(path.replace("{data_dir}", &dir)))
    }

    /// Device paths: at least one of each kind, none empty, a redundancy for arrays.
    fn validate_paths(&self) -> Result<(), ConfigError> {
        let d = &self.devices;
        if let Some(cold) = &d.cold {
            let n = cold.list().len();
            if n != 1 || cold.list().iter().any(|p| p.is_empty()) {
                return Err(ConfigError::Invalid {
                    field: "devices.cold",
                    reason: format!(
                        "{n} cold devices: a cold tier is one device (arrays of them are not built)"
                    ),
                });
            }
            if self.engine.shards > 1 {
                return Err(ConfigError::Invalid {
                    field: "devices.cold",
                    reason: "a cold tier runs behind one engine shard (engine.shards = 1)".into(),
                });
            }
        }
        if d.cache.is_empty() || d.capacity.is_empty() {
            return Err(ConfigError::Invalid {
                field: "devices",
                reason: "both a cache and a capacity device are needed".into(),
            });
        }
        if d.cache
            .list()
            .iter()
            .chain(d.capacity.list().iter())
            .any(|p| p.is_empty())
        {
            return Err(ConfigError::Invalid {
                field: "devices",
                reason: "an empty device path".into(),
            });
        }
        self.redundancy().map(|_| ())
    }

    /// The capacity array's redundancy: `None` for a single capacity device.
    pub fn redundancy(&self) -> Result<Option<shale_array::Redundancy>, ConfigError> {
        let d = &self.devices;
        let n = d.capacity.list().len();
        let bad = |reason: String| ConfigError::Invalid {
            field: "devices.capacity_redundancy",
            reason,
        };
        match (&d.capacity_redundancy, n) {
            (None, 1) => Ok(None),
            (None, _) => Err(bad(format!(
                "{n} capacity devices: say how they keep the data (none, mirror, or K+M such as {}+1)",
                n - 1
            ))),
            (Some(r), _) => {
                let r: shale_array::Redundancy =
                    r.parse().map_err(|e: shale_array::LayoutError| bad(e.to_string()))?;
                let (k, _) = r.shards(n).map_err(|e| bad(e.to_string()))?;
                // A row holds one 512 KiB zone group of the engine in K units.
                shale_array::StripeLayout::choose_unit(k, 4096)
                    .map_err(|e| bad(format!("{r}: {e}")))?;
                if n == 1 {
                    return Ok(None);
                }
                Ok(Some(r))
            }
        }
    }

    /// The NBD TCP listener and who can reach it; `None` when TCP is off.
    pub fn tcp_exposure(&self) -> Result<Option<TcpExposure>, ConfigError> {
        if self.nbd.tcp.is_empty() {
            return Ok(None);
        }
        let addr = self
            .nbd
            .tcp
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Invalid {
                field: "nbd.tcp",
                reason: format!("{:?}: {e}", self.nbd.tcp),
            })?;
        let tls = match &self.nbd.tls {
            None => TlsPolicy::Off,
            Some(t) => {
                let client_ca = t.client_ca.is_some();
                if t.required {
                    TlsPolicy::Required { client_ca }
                } else {
                    TlsPolicy::Optional { client_ca }
                }
            }
        };
        Ok(Some(TcpExposure {
            addr,
            // std's is_loopback: 127.0.0.0/8 and ::1 only, which is the rule.
            loopback: addr.ip().is_loopback(),
            tls,
        }))
    }

    /// Checks every field that can be checked without touching devices.
    /// The rebuild and scrub rates parse: a valid config must make a device spec
    /// (the fuzz target checks it).
    fn validate_rates(&self) -> Result<(), ConfigError> {
        let d = &self.devices;
        d.rebuild_speed_min.bytes("devices.rebuild_speed_min")?;
        if let Some(s) = &d.rebuild_speed_max {
            s.bytes("devices.rebuild_speed_max")?;
        }
        if let Some(s) = d.scrub_speed.as_ref().filter(|s| s.0.trim() != "0") {
            s.bytes("devices.scrub_speed")?;
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.vhost_exports()?;
        self.ublk_volumes()?;
        self.engine.validate()?;
        let d = &self.devices;
        for (field, size) in [
            ("devices.cache_size", &d.cache_size),
            ("devices.capacity_size", &d.capacity_size),
            ("devices.cold_size", &d.cold_size),
            ("devices.chunk_size", &d.chunk_size),
            ("devices.zone_size", &d.zone_size),
        ] {
            let bytes = size.bytes(field)?;
            if bytes == 0 || bytes % 4096 != 0 {
                return Err(ConfigError::Invalid {
                    field,
                    reason: format!("{} is not a positive multiple of 4 KiB", size.0),
                });
            }
        }
        for (field, size) in [
            ("memory.l2p_cache_size", &self.memory.l2p_cache_size),
            ("memory.md_cache_size", &self.memory.md_cache_size),
        ] {
            if !size.is_auto() && size.bytes(field)? < 4096 {
                return Err(ConfigError::Invalid {
                    field,
                    reason: format!("{} is less than one 4 KiB page", size.0),
                });
            }
        }
        validate_volumes(d)?;
        if let Some(size) = &d.default_volume_size {
            let bytes = size.bytes("devices.default_volume_size")?;
            if bytes == 0 || bytes % 4096 != 0 {
                return Err(ConfigError::Invalid {
                    field: "devices.default_volume_size",
                    reason: format!("{} is not a positive multiple of 4 KiB", size.0),
                });
            }
        }
        if !(0.0..0.9).contains(&d.spare_factor) || d.spare_factor.is_nan() {
            return Err(ConfigError::Invalid {
                field: "devices.spare_factor",
                reason: format!("{} is not in [0, 0.9)", d.spare_factor),
            });
        }
        self.validate_rates()?;
        self.redundancy()?;
        self.validate_paths()?;
        if let Some(exposure) = self.tcp_exposure()? {
            exposure.check(self.nbd.insecure_tcp)?;
        }
        if self.nbd.tcp.is_empty() && self.nbd.unix_socket.is_empty() {
            return Err(ConfigError::Invalid {
                field: "nbd",
                reason: "neither a unix socket nor a TCP address to listen on".into(),
            });
        }
        if self.nbd.connections_max == 0 || self.nbd.inflight_per_connection_max == 0 {
            return Err(ConfigError::Invalid {
                field: "nbd",
                reason: "connections_max and inflight_per_connection_max must be positive".into(),
            });
        }
        if !self.metrics.listen.is_empty() {
            self.metrics
                .listen
                .parse::<SocketAddr>()
                .map_err(|e| ConfigError::Invalid {
                    field: "metrics.listen",
                    reason: format!("{:?}: {e}", self.metrics.listen),
                })?;
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(ConfigError::Invalid {
                field: "log.format",
                reason: format!("{:?} is neither \"text\" nor \"json\"", self.log.format),
            });
        }
        if let Some(tls) = &self.nbd.tls {
            if self.nbd.tcp.is_empty() {
                return Err(ConfigError::Invalid {
                    field: "nbd.tls",
                    reason: "TLS is configured but TCP is off: give an address \
                             (--tcp ADDR, nbd.tcp)"
                        .into(),
                });
            }
            for acl in &tls.exports {
                if acl.allowed_identities.is_empty() {
                    return Err(ConfigError::Invalid {
                        field: "nbd.tls.exports",
                        reason: format!("export {:?} allows no identity", acl.name),
                    });
                }
            }
        }
        Ok(())
    }
}

/// `[devices] volumes`: each parses, names are unique, and `default_volume_size`
/// (the size of the one volume made without a list) is not set beside them.
fn validate_volumes(d: &DevicesConfig) -> Result<(), ConfigError> {
    let bad = |reason: String| ConfigError::Invalid {
        field: "devices.volumes",
        reason,
    };
    let plans = d
        .volumes
        .iter()
        .map(|v| crate::serve::VolumePlan::parse(v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    crate::serve::check_volume_plans(&plans).map_err(bad)?;
    if !d.volumes.is_empty() && d.default_volume_size.is_some() {
        return Err(bad("set either volumes or default_volume_size (the size of the one volume made without them)".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ublk_volumes_each_once_with_sane_queues() {
        let mut c = Config::default();
        c.ublk.volumes = vec!["a".into(), " b ".into()];
        assert_eq!(c.ublk_volumes().expect("valid"), ["a", "b"]);
        c.ublk.volumes.push("a".into());
        assert!(c.ublk_volumes().is_err());
        c.ublk.volumes.clear();
        c.ublk.queues = 0;
        assert!(c.ublk_volumes().is_err());
        let text = "[ublk]\nvolumes = [\"db\"]\nqueues = 2\ndepth = 128\n";
        let c: Config = toml::from_str(text).expect("parses");
        assert_eq!((c.ublk.queues, c.ublk.depth), (2, 128));
        assert_eq!(c.ublk_volumes().expect("valid"), ["db"]);
    }

    #[test]
    fn vhost_entries_are_volume_equals_socket_each_once() {
        let mut c = Config::default();
        c.vhost.user_blk = vec!["a={data_dir}/a.sock".into(), " b = /run/b.sock ".into()];
        let x = c.vhost_exports().expect("valid entries");
        assert_eq!(x[0].volume, "a");
        assert_eq!(x[0].socket, PathBuf::from("./shale-data/a.sock"));
        assert_eq!(
            (x[1].volume.as_str(), x[1].socket.to_str()),
            ("b", Some("/run/b.sock"))
        );
        for bad in [
            vec!["noequals"],
            vec!["=x.sock"],
            vec!["a="],
            vec!["a=x.sock", "a=y.sock"],
            vec!["a=x.sock", "b=x.sock"],
        ] {
            c.vhost.user_blk = bad.iter().map(|s| s.to_string()).collect();
            assert!(
                matches!(
                    c.validate(),
                    Err(ConfigError::Invalid {
                        field: "vhost.user_blk",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        c.vhost.user_blk.clear();
        c.vhost.queues = 0;
        assert!(c.validate().is_err());
        let text = "[vhost]\nuser_blk = [\"vm=/tmp/vm.sock\"]\nqueues = 2\n";
        let c = Config::from_toml(text, Path::new("t.toml")).expect("parses");
        assert_eq!(c.vhost.queues, 2);
        assert_eq!(c.vhost_exports().expect("valid").len(), 1);
    }

    #[test]
    fn defaults_validate_and_round_trip() {
        let c = Config::default();
        c.validate().expect("defaults are valid");
        let text = c.to_toml();
        let back = Config::from_toml(&text, Path::new("t.toml")).expect("round trip");
        assert_eq!(back, c);
    }

    #[test]
    fn data_dir_expands_into_paths() {
        let c = Config {
            data_dir: "/srv/shale".into(),
            ..Config::default()
        };
        assert_eq!(
            c.expand(&c.nbd.unix_socket),
            Some(PathBuf::from("/srv/shale/nbd.sock"))
        );
        assert_eq!(c.expand(""), None);
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let c = Config::from_toml(
            "data_dir = \"/d\"\n[nbd]\ntcp = \"\"\n",
            Path::new("t.toml"),
        )
        .expect("parses");
        assert_eq!(c.nbd.tcp, "");
        assert_eq!(c.nbd.unix_socket, "{data_dir}/nbd.sock");
        c.validate().expect("valid");
    }

    #[test]
    fn unknown_fields_and_bad_values_are_typed_errors() {
        for text in [
            "bogus = 1",
            "[nbd]\nport = 3",
            "[devices]\nspare_factor = \"lots\"",
        ] {
            assert!(
                matches!(
                    Config::from_toml(text, Path::new("t.toml")),
                    Err(ConfigError::Parse { .. })
                ),
                "{text}"
            );
        }
        let mut c = Config::default();
        c.devices.chunk_size = Size("5000".into());
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { .. })));
        let mut c = Config::default();
        c.devices.capacity_size = Size("16 furlongs".into());
        assert!(matches!(c.validate(), Err(ConfigError::BadSize { .. })));
        let mut c = Config::default();
        c.nbd.tcp = "localhost".into();
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { .. })));
        let mut c = Config::default();
        c.memory.l2p_cache_size = Size("100".into());
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { .. })));
        let c = Config::from_toml("[memory]\nmd_cache_size = \"16MiB\"\n", Path::new("t.toml"))
            .expect("parses");
        assert_eq!(
            c.memory.l2p_cache_size,
            MemoryConfig::default().l2p_cache_size
        );
        c.validate().expect("valid");
        let mut c = Config::default();
        c.devices.spare_factor = f64::NAN;
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { .. })));
        let mut c = Config::default();
        c.nbd.tcp.clear();
        c.nbd.unix_socket.clear();
        assert!(matches!(c.validate(), Err(ConfigError::Invalid { .. })));
    }

    fn tls(required: bool, client_ca: bool) -> TlsConfig {
        TlsConfig {
            cert: "server-cert.pem".into(),
            key: "server-key.pem".into(),
            client_ca: client_ca.then(|| "ca-cert.pem".into()),
            required,
            exports: Vec::new(),
        }
    }

    fn with_tcp(addr: &str, tls: Option<TlsConfig>, insecure_tcp: bool) -> Config {
        let mut c = Config::default();
        c.nbd.tcp = addr.into();
        c.nbd.tls = tls;
        c.nbd.insecure_tcp = insecure_tcp;
        c
    }

    #[test]
    fn default_serves_the_unix_socket_only() {
        let c = Config::default();
        assert_eq!(c.nbd.tcp, "");
        assert!(!c.nbd.insecure_tcp);
        assert_eq!(c.tcp_exposure().expect("valid"), None);
        let text = c.to_toml();
        assert!(text.contains("tcp = \"\""), "{text}");
        assert!(text.contains("insecure_tcp = false"), "{text}");
    }

    #[test]
    fn loopback_tcp_without_tls_is_allowed_with_a_warning() {
        for addr in ["127.0.0.1:10809", "127.9.8.7:0", "[::1]:10809", "[::1]:0"] {
            let c = with_tcp(addr, None, false);
            c.validate().unwrap_or_else(|e| panic!("{addr}: {e}"));
            let e = c.tcp_exposure().expect("parses").expect("tcp on");
            assert!(e.loopback, "{addr}");
            assert_eq!(e.tls, TlsPolicy::Off);
            let w = e.warning().expect("a warning");
            assert!(w.contains("any local user"), "{addr}: {w}");
        }
    }

    #[test]
    fn non_loopback_tcp_without_tls_is_refused_with_the_fix() {
        for addr in [
            "0.0.0.0:10809",
            "0.0.0.0:0",
            "[::]:10809",
            "192.168.1.20:10809",
            "10.0.0.1:0",
            "[fe80::1]:10809",
            // IPv4-mapped loopback is not 127.0.0.0/8 or ::1: refused, to keep the
            // rule one line long.
            "[::ffff:127.0.0.1]:10809",
        ] {
            let c = with_tcp(addr, None, false);
            let err = c.validate().expect_err(addr);
            assert!(
                matches!(err, ConfigError::TcpWithoutTls { addr: a } if a.to_string() == addr),
                "{addr}: {err:?}"
            );
            let msg = err.to_string();
            for fix in [
                "--insecure-tcp",
                "--tls-required",
                "--tls-client-ca",
                "127.0.0.1",
            ] {
                assert!(msg.contains(fix), "{addr}: {msg} lacks {fix}");
            }
            assert!(
                !with_tcp(addr, None, false)
                    .tcp_exposure()
                    .expect("parses")
                    .expect("on")
                    .loopback
            );
        }
    }

    #[test]
    fn insecure_tcp_opts_in_with_a_warning() {
        for addr in ["0.0.0.0:0", "[::]:0", "192.168.1.20:10809"] {
            let c = with_tcp(addr, None, true);
            c.validate().unwrap_or_else(|e| panic!("{addr}: {e}"));
            let w = c.tcp_exposure().expect("parses").expect("on").warning();
            let w = w.expect("a warning");
            assert!(w.contains("anyone who can reach it"), "{w}");
            assert!(w.contains("without TLS"), "{w}");
            // Optional TLS too.
            let c = with_tcp(addr, Some(tls(false, true)), true);
            c.validate().unwrap_or_else(|e| panic!("{addr}: {e}"));
            let w = c.tcp_exposure().expect("parses").expect("on").warning();
            assert!(w.expect("a warning").contains("plaintext"));
        }
    }

    #[test]
    fn non_loopback_tcp_needs_tls_required() {
        for addr in ["0.0.0.0:10809", "[::]:10809", "192.168.1.20:10809"] {
            // TLS optional serves plaintext clients: refused, naming --tls-required.
            let err = with_tcp(addr, Some(tls(false, true)), false)
                .validate()
                .expect_err(addr);
            assert!(matches!(err, ConfigError::TcpTlsOptional { .. }), "{err:?}");
            assert!(err.to_string().contains("--tls-required"), "{err}");
            // Required, with client certificates: allowed, and nothing to warn about.
            let c = with_tcp(addr, Some(tls(true, true)), false);
            c.validate().unwrap_or_else(|e| panic!("{addr}: {e}"));
            let e = c.tcp_exposure().expect("parses").expect("on");
            assert_eq!(e.tls, TlsPolicy::Required { client_ca: true });
            assert_eq!(e.warning(), None);
            // Required without a client CA: allowed (encrypted), but no client is
            // authenticated, which the daemon warns about.
            let c = with_tcp(addr, Some(tls(true, false)), false);
            c.validate().unwrap_or_else(|e| panic!("{addr}: {e}"));
            let w = c.tcp_exposure().expect("parses").expect("on").warning();
            assert!(w.expect("a warning").contains("no client CA"));
        }
        // On loopback TLS optional is allowed, with the plaintext warning.
        let c = with_tcp("127.0.0.1:10809", Some(tls(false, true)), false);
        c.validate().expect("loopback, TLS optional");
        let w = c.tcp_exposure().expect("parses").expect("on").warning();
        assert!(w.expect("a warning").contains("any local user"));
    }

    #[test]
    fn the_config_file_form_is_checked_the_same_way() {
        let parse = |text: &str| Config::from_toml(text, Path::new("t.toml")).expect("parses");
        let c = parse("[nbd]\ntcp = \"0.0.0.0:10809\"\n");
        assert!(matches!(
            c.validate(),
            Err(ConfigError::TcpWithoutTls { .. })
        ));
        let c = parse("[nbd]\ntcp = \"0.0.0.0:10809\"\ninsecure_tcp = true\n");
        assert!(c.nbd.insecure_tcp);
        c.validate().expect("opted in");
        let c = parse(
            "[nbd]\ntcp = \"[::]:10809\"\n[nbd.tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n\
             client_ca = \"ca.pem\"\nrequired = true\n",
        );
        c.validate().expect("TLS required");
        let c =
            parse("[nbd]\ntcp = \"[::]:10809\"\n[nbd.tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n");
        assert!(matches!(
            c.validate(),
            Err(ConfigError::TcpTlsOptional { .. })
        ));
        let c = parse("[nbd]\ntcp = \"127.0.0.1:10809\"\n");
        c.validate().expect("loopback");
        // The opt-in round-trips through --print-config's TOML.
        let c = with_tcp("0.0.0.0:0", None, true);
        assert_eq!(parse(&c.to_toml()), c);
    }

    #[test]
    fn tls_without_tcp_names_the_flag() {
        let mut c = Config::default();
        c.nbd.tls = Some(tls(true, true));
        let err = c.validate().expect_err("TLS without TCP");
        assert!(err.to_string().contains("--tcp"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,400}") {
            if let Ok(c) = Config::from_toml(&text, Path::new("fuzz.toml")) {
                let _ = c.validate();
            }
        }
    }

    #[test]
    fn engine_section_reaches_the_engine_config() {
        let text = "[engine]\ngc_policy = \"cost-benefit\"\ncompaction_policy = \"fewest-valid\"\n\
                    placement = \"lifetime\"\n\
                    compaction_free_chunks_pct = 35\ngc_free_zones_min = 9\n\
                    streams = 4\ncheckpoint_interval = \"256MiB\"\n";
        let c = Config::from_toml(text, Path::new("t.toml")).expect("parses");
        let e = crate::serve::DeviceSpec::from_config(&c)
            .expect("valid")
            .engine_config()
            .expect("engine config");
        assert_eq!(e.gc_policy, shale_engine::GcPolicyKind::CostBenefit);
        assert_eq!(
            e.compaction_policy,
            shale_engine::CompactionPolicyKind::FewestValid
        );
        assert_eq!(e.placement, shale_engine::PlacementKind::Lifetime);
        assert_eq!(e.compaction_free_chunks_pct, 35);
        assert_eq!(e.gc_free_zones_min, 9);
        assert_eq!(e.streams_max, 4);
        assert_eq!(e.checkpoint_interval_bytes, Some(256 << 20));
        // Left out, every knob is the engine's own default.
        let d = crate::serve::DeviceSpec::from_config(&Config::default())
            .expect("valid")
            .engine_config()
            .expect("engine config");
        let engine = shale_engine::Config::default();
        // GC's default follows the capacity: fifo on emulated zones, greedy on zoned.
        assert_eq!(d.gc_policy, shale_engine::GcPolicyKind::Fifo);
        let zoned = Config::from_toml(
            "[devices]\ncapacity_mode = \"zoned\"\n",
            Path::new("t.toml"),
        )
        .expect("parses");
        let z = crate::serve::DeviceSpec::from_config(&zoned)
            .expect("valid")
            .engine_config()
            .expect("engine config");
        assert_eq!(z.gc_policy, shale_engine::GcPolicyKind::Greedy);
        assert_eq!(d.compaction_policy, engine.compaction_policy);
        assert_eq!(d.placement, engine.placement);
        assert_eq!(
            d.compaction_free_chunks_pct,
            engine.compaction_free_chunks_pct
        );
        assert_eq!(d.gc_free_zones_min, engine.gc_free_zones_min);
        assert_eq!(d.streams_max, engine.streams_max);
        assert_eq!(d.checkpoint_interval_bytes, None);
    }

    /// `[devices] cold`: one device, its size and preset taken; two devices, or a cold
    /// tier with several shards, refused by name.
    #[test]
    fn a_cold_device_is_one_device() {
        let c = Config::from_toml(
            "[devices]\ncold = \"/dev/shm/cold.img\"\ncold_size = \"2GiB\"\ncold_drive = \"hdd\"\n",
            Path::new("t.toml"),
        )
        .expect("parses");
        let spec = crate::serve::DeviceSpec::from_config(&c).expect("valid");
        assert_eq!(
            spec.cold.as_deref(),
            Some(std::path::Path::new("/dev/shm/cold.img"))
        );
        assert_eq!(spec.cold_size, 2 << 30);
        assert_eq!(spec.cold_drive.as_deref(), Some("hdd"));
        for (text, want) in [
            ("[devices]\ncold = [\"/a\", \"/b\"]\n", "2 cold devices"),
            (
                "[devices]\ncold = \"/a\"\n[engine]\nshards = 2\n",
                "one engine shard",
            ),
            (
                "[devices]\ncold = \"/a\"\ncold_size = \"1 parsec\"\n",
                "cold_size",
            ),
        ] {
            let err = Config::from_toml(text, Path::new("t.toml"))
                .and_then(|c| crate::serve::DeviceSpec::from_config(&c).map(|_| c))
                .expect_err(text);
            assert!(err.to_string().contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn devices_volumes_are_checked() {
        let ok = Config::from_toml(
            "[devices]\nvolumes = [\"db:1GiB,iops-max=500\", \"rest,mibps-max=none\"]\n",
            Path::new("t.toml"),
        )
        .expect("parses");
        ok.validate().expect("valid");
        let plans = crate::serve::config_volume_plans(&ok).expect("plans");
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].limits.iops_max, 500);
        for (text, says) in [
            ("volumes = [\"a:1GiB\", \"a\"]", "named twice"),
            ("volumes = [\"a,gc=lru\"]", "unknown GC policy"),
            ("volumes = [\"a,speed=max\"]", "unknown option"),
            ("volumes = [\"\"]", "no name"),
            ("volumes = [\"a\", \"b:1GiB\"]", "list it last"),
            ("volumes = [\"a:4097\"]", "multiple of 4 KiB"),
            (
                "volumes = [\"a\"]\ndefault_volume_size = \"1GiB\"",
                "either volumes or default_volume_size",
            ),
        ] {
            let c = Config::from_toml(&format!("[devices]\n{text}\n"), Path::new("t.toml"))
                .expect("parses");
            match c.validate() {
                Err(ConfigError::Invalid { field, reason }) => {
                    assert_eq!(field, "devices.volumes", "{text}");
                    assert!(reason.contains(says), "{text}: {reason}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    /// The engine configuration a config file's text gives.
    fn engine_config_of(text: &str) -> shale_engine::Config {
        let c = Config::from_toml(text, Path::new("t.toml")).expect("parses");
        crate::serve::DeviceSpec::from_config(&c)
            .expect("valid")
            .engine_config()
            .expect("engine config")
    }

    #[test]
    fn every_compaction_policy_reaches_the_engine() {
        for (name, kind) in [
            ("fifo", shale_engine::CompactionPolicyKind::FifoOldestClosed),
            (
                "fewest-valid",
                shale_engine::CompactionPolicyKind::FewestValid,
            ),
            (
                "cost-benefit",
                shale_engine::CompactionPolicyKind::CostBenefit,
            ),
        ] {
            let e = engine_config_of(&format!("[engine]\ncompaction_policy = \"{name}\"\n"));
            assert_eq!(e.compaction_policy, kind, "{name}");
        }
    }

    #[test]
    fn direct_write_min_reaches_the_engine() {
        for (text, bytes) in [
            ("", 256 << 10),
            ("[engine]\ndirect_write_min = \"off\"\n", 0),
            ("[engine]\ndirect_write_min = \"256KiB\"\n", 256 << 10),
        ] {
            let e = engine_config_of(text);
            assert_eq!(e.direct_write_min_bytes, bytes, "{text}");
        }
        for (text, policy) in [
            ("", shale_engine::DirectWritePolicy::Sequential),
            (
                "[engine]\ndirect_write_policy = \"any\"\n",
                shale_engine::DirectWritePolicy::Any,
            ),
            (
                "[engine]\ndirect_write_policy = \"sequential\"\n",
                shale_engine::DirectWritePolicy::Sequential,
            ),
        ] {
            let e = engine_config_of(text);
            assert_eq!(e.direct_write_policy, policy, "{text}");
        }
    }

    #[test]
    fn engine_section_refuses_bad_values_by_name() {
        for (text, field) in [
            ("gc_policy = \"lru\"", None),
            ("compaction_policy = \"lifo\"", None),
            ("placement = \"random\"", None),
            ("streams = 0", Some("engine.streams")),
            ("streams = 65", Some("engine.streams")),
            ("shards = 0", Some("engine.shards")),
            ("shards = 65", Some("engine.shards")),
            ("streams = \"many\"", None),
            (
                "compaction_free_chunks_pct = 0",
                Some("engine.compaction_free_chunks_pct"),
            ),
            (
                "compaction_free_chunks_pct = 91",
                Some("engine.compaction_free_chunks_pct"),
            ),
            ("gc_free_zones_min = 0", Some("engine.gc_free_zones_min")),
            ("gc_free_zones_min = 5000", Some("engine.gc_free_zones_min")),
            (
                "checkpoint_interval = \"1MiB\"",
                Some("engine.checkpoint_interval"),
            ),
            (
                "checkpoint_interval = \"soon\"",
                Some("engine.checkpoint_interval"),
            ),
            ("handoff_dir = \"\"", Some("engine.handoff_dir")),
            ("handoff_dir = 3", None),
            (
                "direct_write_min = \"6KiB\"",
                Some("engine.direct_write_min"),
            ),
            ("direct_write_min = \"0\"", Some("engine.direct_write_min")),
            (
                "direct_write_min = \"big\"",
                Some("engine.direct_write_min"),
            ),
            ("direct_write_policy = \"random\"", None),
        ] {
            let parsed = Config::from_toml(&format!("[engine]\n{text}\n"), Path::new("t.toml"));
            match (parsed, field) {
                // Unknown keys and values: the parser names them.
                (Err(ConfigError::Parse { message, .. }), None) => {
                    assert!(!message.is_empty(), "{text}");
                }
                (Ok(c), Some(field)) => match c.validate() {
                    Err(
                        ConfigError::Invalid { field: f, .. }
                        | ConfigError::BadSize { field: f, .. },
                    ) => {
                        assert_eq!(f, field, "{text}");
                    }
                    other => panic!("{text}: {other:?}"),
                },
                (other, _) => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn every_rate_is_checked_by_validate() {
        for (field, set) in [
            ("devices.rebuild_speed_min", 0),
            ("devices.rebuild_speed_max", 1),
            ("devices.scrub_speed", 2),
        ] {
            let mut c = Config::default();
            let bad = Size("32M7B".into());
            match set {
                0 => c.devices.rebuild_speed_min = bad,
                1 => c.devices.rebuild_speed_max = Some(bad),
                _ => c.devices.scrub_speed = Some(bad),
            }
            match c.validate() {
                Err(
                    ConfigError::BadSize { field: f, .. } | ConfigError::Invalid { field: f, .. },
                ) => {
                    assert_eq!(f, field);
                }
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
