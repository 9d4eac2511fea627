//! `shale volume ...` and `shale stats`: requests to a running daemon's admin socket.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use shale_daemon::admin::{call, AdminRequest};
use shale_workload::{format_size, parse_size};

/// Where the daemon's admin socket is (shared by `volume`, `stats` and `top`).
#[derive(Debug, Args)]
pub struct SocketArgs {
    /// The daemon's admin socket [default: DATA_DIR/admin.sock]
    #[arg(long, global = true)]
    pub admin_socket: Option<PathBuf>,
    /// The daemon's data directory [default: ./shale-data]
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
}

impl SocketArgs {
    pub fn socket(&self) -> PathBuf {
        self.admin_socket.clone().unwrap_or_else(|| {
            self.data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("./shale-data"))
                .join("admin.sock")
        })
    }
}

#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub socket: SocketArgs,
    /// Print JSON
    #[arg(long, global = true)]
    pub json: bool,
}

impl AdminArgs {
    pub fn socket(&self) -> PathBuf {
        self.socket.socket()
    }
}

#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    pub command: VolumeCommand,
    #[command(flatten)]
    pub admin: AdminArgs,
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a volume
    Create {
        name: String,
        size: String,
        #[command(flatten)]
        limits: LimitArgs,
        /// Mapping unit, 4KiB (the default) to 64KiB: the volume's map is that many
        /// times smaller, and smaller writes are read-modify-write of a whole unit
        /// (fixed for the volume's life)
        #[arg(long, value_name = "SIZE", value_parser = parse_map_unit)]
        map_unit: Option<u64>,
        /// Dual mapping: a map of units (64KiB unless --map-unit says) with a sparse
        /// map of 4KiB blocks over it, so data written in runs costs a sixteenth of
        /// the map while small writes are not read-modify-write (fixed for the
        /// volume's life)
        #[arg(long)]
        dual_map: bool,
    },
    /// List volumes
    List,
    /// Change a volume's rate limits or cache share (at once, for connected clients too)
    Set {
        name: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Grow or shrink a volume (a shrink trims the blocks past the new end)
    Resize {
        name: String,
        size: String,
        /// Shrink even with clients connected: they are disconnected first
        #[arg(long)]
        force: bool,
    },
    /// Delete a volume and trim all of its blocks
    Delete {
        name: String,
        /// Delete even with clients connected: they are disconnected first
        #[arg(long)]
        force: bool,
    },
}

/// A volume's rate limits, as flags.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Requests per second at most (reads, writes, trims); `none` or 0 removes the limit
    #[arg(long, value_name = "N|none", value_parser = parse_limit)]
    iops_max: Option<u64>,
    /// MiB per second read and written at most; `none` or 0 removes the limit
    #[arg(long, value_name = "N|none", value_parser = parse_limit)]
    mibps_max: Option<u64>,
    /// Percent of the cache the volume's data may hold before compaction takes its
    /// chunks first (1-100); `none` or 0 removes the share
    #[arg(long, value_name = "PCT|none", value_parser = parse_share)]
    cache_share: Option<u8>,
    /// How GC chooses among the zones holding this volume's data: greedy,
    /// cost-benefit, or pool (the pool's policy)
    #[arg(long, value_name = "POLICY", value_parser = ["greedy", "cost-benefit", "pool"])]
    gc: Option<String>,
}

fn parse_share(s: &str) -> Result<u8, String> {
    if s == "none" {
        return Ok(0);
    }
    match s.trim_end_matches('%').parse::<u8>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(format!("{s:?} is not a percentage from 0 to 100 or none")),
    }
}

fn parse_map_unit(s: &str) -> Result<u64, String> {
    shale_daemon::serve::parse_map_unit(s).map(|l| l.map_unit_bytes())
}

fn parse_limit(s: &str) -> Result<u64, String> {
    if s == "none" {
        return Ok(0);
    }
    s.parse::<u64>()
        .map_err(|e| format!("{s:?} is not a number or none ({e})"))
}

fn size(text: &str) -> Result<u64> {
    let b = parse_size(text).with_context(|| format!("size {text:?}"))?;
    anyhow::ensure!(
        b > 0 && b % 4096 == 0,
        "size {text:?} is not a positive multiple of 4 KiB"
    );
    Ok(b)
}

pub fn volume(args: VolumeArgs) -> Result<()> {
    let req = match &args.command {
        VolumeCommand::Create {
            name,
            size: s,
            limits,
            map_unit,
            dual_map,
        } => AdminRequest::VolumeCreate {
            name: name.clone(),
            size_bytes: size(s)?,
            iops_max: limits.iops_max,
            mibps_max: limits.mibps_max,
            cache_share_pct: limits.cache_share,
            gc: limits.gc.clone(),
            map_unit_bytes: *map_unit,
            dual_map: dual_map.then_some(true),
        },
        VolumeCommand::List => AdminRequest::VolumeList,
        VolumeCommand::Set { name, limits } => {
            anyhow::ensure!(
                limits.iops_max.is_some()
                    || limits.mibps_max.is_some()
                    || limits.cache_share.is_some()
                    || limits.gc.is_some(),
                "nothing to set: give --iops-max, --mibps-max, --cache-share or --gc"
            );
            AdminRequest::VolumeSet {
                name: name.clone(),
                iops_max: limits.iops_max,
                mibps_max: limits.mibps_max,
                cache_share_pct: limits.cache_share,
                gc: limits.gc.clone(),
            }
        }
        VolumeCommand::Resize {
            name,
            size: s,
            force,
        } => AdminRequest::VolumeResize {
            name: name.clone(),
            size_bytes: size(s)?,
            force: *force,
        },
        VolumeCommand::Delete { name, force } => AdminRequest::VolumeDelete {
            name: name.clone(),
            force: *force,
        },
    };
    let v = call(&args.admin.socket(), &req)?;
    if args.admin.json {
        println!("{v}");
        return Ok(());
    }
    match args.command {
        VolumeCommand::List => print!("{}", volume_table(&v)),
        VolumeCommand::Delete { name, .. } => println!("deleted volume {name}"),
        _ => println!(
            "volume {} (id {}): {}{}",
            v["name"].as_str().unwrap_or("?"),
            v["id"],
            format_size(v["size_bytes"].as_u64().unwrap_or(0)),
            limits_text(&v)
        ),
    }
    Ok(())
}

/// ", at most N IOPS and M MiB/s", or nothing without limits.
fn limits_text(v: &serde_json::Value) -> String {
    let mut parts = Vec::new();
    if let Some(n) = v["iops_max"].as_u64() {
        parts.push(format!("{n} IOPS"));
    }
    if let Some(n) = v["mibps_max"].as_u64() {
        parts.push(format!("{n} MiB/s"));
    }
    let mut text = if parts.is_empty() {
        String::new()
    } else {
        format!(", at most {}", parts.join(" and "))
    };
    if let Some(p) = v["cache_share_pct"].as_u64() {
        text.push_str(&format!(", {p}% of the cache"));
    }
    if let Some(g) = v["gc"].as_str() {
        text.push_str(&format!(", {g} GC"));
    }
    if let Some(u) = v["map_unit_bytes"].as_u64().filter(|&u| u != 4096) {
        text.push_str(&format!(", mapped in units of {}", format_size(u)));
        if v["dual_map"].as_bool() == Some(true) {
            text.push_str(" with 4KiB blocks over them (dual)");
        }
    }
    text
}

/// `volume list` as an aligned table: columns as wide as their widest cell.
fn volume_table(v: &serde_json::Value) -> String {
    let header = [
        "NAME",
        "SIZE",
        "ID",
        "UID",
        "CLIENTS",
        "MAX-IOPS",
        "MAX-MIB/S",
        "CACHE-SHARE",
        "GC",
        "MAP-UNIT",
    ];
    let mut rows: Vec<[String; 10]> = vec![header.map(String::from)];
    for vol in v.as_array().into_iter().flatten() {
        let num = |k: &str| vol[k].as_u64().map_or("?".into(), |n| n.to_string());
        let limit = |k: &str| vol[k].as_u64().map_or("-".into(), |n| n.to_string());
        rows.push([
            vol["name"].as_str().unwrap_or("?").to_string(),
            format_size(vol["size_bytes"].as_u64().unwrap_or(0)),
            num("id"),
            num("uid"),
            num("clients"),
            limit("iops_max"),
            limit("mibps_max"),
            vol["cache_share_pct"]
                .as_u64()
                .map_or("-".into(), |n| format!("{n}%")),
            vol["gc"].as_str().unwrap_or("-").to_string(),
            match (vol["map_unit_bytes"].as_u64(), vol["dual_map"].as_bool()) {
                (Some(u), Some(true)) => format!("{}+4KiB", format_size(u)),
                (Some(u), _) => format_size(u),
                (None, _) => "-".into(),
            },
        ]);
    }
    let mut width = [0usize; 10];
    for r in &rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        // The name left-aligned, numbers right-aligned, two spaces between columns.
        let mut line = format!("{:<w$}", r[0], w = width[0]);
        for (cell, w) in r.iter().zip(width).skip(1) {
            line.push_str(&format!("  {cell:>w$}"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub fn stats(args: AdminArgs) -> Result<()> {
    let v = call(&args.socket(), &AdminRequest::Stats)?;
    if args.json {
        println!("{v}");
        return Ok(());
    }
    print!("{}", stats_text(&v));
    Ok(())
}

/// Column where values start, whatever the nesting.
const STATS_VALUE_COLUMN: usize = 35;

/// The human form of `shale stats`: a section per top-level object, nested objects
/// (the drive's `bytes` and `waf`) as indented subsections after their section's own
/// figures, strings without JSON quotes.
fn stats_text(v: &serde_json::Value) -> String {
    let mut out = String::new();
    stats_fields(&mut out, v, 0);
    out
}

fn stats_fields(out: &mut String, v: &serde_json::Value, depth: usize) {
    use std::fmt::Write as _;
    let pad = "  ".repeat(depth);
    let width = STATS_VALUE_COLUMN.saturating_sub(pad.len() + 1);
    let fields: Vec<_> = v.as_object().into_iter().flatten().collect();
    for (k, val) in fields.iter().filter(|(_, val)| !val.is_object()) {
        let _ = match val {
            serde_json::Value::String(s) => writeln!(out, "{pad}{k:<width$} {s}"),
            other => writeln!(out, "{pad}{k:<width$} {other}"),
        };
    }
    for (k, val) in fields.iter().filter(|(_, val)| val.is_object()) {
        let _ = writeln!(out, "{pad}{k}:");
        stats_fields(out, val, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_list_columns_line_up() {
        let v = serde_json::json!([
            {"name": "default", "size_bytes": 8u64 << 30, "id": 0, "uid": 1, "clients": 2},
            {"name": "a-much-longer-name", "size_bytes": 4096, "id": 12, "uid": 130, "clients": 0},
        ]);
        let t = volume_table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        // Every column's right edge (numbers) is at the same place on every line.
        let ends = |l: &str| l.len();
        assert_eq!(ends(lines[0]), ends(lines[1]), "{t}");
        assert_eq!(ends(lines[1]), ends(lines[2]), "{t}");
        let size_col = lines[0].find("SIZE").expect("header") + "SIZE".len();
        for l in &lines[1..] {
            assert_eq!(&l[size_col..size_col + 2], "  ", "{t}");
        }
        assert!(lines[2].starts_with("a-much-longer-name  "), "{t}");
    }

    #[test]
    fn stats_text_nests_the_drive_section() {
        let v = serde_json::json!({
            "bytes": {"user_written": 4096},
            "drive": {
                "preset": "qlc-p5316",
                "since": "daemon start",
                "erases": 3,
                "bytes": {"host_written": 8192, "nand_written": 65536},
                "waf": {"device": 8.0, "total": 16.0},
            },
        });
        let t = stats_text(&v);
        let want = [
            "bytes:",
            "  user_written                     4096",
            "drive:",
            "  erases                           3",
            "  preset                           qlc-p5316",
            "  since                            daemon start",
            "  bytes:",
            "    host_written                   8192",
            "    nand_written                   65536",
            "  waf:",
            "    device                         8.0",
            "    total                          16.0",
        ];
        assert_eq!(t.lines().collect::<Vec<_>>(), want, "{t}");
    }
}
