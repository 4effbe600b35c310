//! Records shared by the eBPF programs and userspace.
//!
//! Every record starts with an [`EventHeader`]; `kind` tells which record follows. Layouts are
//! `#[repr(C)]` with explicit padding so both sides agree byte for byte.
#![no_std]

/// `CLONE_NEWNET` from `<linux/sched.h>`.
pub const CLONE_NEWNET: u64 = 0x4000_0000;

/// Length of `task_struct.comm`.
pub const COMM_LEN: usize = 16;
/// Length of `net_device.name`.
pub const IFNAME_LEN: usize = 16;
/// Bytes of a netlink message copied from the caller's buffer.
pub const NETLINK_COPY: usize = 256;
/// Bytes of an extack message copied.
pub const EXTACK_LEN: usize = 128;
/// Bytes of an exec'd file name copied.
pub const FILENAME_LEN: usize = 128;
/// Bytes of a mount source / target path copied.
pub const PATH_LEN: usize = 128;

/// `AF_NETLINK`
pub const AF_NETLINK: u16 = 16;
/// `NETLINK_ROUTE`
pub const NETLINK_ROUTE: u16 = 0;
/// `NLMSG_ERROR`
pub const NLMSG_ERROR: u16 = 2;
/// `MS_BIND`
pub const MS_BIND: u64 = 4096;
/// `MSG_PEEK`
pub const MSG_PEEK: u64 = 2;
/// `TC_H_ROOT`: parent of a device's root qdisc.
pub const TC_H_ROOT: u32 = 0xFFFF_FFFF;

/// Kinds of records sent through the `EVENTS` ring buffer.
pub mod kind {
    /// [`super::NetnsCreated`]
    pub const NETNS_CREATED: u32 = 1;
    /// [`super::NetlinkMsg`]: a request written to a NETLINK_ROUTE socket.
    pub const NETLINK_REQUEST: u32 = 2;
    /// [`super::NetlinkMsg`]: an `NLMSG_ERROR` (ACK or errno) read from a NETLINK_ROUTE socket.
    pub const NETLINK_REPLY: u32 = 3;
    /// [`super::Extack`]
    pub const EXTACK: u32 = 4;
    /// [`super::DevEvent`]: a device's root qdisc was created (the device came up).
    pub const DEV_UP: u32 = 5;
    /// [`super::DevEvent`]: a device's root qdisc was destroyed (device or namespace gone).
    pub const DEV_GONE: u32 = 6;
    /// [`super::Exec`]
    pub const EXEC: u32 = 7;
    /// [`super::BindMount`]
    pub const BIND_MOUNT: u32 = 8;
    /// Number of kinds (plus one, kinds start at 1); sizes the per-kind loss counters.
    pub const COUNT: u32 = 9;

    /// A short name for logs and metrics.
    pub fn name(kind: u32) -> &'static str {
        match kind {
            NETNS_CREATED => "netns_created",
            NETLINK_REQUEST => "netlink_request",
            NETLINK_REPLY => "netlink_reply",
            EXTACK => "extack",
            DEV_UP => "dev_up",
            DEV_GONE => "dev_gone",
            EXEC => "exec",
            BIND_MOUNT => "bind_mount",
            _ => "unknown",
        }
    }
}

/// How a network namespace came to be.
pub mod origin {
    /// `unshare(CLONE_NEWNET)`
    pub const UNSHARE: u32 = 1;
    /// `clone`/`clone3` with `CLONE_NEWNET` (seen as the new task is created)
    pub const CLONE: u32 = 2;
}

/// Which syscall a [`NetlinkMsg`] was seen in.
pub mod syscall {
    pub const SENDMSG: u32 = 1;
    pub const SENDTO: u32 = 2;
    pub const RECVMSG: u32 = 3;
    pub const RECVFROM: u32 = 4;
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

/// A network namespace: cookie (identity) and inode (recycled, for matching paths).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetnsId {
    /// `struct net.net_cookie`
    pub cookie: u64,
    /// `struct net.ns.inum`
    pub inum: u32,
    pub _pad: u32,
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

/// The first bytes of a netlink message written to or read from a NETLINK_ROUTE socket.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetlinkMsg {
    pub header: EventHeader,
    /// The calling task's network namespace.
    pub task_netns: NetnsId,
    /// The socket's network namespace (`sock.__sk_common.skc_net`): what a request affects.
    pub sock_netns: NetnsId,
    /// One of [`syscall`].
    pub syscall: u32,
    pub fd: u32,
    /// Bytes in the caller's first buffer (request) or returned by recv (reply).
    pub total_len: u32,
    /// Bytes copied into `data`.
    pub copied: u32,
    pub data: [u8; NETLINK_COPY],
}

/// The kernel's own rejection message (`netlink_extack` tracepoint), in the caller's context.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Extack {
    pub header: EventHeader,
    pub task_netns: NetnsId,
    pub msg: [u8; EXTACK_LEN],
}

/// A device's root qdisc was created (device up) or destroyed (device or namespace gone).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DevEvent {
    pub header: EventHeader,
    /// The device's namespace (`net_device.nd_net`).
    pub netns: NetnsId,
    pub ifindex: u32,
    /// `net_device.flags` (IFF_UP, IFF_LOOPBACK, ...).
    pub dev_flags: u32,
    /// 1 when the namespace's reference count is zero: it is being destroyed.
    pub netns_dying: u32,
    pub _pad: u32,
    pub ifname: [u8; IFNAME_LEN],
    /// `Qdisc_ops.id` (noqueue, pfifo_fast, mq, ...).
    pub qdisc: [u8; 16],
}

/// A binary was executed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Exec {
    pub header: EventHeader,
    pub task_netns: NetnsId,
    pub parent_pid: u32,
    pub _pad: u32,
    pub parent_comm: [u8; COMM_LEN],
    pub filename: [u8; FILENAME_LEN],
}

/// A bind mount was requested (how `ip netns add` and runtimes pin a namespace).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BindMount {
    pub header: EventHeader,
    pub task_netns: NetnsId,
    pub flags: u64,
    pub source: [u8; PATH_LEN],
    pub target: [u8; PATH_LEN],
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all): plain-old-data, `#[repr(C)]`, no padding holes left implicit.
    unsafe impl aya::Pod for super::EventHeader {}
    unsafe impl aya::Pod for super::NetnsCreated {}
    unsafe impl aya::Pod for super::NetlinkMsg {}
    unsafe impl aya::Pod for super::Extack {}
    unsafe impl aya::Pod for super::DevEvent {}
    unsafe impl aya::Pod for super::Exec {}
    unsafe impl aya::Pod for super::BindMount {}
}
