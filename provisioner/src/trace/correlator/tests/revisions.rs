//! An alarm revised when the network came after the deadline, seen or unseen.

use super::super::*;
use super::fixtures::*;
use crate::trace::netlink_parse::RtRequest;
use crate::trace::verdict::Step;

#[test]
fn network_after_the_deadline_revises_the_alarm() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    let first = verdicts(tick_reading(&mut c, 1_000, lo_only));
    assert_eq!(first[0].verdict, Verdict::Skipped);
    // The plugin comes 300 ms late.
    let mut late = Vec::new();
    for event in [
        request(1_290, 500, SANDBOX, 2, link_up(3)),
        dev(1_291, SANDBOX, 3, "eth0", true, false),
        request(
            1_295,
            500,
            SANDBOX,
            3,
            RtRequest::NewAddr(new_addr(3, "10.244.1.2", 24)),
        ),
        request(
            1_300,
            500,
            SANDBOX,
            4,
            RtRequest::NewRoute(default_via("10.244.1.1")),
        ),
    ] {
        late.extend(verdicts(c.feed(&event)));
    }
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0].verdict, Verdict::Networked);
    assert_eq!(late[0].revises, Some(Verdict::Skipped));
    assert_eq!(late[0].late_ms, Some(300));
    let steps: Vec<&Step> = late[0].timeline.iter().map(|e| &e.step).collect();
    assert!(
        steps.iter().any(|s| matches!(
            s,
            Step::Verdict {
                verdict: Verdict::Skipped
            }
        )),
        "both verdicts in the timeline: {steps:?}"
    );
    let m = c.metrics();
    assert_eq!(m.revised.get("skipped"), Some(&1));
    assert_eq!(m.verdicts.get("networked"), Some(&1));
}

#[test]
fn an_alarm_is_read_again_and_revised_when_the_network_came_unseen() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    assert_eq!(
        verdicts(tick_reading(&mut c, 1_000, lo_only))[0].verdict,
        Verdict::Skipped
    );
    // Nothing traced; the next read (one deadline later) shows the network.
    assert!(tick_reading(&mut c, 1_500, |cookie| Ok(networked_state(cookie))).is_empty());
    let v = verdicts(tick_reading(&mut c, 2_100, |cookie| {
        Ok(networked_state(cookie))
    }));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Networked);
    assert_eq!(v[0].revises, Some(Verdict::Skipped));
}
