//! Kernel struct member offsets read from the running kernel's BTF.
//!
//! rustc emits no CO-RE relocations, so the eBPF programs read members at offsets that are
//! resolved here once at load time and patched into the object as globals.

use std::path::Path;

use btf_rs::{Btf, Type};

use super::TraceError;

const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Offsets (bytes) the eBPF programs need, named after their `OFF_*` globals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub values: Vec<(&'static str, u32)>,
}

/// Global name, struct, member path (anonymous members are searched through; `a|b` tries `a`
/// then `b`, for members renamed between kernel versions).
const WANTED: &[(&str, &str, &str)] = &[
    ("OFF_TASK_NSPROXY", "task_struct", "nsproxy"),
    ("OFF_TASK_TGID", "task_struct", "tgid"),
    ("OFF_TASK_REAL_PARENT", "task_struct", "real_parent"),
    ("OFF_TASK_COMM", "task_struct", "comm"),
    ("OFF_NSPROXY_NET_NS", "nsproxy", "net_ns"),
    ("OFF_NET_COOKIE", "net", "net_cookie"),
    ("OFF_NET_NS_INUM", "net", "ns.inum"),
    ("OFF_NET_NS_REF", "net", "ns.__ns_ref|ns.count"),
    ("OFF_SK_FAMILY", "sock", "__sk_common.skc_family"),
    ("OFF_SK_PROTOCOL", "sock", "sk_protocol"),
    ("OFF_SK_NET", "sock", "__sk_common.skc_net.net"),
    ("OFF_SK_RCVQ_TAIL", "sock", "sk_receive_queue.prev"),
    ("OFF_SK_RCVQ_LEN", "sock", "sk_receive_queue.qlen"),
    ("OFF_SKB_DATA", "sk_buff", "data"),
    ("OFF_DEV_NAME", "net_device", "name"),
    ("OFF_DEV_IFINDEX", "net_device", "ifindex"),
    ("OFF_DEV_FLAGS", "net_device", "flags"),
    ("OFF_DEV_NET", "net_device", "nd_net.net"),
    ("OFF_QDISC_OPS", "Qdisc", "ops"),
    ("OFF_QDISC_PARENT", "Qdisc", "parent"),
    ("OFF_QDISC_DEV_QUEUE", "Qdisc", "dev_queue"),
    ("OFF_QDISC_OPS_ID", "Qdisc_ops", "id"),
    ("OFF_NETDEV_QUEUE_DEV", "netdev_queue", "dev"),
    ("OFF_BINPRM_FILENAME", "linux_binprm", "filename"),
    ("OFF_TASK_MM", "task_struct", "mm"),
    ("OFF_MM_ENV_START", "mm_struct", "env_start"),
    ("OFF_MM_ENV_END", "mm_struct", "env_end"),
    // x86_64 saved user registers: syscall number and arguments.
    ("OFF_REGS_ORIG_AX", "pt_regs", "orig_ax"),
    ("OFF_REGS_DI", "pt_regs", "di"),
    ("OFF_REGS_SI", "pt_regs", "si"),
    ("OFF_REGS_DX", "pt_regs", "dx"),
    ("OFF_REGS_R10", "pt_regs", "r10"),
];

impl KernelOffsets {
    /// Resolves every offset from /sys/kernel/btf/vmlinux.
    pub fn from_running_kernel() -> Result<Self, TraceError> {
        let btf = Btf::from_file(VMLINUX_BTF).map_err(|source| TraceError::ReadBtf {
            path: Path::new(VMLINUX_BTF).to_path_buf(),
            source,
        })?;
        let mut values = Vec::with_capacity(WANTED.len());
        for (global, structure, paths) in WANTED {
            let mut result = None;
            for path in paths.split('|') {
                match member_offset(&btf, structure, path) {
                    Ok(offset) => {
                        result = Some(Ok(offset));
                        break;
                    }
                    Err(err) => {
                        if result.is_none() {
                            result = Some(Err(err));
                        }
                    }
                }
            }
            let offset = result.unwrap_or_else(|| {
                Err(TraceError::MissingMember {
                    path: format!("{structure}.{paths}"),
                    reason: "no candidate".into(),
                })
            })?;
            values.push((*global, offset));
        }
        Ok(Self { values })
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
        // `comm` and `nsproxy` are far into task_struct; 0 would mean a wrong lookup.
        assert!(offsets.values.iter().all(|(name, off)| *off > 0
            || matches!(
                *name,
                "OFF_NSPROXY_NET_NS" | "OFF_FDT_MAX_FDS" | "OFF_NETDEV_QUEUE_DEV"
            )));
        Ok(())
    }

    #[test]
    fn unknown_member_is_named_in_the_error() {
        let btf = Btf::from_file(VMLINUX_BTF).expect("vmlinux BTF");
        let err = member_offset(&btf, "net", "no_such_member").expect_err("must fail");
        assert!(err.to_string().contains("net.no_such_member"), "{err}");
    }
}
