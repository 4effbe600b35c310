//! A sandbox's verdict from its setup: networked, partial, or skipped with what it shows.

use super::super::*;
use super::fixtures::*;
use crate::trace::netlink_parse::{RTM_NEWADDR, RTM_NEWROUTE, RtRequest};
use crate::trace::sandbox_rules::SandboxReason;
use crate::trace::verdict::Step;

#[test]
fn runtime_sandbox_with_nothing_is_skipped_after_its_state_is_read() {
    let mut c = correlator();
    assert!(c.feed(&created(0, 42, "containerd", SANDBOX)).is_empty());
    assert!(c.tick(t(999)).is_empty(), "not before the deadline");
    assert!(
        c.tick(t(1_000)).is_empty(),
        "no alarm before the state is read"
    );
    let requests = c.take_snapshot_requests(t(1_000), usize::MAX);
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].cookie, SANDBOX);
    assert!(
        requests[0]
            .paths
            .contains(&PathBuf::from("/proc/42/ns/net")),
        "{requests:?}"
    );
    let v = verdicts(c.snapshot_taken(SANDBOX, Ok(&state(SANDBOX, None)), t(1_001), t(1_002)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert_eq!(v[0].evidence, Evidence::Snapshot { at: t(1_001) });
    assert_eq!(v[0].creator.comm, "containerd");
    assert_eq!(v[0].creator.pid, 42);
    assert!(matches!(
        v[0].sandbox,
        Some(SandboxReason::RuntimeCreator { .. })
    ));
    assert!(v[0].reason.contains("no interface"), "{}", v[0].reason);
    assert!(
        v[0].timeline
            .iter()
            .any(|e| matches!(&e.step, Step::Snapshot { summary } if summary.contains("lo up"))),
        "{:?}",
        v[0].timeline
    );
    assert!(
        verdicts(tick_reading(&mut c, 1_500, lo_only)).is_empty(),
        "decided once"
    );
}

#[test]
fn a_sandbox_the_trace_missed_but_the_kernel_shows_networked_is_networked() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    // Its setup was not seen (e.g. one sendmsg carried it all, or events were lost).
    let v = verdicts(tick_reading(&mut c, 1_000, |cookie| {
        Ok(networked_state(cookie))
    }));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Networked, "{}", v[0].reason);
    assert!(v[0].reason.contains("found set up"), "{}", v[0].reason);
}

#[test]
fn repeated_skips_from_one_creator_are_summarised() {
    let mut c = correlator();
    for i in 0..3 {
        c.feed(&created(i * 100, 42, "containerd", SANDBOX + i));
    }
    let v = verdicts(tick_reading(&mut c, 5_000, lo_only));
    assert_eq!(v.len(), 3);
    let max = v
        .iter()
        .filter_map(|v| v.repeat.as_ref())
        .map(|r| r.count)
        .max();
    assert_eq!(max, Some(3));
    let summaries = c.skip_summaries();
    assert_eq!(summaries.len(), 1);
    assert_eq!(summaries[0].count, 3);
    assert_eq!(summaries[0].first, t(0));
    assert_eq!(summaries[0].last, t(200));
}

#[test]
fn full_setup_is_networked_without_reading_its_state() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    wire(&mut c, SANDBOX);
    let v = verdicts(c.tick(t(1_100)));
    assert_eq!(v[0].verdict, Verdict::Networked, "{}", v[0].reason);
    assert_eq!(v[0].evidence, Evidence::Trace);
    assert!(v[0].reason.contains("seen being set up"), "{}", v[0].reason);
    assert!(v[0].reason.contains("eth0"));
    assert!(c.take_snapshot_requests(t(1_000), usize::MAX).is_empty());
}

#[test]
fn loopback_only_is_skipped_and_shows_lo() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&request(10, 500, SANDBOX, 1, link_up(1)));
    c.feed(&dev(11, SANDBOX, 1, "lo", true, false));
    let v = verdicts(tick_reading(&mut c, 1_100, lo_only));
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert!(v[0].reason.contains("lo up"), "{}", v[0].reason);
    assert!(
        v[0].timeline
            .iter()
            .any(|e| matches!(&e.step, Step::DevUp { ifname, .. } if ifname == "lo"))
    );
}

#[test]
fn interface_without_address_is_partial() {
    let mut c = correlator();
    c.feed(&created(0, 42, "runc:[1:CHILD]", SANDBOX));
    c.feed(&request(20, 500, SANDBOX, 2, link_up(3)));
    c.feed(&dev(21, SANDBOX, 3, "eth0", true, false));
    let v = verdicts(tick_reading(&mut c, 1_100, |cookie| {
        Ok(state(cookie, Some((true, None, None))))
    }));
    assert_eq!(v[0].verdict, Verdict::Partial);
    assert!(v[0].reason.contains("an address"), "{}", v[0].reason);
}

#[test]
fn a_setup_still_at_work_at_its_deadline_is_judged_a_deadline_after_its_last_request() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&request(600, 500, SANDBOX, 1, link_up(3)));
    c.feed(&dev(601, SANDBOX, 3, "eth0", true, false));
    c.feed(&request(
        900,
        501,
        SANDBOX,
        1,
        RtRequest::NewAddr(new_addr(3, "10.9.0.2", 24)),
    ));
    let half_done = |cookie| Ok(state(cookie, Some((true, Some("10.9.0.2/24"), None))));
    let early = verdicts(tick_reading(&mut c, 1_200, half_done));
    assert!(
        early.is_empty(),
        "judged while its setup is at work: {early:?}"
    );
    c.feed(&request(
        1_500,
        502,
        SANDBOX,
        1,
        RtRequest::NewRoute(default_via("10.10.0.1")),
    ));
    c.feed(&reply(1_501, 502, SANDBOX, 1, RTM_NEWROUTE, -101));
    assert!(verdicts(tick_reading(&mut c, 2_499, half_done)).is_empty());
    let v = verdicts(tick_reading(&mut c, 2_500, half_done));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].verdict, Verdict::Failed, "{}", v[0].reason);
    assert!(v[0].reason.contains("ENETUNREACH"), "{}", v[0].reason);
}

#[test]
fn a_setup_that_never_goes_quiet_is_judged_three_deadlines_after_creation() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    let retrying = |c: &mut Correlator, from: u64, to: u64| {
        for (seq, ms) in (from..to).step_by(400).enumerate() {
            let seq = u32::try_from(seq).expect("few retries");
            let pid = 600 + seq;
            c.feed(&request(
                ms,
                pid,
                SANDBOX,
                1,
                RtRequest::NewAddr(new_addr(3, "10.9.0.2", 24)),
            ));
            c.feed(&reply(ms + 1, pid, SANDBOX, 1, RTM_NEWADDR, -19));
        }
    };
    retrying(&mut c, 100, 3_000);
    assert!(verdicts(tick_reading(&mut c, 2_999, lo_only)).is_empty());
    let v = verdicts(tick_reading(&mut c, 3_000, lo_only));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].verdict, Verdict::Failed, "{}", v[0].reason);
    assert!(v[0].reason.contains("ENODEV"), "{}", v[0].reason);
}
