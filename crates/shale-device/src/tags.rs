//! What the zoned wrappers (zone emulation, a kernel zoned drive, a concatenation)
//! keep of the requests they pass to the devices below them.

use std::collections::VecDeque;

/// Requests in flight, each under the tag given to the device below: a slot index,
/// reused once the request completes.
#[derive(Debug)]
pub(crate) struct Tags<T> {
    slots: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Tags<T> {
    pub fn new() -> Tags<T> {
        Tags {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Keeps `value`; returns its tag.
    pub fn insert(&mut self, value: T) -> u64 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(value);
                i as u64
            }
            None => {
                self.slots.push(Some(value));
                (self.slots.len() - 1) as u64
            }
        }
    }

    pub fn get_mut(&mut self, tag: u64) -> Option<&mut T> {
        self.slots.get_mut(tag as usize).and_then(Option::as_mut)
    }

    /// The value under `tag`, whose slot is then free; `None` for a tag not in use.
    pub fn take(&mut self, tag: u64) -> Option<T> {
        let value = self.slots.get_mut(tag as usize).and_then(Option::take)?;
        self.free.push(tag as usize);
        Some(value)
    }
}

/// Marks `key` done in a queue of `(key, done)` sorted by key (submission order),
/// and drops the done entries at its front: the front is then the oldest request
/// not yet complete.
pub(crate) fn mark_done(q: &mut VecDeque<(u64, bool)>, key: u64) {
    let i = q.partition_point(|&(k, _)| k < key);
    match q.get_mut(i) {
        Some(e) if e.0 == key => e.1 = true,
        _ => panic!("completion for untracked request {key}"),
    }
    while q.front().is_some_and(|&(_, done)| done) {
        q.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_reused_after_take() {
        let mut t = Tags::new();
        let a = t.insert("a");
        let b = t.insert("b");
        assert_ne!(a, b);
        assert_eq!(t.take(a), Some("a"));
        assert_eq!(t.take(a), None);
        assert_eq!(t.insert("c"), a);
        *t.get_mut(b).expect("b") = "B";
        assert_eq!(t.take(b), Some("B"));
        assert_eq!(t.take(99), None);
    }

    #[test]
    fn the_front_is_the_oldest_not_done() {
        let mut q: VecDeque<(u64, bool)> = [(1, false), (2, false), (3, false)].into();
        mark_done(&mut q, 2);
        assert_eq!(q.front(), Some(&(1, false)));
        mark_done(&mut q, 1);
        assert_eq!(q.front(), Some(&(3, false)));
        mark_done(&mut q, 3);
        assert!(q.is_empty());
    }
}
