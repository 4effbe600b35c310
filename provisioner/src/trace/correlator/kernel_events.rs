//! What each kernel event does to the timelines: a namespace created, pinned, configured by
//! netlink requests and their answers, a device up or gone, a binary executed, a namespace
//! destroyed.

use std::path::PathBuf;

use crate::trace::kernel::events::{
    BindMount, DevChange, Exec, NetlinkReply, NetlinkRequest, NetnsCreated, NetnsRef, TraceEvent,
};
use crate::trace::netlink_parse::{is_change_type, op_name};
use crate::trace::sandbox_rules::{PinSource, parse_pin_source};
use crate::trace::verdict::{Creator, Evidence, Report, RequestStatus, Step, TimelineEntry};

use super::effects::{Effect, describe};
use super::execs::RecentExec;
use super::pods::{self, NetnsName};
use super::timeline::Ns;
use super::{Correlator, MAX_BY_PID, MAX_NAMESPACES};

impl Correlator {
    pub(super) fn on_created(&mut self, event: &TraceEvent, created: &NetnsCreated) {
        let netns = NetnsRef {
            cookie: created.netns_cookie,
            inode: created.netns_inode,
        };
        let mut ns = Ns::new(netns, event.at);
        ns.origin_known = true;
        ns.creator = Creator {
            pid: event.task.pid,
            comm: event.task.comm.clone(),
            parent_pid: created.parent_pid,
            parent_comm: created.parent_comm.clone(),
            cgroup_id: event.task.cgroup_id,
        };
        ns.add_handle(PathBuf::from(format!("/proc/{}/ns/net", created.owner_pid)));
        ns.push(
            event,
            Step::Created {
                origin: format!("{:?}", created.origin).to_lowercase(),
            },
            None,
        );
        if self.by_pid.len() >= MAX_BY_PID {
            self.by_pid.clear();
        }
        self.by_pid.insert(created.owner_pid, netns.cookie);
        self.by_pid.insert(event.task.pid, netns.cookie);
        if !self.namespaces.contains_key(&netns.cookie) && self.namespaces.len() >= MAX_NAMESPACES {
            self.evict_one();
        }
        let waiting = if self.pending_cni.is_empty() {
            Vec::new()
        } else {
            let pids = [created.owner_pid, event.task.pid];
            self.pending_cni.take(
                event.at,
                |name| matches!(name, NetnsName::Process { pid, .. } if pids.contains(pid)),
            )
        };
        if let Some(previous) = self.namespaces.insert(netns.cookie, Box::new(ns))
            && let Some(ns) = self.namespaces.get_mut(&netns.cookie)
        {
            // A timeline started early (an ADD named it first): keep what it knew.
            ns.expected |= previous.expected;
            ns.deadline_from = ns.deadline_from.max(previous.deadline_from);
            ns.setup_seen_at = ns.setup_seen_at.max(previous.setup_seen_at);
            for path in previous.handles {
                ns.add_handle(path);
            }
            for entry in previous.entries {
                ns.push_at(entry.public, entry.effect);
            }
            ns.pod = previous.pod;
        }
        for call in waiting {
            self.cni_call(netns.cookie, &call);
        }
    }

    pub(super) fn on_bind_mount(&mut self, event: &TraceEvent, mount: &BindMount) -> Option<u64> {
        let target = PathBuf::from(&mount.target);
        if !self.config.rules.is_pin_location(&target) {
            return None;
        }
        let cookie = match parse_pin_source(&mount.source)? {
            PinSource::Caller => mount.task_netns.cookie,
            PinSource::Task { pid, tid }
                if pid == event.task.pid && tid.is_none_or(|t| t == event.task.tid) =>
            {
                mount.task_netns.cookie
            }
            PinSource::Task { pid, .. } => *self.by_pid.get(&pid)?,
        };
        let ns = self.namespaces.get_mut(&cookie)?;
        if !ns.add_pin(target.clone()) {
            return None;
        }
        ns.push(
            event,
            Step::Pinned {
                path: target.clone(),
            },
            None,
        );
        if !self.pending_cni.is_empty() {
            let pin = pods::normal(&target);
            for call in self
                .pending_cni
                .take(event.at, |name| *name == NetnsName::Path(pin.clone()))
            {
                self.cni_call(cookie, &call);
            }
        }
        Some(cookie)
    }

    pub(super) fn on_exec(&mut self, event: &TraceEvent, exec: &Exec) -> Option<u64> {
        self.execs.push(RecentExec {
            at: event.at,
            pid: event.task.pid,
            parent_pid: exec.parent_pid,
            comm: event.task.comm.clone(),
            filename: exec.filename.clone(),
        });
        let cookie = exec.task_netns.cookie;
        let ns = self.namespaces.get_mut(&cookie)?;
        ns.attribute(event.task.pid);
        ns.add_handle(PathBuf::from(format!("/proc/{}/ns/net", event.task.pid)));
        ns.push(
            event,
            Step::Exec {
                filename: exec.filename.clone(),
            },
            None,
        );
        Some(cookie)
    }

    pub(super) fn on_request(
        &mut self,
        event: &TraceEvent,
        request: &NetlinkRequest,
    ) -> Option<u64> {
        let mut extack = self.requests.take_extack(event.task.tid);
        let cookie = request.io.sock_netns.cookie;
        if !self.namespaces.contains_key(&cookie) {
            return None;
        }
        self.attribute_execs(cookie, event.task.pid);
        let ns = self.namespaces.get_mut(&cookie)?;
        if request.io.task_netns.cookie == cookie {
            ns.add_handle(PathBuf::from(format!(
                "/proc/{}/task/{}/ns/net",
                event.task.pid, event.task.tid
            )));
        }
        // An answer found when the request was sent (see `NetlinkRequest::answer`). An ACK comes
        // no other way, so an acked request is not waited for; an error also comes as a reply,
        // which finds its request.
        let answer = request.answer.filter(|_| request.messages.len() == 1);
        let awaits_reply = answer != Some(0);
        for message in &request.messages {
            let key = (event.task.pid, request.io.fd, message.header.seq);
            let Some((detail, effect)) = describe(message, ns.ifnames()) else {
                if awaits_reply {
                    self.requests.sent(key, None);
                }
                continue;
            };
            ns.setup_at_work(event.at);
            let status = match answer {
                None => RequestStatus::Sent,
                Some(0) => RequestStatus::Acked,
                Some(errno) => RequestStatus::Rejected {
                    errno,
                    extack: extack.clone(),
                },
            };
            let id = ns.push(
                event,
                Step::Request {
                    op: message.body.op(),
                    detail,
                    status,
                },
                effect,
            );
            if awaits_reply {
                self.requests.sent(key, Some((cookie, id)));
            }
            ns.set_extack(id, extack.take());
        }
        Some(cookie)
    }

    pub(super) fn on_reply(&mut self, event: &TraceEvent, reply: &NetlinkReply) -> Option<u64> {
        let mut touched = None;
        for answer in &reply.replies {
            let Some(request) = answer.request else {
                continue;
            };
            let key = (event.task.pid, reply.io.fd, request.seq);
            let pending = self.requests.answered(key);
            if matches!(pending, Some(None)) {
                continue;
            }
            if let Some(Some((cookie, id))) = pending
                && self
                    .namespaces
                    .get_mut(&cookie)
                    .is_some_and(|ns| ns.answer(id, answer.error, answer.extack.clone()))
            {
                touched = Some(cookie);
                continue;
            }
            let cookie = reply.io.sock_netns.cookie;
            if answer.error < 0
                && is_change_type(request.msg_type)
                && let Some(ns) = self.namespaces.get_mut(&cookie)
            {
                ns.push(
                    event,
                    Step::UnmatchedReply {
                        op: op_name(request.msg_type),
                        errno: answer.error,
                        extack: answer.extack.clone(),
                    },
                    None,
                );
                touched = Some(cookie);
            }
        }
        touched
    }

    pub(super) fn on_dev(&mut self, event: &TraceEvent, dev: &DevChange, up: bool) -> Option<u64> {
        let ns = self.namespaces.get_mut(&dev.netns.cookie)?;
        ns.name_interface(dev.ifindex, &dev.ifname);
        // Multi-queue devices report one root qdisc per queue: keep the first.
        let duplicate = ns.entries.iter().rev().take(4).any(|e| {
            matches!((&e.effect, up),
                (Some(Effect::DevUp { ifindex, .. }), true) | (Some(Effect::DevGone { ifindex, .. }), false)
                if *ifindex == dev.ifindex)
        });
        if duplicate {
            return None;
        }
        let (ifindex, ifname) = (dev.ifindex, dev.ifname.clone());
        let (step, effect) = if up {
            (
                Step::DevUp {
                    ifname: ifname.clone(),
                    ifindex,
                },
                Effect::DevUp { ifindex, ifname },
            )
        } else {
            (
                Step::DevGone {
                    ifname: ifname.clone(),
                    ifindex,
                },
                Effect::DevGone { ifindex, ifname },
            )
        };
        ns.push(event, step, Some(effect));
        Some(dev.netns.cookie)
    }

    pub(super) fn on_destroyed(&mut self, event: &TraceEvent, cookie: u64) -> Vec<Report> {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return Vec::new();
        };
        if ns.destroyed_at.is_some() {
            return Vec::new();
        }
        ns.destroyed_at = Some(event.at);
        ns.recheck = None;
        let by = TimelineEntry {
            at: event.at,
            pid: event.task.pid,
            comm: event.task.comm.clone(),
            step: Step::Destroyed,
        };
        ns.push_at(by.clone(), None);
        let mut reports = self.changed(cookie, Evidence::Trace);
        reports.extend(self.intents.destroyed(cookie, &by));
        if self
            .namespaces
            .get(&cookie)
            .is_some_and(|ns| ns.verdict.is_none())
            && let Some(verdict) = self.decide(cookie, None, event.at)
        {
            reports.push(Report::Verdict(verdict));
        }
        self.namespaces.remove(&cookie);
        reports
    }

    /// Adds the execs that led to `pid` touching `cookie` (its own and its children's).
    fn attribute_execs(&mut self, cookie: u64, pid: u32) {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return;
        };
        if !ns.attribute(pid) {
            return;
        }
        for exec in self.execs.leading_to(pid) {
            ns.push_at(
                TimelineEntry {
                    at: exec.at,
                    pid: exec.pid,
                    comm: exec.comm.clone(),
                    step: Step::Exec {
                        filename: exec.filename.clone(),
                    },
                },
                None,
            );
        }
    }
}
