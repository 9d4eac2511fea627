//! `shale check`: verifies a cache/capacity pair offline, without writing to either.
//!
//! The capacity is opened through zone emulation, as `shale serve` does; its own
//! metadata (geometry copies, zone table slots) is verified here first, then the engine
//! checker (`shale_engine::check`) verifies Shale's structures: superblock and mirrors,
//! every metadata checksum, L2P against P2L, validity counts against the L2P census,
//! and zone write pointers against the contents. After an unclean stop it runs the
//! recovery in a sandbox (writes kept in memory) and checks the recovered state.
//!
//! Exit status: 0 when nothing was found; non-zero (an error message) otherwise.
//! `--json` prints the report as one JSON object on stdout.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use shale_device::{FileDevice, ZoneEmu};
use shale_engine::{check, CheckOptions, CheckReport, Severity};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Cache device (file or block device)
    #[arg(long)]
    pub cache: PathBuf,
    /// Capacity device (file or block device, with zone emulation)
    #[arg(long)]
    pub capacity: PathBuf,
    /// Print the report as JSON on stdout
    #[arg(long)]
    pub json: bool,
    /// Also read every mapped block and verify its data CRC
    #[arg(long)]
    pub data: bool,
    /// Individual findings listed per kind before they are only counted
    #[arg(long, default_value_t = 50)]
    pub findings_max: usize,
}

/// Verifies the zone emulation metadata at the start of the capacity device.
fn zone_metadata(dev: &mut FileDevice) -> Result<Vec<(Severity, String)>> {
    let problems = ZoneEmu::verify_metadata(dev).context("reading the zone emulation metadata")?;
    Ok(problems
        .into_iter()
        .map(|p| {
            let severity = if p.fatal {
                Severity::Error
            } else {
                Severity::Warning
            };
            (severity, p.message)
        })
        .collect())
}

fn severity_name(s: Severity) -> &'static str {
    match s {
        Severity::Info => "note",
        Severity::Warning => "warning",
        Severity::Error => "error",
    }
}

#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
pub fn main(args: CheckArgs) -> Result<()> {
    // A running `shale serve` (or `shale format`) holds the devices exclusively;
    // checking under a live engine would report its in-flight state as damage.
    let _locks = shale_daemon::serve::DeviceLock::acquire_shared(&args.cache, &args.capacity)?;
    let cache = FileDevice::open(&args.cache)
        .with_context(|| format!("opening the cache device {}", args.cache.display()))?;
    let mut inner = FileDevice::open(&args.capacity)
        .with_context(|| format!("opening the capacity device {}", args.capacity.display()))?;
    let mut extra = zone_metadata(&mut inner)?;
    let report = match ZoneEmu::open(inner) {
        Ok(cap) => {
            let opts = CheckOptions {
                verify_data: args.data,
                findings_per_kind_max: args.findings_max,
                ..CheckOptions::default()
            };
            check(cache, cap, &opts)
        }
        Err(e) => {
            extra.push((
                Severity::Error,
                format!("zone emulation does not open: {e}"),
            ));
            CheckReport::default()
        }
    };
    let errors = report.errors() + extra.iter().filter(|f| f.0 == Severity::Error).count();
    let warnings = report.warnings() + extra.iter().filter(|f| f.0 == Severity::Warning).count();
    let mut findings: Vec<(Severity, &str, &str)> = extra
        .iter()
        .map(|f| (f.0, "zone emulation", f.1.as_str()))
        .collect();
    findings.extend(
        report
            .findings
            .iter()
            .map(|f| (f.severity, f.area, f.message.as_str())),
    );
    findings.sort_by_key(|f| std::cmp::Reverse(f.0));
    if args.json {
        let open = report.open.as_ref().map(|o| {
            json!({
                "clean": o.clean,
                "duration_ms": o.duration_ns() as f64 / 1e6,
                "bytes_read": o.bytes_read(),
                "steps": o.steps.iter().map(|s| json!({
                    "name": s.name,
                    "duration_ms": s.duration_ns as f64 / 1e6,
                    "bytes_read": s.bytes_read,
                    "detail": s.detail,
                })).collect::<Vec<_>>(),
            })
        });
        let c = &report.counts;
        let out = json!({
            "cache": args.cache.display().to_string(),
            "capacity": args.capacity.display().to_string(),
            "clean_flag": report.clean,
            "open": open,
            "counts": {
                "journal_entries": c.journal_entries,
                "l2p_pages": c.l2p_pages,
                "md_groups": c.md_groups,
                "mapped_blocks": c.mapped_blocks,
                "data_blocks_verified": c.data_blocks_verified,
                "regions_in_use": c.regions_in_use,
                "zones": c.zones,
            },
            "findings": findings.iter().map(|(s, a, m)| json!({
                "severity": severity_name(*s),
                "area": a,
                "message": m,
            })).collect::<Vec<_>>(),
            "errors": errors,
            "warnings": warnings,
            "ok": errors + warnings == 0,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "shale check: cache {}, capacity {}",
            args.cache.display(),
            args.capacity.display()
        );
        match report.clean {
            Some(true) => println!("  shut down cleanly"),
            Some(false) => println!("  not shut down cleanly (checked as recovery would leave it)"),
            None => println!("  no usable superblock"),
        }
        if let Some(o) = &report.open {
            println!(
                "  open{}: {:.1} ms, {} bytes read",
                if o.clean { "" } else { " with recovery" },
                o.duration_ns() as f64 / 1e6,
                o.bytes_read()
            );
            for s in &o.steps {
                println!(
                    "    {:<16} {:>9.2} ms {:>12} B  {}",
                    s.name,
                    s.duration_ns as f64 / 1e6,
                    s.bytes_read,
                    s.detail
                );
            }
        }
        let c = &report.counts;
        println!(
            "  checked: {} regions in use, {} md groups, {} L2P pages, {} mapped blocks{}, {} zones",
            c.regions_in_use,
            c.md_groups,
            c.l2p_pages,
            c.mapped_blocks,
            if args.data {
                format!(" ({} data blocks verified)", c.data_blocks_verified)
            } else {
                String::new()
            },
            c.zones
        );
        for (s, a, m) in &findings {
            println!("  {:<7} {a}: {m}", severity_name(*s).to_uppercase());
        }
        if errors + warnings == 0 {
            println!("  result: no problems found");
        } else {
            println!("  result: {errors} errors, {warnings} warnings");
        }
    }
    if errors + warnings > 0 {
        bail!("{errors} errors, {warnings} warnings");
    }
    Ok(())
}
