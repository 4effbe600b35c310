//! The sandbox verbs, ADD, DEL and CHECK: the request admitted (its names and netns checked
//! before anything is allocated), the verb run on the network in force, its outcome logged
//! with the pod and counted in the operation metrics.

use std::sync::Arc;

use ipnetwork::IpNetwork;

use crate::cni::{CniError, CniResult, CniVersion};
use crate::daemon::api::{Response, SandboxRequest};
use crate::daemon::errors::{cni_error, dataplane_refusal};
use crate::daemon::state::{Active, DaemonState};
use crate::dataplane::{BadNetns, DataplaneError};
use crate::metrics::Operation;
use crate::names;
use crate::pod::Pod;
use crate::sandbox::{SandboxError, SandboxRef};

use super::super::options::Limits;
use super::claim::claim_mismatch;
use super::operation::in_operation;

/// A sandbox verb.
#[derive(Clone, Copy)]
pub(super) enum SandboxVerb {
    Add,
    Del,
    Check,
}

impl SandboxVerb {
    fn name(self) -> &'static str {
        match self {
            SandboxVerb::Add => "ADD",
            SandboxVerb::Del => "DEL",
            SandboxVerb::Check => "CHECK",
        }
    }

    fn operation(self) -> Operation {
        match self {
            SandboxVerb::Add => Operation::Add,
            SandboxVerb::Del => Operation::Del,
            SandboxVerb::Check => Operation::Check,
        }
    }
}

/// Admits `req`, runs `op` on it within the operation deadline, and counts the outcome.
pub(super) async fn serve(
    state: &Arc<DaemonState>,
    limits: &Limits,
    mut req: SandboxRequest,
    op: SandboxVerb,
) -> Response {
    let started = std::time::Instant::now();
    // Stored and logged: held to what the plugin's own parsing of CNI_ARGS lets through.
    req.pod = req.pod.and_then(Pod::sanitized);
    let response = match admit(state, limits, &req, op).await {
        Err(refused) => refused,
        Ok(()) => {
            let what = format!(
                "{} of container {:?} ifname {:?}",
                op.name(),
                req.container_id,
                req.ifname
            );
            in_operation(state, limits, what, move |active| async move {
                run(&active, req, op).await
            })
            .await
        }
    };
    let result = match &response {
        Response::Ok { .. } => "ok".to_owned(),
        Response::Error { code, .. } => code.to_string(),
    };
    state
        .metrics
        .observe(op.operation(), &result, started.elapsed());
    response
}

/// What is checked before anything is allocated or touched: the names of an ADD or CHECK
/// (code 4, they are the runtime's `CNI_CONTAINERID` and `CNI_IFNAME`) and the netns path (a
/// network namespace, not the node's nor the daemon's own: code 4; missing: 3). DEL tolerates
/// a path that is gone or not a namespace any more (its teardown skips the sandbox side), never
/// the node's netns.
async fn admit(
    state: &Arc<DaemonState>,
    limits: &Limits,
    req: &SandboxRequest,
    op: SandboxVerb,
) -> Result<(), Response> {
    names::sandbox(&req.container_id, &req.ifname).map_err(|err| {
        Response::from(CniError::invalid_env(format!(
            "{} refused: {err}",
            op.name()
        )))
    })?;
    let Some(netns) = req.netns.clone() else {
        return match op {
            SandboxVerb::Del => Ok(()),
            SandboxVerb::Add | SandboxVerb::Check => Err(CniError::invalid_env(format!(
                "{} of container {} needs a network namespace path",
                op.name(),
                req.container_id
            ))
            .into()),
        };
    };
    // A path on a hung filesystem must not hold the caller either.
    let checked = tokio::time::timeout(
        limits.operation_deadline,
        state.dataplane.check_sandbox_netns(&netns),
    )
    .await
    .map_err(|_| {
        Response::from(CniError::try_again_later(format!(
            "{} of container {}: netns {} not inspected within {:?}",
            op.name(),
            req.container_id,
            netns.display(),
            limits.operation_deadline
        )))
    })?;
    match checked {
        Ok(()) => Ok(()),
        Err(err) => refuse_netns(req, op, &err),
    }
}

/// The answer to a netns that failed its check: a refusal, but for a DEL whose path is gone or
/// no namespace any more.
fn refuse_netns(
    req: &SandboxRequest,
    op: SandboxVerb,
    err: &DataplaneError,
) -> Result<(), Response> {
    let fatal = match op {
        SandboxVerb::Add | SandboxVerb::Check => true,
        SandboxVerb::Del => matches!(
            err,
            DataplaneError::BadNetns {
                reason: BadNetns::NotASandbox(_),
                ..
            }
        ),
    };
    if !fatal {
        return Ok(());
    }
    tracing::warn!(container = %req.container_id, error = %err, op = op.name(), "refused before allocating");
    let mut refused = dataplane_refusal(err);
    refused.msg = format!(
        "{} of container {}: {}",
        op.name(),
        req.container_id,
        refused.msg
    );
    Err(refused.into())
}

/// `op` on the network in force, once the request's network claim is checked against it.
async fn run(active: &Active, req: SandboxRequest, op: SandboxVerb) -> Response {
    if let Some(mismatch) = claim_mismatch(active.service.network(), req.network.as_ref()) {
        // DEL is keyed by (container id, ifname) alone: a runtime tearing down with the config
        // cached at ADD time (before a PodCIDR change) must still get its sandbox removed.
        if !matches!(op, SandboxVerb::Del) {
            return mismatch;
        }
        tracing::warn!(container = %req.container_id, "DEL with a network config that differs from the loaded one: served anyway");
    }
    let sandbox = SandboxRef {
        container_id: req.container_id.clone(),
        ifname: req.ifname.clone(),
        netns: req.netns.clone(),
        pod: req.pod.clone(),
    };
    match op {
        SandboxVerb::Add => add(active, &req, &sandbox).await,
        SandboxVerb::Del => del(active, &req, &sandbox).await,
        SandboxVerb::Check => check(active, &req, &sandbox).await,
    }
}

async fn add(active: &Active, req: &SandboxRequest, sandbox: &SandboxRef) -> Response {
    let (pod, container) = (req.pod.as_ref(), Some(req.container_id.as_str()));
    match active.service.add(sandbox).await {
        Ok(outcome) => {
            let who = crate::pod::describe(pod);
            crate::pod_event!(tracing::Level::INFO, pod, container,
                container = %req.container_id, ifname = %req.ifname,
                addresses = ?outcome.allocation.ips.iter().map(|i| i.address.to_string()).collect::<Vec<_>>(),
                "ADD {who}: added");
            Response::Ok {
                result: outcome.cni_result().to_json(CniVersion::LATEST),
            }
        }
        Err(err) => failed(SandboxVerb::Add, req, pod, &err),
    }
}

async fn del(active: &Active, req: &SandboxRequest, sandbox: &SandboxRef) -> Response {
    let (pod, container) = (req.pod.as_ref(), Some(req.container_id.as_str()));
    match active.service.del(sandbox).await {
        Ok(outcome) => {
            // A DEL without CNI_ARGS names the pod its ADD recorded.
            let pod = pod.or_else(|| outcome.released.as_ref()?.pod.as_ref());
            let who = crate::pod::describe(pod);
            crate::pod_event!(tracing::Level::INFO, pod, container,
                container = %req.container_id, ifname = %req.ifname,
                released = outcome.released.is_some(), "DEL {who}: deleted");
            Response::Ok {
                result: serde_json::Value::Null,
            }
        }
        Err(err) => failed(SandboxVerb::Del, req, pod, &err),
    }
}

/// CHECK: the sandbox against what the daemon holds, and against the addresses of the
/// previous result when the runtime gives one.
async fn check(active: &Active, req: &SandboxRequest, sandbox: &SandboxRef) -> Response {
    let (pod, container) = (req.pod.as_ref(), Some(req.container_id.as_str()));
    let claimed = match req
        .prev_result
        .as_ref()
        .map(CniResult::from_json)
        .transpose()
    {
        Ok(prev) => prev.map(|prev| {
            prev.ips
                .iter()
                .map(|ip| ip.address)
                .collect::<Vec<IpNetwork>>()
        }),
        Err(err) => return err.into(),
    };
    match active.service.check(sandbox, claimed.as_deref()).await {
        Ok(allocation) => {
            let pod = pod.or(allocation.pod.as_ref());
            let who = crate::pod::describe(pod);
            crate::pod_event!(tracing::Level::DEBUG, pod, container,
                container = %req.container_id, ifname = %req.ifname, "CHECK {who}: ok");
            Response::Ok {
                result: serde_json::Value::Null,
            }
        }
        Err(err) => failed(SandboxVerb::Check, req, pod, &err),
    }
}

/// The answer to `op` that failed, logged with the pod the request names.
fn failed(
    op: SandboxVerb,
    req: &SandboxRequest,
    pod: Option<&Pod>,
    err: &SandboxError,
) -> Response {
    let (who, verb) = (crate::pod::describe(pod), op.name());
    crate::pod_event!(tracing::Level::WARN, pod, Some(req.container_id.as_str()),
        container = %req.container_id, ifname = %req.ifname, error = %err,
        "{verb} {who}: failed");
    cni_error(err).into()
}
