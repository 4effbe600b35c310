//! Namespace state reads: sandboxes found at start, reads that fail or never answer, reads waiting
//! for a slot.

use super::super::*;
use super::fixtures::*;
use crate::trace::verdict::IntentOrigin;

#[test]
fn pinned_sandboxes_found_at_start_are_judged_from_their_state() {
    let mut c = correlator();
    let path = |n: &str| PathBuf::from(format!("/run/netns/cni-{n}"));
    // Found networked: said at once.
    let v = verdicts(c.found(path("a"), &networked_state(SANDBOX), t(0), t(0)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Networked);
    assert_eq!(v[0].evidence, Evidence::Snapshot { at: t(0) });
    assert!(v[0].reason.contains("found set up at"), "{}", v[0].reason);
    // Found with nothing: judged only after a deadline and a second read.
    assert!(verdicts(c.found(path("b"), &state(SANDBOX + 1, None), t(0), t(0))).is_empty());
    assert!(
        verdicts(c.found(
            path("c"),
            &state(SANDBOX + 2, Some((true, None, None))),
            t(0),
            t(0)
        ))
        .is_empty()
    );
    assert!(verdicts(c.tick(t(500))).is_empty());
    let v = verdicts(tick_reading(&mut c, 1_000, |cookie| {
        Ok(if cookie == SANDBOX + 1 {
            state(cookie, None)
        } else {
            state(cookie, Some((true, None, None)))
        })
    }));
    let by_cookie = |cookie| {
        v.iter()
            .find(|v| v.netns.cookie == cookie)
            .map(|v| v.verdict)
    };
    assert_eq!(by_cookie(SANDBOX + 1), Some(Verdict::Skipped));
    assert_eq!(by_cookie(SANDBOX + 2), Some(Verdict::Partial));
    let skipped = v
        .iter()
        .find(|v| v.netns.cookie == SANDBOX + 1)
        .expect("verdict");
    assert!(
        skipped.reason.contains("created before tracing"),
        "{}",
        skipped.reason
    );
}

#[test]
fn an_unseen_namespace_that_cannot_be_read_is_never_skipped() {
    let mut c = correlator();
    c.register_intent(
        intent(IntentOrigin::Add),
        PathBuf::from("/run/netns/x"),
        t(0),
    );
    let v = verdicts(tick_reading(&mut c, 1_000, |_| Err("gone".into())));
    assert!(v.iter().all(|v| v.verdict != Verdict::Skipped), "{v:?}");
    let v2 = verdicts(tick_reading(&mut c, 1_200, |_| Err("gone".into())));
    let all: Vec<Verdict> = v.iter().chain(&v2).map(|v| v.verdict).collect();
    assert!(all.contains(&Verdict::Unknown), "{all:?}");
}

#[test]
fn a_read_that_never_answers_does_not_hold_the_verdict_forever() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    assert!(c.tick(t(1_000)).is_empty());
    assert_eq!(c.take_snapshot_requests(t(1_000), usize::MAX).len(), 1);
    let wait = u64::try_from(2 * SNAPSHOT_WAIT.as_millis()).expect("small");
    let v = verdicts(c.tick(t(1_000 + wait)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert_eq!(v[0].evidence, Evidence::Trace);
    assert!(v[0].reason.contains("could not be read"), "{}", v[0].reason);
}

/// Reads are handed out as slots free up; the wait for a read's answer runs from when it is
/// handed out, so a burst of sandboxes is not judged unread while its reads wait their turn.
#[test]
fn reads_beyond_the_free_slots_wait_their_turn_without_being_judged_unanswered() {
    let mut c = correlator();
    for (i, cookie) in [SANDBOX, SANDBOX + 1, SANDBOX + 2].into_iter().enumerate() {
        c.feed(&created(
            0,
            42 + u32::try_from(i).expect("small"),
            "containerd",
            cookie,
        ));
    }
    assert!(c.tick(t(1_000)).is_empty());
    let first = c.take_snapshot_requests(t(1_000), 2);
    assert_eq!(first.len(), 2);
    let wait = u64::try_from(2 * SNAPSHOT_WAIT.as_millis()).expect("small");
    // The first two go unanswered: judged on the trace; the third was never handed out.
    let judged = verdicts(c.tick(t(1_000 + wait)));
    let judged: Vec<u64> = judged.iter().map(|v| v.netns.cookie).collect();
    assert_eq!(judged.len(), 2, "{judged:?}");
    let last = c.take_snapshot_requests(t(1_000 + wait), 2);
    assert_eq!(last.len(), 1);
    assert!(!judged.contains(&last[0].cookie));
    let read = lo_only(last[0].cookie);
    let v = verdicts(c.snapshot_taken(
        last[0].cookie,
        read.as_ref().map_err(Clone::clone),
        t(1_100 + wait),
        t(1_100 + wait),
    ));
    assert_eq!(v.len(), 1);
    assert_eq!(
        v[0].evidence,
        Evidence::Snapshot {
            at: t(1_100 + wait)
        }
    );
}
