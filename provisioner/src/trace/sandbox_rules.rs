//! Which network namespaces count as sandboxes.

use std::path::{Path, PathBuf};

/// Why a namespace is treated as a sandbox.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum SandboxReason {
    /// Created by a process whose comm matches a runtime pattern.
    RuntimeCreator { comm: String },
    /// Pinned (bind mounted) under a sandbox directory with a sandbox name prefix.
    Pinned { path: PathBuf },
    /// Named explicitly (`Correlator::expect_sandbox`), e.g. by the daemon for its ADDs.
    Expected,
}

impl std::fmt::Display for SandboxReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RuntimeCreator { comm } => write!(f, "created by runtime process {comm}"),
            Self::Pinned { path } => write!(f, "pinned at {}", path.display()),
            Self::Expected => write!(f, "expected sandbox"),
        }
    }
}

/// The rules; [`Default`] gives the usual runtimes and pin locations.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxRules {
    /// comm patterns of runtime processes; a trailing `*` matches any suffix.
    pub runtime_comms: Vec<String>,
    /// Directories where runtimes pin sandbox namespaces.
    pub pin_dirs: Vec<PathBuf>,
    /// Name prefixes of pinned sandbox namespaces; empty means every name.
    pub pin_prefixes: Vec<String>,
}

impl Default for SandboxRules {
    fn default() -> Self {
        Self {
            runtime_comms: [
                "containerd",
                "containerd-shim*",
                "runc*",
                "crun",
                "crio",
                "conmon",
                "pinns",
                "podman",
                "pause",
            ]
            .map(String::from)
            .to_vec(),
            pin_dirs: vec![PathBuf::from("/run/netns"), PathBuf::from("/var/run/netns")],
            pin_prefixes: vec!["cni-".into(), "netns-".into()],
        }
    }
}

impl SandboxRules {
    /// Rules that only accept explicitly expected namespaces.
    pub fn explicit_only() -> Self {
        Self {
            runtime_comms: Vec::new(),
            pin_dirs: Vec::new(),
            pin_prefixes: Vec::new(),
        }
    }

    /// Whether `comm` is a runtime process.
    pub fn is_runtime_comm(&self, comm: &str) -> bool {
        self.runtime_comms.iter().any(|pattern| {
            pattern
                .strip_suffix('*')
                .map_or(pattern == comm, |prefix| comm.starts_with(prefix))
        })
    }

    /// Whether a pin at `path` marks a sandbox.
    pub fn is_sandbox_pin(&self, path: &Path) -> bool {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return false;
        };
        let name = name.to_string_lossy();
        self.pin_dirs.iter().any(|d| d == dir)
            && (self.pin_prefixes.is_empty()
                || self
                    .pin_prefixes
                    .iter()
                    .any(|p| name.starts_with(p.as_str())))
    }

    /// Whether `path` is under a pin directory at all (any name).
    pub fn is_pin_location(&self, path: &Path) -> bool {
        path.parent()
            .is_some_and(|dir| self.pin_dirs.iter().any(|d| d == dir))
    }
}

/// The process a `/proc/.../ns/net` bind-mount source refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinSource {
    /// `/proc/self/ns/net`, `/proc/thread-self/ns/net`: the mounting task's namespace.
    Caller,
    /// `/proc/<pid>/ns/net` or `/proc/<pid>/task/<tid>/ns/net`.
    Task { pid: u32, tid: Option<u32> },
}

/// Parses the source of a namespace bind mount; `None` when it is not a netns file.
pub fn parse_pin_source(source: &str) -> Option<PinSource> {
    let rest = source.strip_prefix("/proc/")?.strip_suffix("/ns/net")?;
    let mut parts = rest.split('/');
    let first = parts.next()?;
    let (second, third) = (parts.next(), parts.next());
    if parts.next().is_some() {
        return None;
    }
    match (first, second, third) {
        ("self" | "thread-self", None, None) => Some(PinSource::Caller),
        (pid, None, None) => Some(PinSource::Task {
            pid: pid.parse().ok()?,
            tid: None,
        }),
        (pid, Some("task"), Some(tid)) => Some(PinSource::Task {
            pid: pid.parse().ok()?,
            tid: Some(tid.parse().ok()?),
        }),
        ("self", Some("task"), None) | (_, _, _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_patterns() {
        let rules = SandboxRules::default();
        assert!(rules.is_runtime_comm("containerd"));
        assert!(rules.is_runtime_comm("containerd-shim"));
        assert!(rules.is_runtime_comm("runc:[1:CHILD]"));
        assert!(!rules.is_runtime_comm("ip"));
        assert!(!rules.is_runtime_comm("containerd2"));
    }

    #[test]
    fn pins() {
        let rules = SandboxRules::default();
        assert!(rules.is_sandbox_pin(Path::new("/run/netns/cni-1234")));
        assert!(rules.is_sandbox_pin(Path::new("/var/run/netns/netns-ab")));
        assert!(!rules.is_sandbox_pin(Path::new("/run/netns/node")));
        assert!(!rules.is_sandbox_pin(Path::new("/tmp/cni-1")));
        assert!(rules.is_pin_location(Path::new("/run/netns/node")));
    }

    #[test]
    fn pin_sources() {
        assert_eq!(
            parse_pin_source("/proc/self/ns/net"),
            Some(PinSource::Caller)
        );
        assert_eq!(
            parse_pin_source("/proc/12/task/13/ns/net"),
            Some(PinSource::Task {
                pid: 12,
                tid: Some(13)
            })
        );
        assert_eq!(
            parse_pin_source("/proc/12/ns/net"),
            Some(PinSource::Task { pid: 12, tid: None })
        );
        assert_eq!(parse_pin_source("/proc/12/ns/mnt"), None);
        assert_eq!(parse_pin_source("/run/netns"), None);
    }
}
