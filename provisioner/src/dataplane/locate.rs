//! Finding the sandbox netns of our host veths from the kernel alone (no stored path): a host
//! veth's `IFLA_LINK_NETNSID` names its peer's namespace by its nsid in the host netns, and the
//! host netns tells the nsid of any namespace file it is shown (`RTM_GETNSID` with
//! `NETNSA_FD`). The namespace files of a node are the pins under the runtimes' pin
//! directories and `/proc/<pid>/ns/net` of every process.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};

use super::error::DataplaneError;
use super::link;
use super::netlink::Conn;
use super::netns::{NetnsFile, is_netns};

/// Directories where runtimes pin sandbox network namespaces (containerd, CRI-O, podman, `ip`).
pub const SANDBOX_PIN_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];

/// One path per network namespace of the node: the pins under `pin_dirs` first (a pin outlives
/// the processes of its namespace), then `/proc/<pid>/ns/net` of every process.
#[must_use]
pub fn netns_files(pin_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut consider = |path: PathBuf| {
        if let Ok(meta) = std::fs::metadata(&path)
            && is_netns(&path)
            && seen.insert((meta.dev(), meta.ino()))
        {
            out.push(path);
        }
    };
    for dir in pin_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            consider(entry.path());
        }
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
            {
                consider(entry.path().join("ns/net"));
            }
        }
    }
    out
}

/// The nsid `host` gives the namespace at `path`; `None` when it has none (no link of the
/// host netns points into it).
async fn nsid_of(host: &Conn, path: &Path) -> Result<Option<i32>, DataplaneError> {
    let ns = NetnsFile::open(path)?;
    let fd = u32::try_from(ns.raw_fd()).map_err(|_| DataplaneError::Protocol {
        op: format!("get nsid of {}", path.display()),
        netns: host.netns().to_owned(),
        detail: "negative fd".to_owned(),
    })?;
    let mut msg = NsidMessage::default();
    msg.attributes.push(NsidAttribute::Fd(fd));
    let op = format!("get nsid of {}", path.display());
    let answer = host.get(RouteNetlinkMessage::GetNsId(msg), &op).await?;
    drop(ns);
    let RouteNetlinkMessage::NewNsId(m) = answer else {
        return Err(DataplaneError::Protocol {
            op,
            netns: host.netns().to_owned(),
            detail: format!("unexpected answer {answer:?}"),
        });
    };
    Ok(m.attributes.iter().find_map(|a| match a {
        NsidAttribute::Id(id) if *id >= 0 => Some(*id),
        _ => None,
    }))
}

/// For each host link named in `names`, the namespace file (among `candidates`) of its peer.
/// Links absent from the host, without a peer in another namespace, or whose peer namespace
/// has no file among `candidates`, are left out.
pub(crate) async fn peer_netns(
    host: &Conn,
    names: &[String],
    candidates: &[PathBuf],
) -> Result<HashMap<String, PathBuf>, DataplaneError> {
    let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut by_nsid: HashMap<i32, Vec<String>> = HashMap::new();
    for l in link::all(host).await? {
        if wanted.contains(l.name.as_str())
            && let Some(nsid) = l.peer_netnsid
        {
            by_nsid.entry(nsid).or_default().push(l.name);
        }
    }
    let mut found = HashMap::new();
    for path in candidates {
        if by_nsid.is_empty() {
            break;
        }
        // A namespace may vanish while we look: that one is simply not found.
        let Ok(Some(nsid)) = nsid_of(host, path).await else {
            continue;
        };
        if let Some(links) = by_nsid.remove(&nsid) {
            for name in links {
                found.insert(name, path.clone());
            }
        }
    }
    Ok(found)
}
