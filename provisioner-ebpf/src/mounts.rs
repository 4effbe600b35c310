//! Bind mounts: how `ip netns add` and runtimes pin a namespace. Seen at `cap_capable`
//! (`netns.rs`) where the kernel has it, else with the `mount` syscall tracepoint.

use aya_ebpf::helpers::bpf_probe_read_user_str_bytes;
use aya_ebpf::macros::tracepoint;
use aya_ebpf::programs::TracePointContext;
use provisioner_common::{BindMount, MS_BIND, kind};

use crate::kernel::syscall_arg;
use crate::netns_id::current_netns;
use crate::ring::{EVENTS, count_lost, fill_header, wakeup_flags};

/// A bind mount request (the record carries the caller's netns and the user's paths).
#[inline(always)]
pub(crate) fn emit_bind_mount(flags: u64, source: *const u8, target: *const u8) {
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

/// `mount(dev_name, dir_name, type, flags, data)`
#[tracepoint(category = "syscalls", name = "sys_enter_mount")]
pub fn sys_enter_mount(ctx: TracePointContext) -> u32 {
    let flags: u64 = syscall_arg(&ctx, 3).unwrap_or(0);
    let source: *const u8 = syscall_arg(&ctx, 0).unwrap_or(core::ptr::null());
    let target: *const u8 = syscall_arg(&ctx, 1).unwrap_or(core::ptr::null());
    emit_bind_mount(flags, source, target);
    0
}
