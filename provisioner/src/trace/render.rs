//! One-line human renderings of events and reports for `provisioner trace`.

use std::fmt::Write as _;

use super::events::{EventKind, TraceEvent};
use super::netlink_parse::op_name;
use super::verdict::{IntentStatus, Report, errno_text, format_time};

/// `HH:MM:SS.mmm comm[pid] <what>`
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
            let _ = write!(line, "rtnl-request netns={}", r.io.sock_netns.cookie);
            if r.io.sock_netns.cookie != r.io.task_netns.cookie {
                let _ = write!(line, " (task netns={})", r.io.task_netns.cookie);
            }
            for m in &r.messages {
                let _ = write!(line, " {} {}", m.body.op(), body_summary(&m.body));
                if m.truncated {
                    line.push_str(" [truncated]");
                }
            }
            if let Some(e) = &r.io.parse_error {
                let _ = write!(line, " unparsed: {e}");
            }
            Ok(())
        }
        EventKind::NetlinkReply(r) => {
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
    };
    line
}

fn body_summary(body: &super::netlink_parse::RtRequest) -> String {
    use super::netlink_parse::RtRequest;
    match body {
        RtRequest::NewLink(l) | RtRequest::DelLink(l) | RtRequest::SetLink(l) => {
            let mut s = l
                .ifname
                .clone()
                .unwrap_or_else(|| format!("#{}", l.ifindex));
            if let Some(k) = &l.kind {
                let _ = write!(s, " type {k}");
            }
            if let Some(p) = &l.peer {
                let _ = write!(s, " peer {}", p.ifname.as_deref().unwrap_or("?"));
                if let Some(n) = p.netns {
                    let _ = write!(s, " peer-netns {n:?}");
                }
            }
            if let Some(n) = l.netns {
                let _ = write!(s, " netns {n:?}");
            }
            if l.sets_up() {
                s.push_str(" up");
            } else if l.sets_down() {
                s.push_str(" down");
            }
            s
        }
        RtRequest::NewAddr(a) | RtRequest::DelAddr(a) => format!(
            "{}/{} dev #{}",
            a.addr().map_or_else(|| "?".into(), |x| x.to_string()),
            a.prefix_len,
            a.ifindex
        ),
        RtRequest::NewRoute(r) | RtRequest::DelRoute(r) => {
            let mut s = r.dst.map_or_else(
                || {
                    if r.dst_len == 0 {
                        "default".to_string()
                    } else {
                        format!("?/{}", r.dst_len)
                    }
                },
                |d| format!("{d}/{}", r.dst_len),
            );
            if let Some(g) = r.gateway {
                let _ = write!(s, " via {g}");
            }
            if let Some(o) = r.oif {
                let _ = write!(s, " dev #{o}");
            }
            s
        }
        RtRequest::Other { .. } => String::new(),
    }
}

/// A report and, for verdicts, its timeline (indented lines).
pub fn report_lines(report: &Report) -> String {
    match report {
        Report::Verdict(v) => {
            let mut s = format!(
                "{} VERDICT {} netns cookie={} inode={} creator={}",
                format_time(v.destroyed_at.unwrap_or(v.created_at)),
                v.verdict.as_str().to_uppercase(),
                v.netns.cookie,
                v.netns.inode,
                v.creator
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
            if let Some(r) = &v.repeat
                && r.count > 1
            {
                let _ = write!(
                    s,
                    " [{} skips from {}[{}] since {}]",
                    r.count,
                    r.creator_comm,
                    r.creator_pid,
                    format_time(r.first)
                );
            }
            for entry in &v.timeline {
                let _ = write!(s, "\n    {entry}");
            }
            s
        }
        Report::Intent(i) => {
            let mut s = format!(
                "INTENT {} {} netns cookie={} {} [evidence: {}]",
                intent_status(i.status),
                i.intent.key,
                i.intent.netns_cookie,
                i.intent.ifname,
                i.evidence
            );
            if !i.missing.is_empty() {
                let _ = write!(s, " missing: {}", i.missing.join(", "));
            }
            s
        }
        Report::Drift(d) => {
            let mut s = format!(
                "DRIFT {} netns cookie={}: {}",
                d.key, d.netns_cookie, d.what
            );
            if let Some(by) = &d.by {
                let _ = write!(s, " by {by}");
            }
            s
        }
    }
}

fn intent_status(status: IntentStatus) -> &'static str {
    match status {
        IntentStatus::Confirmed => "CONFIRMED",
        IntentStatus::Unconfirmed => "UNCONFIRMED",
        IntentStatus::Drifted => "DRIFTED",
    }
}
