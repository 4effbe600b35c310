//! Offsets (bytes) of kernel struct members, resolved from the running kernel's BTF by
//! userspace (`provisioner/src/trace/kernel/btf_offsets.rs`) and patched in at load time. A
//! backend whose members a kernel lacks is not attached, so its offsets may stay 0.

use aya_ebpf::Global;

#[unsafe(no_mangle)]
pub(crate) static OFF_TASK_NSPROXY: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_TASK_TGID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_TASK_REAL_PARENT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_TASK_COMM: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_NSPROXY_NET_NS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_NET_COOKIE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_NET_NS_INUM: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_NET_NS_REF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_SK_FAMILY: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_SK_PROTOCOL: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_SK_NET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_SK_RCVQ_TAIL: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_SK_RCVQ_LEN: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_SKB_DATA: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_TASK_FILES: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_FILES_FDT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_FDT_MAX_FDS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_FDT_FD: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_FILE_PRIVATE_DATA: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_SOCKET_SK: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_EXTACK_MSG: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_DEV_NAME: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_DEV_IFINDEX: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_DEV_FLAGS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_DEV_NET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_QDISC_OPS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_QDISC_PARENT: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_QDISC_DEV_QUEUE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_QDISC_OPS_ID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_NETDEV_QUEUE_DEV: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_BINPRM_FILENAME: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_TASK_MM: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_MM_ENV_START: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_MM_ENV_END: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_REGS_ORIG_AX: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_REGS_DI: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_REGS_SI: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_REGS_DX: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static OFF_REGS_R10: Global<u32> = Global::new(0);
