//! Deterministic host-side interface names.

use sha2::{Digest, Sha256};

pub use crate::names::IFNAME_MAX;

/// Prefix of every host veth provisioner creates; no other plugin uses it, so reconciliation can
/// tell our links from others'.
pub const HOST_IFNAME_PREFIX: &str = "pvn";

/// The host end of the veth of (`container_id`, `ifname`): `"pvn"` + 12 hex digits of
/// sha256("`container_id`/`ifname`"), 15 bytes, the same on every call.
#[must_use]
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{container_id}/{ifname}").as_bytes());
    let mut name = String::with_capacity(IFNAME_MAX);
    name.push_str(HOST_IFNAME_PREFIX);
    for b in digest.iter().take(6) {
        name.push_str(&format!("{b:02x}"));
    }
    name.truncate(IFNAME_MAX);
    name
}

/// Is `name` shaped like a name [`host_ifname`] produces?
#[must_use]
pub fn is_host_ifname(name: &str) -> bool {
    name.len() == IFNAME_MAX
        && name.starts_with(HOST_IFNAME_PREFIX)
        && name[HOST_IFNAME_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Prefix of a retired link's name ("graveyard"). A teardown renames the sandbox end, so that
/// its interface name is free again at once for whoever wires the sandbox next. The host end
/// keeps its name (a rename costs the kernel a re-registration of the link's sysctl tables,
/// ~0.1 ms on a node with a thousand links) until a re-ADD of the same sandbox needs it: setup
/// renames a retired host end out of its way then.
pub const GRAVEYARD_IFNAME_PREFIX: &str = "pvx";

/// Link group (`IFLA_GROUP`) of retired host links, which a teardown moves them to with its
/// last request: the reaper deletes the whole group with one request (`ip link del group N`),
/// so the kernel pays its RCU grace periods once per batch. The value spells "pvx" and is used
/// by nothing else.
pub const GRAVEYARD_GROUP: u32 = 0x0070_7678;

/// The graveyard name of the link with index `index` (unique in its netns while it lives).
#[must_use]
pub fn graveyard_ifname(index: u32) -> String {
    format!("{GRAVEYARD_IFNAME_PREFIX}{index:012x}")
}

/// Is `name` shaped like a name [`graveyard_ifname`] produces? Such a link in the host netns
/// (e.g. left by a crash before the reaper deleted it) is safe to delete: it routes nothing.
#[must_use]
pub fn is_graveyard_ifname(name: &str) -> bool {
    name.len() == IFNAME_MAX
        && name.starts_with(GRAVEYARD_IFNAME_PREFIX)
        && name[GRAVEYARD_IFNAME_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ifname_is_deterministic_and_short() {
        let a = host_ifname("abc", "eth0");
        assert_eq!(a, host_ifname("abc", "eth0"));
        assert_eq!(a.len(), 15);
        assert!(a.starts_with(HOST_IFNAME_PREFIX) && is_host_ifname(&a));
        assert!(a[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(crate::names::ifname(&a).is_ok());
    }

    #[test]
    fn host_ifname_differs_by_id_and_ifname() {
        assert_ne!(host_ifname("abc", "eth0"), host_ifname("abd", "eth0"));
        assert_ne!(host_ifname("abc", "eth0"), host_ifname("abc", "eth1"));
        // "a/b" + "c" vs "a" + "b/c" both hash "a/b/c": documented, ids never contain '/'.
    }

    #[test]
    fn graveyard_names() {
        let g = graveyard_ifname(42);
        assert_eq!(g, "pvx00000000002a");
        assert!(is_graveyard_ifname(&g) && crate::names::ifname(&g).is_ok());
        assert!(is_graveyard_ifname(&graveyard_ifname(u32::MAX)));
        assert!(!is_host_ifname(&g));
        assert!(!is_graveyard_ifname(&host_ifname("abc", "eth0")));
    }
}
