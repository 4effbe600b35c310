//! Which namespaces are sandboxes, and the verdict on one from its folded timeline.

use std::time::Duration;

use crate::trace::sandbox_rules::{SandboxReason, SandboxRules};
use ipnetwork::IpNetwork;

use crate::trace::verdict::{Evidence, Intent, RouteIntent, Verdict, format_time};

use super::state::{Progress, State};
use super::timeline::Ns;

/// Why `ns` counts as a sandbox, or `None` when it does not.
pub(super) fn sandbox_reason(ns: &Ns, rules: &SandboxRules) -> Option<SandboxReason> {
    if ns.expected {
        return Some(SandboxReason::Expected);
    }
    if ns.origin_known && rules.is_runtime_comm(&ns.creator.comm) {
        return Some(SandboxReason::RuntimeCreator {
            comm: ns.creator.comm.clone(),
        });
    }
    ns.pins
        .iter()
        .find(|p| rules.is_sandbox_pin(p))
        .map(|p| SandboxReason::Pinned { path: p.clone() })
}

/// A verdict, why, and on what evidence.
pub(super) struct Judgement {
    pub verdict: Verdict,
    pub reason: String,
    pub evidence: Evidence,
}

/// The verdict on a sandbox from what its timeline adds up to. A sandbox that was networked at
/// any point is networked (whatever came after is its teardown); an alarm needs evidence: the
/// trace since its creation, or its state read from the kernel.
pub(super) fn judge(ns: &Ns, p: &Progress, deadline: Duration) -> Judgement {
    if let Some(reached) = p.networked {
        let mut reason = match reached.evidence {
            Evidence::Snapshot { at } => format!("found set up at {}", format_time(at)),
            Evidence::Trace | Evidence::Nothing => "seen being set up".to_owned(),
        };
        reason.push_str(&format!(" ({})", p.best().summary()));
        if let Some(at) = p.torn_down {
            reason.push_str(&format!("; torn down from {}", format_time(at)));
        }
        return Judgement {
            verdict: Verdict::Networked,
            reason,
            evidence: reached.evidence,
        };
    }
    let evidence = match p.last_snapshot {
        Some(at) => Evidence::Snapshot { at },
        None if ns.origin_known => Evidence::Trace,
        None => Evidence::Nothing,
    };
    if evidence == Evidence::Nothing {
        let unread = ns
            .snapshot
            .error
            .as_deref()
            .unwrap_or("no namespace file found for it");
        return if ns.destroyed_at.is_some() {
            Judgement {
                verdict: Verdict::Gone,
                reason: format!(
                    "destroyed before its state could be read ({unread}); created before \
                     tracing started, its history was not seen"
                ),
                evidence,
            }
        } else {
            Judgement {
                verdict: Verdict::Unknown,
                reason: format!(
                    "created before tracing started (history not seen) and its state could \
                     not be read: {unread}"
                ),
                evidence,
            }
        };
    }
    let mut seen = format!("seen: {}", p.best().summary());
    if let Some(err) = &ns.snapshot.error {
        seen.push_str(&format!("; its state could not be read: {err}"));
    }
    if !p.rejected.is_empty() {
        return Judgement {
            verdict: Verdict::Failed,
            reason: format!("kernel rejected: {}; {seen}", p.rejected.join("; ")),
            evidence,
        };
    }
    if p.config_steps > 0 {
        return Judgement {
            verdict: Verdict::Partial,
            reason: format!("missing {}; {seen}", missing_parts(p.best()).join(", ")),
            evidence,
        };
    }
    let within = deadline.as_millis();
    let reason = match evidence {
        Evidence::Snapshot { at } if !ns.origin_known => format!(
            "nothing but loopback in its state read at {} (created before tracing started), \
             still nothing {within} ms after it was found; {seen}",
            format_time(at)
        ),
        _ => format!(
            "no interface, address or route was configured within {within} ms (nothing but \
             loopback; no network plugin touched it); {seen}"
        ),
    };
    Judgement {
        verdict: Verdict::Skipped,
        reason,
        evidence,
    }
}

fn missing_parts(best: &State) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if best.up.is_empty() {
        missing.push("a non-loopback interface up");
    }
    if !best.has_address() {
        missing.push("an address");
    }
    if !best.has_default_route() {
        missing.push("a default route");
    }
    missing
}

/// One part of an intent the state does not show; named (formatted) only when reported.
pub(super) enum MissingStep<'a> {
    Up(&'a str),
    Address(&'a IpNetwork),
    Route(&'a RouteIntent),
}

impl std::fmt::Display for MissingStep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MissingStep::Up(ifname) => write!(f, "interface {ifname} up"),
            MissingStep::Address(net) => write!(f, "address {net}"),
            MissingStep::Route(RouteIntent {
                dst,
                gateway: Some(gw),
            }) => write!(f, "route {dst} via {gw}"),
            MissingStep::Route(RouteIntent { dst, gateway: None }) => write!(f, "route {dst}"),
        }
    }
}

/// What of `intent` the state does not show. Checked on every change of a namespace being set
/// up, when most of it is still missing: nothing is formatted here.
pub(super) fn intent_parts_missing<'a>(
    intent: &'a Intent,
    state: &'a State,
) -> impl Iterator<Item = MissingStep<'a>> {
    let up = (!state.up.contains(&intent.ifname)).then_some(MissingStep::Up(&intent.ifname));
    let addresses = intent
        .addresses
        .iter()
        .filter(|net| {
            !state
                .addrs
                .iter()
                .any(|(_, a, p)| *a == net.ip() && *p == net.prefix())
        })
        .map(MissingStep::Address);
    let routes = intent
        .routes
        .iter()
        .filter(|route| {
            !state.routes.iter().any(|r| {
                r.dst_len == route.dst.prefix()
                    && (route.dst.prefix() == 0 || r.dst == Some(route.dst.network()))
                    && (route.gateway.is_none() || r.gateway == route.gateway)
            })
        })
        .map(MissingStep::Route);
    up.into_iter().chain(addresses).chain(routes)
}

/// What of `intent` the state does not show, each named.
pub(super) fn missing_steps(intent: &Intent, state: &State) -> Vec<String> {
    intent_parts_missing(intent, state)
        .map(|step| step.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::kernel::events::NetnsRef;
    use crate::trace::verdict::{IntentKey, IntentOrigin, RouteIntent};
    use std::time::{SystemTime, UNIX_EPOCH};

    fn ns(origin_known: bool) -> Ns {
        let mut ns = Ns::new(NetnsRef::default(), UNIX_EPOCH);
        ns.origin_known = origin_known;
        ns
    }

    #[test]
    fn an_alarm_needs_evidence() {
        let p = Progress::default();
        let unseen = judge(&ns(false), &p, Duration::from_secs(1));
        assert_eq!(unseen.verdict, Verdict::Unknown);
        let traced = judge(&ns(true), &p, Duration::from_secs(1));
        assert_eq!(traced.verdict, Verdict::Skipped);
        assert_eq!(traced.evidence, Evidence::Trace);
        let mut read = Progress::default();
        read.last_snapshot = Some(SystemTime::UNIX_EPOCH);
        let found = judge(&ns(false), &read, Duration::from_secs(1));
        assert_eq!(found.verdict, Verdict::Skipped);
        assert!(
            found.reason.contains("created before tracing"),
            "{}",
            found.reason
        );
    }

    #[test]
    fn a_gone_namespace_never_read_is_gone_not_skipped() {
        let mut gone = ns(false);
        gone.destroyed_at = Some(UNIX_EPOCH);
        let j = judge(&gone, &Progress::default(), Duration::from_secs(1));
        assert_eq!(j.verdict, Verdict::Gone);
    }

    #[test]
    fn missing_steps_name_each_address_and_route() {
        let intent = Intent {
            key: IntentKey {
                container_id: "c".into(),
                ifname: "eth0".into(),
            },
            origin: IntentOrigin::Add,
            netns_cookie: 1,
            ifname: "eth0".into(),
            addresses: vec!["10.0.0.2/24".parse().expect("net")],
            routes: vec![RouteIntent {
                dst: "0.0.0.0/0".parse().expect("net"),
                gateway: Some("10.0.0.1".parse().expect("ip")),
            }],
        };
        assert_eq!(
            missing_steps(&intent, &State::default()),
            [
                "interface eth0 up",
                "address 10.0.0.2/24",
                "route 0.0.0.0/0 via 10.0.0.1"
            ]
        );
    }
}
