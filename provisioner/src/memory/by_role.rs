//! The global allocator of the musl build: the plugin's arena or mimalloc, chosen once.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use mimalloc::MiMalloc;

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
        // mimalloc asks for transparent huge pages on its arenas: a 2 MiB page resident for
        // every few KiB in use (the daemon held 46 instead of 23 MiB with 100 sandboxes).
        // SAFETY: PR_SET_THP_DISABLE only changes how this process's later faults are served.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        // Pages emptied go back to the kernel after PURGE_DELAY_MS rather than a second later:
        // the daemon is mostly idle, and a delayed purge only runs at its next allocations, so
        // after a restart it held 2-3 MiB of freed start-up memory for good (the kernel
        // watch's tick allocates every 100 ms: a short delay is served). Not at once either:
        // the kernel watch frees each drain's events every 20 ms, and pages purged at once
        // were faulted in again at the next drain, each purge a TLB flush on every CPU the
        // daemon runs on (a quarter of the watch thread's time at 1000 sandboxes).
        // SAFETY: sets an option before mimalloc is set up; allocates nothing.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
        // Built without its constructor (.cargo/config.toml), mimalloc would stay in its
        // "preloading" state for good: no arena ever reserved, every 64 KiB page of the heap
        // mapped from the kernel and unmapped again as soon as it empties (an unmap interrupts
        // every CPU the daemon runs on, to flush its TLB; about one per ADD).
        // SAFETY: mimalloc's process set-up, which its constructor would have run before main;
        // called once, before mimalloc's first allocation, from the only thread there is yet.
        unsafe { _mi_auto_process_init() };
    }
    ROLE.store(role, Ordering::Relaxed);
    role
}

/// mimalloc v3's `mi_option_purge_delay` (include/mimalloc.h; libmimalloc-sys names it only for
/// v2).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long an emptied page stays with the daemon before it goes back to the kernel: longer
/// than the kernel watch's drain period (20 ms), so that each drain reuses the last one's.
const PURGE_DELAY_MS: std::ffi::c_long = 200;

unsafe extern "C" {
    /// mimalloc's process initialisation (`src/init.c`), what its constructor calls.
    fn _mi_auto_process_init();
}

pub struct ByRole;

#[global_allocator]
static HEAP: ByRole = ByRole;

// SAFETY: each block is served and taken back by one allocator: mimalloc for the whole life of
// a long-lived process; in a plugin, the arena for what lies in it and musl's for the rest.
unsafe impl GlobalAlloc for ByRole {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if role() == LONG_LIVED {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { MiMalloc.alloc(layout) };
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
            return unsafe { MiMalloc.alloc_zeroed(layout) };
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
        if role() == LONG_LIVED {
            // SAFETY: the block came from mimalloc, with this layout.
            unsafe { MiMalloc.dealloc(ptr, layout) }
        } else if PLUGIN_ARENA.owns(ptr) {
            PLUGIN_ARENA.free(ptr, layout.size());
        } else {
            // SAFETY: the block came from the system allocator, with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if role() == LONG_LIVED {
            // SAFETY: the block came from mimalloc; forwarded with the caller's guarantees.
            return unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        }
        if !PLUGIN_ARENA.owns(ptr) {
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

pub fn return_freed_memory() {
    if role() == LONG_LIVED {
        // SAFETY: mi_collect only hands mimalloc's unused memory back to the kernel.
        unsafe { libmimalloc_sys::mi_collect(true) };
    }
}
