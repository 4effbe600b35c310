//! Sysctls under /proc/sys/net, written from a thread inside the target netns.
//!
//! A `/proc/sys/net` file reflects the netns of the thread that opens it, so these are only
//! ever opened on a worker thread that entered the namespace (never the caller's thread).

use std::io::{Read, Write};
use std::path::PathBuf;

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

    /// `/proc/sys/` path; interface names may contain dots, so those keys use `/` already
    /// for the interface part (see [`iface_key`]).
    fn path(&self) -> PathBuf {
        PathBuf::from("/proc/sys").join(self.key.replace('.', "/").replace('\u{1}', "."))
    }
}

/// Builds the key of a per-interface IPv6 sysctl (`net.ipv6.conf.<ifname>.<name>`), keeping
/// dots inside `ifname` intact.
pub(crate) fn iface_key(ifname: &str, name: &str) -> String {
    format!("net.ipv6.conf.{}.{name}", ifname.replace('.', "\u{1}"))
}

/// Writes each sysctl unless it already has the value (read first: no write when not needed;
/// a per-link key is written at once).
fn apply(list: &[Sysctl]) -> Vec<(usize, std::io::Error)> {
    let mut errors = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let path = s.path();
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

/// Applies `list` inside `ns`, on a pooled worker; reports the first failure.
pub(crate) async fn apply_in(ns: &NetnsFile, list: Vec<Sysctl>) -> Result<(), DataplaneError> {
    if list.is_empty() {
        return Ok(());
    }
    let (list, errors) = ns
        .run(move || {
            let errors = apply(&list);
            (list, errors)
        })
        .await?;
    first_failure(ns, &list, errors)
}

/// Applies `list` inside `ns` from the calling thread ([`NetnsFile::run_here`], or directly
/// when the thread is `inside` it already): for a few keys, cheaper than the two thread
/// wake-ups of a pooled worker. A write that needs the rtnl lock while another holds it is
/// restarted by the kernel, not put to sleep.
pub(crate) fn apply_here(
    ns: &NetnsFile,
    list: &[Sysctl],
    inside: bool,
) -> Result<(), DataplaneError> {
    if list.is_empty() {
        return Ok(());
    }
    let errors = if inside {
        apply(list)
    } else {
        ns.run_here(|| apply(list))?
    };
    first_failure(ns, list, errors)
}

fn first_failure(
    ns: &NetnsFile,
    list: &[Sysctl],
    errors: Vec<(usize, std::io::Error)>,
) -> Result<(), DataplaneError> {
    if let Some((i, source)) = errors.into_iter().next() {
        let s = &list[i];
        return Err(DataplaneError::Sysctl {
            key: s.key.replace('\u{1}', "."),
            value: s.value.clone(),
            netns: ns.label().to_owned(),
            source,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_link_key_the_link_does_not_have_is_skipped_any_other_missing_key_fails() {
        let missing = iface_key("no-such-link", "disable_ipv6");
        assert!(apply(&[Sysctl::per_link(missing.clone(), "1")]).is_empty());
        let errors = apply(&[Sysctl::new(missing, "1")]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].1.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn paths() {
        assert_eq!(
            Sysctl::new("net.ipv4.ip_forward", "1").path(),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(
            Sysctl::new(iface_key("eth0.10", "accept_ra"), "0").path(),
            PathBuf::from("/proc/sys/net/ipv6/conf/eth0.10/accept_ra")
        );
    }
}
