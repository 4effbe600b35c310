//! How records name a network namespace: its cookie and its inode number.
//!
//! The cookie is the namespace's identity (inode numbers are recycled at once). Where the
//! kernel sets `net.net_cookie` when a namespace is created and userspace can read it
//! (`SO_NETNS_COOKIE`, Linux 5.14), records carry that cookie. Elsewhere userspace sets
//! [`NETNS_IDS_FROM_INODES`] and records carry `generation << 32 | inode` instead: the
//! generation of an inode number counts the namespaces created with it since the programs
//! were loaded (0 for one that existed before), kept in [`NETNS_GENERATIONS`], which userspace
//! reads to name a namespace file the same way. An inode number belongs to one live namespace
//! at a time, and every namespace created while the programs run is counted at its creation,
//! so an inode's generation always names the live namespace that holds it.

use aya_ebpf::Global;
use aya_ebpf::macros::map;
use aya_ebpf::maps::HashMap;
use provisioner_common::{NetnsId, kind};

use crate::kernel::{current_task, read_field, task_net};
use crate::offsets::{OFF_NET_COOKIE, OFF_NET_NS_INUM};
use crate::ring::count_lost;

/// 1: name namespaces by inode generation; 0: by the kernel's cookie.
#[unsafe(no_mangle)]
static NETNS_IDS_FROM_INODES: Global<u32> = Global::new(0);

/// Namespaces created with each inode number since the programs were loaded. Preallocated, as
/// every map of tracing programs must be (a map allocating at run time makes older kernels warn
/// on load); userspace sizes it at load, to one entry where records carry the kernel's cookie.
#[map]
static NETNS_GENERATIONS: HashMap<u32, u32> = HashMap::with_max_entries(32_768, 0);

#[inline(always)]
fn from_inodes() -> bool {
    NETNS_IDS_FROM_INODES.load() != 0
}

/// The name of the namespace `net` (any kernel pointer); `None` when it cannot be read.
#[inline(always)]
pub(crate) unsafe fn net_id(net: *const u8) -> Option<NetnsId> {
    // SAFETY: probe reads tolerate any address.
    let inum: u32 = unsafe { read_field(net, OFF_NET_NS_INUM.load()) }?;
    let cookie = if from_inodes() {
        // SAFETY: the value is copied out at once.
        let generation = unsafe { NETNS_GENERATIONS.get(&inum) }
            .copied()
            .unwrap_or(0);
        (u64::from(generation) << 32) | u64::from(inum)
    } else {
        // SAFETY: as above.
        unsafe { read_field(net, OFF_NET_COOKIE.load()) }?
    };
    Some(NetnsId {
        cookie,
        inum,
        _pad: 0,
    })
}

/// Counts the namespace `net` as new (before any record names it).
#[inline(always)]
pub(crate) unsafe fn created(net: *const u8) {
    if !from_inodes() {
        return;
    }
    // SAFETY: probe reads tolerate any address.
    let Some(inum) = (unsafe { read_field::<u32>(net, OFF_NET_NS_INUM.load()) }) else {
        return;
    };
    // SAFETY: the value is copied out at once.
    let generation = unsafe { NETNS_GENERATIONS.get(&inum) }
        .copied()
        .unwrap_or(0);
    // A full map leaves the generation as it is: the namespace is then named like the inode's
    // previous one. Counted as a lost creation: never silent.
    if NETNS_GENERATIONS
        .insert(&inum, &generation.wrapping_add(1).max(1), 0)
        .is_err()
    {
        count_lost(kind::NETNS_CREATED);
    }
}

/// [`net_id`] with zeros for a namespace that cannot be read.
#[inline(always)]
pub(crate) fn or_unknown(id: Option<NetnsId>) -> NetnsId {
    id.unwrap_or_default()
}

/// The namespace of the current task.
#[inline(always)]
pub(crate) fn current_netns() -> NetnsId {
    // SAFETY: probe reads tolerate any address.
    or_unknown(unsafe { net_id(task_net(current_task())) })
}
