//! The kernel watch's verbs: SANDBOXES (its views, filtered), WHY (one pod's sandboxes
//! explained) and KERNEL_WATCH (pause or resume it); each answers an error when tracing is off.

use crate::cni::CniError;

use super::ok;
use crate::daemon::api::{Response, WhyAnswer};
use crate::daemon::kernel_watch::{self, KernelWatch};
use crate::daemon::sandbox_filter::SandboxFilter;
use crate::daemon::state::DaemonState;
use crate::daemon::why::{explain, explain_absent};

/// The sandboxes the kernel watch saw, only those of `pod` and/or of `verdict` when given.
pub(super) fn sandboxes(
    state: &DaemonState,
    pod: Option<String>,
    verdict: Option<&str>,
) -> Response {
    let Some(kernel) = &state.kernel else {
        return tracing_off();
    };
    match SandboxFilter::parse(pod, verdict) {
        Ok(filter) => ok(&kernel.sandboxes(&filter)),
        Err(reason) => CniError::invalid_env(format!("sandboxes: {reason}")).into(),
    }
}

/// What the kernel watch knows of `pod`'s sandboxes, explained.
pub(super) fn why(state: &DaemonState, pod: String) -> Response {
    let Some(kernel) = &state.kernel else {
        return tracing_off();
    };
    let filter = SandboxFilter {
        pod: Some(pod.clone()),
        verdict: None,
    };
    let answer = kernel.sandboxes(&filter);
    let mut sandboxes: Vec<String> = answer.sandboxes.iter().map(explain).collect();
    sandboxes.extend(answer.absent.iter().map(explain_absent));
    ok(&WhyAnswer {
        pod,
        sandboxes,
        tracing_unavailable: answer.tracing_unavailable,
    })
}

/// Pauses or resumes the kernel watch. A resumed watch audits the live sandboxes, as at start:
/// what happened to them while it was paused was not seen.
pub(super) async fn switch(state: &DaemonState, on: bool) -> Response {
    let Some(kernel) = &state.kernel else {
        return tracing_off();
    };
    if !on {
        kernel.pause().await;
    } else if kernel.resume()
        && let Some(active) = state.active()
    {
        kernel_watch::audit_existing(&active.service, "kernel watch resumed").await;
    }
    ok(&serde_json::json!({
        "kernel_watch": if on { "on" } else { "off" },
        "tracing_unavailable": KernelWatch::metrics(kernel).0,
    }))
}

fn tracing_off() -> Response {
    CniError::new(
        CniError::INTERNAL,
        "kernel tracing is off in this daemon (--no-trace)",
    )
    .into()
}
