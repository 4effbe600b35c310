//! Which network namespace a runtime says a sandbox uses, and whether it is one of the files
//! asked about.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The network namespace path in a runtime's verbose `PodSandboxStatus` info: the OCI spec
/// under `info` (containerd and CRI-O both put it there), `runtimeSpec.linux.namespaces`, the
/// one of type `network`. `Ok(None)` when the sandbox has no namespace file of its own (host
/// network, or a runtime spec without a path).
pub fn netns_path_from_info(info: &HashMap<String, String>) -> Result<Option<PathBuf>, String> {
    let raw = info
        .get("info")
        .ok_or_else(|| "its verbose status has no \"info\"".to_owned())?;
    let info: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| format!("its verbose \"info\" is not JSON: {e}"))?;
    let namespaces = info
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| "its verbose \"info\" has no runtimeSpec.linux.namespaces".to_owned())?;
    Ok(namespaces
        .iter()
        .find(|ns| ns["type"] == "network")
        .and_then(|ns| ns["path"].as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from))
}

/// `path` with `/var/run` spelled `/run` (the same directory on every systemd-era node).
pub fn normalize(path: &Path) -> PathBuf {
    match path.strip_prefix("/var/run") {
        Ok(rest) => Path::new("/run").join(rest),
        Err(_) => path.to_path_buf(),
    }
}

/// The namespace files a lookup asks about: their normalised paths, and the (device, inode)
/// of those that exist when the lookup starts.
pub struct Wanted {
    paths: Vec<PathBuf>,
    files: Vec<(u64, u64)>,
}

impl Wanted {
    pub fn new(paths: &[PathBuf]) -> Self {
        Self {
            paths: paths.iter().map(|p| normalize(p)).collect(),
            files: paths
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| (m.dev(), m.ino()))
                .collect(),
        }
    }

    /// Whether `sandbox_netns` (a runtime's path) is one of them: the same path once
    /// normalised, or the same file (device and inode) now.
    pub fn matches(&self, sandbox_netns: &Path) -> bool {
        let path = normalize(sandbox_netns);
        if self.paths.contains(&path) {
            return true;
        }
        !self.files.is_empty()
            && std::fs::metadata(&path).is_ok_and(|m| self.files.contains(&(m.dev(), m.ino())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What containerd 1.6 answered for a NOTREADY sandbox (trimmed to the keys read and a few
    /// around them).
    const CONTAINERD_INFO: &str = r#"{"pid":0,"processStatus":"deleted","netNamespaceClosed":false,"image":"localhost/pause:latest","snapshotKey":"4bf9","snapshotter":"overlayfs","runtimeHandler":"","runtimeType":"io.containerd.runc.v2","runtimeOptions":null,"config":{"metadata":{"name":"seed-0","uid":"uid-seed-0","namespace":"default"}},"runtimeSpec":{"ociVersion":"1.0.2-dev","process":{"args":["/pause"]},"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network","path":"/var/run/netns/cni-1c7d2b7e-0e3b-7c4e-2f4a-4a8f1d4c5e6f"}]}}}"#;

    fn is_one_of(sandbox_netns: &Path, wanted: &[PathBuf]) -> bool {
        Wanted::new(wanted).matches(sandbox_netns)
    }

    fn info(json: &str) -> HashMap<String, String> {
        HashMap::from([("info".to_owned(), json.to_owned())])
    }

    #[test]
    fn the_netns_path_of_a_containerd_sandbox() {
        assert_eq!(
            netns_path_from_info(&info(CONTAINERD_INFO)),
            Ok(Some(PathBuf::from(
                "/var/run/netns/cni-1c7d2b7e-0e3b-7c4e-2f4a-4a8f1d4c5e6f"
            )))
        );
    }

    #[test]
    fn host_network_and_bad_info() {
        let host =
            r#"{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network"}]}}}"#;
        assert_eq!(netns_path_from_info(&info(host)), Ok(None));
        let no_network = r#"{"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"}]}}}"#;
        assert_eq!(netns_path_from_info(&info(no_network)), Ok(None));
        assert!(netns_path_from_info(&HashMap::new()).is_err());
        assert!(netns_path_from_info(&info("{")).is_err());
        assert!(netns_path_from_info(&info(r#"{"pid":1}"#)).is_err());
    }

    #[test]
    fn var_run_is_run() {
        let containerd = Path::new("/var/run/netns/cni-1");
        assert!(is_one_of(
            containerd,
            &[PathBuf::from("/x"), PathBuf::from("/run/netns/cni-1")]
        ));
        assert!(is_one_of(
            Path::new("/run/netns/cni-1"),
            &[PathBuf::from("/var/run/netns/cni-1")]
        ));
        assert!(!is_one_of(containerd, &[PathBuf::from("/run/netns/cni-2")]));
        assert!(!is_one_of(containerd, &[]));
    }

    #[test]
    fn two_names_of_one_file_are_one_namespace() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("ns");
        std::fs::write(&file, b"").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        let other = dir.path().join("other");
        std::fs::write(&other, b"").expect("write");
        assert!(is_one_of(&file, std::slice::from_ref(&link)));
        assert!(!is_one_of(&file, std::slice::from_ref(&other)));
        assert!(!is_one_of(
            &dir.path().join("gone"),
            &[dir.path().join("gone2")]
        ));
        // The namespace of this process under two names.
        let me = PathBuf::from(format!("/proc/{}/ns/net", std::process::id()));
        assert!(is_one_of(Path::new("/proc/self/ns/net"), &[me]));
    }
}
