//! The daemon's intents: confirmed, unconfirmed with what is missing, drift, teardowns, audits.

use super::super::*;
use super::fixtures::*;
use crate::trace::netlink_parse::RtRequest;
use crate::trace::sandbox_rules::SandboxReason;
use crate::trace::verdict::{IntentOrigin, IntentStatus, IntentVerdict};

#[test]
fn intent_confirmed_then_drift_reported() {
    let mut c = correlator();
    c.feed(&created(0, 42, "provisioner", SANDBOX));
    let reports = c.register_intent(
        intent(IntentOrigin::Add),
        PathBuf::from("/run/netns/x"),
        t(1),
    );
    assert!(reports.is_empty());
    assert!(
        c.take_snapshot_requests(t(1), usize::MAX).is_empty(),
        "history seen: nothing to read"
    );
    let mut all = Vec::new();
    for event in [
        dev(21, SANDBOX, 3, "eth0", true, false),
        request(
            30,
            500,
            SANDBOX,
            3,
            RtRequest::NewAddr(new_addr(3, "10.244.1.2", 24)),
        ),
        request(
            40,
            500,
            SANDBOX,
            4,
            RtRequest::NewRoute(default_via("10.244.1.1")),
        ),
    ] {
        all.extend(c.feed(&event));
    }
    assert!(
        matches!(
            all.as_slice(),
            [Report::Intent(IntentVerdict {
                status: IntentStatus::Confirmed,
                evidence: Evidence::Trace,
                ..
            })]
        ),
        "{all:?}"
    );
    let drift = c.feed(&request(
        500,
        600,
        SANDBOX,
        9,
        RtRequest::DelRoute(default_via("10.244.1.1")),
    ));
    assert!(
        matches!(drift.as_slice(), [Report::Drift(d)] if d.what.contains("route 0.0.0.0/0 via 10.244.1.1")),
        "{drift:?}"
    );
    assert_eq!(c.metrics().intents.drifts, 1);
}

#[test]
fn a_teardown_announced_first_is_not_drift() {
    let mut c = correlator();
    c.feed(&created(0, 42, "provisioner", SANDBOX));
    c.register_intent(
        intent(IntentOrigin::Add),
        PathBuf::from("/run/netns/x"),
        t(1),
    );
    wire(&mut c, SANDBOX);
    c.remove_intent(&intent(IntentOrigin::Add).key);
    let own = c.feed(&request(
        500,
        600,
        SANDBOX,
        9,
        RtRequest::DelAddr(new_addr(3, "10.244.1.2", 24)),
    ));
    assert!(own.is_empty(), "{own:?}");
    assert_eq!(c.metrics().intents.drifts, 0);
}

#[test]
fn intent_for_a_namespace_whose_history_was_not_seen_is_confirmed_from_its_state() {
    let mut c = correlator();
    // Registered before the programs attached: no creation, no setup seen.
    assert!(
        c.register_intent(
            intent(IntentOrigin::Add),
            PathBuf::from("/run/netns/x"),
            t(0)
        )
        .is_empty()
    );
    // Its creation may still be among the events not fed yet: the read waits for the event
    // stream to pass the registration, or a grace period when no event comes.
    assert!(c.take_snapshot_requests(t(10), usize::MAX).is_empty());
    let grace = u64::try_from(HISTORY_GRACE.as_millis()).expect("small");
    let requests = c.take_snapshot_requests(t(grace), usize::MAX);
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].paths, [PathBuf::from("/run/netns/x")]);
    let reports = c.snapshot_taken(SANDBOX, Ok(&networked_state(SANDBOX)), t(grace), t(grace));
    let intents = intent_verdicts(&reports);
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0].status, IntentStatus::Confirmed);
    assert_eq!(intents[0].evidence, Evidence::Snapshot { at: t(grace) });
    let v = verdicts(reports);
    assert_eq!(v.len(), 1, "found set up: said at once");
    assert_eq!(v[0].verdict, Verdict::Networked);
    assert_eq!(v[0].sandbox, Some(SandboxReason::Expected));
}

#[test]
fn a_creation_fed_after_the_intent_names_the_creator_and_no_state_is_read() {
    let mut c = correlator();
    c.register_intent(
        intent(IntentOrigin::Add),
        PathBuf::from("/run/netns/x"),
        t(30),
    );
    // The runtime's creation and the plugin's setup, read from the ring buffer after the ADD's
    // intent was registered (a batch, or a lagging reader on a loaded node).
    c.feed(&created(0, 42, "podman", SANDBOX));
    c.feed(&dev(20, SANDBOX, 3, "eth0", true, false));
    assert!(
        c.take_snapshot_requests(t(35), usize::MAX).is_empty(),
        "no read while the stream has not passed the intent"
    );
    c.feed(&created(40, 43, "other", SANDBOX + 1));
    assert!(
        c.take_snapshot_requests(t(45), usize::MAX).is_empty(),
        "the history was seen after all: nothing to read"
    );
    let v = verdicts(tick_reading(&mut c, 5_000, |cookie| {
        Ok(networked_state(cookie))
    }));
    let mine: Vec<_> = v.iter().filter(|v| v.netns.cookie == SANDBOX).collect();
    assert_eq!(mine.len(), 1, "{v:?}");
    assert_eq!(mine[0].creator.comm, "podman", "{mine:?}");
}

#[test]
fn intent_unconfirmed_at_deadline_lists_missing_steps_after_a_read() {
    let mut c = correlator();
    c.feed(&created(0, 42, "provisioner", SANDBOX));
    c.register_intent(
        intent(IntentOrigin::Add),
        PathBuf::from("/run/netns/x"),
        t(0),
    );
    c.feed(&dev(21, SANDBOX, 3, "eth0", true, false));
    let reports = tick_reading(&mut c, 1_000, |cookie| {
        Ok(state(cookie, Some((true, None, None))))
    });
    let unconfirmed = intent_verdicts(&reports);
    assert_eq!(unconfirmed.len(), 1);
    assert_eq!(unconfirmed[0].status, IntentStatus::Unconfirmed);
    assert_eq!(
        unconfirmed[0].missing.len(),
        2,
        "{:?}",
        unconfirmed[0].missing
    );
}

#[test]
fn audit_confirms_from_the_state_or_names_what_is_missing() {
    let mut c = correlator();
    c.register_intent(
        intent(IntentOrigin::Audit),
        PathBuf::from("/run/netns/x"),
        t(0),
    );
    let requests = c.take_snapshot_requests(t(0), usize::MAX);
    assert_eq!(requests.len(), 1);
    let reports = c.snapshot_taken(
        SANDBOX,
        Ok(&state(SANDBOX, Some((true, Some("10.244.1.2/24"), None)))),
        t(1),
        t(1),
    );
    let intents = intent_verdicts(&reports);
    assert_eq!(intents.len(), 1, "{reports:?}");
    assert_eq!(intents[0].status, IntentStatus::Drifted);
    assert!(
        reports.iter().any(
            |r| matches!(r, Report::Drift(d) if d.what.contains("route 0.0.0.0/0 via 10.244.1.1"))
        ),
        "{reports:?}"
    );
    let mut other = intent(IntentOrigin::Audit);
    other.key.container_id = "c2".into();
    other.netns_cookie = SANDBOX + 1;
    c.register_intent(other, PathBuf::from("/run/netns/y"), t(2));
    c.take_snapshot_requests(t(2), usize::MAX);
    let reports = c.snapshot_taken(SANDBOX + 1, Ok(&networked_state(SANDBOX + 1)), t(3), t(3));
    assert_eq!(intent_verdicts(&reports)[0].status, IntentStatus::Confirmed);
}
