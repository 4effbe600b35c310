//! Error types of the dataplane: every error names the operation, the object and the netns.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// The steps of [`crate::dataplane::Dataplane::setup`], in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetupStep {
    /// Open the sandbox netns and create the netlink socket inside it.
    SandboxNetns,
    /// Check that neither interface name exists yet.
    CheckNames,
    /// Create the veth pair (sandbox end directly in the sandbox netns).
    CreateVeth,
    /// Forwarding in the host netns; `accept_ra`/`accept_dad` on the new interfaces (v6).
    Sysctl,
    /// The gateway as /32 (/128) on the host end.
    HostAddress,
    /// The pod address(es) on the sandbox end.
    SandboxAddress,
    /// Host end, sandbox end and sandbox `lo` up.
    LinkUp,
    /// Host route(s) to the pod address(es).
    HostRoute,
    /// Gateway, subnet, default and configured routes in the sandbox.
    SandboxRoutes,
}

impl SetupStep {
    /// Every step, in execution order.
    pub const ALL: [SetupStep; 9] = [
        SetupStep::SandboxNetns,
        SetupStep::CheckNames,
        SetupStep::CreateVeth,
        SetupStep::Sysctl,
        SetupStep::HostAddress,
        SetupStep::SandboxAddress,
        SetupStep::LinkUp,
        SetupStep::HostRoute,
        SetupStep::SandboxRoutes,
    ];
}

impl fmt::Display for SetupStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            SetupStep::SandboxNetns => "sandbox-netns",
            SetupStep::CheckNames => "check-names",
            SetupStep::CreateVeth => "create-veth",
            SetupStep::Sysctl => "sysctl",
            SetupStep::HostAddress => "host-address",
            SetupStep::SandboxAddress => "sandbox-address",
            SetupStep::LinkUp => "link-up",
            SetupStep::HostRoute => "host-route",
            SetupStep::SandboxRoutes => "sandbox-routes",
        };
        f.write_str(name)
    }
}

/// Errors of the dataplane.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// The spec is not usable (checked before anything is created).
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(String),

    /// Opening a netns path failed.
    #[error("open netns {netns}: {source}{}", privilege_hint(.netns, .source))]
    OpenNetns {
        netns: String,
        #[source]
        source: io::Error,
    },

    /// The netns path of a sandbox is not a sandbox's network namespace.
    #[error("netns {netns} refused: {reason}")]
    BadNetns {
        netns: String,
        reason: crate::nsfs::BadNetns,
    },

    /// A thread could not enter the netns (e.g. the path is not a netns).
    #[error("enter netns {netns}: {source}")]
    EnterNetns {
        netns: String,
        #[source]
        source: io::Error,
    },

    /// Creating the netlink socket (or its tokio registration) failed.
    #[error("create netlink socket in netns {netns}: {source}")]
    Socket {
        netns: String,
        #[source]
        source: io::Error,
    },

    /// A netlink request failed (kernel NACK or socket error).
    #[error("{op} in netns {netns}: {source}")]
    Netlink {
        op: String,
        netns: String,
        #[source]
        source: io::Error,
    },

    /// The kernel answered something this code does not understand.
    #[error("{op} in netns {netns}: {detail}")]
    Protocol {
        op: String,
        netns: String,
        detail: String,
    },

    /// The kernel did not answer a request in time (its acknowledgement or the end of a dump).
    #[error("{op} in netns {netns}: no answer from the kernel within {after:?}")]
    Timeout {
        op: String,
        netns: String,
        after: std::time::Duration,
    },

    /// A dump kept being interrupted (`NLM_F_DUMP_INTR`) after all retries.
    #[error("{op} in netns {netns}: dump interrupted {attempts} times")]
    DumpInterrupted {
        op: String,
        netns: String,
        attempts: u32,
    },

    /// The interface to be created already exists (CNI: ADD must fail).
    #[error("interface {ifname} already exists in netns {netns}")]
    InterfaceExists { ifname: String, netns: String },

    /// Writing a sysctl failed.
    #[error("write sysctl {setting} ({}) in netns {netns}: {source}", .path.display())]
    Sysctl {
        /// `key=value`, the key dotted.
        setting: String,
        /// The file written (under the dataplane's `/proc/sys`).
        path: PathBuf,
        netns: String,
        #[source]
        source: io::Error,
    },

    /// A setup step failed; everything created before was rolled back.
    #[error("setup of {container_id} failed at step {step}: {source}{}", rollback_suffix(.rollback_errors))]
    Setup {
        container_id: String,
        step: SetupStep,
        #[source]
        source: Box<DataplaneError>,
        /// Errors met while rolling back (empty when the rollback was clean).
        rollback_errors: Vec<DataplaneError>,
    },

    /// Teardown met errors; it went on and reports them all.
    #[error("teardown of {container_id}: {}", join_errors(.errors))]
    Teardown {
        container_id: String,
        errors: Vec<DataplaneError>,
    },

    /// A `setup.<step>.fail` failpoint made the step fail (fault injection, tests only).
    #[error("injected failure after step {0}")]
    Injected(SetupStep),
}

fn rollback_suffix(errors: &[DataplaneError]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!(" (rollback errors: {})", join_errors(errors))
    }
}

fn join_errors(errors: &[DataplaneError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What an `EACCES` on another process's `/proc/<pid>/ns/net` means: the daemon lacks
/// `CAP_SYS_PTRACE` over that process (docs/kubernetes.md says when to add it).
fn privilege_hint(netns: &str, source: &io::Error) -> &'static str {
    let of_another_process = netns
        .strip_prefix("/proc/")
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    if of_another_process && source.kind() == io::ErrorKind::PermissionDenied {
        " (opening another process's namespace needs CAP_SYS_PTRACE)"
    } else {
        ""
    }
}

impl DataplaneError {
    /// A netns file that did not open as a sandbox's namespace, `netns` naming its path.
    pub(crate) fn of_netns_file(netns: String, err: crate::nsfs::NetnsFileError) -> Self {
        match err {
            crate::nsfs::NetnsFileError::Io(source) => DataplaneError::OpenNetns { netns, source },
            crate::nsfs::NetnsFileError::Bad(reason) => DataplaneError::BadNetns { netns, reason },
        }
    }

    /// The errno behind a netlink/io error, if there is one.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            DataplaneError::Netlink { source, .. }
            | DataplaneError::OpenNetns { source, .. }
            | DataplaneError::EnterNetns { source, .. }
            | DataplaneError::Socket { source, .. }
            | DataplaneError::Sysctl { source, .. } => source.raw_os_error(),
            DataplaneError::Setup { source, .. } => source.errno(),
            _ => None,
        }
    }

    /// The step a setup failed at, if this is a setup error.
    #[must_use]
    pub fn setup_step(&self) -> Option<SetupStep> {
        match self {
            DataplaneError::Setup { step, .. } => Some(*step),
            _ => None,
        }
    }
}

/// What [`crate::dataplane::Dataplane::check`] found missing or different; one entry per resource.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckFailure {
    pub problems: Vec<String>,
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "check failed ({} problem(s)): {}",
            self.problems.len(),
            self.problems.join("; ")
        )
    }
}

impl std::error::Error for CheckFailure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_proc_namespace_names_the_missing_capability() {
        let refused = |netns: &str| {
            DataplaneError::OpenNetns {
                netns: netns.to_owned(),
                source: io::Error::from_raw_os_error(libc::EACCES),
            }
            .to_string()
        };
        assert!(
            refused("/proc/4242/ns/net").ends_with("needs CAP_SYS_PTRACE)"),
            "{}",
            refused("/proc/4242/ns/net")
        );
        assert!(!refused("/run/netns/cni-1").contains("PTRACE"));
        assert!(!refused("/proc/self/ns/net").contains("PTRACE"));
        let missing = DataplaneError::OpenNetns {
            netns: "/proc/4242/ns/net".to_owned(),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert!(!missing.to_string().contains("PTRACE"), "{missing}");
    }
}
