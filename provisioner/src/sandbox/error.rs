use crate::dataplane::{CheckFailure, DataplaneError};
use crate::ipam::IpamError;

/// Why an operation on one sandbox failed; each variant names the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("network config: {0}")]
    Config(String),
    #[error("{sandbox}: {source}")]
    Ipam {
        sandbox: String,
        #[source]
        source: IpamError,
    },
    #[error("{sandbox}: {source}")]
    Dataplane {
        sandbox: String,
        #[source]
        source: DataplaneError,
    },
    #[error("{sandbox}: verification after setup failed (rolled back): {source}")]
    Verify {
        sandbox: String,
        #[source]
        source: CheckFailure,
    },
    #[error("{sandbox}: {source}")]
    Check {
        sandbox: String,
        #[source]
        source: CheckFailure,
    },
    #[error("{sandbox}: no allocation (was it ever added?)")]
    NotFound { sandbox: String },
    #[error("{sandbox}: prevResult addresses {claimed} differ from the allocation {allocated}")]
    PrevResultMismatch {
        sandbox: String,
        claimed: String,
        allocated: String,
    },
    #[error("{sandbox}: store worker failed: {reason}")]
    Worker { sandbox: String, reason: String },
}
