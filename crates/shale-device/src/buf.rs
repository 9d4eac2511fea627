//! Aligned I/O buffers.
//!
//! O_DIRECT needs buffers aligned to the device's logical block size; we align
//! every buffer to 4096 so one type serves every device. Ownership of an `IoBuf`
//! passes to the device on submit and comes back in the completion, so the kernel
//! never sees a buffer that safe code can touch.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`IoBuf`].
pub const IO_ALIGN: usize = 4096;

/// A zero-initialised, 4096-aligned, fixed-length byte buffer.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: IoBuf uniquely owns its allocation (like Vec<u8>); no interior sharing.
unsafe impl Send for IoBuf {}
// SAFETY: shared references only permit reads of the owned bytes.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zeroed buffer of `len` bytes. `len` may be zero.
    pub fn zeroed(len: usize) -> IoBuf {
        if len == 0 {
            return IoBuf {
                ptr: NonNull::dangling(),
                len: 0,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size (len > 0) and a valid power-of-two alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        IoBuf { ptr, len }
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
        if self.len != 0 {
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
}
