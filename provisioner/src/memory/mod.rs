//! The process's heap: which allocator serves it, and handing freed memory back to the kernel.
//!
//! Built for musl (the release build: a static musl binary execs in a fraction of the time a
//! glibc one does, see docs/benchmarks.md), the binary picks its allocator once, at its first
//! allocation, by what the process is. The CNI plugin mode (CNI_COMMAND set) lives for one
//! request: a bump arena in static storage serves it (no allocator to set up, no memory asked
//! of the kernel, nothing given back), musl's allocator what does not fit. Everything else,
//! the daemon above all, gets musl's allocator, which hands freed memory back to the kernel as
//! it goes: the daemon holds less than with mimalloc and spends more CPU per ADD (both measured
//! in docs/benchmarks.md). Built for glibc (tests, builds without `--target`), glibc's allocator
//! serves every mode.

mod arena;
#[cfg(target_env = "musl")]
mod by_role;

pub use arena::BumpArena;

/// Returns freed heap memory to the kernel after a burst of allocations (parsing the kernel's
/// BTF, a reconciliation reading every link and allocation), so the daemon's resident size
/// reflects what it keeps.
pub fn return_freed_memory() {
    // musl's allocator needs no call: it gives freed pages back as they empty.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
