//! Which namespaces are sandboxes (runtime-made, pinned under a sandbox prefix, expected) and when
//! each is judged.

use super::super::*;
use super::fixtures::*;
use crate::trace::kernel::events::BindMount;
use crate::trace::sandbox_rules::SandboxReason;
use crate::trace::verdict::Step;

#[test]
fn non_runtime_namespace_destroyed_early_is_gone_never_skipped() {
    let mut c = correlator();
    c.feed(&created(0, 77, "stress", SANDBOX));
    c.feed(&dev(50, SANDBOX, 1, "lo", true, false));
    let v = verdicts(c.feed(&dev(100, SANDBOX, 1, "lo", false, true)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Gone);
    assert!(v[0].sandbox.is_none());
    // And a live one is silently dropped at its deadline, without reading its state.
    c.feed(&created(200, 77, "stress", SANDBOX + 1));
    assert!(verdicts(c.tick(t(2_000))).is_empty());
    assert!(c.take_snapshot_requests(t(2_000), usize::MAX).is_empty());
    assert!(!c.is_tracked(SANDBOX + 1));
}

#[test]
fn sandbox_destroyed_early_is_skipped_at_once_on_its_trace() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&request(5, 42, SANDBOX, 1, link_up(1)));
    c.feed(&dev(6, SANDBOX, 1, "lo", true, false));
    let v = verdicts(c.feed(&dev(30, SANDBOX, 1, "lo", false, true)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert_eq!(v[0].evidence, Evidence::Trace);
    assert_eq!(v[0].destroyed_at, Some(t(30)));
    assert!(
        v[0].timeline
            .iter()
            .any(|e| matches!(e.step, Step::Destroyed))
    );
    assert!(v[0].reason.contains("destroyed 30 ms"), "{}", v[0].reason);
}

#[test]
fn pinned_with_sandbox_prefix_is_a_sandbox_other_pins_are_not() {
    let mut c = correlator();
    let pin = |ms, cookie, target: &str| {
        ev(
            ms,
            77,
            "ip",
            EventKind::BindMount(BindMount {
                task_netns: ns(cookie),
                source: "/proc/self/ns/net".into(),
                target: target.into(),
                flags: 4096,
            }),
        )
    };
    c.feed(&created(0, 77, "ip", SANDBOX));
    c.feed(&pin(1, SANDBOX, "/run/netns/cni-abc"));
    c.feed(&created(0, 77, "ip", SANDBOX + 1));
    c.feed(&pin(1, SANDBOX + 1, "/run/netns/node"));
    let mut asked = Vec::new();
    let mut reports = c.tick(t(1_000));
    for request in c.take_snapshot_requests(t(1_000), usize::MAX) {
        asked.push(request.clone());
        reports.extend(c.snapshot_taken(
            request.cookie,
            Ok(&state(request.cookie, None)),
            t(1_000),
            t(1_000),
        ));
    }
    assert_eq!(asked.len(), 1, "only the sandbox is read: {asked:?}");
    assert_eq!(asked[0].paths[0], PathBuf::from("/run/netns/cni-abc"));
    let v = verdicts(reports);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].netns.cookie, SANDBOX);
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert!(matches!(v[0].sandbox, Some(SandboxReason::Pinned { .. })));
}

#[test]
fn expected_namespace_is_judged_whoever_created_it() {
    let mut c = correlator();
    c.feed(&created(0, 77, "myruntime", SANDBOX));
    c.expect_sandbox(ns(SANDBOX), PathBuf::from("/run/netns/x"), t(0));
    assert!(
        c.take_snapshot_requests(t(0), usize::MAX).is_empty(),
        "its history is known: no read needed yet"
    );
    let v = verdicts(tick_reading(&mut c, 1_000, lo_only));
    assert_eq!(v[0].sandbox, Some(SandboxReason::Expected));
}
