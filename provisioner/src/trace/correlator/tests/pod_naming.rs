//! The pod a verdict names, from a CNI plugin's environment, or why none.

use super::super::*;
use super::fixtures::*;
use crate::pod::PodName;
use crate::trace::kernel::events::ExecEnv;

/// containerd's loopback-only failure: the netns pinned, only the loopback plugin run, the netns gone
/// within 30 ms. The verdict names the pod the plugin was run for, first.
#[test]
fn a_plugins_environment_names_the_pod_of_a_pinned_netns() {
    let mut c = correlator();
    c.feed(&created(0, 43, "containerd", SANDBOX));
    c.feed(&pinned_at(1, SANDBOX, "/run/netns/cni-abc"));
    // The runtime spells the pin /var/run/netns (a link to /run).
    c.feed(&cni_exec(
        2,
        600,
        "loopback",
        "/var/run/netns/cni-abc",
        Some(LOOPBACK_ONLY_ARGS),
    ));
    c.feed(&request(3, 600, SANDBOX, 1, link_up(1)));
    c.feed(&dev(4, SANDBOX, 1, "lo", true, false));
    let v = verdicts(c.feed(&dev(30, SANDBOX, 1, "lo", false, true)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert_eq!(
        v[0].pod,
        Some(PodName::Known {
            pod: skipped_pod(),
            source: crate::pod::PodSource::PluginExec {
                plugin: "loopback".into()
            }
        })
    );
    let line = crate::trace::render::verdict_lines(&v[0]);
    let first = line.lines().next().unwrap_or_default();
    let after_verdict = first
        .split_once("VERDICT SKIPPED ")
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    assert!(
        after_verdict.starts_with(
            "pod e2e-lo-only/lo-only-0 (uid u-0, sandbox 4bf982a7, via loopback) netns cookie=100 "
        ),
        "{line}"
    );
    assert!(
        line.contains(
            "loopback[600] CNI ADD by loopback (run by containerd) for pod e2e-lo-only/lo-only-0"
        ),
        "{line}"
    );
    let json = serde_json::to_value(Report::Verdict(v[0].clone())).expect("serialises");
    assert_eq!(json["pod"]["status"], "known");
    assert_eq!(json["pod"]["pod"]["name"], "lo-only-0");
    assert_eq!(json["pod"]["source"]["by"], "plugin_exec");
}

/// `ctr run --cni` names the namespace by its process; a call whose namespace is pinned only
/// after the plugin ran waits for the pin; one naming a namespace never seen is dropped in
/// time and counted.
#[test]
fn a_netns_named_by_its_process_or_pinned_after_the_call_is_found() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&cni_exec(
        2,
        600,
        "ptp",
        "/proc/42/ns/net",
        Some(LOOPBACK_ONLY_ARGS),
    ));
    c.feed(&created(0, 44, "containerd", SANDBOX + 1));
    c.feed(&cni_exec(
        3,
        601,
        "loopback",
        "/run/netns/cni-late",
        Some("K8S_POD_NAMESPACE=default;K8S_POD_NAME=late-0"),
    ));
    c.feed(&pinned_at(4, SANDBOX + 1, "/var/run/netns/cni-late"));
    c.feed(&cni_exec(
        5,
        602,
        "loopback",
        "/run/netns/cni-never",
        Some("K8S_POD_NAME=never"),
    ));
    let v = verdicts(tick_reading(&mut c, 1_010, lo_only));
    assert_eq!(v.len(), 2, "{v:?}");
    for v in &v {
        let pod = v
            .pod
            .as_ref()
            .and_then(PodName::known)
            .map(|p| p.qualified_name());
        let want = if v.netns.cookie == SANDBOX {
            "e2e-lo-only/lo-only-0"
        } else {
            "default/late-0"
        };
        assert_eq!(pod.as_deref(), Some(want), "{v:?}");
    }
    // The ADD for a namespace never seen is dropped once it waited long enough; a DEL for a
    // namespace no longer followed is not kept at all.
    let mut del = cni_exec(2_000, 603, "loopback", "/run/netns/cni-gone", None);
    if let EventKind::ExecEnv(ExecEnv { cni: Some(cni), .. }) = &mut del.kind {
        cni.command = "DEL".into();
    }
    c.feed(&del);
    c.feed(&pinned_at(5_000, SANDBOX + 1, "/run/netns/cni-other"));
    assert_eq!(c.metrics().unmatched_cni_calls, 1);
}

/// A plugin run without a pod in CNI_ARGS names none: the verdict says why, never a guess.
#[test]
fn cni_args_without_a_pod_name_leave_the_pod_unknown_with_the_reason() {
    let mut c = correlator();
    c.feed(&created(0, 43, "containerd", SANDBOX));
    c.feed(&pinned_at(1, SANDBOX, "/run/netns/cni-abc"));
    c.feed(&cni_exec(
        2,
        600,
        "loopback",
        "/run/netns/cni-abc",
        Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e-lo-only"),
    ));
    let v = verdicts(c.feed(&dev(30, SANDBOX, 1, "lo", false, true)));
    assert_eq!(
        v[0].pod,
        Some(PodName::Unknown {
            reason: "CNI plugin loopback ran with no K8S_POD_NAME in CNI_ARGS".into()
        })
    );
    let line = crate::trace::render::verdict_lines(&v[0]);
    assert!(
        line.contains(
            "VERDICT SKIPPED pod unknown (CNI plugin loopback ran with no K8S_POD_NAME in CNI_ARGS) netns cookie="
        ),
        "{line}"
    );
    assert!(line.contains("naming no pod"), "{line}");
}

/// No plugin ran and no resolver answered: the reason says so. A namespace that is not a
/// sandbox names no pod at all.
#[test]
fn no_plugin_and_no_resolver_is_said_and_a_non_sandbox_names_no_pod() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&created(0, 77, "unshare", SANDBOX + 1));
    let mut v = verdicts(c.feed(&dev(500, SANDBOX + 1, 1, "lo", false, true)));
    v.extend(verdicts(tick_reading(&mut c, 1_000, lo_only)));
    let sandbox = v
        .iter()
        .find(|v| v.netns.cookie == SANDBOX)
        .expect("sandbox");
    assert_eq!(
        sandbox.pod,
        Some(PodName::Unknown {
            reason: "no CNI plugin ran and no runtime was asked".into()
        })
    );
    let other = v.iter().find(|v| v.netns.cookie == SANDBOX + 1);
    assert_eq!(other.map(|v| v.pod.clone()), Some(None), "{v:?}");
}

/// Anybody can exec a binary named like a runtime's with any environment: a plugin not run by
/// root does not name the pod (the verdict says so), and a root one after it still does.
#[test]
fn a_plugin_not_run_by_root_names_no_pod() {
    let mut c = correlator();
    c.feed(&created(0, 43, "containerd", SANDBOX));
    c.feed(&pinned_at(1, SANDBOX, "/run/netns/cni-abc"));
    c.feed(&created(0, 44, "containerd", SANDBOX + 1));
    c.feed(&pinned_at(1, SANDBOX + 1, "/run/netns/cni-def"));
    for netns in ["/run/netns/cni-abc", "/run/netns/cni-def"] {
        c.feed(&cni_exec_by(
            1000,
            2,
            600,
            "loopback",
            netns,
            Some("K8S_POD_NAME=evil"),
        ));
    }
    c.feed(&cni_exec(
        3,
        601,
        "loopback",
        "/run/netns/cni-def",
        Some(LOOPBACK_ONLY_ARGS),
    ));
    let mut v = verdicts(c.feed(&dev(30, SANDBOX, 1, "lo", false, true)));
    v.extend(verdicts(c.feed(&dev(
        31,
        SANDBOX + 1,
        1,
        "lo",
        false,
        true,
    ))));
    assert_eq!(v.len(), 2);
    assert_eq!(
        v[0].pod,
        Some(PodName::Unknown {
            reason: "only CNI plugin loopback run by uid 1000, not root, named one".into()
        })
    );
    let text: Vec<String> = v[0].timeline.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|l| l
                .contains("for pod evil (sandbox 4bf982a7), not taken: run by uid 1000, not root")),
        "{text:?}"
    );
    assert_eq!(
        v[1].pod.as_ref().and_then(PodName::known),
        Some(&skipped_pod())
    );
}

/// A plugin that takes longer than the deadline from the namespace's creation, but not from its
/// own start (ptp calling host-local on a loaded node), is judged by what it did, not skipped
/// while it works.
#[test]
fn a_plugin_add_gives_the_sandbox_the_deadline_from_its_start() {
    let mut c = correlator();
    c.feed(&created(0, 43, "containerd", SANDBOX));
    c.feed(&pinned_at(1, SANDBOX, "/run/netns/cni-slow"));
    c.feed(&cni_exec(800, 600, "ptp", "/run/netns/cni-slow", None));
    let early = verdicts(tick_reading(&mut c, 1_200, lo_only));
    assert!(early.is_empty(), "judged while its plugin works: {early:?}");
    wire(&mut c, SANDBOX);
    let v = verdicts(tick_reading(&mut c, 1_900, |cookie| {
        Ok(networked_state(cookie))
    }));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].verdict, Verdict::Networked);
    assert_eq!(v[0].revises, None);
}
