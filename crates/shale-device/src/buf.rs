//! Aligned I/O buffers.
//!
//! O_DIRECT needs buffers aligned to the device's logical block size; we align
//! every buffer to 4096 so one type serves every device. Ownership of an `IoBuf`
//! passes to the device on submit and comes back in the completion, so the kernel
//! never sees a buffer that safe code can touch.
//!
//! A buffer can be split into parts that share its allocation ([`IoBuf::split`]) and
//! the parts joined back ([`IoBuf::join`]): an array hands each member its slice of
//! one stripe buffer without copying it. Parts cover disjoint ranges, so each still
//! owns its bytes alone; the allocation is freed when the last part goes.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every [`IoBuf`].
pub const IO_ALIGN: usize = 4096;

/// A zero-initialised, 4096-aligned, fixed-length byte buffer.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// `None`: this buffer owns its allocation (of `layout(len)`). `Some`: it is a
    /// part of a split allocation, which the last part to go frees.
    shared: Option<Arc<Allocation>>,
}

// SAFETY: IoBuf uniquely owns its bytes (like Vec<u8>): a whole allocation, or a part
// of one whose range no other part covers; the shared allocation is only freed.
unsafe impl Send for IoBuf {}
// SAFETY: shared references only permit reads of the owned bytes.
unsafe impl Sync for IoBuf {}

/// An allocation split among several [`IoBuf`]s; freed when dropped.
struct Allocation {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the allocation is plain memory; its parts' bytes are reached only through
// the parts, and dropping it only frees it.
unsafe impl Send for Allocation {}
// SAFETY: as above: `&Allocation` gives access to nothing but its address.
unsafe impl Sync for Allocation {}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: allocated by `IoBuf::zeroed` with this layout; freed once, here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), IoBuf::layout(self.len)) }
    }
}

impl IoBuf {
    /// A zeroed buffer of `len` bytes. `len` may be zero.
    pub fn zeroed(len: usize) -> IoBuf {
        if len == 0 {
            return IoBuf {
                ptr: NonNull::dangling(),
                len: 0,
                shared: None,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size (len > 0) and a valid power-of-two alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        IoBuf {
            ptr,
            len,
            shared: None,
        }
    }

    /// Splits the buffer into consecutive parts of `lens` bytes (each a multiple of
    /// [`IO_ALIGN`], so every part stays aligned, adding up to `len()`), sharing its
    /// allocation. Gives the buffer back unchanged if the lengths do not fit.
    pub fn split(self, lens: &[usize]) -> Result<Vec<IoBuf>, IoBuf> {
        let fits = lens.iter().all(|&l| l > 0 && l.is_multiple_of(IO_ALIGN))
            && lens.iter().sum::<usize>() == self.len;
        if !fits {
            return Err(self);
        }
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so its fields are moved out exactly once.
        let shared = unsafe { std::ptr::read(&me.shared) };
        let alloc = shared.unwrap_or_else(|| {
            Arc::new(Allocation {
                ptr: me.ptr,
                len: me.len,
            })
        });
        let mut at = 0;
        Ok(lens
            .iter()
            .map(|&l| {
                // SAFETY: `at + l <= me.len`, so the part lies inside this buffer's
                // range, and the parts' ranges are disjoint.
                let ptr = unsafe { NonNull::new_unchecked(me.ptr.as_ptr().add(at)) };
                at += l;
                IoBuf {
                    ptr,
                    len: l,
                    shared: Some(Arc::clone(&alloc)),
                }
            })
            .collect())
    }

    /// Joins the parts of one [`split`](IoBuf::split) allocation back into the whole
    /// buffer, if `parts` are all of them, in order. Otherwise gives them back.
    pub fn join(parts: Vec<IoBuf>) -> Result<IoBuf, Vec<IoBuf>> {
        let whole = match parts.first().and_then(|p| p.shared.as_ref()) {
            Some(a) => {
                let mut at = a.ptr.as_ptr() as usize;
                let contiguous = parts.iter().all(|p| {
                    let same = p.shared.as_ref().is_some_and(|b| Arc::ptr_eq(a, b));
                    let here = p.ptr.as_ptr() as usize == at;
                    at += p.len;
                    same && here
                });
                contiguous
                    && at == a.ptr.as_ptr() as usize + a.len
                    && Arc::strong_count(a) == parts.len()
            }
            None => false,
        };
        if !whole {
            return Err(parts);
        }
        let mut alloc = None;
        for mut p in parts {
            alloc = p.shared.take();
            p.len = 0; // dropped as an empty buffer: frees nothing
        }
        let Some(alloc) = alloc.and_then(|a| Arc::try_unwrap(a).ok()) else {
            unreachable!("the parts held every reference")
        };
        let alloc = std::mem::ManuallyDrop::new(alloc);
        Ok(IoBuf {
            ptr: alloc.ptr,
            len: alloc.len,
            shared: None,
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }

    fn layout(len: usize) -> Layout {
        // Lengths come from callers' I/O sizes; a length that overflows isize is a bug.
        Layout::from_size_align(len, IO_ALIGN).expect("IoBuf length overflows a Layout")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer for handing to the kernel; valid for `len()` bytes while `self` lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Raw mutable pointer for handing to the kernel; valid for `len()` bytes.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (zeroed at allocation) or
        // dangling with len 0, which from_raw_parts permits.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        // A part of a split allocation frees nothing itself (its `Arc` does, last).
        if self.len != 0 && self.shared.is_none() {
            // SAFETY: allocated in `zeroed` with exactly this layout and not freed before.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> IoBuf {
        IoBuf::from_slice(self)
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf").field("len", &self.len).finish()
    }
}

impl PartialEq for IoBuf {
    fn eq(&self, other: &IoBuf) -> bool {
        **self == **other
    }
}
impl Eq for IoBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0usize, 1, 512, 4096, 65536 + 512] {
            let b = IoBuf::zeroed(len);
            assert_eq!(b.len(), len);
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
            }
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn copy_roundtrip() {
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        let b = IoBuf::from_slice(&data);
        assert_eq!(&b[..], &data[..]);
        assert_eq!(b.clone(), b);
    }

    #[test]
    fn split_parts_share_the_allocation_and_join_back() {
        let data: Vec<u8> = (0..5 * 4096u32).map(|i| (i * 13) as u8).collect();
        let b = IoBuf::from_slice(&data);
        let base = b.as_ptr() as usize;
        let mut parts = b.split(&[4096, 8192, 8192]).expect("split");
        assert_eq!(parts[1].as_ptr() as usize, base + 4096);
        assert!(parts
            .iter()
            .all(|p| (p.as_ptr() as usize).is_multiple_of(IO_ALIGN)));
        assert_eq!(&parts[2][..], &data[3 * 4096..]);
        parts[0][..4].copy_from_slice(b"part");
        let whole = IoBuf::join(parts).expect("join");
        assert_eq!(whole.as_ptr() as usize, base);
        assert_eq!(&whole[..4], b"part");
        assert_eq!(&whole[4..], &data[4..]);
        // A part split again, and parts dropped in any order, free nothing twice.
        let mut parts = whole.split(&[8192, 12288]).expect("split");
        let sub = parts
            .pop()
            .expect("part")
            .split(&[4096, 8192])
            .expect("split");
        drop(parts);
        assert_eq!(sub.len(), 2);
    }

    #[test]
    fn what_does_not_fit_is_given_back() {
        let b = IoBuf::zeroed(8192);
        let b = b.split(&[4096]).expect_err("short");
        let b = b.split(&[4096, 100, 3996]).expect_err("unaligned");
        let mut parts = b.split(&[4096, 4096]).expect("split");
        // Out of order, or not all of them: not joined.
        parts.reverse();
        let mut parts = IoBuf::join(parts).expect_err("order");
        parts.reverse();
        let last = parts.pop().expect("part");
        let parts = IoBuf::join(parts).expect_err("missing");
        assert_eq!(parts.len(), 1);
        drop(last);
        assert!(IoBuf::join(vec![IoBuf::zeroed(4096)]).is_err());
    }
}
