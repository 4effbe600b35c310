//! A do-nothing eBPF program on the hook the tracer pays for on every send of the node
//! (`sock_send_length`): what any program there costs a sendto on this machine, before it does
//! anything (the tracepoint's static call, `bpf_trace_run3`, the run context and RCU around the
//! program, the indirect call). The floor of the tracer's sendto row, as `/bin/true` is the
//! floor of an exec'd plugin.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result};

/// `bpf(2)` commands and the program type (`<linux/bpf.h>`).
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_int = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// The hook of the tracer's program that runs on every send (provisioner-ebpf's
/// `sock_send_length`, a BTF tracepoint; a raw tracepoint program runs behind the same
/// dispatch).
const HOOK: &CStr = c"sock_send_length";
const NAME: &[u8] = b"bench_null_send";

/// `r0 = 0; exit`.
const PROGRAM: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];

/// The program, attached for as long as this lives.
pub struct NullProbe {
    _program: OwnedFd,
    _link: OwnedFd,
}

/// `bpf(cmd, attr)`: the file descriptor it returns.
fn bpf(cmd: libc::c_int, attr: &mut [u64]) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` prefix of the size passed; the kernel
    // reads at most that many bytes and writes nothing back for these commands.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl NullProbe {
    pub fn attach() -> Result<Self> {
        let license = c"GPL";
        // BPF_PROG_LOAD: prog_type, insn_cnt | insns | license | log_level, log_size |
        // log_buf | kern_version, prog_flags | prog_name[16].
        let mut load = [0u64; 8];
        load[0] = u64::from(BPF_PROG_TYPE_RAW_TRACEPOINT) | (PROGRAM.len() as u64) << 32;
        load[1] = PROGRAM.as_ptr() as u64;
        load[2] = license.as_ptr() as u64;
        let mut name = [0u8; 16];
        name[..NAME.len()].copy_from_slice(NAME);
        load[6] = u64::from_le_bytes(name[..8].try_into().unwrap_or_default());
        load[7] = u64::from_le_bytes(name[8..].try_into().unwrap_or_default());
        let program = bpf(BPF_PROG_LOAD, &mut load)
            .context("load a do-nothing raw tracepoint program (BPF_PROG_LOAD)")?;
        // BPF_RAW_TRACEPOINT_OPEN: name | prog_fd, pad | cookie.
        let mut open = [0u64; 3];
        open[0] = HOOK.as_ptr() as u64;
        open[1] = u64::try_from(program.as_raw_fd())?;
        let link = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open).with_context(|| {
            format!(
                "attach a do-nothing program to the {} tracepoint (BPF_RAW_TRACEPOINT_OPEN)",
                HOOK.to_string_lossy()
            )
        })?;
        Ok(Self {
            _program: program,
            _link: link,
        })
    }
}
