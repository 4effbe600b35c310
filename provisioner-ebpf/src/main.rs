//! Kernel side of provisioner's tracer.
//!
//! rustc emits no CO-RE relocations, so the struct member offsets this code needs are globals
//! that userspace resolves from the running kernel's BTF and patches in at load time.
#![no_std]
#![no_main]
// rustc's BPF target has no atomic read-modify-write in `core`: the counter's add is the
// intrinsic (and LLVM cannot select an atomic load for BPF's generic CPU: its read is volatile).
#![allow(internal_features)]
#![feature(core_intrinsics)]

use core::ffi::c_void;
use core::intrinsics::AtomicOrdering;

use aya_ebpf::{
    Global,
    bindings::BPF_F_NO_PREALLOC,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_uid_gid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use provisioner_common::{
    AF_NETLINK, BindMount, CLONE_NEWNET, COMM_LEN, DevEvent, ENV_COPY, EventHeader, Exec, ExecEnv,
    Extack, FILENAME_LEN, MS_BIND, MSG_PEEK, NETLINK_COPY, NETLINK_ROUTE, NLMSG_ERROR, NetlinkMsg,
    NetnsCreated, NetnsId, TC_H_ROOT, kind, origin, syscall,
};

// Offsets (bytes) of kernel struct members, resolved from BTF by userspace.
#[unsafe(no_mangle)]
static OFF_TASK_NSPROXY: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_TASK_TGID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_TASK_REAL_PARENT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_TASK_COMM: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_NSPROXY_NET_NS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_NET_COOKIE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_NET_NS_INUM: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_NET_NS_REF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_SK_FAMILY: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_SK_PROTOCOL: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_SK_NET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_SK_RCVQ_TAIL: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_SK_RCVQ_LEN: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_SKB_DATA: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_DEV_NAME: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_DEV_IFINDEX: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_DEV_FLAGS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_DEV_NET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_QDISC_OPS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_QDISC_PARENT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_QDISC_DEV_QUEUE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_QDISC_OPS_ID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_NETDEV_QUEUE_DEV: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_BINPRM_FILENAME: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_TASK_MM: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_MM_ENV_START: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_MM_ENV_END: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_REGS_ORIG_AX: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_REGS_DI: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_REGS_SI: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_REGS_DX: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static OFF_REGS_R10: Global<u32> = Global::new(0);

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

/// Offset of the first syscall argument (and of the return value) in a syscall tracepoint record.
const SYSCALL_ARG0: usize = 16;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Records that could not be reserved in `EVENTS`, per kind.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Flags of unshare calls in flight that asked for a new netns, by pid_tgid (syscall
/// tracepoint fallback only).
#[map]
static PENDING_UNSHARE: HashMap<u64, u64> = HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// Events not sent because the netns of the task they are about could not be read, per kind.
#[map]
static NETNS_UNREADABLE: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// An `unshare(CLONE_NEWNET)` seen at its capability check, before the namespace exists.
#[derive(Clone, Copy)]
#[repr(C)]
struct Unsharing {
    flags: u64,
    /// Cookie of the caller's netns before the call: a different one afterwards is the new one.
    old_cookie: u64,
    ts_ns: u64,
}

/// Unshares announced by `cap_capable` and not yet reported, by pid_tgid. Reported at the
/// task's next traced step (mount, setns, exec, fork, netlink request, exit), once its netns
/// changed.
#[map]
static UNSHARING: HashMap<u64, Unsharing> = HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// Entries put in `UNSHARING` and not taken out yet (more when one replaced another). While it
/// is 0, nearly always, a step that reports a pending unshare skips the lookup: a hash lookup
/// on every netlink send and exit of the node, up to 0.8 us on an exiting task's cold caches.
#[map]
static UNSHARING_ENTRIES: Array<u64> = Array::with_max_entries(1, 0);

/// Adds `delta` (wrapping: `u64::MAX` takes one away) to `UNSHARING_ENTRIES`.
#[inline(always)]
fn count_unsharing(delta: u64) {
    if let Some(entries) = UNSHARING_ENTRIES.get_ptr_mut(0) {
        // SAFETY: an array map's value, valid while the program runs; written atomically, as
        // other CPUs update it too.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(entries, delta)
        };
    }
}

/// `bpf_ringbuf_submit` flags and `bpf_ringbuf_query` selector (`<linux/bpf.h>`).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
/// Unread bytes in `EVENTS` from which a record wakes the reader up. Below it, records do not
/// wake it (each wakeup is an IPI and a context switch in the daemon, per record); the reader
/// drains the buffer on a short timer instead.
const WAKEUP_BYTES: u64 = 256 * 1024;

#[inline(always)]
fn wakeup_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

#[inline(always)]
fn count_lost(kind: u32) {
    count(&LOST, kind);
}

#[inline(always)]
fn count(counters: &PerCpuArray<u64>, kind: u32) {
    if let Some(counter) = counters.get_ptr_mut(kind) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *counter += 1 };
    }
}

/// The `T` at `base + offset`, where `base` is a BTF-typed kernel pointer: a BTF tracepoint's
/// argument, what `bpf_get_current_task_btf` or `bpf_task_pt_regs` return, or a pointer member
/// loaded with this function from one of those. The offsets are constants of the frozen
/// .rodata, so the verifier checks the load against the kernel's BTF and turns it into a
/// fault-tolerant load (0 from a bad address): no helper call, where [`read_field`] costs one.
#[inline(always)]
unsafe fn load<T>(base: *const u8, offset: u32) -> T {
    // SAFETY: see above; the verifier refuses the program if `base` is not BTF-typed.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// The current task, BTF-typed (its members can be [`load`]ed).
#[inline(always)]
fn current_task() -> *const u8 {
    // SAFETY: no preconditions.
    unsafe { generated::bpf_get_current_task_btf() as *const u8 }
}

/// The `T` at `base + offset` in kernel memory; `None` for a null `base` or an unreadable
/// address.
#[inline(always)]
unsafe fn read_field<T>(base: *const u8, offset: u32) -> Option<T> {
    if base.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address; a bad one yields an error.
    // `wrapping_add`: the address is only handed to the helper, never dereferenced here.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.ok()
}

/// Cookie and inode of the network namespace of `task` (BTF-typed); `None` when the task has
/// none any more (exiting).
#[inline(always)]
unsafe fn task_netns(task: *const u8) -> Option<(u64, u32)> {
    unsafe {
        let nsproxy: *const u8 = load(task, OFF_TASK_NSPROXY.load());
        if nsproxy.is_null() {
            return None;
        }
        net_id(load(nsproxy, OFF_NSPROXY_NET_NS.load()))
    }
}

/// Cookie and inode of the namespace `net` (BTF-typed).
#[inline(always)]
unsafe fn net_id(net: *const u8) -> Option<(u64, u32)> {
    if net.is_null() {
        return None;
    }
    unsafe {
        Some((
            load(net, OFF_NET_COOKIE.load()),
            load(net, OFF_NET_NS_INUM.load()),
        ))
    }
}

#[inline(always)]
fn to_id(id: Option<(u64, u32)>) -> NetnsId {
    let (cookie, inum) = id.unwrap_or((0, 0));
    NetnsId {
        cookie,
        inum,
        _pad: 0,
    }
}

#[inline(always)]
fn current_netns() -> NetnsId {
    // SAFETY: a BTF-typed task.
    to_id(unsafe { task_netns(current_task()) })
}

#[inline(always)]
fn fill_header(header: &mut EventHeader, kind: u32) {
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

/// Reports the netns of `task` as new; `at_ns` overrides the record's time (an unshare
/// reported after the call).
#[inline(always)]
fn emit_netns_created(task: *const u8, origin: u32, flags: u64, at_ns: Option<u64>) {
    // SAFETY: `task` is BTF-typed (see `task_netns`).
    let Some((cookie, inum)) = (unsafe { task_netns(task) }) else {
        count(&NETNS_UNREADABLE, kind::NETNS_CREATED);
        return;
    };
    let Some(mut entry) = EVENTS.reserve::<NetnsCreated>(0) else {
        count_lost(kind::NETNS_CREATED);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at a reserved, exclusively owned NetnsCreated slot.
    unsafe {
        fill_header(&mut (*record).header, kind::NETNS_CREATED);
        if let Some(at_ns) = at_ns {
            (*record).header.ts_ns = at_ns;
        }
        (*record).netns_cookie = cookie;
        (*record).netns_inum = inum;
        (*record).origin = origin;
        (*record).flags = flags;
        (*record).owner_pid = read_field(task, OFF_TASK_TGID.load()).unwrap_or(0);
        let parent: *const u8 = load(current_task(), OFF_TASK_REAL_PARENT.load());
        (*record).parent_pid = read_field(parent, OFF_TASK_TGID.load()).unwrap_or(0);
        (*record).parent_comm = read_field(parent, OFF_TASK_COMM.load()).unwrap_or([0; COMM_LEN]);
    }
    entry.submit(wakeup_flags());
}

// ---------------------------------------------------------------------------------------------
// new namespaces and bind mounts
//
// Every syscall tracepoint (even one for a syscall nobody makes) puts every syscall of the node
// on the slow path (SYSCALL_WORK_SYSCALL_TRACEPOINT on every task). So unshare and mount are
// seen at their CAP_SYS_ADMIN check (`cap_capable`, a BTF tracepoint that costs nothing to
// other syscalls), and the syscall tracepoints below are only a fallback for kernels without it.
// ---------------------------------------------------------------------------------------------

/// `CAP_SYS_ADMIN`: checked by unshare and setns of a namespace and by mount.
const CAP_SYS_ADMIN: i32 = 21;
/// x86_64 syscall numbers of the calls recognised at their capability check.
const NR_MOUNT: u64 = 165;
const NR_UNSHARE: u64 = 272;
const NR_SETNS: u64 = 308;

/// Reports the current task's unshare announced by `cap_capable`, if its netns changed since.
#[inline(always)]
fn flush_unshare() {
    flush_unshare_of(bpf_get_current_pid_tgid());
}

/// [`flush_unshare`] of the current task, known to `UNSHARING` as `pid_tgid` (its id before an
/// exec, when a thread other than the leader execs and takes the leader's).
#[inline(always)]
fn flush_unshare_of(pid_tgid: u64) {
    // The task's own entry was counted before its unshare returned (a task that moved to
    // another CPU since went through the scheduler's barriers).
    let pending = UNSHARING_ENTRIES.get_ptr_mut(0).is_none_or(|entries| {
        // SAFETY: an array map's value, valid while the program runs; an aligned 8-byte load
        // is a single instruction on BPF (an atomic load does not compile for the generic CPU).
        (unsafe { core::ptr::read_volatile(entries) }) != 0
    });
    if !pending {
        return;
    }
    // SAFETY: the entry is copied out before it is removed.
    let Some(unsharing) = (unsafe { UNSHARING.get(pid_tgid) }).copied() else {
        return;
    };
    if UNSHARING.remove(pid_tgid).is_ok() {
        count_unsharing(u64::MAX);
    }
    let current = current_task();
    // SAFETY: a BTF-typed task.
    match unsafe { task_netns(current) } {
        Some((cookie, _)) if cookie != unsharing.old_cookie => emit_netns_created(
            current,
            origin::UNSHARE,
            unsharing.flags,
            Some(unsharing.ts_ns),
        ),
        Some(_) => {} // the call failed: same namespace
        None => count(&NETNS_UNREADABLE, kind::NETNS_CREATED),
    }
}

/// `cap_capable(cred, target_ns, capable_ns, cap, ret)`: every capability check. Only
/// CAP_SYS_ADMIN checks made by unshare, setns and mount do more than compare `cap`.
#[btf_tracepoint(function = "cap_capable")]
pub fn cap_capable(ctx: BtfTracePointContext) -> i32 {
    let cap: i32 = ctx.arg(3);
    if cap != CAP_SYS_ADMIN {
        return 0;
    }
    // SAFETY: registers are read with BTF-checked loads, user memory through probe helpers.
    unsafe {
        let (nr, arg0, arg1, _) = syscall_args();
        match nr {
            NR_UNSHARE => {
                // A previous unshare of this task is complete: its namespace is current.
                flush_unshare();
                if arg0 & CLONE_NEWNET != 0 {
                    let unsharing = Unsharing {
                        flags: arg0,
                        old_cookie: current_netns().cookie,
                        ts_ns: bpf_ktime_get_ns(),
                    };
                    match UNSHARING.insert(bpf_get_current_pid_tgid(), unsharing, 0) {
                        Ok(()) => count_unsharing(1),
                        Err(_) => count_lost(kind::NETNS_CREATED),
                    }
                }
            }
            NR_SETNS => flush_unshare(),
            NR_MOUNT => {
                flush_unshare();
                let flags = syscall_reg(OFF_REGS_R10.load());
                emit_bind_mount(flags, arg0 as *const u8, arg1 as *const u8);
            }
            _ => {}
        }
    }
    0
}

/// `sched_process_exit(struct task_struct *p, bool group_dead)`: a task that unshared and did
/// nothing traced since is reported before it goes.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(_ctx: BtfTracePointContext) -> i32 {
    flush_unshare();
    // Keeps the ABI tag in the object (the linker drops statics no program reads).
    // SAFETY: reading a byte of a static.
    let _ = unsafe { core::ptr::read_volatile(&PROVISIONER_EVENT_ABI[0]) };
    // SAFETY: as above.
    let _ = unsafe { core::ptr::read_volatile(&PROVISIONER_EBPF_SOURCES[0]) };
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_unshare")]
pub fn sys_enter_unshare(ctx: TracePointContext) -> u32 {
    // SAFETY: offset of `unshare_flags` in the sys_enter record.
    let flags: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.unwrap_or(0);
    if flags & CLONE_NEWNET != 0 {
        let _ = PENDING_UNSHARE.insert(bpf_get_current_pid_tgid(), flags, 0);
    }
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_unshare")]
pub fn sys_exit_unshare(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: lookup result is copied out before the entry is removed.
    let Some(flags) = (unsafe { PENDING_UNSHARE.get(pid_tgid) }).copied() else {
        return 0;
    };
    let _ = PENDING_UNSHARE.remove(pid_tgid);
    // SAFETY: offset of `ret` in the sys_exit record.
    let ret: i64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.unwrap_or(-1);
    if ret == 0 {
        emit_netns_created(current_task(), origin::UNSHARE, flags, None);
    }
    0
}

/// `task_newtask(struct task_struct *task, u64 clone_flags)`: runs after the child's
/// namespaces were copied, for clone and clone3 alike.
#[btf_tracepoint(function = "task_newtask")]
pub fn task_newtask(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    let flags: u64 = ctx.arg(1);
    flush_unshare();
    if flags & CLONE_NEWNET != 0 {
        emit_netns_created(task, origin::CLONE, flags, None);
    }
    0
}

// ---------------------------------------------------------------------------------------------
// rtnetlink requests and replies
// ---------------------------------------------------------------------------------------------

/// The first rtnetlink message type (`RTM_NEWLINK`); types come in fours: new, del, get, set.
const RTM_BASE: u16 = 16;

/// x86_64 syscall numbers of the calls whose buffers are read (from the caller's saved
/// registers: the socket tracepoints do not carry the user buffer).
const NR_SENDTO: u64 = 44;
const NR_RECVFROM: u64 = 45;
const NR_SENDMSG: u64 = 46;
const NR_RECVMSG: u64 = 47;

/// Whether `sk` is a NETLINK_ROUTE socket: the only work every send/recv on the node pays.
///
/// `sk` is the tracepoint's BTF-typed `struct sock *` and the offsets are constants of the
/// frozen .rodata, so the verifier checks these plain loads against the kernel's BTF and turns
/// them into fault-tolerant loads: no helper call.
#[inline(always)]
unsafe fn is_route_sock(sk: *const u8) -> bool {
    unsafe {
        let family =
            core::ptr::read_volatile(sk.wrapping_add(OFF_SK_FAMILY.load() as usize).cast::<u16>());
        if family != AF_NETLINK {
            return false;
        }
        let protocol = core::ptr::read_volatile(
            sk.wrapping_add(OFF_SK_PROTOCOL.load() as usize)
                .cast::<u16>(),
        );
        protocol == NETLINK_ROUTE
    }
}

/// The current task's saved user registers (x86_64 `pt_regs`).
#[inline(always)]
unsafe fn user_regs() -> *const u8 {
    unsafe { generated::bpf_task_pt_regs(current_task() as *mut _) as *const u8 }
}

/// The current task's syscall number and first three arguments, from its saved user registers.
#[inline(always)]
unsafe fn syscall_args() -> (u64, u64, u64, u64) {
    unsafe {
        let regs = user_regs();
        (
            load(regs, OFF_REGS_ORIG_AX.load()),
            load(regs, OFF_REGS_DI.load()),
            load(regs, OFF_REGS_SI.load()),
            load(regs, OFF_REGS_DX.load()),
        )
    }
}

/// One saved user register of the current task, at `offset` in `pt_regs`.
#[inline(always)]
unsafe fn syscall_reg(offset: u32) -> u64 {
    unsafe { load(user_regs(), offset) }
}

#[inline(always)]
/// Records the netlink message in `buf` (`len` bytes there; the call moved `sent` in all).
fn emit_netlink(
    kind: u32,
    syscall: u32,
    fd: u64,
    sk: *const u8,
    buf: *const u8,
    len: u64,
    sent: u64,
) {
    let Some(mut entry) = EVENTS.reserve::<NetlinkMsg>(0) else {
        count_lost(kind);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at a reserved, exclusively owned NetlinkMsg slot; kernel memory
    // is read with BTF-checked loads, user memory through a probe helper.
    let discard = unsafe {
        fill_header(&mut (*record).header, kind);
        (*record).task_netns = current_netns();
        (*record).sock_netns = to_id(net_id(load(sk, OFF_SK_NET.load())));
        (*record).syscall = syscall;
        (*record).fd = fd as u32;
        (*record).total_len = len as u32;
        let n: u32 = if len > NETLINK_COPY as u64 {
            NETLINK_COPY as u32
        } else {
            len as u32
        };
        let rc = generated::bpf_probe_read_user(
            (*record).data.as_mut_ptr().cast::<c_void>(),
            n,
            buf.cast::<c_void>(),
        );
        (*record).copied = if rc == 0 { n } else { 0 };
        (*record).answer = 0;
        (*record).answered = 0;
        let request = kind == kind::NETLINK_REQUEST && rc == 0;
        if request && let Some(answer) = queued_answer(sk, &(*record).data, sent) {
            (*record).answer = answer;
            (*record).answered = 1;
        }
        request && is_get(&(*record).data, sent)
    };
    if discard {
        entry.discard(0);
    } else {
        entry.submit(wakeup_flags());
    }
}

/// Whether `data` starts with the header of a get or dump request that is alone in the
/// `sent` bytes of its send.
#[inline(always)]
fn is_get(data: &[u8; NETLINK_COPY], sent: u64) -> bool {
    let msg_len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
    let msg_type = u16::from_ne_bytes([data[4], data[5]]);
    u64::from(msg_len) == sent && is_get_type(msg_type)
}

/// `RTM_GET*`: a get or a dump, which changes nothing.
#[inline(always)]
fn is_get_type(msg_type: u16) -> bool {
    msg_type >= RTM_BASE && msg_type % 4 == 2
}

/// The answer (0 or a negative errno) to the request `data` just sent on `sk`, when it is
/// alone in the `sent` bytes of its send and its answer is the last record queued on `sk`: the
/// kernel processed the request within the send and queued its `NLMSG_ERROR` then (after an
/// echo, if one was asked for). The answer echoes the request's header, which must match.
/// `None` when anything else is last (a notification that came after, a dump's output).
#[inline(always)]
unsafe fn queued_answer(sk: *const u8, data: &[u8; NETLINK_COPY], sent: u64) -> Option<i32> {
    let request_len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
    if u64::from(request_len) != sent {
        return None;
    }
    // SAFETY: `sk` is BTF-typed (the tracepoint's `struct sock *`) and the offsets are of its
    // members; the tail is a `struct sk_buff *` member loaded from it; its data is read
    // through a probe helper.
    unsafe {
        let queued: u32 = load(sk, OFF_SK_RCVQ_LEN.load());
        if queued == 0 {
            return None;
        }
        let tail: *const u8 = load(sk, OFF_SK_RCVQ_TAIL.load());
        if tail.is_null() {
            return None;
        }
        let reply: *const u8 = load(tail, OFF_SKB_DATA.load());
        // nlmsghdr (len, type, flags, seq, pid), then `struct nlmsgerr`: the error and the
        // request's header echoed (len, type, flags, seq, pid).
        let head: [u8; 36] = read_field(reply, 0)?;
        let word =
            |b: &[u8], at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let msg_type = u16::from_ne_bytes([head[4], head[5]]);
        let echoes_the_request = word(&head, 20) == word(data, 0)
            && word(&head, 24) == word(data, 4)
            && word(&head, 28) == word(data, 8);
        if msg_type != NLMSG_ERROR || !echoes_the_request {
            return None;
        }
        Some(i32::from_ne_bytes([head[16], head[17], head[18], head[19]]))
    }
}

/// Whether the current task is in a send whose first message is a get or dump.
#[inline(always)]
unsafe fn sending_a_get() -> bool {
    unsafe {
        let (nr, _, arg1, _) = syscall_args();
        let buf = match nr {
            NR_SENDTO => arg1 as *const u8,
            NR_SENDMSG => match first_iov(arg1 as *const u8) {
                Some((base, _)) => base,
                None => return false,
            },
            _ => return false,
        };
        bpf_probe_read_user::<u16>(buf.wrapping_add(4).cast()).is_ok_and(is_get_type)
    }
}

/// The first iovec of a `struct user_msghdr` (userspace ABI: msg_iov at 16): (base, len).
#[inline(always)]
unsafe fn first_iov(msg: *const u8) -> Option<(*const u8, u64)> {
    unsafe {
        if msg.is_null() {
            return None;
        }
        let iov: *const u8 = bpf_probe_read_user(msg.wrapping_add(16).cast()).ok()?;
        if iov.is_null() {
            return None;
        }
        let [base, len]: [u64; 2] = bpf_probe_read_user(iov.cast()).ok()?;
        Some((base as *const u8, len))
    }
}

#[inline(always)]
fn arg<T>(ctx: &TracePointContext, n: usize) -> Option<T> {
    // SAFETY: syscall tracepoint records hold 8-byte arguments after a 16-byte preamble.
    unsafe { ctx.read_at::<T>(SYSCALL_ARG0 + 8 * n) }.ok()
}

/// `sock_send_length(struct sock *sk, int ret, int flags)`: after a send returned. For
/// NETLINK_ROUTE the kernel has processed the request by then (synchronously, in this task).
#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let ret: i32 = ctx.arg(1);
    // SAFETY: kernel memory is read with BTF-checked loads or probe helpers, user memory
    // through probe helpers.
    unsafe {
        if ret < 0 || !is_route_sock(sk) {
            return 0;
        }
        flush_unshare();
        let (nr, fd, arg1, arg2) = syscall_args();
        match nr {
            NR_SENDTO => emit_netlink(
                kind::NETLINK_REQUEST,
                syscall::SENDTO,
                fd,
                sk,
                arg1 as *const u8,
                arg2,
                ret as u64,
            ),
            NR_SENDMSG => {
                if let Some((base, len)) = first_iov(arg1 as *const u8) {
                    emit_netlink(
                        kind::NETLINK_REQUEST,
                        syscall::SENDMSG,
                        fd,
                        sk,
                        base,
                        len,
                        ret as u64,
                    );
                }
            }
            _ => {}
        }
    }
    0
}

/// `sock_recv_length(struct sock *sk, int ret, int flags)`: after a recv returned; emits the
/// reply when it starts with an `NLMSG_ERROR` carrying an error (not a bare ACK) that does not
/// answer a get or dump.
#[btf_tracepoint(function = "sock_recv_length")]
pub fn sock_recv_length(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let ret: i32 = ctx.arg(1);
    let flags: i32 = ctx.arg(2);
    // SAFETY: kernel memory is read with BTF-checked loads or probe helpers, user memory
    // through probe helpers.
    unsafe {
        if ret < 16 || flags as u64 & MSG_PEEK != 0 || !is_route_sock(sk) {
            return 0;
        }
        let (nr, fd, arg1, arg2) = syscall_args();
        let (buf, size, call) = match nr {
            NR_RECVFROM => (arg1 as *const u8, arg2, syscall::RECVFROM),
            NR_RECVMSG => match first_iov(arg1 as *const u8) {
                Some((base, len)) => (base, len, syscall::RECVMSG),
                None => return 0,
            },
            _ => return 0,
        };
        if buf.is_null() {
            return 0;
        }
        // nlmsghdr (len, type, flags, seq, pid), then an NLMSG_ERROR's error, in one read; a
        // buffer too short for the error gives its type alone (and is no ACK).
        let (msg_len, msg_type, error) = match bpf_probe_read_user::<[u32; 5]>(buf.cast()) {
            Ok(head) => (head[0], head[1] as u16, head[4]),
            Err(_) => match bpf_probe_read_user::<u16>(buf.wrapping_add(4).cast()) {
                Ok(msg_type) => (0, msg_type, u32::MAX),
                Err(_) => return 0,
            },
        };
        if msg_type != NLMSG_ERROR {
            return 0;
        }
        // ACKs are not sent: a request's answer is taken when the request is sent (see
        // `queued_answer`; one whose answer was not found then shows as sent). Errors always
        // are: a request's failure is never missed.
        if error == 0 && msg_len as i32 == ret {
            return 0;
        }
        // Nor the errors of gets and dumps (a lookup of what is not there changes nothing).
        if let Ok(request_type) = bpf_probe_read_user::<u16>(buf.wrapping_add(24).cast())
            && ret >= 36
            && is_get_type(request_type)
        {
            return 0;
        }
        let len = if (ret as u64) < size {
            ret as u64
        } else {
            size
        };
        emit_netlink(kind::NETLINK_REPLY, call, fd, sk, buf, len, len);
    }
    0
}

/// `netlink_extack(const char *msg)`: fires in the requester's context while the kernel
/// processes its request.
#[btf_tracepoint(function = "netlink_extack")]
pub fn netlink_extack(ctx: BtfTracePointContext) -> i32 {
    let msg: *const u8 = ctx.arg(0);
    // The message of a get or dump is not sent: neither is its request, which would take it,
    // and the next request of this thread would.
    // SAFETY: registers are read with BTF-checked loads, user memory through probe helpers.
    if unsafe { sending_a_get() } {
        return 0;
    }
    let Some(mut entry) = EVENTS.reserve::<Extack>(0) else {
        count_lost(kind::EXTACK);
        return 0;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: reserved slot; the kernel string is read through a probe helper.
    unsafe {
        fill_header(&mut (*record).header, kind::EXTACK);
        (*record).task_netns = current_netns();
        (*record).msg[0] = 0;
        let _ = bpf_probe_read_kernel_str_bytes(msg, &mut (*record).msg);
    }
    entry.submit(wakeup_flags());
    0
}

// ---------------------------------------------------------------------------------------------
// devices (root qdisc created on first up, destroyed when the device or its netns goes)
// ---------------------------------------------------------------------------------------------

#[inline(always)]
fn emit_dev(kind: u32, dev: *const u8, ops: *const u8) {
    let Some(mut entry) = EVENTS.reserve::<DevEvent>(0) else {
        count_lost(kind);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: reserved slot; kernel memory is read with BTF-checked loads or probe helpers.
    unsafe {
        fill_header(&mut (*record).header, kind);
        let net: *const u8 = load(dev, OFF_DEV_NET.load());
        (*record).netns = to_id(net_id(net));
        let refs: u32 = read_field(net, OFF_NET_NS_REF.load()).unwrap_or(1);
        (*record).netns_dying = u32::from(refs == 0);
        (*record).ifindex = read_field(dev, OFF_DEV_IFINDEX.load()).unwrap_or(0);
        (*record).dev_flags = read_field(dev, OFF_DEV_FLAGS.load()).unwrap_or(0);
        (*record)._pad = 0;
        (*record).ifname = read_field(dev, OFF_DEV_NAME.load()).unwrap_or([0; 16]);
        (*record).qdisc = read_field(ops, OFF_QDISC_OPS_ID.load()).unwrap_or([0; 16]);
    }
    entry.submit(wakeup_flags());
}

/// `qdisc_create(const struct Qdisc_ops *ops, struct net_device *dev, u32 parent)`
#[btf_tracepoint(function = "qdisc_create")]
pub fn qdisc_create(ctx: BtfTracePointContext) -> i32 {
    let parent: u32 = ctx.arg(2);
    if parent == TC_H_ROOT {
        emit_dev(kind::DEV_UP, ctx.arg(1), ctx.arg(0));
    }
    0
}

/// `qdisc_destroy(struct Qdisc *q)`
#[btf_tracepoint(function = "qdisc_destroy")]
pub fn qdisc_destroy(ctx: BtfTracePointContext) -> i32 {
    let q: *const u8 = ctx.arg(0);
    // SAFETY: kernel memory is read with BTF-checked loads or probe helpers.
    unsafe {
        let Some(parent) = read_field::<u32>(q, OFF_QDISC_PARENT.load()) else {
            return 0;
        };
        if parent != TC_H_ROOT {
            return 0;
        }
        let queue: *const u8 = load(q, OFF_QDISC_DEV_QUEUE.load());
        if queue.is_null() {
            return 0;
        }
        let dev: *const u8 = load(queue, OFF_NETDEV_QUEUE_DEV.load());
        if dev.is_null() {
            return 0;
        }
        let ops: *const u8 = read_field(q, OFF_QDISC_OPS.load()).unwrap_or(core::ptr::null());
        emit_dev(kind::DEV_GONE, dev, ops);
    }
    0
}

// ---------------------------------------------------------------------------------------------
// exec and bind mounts
// ---------------------------------------------------------------------------------------------

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    let old_pid: i32 = ctx.arg(1);
    let bprm: *const u8 = ctx.arg(2);
    let pid_tgid = bpf_get_current_pid_tgid();
    flush_unshare_of(pid_tgid);
    if old_pid as u32 != pid_tgid as u32 {
        flush_unshare_of((pid_tgid & 0xffff_ffff_0000_0000) | u64::from(old_pid as u32));
    }
    let Some(mut entry) = EVENTS.reserve::<Exec>(0) else {
        count_lost(kind::EXEC);
        return 0;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: reserved slot; kernel memory is read with BTF-checked loads or probe helpers.
    let (parent_pid, parent_comm, cni_candidate) = unsafe {
        fill_header(&mut (*record).header, kind::EXEC);
        (*record).task_netns = to_id(task_netns(task));
        let parent: *const u8 =
            read_field(task, OFF_TASK_REAL_PARENT.load()).unwrap_or(core::ptr::null());
        (*record).parent_pid = read_field(parent, OFF_TASK_TGID.load()).unwrap_or(0);
        (*record)._pad = 0;
        (*record).parent_comm = read_field(parent, OFF_TASK_COMM.load()).unwrap_or([0; COMM_LEN]);
        (*record).filename[0] = 0;
        let filename: *const u8 =
            read_field(bprm, OFF_BINPRM_FILENAME.load()).unwrap_or(core::ptr::null());
        let _ = bpf_probe_read_kernel_str_bytes(filename, &mut (*record).filename);
        (
            (*record).parent_pid,
            (*record).parent_comm,
            is_runtime_comm(&(*record).parent_comm) || in_cni_dir(&(*record).filename),
        )
    };
    entry.submit(wakeup_flags());
    if cni_candidate {
        emit_exec_env(task, parent_pid, parent_comm);
    }
    0
}

/// Whether `comm` is a container runtime's (the processes that run CNI plugins, and the
/// runtime comms of the sandbox rules): `containerd*`, `runc*`, `crun`, `crio`, `conmon`,
/// `pinns`, `podman`, `pause`.
#[inline(always)]
fn is_runtime_comm(comm: &[u8; COMM_LEN]) -> bool {
    starts_with(comm, b"containerd")
        || starts_with(comm, b"runc")
        || is_comm(comm, b"crun")
        || is_comm(comm, b"crio")
        || is_comm(comm, b"conmon")
        || is_comm(comm, b"pinns")
        || is_comm(comm, b"podman")
        || is_comm(comm, b"pause")
}

/// Whether `path` is a binary of a usual CNI plugin directory.
#[inline(always)]
fn in_cni_dir(path: &[u8; FILENAME_LEN]) -> bool {
    starts_with(path, b"/opt/cni/bin/")
        || starts_with(path, b"/usr/lib/cni/")
        || starts_with(path, b"/usr/libexec/cni/")
}

#[inline(always)]
fn starts_with<const N: usize>(text: &[u8; N], prefix: &[u8]) -> bool {
    if prefix.len() > N {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if text[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether the NUL-terminated `comm` is exactly `name`.
#[inline(always)]
fn is_comm(comm: &[u8; COMM_LEN], name: &[u8]) -> bool {
    name.len() < COMM_LEN && starts_with(comm, name) && comm[name.len()] == 0
}

/// Sends the end of the environment of `task` (BTF-typed, just exec'd: its new stack holds
/// the strings, written by the exec and so present in memory).
#[inline(always)]
fn emit_exec_env(task: *const u8, parent_pid: u32, parent_comm: [u8; COMM_LEN]) {
    // SAFETY: BTF-checked loads of the task's `mm` and its members.
    let (start, end) = unsafe {
        let mm: *const u8 = load(task, OFF_TASK_MM.load());
        if mm.is_null() {
            return;
        }
        (
            load::<u64>(mm, OFF_MM_ENV_START.load()),
            load::<u64>(mm, OFF_MM_ENV_END.load()),
        )
    };
    if end <= start {
        return;
    }
    let env_len = end - start;
    let Some(mut entry) = EVENTS.reserve::<ExecEnv>(0) else {
        count_lost(kind::EXEC_ENV);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: reserved slot; user memory is read through a probe helper, at most ENV_COPY
    // bytes into a buffer of ENV_COPY bytes.
    unsafe {
        fill_header(&mut (*record).header, kind::EXEC_ENV);
        (*record).parent_pid = parent_pid;
        (*record).env_len = if env_len > u64::from(u32::MAX) {
            u32::MAX
        } else {
            env_len as u32
        };
        (*record).uid = bpf_get_current_uid_gid() as u32;
        (*record).parent_comm = parent_comm;
        let n: u32 = if env_len > ENV_COPY as u64 {
            ENV_COPY as u32
        } else {
            env_len as u32
        };
        let rc = generated::bpf_probe_read_user(
            (*record).env.as_mut_ptr().cast::<c_void>(),
            n,
            (end - u64::from(n)) as *const c_void,
        );
        // An unreadable environment is sent empty (`provisioner trace` shows it so).
        (*record).copied = if rc == 0 { n } else { 0 };
    }
    entry.submit(wakeup_flags());
}

/// A bind mount request (the record carries the caller's netns and the user's paths).
#[inline(always)]
fn emit_bind_mount(flags: u64, source: *const u8, target: *const u8) {
    if flags & MS_BIND == 0 {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<BindMount>(0) else {
        count_lost(kind::BIND_MOUNT);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: reserved slot; user strings are read through probe helpers.
    unsafe {
        fill_header(&mut (*record).header, kind::BIND_MOUNT);
        (*record).task_netns = current_netns();
        (*record).flags = flags;
        (*record).source[0] = 0;
        (*record).target[0] = 0;
        let _ = bpf_probe_read_user_str_bytes(source, &mut (*record).source);
        let _ = bpf_probe_read_user_str_bytes(target, &mut (*record).target);
    }
    entry.submit(wakeup_flags());
}

/// `mount(dev_name, dir_name, type, flags, data)` (fallback for kernels without `cap_capable`).
#[tracepoint(category = "syscalls", name = "sys_enter_mount")]
pub fn sys_enter_mount(ctx: TracePointContext) -> u32 {
    let flags: u64 = arg(&ctx, 3).unwrap_or(0);
    let source: *const u8 = arg(&ctx, 0).unwrap_or(core::ptr::null());
    let target: *const u8 = arg(&ctx, 1).unwrap_or(core::ptr::null());
    emit_bind_mount(flags, source, target);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
