//! The ring buffer every record goes through, the counters of what could not be sent, and the
//! header every record starts with.

use core::intrinsics::AtomicOrdering;

use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
};
use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, PerCpuArray, RingBuf};
use provisioner_common::{COMM_LEN, EventHeader, kind};

#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Records that could not be reserved in `EVENTS`, per kind.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Events not sent because the netns of the task they are about could not be read, per kind.
#[map]
static NETNS_UNREADABLE: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// `bpf_ringbuf_submit` flags and `bpf_ringbuf_query` selector (`<linux/bpf.h>`).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
/// Unread bytes in `EVENTS` from which a record wakes the reader up. Below it, records do not
/// wake it (each wakeup is an IPI and a context switch in the daemon, per record); the reader
/// drains the buffer on a short timer instead.
const WAKEUP_BYTES: u64 = 256 * 1024;

/// The flags a record is submitted with (see [`WAKEUP_BYTES`]).
#[inline(always)]
pub(crate) fn wakeup_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// A record of `kind` could not be reserved.
#[inline(always)]
pub(crate) fn count_lost(kind: u32) {
    count(&LOST, kind);
}

/// A record of `kind` was not sent: the namespace it is about could not be read.
#[inline(always)]
pub(crate) fn count_unreadable(kind: u32) {
    count(&NETNS_UNREADABLE, kind);
}

#[inline(always)]
fn count(counters: &PerCpuArray<u64>, kind: u32) {
    if let Some(counter) = counters.get_ptr_mut(kind) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *counter += 1 };
    }
}

/// Adds `delta` (wrapping: `u64::MAX` takes one away) to the count in the one-slot array
/// `entries`: how many entries a hash map of calls in flight holds.
#[inline(always)]
pub(crate) fn count_entries(entries: &Array<u64>, delta: u64) {
    if let Some(entries) = entries.get_ptr_mut(0) {
        // SAFETY: an array map's value, valid while the program runs; written atomically, as
        // other CPUs update it too.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(entries, delta)
        };
    }
}

/// Whether the count in `entries` is not 0. While it is 0, nearly always, a program skips the
/// lookup of the current task in the map it counts: a hash lookup on a hot path of the node.
/// A task's own entry was counted before its call returned (a task that moved to another CPU
/// since went through the scheduler's barriers).
#[inline(always)]
pub(crate) fn has_entries(entries: &Array<u64>) -> bool {
    entries.get_ptr_mut(0).is_none_or(|entries| {
        // SAFETY: an array map's value, valid while the program runs; an aligned 8-byte load
        // is a single instruction on BPF (an atomic load does not compile for the generic CPU).
        (unsafe { core::ptr::read_volatile(entries) }) != 0
    })
}

/// Fills the header of a record of `kind` about the current task.
#[inline(always)]
pub(crate) fn fill_header(header: &mut EventHeader, kind: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    header.kind = kind;
    header.pid = (pid_tgid >> 32) as u32;
    header.tid = pid_tgid as u32;
    header._pad = 0;
    // SAFETY: helpers without preconditions.
    header.ts_ns = unsafe { bpf_ktime_get_ns() };
    header.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    header.comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
}
