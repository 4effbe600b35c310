//! The correlator: a timeline per network namespace (by cookie) and a verdict per sandbox.
//!
//! Pure logic: feed it [`TraceEvent`]s and a clock (`tick(now)`), collect [`Report`]s. It
//! never touches the kernel, so it is unit-tested with synthetic events.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::events::{DevChange, EventKind, NetlinkReply, NetlinkRequest, NetnsRef, TraceEvent};
use super::netlink_parse::{NlRequest, RtRequest, op_name};
use super::sandbox_rules::{PinSource, SandboxReason, SandboxRules, parse_pin_source};
use super::verdict::{
    Creator, Drift, Intent, IntentId, IntentStatus, IntentVerdict, NetnsVerdict, Report,
    RequestStatus, SkipSummary, Step, TimelineEntry, Verdict, errno_text,
};

const LOOPBACK_IFINDEX: u32 = 1;
/// Bounds on the bookkeeping of in-flight requests and recent execs.
const MAX_PENDING: usize = 8192;
const MAX_RECENT_EXECS: usize = 512;

/// How the correlator decides.
#[derive(Clone, Debug)]
pub struct CorrelatorConfig {
    /// Time a namespace has, from its creation, to get its network.
    pub deadline: Duration,
    pub rules: SandboxRules,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(10),
            rules: SandboxRules::default(),
        }
    }
}

/// A namespace named by the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetnsKey {
    Cookie(u64),
    /// Inode of the namespace (matched against namespaces seen being created).
    Inode(u32),
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CorrelatorMetrics {
    /// Verdicts given, by verdict name.
    pub verdicts: BTreeMap<&'static str, u64>,
    /// Events fed, by kind name.
    pub events: BTreeMap<&'static str, u64>,
    pub intents_confirmed: u64,
    pub intents_unconfirmed: u64,
    pub drifts: u64,
    /// Namespaces currently tracked.
    pub tracked_namespaces: usize,
}

/// What a request does, as far as verdicts care.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Effect {
    LinkNew {
        ifname: Option<String>,
    },
    LinkUp {
        ifindex: u32,
        ifname: Option<String>,
    },
    LinkDown {
        ifindex: u32,
        ifname: Option<String>,
    },
    LinkDel {
        ifindex: u32,
        ifname: Option<String>,
    },
    AddrAdd {
        ifindex: u32,
        addr: IpAddr,
        prefix: u8,
    },
    AddrDel {
        ifindex: u32,
        addr: IpAddr,
        prefix: u8,
    },
    RouteAdd(RouteKey),
    RouteDel(RouteKey),
    DevUp {
        ifindex: u32,
        ifname: String,
    },
    DevGone {
        ifindex: u32,
        ifname: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct RouteKey {
    dst: Option<IpAddr>,
    dst_len: u8,
    gateway: Option<IpAddr>,
    default: bool,
}

struct Entry {
    public: TimelineEntry,
    effect: Option<Effect>,
    /// An extack seen while the kernel processed this request.
    extack: Option<String>,
}

struct Ns {
    netns: NetnsRef,
    created_at: SystemTime,
    creator: Creator,
    origin_known: bool,
    pins: Vec<PathBuf>,
    expected: bool,
    entries: Vec<Entry>,
    ifnames: HashMap<u32, String>,
    destroyed_at: Option<SystemTime>,
    decided: bool,
    attributed_pids: HashSet<u32>,
}

/// What the timeline adds up to.
#[derive(Default)]
struct Facts {
    up: HashSet<String>,
    lo_up: bool,
    addrs: Vec<(u32, IpAddr, u8)>,
    routes: Vec<RouteKey>,
    non_lo_steps: usize,
    rejected: Vec<String>,
}

impl Facts {
    fn mark_up(&mut self, ifindex: u32, name: String) {
        if ifindex == LOOPBACK_IFINDEX || name == "lo" {
            self.lo_up = true;
        } else {
            self.non_lo_steps += 1;
            self.up.insert(name);
        }
    }

    fn has_default_route(&self) -> bool {
        self.routes.iter().any(|r| r.default)
    }

    fn has_address(&self) -> bool {
        self.addrs
            .iter()
            .any(|(idx, a, _)| *idx != LOOPBACK_IFINDEX && !a.is_loopback())
    }
}

struct RecentExec {
    at: SystemTime,
    pid: u32,
    parent_pid: u32,
    comm: String,
    filename: String,
}

struct IntentState {
    id: IntentId,
    intent: Intent,
    registered_at: SystemTime,
    status: Option<IntentStatus>,
    drifted: HashSet<String>,
}

/// Timelines and verdicts.
pub struct Correlator {
    config: CorrelatorConfig,
    namespaces: HashMap<u64, Ns>,
    /// Latest netns created with a given owner pid (clone) or by a pid (unshare).
    by_pid: HashMap<u32, u64>,
    expected_inodes: HashSet<u32>,
    /// (pid, fd, seq) of requests in flight -> (cookie, entry index); `None` for requests
    /// that do not matter to verdicts (their answers are dropped too).
    pending: HashMap<(u32, u32, u32), Option<(u64, usize)>>,
    /// Extack messages per thread, waiting for the request they belong to: the kernel
    /// reports a request once it has processed it, so its extack comes first.
    pending_extack: HashMap<u32, String>,
    recent_execs: VecDeque<RecentExec>,
    /// Skips by creator comm (a runtime forks a new helper per sandbox: the pid varies).
    skips: HashMap<String, SkipSummary>,
    intents: Vec<IntentState>,
    next_intent: IntentId,
    metrics: CorrelatorMetrics,
}

impl Correlator {
    pub fn new(config: CorrelatorConfig) -> Self {
        Self {
            config,
            namespaces: HashMap::new(),
            by_pid: HashMap::new(),
            expected_inodes: HashSet::new(),
            pending: HashMap::new(),
            pending_extack: HashMap::new(),
            recent_execs: VecDeque::new(),
            skips: HashMap::new(),
            intents: Vec::new(),
            next_intent: 1,
            metrics: CorrelatorMetrics::default(),
        }
    }

    pub fn config(&self) -> &CorrelatorConfig {
        &self.config
    }

    /// Counters so far.
    pub fn metrics(&self) -> CorrelatorMetrics {
        CorrelatorMetrics {
            tracked_namespaces: self.namespaces.len(),
            ..self.metrics.clone()
        }
    }

    /// Repeated skips per creator.
    pub fn skip_summaries(&self) -> Vec<SkipSummary> {
        let mut all: Vec<_> = self.skips.values().cloned().collect();
        all.sort_by_key(|s| s.first);
        all
    }

    /// Whether the namespace is tracked (created while tracing, or expected).
    pub fn is_tracked(&self, cookie: u64) -> bool {
        self.namespaces.contains_key(&cookie)
    }

    /// The timeline of a tracked namespace so far.
    pub fn timeline(&self, cookie: u64) -> Option<Vec<TimelineEntry>> {
        self.namespaces
            .get(&cookie)
            .map(|ns| ns.entries.iter().map(|e| e.public.clone()).collect())
    }

    /// Marks a namespace as a sandbox, whoever created it. A cookie not seen yet starts a
    /// timeline now (its deadline runs from `now`).
    pub fn expect_sandbox(&mut self, key: NetnsKey, now: SystemTime) {
        match key {
            NetnsKey::Cookie(cookie) => {
                self.namespaces
                    .entry(cookie)
                    .or_insert_with(|| Ns::new(NetnsRef { cookie, inode: 0 }, now))
                    .expected = true;
            }
            NetnsKey::Inode(inode) => {
                let found = self
                    .namespaces
                    .values_mut()
                    .filter(|ns| ns.netns.inode == inode && ns.destroyed_at.is_none())
                    .max_by_key(|ns| ns.created_at);
                match found {
                    Some(ns) => ns.expected = true,
                    None => {
                        self.expected_inodes.insert(inode);
                    }
                }
            }
        }
    }

    /// Registers what the daemon configures in a sandbox; the answer comes as a
    /// [`Report::Intent`] (at once when the timeline already shows everything).
    pub fn register_intent(&mut self, intent: Intent, now: SystemTime) -> (IntentId, Vec<Report>) {
        self.expect_sandbox(NetnsKey::Cookie(intent.netns_cookie), now);
        let id = self.next_intent;
        self.next_intent += 1;
        let cookie = intent.netns_cookie;
        self.intents.push(IntentState {
            id,
            intent,
            registered_at: now,
            status: None,
            drifted: HashSet::new(),
        });
        let mut reports = Vec::new();
        self.check_intents(cookie, &mut reports);
        (id, reports)
    }

    /// Forgets an intent (the daemon's DEL): no drift is reported for it afterwards.
    pub fn remove_intent(&mut self, id: IntentId) {
        self.intents.retain(|i| i.id != id);
    }

    /// Feeds one kernel event.
    pub fn feed(&mut self, event: &TraceEvent) -> Vec<Report> {
        *self
            .metrics
            .events
            .entry(provisioner_common::kind::name(event.kind.kind()))
            .or_default() += 1;
        let mut reports = Vec::new();
        let touched = match &event.kind {
            EventKind::NetnsCreated(created) => {
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
                ns.expected = self.expected_inodes.remove(&netns.inode);
                ns.push(
                    event,
                    Step::Created {
                        origin: format!("{:?}", created.origin).to_lowercase(),
                    },
                    None,
                );
                self.by_pid.insert(created.owner_pid, netns.cookie);
                self.by_pid.insert(event.task.pid, netns.cookie);
                let previous = self.namespaces.insert(netns.cookie, ns);
                if let Some(mut previous) = previous {
                    // A timeline started early by expect_sandbox: keep what it knew.
                    if let Some(ns) = self.namespaces.get_mut(&netns.cookie) {
                        ns.expected |= previous.expected;
                        ns.entries.append(&mut previous.entries);
                    }
                }
                None
            }
            EventKind::BindMount(mount) => self.on_bind_mount(event, mount),
            EventKind::NetlinkRequest(request) => self.on_request(event, request),
            EventKind::NetlinkReply(reply) => self.on_reply(event, reply),
            EventKind::Extack(extack) => {
                if self.pending_extack.len() >= MAX_PENDING {
                    self.pending_extack.clear();
                }
                self.pending_extack
                    .insert(event.task.tid, extack.message.clone());
                None
            }
            EventKind::DevUp(dev) => self.on_dev(event, dev, true),
            EventKind::DevGone(dev) => {
                if dev.netns_dying {
                    self.on_destroyed(event, dev.netns.cookie, &mut reports);
                    None
                } else {
                    self.on_dev(event, dev, false)
                }
            }
            EventKind::Exec(exec) => {
                if self.recent_execs.len() >= MAX_RECENT_EXECS {
                    self.recent_execs.pop_front();
                }
                self.recent_execs.push_back(RecentExec {
                    at: event.at,
                    pid: event.task.pid,
                    parent_pid: exec.parent_pid,
                    comm: event.task.comm.clone(),
                    filename: exec.filename.clone(),
                });
                let cookie = exec.task_netns.cookie;
                self.namespaces.get_mut(&cookie).map(|ns| {
                    ns.attributed_pids.insert(event.task.pid);
                    ns.push(
                        event,
                        Step::Exec {
                            filename: exec.filename.clone(),
                        },
                        None,
                    );
                    cookie
                })
            }
        };
        if let Some(cookie) = touched {
            self.check_intents(cookie, &mut reports);
        }
        reports
    }

    /// Gives verdicts whose deadline passed by `now`.
    pub fn tick(&mut self, now: SystemTime) -> Vec<Report> {
        let deadline = self.config.deadline;
        let mut due: Vec<(SystemTime, u64)> = self
            .namespaces
            .iter()
            .filter(|(_, ns)| !ns.decided && ns.created_at + deadline <= now)
            .map(|(cookie, ns)| (ns.created_at, *cookie))
            .collect();
        due.sort_unstable();
        let mut reports = Vec::new();
        for (_, cookie) in due {
            if let Some(verdict) = self.decide(cookie) {
                reports.push(Report::Verdict(verdict));
            } else {
                // Not a sandbox and still alive: nothing to say about it.
                self.namespaces.remove(&cookie);
            }
        }
        for state in &mut self.intents {
            if state.status.is_none() && state.registered_at + deadline <= now {
                let missing = self.namespaces.get(&state.intent.netns_cookie).map_or_else(
                    || vec!["namespace not seen".into()],
                    |ns| missing_steps(&state.intent, &ns.facts()),
                );
                state.status = Some(IntentStatus::Unconfirmed);
                self.metrics.intents_unconfirmed += 1;
                tracing::warn!(
                    netns_cookie = state.intent.netns_cookie,
                    ifname = %state.intent.ifname,
                    missing = %missing.join(", "),
                    "sandbox setup not confirmed by the kernel timeline"
                );
                reports.push(Report::Intent(IntentVerdict {
                    id: state.id,
                    intent: state.intent.clone(),
                    status: IntentStatus::Unconfirmed,
                    missing,
                }));
            }
        }
        self.pending.retain(|_, target| {
            target.is_none_or(|(cookie, _)| self.namespaces.contains_key(&cookie))
        });
        reports
    }

    /// Verdicts for every undecided namespace now (end of a session), deadline or not.
    pub fn flush(&mut self) -> Vec<Report> {
        let undecided: Vec<u64> = self
            .namespaces
            .iter()
            .filter(|(_, ns)| !ns.decided)
            .map(|(c, _)| *c)
            .collect();
        undecided
            .into_iter()
            .filter_map(|cookie| self.decide(cookie).map(Report::Verdict))
            .collect()
    }

    fn on_bind_mount(
        &mut self,
        event: &TraceEvent,
        mount: &super::events::BindMount,
    ) -> Option<u64> {
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
        ns.pins.push(target.clone());
        ns.push(event, Step::Pinned { path: target }, None);
        Some(cookie)
    }

    fn on_request(&mut self, event: &TraceEvent, request: &NetlinkRequest) -> Option<u64> {
        let mut extack = self.pending_extack.remove(&event.task.tid);
        let cookie = request.io.sock_netns.cookie;
        if !self.namespaces.contains_key(&cookie) {
            return None;
        }
        self.attribute_execs(cookie, event.task.pid);
        let ns = self.namespaces.get_mut(&cookie)?;
        if self.pending.len() >= MAX_PENDING {
            self.pending.clear();
        }
        for message in &request.messages {
            let key = (event.task.pid, request.io.fd, message.header.seq);
            let Some((detail, effect)) = describe(message, &ns.ifnames) else {
                self.pending.insert(key, None);
                continue;
            };
            let idx = ns.push(
                event,
                Step::Request {
                    op: message.body.op(),
                    detail,
                    status: RequestStatus::Sent,
                },
                effect,
            );
            self.pending.insert(key, Some((cookie, idx)));
            if let Some(entry) = ns.entries.get_mut(idx) {
                entry.extack = extack.take();
            }
        }
        Some(cookie)
    }

    fn on_reply(&mut self, event: &TraceEvent, reply: &NetlinkReply) -> Option<u64> {
        let mut touched = None;
        for answer in &reply.replies {
            let Some(request) = answer.request else {
                continue;
            };
            let key = (event.task.pid, reply.io.fd, request.seq);
            let pending = self.pending.remove(&key);
            if matches!(pending, Some(None)) {
                continue;
            }
            if let Some(Some((cookie, idx))) = pending
                && let Some(entry) = self
                    .namespaces
                    .get_mut(&cookie)
                    .and_then(|ns| ns.entries.get_mut(idx))
            {
                if let Step::Request { status, .. } = &mut entry.public.step {
                    *status = if answer.error == 0 {
                        RequestStatus::Acked
                    } else {
                        RequestStatus::Rejected {
                            errno: answer.error,
                            extack: answer.extack.clone().or_else(|| entry.extack.clone()),
                        }
                    };
                }
                touched = Some(cookie);
                continue;
            }
            let cookie = reply.io.sock_netns.cookie;
            let is_change = matches!(request.msg_type, 16 | 17 | 19 | 20 | 21 | 24 | 25);
            if answer.error < 0
                && is_change
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

    fn on_dev(&mut self, event: &TraceEvent, dev: &DevChange, up: bool) -> Option<u64> {
        let ns = self.namespaces.get_mut(&dev.netns.cookie)?;
        ns.ifnames.insert(dev.ifindex, dev.ifname.clone());
        // Multi-queue devices report one root qdisc per queue: keep the first.
        let duplicate = ns.entries.iter().rev().take(4).any(|e| {
            matches!((&e.effect, up),
                (Some(Effect::DevUp { ifindex, .. }), true) | (Some(Effect::DevGone { ifindex, .. }), false)
                if *ifindex == dev.ifindex)
        });
        if duplicate {
            return None;
        }
        let (step, effect) = if up {
            (
                Step::DevUp {
                    ifname: dev.ifname.clone(),
                    ifindex: dev.ifindex,
                },
                Effect::DevUp {
                    ifindex: dev.ifindex,
                    ifname: dev.ifname.clone(),
                },
            )
        } else {
            (
                Step::DevGone {
                    ifname: dev.ifname.clone(),
                    ifindex: dev.ifindex,
                },
                Effect::DevGone {
                    ifindex: dev.ifindex,
                    ifname: dev.ifname.clone(),
                },
            )
        };
        ns.push(event, step, Some(effect));
        Some(dev.netns.cookie)
    }

    fn on_destroyed(&mut self, event: &TraceEvent, cookie: u64, reports: &mut Vec<Report>) {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return;
        };
        if ns.destroyed_at.is_some() {
            return;
        }
        ns.destroyed_at = Some(event.at);
        ns.push(event, Step::Destroyed, None);
        for state in &mut self.intents {
            if state.intent.netns_cookie == cookie
                && state.status == Some(IntentStatus::Confirmed)
                && state.drifted.insert("namespace".into())
            {
                self.metrics.drifts += 1;
                reports.push(Report::Drift(Drift {
                    id: state.id,
                    netns_cookie: cookie,
                    what: "namespace destroyed".into(),
                    by: ns
                        .entries
                        .last()
                        .map(|e| e.public.clone())
                        .unwrap_or_else(|| TimelineEntry {
                            at: event.at,
                            pid: event.task.pid,
                            comm: event.task.comm.clone(),
                            step: Step::Destroyed,
                        }),
                }));
            }
        }
        if !ns.decided
            && let Some(verdict) = self.decide(cookie)
        {
            reports.push(Report::Verdict(verdict));
        }
        self.namespaces.remove(&cookie);
        self.intents.retain(|i| i.intent.netns_cookie != cookie);
    }

    /// Adds the execs that led to `pid` touching `cookie` (its own and its children's).
    fn attribute_execs(&mut self, cookie: u64, pid: u32) {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return;
        };
        if !ns.attributed_pids.insert(pid) {
            return;
        }
        for exec in self
            .recent_execs
            .iter()
            .filter(|e| e.pid == pid || e.parent_pid == pid)
        {
            ns.entries.push(Entry {
                public: TimelineEntry {
                    at: exec.at,
                    pid: exec.pid,
                    comm: exec.comm.clone(),
                    step: Step::Exec {
                        filename: exec.filename.clone(),
                    },
                },
                effect: None,
                extack: None,
            });
        }
    }

    /// The verdict for a namespace, or `None` for a live namespace that is not a sandbox.
    fn decide(&mut self, cookie: u64) -> Option<NetnsVerdict> {
        let deadline = self.config.deadline;
        let rules = &self.config.rules;
        let ns = self.namespaces.get_mut(&cookie)?;
        let sandbox = if ns.expected {
            Some(SandboxReason::Expected)
        } else if ns.origin_known && rules.is_runtime_comm(&ns.creator.comm) {
            Some(SandboxReason::RuntimeCreator {
                comm: ns.creator.comm.clone(),
            })
        } else {
            ns.pins
                .iter()
                .find(|p| rules.is_sandbox_pin(p))
                .map(|p| SandboxReason::Pinned { path: p.clone() })
        };
        if sandbox.is_none() && ns.destroyed_at.is_none() {
            return None;
        }
        ns.decided = true;
        let facts = ns.facts();
        let (verdict, mut reason) = match &sandbox {
            None => (Verdict::Gone, "not a sandbox; destroyed".to_string()),
            Some(_) => judge(&facts, deadline),
        };
        if let Some(destroyed) = ns.destroyed_at {
            let lived = destroyed.duration_since(ns.created_at).unwrap_or_default();
            reason.push_str(&format!(
                "; destroyed {} ms after creation",
                lived.as_millis()
            ));
        }
        let mut timeline: Vec<TimelineEntry> =
            ns.entries.iter().map(|e| e.public.clone()).collect();
        timeline.sort_by_key(|e| e.at);
        let mut verdict = NetnsVerdict {
            netns: ns.netns,
            verdict,
            sandbox,
            creator: ns.creator.clone(),
            created_at: ns.created_at,
            destroyed_at: ns.destroyed_at,
            reason,
            timeline,
            repeat: None,
        };
        *self
            .metrics
            .verdicts
            .entry(verdict.verdict.as_str())
            .or_default() += 1;
        if verdict.verdict == Verdict::Skipped {
            let key = verdict.creator.comm.clone();
            let summary = self.skips.entry(key).or_insert_with(|| SkipSummary {
                creator_comm: verdict.creator.comm.clone(),
                creator_pid: verdict.creator.pid,
                count: 0,
                first: verdict.created_at,
                last: verdict.created_at,
            });
            summary.count += 1;
            summary.creator_pid = verdict.creator.pid;
            summary.first = summary.first.min(verdict.created_at);
            summary.last = summary.last.max(verdict.created_at);
            verdict.repeat = Some(summary.clone());
            if summary.count.is_power_of_two() {
                tracing::warn!(
                    netns_cookie = verdict.netns.cookie,
                    netns_inode = verdict.netns.inode,
                    creator = %verdict.creator,
                    why_sandbox = ?verdict.sandbox.as_ref().map(ToString::to_string),
                    skips_from_creator = summary.count,
                    "sandbox network setup SKIPPED: {}",
                    verdict.reason
                );
            }
        } else if verdict.verdict == Verdict::Failed || verdict.verdict == Verdict::Partial {
            tracing::warn!(
                netns_cookie = verdict.netns.cookie,
                creator = %verdict.creator,
                "sandbox network setup {}: {}",
                verdict.verdict.as_str(),
                verdict.reason
            );
        }
        Some(verdict)
    }

    fn check_intents(&mut self, cookie: u64, reports: &mut Vec<Report>) {
        let Some(ns) = self.namespaces.get(&cookie) else {
            return;
        };
        let facts = ns.facts();
        for state in self
            .intents
            .iter_mut()
            .filter(|s| s.intent.netns_cookie == cookie)
        {
            let missing = missing_steps(&state.intent, &facts);
            match state.status {
                None | Some(IntentStatus::Unconfirmed) if missing.is_empty() => {
                    state.status = Some(IntentStatus::Confirmed);
                    self.metrics.intents_confirmed += 1;
                    reports.push(Report::Intent(IntentVerdict {
                        id: state.id,
                        intent: state.intent.clone(),
                        status: IntentStatus::Confirmed,
                        missing,
                    }));
                }
                Some(IntentStatus::Confirmed) => {
                    for what in missing {
                        if state.drifted.insert(what.clone())
                            && let Some(last) = ns.entries.last()
                        {
                            self.metrics.drifts += 1;
                            tracing::warn!(
                                netns_cookie = cookie,
                                what = %what,
                                by = %last.public,
                                "sandbox network drifted"
                            );
                            reports.push(Report::Drift(Drift {
                                id: state.id,
                                netns_cookie: cookie,
                                what: format!("{what} removed"),
                                by: last.public.clone(),
                            }));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

impl Ns {
    fn new(netns: NetnsRef, at: SystemTime) -> Self {
        Self {
            netns,
            created_at: at,
            creator: Creator::default(),
            origin_known: false,
            pins: Vec::new(),
            expected: false,
            entries: Vec::new(),
            ifnames: HashMap::new(),
            destroyed_at: None,
            decided: false,
            attributed_pids: HashSet::new(),
        }
    }

    fn push(&mut self, event: &TraceEvent, step: Step, effect: Option<Effect>) -> usize {
        self.entries.push(Entry {
            public: TimelineEntry {
                at: event.at,
                pid: event.task.pid,
                comm: event.task.comm.clone(),
                step,
            },
            effect,
            extack: None,
        });
        self.entries.len() - 1
    }

    fn name(&self, ifindex: u32, ifname: Option<&String>) -> String {
        ifname
            .cloned()
            .or_else(|| self.ifnames.get(&ifindex).cloned())
            .unwrap_or_else(|| format!("#{ifindex}"))
    }

    fn facts(&self) -> Facts {
        let mut f = Facts::default();
        for entry in &self.entries {
            if let Step::Request {
                status: RequestStatus::Rejected { errno, extack },
                op,
                detail,
            } = &entry.public.step
            {
                let mut text = format!("{op} {detail}: {}", errno_text(*errno));
                if let Some(msg) = extack.as_ref().or(entry.extack.as_ref()) {
                    text.push_str(&format!(" ({msg})"));
                }
                f.rejected.push(text);
                continue;
            }
            if let Step::UnmatchedReply { op, errno, extack } = &entry.public.step {
                let mut text = format!("{op}: {}", errno_text(*errno));
                if let Some(msg) = extack {
                    text.push_str(&format!(" ({msg})"));
                }
                f.rejected.push(text);
                continue;
            }
            let Some(effect) = &entry.effect else {
                continue;
            };
            match effect {
                Effect::LinkNew { ifname } => {
                    if ifname.as_deref() != Some("lo") {
                        f.non_lo_steps += 1;
                    }
                }
                Effect::LinkUp { ifindex, ifname } => {
                    let name = self.name(*ifindex, ifname.as_ref());
                    f.mark_up(*ifindex, name);
                }
                Effect::DevUp { ifindex, ifname } => f.mark_up(*ifindex, ifname.clone()),
                Effect::LinkDown { ifindex, ifname } | Effect::LinkDel { ifindex, ifname } => {
                    let name = self.name(*ifindex, ifname.as_ref());
                    f.up.remove(&name);
                    if matches!(effect, Effect::LinkDel { .. }) {
                        f.addrs.retain(|(idx, _, _)| idx != ifindex);
                    }
                }
                Effect::DevGone { ifindex, ifname } => {
                    f.up.remove(ifname);
                    f.addrs.retain(|(idx, _, _)| idx != ifindex);
                }
                Effect::AddrAdd {
                    ifindex,
                    addr,
                    prefix,
                } => {
                    if *ifindex != LOOPBACK_IFINDEX && !addr.is_loopback() {
                        f.non_lo_steps += 1;
                    }
                    f.addrs.push((*ifindex, *addr, *prefix));
                }
                Effect::AddrDel { addr, prefix, .. } => {
                    f.addrs.retain(|(_, a, p)| !(a == addr && p == prefix));
                }
                Effect::RouteAdd(route) => {
                    f.non_lo_steps += 1;
                    f.routes.push(route.clone());
                }
                Effect::RouteDel(route) => {
                    f.routes.retain(|r| {
                        !(r.dst_len == route.dst_len
                            && r.dst == route.dst
                            && (route.gateway.is_none() || r.gateway == route.gateway))
                    });
                }
            }
        }
        f
    }
}

/// Verdict and reason for a sandbox from its facts.
fn judge(f: &Facts, deadline: Duration) -> (Verdict, String) {
    let addrs: Vec<String> = f
        .addrs
        .iter()
        .filter(|(idx, a, _)| *idx != LOOPBACK_IFINDEX && !a.is_loopback())
        .map(|(_, a, p)| format!("{a}/{p}"))
        .collect();
    let mut up: Vec<&String> = f.up.iter().collect();
    up.sort();
    let seen = format!(
        "seen: interfaces up [{}], addresses [{}], default route {}, lo {}",
        up.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
        addrs.join(", "),
        if f.has_default_route() { "yes" } else { "no" },
        if f.lo_up { "up" } else { "not brought up" }
    );
    if !f.up.is_empty() && f.has_address() && f.has_default_route() {
        return (Verdict::Networked, seen);
    }
    if !f.rejected.is_empty() {
        return (
            Verdict::Failed,
            format!("kernel rejected: {}; {seen}", f.rejected.join("; ")),
        );
    }
    if f.non_lo_steps > 0 {
        let mut missing = Vec::new();
        if f.up.is_empty() {
            missing.push("a non-loopback interface up");
        }
        if !f.has_address() {
            missing.push("an address");
        }
        if !f.has_default_route() {
            missing.push("a default route");
        }
        return (
            Verdict::Partial,
            format!("missing {}; {seen}", missing.join(", ")),
        );
    }
    (
        Verdict::Skipped,
        format!(
            "no interface, address or route was configured within {} ms (nothing but loopback; \
             no network plugin touched it); {seen}",
            deadline.as_millis()
        ),
    )
}

fn missing_steps(intent: &Intent, f: &Facts) -> Vec<String> {
    let mut missing = Vec::new();
    if !f.up.contains(&intent.ifname) {
        missing.push(format!("interface {} up", intent.ifname));
    }
    for net in &intent.addresses {
        if !f
            .addrs
            .iter()
            .any(|(_, a, p)| *a == net.ip() && *p == net.prefix())
        {
            missing.push(format!("address {net}"));
        }
    }
    for route in &intent.routes {
        let found = f.routes.iter().any(|r| {
            r.dst_len == route.dst.prefix()
                && (route.dst.prefix() == 0 || r.dst == Some(route.dst.network()))
                && (route.gateway.is_none() || r.gateway == route.gateway)
        });
        if !found {
            missing.push(match route.gateway {
                Some(gw) => format!("route {} via {gw}", route.dst),
                None => format!("route {}", route.dst),
            });
        }
    }
    missing
}

/// A human description and the effect of a request; `None` for requests that change nothing
/// a verdict cares about (dumps, gets, iproute2's empty feature probes).
fn describe(
    message: &NlRequest,
    ifnames: &HashMap<u32, String>,
) -> Option<(String, Option<Effect>)> {
    let name_of = |idx: i32, name: &Option<String>| -> String {
        name.clone()
            .or_else(|| ifnames.get(&idx.unsigned_abs()).cloned())
            .unwrap_or_else(|| format!("#{idx}"))
    };
    match &message.body {
        RtRequest::NewLink(link) | RtRequest::SetLink(link) => {
            if link.ifindex == 0 && link.ifname.is_none() {
                return None;
            }
            let ifindex = link.ifindex.unsigned_abs();
            let mut detail = name_of(link.ifindex, &link.ifname);
            if let Some(kind) = &link.kind {
                detail.push_str(&format!(" type {kind}"));
            }
            if let Some(peer) = &link.peer {
                detail.push_str(&format!(" peer {}", peer.ifname.as_deref().unwrap_or("?")));
                if let Some(target) = peer.netns {
                    detail.push_str(&format!(" (peer netns {target:?})"));
                }
            }
            if let Some(target) = link.netns {
                detail.push_str(&format!(" -> netns {target:?}"));
            }
            let effect = if link.sets_up() {
                detail.push_str(" up");
                Effect::LinkUp {
                    ifindex,
                    ifname: link.ifname.clone(),
                }
            } else if link.sets_down() {
                detail.push_str(" down");
                Effect::LinkDown {
                    ifindex,
                    ifname: link.ifname.clone(),
                }
            } else if link.netns.is_some() {
                // Moved out of this namespace.
                Effect::LinkDel {
                    ifindex,
                    ifname: link.ifname.clone(),
                }
            } else {
                Effect::LinkNew {
                    ifname: link.ifname.clone(),
                }
            };
            Some((detail, Some(effect)))
        }
        RtRequest::DelLink(link) => Some((
            name_of(link.ifindex, &link.ifname),
            Some(Effect::LinkDel {
                ifindex: link.ifindex.unsigned_abs(),
                ifname: link.ifname.clone(),
            }),
        )),
        RtRequest::NewAddr(addr) | RtRequest::DelAddr(addr) => {
            let ip = addr.addr()?;
            let idx = i32::try_from(addr.ifindex).unwrap_or(0);
            let detail = format!("{ip}/{} dev {}", addr.prefix_len, name_of(idx, &None));
            let effect = if matches!(message.body, RtRequest::NewAddr(_)) {
                Effect::AddrAdd {
                    ifindex: addr.ifindex,
                    addr: ip,
                    prefix: addr.prefix_len,
                }
            } else {
                Effect::AddrDel {
                    ifindex: addr.ifindex,
                    addr: ip,
                    prefix: addr.prefix_len,
                }
            };
            Some((detail, Some(effect)))
        }
        RtRequest::NewRoute(route) | RtRequest::DelRoute(route) => {
            let key = RouteKey {
                dst: route.dst,
                dst_len: route.dst_len,
                gateway: route.gateway,
                default: route.is_default(),
            };
            let mut detail = match route.dst {
                Some(dst) => format!("{dst}/{}", route.dst_len),
                None if route.dst_len == 0 => "default".to_string(),
                None => format!("?/{}", route.dst_len),
            };
            if let Some(gw) = route.gateway {
                detail.push_str(&format!(" via {gw}"));
            }
            if let Some(oif) = route.oif {
                let idx = i32::try_from(oif).unwrap_or(0);
                detail.push_str(&format!(" dev {}", name_of(idx, &None)));
            }
            if !matches!(route.table, 0 | 254) {
                detail.push_str(&format!(" table {}", route.table));
            }
            let effect = if matches!(message.body, RtRequest::NewRoute(_)) {
                Effect::RouteAdd(key)
            } else {
                Effect::RouteDel(key)
            };
            Some((detail, Some(effect)))
        }
        RtRequest::Other { .. } => None,
    }
}

#[cfg(test)]
mod tests;
