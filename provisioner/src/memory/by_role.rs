//! The global allocator of the musl build: the plugin's arena, or musl's own allocator, chosen
//! once.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use super::BumpArena;

const UNDECIDED: u8 = 0;
const PLUGIN: u8 = 1;
const LONG_LIVED: u8 = 2;

static ROLE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Room for the largest network config a plugin accepts (cni::MAX_STDIN) and its parsing;
/// untouched pages cost nothing.
const PLUGIN_ARENA_SIZE: usize = 4 << 20;
static PLUGIN_ARENA: BumpArena<PLUGIN_ARENA_SIZE> = BumpArena::new();

/// Decided before the first allocation and never changed, so every block is freed by the
/// allocator that made it.
fn role() -> u8 {
    let role = ROLE.load(Ordering::Relaxed);
    if role != UNDECIDED {
        return role;
    }
    // SAFETY: getenv reads the environment the C runtime set up before main, and allocates
    // nothing. Threads racing here before the first allocation all read the same answer.
    let plugin = unsafe { !libc::getenv(c"CNI_COMMAND".as_ptr()).is_null() };
    let role = if plugin { PLUGIN } else { LONG_LIVED };
    if role == LONG_LIVED {
        // A transparent huge page makes 2 MiB resident for the few KiB a fresh heap region
        // holds; the daemon's memory in docs/benchmarks.md is measured without them.
        // SAFETY: PR_SET_THP_DISABLE only changes how this process's later faults are served.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
    ROLE.store(role, Ordering::Relaxed);
    role
}

pub struct ByRole;

#[global_allocator]
static HEAP: ByRole = ByRole;

// SAFETY: each block is served and taken back by one allocator: musl's for the whole life of a
// long-lived process; in a plugin, the arena for what lies in it and musl's for the rest.
unsafe impl GlobalAlloc for ByRole {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if role() == LONG_LIVED {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc(layout) };
        }
        match PLUGIN_ARENA.alloc(layout.size(), layout.align()) {
            Some(block) => block,
            // SAFETY: forwarded with the caller's guarantees.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if role() == LONG_LIVED {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc_zeroed(layout) };
        }
        match PLUGIN_ARENA.alloc(layout.size(), layout.align()) {
            Some(block) => {
                // An arena block may be one freed and handed out again.
                // SAFETY: `block` is `layout.size()` writable bytes.
                unsafe { block.write_bytes(0, layout.size()) };
                block
            }
            // SAFETY: forwarded with the caller's guarantees.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if role() == LONG_LIVED || !PLUGIN_ARENA.owns(ptr) {
            // SAFETY: the block came from the system allocator, with this layout.
            unsafe { System.dealloc(ptr, layout) }
        } else {
            PLUGIN_ARENA.free(ptr, layout.size());
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if role() == LONG_LIVED || !PLUGIN_ARENA.owns(ptr) {
            // SAFETY: the block came from the system allocator; forwarded as given.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if PLUGIN_ARENA.resize_in_place(ptr, layout.size(), new_size) {
            return ptr;
        }
        // SAFETY: the caller guarantees new_size, rounded to the alignment, does not overflow.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a non-zero size (the caller's guarantee).
        let moved = unsafe { self.alloc(new_layout) };
        if !moved.is_null() {
            // SAFETY: both blocks are valid for the smaller size and distinct.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
            }
            PLUGIN_ARENA.free(ptr, layout.size());
        }
        moved
    }
}
