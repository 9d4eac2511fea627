//! The ZNS rules every zoned device Shale implements enforces at submission: zone
//! emulation (`zone_emu.rs`) and a kernel zoned block device (`blkzoned.rs`). Pure
//! functions of a zone's state and write pointer and the device's open and active
//! counts, so both devices refuse exactly the same requests with the same errors.

use crate::{DeviceError, IoOpKind, ZoneAction, ZoneError, ZoneState};

pub(crate) fn is_open(s: ZoneState) -> bool {
    matches!(s, ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen)
}

pub(crate) fn is_active(s: ZoneState) -> bool {
    is_open(s) || s == ZoneState::Closed
}

/// A device's zone layout and limits (0 means no limit).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    pub zone_size: u64,
    pub zone_capacity: u64,
    pub zone_count: u32,
    pub logical_block_size: u64,
    pub max_open: u32,
    pub max_active: u32,
}

/// How many zones are open and active right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub open: u32,
    pub active: u32,
}

impl Counts {
    /// The counts after one zone moves from `old` to `new`.
    pub fn moved(&mut self, old: ZoneState, new: ZoneState) {
        self.open = self.open + u32::from(is_open(new)) - u32::from(is_open(old));
        self.active = self.active + u32::from(is_active(new)) - u32::from(is_active(old));
    }
}

impl Rules {
    pub fn zones_bytes(&self) -> u64 {
        u64::from(self.zone_count) * self.zone_size
    }

    pub fn open_limit(&self, zone: u32, c: Counts) -> Result<(), ZoneError> {
        let limit = self.max_open;
        if limit != 0 && c.open >= limit {
            return Err(ZoneError::TooManyOpen { zone, limit });
        }
        Ok(())
    }

    pub fn active_limit(&self, zone: u32, c: Counts) -> Result<(), ZoneError> {
        let limit = self.max_active;
        if limit != 0 && c.active >= limit {
            return Err(ZoneError::TooManyActive { zone, limit });
        }
        Ok(())
    }

    /// Checks an offset-addressed range: zero length, alignment, bounds, one zone.
    /// Returns the zone index.
    pub fn range(&self, op: IoOpKind, offset: u64, len: u64) -> Result<u32, ZoneError> {
        if len == 0 {
            return Err(DeviceError::ZeroLength { op, offset }.into());
        }
        let align = self.logical_block_size;
        if !offset.is_multiple_of(align) || !len.is_multiple_of(align) {
            return Err(DeviceError::Misaligned {
                op,
                offset,
                len,
                align,
            }
            .into());
        }
        let size = self.zones_bytes();
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(DeviceError::OutOfRange {
                op,
                offset,
                len,
                size,
            }
            .into());
        }
        let zone = offset / self.zone_size;
        if (offset + len - 1) / self.zone_size != zone {
            return Err(ZoneError::CrossesZoneBoundary { offset, len });
        }
        Ok(zone as u32)
    }

    /// A read of `offset..offset+len` in `zone` (already range-checked), whose state
    /// and relative write pointer are given.
    pub fn read(
        &self,
        zone: u32,
        state: ZoneState,
        wp: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), ZoneError> {
        if state == ZoneState::Offline {
            return Err(ZoneError::Offline { zone });
        }
        let start = u64::from(zone) * self.zone_size;
        if offset + len > start + wp {
            return Err(ZoneError::ReadPastWritePointer {
                zone,
                offset,
                len,
                write_pointer: start + wp,
            });
        }
        Ok(())
    }

    /// Checks a write of `len` bytes at the write pointer of `zone` (`offset` is the
    /// caller's offset for a write, `None` for an append) against the zone's state,
    /// write pointer, capacity and the open/active limits. Returns the absolute
    /// offset where the data goes.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_write(
        &self,
        zone: u32,
        state: ZoneState,
        wp: u64,
        offset: Option<u64>,
        len: u64,
        c: Counts,
    ) -> Result<u64, ZoneError> {
        let start = u64::from(zone) * self.zone_size;
        let wp_abs = start + wp;
        let end = start + self.zone_capacity;
        match state {
            ZoneState::Offline => return Err(ZoneError::Offline { zone }),
            ZoneState::ReadOnly => return Err(ZoneError::ReadOnly { zone }),
            ZoneState::Full => {
                return Err(ZoneError::ZoneFull {
                    zone,
                    offset: offset.unwrap_or(wp_abs),
                    len,
                    zone_end: end,
                })
            }
            _ => {}
        }
        if let Some(off) = offset {
            if off != wp_abs {
                return Err(ZoneError::NotAtWritePointer {
                    zone,
                    offset: off,
                    write_pointer: wp_abs,
                });
            }
        }
        if wp_abs + len > end {
            return Err(ZoneError::ZoneFull {
                zone,
                offset: wp_abs,
                len,
                zone_end: end,
            });
        }
        match state {
            ZoneState::Empty => {
                self.active_limit(zone, c)?;
                self.open_limit(zone, c)?;
            }
            ZoneState::Closed => self.open_limit(zone, c)?,
            _ => {}
        }
        Ok(wp_abs)
    }

    /// The state after a write of `len` bytes accepted by `plan_write`, and the new
    /// relative write pointer: the zone opens implicitly (from Empty or Closed) and
    /// fills at capacity.
    pub fn after_write(&self, state: ZoneState, wp: u64, len: u64) -> (ZoneState, u64) {
        let wp = wp + len;
        assert!(wp <= self.zone_capacity, "write pointer past capacity");
        if wp == self.zone_capacity {
            (ZoneState::Full, wp)
        } else if matches!(state, ZoneState::Empty | ZoneState::Closed) {
            (ZoneState::ImplicitlyOpen, wp)
        } else {
            (state, wp)
        }
    }

    /// The state a zone management command moves `zone` to (NVMe ZNS 1.0, Figure 7),
    /// or why it may not.
    pub fn transition(
        &self,
        zone: u32,
        state: ZoneState,
        wp: u64,
        action: ZoneAction,
        c: Counts,
    ) -> Result<ZoneState, ZoneError> {
        let invalid = || ZoneError::InvalidTransition {
            zone,
            state,
            action,
        };
        match state {
            ZoneState::Offline => return Err(ZoneError::Offline { zone }),
            ZoneState::ReadOnly => return Err(ZoneError::ReadOnly { zone }),
            _ => {}
        }
        Ok(match (action, state) {
            (ZoneAction::Open, ZoneState::Full) => return Err(invalid()),
            (ZoneAction::Open, ZoneState::ExplicitlyOpen) => ZoneState::ExplicitlyOpen,
            (ZoneAction::Open, ZoneState::ImplicitlyOpen) => ZoneState::ExplicitlyOpen,
            (ZoneAction::Open, ZoneState::Closed) => {
                self.open_limit(zone, c)?;
                ZoneState::ExplicitlyOpen
            }
            (ZoneAction::Open, _) => {
                self.active_limit(zone, c)?;
                self.open_limit(zone, c)?;
                ZoneState::ExplicitlyOpen
            }
            (ZoneAction::Close, ZoneState::Empty | ZoneState::Full) => return Err(invalid()),
            (ZoneAction::Close, ZoneState::Closed) => ZoneState::Closed,
            (ZoneAction::Close, _) => {
                if wp == 0 {
                    ZoneState::Empty
                } else {
                    ZoneState::Closed
                }
            }
            (ZoneAction::Finish, ZoneState::Empty) => {
                // ZNS: finishing an empty zone needs an active resource on the way.
                self.active_limit(zone, c)?;
                ZoneState::Full
            }
            (ZoneAction::Finish, _) => ZoneState::Full,
            (ZoneAction::Reset, _) => ZoneState::Empty,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            zone_size: 1 << 20,
            zone_capacity: 768 << 10,
            zone_count: 4,
            logical_block_size: 4096,
            max_open: 1,
            max_active: 2,
        }
    }

    #[test]
    fn counts_follow_every_move() {
        let states = [
            ZoneState::Empty,
            ZoneState::ImplicitlyOpen,
            ZoneState::ExplicitlyOpen,
            ZoneState::Closed,
            ZoneState::Full,
            ZoneState::ReadOnly,
            ZoneState::Offline,
        ];
        for &a in &states {
            for &b in &states {
                let mut c = Counts {
                    open: u32::from(is_open(a)),
                    active: u32::from(is_active(a)),
                };
                c.moved(a, b);
                assert_eq!(
                    c,
                    Counts {
                        open: u32::from(is_open(b)),
                        active: u32::from(is_active(b)),
                    },
                    "{a:?} -> {b:?}"
                );
            }
        }
    }

    #[test]
    fn a_write_fills_the_zone_at_its_capacity_not_its_size() {
        let r = rules();
        let c = Counts::default();
        let at = r
            .plan_write(1, ZoneState::Empty, 0, Some(1 << 20), 512 << 10, c)
            .expect("fits");
        assert_eq!(at, 1 << 20);
        assert_eq!(
            r.after_write(ZoneState::Empty, 0, 512 << 10),
            (ZoneState::ImplicitlyOpen, 512 << 10)
        );
        assert_eq!(
            r.after_write(ZoneState::ImplicitlyOpen, 512 << 10, 256 << 10),
            (ZoneState::Full, 768 << 10)
        );
        assert!(matches!(
            r.plan_write(
                1,
                ZoneState::ImplicitlyOpen,
                512 << 10,
                None,
                512 << 10,
                Counts { open: 1, active: 1 }
            ),
            Err(ZoneError::ZoneFull { .. })
        ));
    }

    #[test]
    fn limits_refuse_a_new_open_zone_but_not_one_already_open() {
        let r = rules();
        let one_open = Counts { open: 1, active: 1 };
        assert!(matches!(
            r.plan_write(2, ZoneState::Empty, 0, None, 4096, one_open),
            Err(ZoneError::TooManyOpen { limit: 1, .. })
        ));
        assert!(r
            .plan_write(2, ZoneState::ImplicitlyOpen, 0, None, 4096, one_open)
            .is_ok());
        let two_active = Counts { open: 0, active: 2 };
        assert!(matches!(
            r.transition(3, ZoneState::Empty, 0, ZoneAction::Finish, two_active),
            Err(ZoneError::TooManyActive { limit: 2, .. })
        ));
        assert_eq!(
            r.transition(3, ZoneState::ImplicitlyOpen, 0, ZoneAction::Close, one_open)
                .expect("close"),
            ZoneState::Empty
        );
    }
}
