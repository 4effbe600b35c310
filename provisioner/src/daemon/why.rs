//! `provisioner why NAMESPACE/NAME`: for one pod, in a few lines, what the kernel showed of its
//! sandbox's network (the verdict), how (the timeline) and what it means (the diagnosis): what
//! an operator asks after `kubectl describe pod` showed "failed to find network info for
//! sandbox".

use std::fmt::Write as _;

use crate::pod::PodName;
use crate::trace::render::intent_line;
use crate::trace::{IntentStatus, Verdict};

use super::kernel_watch::{AbsentSandbox, SandboxView};

/// The explanation of one sandbox of a pod: one line per part, each [escaped] (the names in
/// it come from the kernel, a runtime or a socket caller).
///
/// [escaped]: crate::text::escaped
pub fn explain(view: &SandboxView) -> String {
    let mut head = match view.pod() {
        Some(pod @ PodName::Known { source, .. }) => format!("{pod}, named by {source}"),
        Some(pod) => pod.to_string(),
        None => crate::pod::describe(None),
    };
    if let Some(container) = &view.container_id {
        let _ = write!(head, ", container {container}");
    }
    let mut lines = vec![head];
    if let Some(v) = &view.verdict {
        lines.push(format!(
            "  verdict: {} (netns cookie={} inode={}, created by {}; evidence: {}): {}",
            v.verdict.as_str().to_uppercase(),
            v.netns.cookie,
            v.netns.inode,
            v.creator,
            v.evidence,
            v.reason
        ));
    } else {
        lines.push("  verdict: none yet".to_owned());
    }
    if let Some(i) = &view.intent {
        let pod = view.pod().and_then(PodName::known);
        lines.push(format!("  {}", intent_line(i, pod)));
    }
    if let Some(removed) = &view.removed {
        lines.push(format!(
            "  removed by {} at {}: addresses [{}] released",
            removed.by.to_uppercase(),
            removed.at,
            removed.addresses.join(", ")
        ));
    }
    if let Some(v) = &view.verdict
        && !v.timeline.is_empty()
    {
        lines.push("  timeline:".to_owned());
        lines.extend(v.timeline.iter().map(|entry| format!("    {entry}")));
    }
    lines.extend(view.drifts.iter().map(|d| format!("  drift: {}", d.what)));
    lines.push(format!("  diagnosis: {}", diagnosis(view)));
    lines
        .iter()
        .map(|line| crate::text::escaped(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An absent sandbox of a pod (found at start without its namespace).
pub fn explain_absent(absent: &AbsentSandbox) -> String {
    let head = format!(
        "{}, container {} ({})",
        crate::pod::describe(absent.pod.as_ref()),
        absent.container_id,
        absent.ifname
    );
    format!(
        "{}\n  verdict: none (absent since {})\n  diagnosis: {}",
        crate::text::escaped(&head),
        absent.at,
        crate::text::escaped(&absent.what)
    )
}

/// What the verdict, the daemon's intent and their history mean, in one sentence.
fn diagnosis(view: &SandboxView) -> String {
    let removed = view.removed.as_ref().map(|r| {
        format!(
            "its network was removed by the runtime's {} at {}; ",
            r.by.to_uppercase(),
            r.at
        )
    });
    let removed = removed.unwrap_or_default();
    let intent = view.intent.as_deref();
    let missing = intent
        .filter(|i| !i.missing.is_empty())
        .map(|i| i.missing.join(", "));
    let Some(v) = &view.verdict else {
        return format!(
            "{removed}the kernel watch has not judged this sandbox yet (within its deadline, or \
             its namespace was not seen)"
        );
    };
    let why = v.diagnosis.as_deref().unwrap_or(&v.reason);
    let own = match intent.map(|i| i.status) {
        Some(IntentStatus::Confirmed) => {
            "the kernel shows every step of provisioner's ADD (confirmed)".to_owned()
        }
        Some(IntentStatus::Unconfirmed) => format!(
            "the kernel did not show all of provisioner's ADD (unconfirmed; missing: {})",
            missing.as_deref().unwrap_or("?")
        ),
        Some(IntentStatus::Drifted) => format!(
            "it lacks part of what provisioner's ADD configured (drifted; missing: {})",
            missing.as_deref().unwrap_or("?")
        ),
        None => "provisioner did not set it up (no ADD of ours for it)".to_owned(),
    };
    let what = match v.verdict {
        Verdict::Networked => match intent.map(|i| i.status) {
            Some(IntentStatus::Confirmed) => format!(
                "its network is set up and {own}: a \"failed to find network info\" for this pod \
                 does not come from a missing network (look at the runtime's own state)"
            ),
            _ => format!("its network is set up; {own}"),
        },
        Verdict::Skipped => format!("no CNI plugin set its network up: {why}"),
        Verdict::Partial | Verdict::Failed => {
            format!("its network setup did not finish: {why}; {own}")
        }
        Verdict::Gone => format!("its namespace is gone: {why}"),
        Verdict::Unknown => format!("the node cannot tell: {why}"),
    };
    format!("{removed}{what}")
}
