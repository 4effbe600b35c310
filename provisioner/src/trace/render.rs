//! One-line human renderings of events and reports for `provisioner trace`.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::kernel::events::{EventKind, ExecEnv, NetlinkReply, NetlinkRequest, TraceEvent};
use super::kernel::netlink_parse::{RtRequest, op_name};
use super::verdict::{IntentStatus, IntentVerdict, NetnsVerdict, Report, errno_text, format_time};
use crate::pod::{PodName, PodSource, short_id};

/// `<RFC 3339 time> comm[pid] <what>`
pub fn event_line(event: &TraceEvent) -> String {
    let mut line = format!(
        "{} {}[{}] ",
        format_time(event.at),
        event.task.comm,
        event.task.pid
    );
    let _ = match &event.kind {
        EventKind::NetnsCreated(c) => write!(
            line,
            "netns-created cookie={} inode={} via {:?} (parent {}[{}])",
            c.netns_cookie, c.netns_inode, c.origin, c.parent_comm, c.parent_pid
        ),
        EventKind::NetlinkRequest(r) => {
            write_netlink_request(&mut line, r);
            Ok(())
        }
        EventKind::NetlinkReply(r) => {
            write_netlink_reply(&mut line, r);
            Ok(())
        }
        EventKind::Extack(e) => write!(
            line,
            "extack netns={} \"{}\"",
            e.task_netns.cookie, e.message
        ),
        EventKind::DevUp(d) | EventKind::DevGone(d) => write!(
            line,
            "{} {} #{} netns={}{}",
            if matches!(event.kind, EventKind::DevUp(_)) {
                "dev-up"
            } else {
                "dev-gone"
            },
            d.ifname,
            d.ifindex,
            d.netns.cookie,
            if d.netns_dying {
                " (netns destroyed)"
            } else {
                ""
            }
        ),
        EventKind::Exec(x) => write!(
            line,
            "exec {} netns={} (parent {}[{}])",
            x.filename, x.task_netns.cookie, x.parent_comm, x.parent_pid
        ),
        EventKind::BindMount(b) => write!(
            line,
            "bind-mount {} -> {} netns={}",
            b.source, b.target, b.task_netns.cookie
        ),
        EventKind::ExecEnv(x) => write_exec_env(&mut line, x),
    };
    // Names from the kernel (comm, file names, paths, interface names): one line, whatever
    // they hold.
    crate::text::escaped(&line).into_owned()
}

fn write_netlink_request(line: &mut String, r: &NetlinkRequest) {
    let _ = write!(line, "rtnl-request netns={}", r.io.sock_netns.cookie);
    if r.io.sock_netns.cookie != r.io.task_netns.cookie {
        let _ = write!(line, " (task netns={})", r.io.task_netns.cookie);
    }
    for m in &r.messages {
        let _ = write!(line, " {}", m.body.op());
        if let Some(detail) = RequestDetail::new(&m.body, &HashMap::new()) {
            let _ = write!(line, " {detail}");
        }
        if m.truncated {
            line.push_str(" [truncated]");
        }
    }
    if let Some(e) = &r.io.parse_error {
        let _ = write!(line, " unparsed: {e}");
    }
}

fn write_netlink_reply(line: &mut String, r: &NetlinkReply) {
    let _ = write!(line, "rtnl-reply netns={}", r.io.sock_netns.cookie);
    for a in &r.replies {
        let op = a.request.map_or("?", |h| op_name(h.msg_type));
        if a.error == 0 {
            let _ = write!(line, " {op} ack");
        } else {
            let _ = write!(line, " {op} {}", errno_text(a.error));
        }
        if let Some(msg) = &a.extack {
            let _ = write!(line, " ({msg})");
        }
    }
}

fn write_exec_env(line: &mut String, x: &ExecEnv) -> std::fmt::Result {
    let _ = write!(
        line,
        "exec-env (parent {}[{}])",
        x.parent_comm, x.parent_pid
    );
    match &x.cni {
        Some(cni) => write!(
            line,
            " CNI {} netns={} container={} args={}",
            cni.command,
            cni.netns,
            cni.container_id,
            cni.args.as_deref().unwrap_or("-")
        ),
        None if x.copied == 0 => write!(line, " environment not readable"),
        None => write!(line, " no CNI call"),
    }
}

/// What a change request does, in words (`eth0 up`, `10.0.0.2/24 dev eth0`,
/// `default via 10.0.0.1 dev eth0`). Rendered when shown: the tracer keeps the request as
/// parsed, with the name that the interface it names by index only had when it was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestDetail {
    /// Boxed: a timeline step is as large as its largest kind.
    body: Box<RtRequest>,
    /// The name of the interface the request names by index only, as known then.
    dev: Option<String>,
}

impl RequestDetail {
    /// The detail of `body`, interfaces named from `ifnames` when it gives only an index;
    /// `None` for dumps, gets and empty probes.
    pub fn new(body: &RtRequest, ifnames: &HashMap<u32, String>) -> Option<Self> {
        let by_index = match body {
            RtRequest::NewLink(link) | RtRequest::SetLink(link) | RtRequest::DelLink(link) => {
                let probe = link.ifindex == 0 && link.ifname.is_none();
                if probe && !matches!(body, RtRequest::DelLink(_)) {
                    return None;
                }
                link.ifname.is_none().then_some(link.ifindex.unsigned_abs())
            }
            RtRequest::NewAddr(addr) | RtRequest::DelAddr(addr) => {
                addr.addr()?;
                Some(addr.ifindex)
            }
            RtRequest::NewRoute(route) | RtRequest::DelRoute(route) => route.oif,
            RtRequest::Other { .. } => return None,
        };
        Some(Self {
            body: Box::new(body.clone()),
            dev: by_index.and_then(|index| ifnames.get(&index).cloned()),
        })
    }

    /// The interface `index` (or `name`, when the request gives it).
    fn dev<'a>(&'a self, index: u32, name: &'a Option<String>) -> DevName<'a> {
        match name.as_deref().or(self.dev.as_deref()) {
            Some(name) => DevName::Name(name),
            None => DevName::Index(index),
        }
    }
}

/// An interface's name, or `#<index>` when it is not known.
enum DevName<'a> {
    Name(&'a str),
    Index(u32),
}

impl std::fmt::Display for DevName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DevName::Name(name) => f.write_str(name),
            DevName::Index(index) => write!(f, "#{index}"),
        }
    }
}

impl std::fmt::Display for RequestDetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.body {
            RtRequest::NewLink(link) | RtRequest::SetLink(link) => {
                write!(f, "{}", self.dev(link.ifindex.unsigned_abs(), &link.ifname))?;
                if let Some(kind) = &link.kind {
                    write!(f, " type {kind}")?;
                }
                if let Some(peer) = &link.peer {
                    write!(f, " peer {}", peer.ifname.as_deref().unwrap_or("?"))?;
                    if let Some(target) = peer.netns {
                        write!(f, " (peer netns {target:?})")?;
                    }
                }
                if let Some(target) = link.netns {
                    write!(f, " -> netns {target:?}")?;
                }
                if link.sets_up() {
                    f.write_str(" up")
                } else if link.sets_down() {
                    f.write_str(" down")
                } else {
                    Ok(())
                }
            }
            RtRequest::DelLink(link) => {
                write!(f, "{}", self.dev(link.ifindex.unsigned_abs(), &link.ifname))
            }
            RtRequest::NewAddr(addr) | RtRequest::DelAddr(addr) => match addr.addr() {
                Some(ip) => write!(
                    f,
                    "{ip}/{} dev {}",
                    addr.prefix_len,
                    self.dev(addr.ifindex, &None)
                ),
                None => f.write_str("?"),
            },
            RtRequest::NewRoute(route) | RtRequest::DelRoute(route) => {
                match route.dst {
                    Some(dst) => write!(f, "{dst}/{}", route.dst_len)?,
                    None if route.dst_len == 0 => f.write_str("default")?,
                    None => write!(f, "?/{}", route.dst_len)?,
                }
                if let Some(gw) = route.gateway {
                    write!(f, " via {gw}")?;
                }
                if let Some(oif) = route.oif {
                    write!(f, " dev {}", self.dev(oif, &None))?;
                }
                if !matches!(route.table, 0 | 254) {
                    write!(f, " table {}", route.table)?;
                }
                Ok(())
            }
            RtRequest::Other { msg_type } => write!(f, "{}", op_name(*msg_type)),
        }
    }
}

impl serde::Serialize for RequestDetail {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A verdict and its timeline (indented lines); the pod first, where it is a sandbox's.
pub fn verdict_lines(v: &NetnsVerdict) -> String {
    let mut lines = Vec::with_capacity(2 + v.timeline.len());
    let mut s = format!(
        "{} VERDICT {} ",
        format_time(v.destroyed_at.unwrap_or(v.created_at)),
        v.verdict.as_str().to_uppercase(),
    );
    if let Some(pod) = &v.pod {
        s.push_str(&pod_label(pod));
        s.push(' ');
    }
    let _ = write!(
        s,
        "netns cookie={} inode={} creator={}",
        v.netns.cookie, v.netns.inode, v.creator
    );
    if let Some(why) = &v.sandbox {
        let _ = write!(s, " sandbox: {why}");
    }
    if let Some(old) = v.revises {
        let _ = write!(s, " (revises {}", old.as_str().to_uppercase());
        if let Some(ms) = v.late_ms {
            let _ = write!(s, ", late by {ms} ms");
        }
        s.push(')');
    }
    let _ = write!(s, ": {} [evidence: {}]", v.reason, v.evidence);
    // Each line escaped on its own: the names in it come from the kernel, the line breaks
    // between them are this rendering's.
    let mut last = match &v.diagnosis {
        Some(why) => {
            lines.push(s);
            format!("  why: {why}")
        }
        None => s,
    };
    if let Some(r) = &v.repeat
        && r.count > 1
    {
        let _ = write!(
            last,
            " [{} skips from {}[{}] since {}]",
            r.count,
            r.creator_comm,
            r.creator_pid,
            format_time(r.first)
        );
    }
    lines.push(last);
    lines.extend(v.timeline.iter().map(|entry| format!("    {entry}")));
    lines
        .iter()
        .map(|line| crate::text::escaped(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `pod default/web-0 (uid .., sandbox 4bf982a7, via loopback)`: who named it last in the
/// parentheses; `pod unknown (reason)`.
pub fn pod_label(pod: &PodName) -> String {
    let PodName::Known { pod, source } = pod else {
        return pod.to_string();
    };
    let mut extra = Vec::with_capacity(3);
    if let Some(uid) = &pod.uid {
        extra.push(format!("uid {uid}"));
    }
    if let Some(id) = &pod.sandbox_id {
        extra.push(format!("sandbox {}", short_id(id)));
    }
    extra.push(match source {
        PodSource::CniCall => "via its CNI call".to_owned(),
        PodSource::PluginExec { plugin } => format!("via {plugin}"),
        PodSource::Cri { runtime } => format!("via {runtime}"),
    });
    format!("pod {} ({})", pod.qualified_name(), extra.join(", "))
}

/// A report and, for verdicts, its timeline (indented lines).
pub fn report_lines(report: &Report) -> String {
    match report {
        Report::Verdict(v) => verdict_lines(v),
        Report::Intent(i) => intent_line(i, None),
        Report::Drift(d) => {
            let mut s = format!(
                "DRIFT {} netns cookie={}: {}",
                d.key, d.netns_cookie, d.what
            );
            if let Some(by) = &d.by {
                let _ = write!(s, " by {by}");
            }
            crate::text::escaped(&s).into_owned()
        }
    }
}

/// `INTENT CONFIRMED pod <ns>/<name> (uid .., sandbox ..) container <id> (<ifname>) netns
/// cookie=... eth0 [evidence: ...]`; without `pod` (none named) the pod is left out.
pub fn intent_line(i: &IntentVerdict, pod: Option<&crate::pod::Pod>) -> String {
    let pod = pod.map(|p| format!("pod {p} ")).unwrap_or_default();
    let mut s = format!(
        "INTENT {} {pod}{} netns cookie={} {} [evidence: {}]",
        intent_status(i.status),
        i.intent.key,
        i.intent.netns_cookie,
        i.intent.ifname,
        i.evidence
    );
    if !i.missing.is_empty() {
        let _ = write!(s, " missing: {}", i.missing.join(", "));
    }
    crate::text::escaped(&s).into_owned()
}

fn intent_status(status: IntentStatus) -> &'static str {
    match status {
        IntentStatus::Confirmed => "CONFIRMED",
        IntentStatus::Unconfirmed => "UNCONFIRMED",
        IntentStatus::Drifted => "DRIFTED",
    }
}
