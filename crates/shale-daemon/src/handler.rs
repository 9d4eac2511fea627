//! Admin requests and metrics, answered from the engine.

use std::sync::Arc;

use serde_json::{json, Value};
use shale_engine::{EngineError, Reply, Request, Stats, VolumeInfo, VolumeLimits};
use shale_nbd::ServerHandle;

use crate::admin::{AdminHandler, AdminRequest};
use crate::backend::EngineBackend;
use crate::devices::Devices;
use crate::drive::DriveStats;
use crate::metrics::{Metric, MetricKind};

#[derive(Debug)]
pub struct DaemonAdmin {
    backend: Arc<EngineBackend>,
    /// The NBD server's connections, to refuse or force volume changes under them.
    nbd: Option<ServerHandle>,
    /// The simulated capacity drive, when `--drive` names one.
    drive: Option<DriveStats>,
    /// The devices, for `shale device`.
    devices: Option<Arc<Devices>>,
    /// Held across a `volume set`'s read of the limits and its write of the merged
    /// ones, so two at once cannot lose either's change.
    limits: std::sync::Mutex<()>,
}

impl DaemonAdmin {
    pub fn new(backend: Arc<EngineBackend>, nbd: Option<ServerHandle>) -> Self {
        DaemonAdmin {
            backend,
            nbd,
            limits: std::sync::Mutex::new(()),
            drive: None,
            devices: None,
        }
    }

    /// Answers `shale device` from these devices and adds them to `stats`.
    pub fn with_devices(mut self, devices: Arc<Devices>) -> Self {
        self.devices = Some(devices);
        self
    }

    fn devices(&self) -> Result<&Devices, String> {
        self.devices
            .as_deref()
            .ok_or_else(|| "this daemon does not manage its devices".to_string())
    }

    /// Adds the simulated drive's section to `stats`.
    pub fn with_drive(mut self, drive: Option<DriveStats>) -> Self {
        self.drive = drive;
        self
    }

    fn volume(&self, name: &str) -> Result<VolumeInfo, String> {
        list(&self.backend)
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| format!("no volume named {name:?}"))
    }

    /// Clients connected to volume `v`.
    fn clients(&self, v: &VolumeInfo) -> usize {
        self.nbd
            .as_ref()
            .map_or(0, |h| h.connections_to(EngineBackend::export_id(v.uid)))
    }

    fn disconnect(&self, v: &VolumeInfo) -> usize {
        self.nbd
            .as_ref()
            .map_or(0, |h| h.disconnect(EngineBackend::export_id(v.uid)))
    }

    /// Runs a change that connected clients must not see (delete, shrink): the
    /// volume is hidden from new connections first, then refused if clients remain
    /// (unless `force`, which disconnects them), changed, and any client that
    /// connected meanwhile is disconnected too.
    fn change_without_clients(
        &self,
        v: &VolumeInfo,
        what: &str,
        force: bool,
        req: Request,
    ) -> Result<Reply, String> {
        let _hidden = self.backend.hide(v.uid);
        let n = self.clients(v);
        if n > 0 && !force {
            let (s, them) = if n == 1 { ("", "it") } else { ("s", "them") };
            return Err(format!(
                "volume {:?} has {n} connected client{s}; disconnect {them}, or pass --force to disconnect {them} and {what} the volume",
                v.name
            ));
        }
        if n > 0 {
            tracing::warn!(volume = %v.name, clients = n, "disconnecting clients to {what} the volume");
            self.disconnect(v);
        }
        let r = self.backend.engine().call(req).map_err(|e| e.to_string());
        self.disconnect(v);
        self.backend.refresh().map_err(|e| e.to_string())?;
        r
    }
}

fn list(b: &EngineBackend) -> Result<Vec<VolumeInfo>, EngineError> {
    match b.engine().call(Request::ListVolumes)? {
        Reply::Volumes(v) => Ok(v),
        other => Err(EngineError::Failed {
            reason: format!("list volumes answered {other:?}"),
        }),
    }
}

fn stats(b: &EngineBackend) -> Result<Stats, EngineError> {
    match b.engine().call(Request::Stats)? {
        Reply::Stats(s) => Ok(*s),
        other => Err(EngineError::Failed {
            reason: format!("stats answered {other:?}"),
        }),
    }
}

fn volume_json(v: &VolumeInfo, clients: usize) -> Value {
    let limit = |n: u64| if n == 0 { Value::Null } else { json!(n) };
    json!({
        "id": v.id.0,
        "uid": v.uid.0,
        "name": v.name,
        "size_bytes": v.size_bytes,
        "clients": clients,
        "iops_max": limit(v.limits.iops_max),
        "mibps_max": limit(v.limits.bytes_per_sec_max >> 20),
        "cache_share_pct": limit(u64::from(v.limits.cache_share_pct)),
        "gc": crate::serve::volume_gc_name(v.limits.gc),
        "map_unit_bytes": v.layout.map_unit_bytes(),
        "dual_map": v.layout.dual,
    })
}

/// `base` with the limits given changed (0 removes one).
fn limits_of(
    base: VolumeLimits,
    iops_max: Option<u64>,
    mibps_max: Option<u64>,
    cache_share_pct: Option<u8>,
    gc: Option<&str>,
) -> Result<VolumeLimits, String> {
    let mut l = base;
    if let Some(g) = gc {
        l.gc = crate::serve::parse_volume_gc(g)?;
    }
    if let Some(p) = cache_share_pct {
        if p > 100 {
            return Err(format!("cache_share_pct {p} is past 100"));
        }
        l.cache_share_pct = p;
    }
    if let Some(n) = iops_max {
        l.iops_max = n;
    }
    if let Some(n) = mibps_max {
        l.bytes_per_sec_max = n
            .checked_mul(1 << 20)
            .ok_or_else(|| format!("mibps_max {n} is too large"))?;
    }
    Ok(l)
}

fn latency_json(s: &crate::latency::Snapshot) -> Value {
    json!({
        "count": s.count(),
        "p50": s.quantile_us(0.5),
        "p99": s.quantile_us(0.99),
        "p999": s.quantile_us(0.999),
        "max": s.max_us,
        "buckets": s.buckets(),
    })
}

/// The `volumes` array of `shale stats --json`: one object per live volume, the
/// engine's counters joined with its name and the client-visible latency.
pub fn volumes_json(s: &Stats, list: &[VolumeInfo], b: &EngineBackend) -> Value {
    let vols = s.volumes.iter().filter_map(|v| {
        let info = list.iter().find(|i| i.uid == v.uid)?;
        let l = b.latency(v.uid);
        let waf = (v.user_write_bytes > 0).then(|| v.layer_waf());
        Some(json!({
            "name": info.name,
            "uid": v.uid.0,
            "id": v.id.0,
            "size_bytes": info.size_bytes,
            "ops": { "read": v.read_ops, "write": v.write_ops, "trim": v.trim_ops },
            "bytes": {
                "user_written": v.user_write_bytes,
                "user_read": v.user_read_bytes,
                "user_trimmed": v.user_trim_bytes,
                "cache_written": v.cache_write_bytes,
                "capacity_compaction_written": v.capacity_compaction_write_bytes,
                "capacity_gc_written": v.capacity_gc_write_bytes,
                "capacity_written": v.capacity_write_bytes(),
            },
            "waf": { "layer": waf },
            "cache_valid_bytes": v.cache_valid_bytes,
            "l2p_table_bytes": v.l2p_table_bytes,
            "l2p_sparse_bytes": v.l2p_sparse_bytes,
            "throttle": {
                "waiting": v.throttle_waiting,
                "delayed": v.throttle_delayed,
                "wait_ms": v.throttle_wait_ns / 1_000_000,
            },
            "latency_us": {
                "read": latency_json(&l.read.snapshot()),
                "write": latency_json(&l.write.snapshot()),
            },
        }))
    });
    Value::Array(vols.collect())
}

/// Stats as JSON, with the WAF figures of DESIGN.md spelled out.
pub fn stats_json(s: &Stats) -> Value {
    json!({
        "bytes": {
            "user_read": s.user_read_bytes,
            "user_written": s.user_write_bytes,
            "user_trimmed": s.user_trim_bytes,
            "cache_data_written": s.cache_data_write_bytes,
            "cache_md_written": s.cache_md_write_bytes,
            "cache_read": s.cache_read_bytes,
            "capacity_compaction_written": s.capacity_compaction_write_bytes,
            "capacity_gc_written": s.capacity_gc_write_bytes,
            "capacity_written": s.capacity_write_bytes(),
            "capacity_pad": s.capacity_pad_bytes,
            "capacity_read": s.capacity_read_bytes,
            "user_direct_written": s.direct_write_bytes,
            "capacity_direct_written": s.capacity_direct_write_bytes,
        },
        "waf": { "layer": s.layer_waf(), "cache": s.cache_waf() },
        "l2p": {
            "hits": s.l2p_hits,
            "misses": s.l2p_misses,
            "hit_rate": s.l2p_hit_rate(),
            "page_reads": s.l2p_page_reads,
            "page_writes": s.l2p_page_writes,
            "page_reads_ahead": s.l2p_page_reads_ahead,
            "page_writes_ahead": s.l2p_page_writes_ahead,
            "cached_pages": s.l2p_cached_pages,
            "cache_pages_max": s.l2p_cache_pages_max,
            "entry_bytes": s.l2p_entry_bytes,
        },
        "space": {
            "free_chunks": s.free_chunks,
            "chunks": s.chunk_count,
            "free_zones": s.free_zones,
            "data_zones": s.data_zone_count,
            "cold_zones": s.cold_zone_count,
            "free_cold_zones": s.free_cold_zones,
            "zone_resets": s.zone_resets,
            "chunk_frees": s.chunk_frees,
            "zones_given": s.zones_given,
            "zones_taken": s.zones_taken,
            "chunks_given": s.chunks_given,
            "chunks_taken": s.chunks_taken,
        },
        "work": {
            "compaction_victims": s.compaction_victims,
            "gc_victims": s.gc_victims,
            "relocated_blocks": s.relocated_blocks,
            "relocations_superseded": s.relocations_superseded,
            "checkpoints": s.checkpoints,
            "durability_points": s.durability_points,
            "handoff_stores": s.handoff_stores,
            "handoff_bytes": s.handoff_bytes,
            "throttle_waiting": s.throttle_waiting,
            "throttle_waits": s.throttle_waits,
            "crc_errors": s.crc_errors,
            "crc_rebuilt_fixes": s.crc_rebuilt_fixes,
            "repairs_staged": s.repairs_staged,
            "cold_read_blocks": s.cold_read_blocks,
            "promotions_staged": s.promotions_staged,
            "scrub_bytes": s.scrub_bytes,
            "scrub_errors": s.scrub_errors,
            "scrub_mapping_errors": s.scrub_mapping_errors,
            "direct_blocks_mapped": s.direct_blocks_mapped,
            "direct_blocks_superseded": s.direct_blocks_superseded,
            "direct_blocks_to_cache": s.direct_blocks_to_cache,
        },
    })
}

impl DaemonAdmin {
    /// `volume_create` and `volume_set`: a volume with the limits asked for.
    fn create_or_set(&self, req: AdminRequest) -> Result<Reply, String> {
        let engine = self.backend.engine();
        match req {
            AdminRequest::VolumeCreate {
                name,
                size_bytes,
                iops_max,
                mibps_max,
                cache_share_pct,
                gc,
                map_unit_bytes,
                dual_map,
            } => {
                let limits = limits_of(
                    VolumeLimits::NONE,
                    iops_max,
                    mibps_max,
                    cache_share_pct,
                    gc.as_deref(),
                )?;
                let layout = match map_unit_bytes {
                    Some(b) => shale_engine::VolumeLayout::with_map_unit(b)?,
                    None => shale_engine::VolumeLayout::default(),
                };
                let layout = crate::serve::dual_layout(
                    layout,
                    dual_map.unwrap_or(false),
                    map_unit_bytes.is_some(),
                )?;
                let r = crate::serve::create_volume(
                    |r| engine.call(r),
                    name,
                    size_bytes,
                    limits,
                    layout,
                );
                r.map_err(|e| e.to_string())
            }
            AdminRequest::VolumeSet {
                name,
                iops_max,
                mibps_max,
                cache_share_pct,
                gc,
            } => {
                // One change at a time: each starts from the limits the last one left.
                let _one_at_a_time = self
                    .limits
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let v = self.volume(&name)?;
                let limits = limits_of(
                    v.limits,
                    iops_max,
                    mibps_max,
                    cache_share_pct,
                    gc.as_deref(),
                )?;
                let r = engine.call(Request::SetVolumeLimits {
                    volume: v.uid,
                    limits,
                });
                r.map_err(|e| e.to_string())
            }
            _ => Err("not a volume create or set".into()),
        }
    }
}

impl AdminHandler for DaemonAdmin {
    fn handle(&self, req: AdminRequest) -> Result<Value, String> {
        let engine = self.backend.engine();
        let volume_reply = |r: Result<Reply, String>| -> Result<Value, String> {
            let r = r?;
            self.backend.refresh().map_err(|e| e.to_string())?;
            Ok(match r {
                Reply::Volume(v) => volume_json(&v, self.clients(&v)),
                _ => Value::Null,
            })
        };
        match req {
            req @ (AdminRequest::VolumeCreate { .. } | AdminRequest::VolumeSet { .. }) => {
                volume_reply(self.create_or_set(req))
            }
            AdminRequest::VolumeResize {
                name,
                size_bytes,
                force,
            } => {
                let v = self.volume(&name)?;
                let req = Request::ResizeVolume {
                    volume: v.uid,
                    size_bytes,
                };
                volume_reply(if size_bytes < v.size_bytes {
                    self.change_without_clients(&v, "shrink", force, req)
                } else {
                    // Clients keep the size they connected with: growing under them
                    // changes nothing they can see until they reconnect.
                    engine.call(req).map_err(|e| e.to_string())
                })
            }
            AdminRequest::VolumeDelete { name, force } => {
                let v = self.volume(&name)?;
                let req = Request::DeleteVolume { volume: v.uid };
                volume_reply(self.change_without_clients(&v, "delete", force, req))
            }
            AdminRequest::VolumeList => {
                let v = list(&self.backend).map_err(|e| e.to_string())?;
                Ok(Value::Array(
                    v.iter().map(|v| volume_json(v, self.clients(v))).collect(),
                ))
            }
            AdminRequest::Stats => match stats(&self.backend) {
                Ok(s) => {
                    let mut v = stats_json(&s);
                    v["engine"] = json!({ "up": true });
                    let names = list(&self.backend).map_err(|e| e.to_string())?;
                    v["volumes"] = volumes_json(&s, &names, &self.backend);
                    if let (Value::Object(m), Some(d)) = (&mut v, &self.drive) {
                        m.insert("drive".into(), d.json(s.user_write_bytes));
                    }
                    if let (Value::Object(m), Some(d)) = (&mut v, &self.devices) {
                        m.insert("devices".into(), d.list());
                    }
                    Ok(v)
                }
                // A failed engine answers nothing, but why it failed is the one
                // thing an operator needs to see.
                Err(e) => match engine.failure() {
                    Some(reason) => Ok(json!({ "engine": { "up": false, "failure": reason } })),
                    None => Err(e.to_string()),
                },
            },
            AdminRequest::Checkpoint => {
                engine.call(Request::Flush).map_err(|e| e.to_string())?;
                Ok(Value::Null)
            }
            AdminRequest::DeviceList => Ok(self.devices()?.list()),
            AdminRequest::DeviceFail { device } => self.devices()?.fail(&device),
            AdminRequest::DeviceReplace { old, new } => self.devices()?.replace(&old, &new),
        }
    }
}

/// Samples for the Prometheus endpoint: `shale_engine_up` always, the rest (with the
/// simulated drive's, if there is one) while the engine serves.
#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
pub fn metrics(b: &EngineBackend, drive: Option<&DriveStats>) -> Vec<Metric> {
    let up = Metric {
        name: "shale_engine_up",
        help: "1 while the engine serves requests; 0 once it has failed (the daemon exits).",
        kind: MetricKind::Gauge,
        labels: vec![],
        value: 0.0,
    };
    let s = match stats(b) {
        Ok(s) if b.engine().failure().is_none() => s,
        _ => return vec![up],
    };
    let up = Metric { value: 1.0, ..up };
    let c = |name, help, v: u64| Metric {
        name,
        help,
        kind: MetricKind::Counter,
        labels: vec![],
        value: v as f64,
    };
    let g = |name, help, v: f64| Metric {
        name,
        help,
        kind: MetricKind::Gauge,
        labels: vec![],
        value: v,
    };
    let mut m = vec![
        up,
        c(
            "shale_user_read_bytes_total",
            "Bytes read by clients.",
            s.user_read_bytes,
        ),
        c(
            "shale_user_written_bytes_total",
            "Bytes written by clients.",
            s.user_write_bytes,
        ),
        c(
            "shale_cache_data_written_bytes_total",
            "User data bytes appended to the cache device.",
            s.cache_data_write_bytes,
        ),
        c(
            "shale_cache_md_written_bytes_total",
            "Metadata bytes written to the cache device.",
            s.cache_md_write_bytes,
        ),
        c(
            "shale_capacity_compaction_written_bytes_total",
            "Bytes written to capacity zones by compaction.",
            s.capacity_compaction_write_bytes,
        ),
        c(
            "shale_user_direct_written_bytes_total",
            "Bytes of client writes sent straight to capacity zones (direct writes).",
            s.direct_write_bytes,
        ),
        c(
            "shale_capacity_direct_written_bytes_total",
            "Bytes direct writes put in capacity zones (inside compaction's figure).",
            s.capacity_direct_write_bytes,
        ),
        c(
            "shale_capacity_gc_written_bytes_total",
            "Bytes written to capacity zones by GC.",
            s.capacity_gc_write_bytes,
        ),
        c(
            "shale_zone_resets_total",
            "Capacity zone resets.",
            s.zone_resets,
        ),
        c(
            "shale_zones_given_total",
            "Free capacity zones shards gave to the space manager (moved to another shard).",
            s.zones_given,
        ),
        c(
            "shale_chunks_given_total",
            "Free cache chunks shards gave to the space manager (moved to another shard).",
            s.chunks_given,
        ),
        c(
            "shale_chunk_frees_total",
            "Cache chunks freed by compaction.",
            s.chunk_frees,
        ),
        c("shale_l2p_hits_total", "L2P page cache hits.", s.l2p_hits),
        c(
            "shale_l2p_misses_total",
            "L2P page cache misses.",
            s.l2p_misses,
        ),
        c(
            "shale_crc_errors_total",
            "Checksum failures seen.",
            s.crc_errors,
        ),
        c(
            "shale_handoff_stores_total",
            "Hand-off images stored before acknowledgements.",
            s.handoff_stores,
        ),
        c(
            "shale_handoff_written_bytes_total",
            "Bytes of hand-off images stored.",
            s.handoff_bytes,
        ),
        g(
            "shale_free_chunks",
            "Free cache chunks.",
            s.free_chunks as f64,
        ),
        g(
            "shale_free_zones",
            "Free capacity zones.",
            s.free_zones as f64,
        ),
        g(
            "shale_layer_waf",
            "Capacity bytes written per user byte written.",
            s.layer_waf(),
        ),
    ];
    if let Some(d) = drive {
        m.extend(d.metrics(s.user_write_bytes));
    }
    if let Ok(vols) = list(b) {
        for v in &vols {
            m.push(Metric {
                name: "shale_volume_size_bytes",
                help: "Volume size.",
                kind: MetricKind::Gauge,
                labels: vec![("volume", v.name.clone())],
                value: v.size_bytes as f64,
            });
        }
        volume_metrics(&s, &vols, b, &mut m);
    }
    m
}

/// Per-volume series, labelled `volume`.
fn volume_metrics(s: &Stats, list: &[VolumeInfo], b: &EngineBackend, m: &mut Vec<Metric>) {
    for v in &s.volumes {
        let Some(info) = list.iter().find(|i| i.uid == v.uid) else {
            continue;
        };
        let label = || vec![("volume", info.name.clone())];
        let counter = |name, help, value: u64| Metric {
            name,
            help,
            kind: MetricKind::Counter,
            labels: label(),
            value: value as f64,
        };
        m.extend([
            counter(
                "shale_volume_read_ops_total",
                "Reads by the volume's clients.",
                v.read_ops,
            ),
            counter(
                "shale_volume_write_ops_total",
                "Writes by the volume's clients.",
                v.write_ops,
            ),
            counter(
                "shale_volume_user_read_bytes_total",
                "Bytes the volume's clients read.",
                v.user_read_bytes,
            ),
            counter(
                "shale_volume_user_written_bytes_total",
                "Bytes the volume's clients wrote.",
                v.user_write_bytes,
            ),
            counter(
                "shale_volume_user_trimmed_bytes_total",
                "Bytes the volume's clients trimmed.",
                v.user_trim_bytes,
            ),
            counter(
                "shale_volume_cache_written_bytes_total",
                "Data bytes appended to the cache for the volume.",
                v.cache_write_bytes,
            ),
            counter(
                "shale_volume_capacity_written_bytes_total",
                "The volume's data bytes compaction and GC wrote to capacity zones.",
                v.capacity_write_bytes(),
            ),
            counter(
                "shale_volume_throttle_delayed_total",
                "The volume's requests its rate limits delayed.",
                v.throttle_delayed,
            ),
            Metric {
                name: "shale_volume_layer_waf",
                help: "The volume's capacity bytes written per byte it wrote.",
                kind: MetricKind::Gauge,
                labels: label(),
                value: v.layer_waf(),
            },
        ]);
        let l = b.latency(v.uid);
        for (op, h) in [("read", &l.read), ("write", &l.write)] {
            let snap = h.snapshot();
            for (q, name) in [(0.5, "0.5"), (0.99, "0.99"), (0.999, "0.999")] {
                if let Some(us) = snap.quantile_us(q) {
                    m.push(Metric {
                        name: "shale_volume_latency_seconds",
                        help: "Client-visible request latency quantiles (bucket upper bounds) since the daemon started.",
                        kind: MetricKind::Gauge,
                        labels: vec![
                            ("volume", info.name.clone()),
                            ("op", op.to_string()),
                            ("quantile", name.to_string()),
                        ],
                        value: us as f64 / 1e6,
                    });
                }
            }
        }
    }
}
