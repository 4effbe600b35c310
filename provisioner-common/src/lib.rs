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
/// Bytes of an exec'd CNI plugin's environment copied (its end: libcni appends the `CNI_*`
/// variables after the runtime's own environment).
pub const ENV_COPY: usize = 4096;

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
    /// [`super::ExecEnv`]
    pub const EXEC_ENV: u32 = 9;
    /// Number of kinds (plus one, kinds start at 1); sizes the per-kind loss counters.
    pub const COUNT: u32 = 10;

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
            EXEC_ENV => "exec_env",
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
    /// A request's answer, found queued on the socket when the send returned (the kernel
    /// processes an rtnetlink request within the send): 0 (ACK) or a negative errno. Only
    /// for a request of one message whose answer was the last one queued.
    pub answer: i32,
    /// 1 when `answer` holds the answer.
    pub answered: u32,
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

/// The environment of a binary executed by a container runtime or from a CNI plugin
/// directory (where a CNI plugin gets its `CNI_*` variables), sent after its [`Exec`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEnv {
    pub header: EventHeader,
    pub parent_pid: u32,
    /// Bytes of the whole environment (`mm->env_end - mm->env_start`).
    pub env_len: u32,
    /// Bytes copied into `env`: the last `copied` bytes of the environment.
    pub copied: u32,
    /// The real uid of the process (in the initial user namespace).
    pub uid: u32,
    pub parent_comm: [u8; COMM_LEN],
    /// NUL-separated `KEY=VALUE` entries; the first one is cut when `copied < env_len`.
    pub env: [u8; ENV_COPY],
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

// The layouts both sides rely on; a change here must change `ABI_VERSION` or the layout hash
// (it does: the hash covers every size and the offsets below).
const _: () = {
    assert!(core::mem::size_of::<EventHeader>() == 48);
    assert!(core::mem::size_of::<NetnsId>() == 16);
    assert!(core::mem::size_of::<NetnsCreated>() == 96);
    assert!(core::mem::size_of::<NetlinkMsg>() == 360);
    assert!(core::mem::size_of::<Extack>() == 192);
    assert!(core::mem::size_of::<DevEvent>() == 112);
    assert!(core::mem::size_of::<Exec>() == 216);
    assert!(core::mem::size_of::<BindMount>() == 328);
    assert!(core::mem::size_of::<ExecEnv>() == 80 + ENV_COPY);
};

/// Bumped by hand for changes the layout hash cannot see (a field's meaning, a kind's number).
pub const ABI_VERSION: u32 = 4;

/// FNV-1a over `bytes`, continuing from `hash`.
pub const fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// FNV-1a's starting value.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// A hash of the record layouts: `ABI_VERSION`, every record's size and the offsets of the
/// fields after the header.
pub const fn layout_hash() -> u64 {
    use core::mem::{offset_of, size_of};
    let values: [usize; 30] = [
        ABI_VERSION as usize,
        size_of::<EventHeader>(),
        offset_of!(EventHeader, ts_ns),
        offset_of!(EventHeader, comm),
        size_of::<NetnsId>(),
        size_of::<NetnsCreated>(),
        offset_of!(NetnsCreated, netns_cookie),
        offset_of!(NetnsCreated, flags),
        offset_of!(NetnsCreated, parent_comm),
        size_of::<NetlinkMsg>(),
        offset_of!(NetlinkMsg, sock_netns),
        offset_of!(NetlinkMsg, answer),
        offset_of!(NetlinkMsg, data),
        size_of::<Extack>(),
        offset_of!(Extack, msg),
        size_of::<DevEvent>(),
        offset_of!(DevEvent, ifname),
        offset_of!(DevEvent, qdisc),
        size_of::<Exec>(),
        offset_of!(Exec, filename),
        size_of::<BindMount>(),
        offset_of!(BindMount, source),
        offset_of!(BindMount, target),
        kind::COUNT as usize,
        NETLINK_COPY,
        size_of::<ExecEnv>(),
        offset_of!(ExecEnv, copied),
        offset_of!(ExecEnv, uid),
        offset_of!(ExecEnv, parent_comm),
        offset_of!(ExecEnv, env),
    ];
    let mut hash = FNV_OFFSET;
    let mut i = 0;
    while i < values.len() {
        hash = fnv1a(hash, &(values[i] as u64).to_le_bytes());
        i += 1;
    }
    hash
}

/// What precedes the hash in [`abi_tag`].
pub const ABI_MARKER: &[u8; 16] = b"provisioner-abi:";
/// Length of [`abi_tag`]: the marker and 16 hex digits.
pub const ABI_TAG_LEN: usize = ABI_MARKER.len() + 16;

/// `provisioner-abi:<layout hash in hex>`: the eBPF object carries it, userspace compares it
/// with its own before loading.
pub const fn abi_tag() -> [u8; ABI_TAG_LEN] {
    let mut hex = [0u8; 16];
    let hash = layout_hash();
    let mut d = 0;
    while d < 16 {
        let nibble = ((hash >> (60 - 4 * d)) & 0xf) as u8;
        hex[d] = if nibble < 10 {
            b'0' + nibble
        } else {
            b'a' + nibble - 10
        };
        d += 1;
    }
    tag(ABI_MARKER, &hex)
}

/// What precedes the sources hash in the object's sources tag.
pub const SOURCES_MARKER: &[u8; 16] = b"provisioner-src:";

/// `marker` followed by the first 16 bytes of `hex` (zero-padded).
pub const fn tag(marker: &[u8; 16], hex: &[u8]) -> [u8; ABI_TAG_LEN] {
    let mut tag = [0u8; ABI_TAG_LEN];
    let mut i = 0;
    while i < marker.len() {
        tag[i] = marker[i];
        i += 1;
    }
    let mut d = 0;
    while d < 16 && d < hex.len() {
        tag[marker.len() + d] = hex[d];
        d += 1;
    }
    tag
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all): plain-old-data, `#[repr(C)]`, no padding holes left implicit.
    unsafe impl aya::Pod for super::EventHeader {}
    unsafe impl aya::Pod for super::NetnsId {}
    unsafe impl aya::Pod for super::NetnsCreated {}
    unsafe impl aya::Pod for super::NetlinkMsg {}
    unsafe impl aya::Pod for super::Extack {}
    unsafe impl aya::Pod for super::DevEvent {}
    unsafe impl aya::Pod for super::Exec {}
    unsafe impl aya::Pod for super::BindMount {}
    unsafe impl aya::Pod for super::ExecEnv {}
}
