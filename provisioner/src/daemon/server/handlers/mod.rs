//! One handler per verb of the API: the sandbox verbs (ADD, DEL, CHECK: [`sandbox`]), the
//! allocations (GC, LIST: [`allocations`]), the kernel watch's views and switch ([`kernel`]),
//! STATUS here; each verb that touches the network in force runs through [`operation`], within
//! the operation deadline.

mod allocations;
mod claim;
mod kernel;
mod operation;
mod sandbox;

use std::sync::Arc;

use crate::cni::CniError;

use super::options::Limits;
use crate::daemon::api::{Request, Response};
use crate::daemon::state::DaemonState;
use operation::in_operation;
use sandbox::SandboxVerb;

/// The answer to `request`.
pub(super) async fn handle(
    state: &Arc<DaemonState>,
    limits: &Limits,
    request: Request,
) -> Response {
    match request {
        Request::Add(req) => sandbox::serve(state, limits, req, SandboxVerb::Add).await,
        Request::Del(req) => sandbox::serve(state, limits, req, SandboxVerb::Del).await,
        Request::Check(req) => sandbox::serve(state, limits, req, SandboxVerb::Check).await,
        Request::Gc { network, valid } => {
            in_operation(state, limits, "GC".to_owned(), move |active| async move {
                allocations::gc(&active, network.as_ref(), &valid).await
            })
            .await
        }
        Request::Status => ok(&state.status().await),
        Request::List => {
            in_operation(state, limits, "LIST".to_owned(), |active| async move {
                allocations::list(&active).await
            })
            .await
        }
        Request::Sandboxes { pod, verdict } => kernel::sandboxes(state, pod, verdict.as_deref()),
        Request::Why { pod } => kernel::why(state, pod),
        Request::KernelWatch { on } => kernel::switch(state, on).await,
    }
}

/// `value` as a successful answer.
fn ok<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_value(value) {
        Ok(result) => Response::Ok { result },
        Err(err) => CniError::internal(format!("encode answer: {err}")).into(),
    }
}
