//! The offline checker behind `shale check`: verifies a cache/capacity pair without
//! changing a byte of either.
//!
//! 1. Every copy of the mirrored and double-buffered structures: superblock A/B,
//!    capacity label copies, both checkpoint areas, the volume table copies, every
//!    journal entry copy in the ring.
//! 2. An open in a sandbox (writes go to memory, zone resets and finishes are
//!    simulated): after a crash this is the full recovery, so what is checked next is
//!    the state a real open would produce. Its warnings are findings.
//! 3. On the opened state: every L2P page referenced by the checkpoint against its
//!    directory CRC (the census reads them all), the self-check (L2P vs validity bitmaps
//!    vs valid counts, region states, free lists), every md block of every region in
//!    use (valid copy for the region's SID; zone copies identical), L2P against P2L
//!    (each mapped block's md entry names it), zone write pointers against the
//!    contents, and optionally every mapped block's data CRC.
//!
//! Findings are errors (data or metadata the engine cannot use) or warnings (a damaged
//! copy with a good twin, the unflushed tail a crash left, writes in a free zone).

use std::collections::{HashMap, VecDeque};

use shale_device::{
    BlockDevice, DeviceError, DeviceInfo, IoCompletion, IoOp, IoOpKind, IoRequest, ZoneAction,
    ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp, ZoneRequest, ZoneState, ZonedDevice,
};
use shale_format::{
    decode_md_entry, decode_md_header, journal_ring_entries, CapacityLabel, CheckpointHeader,
    JournalBlock, MdRegionKind, Pba, RegionId, RegionState, Superblock, VolumeTable, BLOCK_SIZE,
    LABEL_COPIES,
};

use crate::layout::{Groups, BS};
use crate::{Config, Engine, ManualClock, OpenReport};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Not a problem: what an open will do (recover after an unclean stop).
    Info,
    /// Worked around (a good twin exists) or a normal trace of a crash.
    Warning,
    /// The engine cannot use this, or data is lost or wrong.
    Error,
}

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    /// The structure or check: "superblock", "md", "L2P vs P2L"...
    pub area: &'static str,
    pub message: String,
}

/// What was looked at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckCounts {
    pub journal_entries: u64,
    pub l2p_pages: u64,
    pub md_groups: u64,
    pub mapped_blocks: u64,
    pub data_blocks_verified: u64,
    pub regions_in_use: u64,
    pub zones: u64,
    /// Zone groups holding nothing and no md (a zone finished early by a recovery).
    pub unwritten_zone_groups: u64,
}

/// The checker's result.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// The clean-shutdown flag of the superblock in force.
    pub clean: Option<bool>,
    /// The sandboxed open (recovery when not clean), if it succeeded.
    pub open: Option<OpenReport>,
    pub findings: Vec<Finding>,
    pub counts: CheckCounts,
    /// Zones another shard holds (region state Foreign), on a capacity device
    /// shards share: who holds each zone is checked across the shards.
    pub foreign_zones: Vec<u32>,
    /// Chunks another shard holds, on a cache shards share.
    pub foreign_chunks: Vec<u32>,
}

impl CheckReport {
    pub fn errors(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .count()
    }

    pub fn warnings(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .count()
    }

    fn add(&mut self, severity: Severity, area: &'static str, message: String) {
        self.findings.push(Finding {
            severity,
            area,
            message,
        });
    }
}

/// What to check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Runtime settings for the sandboxed open (format-time fields come from the
    /// superblock).
    pub config: Config,
    /// Read every mapped block and verify its data CRC (reads all live data).
    pub verify_data: bool,
    /// Findings of one kind reported individually before they are only counted.
    pub findings_per_kind_max: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            config: Config::default(),
            verify_data: false,
            findings_per_kind_max: 50,
        }
    }
}

/// Checks a cache and capacity device pair. Never writes to either.
pub fn check<C: BlockDevice, Z: ZonedDevice>(
    mut cache: C,
    mut capacity: Z,
    opts: &CheckOptions,
) -> CheckReport {
    let mut rep = CheckReport::default();
    let sb = raw_structures(&mut cache, &mut capacity, &mut rep);
    let mut raw_zones = Vec::new();
    if capacity
        .report_zones(0, capacity.geometry().zone_count, &mut raw_zones)
        .is_err()
    {
        rep.add(
            Severity::Error,
            "zones",
            "the capacity device cannot report its zones".into(),
        );
    }
    let mut config = opts.config.clone();
    config.open_self_check = false;
    // The checks below read the validity bits: the census runs within the open.
    config.census_in_background = false;
    config.recover = true;
    let opened = Engine::open(
        Sandbox::new(cache),
        ZoneSandbox::new(capacity),
        ManualClock::new(),
        config,
    );
    let mut e = match opened {
        Ok(e) => e,
        Err(err) => {
            rep.add(Severity::Error, "open", format!("open fails: {err}"));
            return rep;
        }
    };
    let report = e.open_report().clone();
    for w in &report.warnings {
        rep.add(Severity::Warning, "open", w.clone());
    }
    if sb.as_ref().is_some_and(|s| !s.clean) || !report.clean {
        rep.add(
            Severity::Info,
            "shutdown",
            format!(
                "not shut down cleanly: the next open recovers ({} journal entries, {} md groups replayed)",
                report.replay.journal_entries, report.replay.md_groups_read
            ),
        );
    }
    rep.counts.journal_entries = report.replay.journal_entries;
    rep.open = Some(report);
    opened_state(&mut e, &raw_zones, opts, &mut rep);
    rep
}

/// Step 1: every copy of the small structures. Returns the superblock in force.
fn raw_structures<C: BlockDevice, Z: ZonedDevice>(
    cache: &mut C,
    capacity: &mut Z,
    rep: &mut CheckReport,
) -> Option<Superblock> {
    let mut b = vec![0u8; 2 * BLOCK_SIZE];
    if let Err(e) = cache.read_at(0, &mut b) {
        rep.add(
            Severity::Error,
            "superblock",
            format!("cannot read the superblocks: {e}"),
        );
        return None;
    }
    let copies = [
        Superblock::decode(&b[..BLOCK_SIZE], 0),
        Superblock::decode(&b[BLOCK_SIZE..], BS),
    ];
    for (i, c) in copies.iter().enumerate() {
        if let Err(e) = c {
            rep.add(
                Severity::Warning,
                "superblock",
                format!("copy {}: {e}", ["A", "B"][i]),
            );
        }
    }
    let sb = copies
        .iter()
        .flatten()
        .max_by_key(|s| s.generation)
        .cloned();
    let Some(sb) = sb else {
        rep.findings.iter_mut().for_each(|f| {
            if f.area == "superblock" {
                f.severity = Severity::Error;
            }
        });
        return None;
    };
    rep.clean = Some(sb.clean);

    raw_label(capacity, &sb, rep);
    raw_checkpoints(cache, &sb, rep);
    raw_volume_tables(cache, &sb.layout, rep);
    raw_journal(cache, &sb.layout, rep);
    Some(sb)
}

/// Every copy of the capacity label.
fn raw_label<Z: ZonedDevice>(capacity: &mut Z, sb: &Superblock, rep: &mut CheckReport) {
    let mut lb = vec![0u8; LABEL_COPIES * BLOCK_SIZE];
    match capacity.read_at(0, &mut lb) {
        Ok(()) => {
            let mut good = 0;
            for i in 0..LABEL_COPIES {
                let at = i as u64 * BS;
                match CapacityLabel::decode(&lb[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE], at) {
                    Ok(l) if l.uuid != sb.uuid => rep.add(
                        Severity::Error,
                        "capacity label",
                        format!("copy {i} belongs to another cache device"),
                    ),
                    Ok(_) => good += 1,
                    Err(e) => rep.add(
                        Severity::Warning,
                        "capacity label",
                        format!("copy {i}: {e}"),
                    ),
                }
            }
            if good == 0 {
                rep.add(Severity::Error, "capacity label", "no valid copy".into());
            }
        }
        Err(e) => rep.add(
            Severity::Error,
            "capacity label",
            format!("cannot read the label: {e}"),
        ),
    }
}

/// Both checkpoint areas; damage in the one the superblock names is an error.
fn raw_checkpoints<C: BlockDevice>(cache: &mut C, sb: &Superblock, rep: &mut CheckReport) {
    let l = &sb.layout;
    for area in 0..2u8 {
        let off = l.checkpoint_start(area) * BS;
        let mut head = vec![0u8; BLOCK_SIZE];
        if cache.read_at(off, &mut head).is_err() {
            rep.add(
                Severity::Error,
                "checkpoint",
                format!("area {area} unreadable"),
            );
            continue;
        }
        let named = area == sb.active_checkpoint;
        let sev = if named {
            Severity::Error
        } else {
            Severity::Warning
        };
        let payload = match CheckpointHeader::decode(&head, off) {
            Ok(h) => h
                .payload_bytes
                .div_ceil(BS)
                .min(u64::from(l.checkpoint_blocks) - 1),
            Err(e) => {
                if !head.iter().all(|&x| x == 0) || named {
                    rep.add(sev, "checkpoint", format!("area {area}: {e}"));
                }
                continue;
            }
        };
        let mut all = vec![0u8; (1 + payload as usize) * BLOCK_SIZE];
        all[..BLOCK_SIZE].copy_from_slice(&head);
        if cache.read_at(off + BS, &mut all[BLOCK_SIZE..]).is_err() {
            rep.add(sev, "checkpoint", format!("area {area} payload unreadable"));
            continue;
        }
        if let Err(e) = crate::recovery::load::decode_area(&all, off, u64::from(l.l2p_pool_pages)) {
            rep.add(sev, "checkpoint", format!("area {area}: {e}"));
        }
    }
}

/// Both copies of the volume table.
fn raw_volume_tables<C: BlockDevice>(
    cache: &mut C,
    l: &shale_format::CacheLayout,
    rep: &mut CheckReport,
) {
    let voff = l.volume_table_start * BS;
    let copy_len = l.volume_table_copy_blocks() as usize * BLOCK_SIZE;
    let mut vb = vec![0u8; 2 * copy_len];
    if cache.read_at(voff, &mut vb).is_ok() {
        for i in 0..2 {
            let at = voff + (i * copy_len) as u64;
            if let Err(e) = VolumeTable::decode(&vb[i * copy_len..(i + 1) * copy_len], at) {
                rep.add(Severity::Warning, "volume table", format!("copy {i}: {e}"));
            }
        }
    }
}

/// Both copies of every journal entry.
fn raw_journal<C: BlockDevice>(
    cache: &mut C,
    l: &shale_format::CacheLayout,
    rep: &mut CheckReport,
) {
    let entries = journal_ring_entries(l.journal_blocks);
    let joff = l.journal_start * BS;
    let mut ring = vec![0u8; 2 * entries as usize * BLOCK_SIZE];
    if cache.read_at(joff, &mut ring).is_ok() {
        for i in 0..entries as usize {
            let blk = |c: usize| &ring[(2 * i + c) * BLOCK_SIZE..(2 * i + c + 1) * BLOCK_SIZE];
            let zero = |c: usize| blk(c).iter().all(|&x| x == 0);
            let d = [
                JournalBlock::decode(blk(0), joff + (2 * i) as u64 * BS),
                JournalBlock::decode(blk(1), joff + (2 * i + 1) as u64 * BS),
            ];
            match (&d[0], &d[1]) {
                (Ok(a), Ok(b)) if a != b && a.sequence == b.sequence => rep.add(
                    Severity::Warning,
                    "journal",
                    format!("entry {i}: the two copies differ"),
                ),
                (Ok(_), Err(e)) | (Err(e), Ok(_)) => rep.add(
                    Severity::Warning,
                    "journal",
                    format!("entry {i}: one copy damaged ({e})"),
                ),
                (Err(e), Err(_)) if !(zero(0) && zero(1)) => rep.add(
                    Severity::Warning,
                    "journal",
                    format!("entry {i}: both copies damaged ({e}): a torn write, or corruption"),
                ),
                _ => {}
            }
        }
    }
}

/// Step 3: the opened state.
fn opened_state<C: BlockDevice, Z: ZonedDevice>(
    e: &mut Engine<Sandbox<C>, ZoneSandbox<Z>, ManualClock>,
    raw_zones: &[ZoneInfo],
    opts: &CheckOptions,
    rep: &mut CheckReport,
) {
    let cap = opts.findings_per_kind_max;
    if let Err(err) = e.self_check() {
        rep.add(Severity::Error, "self-check", err.to_string());
    }
    rep.counts.l2p_pages = e.core.l2p.counters.page_reads;
    let md_problems = check_region_md(e, raw_zones, cap, rep);
    let Some(bad) = check_mappings(e, opts, cap, rep) else {
        return;
    };
    for (n, area) in [(md_problems, "md"), (bad, "L2P vs P2L")] {
        if n > cap {
            rep.add(
                Severity::Error,
                area,
                format!("{} more findings not listed", n - cap),
            );
        }
    }
    check_zone_pointers(e, raw_zones, rep);
}

/// Findings of one kind: all counted, the first `cap` listed.
struct Capped {
    count: usize,
    cap: usize,
}

impl Capped {
    fn note(&mut self, rep: &mut CheckReport, sev: Severity, area: &'static str, msg: String) {
        self.count += 1;
        if self.count <= self.cap {
            rep.add(sev, area, msg);
        }
    }
}

/// The md of every region in use. Returns the problems found.
fn check_region_md<C: BlockDevice, Z: ZonedDevice>(
    e: &mut Engine<Sandbox<C>, ZoneSandbox<Z>, ManualClock>,
    raw_zones: &[ZoneInfo],
    cap: usize,
    rep: &mut CheckReport,
) -> usize {
    let mut problems = Capped { count: 0, cap };
    for i in 0..e.core.geo.region_count() {
        let r = RegionId(i);
        let reg = e.core.regions.get(r).clone();
        if !matches!(reg.state, RegionState::Open | RegionState::Closed) {
            continue;
        }
        rep.counts.regions_in_use += 1;
        let chunk = e.core.geo.is_chunk(r);
        let groups = Groups {
            blocks: e.core.geo.region_blocks(r),
        };
        // Zones: only what the device holds; chunks: the groups written (a closed
        // chunk is full, except the remainder left by a recovery or a resume).
        let end = if chunk {
            reg.wp.min(groups.end())
        } else {
            let z = e.core.geo.zone_of(r).0 as usize;
            raw_zones.get(z).map_or(0, |zi| match zi.state {
                ZoneState::Full => groups.end(),
                _ => ((zi.write_pointer - zi.start) / BS) as u32,
            })
        };
        for g in 0..groups.count() {
            if groups.start(g) >= end
                || (chunk && groups.md_slot(g) > end && reg.state == RegionState::Open)
            {
                break;
            }
            check_group_md(e, r, &reg, g, rep, &mut problems);
        }
    }
    problems.count
}

/// Both md copies at `md_slot` of region `r`, and their device offset.
fn read_md_pair<C: BlockDevice, Z: ZonedDevice>(
    e: &mut Engine<Sandbox<C>, ZoneSandbox<Z>, ManualClock>,
    r: RegionId,
    md_slot: u32,
) -> Result<(Vec<u8>, u64), String> {
    let mut two = vec![0u8; 2 * BLOCK_SIZE];
    if e.core.geo.is_chunk(r) {
        let off = e.core.geo.chunk_offset(r, md_slot);
        e.core
            .cache
            .read_at(off, &mut two)
            .map_err(|x| x.to_string())?;
        Ok((two, off))
    } else {
        let off = e.core.geo.zone_offset(r, md_slot);
        e.core
            .capacity
            .read_at(off, &mut two)
            .map_err(|x| x.to_string())?;
        Ok((two, off))
    }
}

/// Group `g` of region `r` (in use, written that far): its md copies.
fn check_group_md<C: BlockDevice, Z: ZonedDevice>(
    e: &mut Engine<Sandbox<C>, ZoneSandbox<Z>, ManualClock>,
    r: RegionId,
    reg: &crate::space::Region,
    g: u32,
    rep: &mut CheckReport,
    problems: &mut Capped,
) {
    let chunk = e.core.geo.is_chunk(r);
    let groups = Groups {
        blocks: e.core.geo.region_blocks(r),
    };
    rep.counts.md_groups += 1;
    let (two, at) = match read_md_pair(e, r, groups.md_slot(g)) {
        Ok(read) => read,
        Err(x) => {
            problems.note(
                rep,
                Severity::Error,
                "md",
                format!("{r} group {g}: unreadable: {x}"),
            );
            return;
        }
    };
    let kind = if chunk {
        MdRegionKind::Chunk
    } else {
        MdRegionKind::Zone
    };
    let hs: Vec<_> = (0..2)
        .map(|c| {
            decode_md_header(
                &two[c * BLOCK_SIZE..(c + 1) * BLOCK_SIZE],
                at + c as u64 * BS,
            )
            .map_err(|x| x.to_string())
            .and_then(|h| {
                if h.region != r || h.group != g || h.region_kind != kind {
                    Err(format!("names {} group {}", h.region, h.group))
                } else {
                    Ok(h)
                }
            })
        })
        .collect();
    let current = hs
        .iter()
        .filter(|h| h.as_ref().is_ok_and(|h| h.region_sid == reg.sid))
        .count();
    if current == 0 && !e.core.geo.is_chunk(r) {
        let unmapped = (0..groups.data_slots(g)).all(|s| {
            !e.core
                .regions
                .validity
                .get(e.core.geo.pba(r, groups.start(g) + s))
        });
        if unmapped {
            rep.counts.unwritten_zone_groups += 1;
        }
    }
    let mut note = |sev, msg: String| problems.note(rep, sev, "md", msg);
    if current == 0 {
        // A group not written since the region opened has no md of its life: a
        // chunk's remainder, or the rest of a zone a recovery finished early (the
        // writes past the last durability point were never acknowledged). That is
        // only a problem if something maps into it.
        let mapped = (0..groups.data_slots(g)).any(|s| {
            e.core
                .regions
                .validity
                .get(e.core.geo.pba(r, groups.start(g) + s))
        });
        if mapped {
            note(
                Severity::Error,
                format!(
                    "{r} group {g}: no valid md copy for {} (A: {}, B: {})",
                    reg.sid,
                    describe(&hs[0]),
                    describe(&hs[1])
                ),
            );
        }
        return;
    }
    for (c, h) in hs.iter().enumerate() {
        let zero = two[c * BLOCK_SIZE..(c + 1) * BLOCK_SIZE]
            .iter()
            .all(|&x| x == 0);
        match h {
            Err(x) if !zero || !chunk => note(
                Severity::Warning,
                format!(
                    "{r} group {g} md copy {}: {x} (the other copy is used)",
                    ["A", "B"][c]
                ),
            ),
            _ => {}
        }
    }
    if !chunk && current == 2 && two[..BLOCK_SIZE] != two[BLOCK_SIZE..] {
        note(
            Severity::Error,
            format!("{r} group {g}: the two md copies of a zone group differ"),
        );
    }
}

/// L2P against P2L, and with `verify_data` the data. Returns the bad mappings, or
/// `None` when the L2P cannot be read.
fn check_mappings<C: BlockDevice, Z: ZonedDevice>(
    e: &mut Engine<Sandbox<C>, ZoneSandbox<Z>, ManualClock>,
    opts: &CheckOptions,
    cap: usize,
    rep: &mut CheckReport,
) -> Option<usize> {
    let mut mapped = Vec::new();
    let kinds = e.core.volumes.kinds();
    let geo = e.core.geo;
    // An entry maps a block, or each block of a unit (a dual volume's sparse map
    // over its unit map).
    let res = crate::volume::walk_all_blocks(
        &mut e.core.l2p,
        &mut e.core.cache,
        kinds,
        &geo,
        &mut crate::recovery::Meter::off(),
        |v, lba, pba, _| mapped.push((v, lba, pba.unwrap_or(Pba::NONE))),
    );
    if let Err(x) = res {
        rep.add(Severity::Error, "L2P", format!("unreadable: {x}"));
        return None;
    }
    rep.counts.mapped_blocks = mapped.len() as u64;
    let mut bad = 0usize;
    let mut data = vec![0u8; BLOCK_SIZE];
    for (v, lba, pba) in mapped {
        let verdict = check_mapping(e, v, lba, pba, opts.verify_data, &mut data);
        if opts.verify_data {
            rep.counts.data_blocks_verified += 1;
        }
        if let Err(msg) = verdict {
            bad += 1;
            if bad <= cap {
                rep.add(Severity::Error, "L2P vs P2L", msg);
            }
        }
    }
    Some(bad)
}

/// Zone write pointers against the region table.
fn check_zone_pointers<C: BlockDevice, Z: ZonedDevice>(
    e: &mut Engine<Sandbox<C>, ZoneSandbox<Z>, ManualClock>,
    raw_zones: &[ZoneInfo],
    rep: &mut CheckReport,
) {
    rep.foreign_zones = crate::space::lend::foreign_list(&e.core);
    rep.foreign_chunks = crate::space::lend::foreign_chunk_list(&e.core);
    let held = e.core.geo.zone_count.saturating_sub(1) as usize - rep.foreign_zones.len();
    rep.counts.zones = held as u64;
    for zi in raw_zones.iter().skip(1) {
        let r = e.core.geo.zone_region(shale_format::ZoneId(zi.index));
        let reg = e.core.regions.get(r);
        let wp = ((zi.write_pointer - zi.start) / BS) as u32;
        match reg.state {
            RegionState::Free | RegionState::PendingFree if zi.state != ZoneState::Empty => rep.add(
                Severity::Warning,
                "zones",
                format!("{r} is free but the device zone is {:?} at slot {wp}: writes nothing recorded (an open reset it)", zi.state),
            ),
            RegionState::Open if zi.state == ZoneState::Full || wp != reg.wp => rep.add(
                Severity::Error,
                "zones",
                format!("{r} is open at slot {} but the device zone is {:?} at slot {wp}", reg.wp, zi.state),
            ),
            _ => {}
        }
    }
}

fn describe(h: &Result<shale_format::MdHeader, String>) -> String {
    match h {
        Ok(h) => format!("{} generation {}", h.region_sid, h.generation),
        Err(e) => e.clone(),
    }
}

/// The md entry of a mapped block must name it; with `data` its CRC must match.
fn check_mapping<C: BlockDevice, Z: ZonedDevice>(
    e: &mut Engine<Sandbox<C>, ZoneSandbox<Z>, ManualClock>,
    v: shale_format::VolumeId,
    lba: shale_format::Lba,
    pba: Pba,
    data: bool,
    buf: &mut [u8],
) -> Result<(), String> {
    let Some((r, slot)) = e.core.geo.region_slot(pba) else {
        return Err(format!("{v} {lba} maps to {pba}, outside the data regions"));
    };
    let md = crate::read::reader::md_block(&mut e.core, &e.writer, pba)
        .map_err(|x| format!("{v} {lba} at {pba}: md unreadable: {x}"))?;
    let idx = (slot % shale_format::GROUP_BLOCKS) as usize;
    let ent = decode_md_entry(&md[..], idx, 0).map_err(|x| format!("{v} {lba} at {pba}: {x}"))?;
    if !ent.kind.holds_data() || ent.volume != v || ent.lba != lba {
        return Err(format!(
            "{v} {lba} maps to {pba} in {r}, whose md entry says {:?} {} {}",
            ent.kind, ent.volume, ent.lba
        ));
    }
    if data {
        let res = if e.core.geo.is_chunk(r) {
            let off = e.core.geo.chunk_offset(r, slot);
            e.core.cache.read_at(off, buf).map_err(|x| x.to_string())
        } else {
            let off = e.core.geo.zone_offset(r, slot);
            e.core.capacity.read_at(off, buf).map_err(|x| x.to_string())
        };
        res.map_err(|x| format!("{v} {lba} at {pba}: data unreadable: {x}"))?;
        let got = shale_format::block_crc(buf);
        if got != ent.data_crc {
            return Err(format!(
                "{v} {lba} at {pba}: data CRC {got:#010x}, md says {:#010x}",
                ent.data_crc
            ));
        }
    }
    Ok(())
}

/// A block device whose writes stay in memory: the checker's open may recover, but
/// the device is never changed.
#[derive(Debug)]
pub(crate) struct Sandbox<D> {
    inner: D,
    blocks: HashMap<u64, Box<[u8]>>,
    done: VecDeque<IoCompletion>,
}

impl<D: BlockDevice> Sandbox<D> {
    pub fn new(inner: D) -> Self {
        Sandbox {
            inner,
            blocks: HashMap::new(),
            done: VecDeque::new(),
        }
    }
}

impl<D: BlockDevice> BlockDevice for Sandbox<D> {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn submit(&mut self, req: IoRequest) {
        let (buf, result) = match req.op {
            IoOp::Read { offset, mut buf } => {
                let r = self.read_at(offset, &mut buf);
                (Some(buf), r)
            }
            IoOp::Write { offset, buf, .. } => {
                let r = self.write_at(offset, &buf);
                (Some(buf), r)
            }
            IoOp::Flush => (None, Ok(())),
            IoOp::Discard { offset, len } => (None, self.discard(offset, len)),
        };
        self.done.push_back(IoCompletion {
            tag: req.tag,
            buf,
            result,
        });
    }
    fn poll(&mut self, out: &mut Vec<IoCompletion>, _min: usize) -> Result<usize, DeviceError> {
        let n = self.done.len();
        out.extend(self.done.drain(..));
        Ok(n)
    }
    fn in_flight(&self) -> usize {
        self.done.len()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read_at(offset, buf)?;
        if offset.is_multiple_of(BS) && buf.len().is_multiple_of(BLOCK_SIZE) {
            for (i, b) in buf.chunks_exact_mut(BLOCK_SIZE).enumerate() {
                if let Some(s) = self.blocks.get(&(offset / BS + i as u64)) {
                    b.copy_from_slice(s);
                }
            }
        }
        Ok(())
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        if !offset.is_multiple_of(BS) || !buf.len().is_multiple_of(BLOCK_SIZE) {
            return Err(DeviceError::Misaligned {
                op: IoOpKind::Write,
                offset,
                len: buf.len() as u64,
                align: BS,
            });
        }
        for (i, b) in buf.chunks_exact(BLOCK_SIZE).enumerate() {
            self.blocks.insert(offset / BS + i as u64, b.into());
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let zero = vec![0u8; len as usize];
        self.write_at(offset, &zero)
    }
}

/// A zoned device whose zone finishes and resets are simulated in memory; writes
/// are refused (an open does not write zones).
#[derive(Debug)]
pub(crate) struct ZoneSandbox<Z> {
    inner: Z,
    zones: Vec<ZoneInfo>,
    reset: Vec<bool>,
    done: VecDeque<ZoneCompletion>,
}

impl<Z: ZonedDevice> ZoneSandbox<Z> {
    pub fn new(inner: Z) -> Self {
        let mut zones = Vec::new();
        let n = inner.geometry().zone_count;
        let _ = inner.report_zones(0, n, &mut zones);
        ZoneSandbox {
            reset: vec![false; zones.len()],
            inner,
            zones,
            done: VecDeque::new(),
        }
    }

    fn zone_of(&self, offset: u64) -> usize {
        (offset / self.inner.geometry().zone_size.max(1)) as usize
    }
}

fn read_only() -> ZoneError {
    ZoneError::Device(DeviceError::Unsupported {
        op: IoOpKind::Write,
    })
}

impl<Z: ZonedDevice> ZonedDevice for ZoneSandbox<Z> {
    fn geometry(&self) -> &ZoneGeometry {
        self.inner.geometry()
    }
    fn report_zones(
        &self,
        first: u32,
        count: u32,
        out: &mut Vec<ZoneInfo>,
    ) -> Result<(), ZoneError> {
        let lo = (first as usize).min(self.zones.len());
        let hi = lo.saturating_add(count as usize).min(self.zones.len());
        out.extend_from_slice(&self.zones[lo..hi]);
        Ok(())
    }
    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        self.zones
            .get(zone as usize)
            .cloned()
            .ok_or(ZoneError::NoSuchZone {
                zone,
                count: self.zones.len() as u32,
            })
    }
    fn submit(&mut self, req: ZoneRequest) {
        let (buf, result) = match req.op {
            ZoneOp::Read { offset, mut buf } => {
                let r = self.read_at(offset, &mut buf).map(|_| None);
                (Some(buf), r)
            }
            ZoneOp::Write { buf, .. } | ZoneOp::Append { buf, .. } => (Some(buf), Err(read_only())),
            ZoneOp::Flush => (None, Ok(None)),
        };
        self.done.push_back(ZoneCompletion {
            tag: req.tag,
            buf,
            result,
        });
    }
    fn poll(&mut self, out: &mut Vec<ZoneCompletion>, _min: usize) -> Result<usize, DeviceError> {
        let n = self.done.len();
        out.extend(self.done.drain(..));
        Ok(n)
    }
    fn in_flight(&self) -> usize {
        self.done.len()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        let z = self.zone_of(offset);
        if self.reset.get(z).copied().unwrap_or(false) {
            buf.fill(0);
            return Ok(());
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, _offset: u64, _buf: &[u8]) -> Result<u64, ZoneError> {
        Err(read_only())
    }
    fn append(&mut self, _zone: u32, _buf: &[u8]) -> Result<u64, ZoneError> {
        Err(read_only())
    }
    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        let count = self.zones.len() as u32;
        let z = self
            .zones
            .get_mut(zone as usize)
            .ok_or(ZoneError::NoSuchZone { zone, count })?;
        match action {
            ZoneAction::Finish => {
                z.state = ZoneState::Full;
                z.write_pointer = z.start + z.capacity;
            }
            ZoneAction::Reset => {
                z.state = ZoneState::Empty;
                z.write_pointer = z.start;
                self.reset[zone as usize] = true;
            }
            ZoneAction::Open => z.state = ZoneState::ExplicitlyOpen,
            ZoneAction::Close => z.state = ZoneState::Closed,
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), ZoneError> {
        Ok(())
    }
}
