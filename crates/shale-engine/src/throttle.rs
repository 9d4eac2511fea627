//! Per-volume rate limits (`VolumeLimits`): a token bucket per limited volume, for
//! requests per second and bytes per second.
//!
//! Reads, writes, trims and write-zeroes of a limited volume wait here, in arrival
//! order, until the bucket admits them; the engine takes admitted ones into its
//! queue at the start of each loop iteration. A bucket holds a tenth of a second of
//! its rate (bursts up to that), starts full, and may go into debt by bytes (a request
//! larger than the bucket passes once the bucket is not in debt, and later ones wait
//! for the debt to be repaid), so over time the rate is exact whatever the request
//! size. Flushes and volume changes never wait: a flush covers what completed before
//! it, and a waiting write has not completed.
//!
//! Invariants: only volumes whose limits are set have a bucket; a request of such a
//! volume is never admitted ahead of an earlier one of the same volume.

use std::collections::{HashMap, VecDeque};

use shale_format::{VolumeLimits, VolumeUid};

use crate::request::{Answer, Request};

/// Seconds of rate a bucket holds.
const BURST_SECS: f64 = 0.1;

/// A request waiting: arrival time and the bucket's stall count then.
#[derive(Debug)]
struct Waiting {
    request: Request,
    done: Answer,
    since_ns: u64,
    stalls: u64,
}

/// What a limited volume's requests waited, over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Waited {
    /// Requests the limits delayed (not admitted at the first chance).
    pub requests: u64,
    /// Their time waiting, in nanoseconds.
    pub ns: u64,
}

#[derive(Debug)]
struct Bucket {
    limits: VolumeLimits,
    ops: f64,
    bytes: f64,
    last_ns: u64,
    waiting: VecDeque<Waiting>,
    /// Times admission stopped for want of tokens: a request that arrived before the
    /// latest stop was delayed by the limits.
    stalls: u64,
    waited: Waited,
}

impl Bucket {
    fn new(limits: VolumeLimits, now: u64) -> Bucket {
        let mut b = Bucket {
            limits,
            ops: 0.0,
            bytes: 0.0,
            last_ns: now,
            waiting: VecDeque::new(),
            stalls: 0,
            waited: Waited::default(),
        };
        b.ops = b.ops_cap();
        b.bytes = b.bytes_cap();
        b
    }

    fn ops_cap(&self) -> f64 {
        (self.limits.iops_max as f64 * BURST_SECS).max(1.0)
    }

    fn bytes_cap(&self) -> f64 {
        self.limits.bytes_per_sec_max as f64 * BURST_SECS
    }

    fn refill(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last_ns) as f64 / 1e9;
        self.last_ns = self.last_ns.max(now);
        if self.limits.iops_max > 0 {
            self.ops = (self.ops + self.limits.iops_max as f64 * dt).min(self.ops_cap());
        }
        if self.limits.bytes_per_sec_max > 0 {
            self.bytes =
                (self.bytes + self.limits.bytes_per_sec_max as f64 * dt).min(self.bytes_cap());
        }
    }

    /// Takes the tokens for `bytes` if the bucket has them.
    fn admit(&mut self, bytes: u64) -> bool {
        let ops_ok = self.limits.iops_max == 0 || self.ops >= 1.0;
        let bytes_ok = self.limits.bytes_per_sec_max == 0 || self.bytes > 0.0 || bytes == 0;
        if !(ops_ok && bytes_ok) {
            return false;
        }
        if self.limits.iops_max > 0 {
            self.ops -= 1.0;
        }
        if self.limits.bytes_per_sec_max > 0 {
            self.bytes -= bytes as f64;
        }
        true
    }

    /// Nanoseconds until the first waiting request can be admitted.
    fn wait_ns(&self) -> u64 {
        let Some(Waiting { request: r, .. }) = self.waiting.front() else {
            return u64::MAX;
        };
        let mut secs: f64 = 0.0;
        if self.limits.iops_max > 0 && self.ops < 1.0 {
            secs = secs.max((1.0 - self.ops) / self.limits.iops_max as f64);
        }
        if self.limits.bytes_per_sec_max > 0 && self.bytes <= 0.0 && cost_bytes(r) > 0 {
            secs = secs.max((1.0 - self.bytes) / self.limits.bytes_per_sec_max as f64);
        }
        (secs * 1e9).ceil() as u64
    }
}

/// The volume and bytes of a request that limits apply to.
fn limited(r: &Request) -> Option<VolumeUid> {
    match r {
        Request::Read { volume, .. }
        | Request::Write { volume, .. }
        | Request::Trim { volume, .. }
        | Request::WriteZeroes { volume, .. } => Some(*volume),
        _ => None,
    }
}

fn cost_bytes(r: &Request) -> u64 {
    match r {
        Request::Read { len, .. } => *len,
        Request::Write { data, .. } => data.len() as u64,
        _ => 0,
    }
}

#[derive(Debug, Default)]
pub(crate) struct Throttle {
    buckets: HashMap<VolumeUid, Bucket>,
    /// What waited on volumes whose limits were removed (their buckets went), so the
    /// per-volume counters never go back; forgotten when the volume goes.
    past: HashMap<VolumeUid, Waited>,
    /// Requests the limits delayed, over the engine's life (deleted volumes too).
    pub delayed: u64,
}

/// Hands back a bucket's waiting requests, counting as delayed those the limits
/// stopped after they arrived.
fn drain(b: &mut Bucket, now: u64, delayed: &mut u64, out: &mut Vec<(Request, Answer)>) {
    for w in b.waiting.drain(..) {
        if w.stalls < b.stalls {
            b.waited.requests += 1;
            b.waited.ns += now.saturating_sub(w.since_ns);
            *delayed += 1;
        }
        out.push((w.request, w.done));
    }
}

impl Throttle {
    /// Makes the buckets follow the volumes' limits; a volume whose limits went away
    /// (or that was deleted) hands back what waited, to be queued at once.
    pub fn sync(
        &mut self,
        volumes: impl Iterator<Item = (VolumeUid, VolumeLimits)>,
        now: u64,
    ) -> Vec<(Request, Answer)> {
        let mut keep: HashMap<VolumeUid, VolumeLimits> = HashMap::new();
        let mut live = std::collections::HashSet::new();
        for (uid, l) in volumes {
            live.insert(uid);
            if l.has_rates() {
                keep.insert(uid, l);
            }
        }
        let mut freed = Vec::new();
        let (past, delayed) = (&mut self.past, &mut self.delayed);
        self.buckets.retain(|uid, b| {
            if keep.contains_key(uid) {
                return true;
            }
            drain(b, now, delayed, &mut freed);
            let p = past.entry(*uid).or_default();
            p.requests += b.waited.requests;
            p.ns += b.waited.ns;
            false
        });
        self.past.retain(|uid, _| live.contains(uid));
        for (uid, l) in keep {
            match self.buckets.get_mut(&uid) {
                Some(b) if b.limits == l => {}
                Some(b) => {
                    b.refill(now);
                    b.limits = l;
                    b.ops = b.ops.min(b.ops_cap());
                    b.bytes = b.bytes.min(b.bytes_cap());
                }
                None => {
                    let mut b = Bucket::new(l, now);
                    b.waited = self.past.remove(&uid).unwrap_or_default();
                    self.buckets.insert(uid, b);
                }
            }
        }
        freed
    }

    /// Takes `r` if its volume is limited (it waits here); otherwise hands it back.
    pub fn hold(&mut self, r: Request, done: Answer, now: u64) -> Option<(Request, Answer)> {
        if self.buckets.is_empty() {
            return Some((r, done));
        }
        match limited(&r).and_then(|uid| self.buckets.get_mut(&uid)) {
            Some(b) => {
                let stalls = b.stalls;
                b.waiting.push_back(Waiting {
                    request: r,
                    done,
                    since_ns: now,
                    stalls,
                });
                None
            }
            None => Some((r, done)),
        }
    }

    /// Requests admitted by now, in each volume's order.
    pub fn release(&mut self, now: u64, out: &mut VecDeque<(Request, Answer)>) {
        for b in self.buckets.values_mut() {
            if b.waiting.is_empty() {
                continue;
            }
            b.refill(now);
            while let Some(w) = b.waiting.front() {
                if !b.admit(cost_bytes(&w.request)) {
                    b.stalls += 1;
                    break;
                }
                let Some(w) = b.waiting.pop_front() else {
                    break;
                };
                if w.stalls < b.stalls {
                    b.waited.requests += 1;
                    b.waited.ns += now.saturating_sub(w.since_ns);
                    self.delayed += 1;
                }
                out.push_back((w.request, w.done));
            }
        }
    }

    /// Nanoseconds until some waiting request can be admitted (`u64::MAX`: none waits).
    pub fn wake_ns(&self) -> u64 {
        self.buckets
            .values()
            .map(Bucket::wait_ns)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// No volume has limits: the loop skips the throttle (and its clock read).
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn waiting(&self) -> usize {
        self.buckets.values().map(|b| b.waiting.len()).sum()
    }

    /// Hands back what waits for `volume` (at once, whatever its limits): a resize
    /// or delete must come after the requests sent before it.
    pub fn release_volume(&mut self, volume: VolumeUid, now: u64) -> Vec<(Request, Answer)> {
        let mut out = Vec::new();
        if let Some(b) = self.buckets.get_mut(&volume) {
            drain(b, now, &mut self.delayed, &mut out);
        }
        out
    }

    /// Per volume that had limits: requests waiting now, and what the limits delayed.
    pub fn per_volume(&self) -> impl Iterator<Item = (VolumeUid, usize, Waited)> + '_ {
        self.buckets
            .iter()
            .map(|(uid, b)| (*uid, b.waiting.len(), b.waited))
            .chain(self.past.iter().map(|(uid, w)| (*uid, 0, *w)))
    }

    /// Everything waiting, in no particular order between volumes.
    pub fn take_all(&mut self) -> Vec<(Request, Answer)> {
        self.buckets
            .values_mut()
            .flat_map(|b| b.waiting.drain(..).map(|w| (w.request, w.done)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(uid: u64, len: usize) -> Request {
        Request::Write {
            volume: VolumeUid(uid),
            offset: 0,
            data: vec![0; len],
            fua: false,
        }
    }

    fn limits(iops: u64, bps: u64) -> VolumeLimits {
        VolumeLimits {
            iops_max: iops,
            bytes_per_sec_max: bps,
            ..VolumeLimits::NONE
        }
    }

    /// Admitted requests over `secs` seconds polled every millisecond, holding
    /// `backlog` requests of `len` bytes waiting at all times.
    fn admitted(l: VolumeLimits, len: usize, secs: u64) -> (u64, u64) {
        let mut t = Throttle::default();
        assert!(t.sync([(VolumeUid(1), l)].into_iter(), 0).is_empty());
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut out = VecDeque::new();
        for ms in 0..=secs * 1000 {
            while t.waiting() < 4 {
                assert!(t
                    .hold(write(1, len), Answer::none(), ms * 1_000_000)
                    .is_none());
            }
            t.release(ms * 1_000_000, &mut out);
            for (r, _) in out.drain(..) {
                n += 1;
                bytes += cost_bytes(&r);
            }
        }
        (n, bytes)
    }

    #[test]
    fn the_rate_holds_over_time_whatever_the_request_size() {
        // 500 IOPS for 10 s: 5,000 plus the initial burst of 50.
        let (n, _) = admitted(limits(500, 0), 4096, 10);
        assert!((5000..=5051).contains(&n), "{n}");
        // 1 MiB/s with 256 KiB requests (larger than the 0.1 s bucket): 10 MiB in 10 s,
        // within a request and the burst.
        let (_, bytes) = admitted(limits(0, 1 << 20), 256 << 10, 10);
        let want = 10u64 << 20;
        assert!(
            bytes >= want && bytes <= want + (512 << 10) + (1 << 20) / 10,
            "{bytes}"
        );
        // Both: the tighter one binds (4 KiB at 1 MiB/s is 256/s, under 1,000 IOPS).
        let (n, _) = admitted(limits(1000, 1 << 20), 4096, 4);
        assert!((1024..=1024 + 26 + 1).contains(&n), "{n}");
    }

    #[test]
    fn unlimited_volumes_and_other_requests_pass_and_order_is_kept() {
        let mut t = Throttle::default();
        let _ = t.sync([(VolumeUid(1), limits(10, 0))].into_iter(), 0);
        assert!(t.hold(write(2, 4096), Answer::none(), 0).is_some());
        assert!(t.hold(Request::Flush, Answer::none(), 0).is_some());
        for i in 0..5 {
            let r = Request::Read {
                volume: VolumeUid(1),
                offset: i,
                len: 4096,
            };
            assert!(t.hold(r, Answer::none(), 0).is_none());
        }
        let mut out = VecDeque::new();
        t.release(0, &mut out);
        assert_eq!(out.len(), 1, "a bucket of 10 IOPS holds one request");
        assert!(t.wake_ns() > 0 && t.wake_ns() <= 100_000_000);
        // The bucket holds one request (a tenth of a second): one more every 100 ms,
        // however long the wait was.
        t.release(1_000_000_000, &mut out);
        assert_eq!(out.len(), 2);
        for ms in [1100, 1200, 1300] {
            t.release(ms * 1_000_000, &mut out);
        }
        let offsets: Vec<u64> = out
            .iter()
            .map(|(r, _)| match r {
                Request::Read { offset, .. } => *offset,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(offsets, vec![0, 1, 2, 3, 4]);
        assert_eq!(t.wake_ns(), u64::MAX);
        // Limits removed: what waits is handed back.
        assert!(t
            .hold(write(1, 4096), Answer::none(), 1_000_000_000)
            .is_none());
        assert!(t
            .hold(write(1, 4096), Answer::none(), 1_000_000_000)
            .is_none());
        t.release(1_400_000_000, &mut out);
        let freed = t.sync(std::iter::empty(), 2_000_000_000);
        assert_eq!(freed.len() + t.waiting(), 1);
        assert!(t.buckets.is_empty());
    }

    #[test]
    fn a_volume_change_takes_what_waits_and_counters_never_go_back() {
        let mut t = Throttle::default();
        let uid = VolumeUid(3);
        let _ = t.sync([(uid, limits(10, 0))].into_iter(), 0);
        for _ in 0..5 {
            assert!(t.hold(write(3, 4096), Answer::none(), 0).is_none());
        }
        let mut out = VecDeque::new();
        t.release(0, &mut out);
        assert_eq!(out.len(), 1);
        // A resize or delete of the volume: the 4 waiting go first, counted as delayed.
        let before = t.release_volume(uid, 50_000_000);
        assert_eq!(before.len(), 4);
        let counted = |t: &Throttle| {
            t.per_volume()
                .find(|(u, ..)| *u == uid)
                .map(|(_, waiting, w)| (waiting, w.requests, w.ns))
        };
        assert_eq!(counted(&t), Some((0, 4, 4 * 50_000_000)));
        assert_eq!(t.delayed, 4);
        // Limits removed, then set again: the counters carry on.
        let _ = t.sync([(uid, VolumeLimits::NONE)].into_iter(), 60_000_000);
        assert_eq!(counted(&t), Some((0, 4, 4 * 50_000_000)));
        let _ = t.sync([(uid, limits(10, 0))].into_iter(), 70_000_000);
        assert_eq!(counted(&t), Some((0, 4, 4 * 50_000_000)));
        // The volume deleted: forgotten.
        let _ = t.sync([(uid, VolumeLimits::NONE)].into_iter(), 80_000_000);
        let _ = t.sync(std::iter::empty(), 90_000_000);
        assert_eq!(counted(&t), None);
        assert_eq!(t.delayed, 4);
    }
}
