//! What the running kernel's BTF says: the offsets of the struct members the programs read,
//! and which tracepoints and functions it has.
//!
//! rustc emits no CO-RE relocations, so the eBPF programs read members at offsets that are
//! resolved here once at load time and patched into the object as globals.

use std::collections::BTreeMap;
use std::path::Path;

use btf_rs::{Btf, Type};

use crate::trace::TraceError;

const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Which programs need a member: a kernel without one of [`Group::Core`] cannot run the watch;
/// one without a member of another group cannot run the backends that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// Tasks and their namespaces: every program.
    Core,
    /// Sockets and their receive queues: the rtnetlink backends.
    Sockets,
    /// A task's file table (a socket from its fd): the syscall tracepoints of rtnetlink.
    FileTable,
    /// The saved user registers: programs that tell the syscall they run in.
    Registers,
    /// Devices, qdiscs, the namespace's reference count.
    Devices,
    /// The exec'd file and the new environment.
    Execs,
    /// The message of a `netlink_ext_ack`: the fentry backend of error messages.
    Extack,
}

/// Offsets (bytes) the eBPF programs need, named after their `OFF_*` globals; 0 for a member
/// this kernel lacks (see `missing`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub values: Vec<(&'static str, u32)>,
    /// The groups with a member this kernel lacks, and the first such member's error.
    pub missing: BTreeMap<Group, String>,
}

/// Global name, group, struct, member path (anonymous members are searched through; `a|b`
/// tries `a` then `b`, for members renamed or moved between kernel versions).
const WANTED: &[(&str, Group, &str, &str)] = &[
    ("OFF_TASK_NSPROXY", Group::Core, "task_struct", "nsproxy"),
    ("OFF_TASK_TGID", Group::Core, "task_struct", "tgid"),
    (
        "OFF_TASK_REAL_PARENT",
        Group::Core,
        "task_struct",
        "real_parent",
    ),
    ("OFF_TASK_COMM", Group::Core, "task_struct", "comm"),
    ("OFF_NSPROXY_NET_NS", Group::Core, "nsproxy", "net_ns"),
    ("OFF_NET_COOKIE", Group::Core, "net", "net_cookie"),
    ("OFF_NET_NS_INUM", Group::Core, "net", "ns.inum"),
    // The namespace's reference count: in `ns_common` from 5.11 (`count`, then `__ns_ref`),
    // in `struct net` itself before.
    (
        "OFF_NET_NS_REF",
        Group::Devices,
        "net",
        "ns.__ns_ref|ns.count|count",
    ),
    (
        "OFF_SK_FAMILY",
        Group::Sockets,
        "sock",
        "__sk_common.skc_family",
    ),
    ("OFF_SK_PROTOCOL", Group::Sockets, "sock", "sk_protocol"),
    (
        "OFF_SK_NET",
        Group::Sockets,
        "sock",
        "__sk_common.skc_net.net",
    ),
    (
        "OFF_SK_RCVQ_TAIL",
        Group::Sockets,
        "sock",
        "sk_receive_queue.prev",
    ),
    (
        "OFF_SK_RCVQ_LEN",
        Group::Sockets,
        "sock",
        "sk_receive_queue.qlen",
    ),
    ("OFF_SKB_DATA", Group::Sockets, "sk_buff", "data"),
    ("OFF_TASK_FILES", Group::FileTable, "task_struct", "files"),
    ("OFF_FILES_FDT", Group::FileTable, "files_struct", "fdt"),
    ("OFF_FDT_MAX_FDS", Group::FileTable, "fdtable", "max_fds"),
    ("OFF_FDT_FD", Group::FileTable, "fdtable", "fd"),
    (
        "OFF_FILE_PRIVATE_DATA",
        Group::FileTable,
        "file",
        "private_data",
    ),
    ("OFF_SOCKET_SK", Group::FileTable, "socket", "sk"),
    ("OFF_EXTACK_MSG", Group::Extack, "netlink_ext_ack", "_msg"),
    ("OFF_DEV_NAME", Group::Devices, "net_device", "name"),
    ("OFF_DEV_IFINDEX", Group::Devices, "net_device", "ifindex"),
    ("OFF_DEV_FLAGS", Group::Devices, "net_device", "flags"),
    ("OFF_DEV_NET", Group::Devices, "net_device", "nd_net.net"),
    ("OFF_QDISC_OPS", Group::Devices, "Qdisc", "ops"),
    ("OFF_QDISC_PARENT", Group::Devices, "Qdisc", "parent"),
    ("OFF_QDISC_DEV_QUEUE", Group::Devices, "Qdisc", "dev_queue"),
    ("OFF_QDISC_OPS_ID", Group::Devices, "Qdisc_ops", "id"),
    (
        "OFF_NETDEV_QUEUE_DEV",
        Group::Devices,
        "netdev_queue",
        "dev",
    ),
    (
        "OFF_BINPRM_FILENAME",
        Group::Execs,
        "linux_binprm",
        "filename",
    ),
    ("OFF_TASK_MM", Group::Execs, "task_struct", "mm"),
    ("OFF_MM_ENV_START", Group::Execs, "mm_struct", "env_start"),
    ("OFF_MM_ENV_END", Group::Execs, "mm_struct", "env_end"),
    // x86_64 saved user registers: syscall number and arguments.
    ("OFF_REGS_ORIG_AX", Group::Registers, "pt_regs", "orig_ax"),
    ("OFF_REGS_DI", Group::Registers, "pt_regs", "di"),
    ("OFF_REGS_SI", Group::Registers, "pt_regs", "si"),
    ("OFF_REGS_DX", Group::Registers, "pt_regs", "dx"),
    ("OFF_REGS_R10", Group::Registers, "pt_regs", "r10"),
];

impl KernelOffsets {
    /// Resolves every offset from the running kernel's BTF; an error only when a member of
    /// [`Group::Core`] is missing.
    pub fn from_running_kernel() -> Result<Self, TraceError> {
        Self::from_kernel(&KernelBtf::read()?)
    }

    /// [`Self::from_btf`] of `kernel`; an error only when a member of [`Group::Core`] is
    /// missing.
    pub fn from_kernel(kernel: &KernelBtf) -> Result<Self, TraceError> {
        let offsets = Self::from_btf(&kernel.0);
        if let Some(reason) = offsets.missing.get(&Group::Core) {
            return Err(TraceError::MissingMember {
                path: reason.clone(),
                reason: "every program reads it".into(),
            });
        }
        Ok(offsets)
    }

    /// Resolves every offset from `btf`.
    pub fn from_btf(btf: &Btf) -> Self {
        let mut values = Vec::with_capacity(WANTED.len());
        let mut missing = BTreeMap::new();
        for (global, group, structure, paths) in WANTED {
            let mut first_error = None;
            let mut found = None;
            for path in paths.split('|') {
                match member_offset(btf, structure, path) {
                    Ok(offset) => {
                        found = Some(offset);
                        break;
                    }
                    Err(err) => {
                        first_error.get_or_insert(err);
                    }
                }
            }
            if found.is_none() {
                let reason = first_error.map_or_else(
                    || format!("{structure}.{paths}: no candidate"),
                    |e| e.to_string(),
                );
                missing.entry(*group).or_insert(reason);
            }
            values.push((*global, found.unwrap_or(0)));
        }
        Self { values, missing }
    }

    /// Why the programs reading `groups` cannot run here, if they cannot.
    pub fn lacking(&self, groups: &[Group]) -> Option<&str> {
        groups
            .iter()
            .find_map(|g| self.missing.get(g).map(String::as_str))
    }
}

/// The running kernel's BTF (`/sys/kernel/btf/vmlinux`), parsed.
pub struct KernelBtf(Btf);

impl KernelBtf {
    pub fn read() -> Result<Self, TraceError> {
        Btf::from_file(VMLINUX_BTF)
            .map(Self)
            .map_err(|source| TraceError::ReadBtf {
                path: Path::new(VMLINUX_BTF).to_path_buf(),
                source,
            })
    }

    /// Whether the kernel has the BTF tracepoint `name` (its BTF holds `btf_trace_<name>`).
    pub fn has_tracepoint(&self, name: &str) -> bool {
        self.has(&format!("btf_trace_{name}"), |t| {
            matches!(t, Type::Typedef(_))
        })
    }

    /// Whether the kernel has the function `name` (fentry attaches to functions of its BTF).
    pub fn has_function(&self, name: &str) -> bool {
        self.has(name, |t| matches!(t, Type::Func(_)))
    }

    fn has(&self, name: &str, kind: impl Fn(&Type) -> bool) -> bool {
        self.0
            .resolve_types_by_name(name)
            .is_ok_and(|types| types.iter().any(kind))
    }
}

/// Byte offset of `path` (dot separated) inside `struct structure`.
pub fn member_offset(btf: &Btf, structure: &str, path: &str) -> Result<u32, TraceError> {
    let missing = |reason: String| TraceError::MissingMember {
        path: format!("{structure}.{path}"),
        reason,
    };
    let candidates = btf
        .resolve_types_by_name(structure)
        .map_err(|e| missing(e.to_string()))?;
    let mut current = candidates
        .into_iter()
        .find(|t| matches!(t, Type::Struct(s) if !s.members.is_empty()))
        .ok_or_else(|| missing(format!("no struct {structure}")))?;
    let mut bits = 0u32;
    for name in path.split('.') {
        let (member_bits, member_type) =
            find_member(btf, &current, name).map_err(|e| missing(e.clone()))?;
        bits += member_bits;
        current = member_type;
    }
    if !bits.is_multiple_of(8) {
        return Err(missing(format!("member is a bitfield at bit {bits}")));
    }
    Ok(bits / 8)
}

/// Finds `name` in a struct/union, descending into anonymous members; returns its bit offset
/// and its type (typedefs and qualifiers stripped).
fn find_member(btf: &Btf, container: &Type, name: &str) -> Result<(u32, Type), String> {
    let members = match container {
        Type::Struct(s) | Type::Union(s) => &s.members,
        other => return Err(format!("{} is not a struct or union", other.name())),
    };
    for member in members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        let member_type = strip(
            btf,
            btf.resolve_chained_type(member)
                .map_err(|e| e.to_string())?,
        )?;
        if member_name == name {
            return Ok((member.bit_offset(), member_type));
        }
        if member_name.is_empty()
            && matches!(member_type, Type::Struct(_) | Type::Union(_))
            && let Ok((inner, found)) = find_member(btf, &member_type, name)
        {
            return Ok((member.bit_offset() + inner, found));
        }
    }
    Err(format!("no member {name}"))
}

fn strip(btf: &Btf, mut t: Type) -> Result<Type, String> {
    for _ in 0..16 {
        t = match &t {
            Type::Typedef(_)
            | Type::Volatile(_)
            | Type::Const(_)
            | Type::Restrict(_)
            | Type::TypeTag(_) => {
                let inner = t.as_btf_type().ok_or("type without a chained type")?;
                btf.resolve_chained_type(inner).map_err(|e| e.to_string())?
            }
            _ => return Ok(t),
        };
    }
    Err("type chain too long".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_every_wanted_offset_on_this_kernel() -> Result<(), TraceError> {
        let offsets = KernelOffsets::from_running_kernel()?;
        assert_eq!(offsets.values.len(), WANTED.len());
        assert_eq!(offsets.missing, BTreeMap::new());
        // `comm` and `nsproxy` are far into task_struct; 0 would mean a wrong lookup, but for
        // the members that are first in their struct.
        let first_members = [
            "OFF_NSPROXY_NET_NS",
            "OFF_NETDEV_QUEUE_DEV",
            "OFF_FDT_MAX_FDS",
            "OFF_EXTACK_MSG",
        ];
        assert!(
            offsets
                .values
                .iter()
                .all(|(name, off)| *off > 0 || first_members.contains(name)),
            "{:?}",
            offsets.values
        );
        Ok(())
    }

    /// Every `OFF_*` global of the embedded eBPF object is resolved here, and nothing else:
    /// a global left at 0 would read the wrong member, a name here without its global would
    /// make the loader's override fail.
    #[test]
    fn wanted_offsets_are_the_objects_globals() {
        let object = super::super::loader::EBPF_OBJECT;
        let mut in_object: Vec<&str> = object
            .split(|b| *b == 0)
            .filter_map(|name| std::str::from_utf8(name).ok())
            .filter(|name| {
                name.starts_with("OFF_")
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            })
            .collect();
        in_object.sort_unstable();
        in_object.dedup();
        let mut wanted: Vec<&str> = WANTED.iter().map(|(global, ..)| *global).collect();
        wanted.sort_unstable();
        assert_eq!(wanted, in_object);
    }

    #[test]
    fn unknown_member_is_named_in_the_error() {
        let btf = Btf::from_file(VMLINUX_BTF).expect("vmlinux BTF");
        let err = member_offset(&btf, "net", "no_such_member").expect_err("must fail");
        assert!(err.to_string().contains("net.no_such_member"), "{err}");
    }
}
