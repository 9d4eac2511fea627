//! Configuration of `shale serve`.
//!
//! Precedence: built-in defaults < config file < command-line flags. Paths that
//! are not absolute are relative to the working directory; `{data_dir}` in a path
//! is replaced by the data directory, so the defaults follow `--data-dir`.
//!
//! Invariant: a [`Config`] returned by [`Config::validate`] has passed every check
//! here; the daemon does not re-check fields.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shale_workload::parse_size;

/// Size strings in the config are parsed like the CLI's (`16GiB`, `64m`, `4096`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Size(pub String);

impl Size {
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesConfig {
    /// Cache device: a file or block device.
    pub cache: String,
    /// Capacity device: a file or block device.
    pub capacity: String,
    /// Sizes used only when the embedded default creates sparse files.
    pub cache_size: Size,
    pub capacity_size: Size,
    pub capacity_mode: CapacityMode,
    /// Optional simulated-drive preset wrapped around the capacity device.
    pub drive: Option<String>,
    pub chunk_size: Size,
    pub zone_size: Size,
    /// Spare space as a fraction of the capacity (0.18 = 18%).
    pub spare_factor: f64,
    /// Size of the `default` volume created on first start; unset = all of the user
    /// capacity.
    pub default_volume_size: Option<Size>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NbdConfig {
    /// Unix socket path; empty disables it.
    pub unix_socket: String,
    /// TCP listen address; empty disables it. Loopback unless configured otherwise.
    pub tcp: String,
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

/// DRAM the engine may use for its caches. Both fill only as pages are touched, so a
/// budget larger than what it caches costs nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Cached L2P pages. The whole table is 1/1024 of the user capacity (4 bytes per
    /// 4 KiB block), so the default keeps all of it in DRAM up to 1 TiB of volumes;
    /// beyond that, a miss is a synchronous 4 KiB read on the engine thread (and a
    /// write-back if the evicted page was dirty).
    pub l2p_cache_size: Size,
    /// Cached metadata blocks, used to verify reads (one per 126 data blocks).
    pub md_cache_size: Size,
}

impl Default for MemoryConfig {
    fn default() -> MemoryConfig {
        MemoryConfig {
            l2p_cache_size: Size("1GiB".into()),
            md_cache_size: Size("64MiB".into()),
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
        }
    }
}

impl Default for DevicesConfig {
    fn default() -> DevicesConfig {
        DevicesConfig {
            cache: "{data_dir}/cache.img".into(),
            capacity: "{data_dir}/capacity.img".into(),
            cache_size: Size("1GiB".into()),
            capacity_size: Size("16GiB".into()),
            capacity_mode: CapacityMode::Emulated,
            drive: None,
            chunk_size: Size("16MiB".into()),
            zone_size: Size("64MiB".into()),
            spare_factor: 0.18,
            default_volume_size: None,
        }
    }
}

impl Default for NbdConfig {
    fn default() -> NbdConfig {
        NbdConfig {
            unix_socket: "{data_dir}/nbd.sock".into(),
            tcp: "127.0.0.1:10809".into(),
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

    /// Expands `{data_dir}` in a configured path; empty stays empty (= disabled).
    pub fn expand(&self, path: &str) -> Option<PathBuf> {
        if path.is_empty() {
            return None;
        }
        let dir = self.data_dir.to_string_lossy();
        Some(PathBuf::from(path.replace("{data_dir}", &dir)))
    }

    /// Checks every field that can be checked without touching devices.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let d = &self.devices;
        for (field, size) in [
            ("devices.cache_size", &d.cache_size),
            ("devices.capacity_size", &d.capacity_size),
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
            if size.bytes(field)? < 4096 {
                return Err(ConfigError::Invalid {
                    field,
                    reason: format!("{} is less than one 4 KiB page", size.0),
                });
            }
        }
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
        if d.cache.is_empty() || d.capacity.is_empty() {
            return Err(ConfigError::Invalid {
                field: "devices",
                reason: "both a cache and a capacity device are needed".into(),
            });
        }
        if !self.nbd.tcp.is_empty() {
            self.nbd
                .tcp
                .parse::<SocketAddr>()
                .map_err(|e| ConfigError::Invalid {
                    field: "nbd.tcp",
                    reason: format!("{:?}: {e}", self.nbd.tcp),
                })?;
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
                    reason: "TLS is configured but TCP is disabled".into(),
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

#[cfg(test)]
mod tests {
    use super::*;

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

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,400}") {
            if let Ok(c) = Config::from_toml(&text, Path::new("fuzz.toml")) {
                let _ = c.validate();
            }
        }
    }
}
