//! Correlator unit tests over synthetic events (no root, no kernel).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::dataplane::{SnapshotAddress, SnapshotLink, SnapshotRoute};
use crate::pod::{NetnsCreator, PodName};
use crate::trace::kernel::events::{
    BindMount, DevChange, Exec, ExecEnv, Extack, NetlinkIo, NetlinkReply, NetlinkRequest,
    NetnsCreated, NetnsOrigin, TaskInfo,
};
use crate::trace::netlink_parse::{
    AddrMsg, LinkMsg, NlHeader, NlReply, NlRequest, RTM_DELADDR, RTM_DELLINK, RTM_DELROUTE,
    RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE, RTM_SETLINK, RouteMsg, RtRequest,
};
use crate::trace::sandbox_rules::SandboxReason;
use crate::trace::verdict::{
    IntentOrigin, IntentStatus, IntentVerdict, NetnsVerdict, RouteIntent, Step,
};

const SANDBOX: u64 = 100;
const SANDBOX_INODE: u32 = 4_026_532_100;

fn t(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000) + Duration::from_millis(ms)
}

fn ev(ms: u64, pid: u32, comm: &str, kind: EventKind) -> TraceEvent {
    TraceEvent {
        at: t(ms),
        task: TaskInfo {
            pid,
            tid: pid,
            comm: comm.into(),
            cgroup_id: 1,
        },
        kind,
    }
}

fn created(ms: u64, pid: u32, comm: &str, cookie: u64) -> TraceEvent {
    ev(
        ms,
        pid,
        comm,
        EventKind::NetnsCreated(NetnsCreated {
            netns_cookie: cookie,
            netns_inode: SANDBOX_INODE,
            origin: NetnsOrigin::Unshare,
            flags: 0x4000_0000,
            owner_pid: pid,
            parent_pid: 1,
            parent_comm: "init".into(),
        }),
    )
}

fn ns(cookie: u64) -> NetnsRef {
    NetnsRef {
        cookie,
        inode: SANDBOX_INODE,
    }
}

fn io(cookie: u64) -> NetlinkIo {
    NetlinkIo {
        task_netns: ns(1),
        sock_netns: ns(cookie),
        syscall: "sendmsg",
        fd: 3,
        total_len: 0,
        copied: 0,
        parse_error: None,
    }
}

fn header(msg_type: u16, seq: u32) -> NlHeader {
    NlHeader {
        len: 40,
        msg_type,
        flags: 5,
        seq,
        port: 0,
    }
}

fn request(ms: u64, pid: u32, cookie: u64, seq: u32, body: RtRequest) -> TraceEvent {
    let msg_type = match &body {
        RtRequest::NewLink(_) => RTM_NEWLINK,
        RtRequest::NewAddr(_) => RTM_NEWADDR,
        RtRequest::NewRoute(_) => RTM_NEWROUTE,
        RtRequest::DelAddr(_) => RTM_DELADDR,
        RtRequest::DelRoute(_) => RTM_DELROUTE,
        RtRequest::DelLink(_) => RTM_DELLINK,
        RtRequest::SetLink(_) => RTM_SETLINK,
        RtRequest::Other { msg_type } => *msg_type,
    };
    ev(
        ms,
        pid,
        "plugin",
        EventKind::NetlinkRequest(NetlinkRequest {
            io: io(cookie),
            messages: vec![NlRequest {
                header: header(msg_type, seq),
                body,
                truncated: false,
            }],
            answer: None,
        }),
    )
}

fn reply(ms: u64, pid: u32, cookie: u64, seq: u32, msg_type: u16, error: i32) -> TraceEvent {
    ev(
        ms,
        pid,
        "plugin",
        EventKind::NetlinkReply(NetlinkReply {
            io: io(cookie),
            replies: vec![NlReply {
                header: header(2, seq),
                error,
                request: Some(header(msg_type, seq)),
                extack: None,
            }],
        }),
    )
}

fn dev(ms: u64, cookie: u64, ifindex: u32, name: &str, up: bool, dying: bool) -> TraceEvent {
    let change = DevChange {
        netns: ns(cookie),
        ifindex,
        ifname: name.into(),
        dev_flags: 1,
        netns_dying: dying,
        qdisc: "noqueue".into(),
    };
    ev(
        ms,
        if dying { 38 } else { 500 },
        if dying { "kworker/u8:2" } else { "plugin" },
        if up {
            EventKind::DevUp(change)
        } else {
            EventKind::DevGone(change)
        },
    )
}

fn link_up(ifindex: i32) -> RtRequest {
    RtRequest::NewLink(LinkMsg {
        ifindex,
        flags: 1,
        change: 1,
        ..LinkMsg::default()
    })
}

fn new_addr(ifindex: u32, ip: &str, prefix: u8) -> AddrMsg {
    AddrMsg {
        family: 2,
        prefix_len: prefix,
        ifindex,
        address: Some(ip.parse().expect("ip")),
        local: Some(ip.parse().expect("ip")),
    }
}

fn default_via(gw: &str) -> RouteMsg {
    RouteMsg {
        family: 2,
        dst_len: 0,
        table: 254,
        protocol: 3,
        scope: 0,
        route_type: 1,
        dst: None,
        gateway: Some(gw.parse().expect("ip")),
        oif: None,
        prefsrc: None,
    }
}

fn correlator() -> Correlator {
    Correlator::new(CorrelatorConfig {
        deadline: Duration::from_secs(1),
        rules: SandboxRules::default(),
        read_wait: SNAPSHOT_WAIT,
    })
}

fn verdicts(reports: Vec<Report>) -> Vec<NetnsVerdict> {
    reports
        .into_iter()
        .filter_map(|r| match r {
            Report::Verdict(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// Feeds a full ptp-like setup of `cookie` by pid 500.
fn wire(c: &mut Correlator, cookie: u64) {
    c.feed(&request(10, 500, cookie, 1, link_up(1)));
    c.feed(&dev(11, cookie, 1, "lo", true, false));
    c.feed(&request(20, 500, cookie, 2, link_up(3)));
    c.feed(&dev(21, cookie, 3, "eth0", true, false));
    c.feed(&reply(22, 500, cookie, 2, RTM_NEWLINK, 0));
    c.feed(&request(
        30,
        500,
        cookie,
        3,
        RtRequest::NewAddr(new_addr(3, "10.244.1.2", 24)),
    ));
    c.feed(&reply(31, 500, cookie, 3, RTM_NEWADDR, 0));
    c.feed(&request(
        40,
        500,
        cookie,
        4,
        RtRequest::NewRoute(default_via("10.244.1.1")),
    ));
    c.feed(&reply(41, 500, cookie, 4, RTM_NEWROUTE, 0));
}

/// A state read: `lo` up, and `eth0` (index 3) with what is given.
fn state(cookie: u64, eth0: Option<(bool, Option<&str>, Option<&str>)>) -> NetnsSnapshot {
    let mut links = vec![SnapshotLink {
        index: 1,
        name: "lo".into(),
        up: true,
    }];
    let mut addresses = Vec::new();
    let mut routes = Vec::new();
    if let Some((up, addr, gw)) = eth0 {
        links.push(SnapshotLink {
            index: 3,
            name: "eth0".into(),
            up,
        });
        if let Some(addr) = addr {
            addresses.push(SnapshotAddress {
                ifindex: 3,
                net: addr.parse().expect("net"),
                link_local: false,
            });
        }
        if let Some(gw) = gw {
            routes.push(SnapshotRoute {
                dst: "0.0.0.0/0".parse().expect("net"),
                gateway: Some(gw.parse().expect("ip")),
                oif: Some(3),
            });
        }
    }
    NetnsSnapshot {
        cookie,
        inode: u64::from(SANDBOX_INODE),
        links,
        addresses,
        routes,
    }
}

fn networked_state(cookie: u64) -> NetnsSnapshot {
    state(
        cookie,
        Some((true, Some("10.244.1.2/24"), Some("10.244.1.1"))),
    )
}

/// Ticks at `ms` and answers every read the correlator asks for with `answer`.
fn tick_reading(
    c: &mut Correlator,
    ms: u64,
    answer: impl Fn(u64) -> Result<NetnsSnapshot, String>,
) -> Vec<Report> {
    let mut reports = c.tick(t(ms));
    for request in c.take_snapshot_requests(t(ms), usize::MAX) {
        let read = answer(request.cookie);
        reports.extend(c.snapshot_taken(
            request.cookie,
            read.as_ref().map_err(Clone::clone),
            t(ms),
            t(ms),
        ));
    }
    reports
}

fn lo_only(cookie: u64) -> Result<NetnsSnapshot, String> {
    Ok(state(cookie, None))
}

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
    let v = verdicts(c.tick(t(1_000)));
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
    let v = verdicts(tick_reading(&mut c, 1_000, lo_only));
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
    let v = verdicts(tick_reading(&mut c, 1_000, |cookie| {
        Ok(state(cookie, Some((true, None, None))))
    }));
    assert_eq!(v[0].verdict, Verdict::Partial);
    assert!(v[0].reason.contains("an address"), "{}", v[0].reason);
}

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
    let v = verdicts(tick_reading(c, 1_000, |cookie| {
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
    let v = verdicts(c.tick(t(1_000)));
    assert_eq!(v[0].verdict, Verdict::Networked, "{}", v[0].reason);
}

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
    let v = verdicts(c.tick(t(1_000)));
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

fn intent(origin: IntentOrigin) -> Intent {
    Intent {
        key: IntentKey {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        },
        origin,
        netns_cookie: SANDBOX,
        ifname: "eth0".into(),
        addresses: vec!["10.244.1.2/24".parse().expect("net")],
        routes: vec![RouteIntent {
            dst: "0.0.0.0/0".parse().expect("net"),
            gateway: Some("10.244.1.1".parse().expect("ip")),
        }],
    }
}

fn intent_verdicts(reports: &[Report]) -> Vec<&IntentVerdict> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Intent(i) => Some(i),
            _ => None,
        })
        .collect()
}

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

/// The environment of CNI plugin `plugin` (pid `pid`, run by containerd pid 42) for a call
/// naming `netns`, with `args` as its `CNI_ARGS`.
fn cni_exec(ms: u64, pid: u32, plugin: &str, netns: &str, args: Option<&str>) -> TraceEvent {
    cni_exec_by(0, ms, pid, plugin, netns, args)
}

/// [`cni_exec`] of a plugin run by `uid`.
fn cni_exec_by(
    uid: u32,
    ms: u64,
    pid: u32,
    plugin: &str,
    netns: &str,
    args: Option<&str>,
) -> TraceEvent {
    ev(
        ms,
        pid,
        plugin,
        EventKind::ExecEnv(ExecEnv {
            parent_pid: 42,
            parent_comm: "containerd".into(),
            uid,
            cni: Some(crate::trace::cni_env::CniEnv {
                command: "ADD".into(),
                netns: netns.into(),
                container_id: "4bf982a7deadbeef".into(),
                args: args.map(str::to_owned),
            }),
            env_len: 300,
            copied: 300,
        }),
    )
}

const LOOPBACK_ONLY_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e-lo-only;K8S_POD_NAME=lo-only-0;K8S_POD_INFRA_CONTAINER_ID=4bf982a7deadbeef;K8S_POD_UID=u-0";

fn pinned_at(ms: u64, cookie: u64, target: &str) -> TraceEvent {
    ev(
        ms,
        43,
        "containerd",
        EventKind::BindMount(BindMount {
            task_netns: ns(cookie),
            source: "/proc/43/task/43/ns/net".into(),
            target: target.into(),
            flags: 4096,
        }),
    )
}

fn skipped_pod() -> crate::pod::Pod {
    crate::pod::Pod::from_cni_args(LOOPBACK_ONLY_ARGS).expect("a pod")
}

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
    let v = verdicts(tick_reading(&mut c, 1_000, lo_only));
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

    let mut reports = c.tick(t(1_000));
    let requests = c.take_snapshot_requests(t(1_000), usize::MAX);
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
            t(1_000),
            t(1_000),
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
