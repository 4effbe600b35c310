//! Metrics, the memory bound on namespaces, and a namespace found twice judged once.

use super::super::*;
use super::fixtures::*;
use crate::trace::verdict::{IntentOrigin, IntentStatus};

#[test]
fn metrics_count_events_verdicts_and_reads() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    tick_reading(&mut c, 1_000, lo_only);
    let m = c.metrics();
    assert_eq!(m.events.get("netns_created"), Some(&1));
    assert_eq!(m.verdicts.get("skipped"), Some(&1));
    assert_eq!(m.snapshots_taken, 1);
}

#[test]
fn a_flood_of_namespaces_costs_bounded_memory_and_is_counted() {
    let mut c = correlator();
    let n = u64::try_from(MAX_NAMESPACES).expect("small") + 100;
    for i in 0..n {
        c.feed(&created(0, 77, "flood", 1_000 + i));
    }
    let m = c.metrics();
    assert!(m.tracked_namespaces <= MAX_NAMESPACES);
    assert_eq!(m.evicted_namespaces, 100);
}

#[test]
fn a_namespace_found_twice_is_judged_once() {
    let mut c = correlator();
    let path = PathBuf::from("/run/netns/cni-a");
    let v = verdicts(c.found(path.clone(), &networked_state(SANDBOX), t(0), t(0)));
    assert_eq!(v.len(), 1);
    c.expect_sandbox(ns(SANDBOX), path, t(1));
    let again = verdicts(tick_reading(&mut c, 2_000, |cookie| {
        Ok(networked_state(cookie))
    }));
    assert!(again.is_empty(), "{again:?}");
    // An ADD naming it later is still checked against the kernel (from the state read).
    let reports = c.register_intent(
        intent(IntentOrigin::Add),
        PathBuf::from("/run/netns/cni-a"),
        t(3),
    );
    assert!(
        matches!(intent_verdicts(&reports).as_slice(),
            [i] if i.status == IntentStatus::Confirmed && i.evidence == Evidence::Snapshot { at: t(2_000) }),
        "{reports:?}"
    );
    assert!(verdicts(reports).is_empty(), "judged once");
}
