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

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use shale_array::{MemberState, MirrorDevice, ZoneArray};
use shale_daemon::serve::{CapacityCut, ShardWindows};
use shale_device::{BlockDevice, FileDevice, ZoneEmu, ZonedDevice};
use shale_engine::{check, CheckOptions, CheckReport, Severity};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Cache device (file or block device); repeat for every mirror
    #[arg(long, required = true)]
    pub cache: Vec<PathBuf>,
    /// Capacity device (file or block device, with zone emulation); repeat for every
    /// member of an array
    #[arg(long, required = true)]
    pub capacity: Vec<PathBuf>,
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

type Findings = Vec<(Severity, String)>;

/// Warnings for array members not in service (a degraded array is worth a look).
fn member_findings(what: &str, members: &[shale_array::MemberStatus], out: &mut Findings) {
    for m in members.iter().filter(|m| m.state != MemberState::Ok) {
        out.push((
            Severity::Warning,
            format!(
                "{what} member {} ({}) is {}{}",
                m.index,
                m.name,
                m.state,
                m.reason
                    .as_ref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
        ));
    }
}

/// The cache: one device, or a mirror put together read-only from its labels.
fn open_cache(paths: &[PathBuf], extra: &mut Findings) -> Result<Box<dyn BlockDevice + Send>> {
    let open = |p: &Path| {
        FileDevice::open(p).with_context(|| format!("opening the cache device {}", p.display()))
    };
    let mut members: Vec<(Box<dyn BlockDevice + Send>, String)> = Vec::new();
    for p in paths {
        let mut dev = open(p)?;
        if paths.len() == 1 && shale_array::label::read_block(&mut dev, "").is_err() {
            return Ok(Box::new(dev));
        }
        members.push((Box::new(dev), p.display().to_string()));
    }
    let m = MirrorDevice::open_read_only(members).context("putting the cache mirror together")?;
    member_findings("cache mirror", &m.members(), extra);
    Ok(Box::new(m))
}

/// The capacity: one device with zone emulation, or an array of them (read-only);
/// `None` when zone emulation does not open (a finding says why).
fn open_capacity(
    paths: &[PathBuf],
    extra: &mut Findings,
) -> Result<Option<Box<dyn ZonedDevice + Send>>> {
    let mut zoned: Vec<(Box<dyn ZonedDevice + Send>, String)> = Vec::new();
    for p in paths {
        if shale_device::is_zoned_block_device(p)
            .with_context(|| format!("looking at the capacity device {}", p.display()))?
        {
            let z = shale_device::open_zoned_drive(p, shale_device::DriveOpen::AsIs)
                .with_context(|| format!("opening the zoned capacity device {}", p.display()))?;
            zoned.push((z, p.display().to_string()));
            continue;
        }
        let mut inner = FileDevice::open(p)
            .with_context(|| format!("opening the capacity device {}", p.display()))?;
        let prefix = if paths.len() > 1 {
            format!("{}: ", p.display())
        } else {
            String::new()
        };
        for (sev, m) in zone_metadata(&mut inner)? {
            extra.push((sev, format!("{prefix}{m}")));
        }
        match ZoneEmu::open(inner) {
            Ok(z) => zoned.push((Box::new(z), p.display().to_string())),
            Err(e) => {
                extra.push((
                    Severity::Error,
                    format!("{prefix}zone emulation does not open: {e}"),
                ));
                return Ok(None);
            }
        }
    }
    if let [(one, name)] = zoned.as_mut_slice() {
        if shale_array::label::read_zoned(one, name).is_err() {
            return Ok(zoned.pop().map(|(z, _)| z));
        }
    }
    match ZoneArray::open_read_only(zoned) {
        Ok(a) => {
            member_findings("capacity array", &a.members(), extra);
            Ok(Some(Box::new(a)))
        }
        Err(e) => {
            extra.push((Severity::Error, format!("capacity array: {e}")));
            Ok(None)
        }
    }
}

/// A pool of several shards on one cache and one capacity device: each shard's
/// windows checked as a pool of their own, the findings named by shard, the counts
/// summed; clean only if every shard is, the open report shard 0's. Shards sharing
/// the capacity are each checked through their view of it, and every zone must be
/// held by one shard.
fn check_shards(
    cache: &Path,
    capacities: &[PathBuf],
    w: ShardWindows,
    opts: &CheckOptions,
    extra: &mut Findings,
) -> Result<CheckReport> {
    let mut all = CheckReport::default();
    let capacity = capacities.first().map_or(Path::new(""), PathBuf::as_path);
    let mut shared = match w.capacity {
        CapacityCut::Shared => {
            let z: Box<dyn ZonedDevice + Send> = if capacities.len() > 1 {
                let Some(z) = open_capacity(capacities, extra)? else {
                    return Ok(all);
                };
                z
            } else {
                let z = FileDevice::open(capacity).with_context(|| {
                    format!("opening the capacity device {}", capacity.display())
                })?;
                let Some(z) = open_emulation(z, "", extra)? else {
                    return Ok(all);
                };
                Box::new(z)
            };
            let views = shale_device::SharedZones::split(z, w.shards)
                .map_err(anyhow::Error::msg)
                .context("the shards' views of the shared capacity device")?;
            Some(views.into_iter())
        }
        _ => None,
    };
    let mut shared_cache = match w.cache_split {
        Some(split) => {
            let c = FileDevice::open(cache)
                .with_context(|| format!("opening the cache device {}", cache.display()))?;
            let views = shale_device::SharedCache::split(c, split)
                .map_err(anyhow::Error::msg)
                .context("the shards' views of the shared cache")?;
            Some(views.into_iter())
        }
        None => None,
    };
    let mut holders = Vec::new();
    let mut chunk_holders = Vec::new();
    for i in 0..w.shards {
        let c: Box<dyn BlockDevice + Send> = match shared_cache.as_mut().and_then(Iterator::next) {
            Some(view) => Box::new(view),
            None => {
                let c = FileDevice::open(cache)
                    .with_context(|| format!("opening the cache device {}", cache.display()))?;
                Box::new(
                    shale_device::Window::new(c, i as u64 * w.cache, w.cache)
                        .with_context(|| format!("shard {i}'s cache window"))?,
                )
            }
        };
        let r = match (w.capacity, shared.as_mut().and_then(Iterator::next)) {
            (_, Some(view)) => {
                let zones = view.geometry().zone_count;
                let r = check(c, view, opts);
                count_holders(&mut holders, zones, i, w.shards, &r.foreign_zones);
                r
            }
            (CapacityCut::Windows(cap_window), _) => {
                let z = FileDevice::open(capacity).with_context(|| {
                    format!("opening the capacity device {}", capacity.display())
                })?;
                let z = shale_device::Window::new(z, i as u64 * cap_window, cap_window)
                    .with_context(|| format!("shard {i}'s capacity window"))?;
                let Some(z) = open_emulation(z, &format!("shard {i}: "), extra)? else {
                    continue;
                };
                check(c, z, opts)
            }
            _ => {
                let z = shale_device::open_zoned_drive_shard(
                    capacity,
                    shale_device::DriveOpen::AsIs,
                    i,
                    w.shards,
                )
                .with_context(|| format!("opening shard {i}'s zones of {}", capacity.display()))?;
                check(c, z, opts)
            }
        };
        if let Some(split) = w.cache_split {
            count_holders(
                &mut chunk_holders,
                split.chunks,
                i,
                w.shards,
                &r.foreign_chunks,
            );
        }
        add_shard(&mut all, i, r);
    }
    holder_findings(&holders, "zones of the shared capacity device", extra);
    if w.cache_split.is_some() {
        holder_findings(&chunk_holders, "chunks of the shared cache", extra);
    }
    Ok(all)
}

/// The zone emulation on `z`, its metadata's problems added to `extra` (each
/// message after `prefix`); `None` if it does not open.
fn open_emulation<D: BlockDevice>(
    mut z: D,
    prefix: &str,
    extra: &mut Findings,
) -> Result<Option<ZoneEmu<D>>> {
    for p in ZoneEmu::verify_metadata(&mut z).context("reading zone emulation metadata")? {
        let sev = if p.fatal {
            Severity::Error
        } else {
            Severity::Warning
        };
        extra.push((sev, format!("{prefix}{}", p.message)));
    }
    match ZoneEmu::open(z) {
        Ok(z) => Ok(Some(z)),
        Err(e) => {
            extra.push((
                Severity::Error,
                format!("{prefix}zone emulation does not open: {e}"),
            ));
            Ok(None)
        }
    }
}

/// Counts shard `i` of `n` as the holder of every zone of the shared device it
/// does not call foreign (its view is rotated by `i` times the device's `n`th).
fn count_holders(holders: &mut Vec<u32>, zones: u32, i: usize, n: usize, foreign: &[u32]) {
    holders.resize(zones as usize, 0);
    let per = u64::from(zones) / n as u64;
    let mut theirs = vec![false; zones as usize];
    for &z in foreign {
        if let Some(t) = theirs.get_mut(z as usize) {
            *t = true;
        }
    }
    for (z, t) in theirs.iter().enumerate() {
        if !t {
            let d = (z as u64 + per * i as u64) % u64::from(zones);
            holders[d as usize] += 1;
        }
    }
}

/// Zones of a shared capacity device (or chunks of a shared cache: `what` names
/// them) held by two shards (an error: both may write them) or by none (given away,
/// not yet taken: the next open hands them out).
fn holder_findings(holders: &[u32], what: &str, extra: &mut Findings) {
    let twice: Vec<usize> = (0..holders.len()).filter(|&z| holders[z] > 1).collect();
    let none = holders.iter().filter(|&&h| h == 0).count();
    if let Some(z) = twice.first() {
        extra.push((
            Severity::Error,
            format!(
                "{} {what} are held by several shards (number {z} by {})",
                twice.len(),
                holders[*z]
            ),
        ));
    }
    if none > 0 {
        extra.push((
            Severity::Warning,
            format!(
                "{none} {what} are held by no shard \
                 (moving between shards when it stopped): the next open hands them out"
            ),
        ));
    }
}

/// Adds shard `i`'s report to the pool's: findings named by shard, counts summed.
fn add_shard(all: &mut CheckReport, i: usize, r: CheckReport) {
    all.clean = match (all.clean, r.clean) {
        (_, None) | (None, _) if i > 0 => None,
        (Some(a), Some(b)) => Some(a && b),
        (_, b) => b,
    };
    if i == 0 {
        all.open = r.open;
    }
    all.findings.extend(r.findings.into_iter().map(|mut f| {
        f.message = format!("shard {i}: {}", f.message);
        f
    }));
    let (a, b) = (&mut all.counts, &r.counts);
    a.journal_entries += b.journal_entries;
    a.l2p_pages += b.l2p_pages;
    a.md_groups += b.md_groups;
    a.mapped_blocks += b.mapped_blocks;
    a.data_blocks_verified += b.data_blocks_verified;
    a.regions_in_use += b.regions_in_use;
    a.zones += b.zones;
    a.unwritten_zone_groups += b.unwritten_zone_groups;
}

fn names(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
pub fn main(args: CheckArgs) -> Result<()> {
    // A running `shale serve` (or `shale format`) holds the devices exclusively;
    // checking under a live engine would report its in-flight state as damage.
    let paths: Vec<&Path> = args
        .cache
        .iter()
        .chain(&args.capacity)
        .map(PathBuf::as_path)
        .collect();
    let _locks = shale_daemon::serve::DeviceLock::acquire_shared(&paths)?;
    let mut extra = Vec::new();
    let opts = CheckOptions {
        verify_data: args.data,
        findings_per_kind_max: args.findings_max,
        ..CheckOptions::default()
    };
    let shards = match (args.cache.as_slice(), args.capacity.is_empty()) {
        ([c], false) => shale_daemon::serve::recorded_shard_windows(c, &args.capacity)?,
        _ => None,
    };
    let report = match shards {
        Some(w) => check_shards(&args.cache[0], &args.capacity, w, &opts, &mut extra)?,
        None => {
            let cache = open_cache(&args.cache, &mut extra)?;
            match open_capacity(&args.capacity, &mut extra)? {
                Some(cap) => check(cache, cap, &opts),
                None => CheckReport::default(),
            }
        }
    };
    let errors = report.errors() + extra.iter().filter(|f| f.0 == Severity::Error).count();
    let warnings = report.warnings() + extra.iter().filter(|f| f.0 == Severity::Warning).count();
    let mut findings: Vec<(Severity, &str, &str)> = extra
        .iter()
        .map(|f| (f.0, "devices", f.1.as_str()))
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
            "cache": names(&args.cache),
            "capacity": names(&args.capacity),
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
                "unwritten_zone_groups": c.unwritten_zone_groups,
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
            names(&args.cache),
            names(&args.capacity)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two shards on 10 zones, each view rotated by 5: shard 0 calls zones 5..10
    /// foreign, shard 1 (whose zone z is the device's z + 5) calls its 5..10 foreign,
    /// the device's 0..5.
    #[test]
    fn every_zone_held_once_is_clean_and_a_double_or_a_gap_is_not() {
        let findings = |f0: &[u32], f1: &[u32]| {
            let mut holders = Vec::new();
            count_holders(&mut holders, 10, 0, 2, f0);
            count_holders(&mut holders, 10, 1, 2, f1);
            let mut extra = Vec::new();
            holder_findings(&holders, "zones", &mut extra);
            extra
        };
        let theirs = [5, 6, 7, 8, 9];
        assert!(findings(&theirs, &theirs).is_empty());
        // Shard 1's zone 7 (device zone 2, shard 0's) not foreign there: two holders.
        let double = findings(&theirs, &[5, 6, 8, 9]);
        assert_eq!(double.len(), 1, "{double:?}");
        assert_eq!(double[0].0, Severity::Error);
        assert!(double[0].1.contains("number 2 by 2"), "{double:?}");
        // Device zone 3 foreign to both: held by none, a warning.
        let gap = findings(&[3, 5, 6, 7, 8, 9], &theirs);
        assert_eq!(gap.len(), 1, "{gap:?}");
        assert_eq!(gap[0].0, Severity::Warning);
    }
}
