//! Reading kernel memory: tasks, their namespaces, their saved registers.

use aya_ebpf::helpers::{bpf_probe_read_kernel, generated};
use aya_ebpf::programs::TracePointContext;

use crate::offsets::{
    OFF_NSPROXY_NET_NS, OFF_REGS_DI, OFF_REGS_DX, OFF_REGS_ORIG_AX, OFF_REGS_SI, OFF_TASK_NSPROXY,
};

/// The `T` at `base + offset`, where `base` is a BTF-typed kernel pointer: a BTF tracepoint's
/// or an fentry program's argument, what `bpf_get_current_task_btf` or `bpf_task_pt_regs`
/// return, or a pointer member loaded with this function from one of those. The offsets are
/// constants of the frozen .rodata, so the verifier checks the load against the kernel's BTF
/// and turns it into a fault-tolerant load (0 from a bad address): no helper call, where
/// [`read_field`] costs one.
#[inline(always)]
pub(crate) unsafe fn load<T>(base: *const u8, offset: u32) -> T {
    // SAFETY: see above; the verifier refuses the program if `base` is not BTF-typed.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// The `T` at `base + offset` in kernel memory, for any kernel pointer; `None` for a null
/// `base` or an unreadable address.
#[inline(always)]
pub(crate) unsafe fn read_field<T>(base: *const u8, offset: u32) -> Option<T> {
    if base.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address; a bad one yields an error.
    // `wrapping_add`: the address is only handed to the helper, never dereferenced here.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.ok()
}

/// A member of `struct sock`-like memory at `base`: a BTF-checked load when `BTF` (`base` is
/// a BTF-typed pointer), else through a probe helper.
#[inline(always)]
pub(crate) unsafe fn member<T, const BTF: bool>(base: *const u8, offset: u32) -> Option<T> {
    if BTF {
        if base.is_null() {
            return None;
        }
        // SAFETY: the caller says `base` is BTF-typed.
        Some(unsafe { load(base, offset) })
    } else {
        // SAFETY: probe reads tolerate any address.
        unsafe { read_field(base, offset) }
    }
}

/// The current task, as a plain kernel pointer (its members are read with [`read_field`]):
/// every kernel has this helper, while the BTF-typed one needs Linux 5.11.
#[inline(always)]
pub(crate) fn current_task() -> *const u8 {
    // SAFETY: no preconditions.
    unsafe { aya_ebpf::helpers::bpf_get_current_task() as *const u8 }
}

/// The `struct net` of the network namespace of `task`; null when the task has none any more
/// (exiting) or it cannot be read.
#[inline(always)]
pub(crate) unsafe fn task_net(task: *const u8) -> *const u8 {
    unsafe {
        let nsproxy: *const u8 =
            read_field(task, OFF_TASK_NSPROXY.load()).unwrap_or(core::ptr::null());
        read_field(nsproxy, OFF_NSPROXY_NET_NS.load()).unwrap_or(core::ptr::null())
    }
}

/// Offset of the first syscall argument (and of the return value) in a syscall tracepoint
/// record.
const SYSCALL_ARG0: usize = 16;

/// Argument `n` of a `sys_enter_*` tracepoint record.
#[inline(always)]
pub(crate) fn syscall_arg<T>(ctx: &TracePointContext, n: usize) -> Option<T> {
    // SAFETY: syscall tracepoint records hold 8-byte arguments after a 16-byte preamble.
    unsafe { ctx.read_at::<T>(SYSCALL_ARG0 + 8 * n) }.ok()
}

/// The return value in a `sys_exit_*` tracepoint record (-1 when unreadable).
#[inline(always)]
pub(crate) fn syscall_ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: the return value is the record's first field after its preamble.
    unsafe { ctx.read_at::<i64>(SYSCALL_ARG0) }.unwrap_or(-1)
}

/// The current task's saved user registers (x86_64 `pt_regs`), BTF-typed. Only programs of
/// attach points that appeared after Linux 5.15 use it (`bpf_task_pt_regs`).
#[inline(always)]
pub(crate) unsafe fn user_regs() -> *const u8 {
    unsafe {
        let task = generated::bpf_get_current_task_btf();
        generated::bpf_task_pt_regs(task) as *const u8
    }
}

/// The current task's syscall number and first three arguments, from its saved user
/// registers (see [`user_regs`]).
#[inline(always)]
pub(crate) unsafe fn syscall_args() -> (u64, u64, u64, u64) {
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

/// x86_64 syscall numbers (the capability check and the socket tracepoints tell the syscall
/// from the caller's saved registers).
pub(crate) mod nr {
    pub const SENDTO: u64 = 44;
    pub const RECVFROM: u64 = 45;
    pub const SENDMSG: u64 = 46;
    pub const RECVMSG: u64 = 47;
    pub const MOUNT: u64 = 165;
    pub const UNSHARE: u64 = 272;
    pub const SETNS: u64 = 308;
}

/// Whether the NUL-padded `text` starts with `prefix`.
#[inline(always)]
pub(crate) fn starts_with<const N: usize>(text: &[u8; N], prefix: &[u8]) -> bool {
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

/// Whether the NUL-terminated `text` is exactly `name`.
#[inline(always)]
pub(crate) fn is_exactly<const N: usize>(text: &[u8; N], name: &[u8]) -> bool {
    name.len() < N && starts_with(text, name) && text[name.len()] == 0
}
