//! What the correlator tests share: synthetic trace events, namespace states, a correlator
//! and the readers of its reports.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::super::*;
use crate::dataplane::{SnapshotAddress, SnapshotLink, SnapshotRoute};
use crate::trace::kernel::events::{
    BindMount, DevChange, ExecEnv, NetlinkIo, NetlinkReply, NetlinkRequest, NetnsCreated,
    NetnsOrigin, TaskInfo,
};
use crate::trace::netlink_parse::{
    AddrMsg, LinkMsg, NlHeader, NlReply, NlRequest, RTM_DELADDR, RTM_DELLINK, RTM_DELROUTE,
    RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE, RTM_SETLINK, RouteMsg, RtRequest,
};
use crate::trace::verdict::{IntentOrigin, IntentVerdict, NetnsVerdict, RouteIntent};

pub(super) const SANDBOX: u64 = 100;
pub(super) const SANDBOX_INODE: u32 = 4_026_532_100;

pub(super) fn t(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000) + Duration::from_millis(ms)
}

pub(super) fn ev(ms: u64, pid: u32, comm: &str, kind: EventKind) -> TraceEvent {
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

pub(super) fn created(ms: u64, pid: u32, comm: &str, cookie: u64) -> TraceEvent {
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

pub(super) fn ns(cookie: u64) -> NetnsRef {
    NetnsRef {
        cookie,
        inode: SANDBOX_INODE,
    }
}

pub(super) fn io(cookie: u64) -> NetlinkIo {
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

pub(super) fn header(msg_type: u16, seq: u32) -> NlHeader {
    NlHeader {
        len: 40,
        msg_type,
        flags: 5,
        seq,
        port: 0,
    }
}

pub(super) fn request(ms: u64, pid: u32, cookie: u64, seq: u32, body: RtRequest) -> TraceEvent {
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

pub(super) fn reply(
    ms: u64,
    pid: u32,
    cookie: u64,
    seq: u32,
    msg_type: u16,
    error: i32,
) -> TraceEvent {
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

pub(super) fn dev(
    ms: u64,
    cookie: u64,
    ifindex: u32,
    name: &str,
    up: bool,
    dying: bool,
) -> TraceEvent {
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

pub(super) fn link_up(ifindex: i32) -> RtRequest {
    RtRequest::NewLink(LinkMsg {
        ifindex,
        flags: 1,
        change: 1,
        ..LinkMsg::default()
    })
}

pub(super) fn new_addr(ifindex: u32, ip: &str, prefix: u8) -> AddrMsg {
    AddrMsg {
        family: 2,
        prefix_len: prefix,
        ifindex,
        address: Some(ip.parse().expect("ip")),
        local: Some(ip.parse().expect("ip")),
    }
}

pub(super) fn default_via(gw: &str) -> RouteMsg {
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

pub(super) fn correlator() -> Correlator {
    Correlator::new(CorrelatorConfig {
        deadline: Duration::from_secs(1),
        rules: SandboxRules::default(),
        read_wait: SNAPSHOT_WAIT,
    })
}

pub(super) fn verdicts(reports: Vec<Report>) -> Vec<NetnsVerdict> {
    reports
        .into_iter()
        .filter_map(|r| match r {
            Report::Verdict(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// Feeds a full ptp-like setup of `cookie` by pid 500.
pub(super) fn wire(c: &mut Correlator, cookie: u64) {
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
pub(super) fn state(
    cookie: u64,
    eth0: Option<(bool, Option<&str>, Option<&str>)>,
) -> NetnsSnapshot {
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

pub(super) fn networked_state(cookie: u64) -> NetnsSnapshot {
    state(
        cookie,
        Some((true, Some("10.244.1.2/24"), Some("10.244.1.1"))),
    )
}

/// Ticks at `ms` and answers every read the correlator asks for with `answer`.
pub(super) fn tick_reading(
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

pub(super) fn lo_only(cookie: u64) -> Result<NetnsSnapshot, String> {
    Ok(state(cookie, None))
}

pub(super) fn intent(origin: IntentOrigin) -> Intent {
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

pub(super) fn intent_verdicts(reports: &[Report]) -> Vec<&IntentVerdict> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Intent(i) => Some(i),
            _ => None,
        })
        .collect()
}

/// The environment of CNI plugin `plugin` (pid `pid`, run by containerd pid 42) for a call
/// naming `netns`, with `args` as its `CNI_ARGS`.
pub(super) fn cni_exec(
    ms: u64,
    pid: u32,
    plugin: &str,
    netns: &str,
    args: Option<&str>,
) -> TraceEvent {
    cni_exec_by(0, ms, pid, plugin, netns, args)
}

/// [`cni_exec`] of a plugin run by `uid`.
pub(super) fn cni_exec_by(
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

pub(super) const LOOPBACK_ONLY_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e-lo-only;K8S_POD_NAME=lo-only-0;K8S_POD_INFRA_CONTAINER_ID=4bf982a7deadbeef;K8S_POD_UID=u-0";

pub(super) fn pinned_at(ms: u64, cookie: u64, target: &str) -> TraceEvent {
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

pub(super) fn skipped_pod() -> crate::pod::Pod {
    crate::pod::Pod::from_cni_args(LOOPBACK_ONLY_ARGS).expect("a pod")
}
