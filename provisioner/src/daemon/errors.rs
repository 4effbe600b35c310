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

fn dataplane_code(err: &DataplaneError) -> u32 {
    match err {
        DataplaneError::InterfaceExists { .. } => CniError::INTERFACE_EXISTS,
        DataplaneError::Setup { source, .. } => dataplane_code(source),
        DataplaneError::OpenNetns { .. } | DataplaneError::EnterNetns { .. } => {
            CniError::UNKNOWN_CONTAINER
        }
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
