//! Records shared by the eBPF programs and userspace.
//!
//! Every record starts with an [`EventHeader`]; `kind` tells which record follows. Layouts are
//! `#[repr(C)]` with explicit padding so both sides agree byte for byte.
#![no_std]

/// `CLONE_NEWNET` from `<linux/sched.h>`.
pub const CLONE_NEWNET: u64 = 0x4000_0000;

/// Length of `task_struct.comm`.
pub const COMM_LEN: usize = 16;

/// Kinds of records sent through the `EVENTS` ring buffer.
pub mod kind {
    /// [`super::NetnsCreated`]
    pub const NETNS_CREATED: u32 = 1;
    /// Number of kinds; sizes the per-kind loss counters.
    pub const COUNT: u32 = 8;
}

/// How a network namespace came to be.
pub mod origin {
    /// `unshare(CLONE_NEWNET)`
    pub const UNSHARE: u32 = 1;
    /// `clone`/`clone3` with `CLONE_NEWNET` (seen as the new task is created)
    pub const CLONE: u32 = 2;
}

/// Common start of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventHeader {
    pub kind: u32,
    /// Process id (tgid) of the task that caused the event.
    pub pid: u32,
    /// Thread id of that task.
    pub tid: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// cgroup v2 id of the task.
    pub cgroup_id: u64,
    pub comm: [u8; COMM_LEN],
}

/// A new network namespace exists.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetnsCreated {
    pub header: EventHeader,
    /// `struct net.net_cookie`: stable identity (inode numbers are recycled).
    pub netns_cookie: u64,
    /// `struct net.ns.inum`
    pub netns_inum: u32,
    /// One of [`origin`].
    pub origin: u32,
    /// Flags passed to unshare/clone.
    pub flags: u64,
    /// Pid (tgid) of the new task for [`origin::CLONE`], else the caller's.
    pub owner_pid: u32,
    /// Pid (tgid) of the caller's parent.
    pub parent_pid: u32,
    pub parent_comm: [u8; COMM_LEN],
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain-old-data, `#[repr(C)]`, no padding holes left implicit.
    unsafe impl aya::Pod for super::EventHeader {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NetnsCreated {}
}
