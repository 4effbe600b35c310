//! Mapping operation failures to CNI error codes (see [`crate::cni::CniError`]).

use crate::cni::CniError;
use crate::dataplane::DataplaneError;
use crate::ipam::IpamError;
use crate::sandbox::SandboxError;

use super::api::Response;

pub fn cni_error(err: &SandboxError) -> CniError {
    let msg = err.to_string();
    let code = match err {
        SandboxError::Config(_) => CniError::INVALID_NETWORK_CONFIG,
        SandboxError::Ipam {
            source: IpamError::Exhausted { .. },
            ..
        } => CniError::ADDRESS_EXHAUSTED,
        // The daemon reopens the store once its disk takes writes again.
        SandboxError::Ipam {
            source: IpamError::Unwritable { .. },
            ..
        } => CniError::TRY_AGAIN_LATER,
        SandboxError::Ipam { .. } | SandboxError::Worker { .. } => CniError::INTERNAL,
        SandboxError::Dataplane { source, .. } => dataplane_code(source),
        SandboxError::Verify { .. } => CniError::DATAPLANE_FAILURE,
        SandboxError::Check { .. } | SandboxError::PrevResultMismatch { .. } => {
            CniError::CHECK_FAILED
        }
        SandboxError::NotFound { .. } => CniError::UNKNOWN_CONTAINER,
    };
    CniError::new(code, msg)
}

/// A refusal of the dataplane before any operation ran (e.g. the netns check), with its code.
pub fn dataplane_refusal(err: &DataplaneError) -> CniError {
    CniError::new(dataplane_code(err), err.to_string())
}

fn dataplane_code(err: &DataplaneError) -> u32 {
    match err {
        // The daemon (or the node) is out of file descriptors: nothing is wrong with the
        // sandbox, and the runtime's retry finds descriptors freed by the calls that held them.
        err if matches!(err.errno(), Some(libc::EMFILE | libc::ENFILE)) => {
            CniError::TRY_AGAIN_LATER
        }
        DataplaneError::InterfaceExists { .. } => CniError::INTERFACE_EXISTS,
        DataplaneError::Setup { source, .. } => dataplane_code(source),
        // The runtime's CNI_NETNS names something that is not a sandbox's network namespace.
        DataplaneError::BadNetns { .. } => CniError::INVALID_ENV,
        DataplaneError::OpenNetns { source, .. }
            if source.kind() != std::io::ErrorKind::NotFound =>
        {
            CniError::IO_FAILURE
        }
        DataplaneError::OpenNetns { .. } | DataplaneError::EnterNetns { .. } => {
            CniError::UNKNOWN_CONTAINER
        }
        // The kernel did not answer in time: the runtime's retry may find it answering.
        DataplaneError::Timeout { .. } => CniError::TRY_AGAIN_LATER,
        DataplaneError::InvalidSpec(_) => CniError::INVALID_NETWORK_CONFIG,
        _ => CniError::DATAPLANE_FAILURE,
    }
}

impl From<CniError> for Response {
    fn from(err: CniError) -> Self {
        Response::Error {
            code: err.code,
            msg: err.msg,
            details: err.details,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;
    use crate::dataplane::{CheckFailure, SetupStep};

    const SANDBOX: &str = "sandbox c1 (eth0 in /run/netns/p)";

    fn sandbox() -> String {
        SANDBOX.to_owned()
    }

    fn dataplane(source: DataplaneError) -> SandboxError {
        SandboxError::Dataplane {
            sandbox: sandbox(),
            source,
        }
    }

    fn os_error() -> io::Error {
        io::Error::from_raw_os_error(libc::EPERM)
    }

    fn check_failure() -> CheckFailure {
        CheckFailure {
            problems: vec!["route 0.0.0.0/0 missing".to_owned()],
        }
    }

    /// Every kind of failure gets the code docs/operating.md promises, and the message names the
    /// sandbox (where the failure is about one).
    #[test]
    fn every_failure_maps_to_its_documented_code() {
        let cases: Vec<(SandboxError, u32)> = vec![
            (SandboxError::Config("no network".to_owned()), 7),
            (
                SandboxError::Ipam {
                    sandbox: sandbox(),
                    source: IpamError::Exhausted {
                        key: "c1/eth0".to_owned(),
                        range_sets: vec!["10.0.0.0/30".to_owned()],
                    },
                },
                101,
            ),
            (
                SandboxError::Ipam {
                    sandbox: sandbox(),
                    source: IpamError::Corrupt {
                        path: "/var/lib/p/store".into(),
                        what: "c1".to_owned(),
                        reason: "truncated".to_owned(),
                    },
                },
                100,
            ),
            (
                SandboxError::Worker {
                    sandbox: sandbox(),
                    reason: "panicked".to_owned(),
                },
                100,
            ),
            (
                dataplane(DataplaneError::InterfaceExists {
                    ifname: "eth0".to_owned(),
                    netns: "/run/netns/p".to_owned(),
                }),
                102,
            ),
            (
                dataplane(DataplaneError::Setup {
                    container_id: "c1".to_owned(),
                    step: SetupStep::CheckNames,
                    source: Box::new(DataplaneError::InterfaceExists {
                        ifname: "eth0".to_owned(),
                        netns: "/run/netns/p".to_owned(),
                    }),
                    rollback_errors: vec![],
                }),
                102,
            ),
            (
                dataplane(DataplaneError::Setup {
                    container_id: "c1".to_owned(),
                    step: SetupStep::SandboxNetns,
                    source: Box::new(DataplaneError::OpenNetns {
                        netns: "/run/netns/p".to_owned(),
                        source: io::Error::from_raw_os_error(libc::ENOENT),
                    }),
                    rollback_errors: vec![],
                }),
                3,
            ),
            (
                dataplane(DataplaneError::EnterNetns {
                    netns: "/run/netns/p".to_owned(),
                    source: os_error(),
                }),
                3,
            ),
            (
                dataplane(DataplaneError::InvalidSpec("no address".to_owned())),
                7,
            ),
            (
                dataplane(DataplaneError::Netlink {
                    op: "add address".to_owned(),
                    netns: "/run/netns/p".to_owned(),
                    source: os_error(),
                }),
                104,
            ),
            (
                SandboxError::Verify {
                    sandbox: sandbox(),
                    source: check_failure(),
                },
                104,
            ),
            (
                SandboxError::Check {
                    sandbox: sandbox(),
                    source: check_failure(),
                },
                105,
            ),
            (
                SandboxError::PrevResultMismatch {
                    sandbox: sandbox(),
                    claimed: "10.0.0.9/24".to_owned(),
                    allocated: "10.0.0.2/24".to_owned(),
                },
                105,
            ),
            (SandboxError::NotFound { sandbox: sandbox() }, 3),
        ];
        // Out of file descriptors, wherever it is met: try again later, not "no such netns".
        let out_of_fds = |errno| {
            [
                DataplaneError::OpenNetns {
                    netns: "/run/netns/p".to_owned(),
                    source: io::Error::from_raw_os_error(errno),
                },
                DataplaneError::EnterNetns {
                    netns: "/run/netns/p".to_owned(),
                    source: io::Error::from_raw_os_error(errno),
                },
                DataplaneError::Setup {
                    container_id: "c1".to_owned(),
                    step: SetupStep::SandboxNetns,
                    source: Box::new(DataplaneError::Socket {
                        netns: "/run/netns/p".to_owned(),
                        source: io::Error::from_raw_os_error(errno),
                    }),
                    rollback_errors: vec![],
                },
            ]
        };
        let cases = cases.into_iter().chain(
            [libc::EMFILE, libc::ENFILE]
                .into_iter()
                .flat_map(out_of_fds)
                .map(|e| (dataplane(e), 11)),
        );
        for (err, code) in cases {
            let cni = cni_error(&err);
            assert_eq!(cni.code, code, "{err:?}");
            assert_eq!(cni.msg, err.to_string());
            if !matches!(err, SandboxError::Config(_)) {
                assert!(cni.msg.contains(SANDBOX), "{}", cni.msg);
            }
        }
    }

    #[test]
    fn the_answer_carries_code_message_and_details() {
        let answer = Response::from(CniError::new(104, "add address").with_details("EPERM"));
        match answer {
            Response::Error { code, msg, details } => {
                assert_eq!(
                    (code, msg.as_str(), details.as_str()),
                    (104, "add address", "EPERM")
                );
            }
            other => panic!("not an error answer: {other:?}"),
        }
    }
}
