//! Kernel side of provisioner's kernel watch.
//!
//! One module per observation (namespaces created, unshare and bind mounts, rtnetlink requests
//! and the kernel's answers, its error messages, devices, execs), and in each one program per
//! attach point a kernel may offer: userspace reads the running kernel's BTF and attaches, per
//! observation, the first backend it has (`provisioner/src/trace/kernel/backends.rs`). Every
//! program writes the same records into one ring buffer, so nothing after it knows which
//! backend saw an event.
//!
//! rustc emits no CO-RE relocations, so the struct member offsets this code needs are globals
//! that userspace resolves from the running kernel's BTF and patches in at load time
//! (`offsets.rs`). Programs that every supported kernel (5.10 and later) loads read kernel
//! memory through probe helpers, starting from `bpf_get_current_task` or their arguments; only
//! the programs of attach points that newer kernels alone have use BTF-checked loads and the
//! helpers of those kernels.
#![no_std]
#![no_main]
// rustc's BPF target has no atomic read-modify-write in `core`: the counters' add is the
// intrinsic (and LLVM cannot select an atomic load for BPF's generic CPU: its read is volatile).
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod devices;
mod exec;
mod kernel;
mod mounts;
mod netns;
mod netns_id;
mod offsets;
mod ring;
mod rtnetlink;

/// The event layout this object was built with; userspace refuses an object whose tag differs
/// from its own `provisioner_common::abi_tag()`.
#[unsafe(no_mangle)]
static PROVISIONER_EVENT_ABI: [u8; provisioner_common::ABI_TAG_LEN] = provisioner_common::abi_tag();

/// The hash of the sources this object was built from (see build.rs); provisioner's build
/// refuses an object whose hash is not the tree's.
#[unsafe(no_mangle)]
static PROVISIONER_EBPF_SOURCES: [u8; provisioner_common::ABI_TAG_LEN] = provisioner_common::tag(
    provisioner_common::SOURCES_MARKER,
    env!("PROVISIONER_EBPF_SOURCES").as_bytes(),
);

/// Keeps the tags in the object (the linker drops statics no program reads); called by a
/// program every kernel attaches.
#[inline(always)]
fn keep_tags() {
    // SAFETY: reading a byte of a static.
    let _ = unsafe { core::ptr::read_volatile(&PROVISIONER_EVENT_ABI[0]) };
    // SAFETY: as above.
    let _ = unsafe { core::ptr::read_volatile(&PROVISIONER_EBPF_SOURCES[0]) };
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
