//! What a sandbox's timeline shows: the plugins run, the teardown after the setup, short lives back
//! to back.

use super::super::*;
use super::fixtures::*;
use crate::trace::kernel::events::Exec;
use crate::trace::netlink_parse::{LinkMsg, RTM_DELADDR, RTM_SETLINK, RtRequest};
use crate::trace::verdict::Step;

#[test]
fn plugin_execs_show_in_the_timeline() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&ev(
        5,
        500,
        "ptp",
        EventKind::Exec(Exec {
            task_netns: ns(1),
            filename: "/usr/lib/cni/ptp".into(),
            parent_pid: 42,
            parent_comm: "containerd".into(),
        }),
    ));
    c.feed(&ev(
        6,
        501,
        "host-local",
        EventKind::Exec(Exec {
            task_netns: ns(1),
            filename: "/usr/lib/cni/host-local".into(),
            parent_pid: 500,
            parent_comm: "ptp".into(),
        }),
    ));
    wire(&mut c, SANDBOX);
    let v = verdicts(c.tick(t(1_100)));
    let execs: Vec<&str> = v[0]
        .timeline
        .iter()
        .filter_map(|e| match &e.step {
            Step::Exec { filename } => Some(filename.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(execs, ["/usr/lib/cni/ptp", "/usr/lib/cni/host-local"]);
}

/// Wires `cookie` like ptp, then tears it down like a DEL, then destroys it.
fn wire_and_tear_down(c: &mut Correlator, cookie: u64) -> Vec<Report> {
    let mut reports = Vec::new();
    wire(c, cookie);
    for event in [
        request(
            60,
            600,
            cookie,
            10,
            RtRequest::DelAddr(new_addr(3, "10.244.1.2", 24)),
        ),
        reply(61, 600, cookie, 10, RTM_DELADDR, 0),
        request(
            62,
            600,
            cookie,
            11,
            RtRequest::SetLink(LinkMsg {
                ifindex: 3,
                change: 1,
                ..LinkMsg::default()
            }),
        ),
        // The reaper deleted the pair meanwhile: the rename is refused.
        request(
            63,
            600,
            cookie,
            12,
            RtRequest::SetLink(LinkMsg {
                ifindex: 3,
                ifname: Some("pvx000000000003".into()),
                ..LinkMsg::default()
            }),
        ),
        reply(64, 600, cookie, 12, RTM_SETLINK, -19),
        dev(90, cookie, 1, "lo", false, true),
    ] {
        reports.extend(c.feed(&event));
    }
    reports
}

#[test]
fn wired_then_torn_down_and_destroyed_is_networked_with_its_teardown() {
    let mut c = correlator();
    c.feed(&created(0, 42, "conmon", SANDBOX));
    let v = verdicts(wire_and_tear_down(&mut c, SANDBOX));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Networked, "{}", v[0].reason);
    assert!(v[0].reason.contains("torn down from"), "{}", v[0].reason);
    assert!(
        v[0].reason.contains("10.244.1.2/24"),
        "judged on what it reached: {}",
        v[0].reason
    );
    assert!(
        v[0].timeline
            .iter()
            .any(|e| matches!(&e.step, Step::Request { op: "deladdr", .. }))
    );
}

#[test]
fn fifty_short_lived_sandboxes_back_to_back_are_all_networked() {
    let mut c = correlator();
    let mut all = Vec::new();
    for i in 0..50 {
        c.feed(&created(0, 42, "conmon", SANDBOX + i));
        all.extend(verdicts(wire_and_tear_down(&mut c, SANDBOX + i)));
    }
    assert_eq!(all.len(), 50);
    assert!(all.iter().all(|v| v.verdict == Verdict::Networked));
}
