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
}

impl Sysctl {
    pub(crate) fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
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

/// Writes each sysctl unless it already has the value (read first: no write when not needed).
fn apply(list: &[Sysctl]) -> Vec<(usize, std::io::Error)> {
    let mut errors = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let path = s.path();
        let mut current = String::new();
        let same = std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_string(&mut current))
            .is_ok_and(|_| current.trim() == s.value);
        if same {
            continue;
        }
        if let Err(e) = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(s.value.as_bytes()))
        {
            errors.push((i, e));
        }
    }
    errors
}

/// Applies `list` inside `ns`; reports the first failure.
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
