//! Completion order of user-write runs: the completed-ASN watermark.

use std::collections::VecDeque;

#[derive(Debug, Default)]
pub(crate) struct Runs {
    /// (asn_start, asn_end, done) in submission (= ASN) order.
    runs: VecDeque<(u64, u64, bool)>,
    base_seq: u64,
    /// Blocks with ASN below this have been submitted.
    pub submitted_end: u64,
}

impl Runs {
    /// Records a submitted run; returns its sequence number.
    pub fn push(&mut self, start: u64, end: u64) -> u64 {
        debug_assert_eq!(start, self.submitted_end);
        self.submitted_end = end;
        self.runs.push_back((start, end, false));
        self.base_seq + self.runs.len() as u64 - 1
    }

    pub fn complete(&mut self, seq: u64) {
        let i = (seq - self.base_seq) as usize;
        if let Some(r) = self.runs.get_mut(i) {
            r.2 = true;
        }
        while self.runs.front().is_some_and(|r| r.2) {
            self.runs.pop_front();
            self.base_seq += 1;
        }
    }

    /// Every block with ASN below this is written.
    pub fn watermark(&self) -> u64 {
        self.runs.front().map_or(self.submitted_end, |r| r.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_waits_for_the_oldest_run() {
        let mut r = Runs::default();
        let a = r.push(0, 3);
        let b = r.push(3, 5);
        assert_eq!(r.watermark(), 0);
        r.complete(b);
        assert_eq!(r.watermark(), 0);
        r.complete(a);
        assert_eq!(r.watermark(), 5);
    }
}
