//! Correlator unit tests over synthetic events (no root, no kernel).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::trace::events::{
    BindMount, DevChange, Exec, Extack, NetlinkIo, NetnsCreated, NetnsOrigin, TaskInfo,
};
use crate::trace::netlink_parse::{
    AddrMsg, LinkMsg, NlHeader, NlReply, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE, RouteMsg,
};
use crate::trace::verdict::RouteIntent;

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
        RtRequest::DelAddr(_) => 21,
        RtRequest::DelRoute(_) => 25,
        RtRequest::DelLink(_) => 17,
        RtRequest::SetLink(_) => 19,
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

#[test]
fn runtime_sandbox_with_nothing_is_skipped_at_the_deadline_naming_its_creator() {
    let mut c = correlator();
    assert!(c.feed(&created(0, 42, "containerd", SANDBOX)).is_empty());
    assert!(c.tick(t(999)).is_empty(), "not before the deadline");
    let v = verdicts(c.tick(t(1_000)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert_eq!(v[0].creator.comm, "containerd");
    assert_eq!(v[0].creator.pid, 42);
    assert!(matches!(
        v[0].sandbox,
        Some(SandboxReason::RuntimeCreator { .. })
    ));
    assert!(v[0].reason.contains("no interface"), "{}", v[0].reason);
    assert!(c.tick(t(5_000)).is_empty(), "decided once");
}

#[test]
fn repeated_skips_from_one_creator_are_summarised() {
    let mut c = correlator();
    for i in 0..3 {
        c.feed(&created(i * 100, 42, "containerd", SANDBOX + i));
    }
    let v = verdicts(c.tick(t(5_000)));
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
fn full_setup_is_networked() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    wire(&mut c, SANDBOX);
    let v = verdicts(c.tick(t(1_000)));
    assert_eq!(v[0].verdict, Verdict::Networked, "{}", v[0].reason);
    assert!(v[0].reason.contains("eth0"));
}

#[test]
fn loopback_only_is_skipped_and_shows_lo() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&request(10, 500, SANDBOX, 1, link_up(1)));
    c.feed(&dev(11, SANDBOX, 1, "lo", true, false));
    let v = verdicts(c.tick(t(1_000)));
    assert_eq!(v[0].verdict, Verdict::Skipped);
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
    let v = verdicts(c.tick(t(1_000)));
    assert_eq!(v[0].verdict, Verdict::Partial);
    assert!(v[0].reason.contains("an address"), "{}", v[0].reason);
}

#[test]
fn rejected_route_is_failed_with_errno_and_extack() {
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
    c.feed(&request(
        40,
        500,
        SANDBOX,
        4,
        RtRequest::NewRoute(default_via("10.10.0.1")),
    ));
    c.feed(&reply(41, 500, SANDBOX, 4, RTM_NEWROUTE, -101));
    let v = verdicts(c.tick(t(1_000)));
    assert_eq!(v[0].verdict, Verdict::Failed);
    assert!(v[0].reason.contains("ENETUNREACH"), "{}", v[0].reason);
    assert!(
        v[0].reason.contains("Nexthop has invalid gateway"),
        "{}",
        v[0].reason
    );
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
    // And a live one is silently dropped at its deadline.
    c.feed(&created(200, 77, "stress", SANDBOX + 1));
    assert!(verdicts(c.tick(t(2_000))).is_empty());
    assert!(!c.is_tracked(SANDBOX + 1));
}

#[test]
fn sandbox_destroyed_early_is_skipped_at_once() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.feed(&request(5, 42, SANDBOX, 1, link_up(1)));
    c.feed(&dev(6, SANDBOX, 1, "lo", true, false));
    let v = verdicts(c.feed(&dev(30, SANDBOX, 1, "lo", false, true)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].verdict, Verdict::Skipped);
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
    let v = verdicts(c.tick(t(1_000)));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].netns.cookie, SANDBOX);
    assert_eq!(v[0].verdict, Verdict::Skipped);
    assert!(matches!(v[0].sandbox, Some(SandboxReason::Pinned { .. })));
}

#[test]
fn expected_namespace_is_judged_whoever_created_it() {
    let mut c = correlator();
    c.expect_sandbox(NetnsKey::Inode(SANDBOX_INODE), t(0));
    c.feed(&created(0, 77, "myruntime", SANDBOX));
    let v = verdicts(c.tick(t(1_000)));
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

fn intent() -> Intent {
    Intent {
        netns_cookie: SANDBOX,
        ifname: "eth0".into(),
        addresses: vec!["10.244.1.2/24".parse().expect("net")],
        routes: vec![RouteIntent {
            dst: "0.0.0.0/0".parse().expect("net"),
            gateway: Some("10.244.1.1".parse().expect("ip")),
        }],
    }
}

#[test]
fn intent_confirmed_then_drift_reported() {
    let mut c = correlator();
    c.feed(&created(0, 42, "provisioner", SANDBOX));
    let (id, reports) = c.register_intent(intent(), t(1));
    assert!(reports.is_empty());
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
            [Report::Intent(IntentVerdict { status: IntentStatus::Confirmed, id: got, .. })] if *got == id
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
        matches!(drift.as_slice(), [Report::Drift(d)] if d.what.contains("route 0.0.0.0/0")),
        "{drift:?}"
    );
    assert_eq!(c.metrics().drifts, 1);
}

#[test]
fn intent_unconfirmed_at_deadline_lists_missing_steps() {
    let mut c = correlator();
    c.feed(&created(0, 42, "provisioner", SANDBOX));
    c.register_intent(intent(), t(0));
    c.feed(&dev(21, SANDBOX, 3, "eth0", true, false));
    let reports = c.tick(t(1_000));
    let unconfirmed = reports.iter().find_map(|r| match r {
        Report::Intent(i) => Some(i),
        _ => None,
    });
    let unconfirmed = unconfirmed.expect("intent verdict");
    assert_eq!(unconfirmed.status, IntentStatus::Unconfirmed);
    assert_eq!(unconfirmed.missing.len(), 2, "{:?}", unconfirmed.missing);
}

#[test]
fn metrics_count_events_and_verdicts() {
    let mut c = correlator();
    c.feed(&created(0, 42, "containerd", SANDBOX));
    c.tick(t(1_000));
    let m = c.metrics();
    assert_eq!(m.events.get("netns_created"), Some(&1));
    assert_eq!(m.verdicts.get("skipped"), Some(&1));
}
