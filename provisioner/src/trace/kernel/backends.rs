//! What the kernel watch observes and, for each observation, the attach points kernels offer
//! for it (its backends), in the order they are preferred. Which one a kernel has is read
//! from its BTF and its tracefs when the programs load, never from its version number.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::btf::Group;

/// Something the watch sees of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observation {
    /// Network namespaces created by clone and clone3.
    Clones,
    /// `unshare(CLONE_NEWNET)`, and bind mounts (how namespaces are pinned).
    UnshareAndMounts,
    /// rtnetlink requests and the kernel's answers.
    Rtnetlink,
    /// The kernel's messages about the requests it rejects (extack).
    ErrorMessages,
    /// Devices coming up and going; namespaces going.
    Devices,
    /// Binaries executed, and the CNI call in a plugin's environment.
    Execs,
    /// How a network namespace is identified, in records and from its file.
    NamespaceIds,
}

impl Observation {
    pub const ALL: [Observation; 7] = [
        Observation::Clones,
        Observation::UnshareAndMounts,
        Observation::Rtnetlink,
        Observation::ErrorMessages,
        Observation::Devices,
        Observation::Execs,
        Observation::NamespaceIds,
    ];

    /// The name used on the command line, in metrics and in `provisioner status`.
    pub fn name(self) -> &'static str {
        match self {
            Observation::Clones => "clones",
            Observation::UnshareAndMounts => "unshare_and_mounts",
            Observation::Rtnetlink => "rtnetlink",
            Observation::ErrorMessages => "error_messages",
            Observation::Devices => "devices",
            Observation::Execs => "execs",
            Observation::NamespaceIds => "namespace_ids",
        }
    }
}

impl fmt::Display for Observation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A kind of attach point (or, for [`Observation::NamespaceIds`], of identity).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// BTF tracepoints (`tp_btf`): typed arguments, run only when their event happens.
    BtfTracepoint,
    /// Syscall tracepoints: once any is attached, every syscall of the node takes the kernel's
    /// slow path.
    SyscallTracepoints,
    /// An fentry program on a kernel function.
    Fentry,
    /// The kernel's namespace cookie (`net.net_cookie`, read from a file with
    /// `SO_NETNS_COOKIE`).
    KernelCookie,
    /// `generation << 32 | inode`, counted by the watch's programs (`SO_NETNS_COOKIE` missing).
    InodeGeneration,
}

impl Backend {
    /// The name used on the command line, in metrics and in `provisioner status`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::BtfTracepoint => "btf_tracepoint",
            Backend::SyscallTracepoints => "syscall_tracepoints",
            Backend::Fentry => "fentry",
            Backend::KernelCookie => "kernel_cookie",
            Backend::InodeGeneration => "inode_generation",
        }
    }

    /// What the backend costs the node, in words.
    pub fn cost(self) -> &'static str {
        match self {
            Backend::BtfTracepoint => "runs only when its event happens",
            Backend::SyscallTracepoints => "every syscall of the node takes the slow path",
            Backend::Fentry => "a trampoline on one kernel function",
            Backend::KernelCookie => "no cost",
            Backend::InodeGeneration => {
                "a map lookup per record; cookies are this watch's own, not the kernel's"
            }
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [
            Backend::BtfTracepoint,
            Backend::SyscallTracepoints,
            Backend::Fentry,
            Backend::KernelCookie,
            Backend::InodeGeneration,
        ]
        .into_iter()
        .find(|b| b.name() == name)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One program of the eBPF object and where it attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A BTF tracepoint; the kernel has it when its BTF has `btf_trace_<name>`.
    BtfTracepoint {
        program: &'static str,
        tracepoint: &'static str,
    },
    /// A tracepoint of tracefs (`events/<category>/<name>`).
    Tracepoint {
        program: &'static str,
        category: &'static str,
        name: &'static str,
    },
    /// fentry of a kernel function (its BTF has the function).
    Fentry {
        program: &'static str,
        function: &'static str,
    },
}

impl Attach {
    pub fn program(&self) -> &'static str {
        match self {
            Attach::BtfTracepoint { program, .. }
            | Attach::Tracepoint { program, .. }
            | Attach::Fentry { program, .. } => program,
        }
    }
}

/// One way of making an observation: its programs and the struct members they read.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub backend: Backend,
    pub programs: &'static [Attach],
    pub members: &'static [Group],
}

const fn btf_tp(name: &'static str) -> Attach {
    Attach::BtfTracepoint {
        program: name,
        tracepoint: name,
    }
}

const fn syscall_tp(name: &'static str) -> Attach {
    Attach::Tracepoint {
        program: name,
        category: "syscalls",
        name,
    }
}

/// Programs every backend relies on: a task's exit ends what it had in flight.
pub const ALWAYS: &[Attach] = &[btf_tp("sched_process_exit")];

const CLONES: &[Candidate] = &[Candidate {
    backend: Backend::BtfTracepoint,
    programs: &[btf_tp("task_newtask")],
    members: &[],
}];

const UNSHARE_AND_MOUNTS: &[Candidate] = &[
    Candidate {
        backend: Backend::BtfTracepoint,
        programs: &[btf_tp("cap_capable")],
        members: &[Group::Registers],
    },
    Candidate {
        backend: Backend::SyscallTracepoints,
        programs: &[
            syscall_tp("sys_enter_unshare"),
            syscall_tp("sys_exit_unshare"),
            syscall_tp("sys_enter_mount"),
        ],
        members: &[],
    },
];

const RTNETLINK: &[Candidate] = &[
    Candidate {
        backend: Backend::BtfTracepoint,
        programs: &[btf_tp("sock_send_length"), btf_tp("sock_recv_length")],
        members: &[Group::Sockets, Group::Registers],
    },
    Candidate {
        backend: Backend::SyscallTracepoints,
        programs: &[
            syscall_tp("sys_enter_sendmsg"),
            syscall_tp("sys_exit_sendmsg"),
            syscall_tp("sys_enter_sendto"),
            syscall_tp("sys_exit_sendto"),
            syscall_tp("sys_enter_recvmsg"),
            syscall_tp("sys_exit_recvmsg"),
            syscall_tp("sys_enter_recvfrom"),
            syscall_tp("sys_exit_recvfrom"),
        ],
        members: &[Group::Sockets, Group::FileTable],
    },
];

const ERROR_MESSAGES: &[Candidate] = &[
    Candidate {
        backend: Backend::BtfTracepoint,
        programs: &[btf_tp("netlink_extack")],
        members: &[Group::Registers],
    },
    Candidate {
        backend: Backend::Fentry,
        programs: &[Attach::Fentry {
            program: "netlink_ack",
            function: "netlink_ack",
        }],
        members: &[Group::Extack],
    },
];

const DEVICES: &[Candidate] = &[Candidate {
    backend: Backend::BtfTracepoint,
    programs: &[btf_tp("qdisc_create"), btf_tp("qdisc_destroy")],
    members: &[Group::Devices],
}];

const EXECS: &[Candidate] = &[Candidate {
    backend: Backend::BtfTracepoint,
    programs: &[btf_tp("sched_process_exec")],
    members: &[Group::Execs],
}];

const NAMESPACE_IDS: &[Candidate] = &[
    Candidate {
        backend: Backend::KernelCookie,
        programs: &[],
        members: &[],
    },
    Candidate {
        backend: Backend::InodeGeneration,
        programs: &[],
        members: &[],
    },
];

/// The backends of `observation`, preferred first.
pub fn candidates(observation: Observation) -> &'static [Candidate] {
    match observation {
        Observation::Clones => CLONES,
        Observation::UnshareAndMounts => UNSHARE_AND_MOUNTS,
        Observation::Rtnetlink => RTNETLINK,
        Observation::ErrorMessages => ERROR_MESSAGES,
        Observation::Devices => DEVICES,
        Observation::Execs => EXECS,
        Observation::NamespaceIds => NAMESPACE_IDS,
    }
}

/// Backends chosen by the operator instead of the probe (`--trace-backend`), for a test or a
/// measurement of a backend this kernel would not pick.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendChoices(BTreeMap<Observation, Backend>);

impl BackendChoices {
    pub fn get(&self, observation: Observation) -> Option<Backend> {
        self.0.get(&observation).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `observation=backend`, checked against the observation's candidates.
    pub fn choose(&mut self, choice: &str) -> Result<(), String> {
        let (observation, backend) = choice.split_once('=').ok_or_else(|| {
            format!("{choice:?}: expected OBSERVATION=BACKEND, e.g. rtnetlink=syscall_tracepoints")
        })?;
        let observation = Observation::ALL
            .into_iter()
            .find(|o| o.name() == observation)
            .ok_or_else(|| {
                format!(
                    "{observation:?} is not an observation (one of {})",
                    names(Observation::ALL.iter().map(|o| o.name()))
                )
            })?;
        let offered = candidates(observation);
        let backend = Backend::parse(backend)
            .filter(|b| offered.iter().any(|c| c.backend == *b))
            .ok_or_else(|| {
                format!(
                    "{backend:?} is not a backend of {observation} (one of {})",
                    names(offered.iter().map(|c| c.backend.name()))
                )
            })?;
        self.0.insert(observation, backend);
        Ok(())
    }
}

impl FromStr for BackendChoices {
    type Err = String;

    /// Comma-separated `observation=backend` pairs.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut choices = Self::default();
        for choice in text.split(',').filter(|c| !c.trim().is_empty()) {
            choices.choose(choice.trim())?;
        }
        Ok(choices)
    }
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// What one observation runs on, on this kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservationStatus {
    pub observation: Observation,
    /// `None` when no backend could be attached.
    pub backend: Option<Backend>,
    /// What the backend costs, or why the observation is missing (each backend tried, and why
    /// it could not be used).
    pub detail: String,
}

impl ObservationStatus {
    /// `rtnetlink: syscall_tracepoints (every syscall of the node takes the slow path)`.
    pub fn line(&self) -> String {
        match self.backend {
            Some(backend) => format!("{}: {} ({})", self.observation, backend, self.detail),
            None => format!("{}: unavailable ({})", self.observation, self.detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_observation_has_a_backend_and_names_are_unique() {
        let mut names: Vec<&str> = Observation::ALL.iter().map(|o| o.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Observation::ALL.len());
        for observation in Observation::ALL {
            assert!(!candidates(observation).is_empty(), "{observation}");
        }
    }

    #[test]
    fn choices_are_parsed_and_checked_against_the_candidates() {
        let choices: BackendChoices =
            "rtnetlink=syscall_tracepoints, namespace_ids=inode_generation"
                .parse()
                .expect("valid");
        assert_eq!(
            choices.get(Observation::Rtnetlink),
            Some(Backend::SyscallTracepoints)
        );
        assert_eq!(
            choices.get(Observation::NamespaceIds),
            Some(Backend::InodeGeneration)
        );
        assert_eq!(choices.get(Observation::Devices), None);

        let err = "devices=fentry"
            .parse::<BackendChoices>()
            .expect_err("no such backend");
        assert!(err.contains("btf_tracepoint"), "{err}");
        let err = "disks=fentry"
            .parse::<BackendChoices>()
            .expect_err("no such observation");
        assert!(err.contains("rtnetlink"), "{err}");
        assert!("rtnetlink".parse::<BackendChoices>().is_err());
    }

    #[test]
    fn a_status_line_names_the_backend_and_its_cost_or_why_there_is_none() {
        let running = ObservationStatus {
            observation: Observation::Rtnetlink,
            backend: Some(Backend::SyscallTracepoints),
            detail: Backend::SyscallTracepoints.cost().to_owned(),
        };
        assert_eq!(
            running.line(),
            "rtnetlink: syscall_tracepoints (every syscall of the node takes the slow path)"
        );
        let missing = ObservationStatus {
            observation: Observation::ErrorMessages,
            backend: None,
            detail: "btf_tracepoint: no netlink_extack tracepoint".to_owned(),
        };
        assert!(missing.line().starts_with("error_messages: unavailable ("));
    }
}
