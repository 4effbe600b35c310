//! Execs: every binary executed, and the environment of those that can be a CNI plugin's call.

use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_probe_read_kernel_str_bytes, generated,
};
use aya_ebpf::macros::btf_tracepoint;
use aya_ebpf::programs::BtfTracePointContext;
use provisioner_common::{COMM_LEN, ENV_COPY, Exec, ExecEnv, FILENAME_LEN, kind};

use crate::kernel::{is_exactly, load, read_field, starts_with, task_net};
use crate::netns::flush_unshare_of;
use crate::netns_id::{net_id, or_unknown};
use crate::offsets::{
    OFF_BINPRM_FILENAME, OFF_MM_ENV_END, OFF_MM_ENV_START, OFF_TASK_COMM, OFF_TASK_MM,
    OFF_TASK_REAL_PARENT, OFF_TASK_TGID,
};
use crate::ring::{EVENTS, count_lost, fill_header, wakeup_flags};

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
    // SAFETY: reserved slot; kernel memory is read through probe helpers.
    let (parent_pid, parent_comm, cni_candidate) = unsafe {
        fill_header(&mut (*record).header, kind::EXEC);
        (*record).task_netns = or_unknown(net_id(task_net(task)));
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
            runs_cni_plugins(&(*record).parent_comm) || in_cni_dir(&(*record).filename),
        )
    };
    entry.submit(wakeup_flags());
    if cni_candidate {
        emit_exec_env(task, parent_pid, parent_comm);
    }
    0
}

/// Whether `comm` is a runtime's own process, the one that executes CNI plugins: `containerd`,
/// `crio`, `podman`. Never a shim, runc, crun, conmon or pause: they start containers, whose
/// environments are no business of the watch.
#[inline(always)]
fn runs_cni_plugins(comm: &[u8; COMM_LEN]) -> bool {
    is_exactly(comm, b"containerd") || is_exactly(comm, b"crio") || is_exactly(comm, b"podman")
}

/// Whether `path` is a binary of a usual CNI plugin directory.
#[inline(always)]
fn in_cni_dir(path: &[u8; FILENAME_LEN]) -> bool {
    starts_with(path, b"/opt/cni/bin/")
        || starts_with(path, b"/usr/lib/cni/")
        || starts_with(path, b"/usr/libexec/cni/")
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
