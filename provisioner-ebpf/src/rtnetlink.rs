//! rtnetlink requests, the kernel's answers, and its error messages (extack).
//!
//! Requests and answers are read from the caller's buffers after the call returned (for
//! NETLINK_ROUTE the kernel has processed a request within the send). Two backends:
//! - the socket tracepoints `sock_send_length` and `sock_recv_length` (Linux 6.3), which carry
//!   the socket and cost nothing to other syscalls;
//! - the syscall tracepoints of sendmsg, sendto, recvmsg and recvfrom, for older kernels: the
//!   call's socket is found from its fd at entry and, when it is a NETLINK_ROUTE one, the call
//!   is kept until its exit.
//!
//! The error messages come from the `netlink_extack` tracepoint, or, where the kernel lacks
//! it, from an fentry program on `netlink_ack`, which every rtnetlink answer goes through.

use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes, bpf_probe_read_user, generated,
};
use aya_ebpf::macros::{btf_tracepoint, fentry, map, tracepoint};
use aya_ebpf::maps::{Array, HashMap};
use aya_ebpf::programs::{BtfTracePointContext, FEntryContext, TracePointContext};
use provisioner_common::{
    AF_NETLINK, Extack, MSG_PEEK, NETLINK_COPY, NETLINK_ROUTE, NLMSG_ERROR, NetlinkMsg, kind,
    syscall,
};

use crate::kernel::{current_task, member, nr, read_field, syscall_arg, syscall_args, syscall_ret};
use crate::netns::flush_unshare;
use crate::netns_id::{current_netns, net_id, or_unknown};
use crate::offsets::{
    OFF_EXTACK_MSG, OFF_FDT_FD, OFF_FDT_MAX_FDS, OFF_FILE_PRIVATE_DATA, OFF_FILES_FDT,
    OFF_SK_FAMILY, OFF_SK_NET, OFF_SK_PROTOCOL, OFF_SK_RCVQ_LEN, OFF_SK_RCVQ_TAIL, OFF_SKB_DATA,
    OFF_SOCKET_SK, OFF_TASK_FILES,
};
use crate::ring::{EVENTS, count_entries, count_lost, fill_header, has_entries, wakeup_flags};

/// The first rtnetlink message type (`RTM_NEWLINK`); types come in fours: new, del, get, set.
const RTM_BASE: u16 = 16;

/// Whether `sk` is a NETLINK_ROUTE socket: the only work every send/recv on the node pays
/// with the socket tracepoints (`BTF`: plain loads the verifier checks, no helper call).
#[inline(always)]
unsafe fn is_route_sock<const BTF: bool>(sk: *const u8) -> bool {
    unsafe {
        member::<u16, BTF>(sk, OFF_SK_FAMILY.load()) == Some(AF_NETLINK)
            && member::<u16, BTF>(sk, OFF_SK_PROTOCOL.load()) == Some(NETLINK_ROUTE)
    }
}

/// `sock_send_length(struct sock *sk, int ret, int flags)`: after a send returned.
#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let ret: i32 = ctx.arg(1);
    // SAFETY: `sk` is BTF-typed; registers are read with BTF-checked loads, user memory
    // through probe helpers.
    unsafe {
        if ret < 0 || !is_route_sock::<true>(sk) {
            return 0;
        }
        let (call, fd, arg1, arg2) = syscall_args();
        let (buf, len, call) = match call {
            nr::SENDTO => (arg1 as *const u8, arg2, syscall::SENDTO),
            nr::SENDMSG => match first_iov(arg1 as *const u8) {
                Some((base, len)) => (base, len, syscall::SENDMSG),
                None => return 0,
            },
            _ => return 0,
        };
        on_sent::<true>(sk, i64::from(ret), call, fd, buf, len);
    }
    0
}

/// `sock_recv_length(struct sock *sk, int ret, int flags)`: after a recv returned.
#[btf_tracepoint(function = "sock_recv_length")]
pub fn sock_recv_length(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let ret: i32 = ctx.arg(1);
    let flags: i32 = ctx.arg(2);
    // SAFETY: `sk` is BTF-typed; registers are read with BTF-checked loads, user memory
    // through probe helpers.
    unsafe {
        if ret < 16 || flags as u64 & MSG_PEEK != 0 || !is_route_sock::<true>(sk) {
            return 0;
        }
        let (call, fd, arg1, arg2) = syscall_args();
        let (buf, size, call) = match call {
            nr::RECVFROM => (arg1 as *const u8, arg2, syscall::RECVFROM),
            nr::RECVMSG => match first_iov(arg1 as *const u8) {
                Some((base, len)) => (base, len, syscall::RECVMSG),
                None => return 0,
            },
            _ => return 0,
        };
        on_received::<true>(sk, i64::from(ret), call, fd, buf, size);
    }
    0
}

// ---------------------------------------------------------------------------------------------
// the syscall tracepoint backend
// ---------------------------------------------------------------------------------------------

/// A call on a NETLINK_ROUTE socket between its entry and its exit.
#[derive(Clone, Copy)]
#[repr(C)]
struct NetlinkCall {
    sk: u64,
    /// The caller's (first) buffer and its size.
    buf: u64,
    size: u64,
    fd: u32,
    /// One of `provisioner_common::syscall`.
    call: u32,
}

/// Calls on NETLINK_ROUTE sockets in flight, by pid_tgid.
#[map]
static NETLINK_CALLS: HashMap<u64, NetlinkCall> = HashMap::with_max_entries(1024, 0);

/// Entries in `NETLINK_CALLS` (see `ring::has_entries`): every send and recv exit of the node
/// skips the lookup while it is 0.
#[map]
static NETLINK_CALLS_ENTRIES: Array<u64> = Array::with_max_entries(1, 0);

/// The `struct sock` behind the current task's file descriptor `fd`; null when there is none.
/// A file that is no socket gives a pointer the caller's checks reject, and the call itself
/// fails (ENOTSOCK), so no record follows from it.
#[inline(always)]
unsafe fn sock_of_fd(fd: u64) -> *const u8 {
    let null = core::ptr::null();
    unsafe {
        let files: *const u8 = read_field(current_task(), OFF_TASK_FILES.load()).unwrap_or(null);
        let fdt: *const u8 = read_field(files, OFF_FILES_FDT.load()).unwrap_or(null);
        let max_fds: u32 = read_field(fdt, OFF_FDT_MAX_FDS.load()).unwrap_or(0);
        if fd >= u64::from(max_fds) {
            return null;
        }
        let fds: *const u8 = read_field(fdt, OFF_FDT_FD.load()).unwrap_or(null);
        let file: *const u8 = read_field(fds, (fd * 8) as u32).unwrap_or(null);
        let socket: *const u8 = read_field(file, OFF_FILE_PRIVATE_DATA.load()).unwrap_or(null);
        read_field(socket, OFF_SOCKET_SK.load()).unwrap_or(null)
    }
}

/// Keeps the call of the current task when its fd is a NETLINK_ROUTE socket.
#[inline(always)]
fn enter(ctx: &TracePointContext, call: u32) {
    let Some(fd) = syscall_arg::<u64>(ctx, 0) else {
        return;
    };
    // SAFETY: kernel memory is read through probe helpers, user memory through probe helpers.
    unsafe {
        let sk = sock_of_fd(fd);
        if !is_route_sock::<false>(sk) {
            return;
        }
        let arg1: u64 = syscall_arg(ctx, 1).unwrap_or(0);
        let (buf, size) = match call {
            syscall::SENDTO | syscall::RECVFROM => (arg1, syscall_arg(ctx, 2).unwrap_or(0)),
            _ => match first_iov(arg1 as *const u8) {
                Some((base, len)) => (base as u64, len),
                None => return,
            },
        };
        let flags: u64 = match call {
            syscall::RECVFROM => syscall_arg(ctx, 3).unwrap_or(0),
            syscall::RECVMSG => syscall_arg(ctx, 2).unwrap_or(0),
            _ => 0,
        };
        if flags & MSG_PEEK != 0 {
            return;
        }
        let kept = NetlinkCall {
            sk: sk as u64,
            buf,
            size,
            fd: fd as u32,
            call,
        };
        let pid_tgid = bpf_get_current_pid_tgid();
        // BPF_NOEXIST: counted once; a call left behind by a task is replaced uncounted.
        match NETLINK_CALLS.insert(pid_tgid, kept, 1) {
            Ok(()) => count_entries(&NETLINK_CALLS_ENTRIES, 1),
            Err(_) => {
                if NETLINK_CALLS.insert(pid_tgid, kept, 0).is_err() {
                    count_lost(kind::NETLINK_REQUEST);
                }
            }
        }
    }
}

/// The current task's call kept at its entry, taken out.
#[inline(always)]
fn take_call() -> Option<NetlinkCall> {
    if !has_entries(&NETLINK_CALLS_ENTRIES) {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: the entry is copied out before it is removed.
    let call = (unsafe { NETLINK_CALLS.get(pid_tgid) }).copied()?;
    if NETLINK_CALLS.remove(pid_tgid).is_ok() {
        count_entries(&NETLINK_CALLS_ENTRIES, u64::MAX);
    }
    Some(call)
}

/// Forgets the call the current task has in flight (it is exiting).
#[inline(always)]
pub(crate) fn forget_netlink_call() {
    let _ = take_call();
}

#[inline(always)]
fn exit(ctx: &TracePointContext, sent: bool) {
    let Some(call) = take_call() else {
        return;
    };
    let ret = syscall_ret(ctx);
    let sk = call.sk as *const u8;
    let buf = call.buf as *const u8;
    // SAFETY: the socket was a NETLINK_ROUTE one at entry; kernel memory is read through probe
    // helpers, user memory through probe helpers.
    unsafe {
        if sent {
            on_sent::<false>(sk, ret, call.call, u64::from(call.fd), buf, call.size);
        } else {
            on_received::<false>(sk, ret, call.call, u64::from(call.fd), buf, call.size);
        }
    }
}

#[tracepoint(category = "syscalls", name = "sys_enter_sendmsg")]
pub fn sys_enter_sendmsg(ctx: TracePointContext) -> u32 {
    enter(&ctx, syscall::SENDMSG);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_sendto")]
pub fn sys_enter_sendto(ctx: TracePointContext) -> u32 {
    enter(&ctx, syscall::SENDTO);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_recvmsg")]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    enter(&ctx, syscall::RECVMSG);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_recvfrom")]
pub fn sys_enter_recvfrom(ctx: TracePointContext) -> u32 {
    enter(&ctx, syscall::RECVFROM);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_sendmsg")]
pub fn sys_exit_sendmsg(ctx: TracePointContext) -> u32 {
    exit(&ctx, true);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_sendto")]
pub fn sys_exit_sendto(ctx: TracePointContext) -> u32 {
    exit(&ctx, true);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_recvmsg")]
pub fn sys_exit_recvmsg(ctx: TracePointContext) -> u32 {
    exit(&ctx, false);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_recvfrom")]
pub fn sys_exit_recvfrom(ctx: TracePointContext) -> u32 {
    exit(&ctx, false);
    0
}

// ---------------------------------------------------------------------------------------------
// what both backends record
// ---------------------------------------------------------------------------------------------

/// A send of `ret` bytes from `buf` (`len` bytes there) on the NETLINK_ROUTE socket `sk`.
#[inline(always)]
unsafe fn on_sent<const BTF: bool>(
    sk: *const u8,
    ret: i64,
    call: u32,
    fd: u64,
    buf: *const u8,
    len: u64,
) {
    if ret < 0 {
        return;
    }
    flush_unshare();
    // SAFETY: forwarded from the caller.
    unsafe { emit_netlink::<BTF>(kind::NETLINK_REQUEST, call, fd, sk, buf, len, ret as u64) };
}

/// A receive of `ret` bytes into `buf` (`size` bytes there) on the NETLINK_ROUTE socket `sk`:
/// recorded when the reply starts with an `NLMSG_ERROR` carrying an error (not a bare ACK)
/// that does not answer a get or dump.
#[inline(always)]
unsafe fn on_received<const BTF: bool>(
    sk: *const u8,
    ret: i64,
    call: u32,
    fd: u64,
    buf: *const u8,
    size: u64,
) {
    if ret < 16 || buf.is_null() {
        return;
    }
    // SAFETY: user memory is read through probe helpers.
    unsafe {
        // nlmsghdr (len, type, flags, seq, pid), then an NLMSG_ERROR's error, in one read; a
        // buffer too short for the error gives its type alone (and is no ACK).
        let (msg_len, msg_type, error) = match bpf_probe_read_user::<[u32; 5]>(buf.cast()) {
            Ok(head) => (head[0], head[1] as u16, head[4]),
            Err(_) => match bpf_probe_read_user::<u16>(buf.wrapping_add(4).cast()) {
                Ok(msg_type) => (0, msg_type, u32::MAX),
                Err(_) => return,
            },
        };
        if msg_type != NLMSG_ERROR {
            return;
        }
        // ACKs are not sent: a request's answer is taken when the request is sent (see
        // `queued_answer`; one whose answer was not found then shows as sent). Errors always
        // are: a request's failure is never missed.
        if error == 0 && i64::from(msg_len) == ret {
            return;
        }
        // Nor the errors of gets and dumps (a lookup of what is not there changes nothing).
        if let Ok(request_type) = bpf_probe_read_user::<u16>(buf.wrapping_add(24).cast())
            && ret >= 36
            && is_get_type(request_type)
        {
            return;
        }
        let len = if (ret as u64) < size {
            ret as u64
        } else {
            size
        };
        emit_netlink::<BTF>(kind::NETLINK_REPLY, call, fd, sk, buf, len, len);
    }
}

/// Records the netlink message in `buf` (`len` bytes there; the call moved `sent` in all).
#[inline(always)]
unsafe fn emit_netlink<const BTF: bool>(
    kind: u32,
    call: u32,
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
    // is read as `member` says, user memory through a probe helper.
    let discard = unsafe {
        fill_header(&mut (*record).header, kind);
        (*record).task_netns = current_netns();
        let net = member::<*const u8, BTF>(sk, OFF_SK_NET.load()).unwrap_or(core::ptr::null());
        (*record).sock_netns = or_unknown(net_id(net));
        (*record).syscall = call;
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
        if request && let Some(answer) = queued_answer::<BTF>(sk, &(*record).data, sent) {
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
unsafe fn queued_answer<const BTF: bool>(
    sk: *const u8,
    data: &[u8; NETLINK_COPY],
    sent: u64,
) -> Option<i32> {
    let request_len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
    if u64::from(request_len) != sent {
        return None;
    }
    // SAFETY: `sk` is read as `member` says (the tail is a `struct sk_buff *` member of it,
    // read the same way); the reply's data is read through a probe helper.
    unsafe {
        let queued: u32 = member::<u32, BTF>(sk, OFF_SK_RCVQ_LEN.load())?;
        if queued == 0 {
            return None;
        }
        let tail: *const u8 = member::<*const u8, BTF>(sk, OFF_SK_RCVQ_TAIL.load())?;
        if tail.is_null() {
            return None;
        }
        let reply: *const u8 = member::<*const u8, BTF>(tail, OFF_SKB_DATA.load())?;
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

// ---------------------------------------------------------------------------------------------
// the kernel's error messages
// ---------------------------------------------------------------------------------------------

/// Records the kernel's message `msg` about the request the current task is sending.
#[inline(always)]
fn emit_extack(msg: *const u8) {
    let Some(mut entry) = EVENTS.reserve::<Extack>(0) else {
        count_lost(kind::EXTACK);
        return;
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
    emit_extack(msg);
    0
}

/// Whether the current task is in a send whose first message is a get or dump.
#[inline(always)]
unsafe fn sending_a_get() -> bool {
    unsafe {
        let (call, _, arg1, _) = syscall_args();
        let buf = match call {
            nr::SENDTO => arg1 as *const u8,
            nr::SENDMSG => match first_iov(arg1 as *const u8) {
                Some((base, _)) => base,
                None => return false,
            },
            _ => return false,
        };
        bpf_probe_read_user::<u16>(buf.wrapping_add(4).cast()).is_ok_and(is_get_type)
    }
}

/// `netlink_ack(struct sk_buff *in_skb, struct nlmsghdr *nlh, int err, const struct
/// netlink_ext_ack *extack)`: the answer to every netlink request that asked for one or
/// failed, built in the requester's context; carries the message the kernel set, if any.
#[fentry(function = "netlink_ack")]
pub fn netlink_ack(ctx: FEntryContext) -> i32 {
    let nlh: *const u8 = ctx.arg(1);
    let extack: *const u8 = ctx.arg(3);
    // SAFETY: kernel memory is read through probe helpers.
    let msg = unsafe {
        let Some(msg) = read_field::<*const u8>(extack, OFF_EXTACK_MSG.load()) else {
            return 0;
        };
        // nlmsghdr: len, then type.
        if msg.is_null() || read_field::<u16>(nlh, 4).is_some_and(is_get_type) {
            return 0;
        }
        msg
    };
    emit_extack(msg);
    0
}
