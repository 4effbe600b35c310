//! Requests the kernel rejected: a failed setup named by its errno and extack, an answer read once,
//! a probe that is no failure.

use super::super::*;
use super::fixtures::*;
use crate::trace::kernel::events::Extack;
use crate::trace::netlink_parse::{LinkMsg, RTM_NEWLINK, RTM_NEWROUTE, RtRequest};

/// A sandbox whose default route via 10.10.0.1 the kernel rejected (ENETUNREACH, with an
/// extack), its request as `route` makes it; the reply comes after it.
fn rejected_default_route(route: impl FnOnce(RtRequest) -> TraceEvent) -> Correlator {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&dev(21, SANDBOX, 3, "eth0", true, false));
    c.feed(&request(
        30,
        500,
        SANDBOX,
        3,
        RtRequest::NewAddr(new_addr(3, "10.9.0.2", 24)),
    ));
    // The kernel reports a request after processing it: its extack comes first.
    c.feed(&ev(
        40,
        500,
        "plugin",
        EventKind::Extack(Extack {
            task_netns: ns(1),
            message: "Nexthop has invalid gateway".into(),
        }),
    ));
    c.feed(&route(RtRequest::NewRoute(default_via("10.10.0.1"))));
    c.feed(&reply(41, 500, SANDBOX, 4, RTM_NEWROUTE, -101));
    c
}

/// The verdict on [`rejected_default_route`]'s sandbox: failed, naming the errno and extack.
fn assert_failed_by_the_route(c: &mut Correlator) {
    let v = verdicts(tick_reading(c, 1_100, |cookie| {
        Ok(state(cookie, Some((true, Some("10.9.0.2/24"), None))))
    }));
    assert_eq!(v[0].verdict, Verdict::Failed);
    assert_eq!(
        v[0].reason.matches("ENETUNREACH").count(),
        1,
        "{}",
        v[0].reason
    );
    assert!(
        v[0].reason.contains("Nexthop has invalid gateway"),
        "{}",
        v[0].reason
    );
}

#[test]
fn rejected_route_is_failed_with_errno_and_extack() {
    let mut c = rejected_default_route(|route| request(40, 500, SANDBOX, 4, route));
    assert_failed_by_the_route(&mut c);
}

/// `request` whose answer the kernel had queued when it was sent.
fn answered_request(
    ms: u64,
    pid: u32,
    cookie: u64,
    seq: u32,
    body: RtRequest,
    answer: i32,
) -> TraceEvent {
    let mut event = request(ms, pid, cookie, seq, body);
    if let EventKind::NetlinkRequest(r) = &mut event.kind {
        r.answer = Some(answer);
    }
    event
}

fn timeline_text(c: &Correlator, cookie: u64) -> String {
    c.timeline(cookie)
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_request_answered_when_sent_is_acked_without_a_reply_and_not_waited_for() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&dev(21, SANDBOX, 3, "eth0", true, false));
    c.feed(&answered_request(
        30,
        500,
        SANDBOX,
        3,
        RtRequest::NewAddr(new_addr(3, "10.9.0.2", 24)),
        0,
    ));
    let text = timeline_text(&c, SANDBOX);
    assert!(text.contains("10.9.0.2/24 dev eth0 (ack)"), "{text}");
    assert!(
        c.requests.answered((500, 3, 3)).is_none(),
        "an acked request waits for no reply"
    );
}

#[test]
fn a_rejection_found_when_sent_and_read_again_as_a_reply_counts_once() {
    let mut c = rejected_default_route(|route| answered_request(40, 500, SANDBOX, 4, route, -101));
    let text = timeline_text(&c, SANDBOX);
    assert_eq!(text.matches("REJECTED").count(), 1, "{text}");
    assert!(!text.contains(" rejected:"), "no unmatched reply\n{text}");
    assert_failed_by_the_route(&mut c);
}

#[test]
fn iproute2_probe_rejection_is_not_a_failure() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&request(5, 500, SANDBOX, 0, link_up(0)));
    c.feed(&request(
        6,
        500,
        SANDBOX,
        0,
        RtRequest::NewLink(LinkMsg::default()),
    ));
    c.feed(&reply(7, 500, SANDBOX, 0, RTM_NEWLINK, -19));
    wire(&mut c, SANDBOX);
    let v = verdicts(c.tick(t(1_100)));
    assert_eq!(v[0].verdict, Verdict::Networked, "{}", v[0].reason);
}
