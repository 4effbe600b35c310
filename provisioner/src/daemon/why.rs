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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::pod::{Pod, PodSource};
    use crate::trace::verdict::{Drift, fixtures};
    use crate::trace::{
        Creator, Evidence, IntentVerdict, NetnsRef, NetnsVerdict, SandboxReason, Step,
        TimelineEntry,
    };

    use super::super::kernel_watch::RemovedSandbox;

    /// 2026-12-04T05:23:18.123Z plus `ms`.
    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_361_798_123 + ms)
    }

    fn skipped_pod() -> Pod {
        Pod::from_cni_args(
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=lo-only-0;K8S_POD_UID=uid-lo-only-0;\
             K8S_POD_INFRA_CONTAINER_ID=4bf982a7deadbeef",
        )
        .expect("a pod")
    }

    fn containerd() -> Creator {
        Creator {
            pid: 4242,
            comm: "containerd".to_owned(),
            parent_pid: 1,
            parent_comm: "init".to_owned(),
            cgroup_id: 77,
        }
    }

    fn entry(ms: u64, comm: &str, pid: u32, step: Step) -> Arc<TimelineEntry> {
        Arc::new(TimelineEntry {
            at: at(ms),
            pid,
            comm: comm.to_owned(),
            step,
        })
    }

    /// A verdict on netns cookie 4121 (inode 4026532999), created by containerd.
    fn verdict(verdict: Verdict, pod: Option<PodName>, reason: &str) -> NetnsVerdict {
        NetnsVerdict {
            netns: NetnsRef {
                cookie: 4121,
                inode: 4_026_532_999,
            },
            sandbox: Some(SandboxReason::RuntimeCreator {
                comm: "containerd".to_owned(),
            }),
            creator: containerd(),
            created_at: at(0),
            ..fixtures::verdict(4121, verdict, pod, reason)
        }
    }

    fn view(verdict: Option<NetnsVerdict>) -> SandboxView {
        SandboxView {
            verdict: verdict.map(Arc::new),
            ..SandboxView::default()
        }
    }

    fn intent(status: IntentStatus, missing: &[&str]) -> Arc<IntentVerdict> {
        Arc::new(fixtures::intent(4121, "4bf982a7deadbeef", status, missing))
    }

    /// The pod of the daemon's own ADD.
    fn by_cni_call() -> Option<PodName> {
        Some(PodName::Known {
            pod: skipped_pod(),
            source: PodSource::CniCall,
        })
    }

    fn diagnosis_of(text: &str) -> &str {
        text.rsplit_once("\n  diagnosis: ")
            .map_or("", |(_, diagnosis)| diagnosis)
    }

    #[test]
    fn a_skipped_sandbox_names_its_pod_the_timeline_and_the_runtimes_conf_dir() {
        let mut v = verdict(
            Verdict::Skipped,
            Some(PodName::Known {
                pod: skipped_pod(),
                source: PodSource::PluginExec {
                    plugin: "loopback".to_owned(),
                },
            }),
            "no interface, address or route was set up within 2000 ms",
        );
        v.diagnosis = Some(
            "only the loopback plugin ran for it; containerd reads CNI networks from \
             /etc/cni/net.d, which holds only 10-loopback.conf (type loopback)"
                .to_owned(),
        );
        v.timeline = vec![
            entry(
                0,
                "containerd",
                4242,
                Step::Created {
                    origin: "unshare".to_owned(),
                },
            ),
            entry(
                2,
                "loopback",
                4250,
                Step::CniCall {
                    command: "ADD".to_owned(),
                    plugin: "loopback".to_owned(),
                    parent: "containerd".to_owned(),
                    uid: 0,
                    pod: Some(Box::new(skipped_pod())),
                },
            ),
            entry(
                2000,
                "provisioner",
                1,
                Step::Verdict {
                    verdict: Verdict::Skipped,
                },
            ),
        ];
        assert_eq!(
            explain(&view(Some(v))),
            "pod default/lo-only-0 (uid uid-lo-only-0, sandbox 4bf982a7), named by the environment \
             of CNI plugin loopback\n  \
             verdict: SKIPPED (netns cookie=4121 inode=4026532999, created by containerd (pid \
             4242, parent init pid 1, cgroup 77); evidence: the kernel trace): no interface, \
             address or route was set up within 2000 ms\n  \
             timeline:\n    \
             2026-12-04T05:23:18.123Z containerd[4242] netns created (unshare)\n    \
             2026-12-04T05:23:18.125Z loopback[4250] CNI ADD by loopback (run by containerd) \
             for pod default/lo-only-0 (uid uid-lo-only-0, sandbox 4bf982a7)\n    \
             2026-12-04T05:23:20.123Z provisioner[1] verdict skipped\n  \
             diagnosis: no CNI plugin set its network up: only the loopback plugin ran for it; \
             containerd reads CNI networks from /etc/cni/net.d, which holds only \
             10-loopback.conf (type loopback)"
        );
    }

    #[test]
    fn a_skip_without_a_diagnosis_gives_its_reason_and_a_pod_from_cri_names_the_runtime() {
        let v = verdict(
            Verdict::Skipped,
            Some(PodName::Known {
                pod: skipped_pod(),
                source: PodSource::Cri {
                    runtime: "containerd".to_owned(),
                },
            }),
            "nothing was set up",
        );
        let text = explain(&view(Some(v)));
        assert!(
            text.starts_with(
                "pod default/lo-only-0 (uid uid-lo-only-0, sandbox 4bf982a7), named by containerd \
                 over CRI\n  verdict: SKIPPED"
            ),
            "{text}"
        );
        assert!(!text.contains("timeline:"), "an empty timeline: {text}");
        assert_eq!(
            diagnosis_of(&text),
            "no CNI plugin set its network up: nothing was set up"
        );
    }

    #[test]
    fn a_pod_only_an_untrusted_plugin_named_is_unknown_and_says_why() {
        let untrusted = PodName::Unknown {
            reason: "only CNI plugin loopback run by uid 65534, not root, named one".to_owned(),
        };
        let text = explain(&view(Some(verdict(
            Verdict::Skipped,
            Some(untrusted),
            "nothing was set up",
        ))));
        assert!(
            text.starts_with(
                "pod unknown (only CNI plugin loopback run by uid 65534, not root, named one)\n  \
                 verdict: SKIPPED"
            ),
            "{text}"
        );
        // No pod at all: the view says so in the same words as every output.
        let text = explain(&view(Some(verdict(Verdict::Skipped, None, "x"))));
        assert!(
            text.starts_with("pod unknown\n  verdict: SKIPPED"),
            "{text}"
        );
    }

    #[test]
    fn partial_and_failed_say_the_setup_did_not_finish_and_what_our_add_lacks() {
        for (kind, name) in [(Verdict::Partial, "PARTIAL"), (Verdict::Failed, "FAILED")] {
            let mut v = verdict(kind, by_cni_call(), "RTM_NEWROUTE REJECTED: ENETUNREACH");
            v.diagnosis = Some("the route's gateway is not on the link".to_owned());
            let mut ours = view(Some(v));
            ours.container_id = Some("4bf982a7deadbeef".to_owned());
            ours.intent = Some(intent(
                IntentStatus::Unconfirmed,
                &["route 0.0.0.0/0", "eth0 up"],
            ));
            let text = explain(&ours);
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(
                lines[0],
                "pod default/lo-only-0 (uid uid-lo-only-0, sandbox 4bf982a7), named by its CNI call, \
                 container 4bf982a7deadbeef"
            );
            assert!(
                lines[1].starts_with(&format!("  verdict: {name} ")),
                "{text}"
            );
            assert_eq!(
                lines[2],
                "  INTENT UNCONFIRMED pod default/lo-only-0 (uid uid-lo-only-0, sandbox 4bf982a7) \
                 container 4bf982a7deadbeef (eth0) netns cookie=4121 eth0 [evidence: the kernel \
                 trace] missing: route 0.0.0.0/0, eth0 up"
            );
            assert_eq!(
                diagnosis_of(&text),
                "its network setup did not finish: the route's gateway is not on the link; the \
                 kernel did not show all of provisioner's ADD (unconfirmed; missing: route \
                 0.0.0.0/0, eth0 up)"
            );
        }
        // Someone else's plugin failed: provisioner had no part in it.
        let text = explain(&view(Some(verdict(
            Verdict::Failed,
            None,
            "RTM_NEWLINK REJECTED: EEXIST",
        ))));
        assert_eq!(
            diagnosis_of(&text),
            "its network setup did not finish: RTM_NEWLINK REJECTED: EEXIST; provisioner did \
             not set it up (no ADD of ours for it)"
        );
    }

    #[test]
    fn gone_and_unknown_say_what_the_node_could_not_see() {
        let text = explain(&view(Some(verdict(
            Verdict::Gone,
            None,
            "destroyed 30 ms after creation",
        ))));
        assert!(text.contains("\n  verdict: GONE ("), "{text}");
        assert_eq!(
            diagnosis_of(&text),
            "its namespace is gone: destroyed 30 ms after creation"
        );
        let mut v = verdict(
            Verdict::Unknown,
            None,
            "its history was not seen and its state could not be read",
        );
        v.evidence = Evidence::Nothing;
        let text = explain(&view(Some(v)));
        assert!(
            text.contains("evidence: nothing (history not seen, state unreadable)"),
            "{text}"
        );
        assert_eq!(
            diagnosis_of(&text),
            "the node cannot tell: its history was not seen and its state could not be read"
        );
    }

    #[test]
    fn networked_tells_whether_our_add_is_confirmed_drifted_or_not_ours() {
        let mut ours = view(Some(verdict(Verdict::Networked, by_cni_call(), "seen")));
        ours.intent = Some(intent(IntentStatus::Confirmed, &[]));
        assert_eq!(
            diagnosis_of(&explain(&ours)),
            "its network is set up and the kernel shows every step of provisioner's ADD \
             (confirmed): a \"failed to find network info\" for this pod does not come from a \
             missing network (look at the runtime's own state)"
        );
        ours.intent = Some(intent(IntentStatus::Drifted, &["address 10.244.1.2/24"]));
        ours.drifts = vec![Drift {
            key: ours.intent.as_ref().expect("an intent").intent.key.clone(),
            netns_cookie: 4121,
            what: "address 10.244.1.2/24 removed".to_owned(),
            by: None,
        }];
        let text = explain(&ours);
        assert!(
            text.contains("\n  drift: address 10.244.1.2/24 removed\n  diagnosis: "),
            "{text}"
        );
        assert_eq!(
            diagnosis_of(&text),
            "its network is set up; it lacks part of what provisioner's ADD configured \
             (drifted; missing: address 10.244.1.2/24)"
        );
        let theirs = view(Some(verdict(Verdict::Networked, None, "seen")));
        assert_eq!(
            diagnosis_of(&explain(&theirs)),
            "its network is set up; provisioner did not set it up (no ADD of ours for it)"
        );
    }

    #[test]
    fn a_removed_sandbox_says_so_before_the_verdict_and_before_no_verdict() {
        let removed = RemovedSandbox {
            by: "del",
            at: "2026-12-04T05:23:30.000Z".to_owned(),
            addresses: vec!["10.244.1.2/24".to_owned(), "fd00:1::2/64".to_owned()],
        };
        let mut judged = view(Some(verdict(Verdict::Networked, by_cni_call(), "seen")));
        judged.removed = Some(removed.clone());
        let text = explain(&judged);
        assert!(
            text.contains(
                "\n  removed by DEL at 2026-12-04T05:23:30.000Z: addresses [10.244.1.2/24, \
                 fd00:1::2/64] released"
            ),
            "{text}"
        );
        assert_eq!(
            diagnosis_of(&text),
            "its network was removed by the runtime's DEL at 2026-12-04T05:23:30.000Z; its \
             network is set up; provisioner did not set it up (no ADD of ours for it)"
        );
        let mut unjudged = view(None);
        unjudged.pod = by_cni_call();
        unjudged.removed = Some(RemovedSandbox {
            by: "gc",
            ..removed
        });
        let text = explain(&unjudged);
        assert!(text.contains("\n  verdict: none yet\n"), "{text}");
        assert_eq!(
            diagnosis_of(&text),
            "its network was removed by the runtime's GC at 2026-12-04T05:23:30.000Z; the \
             kernel watch has not judged this sandbox yet (within its deadline, or its \
             namespace was not seen)"
        );
    }

    #[test]
    fn an_absent_sandbox_names_its_pod_container_and_what_happened() {
        let absent = AbsentSandbox {
            container_id: "gone-0-sandbox".to_owned(),
            ifname: "eth0".to_owned(),
            pod: Some(skipped_pod()),
            addresses: vec!["10.244.1.3/24".to_owned()],
            what: "netns gone while the daemon was down: addresses released".to_owned(),
            at: "2026-12-04T05:23:18.123Z".to_owned(),
        };
        assert_eq!(
            explain_absent(&absent),
            "pod default/lo-only-0 (uid uid-lo-only-0, sandbox 4bf982a7), container gone-0-sandbox \
             (eth0)\n  verdict: none (absent since 2026-12-04T05:23:18.123Z)\n  diagnosis: \
             netns gone while the daemon was down: addresses released"
        );
        let unnamed = AbsentSandbox {
            pod: None,
            ..absent
        };
        assert!(
            explain_absent(&unnamed).starts_with("pod unknown, container gone-0-sandbox"),
            "{}",
            explain_absent(&unnamed)
        );
    }
}
