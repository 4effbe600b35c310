//! A CRI (v1) client over a runtime's unix socket: the few read-only calls that name a
//! sandbox's pod. Every call is bounded by its caller.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use provisioner_cri::v1 as cri;
use provisioner_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use super::netns::netns_path_from_info;

pub use provisioner_cri::v1::{PodSandbox, PodSandboxState};

/// Why a CRI call gave no answer.
#[derive(Debug)]
pub enum CriError {
    /// Nothing answered on the socket (missing, refused, closed, not gRPC).
    Unreachable(String),
    /// The runtime answered the call with an error.
    Refused { call: &'static str, message: String },
}

impl std::fmt::Display for CriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(detail) => write!(f, "no answer: {detail}"),
            Self::Refused { call, message } => write!(f, "{call} refused: {message}"),
        }
    }
}

fn call_error(call: &'static str, status: tonic::Status) -> CriError {
    match status.code() {
        // tonic's code for a connection that failed under the call.
        tonic::Code::Unavailable => CriError::Unreachable(status.to_string()),
        _ => CriError::Refused {
            call,
            message: status.message().to_owned(),
        },
    }
}

/// One connection to a runtime's CRI socket.
#[derive(Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
}

impl CriClient {
    /// Connects to `socket` (the HTTP/2 connection is made here, so a missing or dead socket
    /// fails at once).
    pub async fn connect(socket: &Path) -> Result<Self, CriError> {
        let path: PathBuf = socket.to_path_buf();
        // The URI is required by tonic and unused: the connector below dials the socket.
        let channel = Endpoint::from_static("http://[::]:0")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| CriError::Unreachable(transport_detail(&e)))?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel),
        })
    }

    /// The runtime's name as it reports itself (`Version`).
    pub async fn runtime_name(&mut self) -> Result<String, CriError> {
        let answer = self
            .runtime
            .version(cri::VersionRequest::default())
            .await
            .map_err(|s| call_error("Version", s))?;
        Ok(answer.into_inner().runtime_name)
    }

    /// Every sandbox the runtime knows, ready or not (`ListPodSandbox`).
    pub async fn sandboxes(&mut self) -> Result<Vec<PodSandbox>, CriError> {
        let answer = self
            .runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .map_err(|s| call_error("ListPodSandbox", s))?;
        Ok(answer.into_inner().items)
    }

    /// The network namespace path of sandbox `id`, from its verbose status; `Ok(None)` when
    /// it has none of its own.
    pub async fn sandbox_netns(&mut self, id: &str) -> Result<Option<PathBuf>, CriError> {
        let answer = self
            .runtime
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: true,
            })
            .await
            .map_err(|s| call_error("PodSandboxStatus", s))?;
        netns_path_from_info(&answer.into_inner().info).map_err(|message| CriError::Refused {
            call: "PodSandboxStatus",
            message,
        })
    }
}

/// A transport error with its causes (tonic's own text is only "transport error").
fn transport_detail(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
