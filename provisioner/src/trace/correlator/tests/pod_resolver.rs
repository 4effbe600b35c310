//! The pod resolver: asked once before an alarm, never where a plugin named the pod.

use super::super::*;
use super::fixtures::*;
use crate::pod::{NetnsCreator, PodName};

/// The resolver is asked with the read before an alarm, once per namespace, with the
/// namespace's creator; never for a sandbox seen networked or one a plugin named.
#[test]
fn a_resolver_is_asked_once_before_an_alarm_and_only_when_no_plugin_named_the_pod() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&created(0, 43, "containerd", SANDBOX + 1));
    c.feed(&pinned_at(1, SANDBOX + 1, "/run/netns/cni-named"));
    c.feed(&cni_exec(
        2,
        600,
        "loopback",
        "/run/netns/cni-named",
        Some(LOOPBACK_ONLY_ARGS),
    ));
    c.feed(&created(0, 44, "containerd", SANDBOX + 2));
    wire(&mut c, SANDBOX + 2);

    let mut reports = c.tick(t(1_010));
    let requests = c.take_snapshot_requests(t(1_010), usize::MAX);
    let asked: Vec<(u64, Option<PodQuery>)> = requests
        .iter()
        .map(|r| (r.cookie, r.pod_query.clone()))
        .collect();
    assert!(
        asked.contains(&(
            SANDBOX,
            Some(PodQuery {
                creator: Some(NetnsCreator {
                    pid: 42,
                    comm: "containerd".into()
                })
            })
        )),
        "{asked:?}"
    );
    assert!(asked.contains(&(SANDBOX + 1, None)), "{asked:?}");
    assert!(
        asked.iter().all(|(cookie, _)| *cookie != SANDBOX + 2),
        "the networked sandbox is not read: {asked:?}"
    );
    let from_cri = crate::pod::Pod::from_cni_args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0")
        .expect("pod");
    c.pod_resolved(
        SANDBOX,
        PodName::Known {
            pod: from_cri.clone(),
            source: crate::pod::PodSource::Cri {
                runtime: "containerd".into(),
            },
        },
    );
    // An answer for the named one (it was not asked) does not replace the plugin's pod.
    c.pod_resolved(SANDBOX + 1, PodName::Unknown { reason: "x".into() });
    for request in requests {
        reports.extend(c.snapshot_taken(
            request.cookie,
            Ok(&state(request.cookie, None)),
            t(1_010),
            t(1_010),
        ));
    }
    let v = verdicts(reports);
    let pod_of = |cookie| {
        v.iter()
            .find(|v| v.netns.cookie == cookie)
            .and_then(|v| v.pod.as_ref())
            .and_then(PodName::known)
            .cloned()
    };
    assert_eq!(pod_of(SANDBOX), Some(from_cri));
    assert_eq!(pod_of(SANDBOX + 1), Some(skipped_pod()));
    assert_eq!(
        pod_of(SANDBOX + 2).map(|_| ()),
        None,
        "networked, no pod named"
    );

    // Read again while the alarm stands: the resolver is not asked again.
    let again = {
        c.tick(t(2_500));
        c.take_snapshot_requests(t(2_500), usize::MAX)
    };
    assert!(!again.is_empty(), "the alarms are read again");
    assert!(again.iter().all(|r| r.pod_query.is_none()), "{again:?}");
}
