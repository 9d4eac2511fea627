//! `shale serve` and `shale format`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use shale_daemon::config::{CapacityMode, Config, Paths, Size, TlsConfig};
use shale_daemon::serve::{self, DeviceSpec, FormatProgress};
use shale_engine::NoProgress;

use crate::progress::{BarSlot, OpenBar};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Mode {
    /// Zone emulation over a conventional device (CSAL-BLK).
    Emulated,
    /// A zoned device (ZNS rules and open/active-zone limits).
    Zoned,
}

impl From<Mode> for CapacityMode {
    fn from(m: Mode) -> CapacityMode {
        match m {
            Mode::Emulated => CapacityMode::Emulated,
            Mode::Zoned => CapacityMode::Zoned,
        }
    }
}

/// Device and geometry options shared by `serve` and `format`.
#[derive(Debug, Args)]
pub struct DeviceArgs {
    /// Directory of the embedded default's files and sockets [default: ./shale-data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Cache device: file or block device; repeat for mirrors [default: DATA_DIR/cache.img]
    #[arg(long)]
    pub cache: Vec<String>,
    /// Capacity device: file, block device or zoned drive (ZNS, SMR: used through its own
    /// zones); repeat for an array [default: DATA_DIR/capacity.img]
    #[arg(long)]
    pub capacity: Vec<String>,
    /// How an array of capacity devices keeps its data: none (striped), mirror, or
    /// K+M (Reed-Solomon: K data and M parity shards, e.g. 4+1)
    #[arg(long, value_name = "none|mirror|K+M")]
    pub capacity_redundancy: Option<String>,
    /// Rebuild pace of an array while it is busy, per second [default: 32MiB]
    #[arg(long)]
    pub rebuild_speed_min: Option<String>,
    /// Rebuild pace of an array while it is idle, per second [default: no limit]
    #[arg(long)]
    pub rebuild_speed_max: Option<String>,
    /// Background scrub pace, per second; 0 turns it off [default: 8MiB]
    #[arg(long)]
    pub scrub_speed: Option<String>,
    /// Size of a cache file created by format [default: 1GiB]
    #[arg(long)]
    pub cache_size: Option<String>,
    /// Size of a capacity file created by format [default: 16GiB]
    #[arg(long)]
    pub capacity_size: Option<String>,
    /// How a conventional capacity device presents zones (a zoned drive has its own)
    /// [default: emulated]
    #[arg(long, value_enum)]
    pub capacity_mode: Option<Mode>,
    /// Simulated-drive preset around the capacity device (qlc-p5316, tlc, optane, zns-qlc)
    #[arg(long)]
    pub drive: Option<String>,
    /// A cold tier behind the capacity device: a slower file or block device (an SMR
    /// or conventional disk), zones of the same size; one device
    #[arg(long, value_name = "DEV")]
    pub cold: Vec<String>,
    /// Size of a cold file created by format [default: 64GiB]
    #[arg(long)]
    pub cold_size: Option<String>,
    /// Simulated-drive preset around the cold device (hdd, smr-hm)
    #[arg(long)]
    pub cold_drive: Option<String>,
    /// Cache chunk size [default: 16MiB]
    #[arg(long)]
    pub chunk_size: Option<String>,
    /// Capacity zone size, for zone emulation (a zoned drive has its own) [default: 64MiB]
    #[arg(long)]
    pub zone_size: Option<String>,
    /// Spare factor of the capacity device, 0..0.9 [default: 0.18]
    #[arg(long)]
    pub spare_factor: Option<f64>,
    /// Size of the default volume created on first start [default: all user capacity]
    #[arg(long)]
    pub default_volume_size: Option<String>,
}

impl DeviceArgs {
    fn apply(&self, c: &mut Config) {
        if let Some(d) = &self.data_dir {
            c.data_dir = d.clone();
        }
        let d = &mut c.devices;
        let paths = |v: &[String]| match v {
            [one] => Paths::One(one.clone()),
            many => Paths::Many(many.to_vec()),
        };
        if !self.cache.is_empty() {
            d.cache = paths(&self.cache);
        }
        if !self.capacity.is_empty() {
            d.capacity = paths(&self.capacity);
        }
        if let Some(v) = &self.capacity_redundancy {
            d.capacity_redundancy = Some(v.clone());
        }
        if let Some(v) = &self.rebuild_speed_min {
            d.rebuild_speed_min = Size(v.clone());
        }
        if let Some(v) = &self.rebuild_speed_max {
            d.rebuild_speed_max = Some(Size(v.clone()));
        }
        if let Some(v) = &self.scrub_speed {
            d.scrub_speed = Some(Size(v.clone()));
        }
        if let Some(v) = &self.cache_size {
            d.cache_size = Size(v.clone());
        }
        if let Some(v) = &self.capacity_size {
            d.capacity_size = Size(v.clone());
        }
        if let Some(v) = self.capacity_mode {
            d.capacity_mode = v.into();
        }
        if let Some(v) = &self.drive {
            d.drive = Some(v.clone());
        }
        if !self.cold.is_empty() {
            d.cold = Some(paths(&self.cold));
        }
        if let Some(v) = &self.cold_size {
            d.cold_size = Size(v.clone());
        }
        if let Some(v) = &self.cold_drive {
            d.cold_drive = Some(v.clone());
        }
        if let Some(v) = &self.chunk_size {
            d.chunk_size = Size(v.clone());
        }
        if let Some(v) = &self.zone_size {
            d.zone_size = Size(v.clone());
        }
        if let Some(v) = self.spare_factor {
            d.spare_factor = v;
        }
        if let Some(v) = &self.default_volume_size {
            d.default_volume_size = Some(Size(v.clone()));
        }
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file; flags override it
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub devices: DeviceArgs,
    /// NBD unix socket ("" disables) [default: DATA_DIR/nbd.sock]
    #[arg(long)]
    pub unix_socket: Option<String>,
    /// Also serve NBD over TCP on ADDR, e.g. 127.0.0.1:10809 (loopback: every local
    /// user can connect); a non-loopback address needs --tls-required or
    /// --insecure-tcp [default: off, unix socket only]
    #[arg(long, value_name = "ADDR")]
    pub tcp: Option<String>,
    /// Allow --tcp on a non-loopback address without required TLS: whoever reaches it
    /// can read and write every volume
    #[arg(long)]
    pub insecure_tcp: bool,
    /// Admin socket [default: DATA_DIR/admin.sock]
    #[arg(long)]
    pub admin_socket: Option<String>,
    /// Prometheus metrics listen address, e.g. 127.0.0.1:9477 [default: off]
    #[arg(long)]
    pub metrics: Option<String>,
    /// Serve a volume to a virtual machine over vhost-user-blk on a unix socket,
    /// VOLUME=SOCKET (repeatable; added to the config file's `vhost.user_blk`)
    #[arg(long, value_name = "VOLUME=SOCKET")]
    pub vhost_user_blk: Vec<String>,
    /// Virtqueues per vhost-user-blk device [default: 1]
    #[arg(long)]
    pub vhost_queues: Option<u16>,
    /// Serve a volume as a kernel block device, /dev/ublkbN, through ublk (Linux
    /// 6.0+ with ublk_drv, as root; repeatable; added to the config file's
    /// `ublk.volumes`)
    #[arg(long = "ublk", value_name = "VOLUME")]
    pub ublk: Vec<String>,
    /// Hardware queues per ublk device [default: 1]
    #[arg(long)]
    pub ublk_queues: Option<u16>,
    /// TLS certificate chain (PEM) for NBD over TCP
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM)
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle to verify client certificates (gives clients identities)
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Refuse clients that do not use TLS, and with --tls-client-ca those without a
    /// certificate it signed
    #[arg(long, requires = "tls_cert")]
    pub tls_required: bool,
    /// DRAM for cached L2P pages (the table is 1/1024 of the user capacity), or auto: the whole table up to 32 MiB, else 5% of it [default: auto]
    #[arg(long)]
    pub l2p_cache_size: Option<String>,
    /// DRAM for cached metadata blocks used to verify reads, or auto (4 MiB) [default: auto]
    #[arg(long)]
    pub md_cache_size: Option<String>,
    /// Log format: text or json [default: text]
    #[arg(long)]
    pub log_format: Option<String>,
    /// Log filter, e.g. info or shale_engine=debug [default: info]
    #[arg(long)]
    pub log_level: Option<String>,
    /// Directory on tmpfs where the engine leaves, before it acknowledges writes,
    /// what recovers them after a kill of the daemon; off: none (a kill loses writes
    /// acknowledged since the last flush) [default: /dev/shm]
    #[arg(long, value_name = "DIR|off", overrides_with = "handoff_dir")]
    pub handoff_dir: Option<String>,
    /// Print the effective configuration as TOML and exit
    #[arg(long)]
    pub print_config: bool,
}

pub fn load_config(path: Option<&PathBuf>) -> Result<Config> {
    match path {
        Some(p) => Config::load(p).map_err(Into::into),
        None => Ok(Config::default()),
    }
}

pub fn main(args: ServeArgs) -> Result<()> {
    let mut c = load_config(args.config.as_ref())?;
    args.devices.apply(&mut c);
    if let Some(v) = &args.unix_socket {
        c.nbd.unix_socket = v.clone();
    }
    if let Some(v) = &args.tcp {
        c.nbd.tcp = v.clone();
    }
    c.vhost.user_blk.extend(args.vhost_user_blk.iter().cloned());
    c.ublk.volumes.extend(args.ublk.iter().cloned());
    if let Some(q) = args.ublk_queues {
        c.ublk.queues = q;
    }
    if let Some(q) = args.vhost_queues {
        c.vhost.queues = q;
    }
    // The flag only opts in; it cannot undo `insecure_tcp = true` in the file.
    if args.insecure_tcp {
        c.nbd.insecure_tcp = true;
    }
    if let Some(v) = &args.admin_socket {
        c.admin.socket = v.clone();
    }
    if let Some(v) = &args.metrics {
        c.metrics.listen = v.clone();
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let exports = c.nbd.tls.take().map(|t| t.exports).unwrap_or_default();
        c.nbd.tls = Some(TlsConfig {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.tls_client_ca.clone(),
            required: args.tls_required,
            exports,
        });
    }
    if let Some(v) = &args.l2p_cache_size {
        c.memory.l2p_cache_size = Size(v.clone());
    }
    if let Some(v) = &args.md_cache_size {
        c.memory.md_cache_size = Size(v.clone());
    }
    if let Some(v) = &args.log_format {
        c.log.format = v.clone();
    }
    if let Some(v) = &args.log_level {
        c.log.level = v.clone();
    }
    if let Some(v) = &args.handoff_dir {
        c.engine.handoff_dir = v.clone();
    }
    c.validate().context("invalid configuration")?;
    if args.print_config {
        print!("{}", c.to_toml());
        return Ok(());
    }
    let slot = BarSlot::default();
    crate::logging::init_above_bar(&c.log.format, &c.log.level, slot.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing the signal handler")?;
    }
    // The open's steps as a bar on a terminal; otherwise the log lines say it all.
    let result = if std::io::stderr().is_terminal() {
        let mut bar = OpenBar::new(slot);
        let r = serve::run(&c, &stop, &mut bar);
        bar.finish();
        r
    } else {
        serve::run(&c, &stop, &mut NoProgress)
    };
    result.context("shale serve")?;
    Ok(())
}

#[derive(Debug, Args)]
pub struct FormatArgs {
    /// TOML config file; flags override it
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub devices: DeviceArgs,
    /// Volume to create, NAME[:SIZE][,key=value…] (repeatable; one without a size takes
    /// what the ones before it left; keys: iops-max, mibps-max, cache-share, gc,
    /// map-unit, dual-map=yes)
    /// [default: one volume named default]
    #[arg(long = "volume")]
    pub volumes: Vec<String>,
    /// Overwrite an existing Shale
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

pub fn format(args: FormatArgs) -> Result<()> {
    let mut c = load_config(args.config.as_ref())?;
    args.devices.apply(&mut c);
    let spec = DeviceSpec::from_config(&c).context("invalid configuration")?;
    let mut volumes = Vec::new();
    for v in &args.volumes {
        volumes.push(serve::VolumePlan::parse(v).map_err(anyhow::Error::msg)?);
    }
    serve::check_volume_plans(&volumes).map_err(anyhow::Error::msg)?;
    if volumes.is_empty() {
        volumes = serve::config_volume_plans(&c).context("invalid configuration")?;
    }
    if volumes.is_empty() {
        volumes.push(serve::VolumePlan::named(serve::DEFAULT_VOLUME));
    }
    // A bar on a terminal (the step log lines would only interleave with it);
    // otherwise one log line per step.
    let terminal = std::io::stderr().is_terminal();
    crate::logging::init("text", if terminal { "warn" } else { "info" })?;
    let created = if terminal {
        let mut bar = BarProgress::new();
        let r = serve::format(&spec, args.force, &volumes, &mut bar);
        bar.finish();
        r
    } else {
        serve::format(&spec, args.force, &volumes, &mut serve::LogOnly)
    }
    .context("shale format")?;
    if args.json {
        let v: Vec<_> = created
            .iter()
            .map(|v| {
                let limit = |n: u64| (n > 0).then_some(n);
                serde_json::json!({
                    "id": v.id.0,
                    "name": v.name,
                    "size_bytes": v.size_bytes,
                    "iops_max": limit(v.limits.iops_max),
                    "mibps_max": limit(v.limits.bytes_per_sec_max >> 20),
                    "cache_share_pct": limit(u64::from(v.limits.cache_share_pct)),
                    "gc": shale_daemon::serve::volume_gc_name(v.limits.gc),
                    "map_unit_bytes": v.layout.map_unit_bytes(),
                    "dual_map": v.layout.dual,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "cache": spec.cache, "capacity": spec.capacity, "volumes": v })
        );
    } else {
        let names = |p: &[PathBuf]| {
            p.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "formatted cache {} and capacity {}{}{}",
            names(&spec.cache),
            names(&spec.capacity),
            spec.redundancy
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
            spec.cold
                .as_ref()
                .map(|c| format!(", cold tier {}", c.display()))
                .unwrap_or_default()
        );
        for v in created {
            println!("  volume {:<16} {:>16} bytes", v.name, v.size_bytes);
        }
    }
    Ok(())
}

/// The steps of a format as a progress bar; the spinner keeps turning while a long
/// step (a discard of a whole drive) runs, and each finished step stays printed.
struct BarProgress {
    bar: indicatif::ProgressBar,
}

impl BarProgress {
    fn new() -> BarProgress {
        let bar = indicatif::ProgressBar::new(1);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} format [{bar:24}] {pos}/{len} {msg} ({elapsed})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(100));
        BarProgress { bar }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl FormatProgress for BarProgress {
    fn begin(&mut self, index: usize, total: usize, step: &str) {
        self.bar.set_length(total as u64);
        self.bar.set_position(index as u64);
        self.bar.set_message(step.to_string());
    }

    fn end(&mut self, step: &str, elapsed: Duration, detail: &str) {
        self.bar.inc(1);
        let sep = if detail.is_empty() { "" } else { ": " };
        self.bar.println(format!(
            "  {step}{sep}{detail} ({:.2} s)",
            elapsed.as_secs_f64()
        ));
    }
}
