//! Sysctls under `<proc-sys>/net`, written from a thread inside the target netns.
//!
//! A `/proc/sys/net` file reflects the netns of the thread that opens it, also where it is
//! bind-mounted elsewhere (the host's `/proc/sys/net` mounted writable into a container whose
//! own `/proc/sys` is read-only), so these are only ever opened on a thread that entered the
//! namespace. The root they are opened under is the dataplane's (see
//! [`super::Dataplane::open`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::DataplaneError;
use super::netns::NetnsFile;

/// One `key=value` write, key in dotted form (`net.ipv4.ip_forward`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sysctl {
    pub key: String,
    pub value: String,
    /// A key of one new link: written without reading it first, and skipped when the link
    /// has no such key (a link without IPv6 has no `net.ipv6.conf.<link>` keys).
    pub per_link: bool,
}

impl Sysctl {
    pub(crate) fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            per_link: false,
        }
    }

    /// A key of a link just created (see [`Sysctl::per_link`]).
    pub(crate) fn per_link(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            per_link: true,
            ..Self::new(key, value)
        }
    }

    /// The key's file under `root` (the `/proc/sys` in use); interface names may contain
    /// dots, so those keys use `/` already for the interface part (see [`iface_key`]).
    fn path(&self, root: &Path) -> PathBuf {
        root.join(self.key.replace('.', "/").replace('\u{1}', "."))
    }
}

/// Builds the key of a per-interface IPv6 sysctl (`net.ipv6.conf.<ifname>.<name>`), keeping
/// dots inside `ifname` intact.
pub(crate) fn iface_key(ifname: &str, name: &str) -> String {
    format!("net.ipv6.conf.{}.{name}", ifname.replace('.', "\u{1}"))
}

/// Writes each sysctl unless it already has the value (read first: no write when not needed;
/// a per-link key is written at once).
fn apply(root: &Path, list: &[Sysctl]) -> Vec<(usize, std::io::Error)> {
    let mut errors = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let path = s.path(root);
        let mut current = String::new();
        let same = !s.per_link
            && std::fs::File::open(&path)
                .and_then(|mut f| f.read_to_string(&mut current))
                .is_ok_and(|_| current.trim() == s.value);
        if same {
            continue;
        }
        match std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(s.value.as_bytes()))
        {
            Ok(()) => {}
            Err(e) if s.per_link && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push((i, e)),
        }
    }
    errors
}

/// Applies `list` under `root` inside `ns`, on a pooled worker; reports the first failure.
pub(crate) async fn apply_in(
    ns: &NetnsFile,
    root: &Arc<Path>,
    list: Vec<Sysctl>,
) -> Result<(), DataplaneError> {
    if list.is_empty() {
        return Ok(());
    }
    let worker_root = Arc::clone(root);
    let (list, errors) = ns
        .run(move || {
            let errors = apply(&worker_root, &list);
            (list, errors)
        })
        .await?;
    first_failure(ns, root, &list, errors)
}

/// Applies `list` inside `ns` from the calling thread ([`NetnsFile::run_here`], or directly
/// when the thread is `inside` it already): for a few keys, cheaper than the two thread
/// wake-ups of a pooled worker. A write that needs the rtnl lock while another holds it is
/// restarted by the kernel, not put to sleep.
pub(crate) fn apply_here(
    ns: &NetnsFile,
    root: &Path,
    list: &[Sysctl],
    inside: bool,
) -> Result<(), DataplaneError> {
    if list.is_empty() {
        return Ok(());
    }
    let errors = if inside {
        apply(root, list)
    } else {
        ns.run_here(|| apply(root, list))?
    };
    first_failure(ns, root, list, errors)
}

fn first_failure(
    ns: &NetnsFile,
    root: &Path,
    list: &[Sysctl],
    errors: Vec<(usize, std::io::Error)>,
) -> Result<(), DataplaneError> {
    if let Some((i, source)) = errors.into_iter().next() {
        let s = &list[i];
        return Err(DataplaneError::Sysctl {
            setting: format!("{}={}", s.key.replace('\u{1}', "."), s.value),
            path: s.path(root),
            netns: ns.label().to_owned(),
            source,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::dataplane::DEFAULT_PROC_SYS as PROC_SYS;

    #[test]
    fn a_per_link_key_the_link_does_not_have_is_skipped_any_other_missing_key_fails() {
        let root = Path::new(PROC_SYS);
        let missing = iface_key("no-such-link", "disable_ipv6");
        assert!(apply(root, &[Sysctl::per_link(missing.clone(), "1")]).is_empty());
        let errors = apply(root, &[Sysctl::new(missing, "1")]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].1.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn paths() {
        let root = Path::new(PROC_SYS);
        assert_eq!(
            Sysctl::new("net.ipv4.ip_forward", "1").path(root),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(
            Sysctl::new(iface_key("eth0.10", "accept_ra"), "0").path(Path::new("/host/proc/sys")),
            PathBuf::from("/host/proc/sys/net/ipv6/conf/eth0.10/accept_ra")
        );
    }

    /// Reads and writes both go under the root given: a key already at its value is not
    /// written, one that differs is, and a failure's error names the file under that root.
    #[test]
    fn reads_and_writes_go_under_the_root_given() -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let ipv4 = root.path().join("net/ipv4");
        std::fs::create_dir_all(&ipv4)?;
        // Written as procfs takes it: from the start of the file, not truncated.
        std::fs::write(ipv4.join("ip_forward"), "0\n")?;
        std::fs::write(ipv4.join("same"), " 1\n")?;
        let list = [
            Sysctl::new("net.ipv4.ip_forward", "1"),
            Sysctl::new("net.ipv4.same", "1"),
        ];
        assert!(apply(root.path(), &list).is_empty());
        assert_eq!(std::fs::read_to_string(ipv4.join("ip_forward"))?, "1\n");
        assert_eq!(std::fs::read_to_string(ipv4.join("same"))?, " 1\n");

        let ns = NetnsFile::current_thread()?;
        let missing = [Sysctl::new("net.ipv6.conf.all.forwarding", "1")];
        let err = apply_here(&ns, root.path(), &missing, true)
            .err()
            .ok_or("a key missing under the root was written")?;
        let real = root.path().join("net/ipv6/conf/all/forwarding");
        assert!(
            err.to_string().contains(&real.display().to_string()),
            "{err}"
        );
        Ok(())
    }
}
