//! What a caller sees while an open runs: each step starting and finishing, and the
//! long steps (L2P walks, the md scan, replay, the L2P write-back) advancing through
//! their units. The engine only reports; drawing (a bar on a terminal) is the
//! caller's business, so the library has no terminal code.
//!
//! Cost: a step counts its units with an add and a compare, and sends an advance only
//! when the count has moved by 1% of the step's total since the last one (and at the
//! end), so a walk over millions of L2P pages sends about a hundred events.

use super::StepReport;

/// One thing an open reports while it runs (see [`OpenProgress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenEvent<'a> {
    /// Step `index` (0-based) starts. `total` is the number of steps, known once the
    /// journal step has said whether the open replays (`None` before).
    StepStarted {
        index: usize,
        total: Option<usize>,
        name: &'static str,
    },
    /// The running step has done `done` of its `total` units (`unit` names them,
    /// plural: "L2P pages"). The first advance of a step is `0` of `total`; counts
    /// only grow, and the last advance before the step finishes has `done == total`.
    /// Steps made of a few device calls send none.
    StepAdvanced {
        name: &'static str,
        done: u64,
        total: u64,
        unit: &'static str,
    },
    /// Step `index` ended; `step` is what [`super::OpenReport::steps`] records for it
    /// (engine clock duration, bytes read, a short detail).
    StepFinished { index: usize, step: &'a StepReport },
}

/// Receives an open's [`OpenEvent`]s, in order, on the thread running the open. A
/// failing open stops sending at the step that failed (no `StepFinished` for it).
pub trait OpenProgress {
    fn event(&mut self, event: &OpenEvent<'_>);
}

impl<F: FnMut(&OpenEvent<'_>)> OpenProgress for F {
    fn event(&mut self, event: &OpenEvent<'_>) {
        self(event);
    }
}

/// Progress nobody watches ([`crate::Engine::open`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl OpenProgress for NoProgress {
    fn event(&mut self, _: &OpenEvent<'_>) {}
}

/// Counts one step's units and sends [`OpenEvent::StepAdvanced`] at a bounded rate.
pub(crate) struct Meter<'p> {
    /// `None`: counting for nobody (the same loops run outside an open).
    sink: Option<&'p mut dyn OpenProgress>,
    step: &'static str,
    unit: &'static str,
    total: u64,
    done: u64,
    /// The count at which the next advance is sent.
    next: u64,
    /// The count last sent.
    sent: Option<u64>,
}

impl<'p> Meter<'p> {
    pub fn new(sink: &'p mut dyn OpenProgress, step: &'static str, unit: &'static str) -> Self {
        Meter {
            sink: Some(sink),
            step,
            unit,
            total: 0,
            done: 0,
            next: 0,
            sent: None,
        }
    }

    /// A meter that sends nothing.
    pub fn off() -> Meter<'static> {
        Meter {
            sink: None,
            step: "",
            unit: "",
            total: 0,
            done: 0,
            next: u64::MAX,
            sent: None,
        }
    }

    /// The step has `total` units to do; sends `0` of `total`.
    pub fn start(&mut self, total: u64) {
        if self.sink.is_none() {
            return;
        }
        self.total = total;
        self.done = 0;
        self.send();
    }

    /// `n` more units done.
    pub fn add(&mut self, n: u64) {
        self.done += n;
        if self.done >= self.next {
            self.send();
        }
    }

    /// The step's loop ended: sends the final count unless it was the last one sent.
    pub fn finish(&mut self) {
        if self.sink.is_some() && self.sent != Some(self.done) {
            self.send();
        }
    }

    fn send(&mut self) {
        let Some(sink) = self.sink.as_deref_mut() else {
            self.next = u64::MAX;
            return;
        };
        debug_assert!(
            self.done <= self.total,
            "{}: {} of {} {}",
            self.step,
            self.done,
            self.total,
            self.unit
        );
        sink.event(&OpenEvent::StepAdvanced {
            name: self.step,
            done: self.done,
            total: self.total,
            unit: self.unit,
        });
        self.sent = Some(self.done);
        self.next = self.done.saturating_add(self.total.div_ceil(100).max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advances(total: u64, steps: &[u64]) -> Vec<u64> {
        let mut seen = Vec::new();
        let mut sink = |e: &OpenEvent<'_>| {
            if let OpenEvent::StepAdvanced { done, total: t, .. } = *e {
                assert_eq!(t, total);
                seen.push(done);
            }
        };
        let mut m = Meter::new(&mut sink, "census", "L2P pages");
        m.start(total);
        for &n in steps {
            m.add(n);
        }
        m.finish();
        seen
    }

    #[test]
    fn a_meter_sends_about_a_hundred_advances_ending_at_the_total() {
        for total in [101, 150, 199, 1_000_000] {
            let seen = advances(total, &vec![1; total as usize]);
            assert!(seen.len() <= 102, "{total}: {} advances", seen.len());
            assert_eq!(seen.first(), Some(&0));
            assert_eq!(seen.last(), Some(&total));
            assert!(seen.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn small_totals_send_every_unit_and_empty_steps_send_zero_of_zero() {
        assert_eq!(advances(3, &[1, 1, 1]), vec![0, 1, 2, 3]);
        assert_eq!(advances(0, &[]), vec![0]);
        assert_eq!(advances(250, &[100, 150]), vec![0, 100, 250]);
    }

    #[test]
    fn an_off_meter_sends_nothing() {
        let mut m = Meter::off();
        m.start(10);
        m.add(10);
        m.finish();
        assert_eq!(m.sent, None);
    }
}
