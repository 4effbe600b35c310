//! The daemon's log lines for what the kernel watch reports: one event per verdict, intent or
//! drift worth an operator's attention, naming the pod first, with the pod and the verdict as
//! fields (`pod_namespace`, `pod_name`, `pod_uid`, `sandbox_id`, `netns`, `verdict`, `reason`)
//! for a log pipeline to alert on.

use std::sync::Arc;

use tracing::Level;

use crate::pod::{Pod, PodName};
use crate::text::escaped;
use crate::trace::{Drift, IntentStatus, IntentVerdict, NetnsVerdict, Verdict};

/// A report of the kernel watch as its sandbox view holds it.
pub(super) enum Reported {
    Verdict(Arc<NetnsVerdict>),
    Intent(Arc<IntentVerdict>),
    Drift(Box<Drift>),
}

/// `pod default/web-0 (uid .., sandbox ..)`, `pod unknown (why)` or `pod unknown`, escaped.
fn describe(pod: Option<&PodName>) -> String {
    let who = pod.map_or_else(|| crate::pod::describe(None), ToString::to_string);
    escaped(&who).into_owned()
}

/// Logs `report` about the sandbox of `pod` when an operator should see it: alarms and their
/// revisions as warnings, a sandbox networked as info; repeated skips from one creator at the
/// 1st, 2nd, 4th, 8th... (each line says how many so far).
pub(super) fn log(report: &Reported, pod: Option<&PodName>) {
    match report {
        Reported::Verdict(v) => verdict(v, pod),
        Reported::Intent(i) => intent(i, pod),
        Reported::Drift(d) => drift(d, pod),
    }
}

fn verdict(v: &NetnsVerdict, pod: Option<&PodName>) {
    let known = pod.and_then(PodName::known);
    let who = describe(pod);
    let name = v.verdict.as_str().to_uppercase();
    let netns = format!("net:[{}]", v.netns.inode);
    let verdict = v.verdict.as_str();
    // Names from the kernel (comm, file names) and a runtime: escaped in the message and in
    // the fields written as they are.
    let reason = escaped(&v.reason);
    let reason = reason.as_ref();
    let creator = v.creator.to_string();
    let creator = escaped(&creator);
    macro_rules! verdict_event {
        ($level:expr, $($rest:tt)+) => {
            crate::pod_event!($level, known, None, netns = %netns, verdict, reason,
                netns_cookie = v.netns.cookie, netns_inode = v.netns.inode, creator = %creator,
                evidence = %v.evidence, $($rest)+)
        };
    }
    if let Some(old) = v.revises {
        let late = v
            .late_ms
            .map(|ms| format!(", late by {ms} ms"))
            .unwrap_or_default();
        verdict_event!(Level::INFO, revises = old.as_str(), late_ms = ?v.late_ms,
            "VERDICT {name} {who} (revises {}{late}): sandbox network arrived after the deadline, \
             resolving the earlier {} warning: {reason}",
            old.as_str().to_uppercase(), old.as_str().to_uppercase());
        return;
    }
    if v.sandbox.is_none() {
        return;
    }
    let count = v.repeat.as_ref().map_or(1, |r| r.count);
    match v.verdict {
        Verdict::Skipped if count.is_power_of_two() => verdict_event!(Level::WARN,
            why_sandbox = ?v.sandbox.as_ref().map(ToString::to_string),
            skips_from_creator = count,
            diagnosis = v.diagnosis.as_deref().unwrap_or_default(),
            "VERDICT {name} {who}: sandbox network setup skipped: {reason}"),
        Verdict::Failed | Verdict::Partial | Verdict::Unknown => {
            verdict_event!(Level::WARN, "VERDICT {name} {who}: {reason}")
        }
        Verdict::Networked => verdict_event!(Level::INFO, "VERDICT {name} {who}: {reason}"),
        Verdict::Skipped | Verdict::Gone => {}
    }
}

fn intent(i: &IntentVerdict, pod: Option<&PodName>) {
    let known: Option<&Pod> = pod.and_then(PodName::known);
    let who = describe(pod);
    let container = Some(i.intent.key.container_id.as_str());
    let sandbox = &i.intent.key;
    let cookie = i.intent.netns_cookie;
    match i.status {
        IntentStatus::Unconfirmed => crate::pod_event!(Level::WARN, known, container,
            netns_cookie = cookie, sandbox = %sandbox, missing = ?i.missing,
            "INTENT UNCONFIRMED {who}: kernel did not show the whole sandbox setup within the deadline"),
        IntentStatus::Drifted => crate::pod_event!(Level::WARN, known, container,
            netns_cookie = cookie, sandbox = %sandbox, missing = ?i.missing,
            "INTENT DRIFTED {who}: sandbox found at start lacks part of its network"),
        IntentStatus::Confirmed => crate::pod_event!(Level::DEBUG, known, container,
            netns_cookie = cookie, sandbox = %sandbox, "INTENT CONFIRMED {who}"),
    }
}

fn drift(d: &Drift, pod: Option<&PodName>) {
    let known = pod.and_then(PodName::known);
    let who = describe(pod);
    let what = escaped(&d.what);
    crate::pod_event!(Level::WARN, known, Some(d.key.container_id.as_str()),
        netns_cookie = d.netns_cookie, sandbox = %d.key, what = %what,
        by = ?d.by.as_ref().map(ToString::to_string),
        "DRIFT {who}: sandbox network drifted: {what}");
}
