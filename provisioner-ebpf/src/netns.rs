//! New network namespaces: clone and clone3 (at `task_newtask`), and unshare, seen either at
//! its CAP_SYS_ADMIN check (`cap_capable`, Linux 6.14) or with syscall tracepoints.
//!
//! Every syscall tracepoint (even one for a syscall nobody makes) puts every syscall of the node
//! on the slow path (SYSCALL_WORK_SYSCALL_TRACEPOINT on every task). So where the kernel has
//! `cap_capable`, a BTF tracepoint that costs nothing to other syscalls, unshare and mount are
//! seen there, and the syscall tracepoints are the backend of kernels without it.

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns};
use aya_ebpf::macros::{btf_tracepoint, map, tracepoint};
use aya_ebpf::maps::{Array, HashMap};
use aya_ebpf::programs::{BtfTracePointContext, TracePointContext};
use provisioner_common::{CLONE_NEWNET, COMM_LEN, NetnsCreated, kind, origin};

use crate::kernel::{
    current_task, load, nr, read_field, syscall_arg, syscall_args, syscall_ret, task_net, user_regs,
};
use crate::mounts::emit_bind_mount;
use crate::netns_id::{created, current_netns, net_id};
use crate::offsets::{OFF_REGS_R10, OFF_TASK_COMM, OFF_TASK_REAL_PARENT, OFF_TASK_TGID};
use crate::ring::{
    EVENTS, count_entries, count_lost, count_unreadable, fill_header, has_entries, wakeup_flags,
};
use crate::rtnetlink::forget_netlink_call;

/// Reports the netns of `task` (any kernel pointer to a task) as new; `at_ns` overrides the
/// record's time (an unshare reported after the call).
#[inline(always)]
fn emit_netns_created(task: *const u8, origin: u32, flags: u64, at_ns: Option<u64>) {
    // SAFETY: probe reads tolerate any address.
    let net = unsafe { task_net(task) };
    // SAFETY: as above.
    unsafe { created(net) };
    // SAFETY: as above.
    let Some(id) = (unsafe { net_id(net) }) else {
        count_unreadable(kind::NETNS_CREATED);
        return;
    };
    let Some(mut entry) = EVENTS.reserve::<NetnsCreated>(0) else {
        count_lost(kind::NETNS_CREATED);
        return;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at a reserved, exclusively owned NetnsCreated slot; kernel
    // memory is read through probe helpers.
    unsafe {
        fill_header(&mut (*record).header, kind::NETNS_CREATED);
        if let Some(at_ns) = at_ns {
            (*record).header.ts_ns = at_ns;
        }
        (*record).netns_cookie = id.cookie;
        (*record).netns_inum = id.inum;
        (*record).origin = origin;
        (*record).flags = flags;
        (*record).owner_pid = read_field(task, OFF_TASK_TGID.load()).unwrap_or(0);
        let parent: *const u8 =
            read_field(current_task(), OFF_TASK_REAL_PARENT.load()).unwrap_or(core::ptr::null());
        (*record).parent_pid = read_field(parent, OFF_TASK_TGID.load()).unwrap_or(0);
        (*record).parent_comm = read_field(parent, OFF_TASK_COMM.load()).unwrap_or([0; COMM_LEN]);
    }
    entry.submit(wakeup_flags());
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

/// `sched_process_exit(struct task_struct *p, bool group_dead)`: a task that unshared and did
/// nothing traced since is reported before it goes; a netlink call it left in flight is
/// forgotten.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(_ctx: BtfTracePointContext) -> i32 {
    flush_unshare();
    forget_netlink_call();
    crate::keep_tags();
    0
}

// ---------------------------------------------------------------------------------------------
// unshare at its capability check (Linux 6.14 and later)
// ---------------------------------------------------------------------------------------------

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
static UNSHARING: HashMap<u64, Unsharing> = HashMap::with_max_entries(1024, 0);

/// Entries in `UNSHARING` (see `ring::has_entries`): a hash lookup on every netlink send and
/// exit of the node, up to 0.8 us on an exiting task's cold caches, is skipped while it is 0.
#[map]
static UNSHARING_ENTRIES: Array<u64> = Array::with_max_entries(1, 0);

/// `CAP_SYS_ADMIN`: checked by unshare and setns of a namespace and by mount.
const CAP_SYS_ADMIN: i32 = 21;

/// Reports the current task's unshare announced by `cap_capable`, if its netns changed since.
#[inline(always)]
pub(crate) fn flush_unshare() {
    flush_unshare_of(bpf_get_current_pid_tgid());
}

/// [`flush_unshare`] of the current task, known to `UNSHARING` as `pid_tgid` (its id before an
/// exec, when a thread other than the leader execs and takes the leader's).
#[inline(always)]
pub(crate) fn flush_unshare_of(pid_tgid: u64) {
    if !has_entries(&UNSHARING_ENTRIES) {
        return;
    }
    // SAFETY: the entry is copied out before it is removed.
    let Some(unsharing) = (unsafe { UNSHARING.get(pid_tgid) }).copied() else {
        return;
    };
    if UNSHARING.remove(pid_tgid).is_ok() {
        count_entries(&UNSHARING_ENTRIES, u64::MAX);
    }
    let current = current_task();
    // SAFETY: probe reads tolerate any address.
    match unsafe { net_id(task_net(current)) } {
        Some(id) if id.cookie != unsharing.old_cookie => emit_netns_created(
            current,
            origin::UNSHARE,
            unsharing.flags,
            Some(unsharing.ts_ns),
        ),
        Some(_) => {} // the call failed: same namespace
        None => count_unreadable(kind::NETNS_CREATED),
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
        let (call, arg0, arg1, _) = syscall_args();
        match call {
            nr::UNSHARE => {
                // A previous unshare of this task is complete: its namespace is current.
                flush_unshare();
                if arg0 & CLONE_NEWNET != 0 {
                    let unsharing = Unsharing {
                        flags: arg0,
                        old_cookie: current_netns().cookie,
                        ts_ns: bpf_ktime_get_ns(),
                    };
                    match UNSHARING.insert(bpf_get_current_pid_tgid(), unsharing, 0) {
                        Ok(()) => count_entries(&UNSHARING_ENTRIES, 1),
                        Err(_) => count_lost(kind::NETNS_CREATED),
                    }
                }
            }
            nr::SETNS => flush_unshare(),
            nr::MOUNT => {
                flush_unshare();
                let flags: u64 = load(user_regs(), OFF_REGS_R10.load());
                emit_bind_mount(flags, arg0 as *const u8, arg1 as *const u8);
            }
            _ => {}
        }
    }
    0
}

// ---------------------------------------------------------------------------------------------
// unshare with syscall tracepoints (kernels without `cap_capable`)
// ---------------------------------------------------------------------------------------------

/// Flags of unshare calls in flight that asked for a new netns, by pid_tgid.
#[map]
static PENDING_UNSHARE: HashMap<u64, u64> = HashMap::with_max_entries(1024, 0);

#[tracepoint(category = "syscalls", name = "sys_enter_unshare")]
pub fn sys_enter_unshare(ctx: TracePointContext) -> u32 {
    let flags: u64 = syscall_arg(&ctx, 0).unwrap_or(0);
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
    if syscall_ret(&ctx) == 0 {
        emit_netns_created(current_task(), origin::UNSHARE, flags, None);
    }
    0
}
