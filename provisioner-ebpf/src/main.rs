//! Kernel side of provisioner's tracer.
//!
//! rustc emits no CO-RE relocations, so the struct member offsets this code needs are globals
//! that userspace resolves from the running kernel's BTF and patches in at load time.
#![no_std]
#![no_main]

use aya_ebpf::{
    Global,
    bindings::BPF_F_NO_PREALLOC,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use provisioner_common::{CLONE_NEWNET, COMM_LEN, EventHeader, NetnsCreated, kind, origin};

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

/// Offset of the first syscall argument (and of the return value) in a syscall tracepoint record.
const SYSCALL_ARG0: usize = 16;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Records that could not be reserved in `EVENTS`, per kind.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Flags of unshare calls in flight that asked for a new netns, by pid_tgid.
#[map]
static PENDING_UNSHARE: HashMap<u64, u64> = HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

#[inline(always)]
fn count_lost(kind: u32) {
    if let Some(counter) = LOST.get_ptr_mut(kind) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
unsafe fn read_field<T>(base: *const u8, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel tolerates any address; a bad one yields an error.
    unsafe { bpf_probe_read_kernel(base.add(offset as usize).cast::<T>()) }.ok()
}

/// Cookie and inode of the network namespace of `task`.
#[inline(always)]
unsafe fn task_netns(task: *const u8) -> Option<(u64, u32)> {
    unsafe {
        let nsproxy: *const u8 = read_field(task, OFF_TASK_NSPROXY.load())?;
        let net: *const u8 = read_field(nsproxy, OFF_NSPROXY_NET_NS.load())?;
        let cookie: u64 = read_field(net, OFF_NET_COOKIE.load())?;
        let inum: u32 = read_field(net, OFF_NET_NS_INUM.load())?;
        Some((cookie, inum))
    }
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

#[inline(always)]
fn emit_netns_created(task: *const u8, origin: u32, flags: u64) {
    // SAFETY: task pointers come from the kernel; reads go through bpf_probe_read_kernel.
    let Some((cookie, inum)) = (unsafe { task_netns(task) }) else {
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
        (*record).netns_cookie = cookie;
        (*record).netns_inum = inum;
        (*record).origin = origin;
        (*record).flags = flags;
        (*record).owner_pid = read_field(task, OFF_TASK_TGID.load()).unwrap_or(0);
        let current = bpf_get_current_task() as *const u8;
        let parent: *const u8 =
            read_field(current, OFF_TASK_REAL_PARENT.load()).unwrap_or(core::ptr::null());
        (*record).parent_pid = read_field(parent, OFF_TASK_TGID.load()).unwrap_or(0);
        (*record).parent_comm = read_field(parent, OFF_TASK_COMM.load()).unwrap_or([0; COMM_LEN]);
    }
    entry.submit(0);
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
        // SAFETY: the current task pointer is only dereferenced through probe reads.
        let current = unsafe { bpf_get_current_task() } as *const u8;
        emit_netns_created(current, origin::UNSHARE, flags);
    }
    0
}

/// `task_newtask(struct task_struct *task, u64 clone_flags)`: runs after the child's
/// namespaces were copied, for clone and clone3 alike.
#[btf_tracepoint(function = "task_newtask")]
pub fn task_newtask(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    let flags: u64 = ctx.arg(1);
    if flags & CLONE_NEWNET != 0 {
        emit_netns_created(task, origin::CLONE, flags);
    }
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
