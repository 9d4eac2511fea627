//! `shale device list|fail|replace`: the daemon's devices as an operator sees them.
//!
//! A single cache or capacity device is listed as it is (state `ok`). An array is
//! listed from its handle's snapshot, which the engine thread refreshes; commands go
//! to the array through the handle and are applied on the engine thread, which
//! answers within a poll interval (`shale_array::control::COMMAND_POLL_NS`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};
use shale_array::{ArrayHandle, ArrayStatus, Command, MemberShape, MemberState};
use shale_device::{BlockDevice, FileDevice, ZoneEmu, ZoneEmuConfig, ZonedDevice};

use crate::serve::DeviceSpec;

pub type CacheMember = Box<dyn BlockDevice + Send>;
pub type CapacityMember = Box<dyn ZonedDevice + Send>;

/// How long a command waits for the engine thread to apply it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The daemon's devices and, for arrays, their handles.
#[derive(Debug)]
pub struct Devices {
    pub spec: DeviceSpec,
    pub cache: Option<ArrayHandle<CacheMember>>,
    pub capacity: Option<ArrayHandle<CapacityMember>>,
    /// Locks on devices put in by `replace`, held while the daemon runs.
    locks: Mutex<Vec<std::fs::File>>,
}

impl Devices {
    pub fn new(
        spec: DeviceSpec,
        cache: Option<ArrayHandle<CacheMember>>,
        capacity: Option<ArrayHandle<CapacityMember>>,
    ) -> Devices {
        Devices {
            spec,
            cache,
            capacity,
            locks: Mutex::default(),
        }
    }

    /// Every device, cache first, as JSON objects.
    pub fn list(&self) -> Value {
        let mut out = Vec::new();
        match &self.cache {
            Some(h) => out.extend(members_json(&h.status())),
            None => out.push(single_json("cache", &self.spec.cache[0])),
        }
        match &self.capacity {
            Some(h) => out.extend(members_json(&h.status())),
            None => out.push(single_json("capacity", &self.spec.capacity[0])),
        }
        if let Some(cold) = &self.spec.cold {
            out.push(single_json("cold", cold));
        }
        Value::Array(out)
    }

    /// Takes a member out of service.
    pub fn fail(&self, device: &str) -> Result<Value, String> {
        let (role, rx) = if self.is_member(self.cache.as_ref().map(ArrayHandle::status), device) {
            let h = self.cache.as_ref().ok_or("no cache mirror")?;
            (
                "cache",
                h.submit(Command::Fail {
                    member: device.into(),
                }),
            )
        } else if self.is_member(self.capacity.as_ref().map(ArrayHandle::status), device) {
            let h = self.capacity.as_ref().ok_or("no capacity array")?;
            (
                "capacity",
                h.submit(Command::Fail {
                    member: device.into(),
                }),
            )
        } else {
            return Err(self.not_a_member(device));
        };
        let msg = wait(rx)?;
        tracing::warn!(%role, %device, "{msg}");
        Ok(json!({ "role": role, "message": msg }))
    }

    /// Puts `new` (a file or block device; a missing file is created sparse, of the
    /// members' size and zones) in `old`'s place and starts the rebuild.
    pub fn replace(&self, old: &str, new: &str) -> Result<Value, String> {
        let new_path = PathBuf::from(new);
        let name = new_path.display().to_string();
        let cache_status = self.cache.as_ref().map(ArrayHandle::status);
        let capacity_status = self.capacity.as_ref().map(ArrayHandle::status);
        if [&cache_status, &capacity_status].iter().any(|s| {
            s.as_ref()
                .is_some_and(|s| s.members.iter().any(|m| m.name == name))
        }) {
            return Err(format!("{name} is already a member"));
        }
        // A new file is sized as the members are (the array says), not from this
        // daemon's flags: `serve` may have been started without the sizes `format`
        // was given.
        let cache_bytes = match cache_status.as_ref().map(|s| &s.member_shape) {
            Some(MemberShape::Block { bytes }) => *bytes,
            _ => self.spec.cache_size,
        };
        let zones = match capacity_status.as_ref().map(|s| &s.member_shape) {
            Some(MemberShape::Zoned(g)) => Some(g.clone()),
            _ => None,
        };
        let (role, rx) = if self.is_member(cache_status, old) {
            let h = self.cache.as_ref().ok_or("no cache mirror")?;
            let dev = self.open_new(&new_path, cache_bytes)?;
            (
                "cache",
                h.submit(Command::Replace {
                    old: old.into(),
                    new: Box::new(dev) as CacheMember,
                    name,
                }),
            )
        } else if self.is_member(capacity_status, old) {
            let h = self.capacity.as_ref().ok_or("no capacity array")?;
            let cfg = match &zones {
                Some(g) => ZoneEmuConfig {
                    zone_size: g.zone_size,
                    zone_capacity: g.zone_capacity,
                    max_open_zones: g.max_open_zones,
                    max_active_zones: g.max_active_zones,
                    zone_count_max: g.zone_count,
                },
                None => self.spec.zone_config(),
            };
            let bytes = zones
                .as_ref()
                .and_then(|g| cfg.device_bytes_for(g.zone_count))
                .unwrap_or(self.spec.capacity_size);
            let file = self.open_new(&new_path, bytes)?;
            let inner: Box<dyn BlockDevice + Send> = Box::new(file);
            let emu =
                ZoneEmu::format(inner, &cfg).map_err(|e| format!("{new}: zone emulation: {e}"))?;
            (
                "capacity",
                h.submit(Command::Replace {
                    old: old.into(),
                    new: Box::new(emu) as CapacityMember,
                    name,
                }),
            )
        } else {
            return Err(self.not_a_member(old));
        };
        let msg = wait(rx)?;
        tracing::warn!(%role, %old, %new, "{msg}");
        Ok(json!({ "role": role, "message": msg }))
    }

    fn is_member(&self, status: Option<ArrayStatus>, device: &str) -> bool {
        status.is_some_and(|s| {
            s.members
                .iter()
                .any(|m| m.name == device || m.index.to_string() == device)
        })
    }

    fn not_a_member(&self, device: &str) -> String {
        if self.cache.is_none() && self.capacity.is_none() {
            return "this daemon's devices are not arrays: there is nothing to fail or replace"
                .into();
        }
        format!("{device} is not a member of this daemon's arrays (see shale device list)")
    }

    /// Opens (creating a sparse file if missing) and locks a replacement device.
    fn open_new(&self, path: &Path, size: u64) -> Result<FileDevice, String> {
        if !path.exists() {
            FileDevice::create_sparse(path, size)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
        }
        let lock = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        lock.try_lock()
            .map_err(|_| format!("{} is in use by another process", path.display()))?;
        let dev = FileDevice::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(lock);
        Ok(dev)
    }
}

fn wait(rx: std::sync::mpsc::Receiver<shale_array::CommandResult>) -> Result<String, String> {
    match rx.recv_timeout(COMMAND_TIMEOUT) {
        Ok(r) => r,
        Err(_) => Err("the engine thread did not take the command (is it running?)".into()),
    }
}

fn single_json(role: &str, path: &Path) -> Value {
    json!({
        "path": path.display().to_string(),
        "role": role,
        "index": 0,
        "state": "ok",
        "array": null,
    })
}

/// One JSON object per member of an array.
pub fn members_json(s: &ArrayStatus) -> Vec<Value> {
    s.members
        .iter()
        .map(|m| {
            let rebuild = s.rebuild.as_ref().filter(|r| r.member == m.index).map(|r| {
                let left = r.total_bytes.saturating_sub(r.done_bytes);
                json!({
                    "done_bytes": r.done_bytes,
                    "total_bytes": r.total_bytes,
                    "percent": if r.total_bytes == 0 { 100.0 } else { r.done_bytes as f64 * 100.0 / r.total_bytes as f64 },
                    "bytes_per_sec": r.bytes_per_sec,
                    "eta_seconds": if r.bytes_per_sec > 0.0 { Some(left as f64 / r.bytes_per_sec) } else { None },
                })
            });
            json!({
                "path": m.name,
                "role": s.role,
                "index": m.index,
                "state": m.state.as_str(),
                "reason": m.reason,
                "array": { "redundancy": s.redundancy, "generation": s.generation },
                "errors": {
                    "read": m.counters.read_errors,
                    "write": m.counters.write_errors,
                    "other": m.counters.other_errors,
                },
                "reconstructed_reads": m.counters.reconstructed_reads,
                "bytes_read": m.counters.bytes_read,
                "bytes_written": m.counters.bytes_written,
                "rebuild": rebuild,
            })
        })
        .collect()
}

/// Members not serving in full, per role (for stats and metrics).
pub fn degraded(s: &ArrayStatus) -> usize {
    s.members
        .iter()
        .filter(|m| m.state != MemberState::Ok)
        .count()
}
