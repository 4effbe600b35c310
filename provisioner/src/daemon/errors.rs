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
