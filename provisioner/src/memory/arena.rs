//! A bump arena for a process that lives for one request (the CNI plugin mode): allocating is
//! an addition, freeing the latest block takes it back, freeing any other does nothing, and
//! nothing asks the kernel for memory until the arena is full. What does not fit is left to the
//! caller (the system allocator).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `SIZE` bytes of static storage (zero-filled `.bss`: the kernel maps a page when it is first
/// touched) and how much of it is handed out.
#[repr(C, align(4096))]
pub struct BumpArena<const SIZE: usize> {
    bytes: UnsafeCell<[u8; SIZE]>,
    used: AtomicUsize,
}

// SAFETY: every block handed out is a distinct range, claimed by a compare-and-swap on `used`.
unsafe impl<const SIZE: usize> Sync for BumpArena<SIZE> {}

impl<const SIZE: usize> Default for BumpArena<SIZE> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const SIZE: usize> BumpArena<SIZE> {
    pub const fn new() -> Self {
        Self {
            bytes: UnsafeCell::new([0; SIZE]),
            used: AtomicUsize::new(0),
        }
    }

    fn base(&self) -> usize {
        self.bytes.get() as usize
    }

    /// Was `ptr` handed out by this arena?
    pub fn owns(&self, ptr: *const u8) -> bool {
        let at = ptr as usize;
        at >= self.base() && at < self.base() + SIZE
    }

    /// A block of `size` bytes aligned to `align` (a power of two), or None when it does not fit.
    pub fn alloc(&self, size: usize, align: usize) -> Option<*mut u8> {
        let base = self.base();
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let start = (base + used).checked_next_multiple_of(align)? - base;
            let end = start.checked_add(size).filter(|&end| end <= SIZE)?;
            match self
                .used
                .compare_exchange_weak(used, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some((base + start) as *mut u8),
                Err(now) => used = now,
            }
        }
    }

    /// Takes back the block at `ptr` of `size` bytes if it is the latest one; others stay used
    /// until the process ends.
    pub fn free(&self, ptr: *mut u8, size: usize) {
        let start = ptr as usize - self.base();
        let _ =
            self.used
                .compare_exchange(start + size, start, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Grows or shrinks the block at `ptr` (of `size` bytes) where it lies: possible when it is
    /// the latest block, and always when it shrinks.
    pub fn resize_in_place(&self, ptr: *mut u8, size: usize, new_size: usize) -> bool {
        let start = ptr as usize - self.base();
        if new_size <= size {
            let _ = self.used.compare_exchange(
                start + size,
                start + new_size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return true;
        }
        start + new_size <= SIZE
            && self
                .used
                .compare_exchange(
                    start + size,
                    start + new_size,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Bytes handed out and not taken back.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_distinct_and_inside() {
        let arena = Box::new(BumpArena::<4096>::new());
        let a = arena.alloc(3, 1).expect("a");
        let b = arena.alloc(8, 8).expect("b");
        let c = arena.alloc(64, 64).expect("c");
        assert_eq!(b as usize % 8, 0);
        assert_eq!(c as usize % 64, 0);
        assert!(a < b && (a as usize) + 3 <= b as usize);
        assert!((b as usize) + 8 <= c as usize);
        assert!(arena.owns(a) && arena.owns(c));
        assert!(!arena.owns(std::ptr::null()));
    }

    #[test]
    fn a_block_that_does_not_fit_is_refused_and_the_arena_keeps_serving() {
        let arena = Box::new(BumpArena::<4096>::new());
        let a = arena.alloc(4000, 8).expect("a");
        assert_eq!(arena.alloc(200, 8), None);
        assert_eq!(arena.alloc(usize::MAX, 1), None);
        let b = arena.alloc(64, 8).expect("what still fits is served");
        assert!(b as usize >= a as usize + 4000);
    }

    #[test]
    fn freeing_the_latest_block_takes_it_back_and_others_stay_used() {
        let arena = Box::new(BumpArena::<4096>::new());
        let a = arena.alloc(100, 8).expect("a");
        let b = arena.alloc(100, 8).expect("b");
        arena.free(a, 100);
        assert_eq!(
            arena.used(),
            b as usize - a as usize + 100,
            "not the latest: kept"
        );
        arena.free(b, 100);
        assert_eq!(arena.alloc(100, 8), Some(b), "the latest: reused");
    }

    #[test]
    fn the_latest_block_grows_in_place_others_do_not() {
        let arena = Box::new(BumpArena::<4096>::new());
        let a = arena.alloc(100, 8).expect("a");
        assert!(arena.resize_in_place(a, 100, 1000));
        let b = arena.alloc(8, 8).expect("b");
        assert!(
            b as usize >= a as usize + 1000,
            "the grown block is not handed out again"
        );
        assert!(
            !arena.resize_in_place(a, 1000, 2000),
            "no longer the latest"
        );
        assert!(arena.resize_in_place(a, 1000, 10), "shrinking always fits");
        assert!(!arena.resize_in_place(b, 8, 8192), "past the end");
    }
}
