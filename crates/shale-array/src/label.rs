//! Member labels on media, and putting an array together from labelled devices.
//!
//! A zoned member keeps its labels in its zones 0 and 1, one 4 KiB block appended per
//! update (the newest valid generation wins; a torn append leaves the previous one).
//! Appends go to one zone until it is full, then to the other, which is reset first:
//! the full zone keeps the newest label until the new one is durable, so a cut
//! between the reset and the append loses nothing. The zone is closed after each
//! append so it holds no open-zone slot. A mirror member keeps two label blocks at its start and writes the one not
//! holding the newest, so an interrupted update leaves the other.
//!
//! Open reads every device's label and refuses a set that does not belong together
//! (another pool or role, another layout, two devices claiming one slot, a device
//! whose identity is not the one the array records for its slot). The newest
//! generation among them is the array's state; a member that is missing, or whose
//! own label is older (it missed a change), is recorded failed in a new generation
//! before anything is written, so it is never trusted again without a rebuild.

use shale_device::{BlockDevice, DeviceError, ZoneAction, ZoneError, ZoneState, ZonedDevice};

use shale_format::{
    ArrayLabel, ArrayMember, ArrayRedundancy, ArrayRole, FormatError, MemberRecord, BLOCK_SIZE,
};

use crate::layout::{Redundancy, LABEL_ZONES};

/// What an array knows about itself beyond its devices: the label's contents.
#[derive(Debug, Clone)]
pub struct Identity {
    pub pool: [u8; 16],
    pub role: ArrayRole,
    pub redundancy: Redundancy,
    pub unit: u64,
    pub generation: u64,
    pub members: Vec<ArrayMember>,
}

#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    #[error("{device}: {source}")]
    Zone {
        device: String,
        #[source]
        source: ZoneError,
    },
    #[error("{device}: {source}")]
    Device {
        device: String,
        #[source]
        source: DeviceError,
    },
    #[error("{device}: no array member label (not a member of a Shale array{})", .detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Unlabelled {
        device: String,
        detail: Option<FormatError>,
    },
    #[error("these devices do not belong together: {0}")]
    Mismatch(String),
}

impl Identity {
    pub fn new(
        pool: [u8; 16],
        role: ArrayRole,
        redundancy: Redundancy,
        unit: u64,
        members: usize,
    ) -> Identity {
        Identity {
            pool,
            role,
            redundancy,
            unit,
            generation: 1,
            members: (0..members)
                .map(|_| ArrayMember {
                    uuid: *uuid::Uuid::new_v4().as_bytes(),
                    state: MemberRecord::Ok,
                    rebuilt: 0,
                })
                .collect(),
        }
    }

    /// Brings the recorded states in line with `states` (by slot); on any change the
    /// generation moves on and true says the labels must be written.
    pub fn record(&mut self, states: impl Iterator<Item = crate::member::MemberState>) -> bool {
        let mut changed = false;
        for (st, rec) in states.zip(self.members.iter_mut()) {
            let want = st.record();
            if rec.state != want {
                rec.state = want;
                changed = true;
            }
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// The label member `index` carries.
    pub fn label(&self, index: usize) -> ArrayLabel {
        ArrayLabel {
            pool: self.pool,
            role: self.role,
            redundancy: match self.redundancy {
                Redundancy::None => ArrayRedundancy::None,
                Redundancy::Mirror => ArrayRedundancy::Mirror,
                Redundancy::Parity { k, m } => ArrayRedundancy::Parity { k, m },
            },
            unit: self.unit,
            generation: self.generation,
            index: index as u8,
            members: self.members.clone(),
        }
    }

    fn from_label(l: &ArrayLabel) -> Identity {
        Identity {
            pool: l.pool,
            role: l.role,
            redundancy: match l.redundancy {
                ArrayRedundancy::None => Redundancy::None,
                ArrayRedundancy::Mirror => Redundancy::Mirror,
                ArrayRedundancy::Parity { k, m } => Redundancy::Parity { k, m },
            },
            unit: l.unit,
            generation: l.generation,
            members: l.members.clone(),
        }
    }
}

/// The newest valid label among `blocks` (4 KiB each).
fn newest(blocks: &[u8], at: u64) -> Result<ArrayLabel, FormatError> {
    let mut best: Option<ArrayLabel> = None;
    let mut first_err = None;
    for (i, b) in blocks.chunks_exact(BLOCK_SIZE).enumerate() {
        match ArrayLabel::decode(b, at + (i * BLOCK_SIZE) as u64) {
            Ok(l) if best.as_ref().is_none_or(|x| l.generation > x.generation) => best = Some(l),
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    best.ok_or_else(|| {
        first_err.unwrap_or(FormatError::Truncated {
            structure: shale_format::Structure::ArrayLabel,
            at,
            len: 0,
            need: BLOCK_SIZE,
        })
    })
}

/// The written part of label zone `zone`, whole blocks.
fn label_blocks<Z: ZonedDevice>(dev: &mut Z, zone: u32) -> Result<(u64, Vec<u8>), ZoneError> {
    let info = dev.zone_info(zone)?;
    let len = info.write_pointer.saturating_sub(info.start) as usize;
    let mut buf = vec![0u8; len / BLOCK_SIZE * BLOCK_SIZE];
    if !buf.is_empty() {
        dev.read_at(info.start, &mut buf)?;
    }
    Ok((info.start, buf))
}

/// Reads the newest label from a zoned member's label zones.
pub fn read_zoned<Z: ZonedDevice>(dev: &mut Z, name: &str) -> Result<ArrayLabel, LabelError> {
    let zerr = |source| LabelError::Zone {
        device: name.to_string(),
        source,
    };
    let mut best: Option<ArrayLabel> = None;
    let mut first_err = None;
    let mut any = false;
    for zone in 0..LABEL_ZONES {
        let (at, buf) = label_blocks(dev, zone).map_err(zerr)?;
        if buf.is_empty() {
            continue;
        }
        any = true;
        match newest(&buf, at) {
            Ok(l) if best.as_ref().is_none_or(|b| l.generation > b.generation) => best = Some(l),
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    best.ok_or_else(|| LabelError::Unlabelled {
        device: name.to_string(),
        detail: if any { first_err } else { None },
    })
}

/// The generation of the newest valid label in label zone `zone` (`None`: none).
fn zone_generation<Z: ZonedDevice>(dev: &mut Z, zone: u32) -> Result<Option<u64>, ZoneError> {
    let (at, buf) = label_blocks(dev, zone)?;
    Ok(newest(&buf, at).ok().map(|l| l.generation))
}

/// Which label zone the next append goes to. Appends fill one zone, then move to the
/// other; so a written zone with room left is the newer one, and when both are full
/// the one holding the older labels is the one to reset.
fn append_zone<Z: ZonedDevice>(dev: &mut Z) -> Result<u32, ZoneError> {
    let info = [dev.zone_info(0)?, dev.zone_info(1)?];
    let used = |i: usize| info[i].write_pointer > info[i].start;
    let room = |i: usize| {
        info[i].state != ZoneState::Full
            && info[i].write_pointer + BLOCK_SIZE as u64 <= info[i].start + info[i].capacity
    };
    Ok(match (used(0), used(1)) {
        (false, false) => 0,
        (true, false) => u32::from(!room(0)),
        (false, true) => u32::from(room(1)),
        (true, true) => match (room(0), room(1)) {
            (true, false) => 0,
            (false, true) => 1,
            _ => {
                // Both full (or, never by this code, both with room): the newer zone
                // takes the append if it can, else the older one is reset.
                let newer = u32::from(zone_generation(dev, 1)? > zone_generation(dev, 0)?);
                if room(newer as usize) {
                    newer
                } else {
                    1 - newer
                }
            }
        },
    })
}

/// Appends a label to a zoned member's label zones (see the module's comment), closes
/// the zone and flushes.
pub fn write_zoned<Z: ZonedDevice>(dev: &mut Z, label: &ArrayLabel) -> Result<(), ZoneError> {
    let zone = append_zone(dev)?;
    let info = dev.zone_info(zone)?;
    if info.state == ZoneState::Full
        || info.write_pointer + BLOCK_SIZE as u64 > info.start + info.capacity
    {
        dev.manage(zone, ZoneAction::Reset)?;
    }
    let wp = dev.zone_info(zone)?.write_pointer;
    dev.write_at(wp, &label.encode())?;
    // The append that fills the zone leaves it full, and a full zone holds no
    // open-zone slot to give back.
    if dev.zone_info(zone)?.state != ZoneState::Full {
        dev.manage(zone, ZoneAction::Close)?;
    }
    dev.flush()
}

/// Reads the newest of a mirror member's two label blocks.
pub fn read_block<C: BlockDevice>(dev: &mut C, name: &str) -> Result<ArrayLabel, LabelError> {
    let mut buf = vec![0u8; 2 * BLOCK_SIZE];
    dev.read_at(0, &mut buf)
        .map_err(|source| LabelError::Device {
            device: name.to_string(),
            source,
        })?;
    newest(&buf, 0).map_err(|e| LabelError::Unlabelled {
        device: name.to_string(),
        detail: Some(e),
    })
}

/// Writes a mirror member's label into the block its generation's parity picks (so
/// the previous generation stays in the other) and flushes.
pub fn write_block<C: BlockDevice>(dev: &mut C, label: &ArrayLabel) -> Result<(), DeviceError> {
    let at = (label.generation % 2) * BLOCK_SIZE as u64;
    dev.write_at(at, &label.encode())?;
    dev.flush()
}

/// What open worked out: the array's identity (the newest label, missing and stale
/// members recorded failed), the devices by slot, and whether the labels need
/// rewriting.
#[derive(Debug)]
pub struct Placement<D> {
    pub identity: Identity,
    pub slots: Vec<(Option<D>, String)>,
    pub changed: bool,
}

/// Matches labelled devices to slots. Returns the array's identity (the newest
/// label, with missing and stale members recorded failed) and the devices by slot.
pub fn place<D>(
    role: ArrayRole,
    found: Vec<(D, String, ArrayLabel)>,
) -> Result<Placement<D>, LabelError> {
    let Some(newest) = found
        .iter()
        .map(|f| &f.2)
        .max_by_key(|l| l.generation)
        .cloned()
    else {
        return Err(LabelError::Mismatch("no devices".into()));
    };
    let mut id = Identity::from_label(&newest);
    let n = id.members.len();
    let mut slots: Vec<(Option<D>, String)> = (0..n)
        .map(|i| (None, format!("slot {i} (missing)")))
        .collect();
    let mut changed = false;
    for (dev, name, l) in found {
        let same = l.pool == newest.pool
            && l.role == role
            && l.redundancy == newest.redundancy
            && l.unit == newest.unit
            && l.members.len() == n;
        if !same {
            return Err(LabelError::Mismatch(format!(
                "{name} is slot {} of a {:?} array of {} members ({:?}) in pool {}; the others are {:?} of {n} ({:?}) in pool {}",
                l.index, l.role, l.members.len(), l.redundancy, uuid::Uuid::from_bytes(l.pool),
                role, newest.redundancy, uuid::Uuid::from_bytes(newest.pool)
            )));
        }
        let slot = usize::from(l.index);
        if l.member_uuid() != Some(id.members[slot].uuid) {
            if l.generation < newest.generation {
                // A former member, replaced while it was out: not part of the array.
                tracing::warn!(device = %name, slot, "a former member of this array (replaced); left out");
                continue;
            }
            return Err(LabelError::Mismatch(format!(
                "{name} says it is slot {slot}, but the array's slot {slot} is another device"
            )));
        }
        if slots[slot].0.is_some() {
            return Err(LabelError::Mismatch(format!(
                "{name} and {} both claim slot {slot}",
                slots[slot].1
            )));
        }
        if l.generation < newest.generation && id.members[slot].state == MemberRecord::Ok {
            tracing::warn!(device = %name, "array member missed a change of the array (stale); treated as failed");
            id.members[slot].state = MemberRecord::Failed;
            changed = true;
        }
        slots[slot] = (Some(dev), name);
    }
    for (slot, (d, name)) in slots.iter().enumerate() {
        if d.is_none() && id.members[slot].state == MemberRecord::Ok {
            tracing::warn!(slot, %name, "array member missing; recorded failed");
            id.members[slot].state = MemberRecord::Failed;
            changed = true;
        }
    }
    if changed {
        id.generation += 1;
    }
    Ok(Placement {
        identity: id,
        slots,
        changed,
    })
}

impl From<LabelError> for crate::zoned::ArrayError {
    fn from(e: LabelError) -> Self {
        crate::zoned::ArrayError::Label(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemberState;
    use crate::{MirrorDevice, ZoneArray};
    use shale_device::{MemDevice, ZoneEmu, ZoneEmuConfig};

    type Z = ZoneEmu<MemDevice>;

    fn zoned(n: usize) -> Vec<(Z, String)> {
        let cfg = ZoneEmuConfig::new(256 * 1024);
        let bytes = cfg.device_bytes_for(8).expect("size");
        (0..n)
            .map(|i| {
                let d = MemDevice::new(bytes, 4096).expect("mem");
                (ZoneEmu::format(d, &cfg).expect("emu"), format!("z{i}"))
            })
            .collect()
    }

    fn present(a: ZoneArray<Z>) -> Vec<(Z, String)> {
        a.into_members()
            .into_iter()
            .filter_map(|(d, n)| Some((d?, n)))
            .collect()
    }

    const R: Redundancy = Redundancy::Parity { k: 2, m: 1 };
    const UNIT: u64 = 64 * 1024;

    fn sample_label(generation: u64) -> ArrayLabel {
        ArrayLabel {
            pool: [3; 16],
            role: ArrayRole::Capacity,
            redundancy: ArrayRedundancy::Parity { k: 2, m: 1 },
            unit: UNIT,
            generation,
            index: 0,
            members: vec![
                ArrayMember {
                    uuid: [1; 16],
                    state: MemberRecord::Ok,
                    rebuilt: 0,
                };
                3
            ],
        }
    }

    #[test]
    fn labels_outlive_filling_and_resetting_their_zones() {
        // 64 labels a zone: 300 updates fill and reset each zone several times.
        let (mut d, _) = zoned(1).pop().expect("device");
        for g in 1..=300u64 {
            write_zoned(&mut d, &sample_label(g)).expect("write");
            assert_eq!(read_zoned(&mut d, "z").expect("read").generation, g);
            // A cut right after the next append's reset (the worst point) still
            // leaves this label.
            let zone = append_zone(&mut d).expect("zone");
            let info = d.zone_info(zone).expect("info");
            if info.write_pointer + BLOCK_SIZE as u64 > info.start + info.capacity {
                let bytes = d.inner().size_bytes();
                let mut image = vec![0u8; bytes as usize];
                d.inner_mut().read_at(0, &mut image).expect("image");
                let mut m = MemDevice::new(bytes, 4096).expect("mem");
                m.write_at(0, &image).expect("copy");
                let mut copy = ZoneEmu::open(m).expect("copy");
                copy.manage(zone, ZoneAction::Reset).expect("reset");
                assert_eq!(read_zoned(&mut copy, "z").expect("read").generation, g);
            }
        }
    }

    #[test]
    fn members_are_found_by_label_in_any_order() {
        let mut a = ZoneArray::create(zoned(3), R, UNIT, [1; 16]).expect("create");
        let s = a.geometry().write_unit as usize;
        a.write_at(0, &vec![9u8; s]).expect("write");
        a.flush().expect("flush");
        let mut devs = present(a);
        devs.reverse();
        let mut a = ZoneArray::open(devs).expect("open");
        assert_eq!(a.generation(), 1);
        let mut b = vec![0u8; s];
        a.read_at(0, &mut b).expect("read");
        assert!(b.iter().all(|&x| x == 9));
        assert!(a.members().iter().all(|m| m.state == MemberState::Ok));
    }

    #[test]
    fn devices_of_another_array_or_none_are_refused() {
        let a = ZoneArray::create(zoned(3), R, UNIT, [1; 16]).expect("create");
        let b = ZoneArray::create(zoned(3), R, UNIT, [2; 16]).expect("create");
        let mut mixed = present(a);
        let other = present(b).pop().expect("one");
        mixed.pop();
        mixed.push(other);
        let e = ZoneArray::open(mixed).expect_err("a foreign member");
        assert!(e.to_string().contains("do not belong together"), "{e}");
        let e = ZoneArray::open(zoned(3)).expect_err("blank devices");
        assert!(e.to_string().contains("no array member label"), "{e}");
        // The same pool, a member replaced by a freshly made array's slot 2.
        let a = ZoneArray::create(zoned(3), R, UNIT, [3; 16]).expect("create");
        let c = ZoneArray::create(zoned(3), R, UNIT, [3; 16]).expect("create");
        let mut mixed = present(a);
        mixed.pop();
        mixed.push(present(c).pop().expect("one"));
        let e = ZoneArray::open(mixed).expect_err("an impostor");
        assert!(e.to_string().contains("another device"), "{e}");
    }

    #[test]
    fn a_member_missing_once_is_never_trusted_again() {
        let a = ZoneArray::create(zoned(3), R, UNIT, [4; 16]).expect("create");
        let mut devs = present(a);
        let away = devs.remove(1);
        let a = ZoneArray::open(devs).expect("degraded open");
        assert_eq!(a.generation(), 2);
        assert_eq!(a.members()[1].state, MemberState::Missing);
        let mut devs = present(a);
        devs.push(away);
        let a = ZoneArray::open(devs).expect("open");
        assert_eq!(a.members()[1].state, MemberState::Failed);
        assert!(
            a.members()
                .iter()
                .filter(|m| m.state == MemberState::Ok)
                .count()
                == 2
        );
    }

    #[test]
    fn a_failure_is_recorded_on_the_survivors() {
        let mut a = ZoneArray::create(zoned(3), R, UNIT, [5; 16]).expect("create");
        a.fail_member(0, "operator").expect("fail");
        assert_eq!(a.generation(), 2);
        let a = ZoneArray::open(present(a)).expect("open");
        assert_eq!(a.members()[0].state, MemberState::Failed);
        assert_eq!(a.generation(), 2);
    }

    #[test]
    fn mirrors_are_found_by_label_and_a_stale_one_is_not_read() {
        let devs: Vec<(MemDevice, String)> = (0..2)
            .map(|i| (MemDevice::new(4 << 20, 4096).expect("mem"), format!("c{i}")))
            .collect();
        let mut m = MirrorDevice::create(devs, [6; 16]).expect("create");
        m.write_at(0, &[1u8; 4096]).expect("write");
        let mut devs: Vec<(MemDevice, String)> = m
            .into_members()
            .into_iter()
            .filter_map(|(d, n)| Some((d?, n)))
            .collect();
        devs.reverse();
        let away = devs.remove(0);
        let mut m = MirrorDevice::open(devs).expect("one mirror is enough");
        m.write_at(0, &[2u8; 4096]).expect("write");
        let mut devs: Vec<(MemDevice, String)> = m
            .into_members()
            .into_iter()
            .filter_map(|(d, n)| Some((d?, n)))
            .collect();
        devs.push(away);
        let mut m = MirrorDevice::open(devs).expect("open");
        let mut b = [0u8; 4096];
        for _ in 0..4 {
            m.read_at(0, &mut b).expect("read");
            assert!(b.iter().all(|&x| x == 2), "the stale mirror was read");
        }
        assert_eq!(
            m.members()
                .iter()
                .filter(|s| s.state == MemberState::Failed)
                .count(),
            1
        );
    }
}
