//! The correlator: a timeline per network namespace (by cookie) and a verdict per sandbox.
//!
//! Pure logic: feed it [`TraceEvent`]s, the states of namespaces read from the kernel
//! ([`Correlator::snapshot_taken`]) and a clock ([`Correlator::tick`]); collect [`Report`]s. It
//! never touches the kernel itself: it asks for reads ([`Correlator::take_snapshot_requests`]),
//! so it is unit-tested with synthetic events and states.
//!
//! A verdict rests on evidence. What the trace did not see is read from the kernel before any
//! judgement: a namespace whose creation was not seen (it existed before tracing, or was
//! dropped as "not a sandbox" before an ADD named it) is read when it becomes known; and no
//! alarm (`skipped`, `partial`, `failed`) is given on a live namespace without reading its state
//! after its deadline. An alarm is revised (`networked`, late) when the network arrives later.
//!
//! Parts: `timeline` (entries of one namespace, bounded), `effects` (what a request does),
//! `state` (the timeline folded), `requests` (request/answer pairing), `execs` (binaries
//! that led to a change), `judge` (sandbox or not, and the verdict), `intents` (the
//! daemon's intents and drift), `pods` (the pod a CNI plugin's environment or a resolver
//! named).

mod effects;
mod execs;
mod intents;
mod judge;
mod name_set;
mod pods;
mod requests;
mod state;
mod timeline;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::dataplane::NetnsSnapshot;
use crate::pod::{NetnsCreator, PodName};

use super::events::{
    DevChange, EventKind, ExecEnv, NetlinkReply, NetlinkRequest, NetnsRef, TraceEvent,
};
use super::netlink_parse::{is_change_type, op_name};
use super::sandbox_rules::{PinSource, SandboxRules, parse_pin_source};
use super::verdict::{
    Creator, Evidence, Intent, IntentKey, NetnsVerdict, Report, RequestStatus, SkipSummary, Step,
    TimelineEntry, Verdict, format_time,
};

use effects::{Effect, describe};
use execs::{RecentExec, RecentExecs};
pub use intents::IntentCounts;
use intents::Intents;
use judge::{judge, sandbox_reason};
use pods::{NetnsName, PendingCall, PendingCalls};
use requests::Requests;
use state::State;
use timeline::Ns;

/// Namespaces tracked at once; beyond, the oldest judged (then the oldest not expected) are
/// dropped and counted.
const MAX_NAMESPACES: usize = 8192;
/// Creators with a skip summary.
const MAX_SKIP_CREATORS: usize = 128;
/// Latest namespace per creating pid (for pins through `/proc/<pid>/ns/net`).
const MAX_BY_PID: usize = 16_384;
/// Final verdicts remembered after their namespace is no longer followed.
const MAX_JUDGED: usize = 16_384;
/// How long a state read may take before the judgement goes on without it.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(3);
/// How long the read of a namespace whose history was not seen waits for the event stream to
/// pass the moment it was asked for (its creation may be among the events not fed yet).
pub const HISTORY_GRACE: Duration = Duration::from_secs(1);
/// Longest interval between reads of a sandbox judged an alarm (its network may arrive by a
/// path the trace does not see).
const MAX_RECHECK: Duration = Duration::from_secs(60);

/// How the correlator decides.
#[derive(Clone, Debug)]
pub struct CorrelatorConfig {
    /// Time a namespace has, from its creation (or the ADD naming it), to get its network.
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

/// A read of a namespace's state the correlator asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRequest {
    pub cookie: u64,
    /// Namespace files that may be it, most likely first; the reader checks the cookie.
    pub paths: Vec<PathBuf>,
    /// Ask who the sandbox belongs to as well (an alarm is due and its pod is not known):
    /// the answer goes to [`Correlator::pod_resolved`] before the state read's.
    pub pod_query: Option<PodQuery>,
}

/// What a [`crate::pod::PodResolver`] is told of the namespace besides its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodQuery {
    /// The process that created it, when the trace saw it: its runtime is the one to ask.
    pub creator: Option<NetnsCreator>,
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CorrelatorMetrics {
    /// Verdicts given, by verdict name (a revised verdict counts again).
    pub verdicts: BTreeMap<&'static str, u64>,
    /// Alarms revised to `networked` (the network arrived late), by the alarm.
    pub revised: BTreeMap<&'static str, u64>,
    /// Events fed, by kind name.
    pub events: BTreeMap<&'static str, u64>,
    pub intents: IntentCounts,
    pub snapshots_taken: u64,
    pub snapshots_failed: u64,
    /// Namespaces dropped to stay within bounds, and requests whose pairing was dropped.
    pub evicted_namespaces: u64,
    /// CNI calls whose namespace did not become known in time (or that did not fit).
    pub unmatched_cni_calls: u64,
    pub dropped_requests: u64,
    /// Namespaces currently tracked.
    pub tracked_namespaces: usize,
}

/// Timelines and verdicts.
pub struct Correlator {
    config: CorrelatorConfig,
    namespaces: HashMap<u64, Ns>,
    /// Latest netns created with a given owner pid (clone) or by a pid (unshare).
    by_pid: HashMap<u32, u64>,
    requests: Requests,
    execs: RecentExecs,
    /// CNI calls naming a namespace not known yet.
    pending_cni: PendingCalls,
    /// Skips by creator comm (a runtime forks a new helper per sandbox: the pid varies).
    skips: HashMap<String, SkipSummary>,
    intents: Intents,
    /// Namespaces whose state should be read, each with the time before which a read must
    /// wait for the event stream (see [`Self::want_history`]).
    wanted: Vec<(u64, Option<SystemTime>)>,
    /// The time of the latest event fed.
    latest_event: Option<SystemTime>,
    /// Final verdicts on namespaces no longer followed: one found again (named by an ADD, by
    /// `--netns`) is not judged twice.
    judged: HashMap<u64, Verdict>,
    judged_order: std::collections::VecDeque<u64>,
    metrics: CorrelatorMetrics,
}

impl Correlator {
    pub fn new(config: CorrelatorConfig) -> Self {
        Self {
            config,
            namespaces: HashMap::new(),
            by_pid: HashMap::new(),
            requests: Requests::default(),
            execs: RecentExecs::default(),
            pending_cni: PendingCalls::default(),
            skips: HashMap::new(),
            intents: Intents::default(),
            wanted: Vec::new(),
            latest_event: None,
            judged: HashMap::new(),
            judged_order: std::collections::VecDeque::new(),
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
            intents: self.intents.counts.clone(),
            dropped_requests: self.requests.dropped,
            unmatched_cni_calls: self.pending_cni.dropped,
            ..self.metrics.clone()
        }
    }

    /// Repeated skips per creator.
    pub fn skip_summaries(&self) -> Vec<SkipSummary> {
        let mut all: Vec<_> = self.skips.values().cloned().collect();
        all.sort_by_key(|s| s.first);
        all
    }

    /// The binaries executed since `since` (as far as the recent ones are kept).
    pub fn execs_since(&self, since: SystemTime) -> Vec<String> {
        self.execs.since(since)
    }

    /// Whether the namespace is tracked.
    pub fn is_tracked(&self, cookie: u64) -> bool {
        self.namespaces.contains_key(&cookie)
    }

    /// The timeline of a tracked namespace so far.
    pub fn timeline(&self, cookie: u64) -> Option<Vec<Arc<TimelineEntry>>> {
        self.namespaces.get(&cookie).map(Ns::timeline)
    }

    /// Marks the namespace `netns` (a file at `path`) as a sandbox, whoever created it. One not
    /// seen being created starts a timeline now (its deadline runs from `now`) and its state is
    /// read.
    pub fn expect_sandbox(&mut self, netns: NetnsRef, path: PathBuf, now: SystemTime) {
        let ns = self.track(netns, now);
        ns.expected = true;
        ns.add_handle(path);
        self.want_history(netns.cookie, now);
    }

    /// A sandbox namespace found pinned at `path` (under a sandbox pin directory, with a sandbox
    /// name) with its state already read, when tracing started: judged from that state;
    /// `networked` at once when it shows the network.
    pub fn found(
        &mut self,
        path: PathBuf,
        snapshot: &NetnsSnapshot,
        read_at: SystemTime,
        now: SystemTime,
    ) -> Vec<Report> {
        let netns = NetnsRef {
            cookie: snapshot.cookie,
            inode: u32::try_from(snapshot.inode).unwrap_or(0),
        };
        let ns = self.track(netns, now);
        ns.add_pin(path);
        self.snapshot_taken(netns.cookie, Ok(snapshot), read_at, now)
    }

    /// Registers what the daemon configures in a sandbox (the namespace file `path`); the
    /// answer comes as a [`Report::Intent`] (at once when the kernel already shows everything).
    /// Replaces an earlier intent for the same key. The sandbox's deadline runs from now.
    pub fn register_intent(
        &mut self,
        intent: Intent,
        path: PathBuf,
        now: SystemTime,
    ) -> Vec<Report> {
        let cookie = intent.netns_cookie;
        let audit = intent.origin == super::verdict::IntentOrigin::Audit;
        let ns = self.track(NetnsRef { cookie, inode: 0 }, now);
        ns.expected = true;
        ns.add_handle(path);
        ns.deadline_from = ns.deadline_from.max(now);
        self.intents.register(intent, now);
        if audit {
            self.want(cookie);
        } else {
            self.want_history(cookie, now);
        }
        let mut reports = Vec::new();
        if let Some(ns) = self.namespaces.get_mut(&cookie) {
            let progress = ns.progress();
            // What is known of a namespace whose history was not seen came from reading it.
            let evidence = match progress.last_snapshot {
                Some(at) if !ns.origin_known => Evidence::Snapshot { at },
                _ => Evidence::Trace,
            };
            reports.extend(self.intents.check(cookie, &progress, evidence, None));
        }
        reports
    }

    /// Forgets an intent (the daemon is tearing the sandbox down): no drift is reported for it.
    pub fn remove_intent(&mut self, key: &IntentKey) {
        self.intents.remove(key);
    }

    /// The reads of namespace states wanted since the last call.
    pub fn take_snapshot_requests(&mut self, now: SystemTime) -> Vec<SnapshotRequest> {
        let mut requests = Vec::new();
        for (cookie, after) in std::mem::take(&mut self.wanted) {
            let Some(ns) = self.namespaces.get_mut(&cookie) else {
                continue;
            };
            if let Some(after) = after {
                let caught_up = self.latest_event.is_some_and(|at| at > after);
                let waited = now.duration_since(after).unwrap_or_default() >= HISTORY_GRACE;
                if !caught_up && !waited {
                    self.wanted.push((cookie, Some(after)));
                    continue;
                }
                if ns.origin_known {
                    // Its creation was still on its way: the trace has its history after all.
                    continue;
                }
            }
            if ns.snapshot.pending_since.is_some() || ns.destroyed_at.is_some() {
                continue;
            }
            ns.snapshot.pending_since = Some(now);
            let pod_query = ns.pod.take_query().then(|| PodQuery {
                creator: (!ns.creator.comm.is_empty()).then(|| NetnsCreator {
                    pid: ns.creator.pid,
                    comm: ns.creator.comm.clone(),
                }),
            });
            requests.push(SnapshotRequest {
                cookie,
                paths: ns.handles.iter().rev().cloned().collect(),
                pod_query,
            });
        }
        requests
    }

    /// Who namespace `cookie` belongs to, as a [`crate::pod::PodResolver`] answered a
    /// [`SnapshotRequest::pod_query`] (kept unless a CNI plugin's environment named the pod).
    pub fn pod_resolved(&mut self, cookie: u64, answer: PodName) {
        if let Some(ns) = self.namespaces.get_mut(&cookie) {
            ns.pod.resolved(answer);
        }
    }

    /// The answer to a [`SnapshotRequest`]: the state of namespace `cookie` read from `read_at`
    /// on, or why it could not be read.
    pub fn snapshot_taken(
        &mut self,
        cookie: u64,
        result: Result<&NetnsSnapshot, String>,
        read_at: SystemTime,
        now: SystemTime,
    ) -> Vec<Report> {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return Vec::new();
        };
        ns.snapshot.pending_since = None;
        ns.snapshot.answered_at = Some(read_at);
        let public = |step| TimelineEntry {
            at: read_at,
            pid: 0,
            comm: "provisioner".into(),
            step,
        };
        match result {
            Ok(snapshot) => {
                self.metrics.snapshots_taken += 1;
                ns.snapshot.error = None;
                if ns.netns.inode == 0 {
                    ns.netns.inode = u32::try_from(snapshot.inode).unwrap_or(0);
                }
                for link in &snapshot.links {
                    ns.name_interface(link.index, &link.name);
                }
                let state = State::from_snapshot(snapshot);
                ns.push_at(
                    public(Step::Snapshot {
                        summary: state.summary(),
                    }),
                    Some(Effect::Snapshot(Box::new(state))),
                );
            }
            Err(error) => {
                self.metrics.snapshots_failed += 1;
                if ns.verdict.is_some() && !self.intents.on(cookie) {
                    // A judged namespace that can no longer be read is gone (its destruction
                    // is not always seen: a namespace with no device up leaves no trace).
                    self.namespaces.remove(&cookie);
                    return Vec::new();
                }
                ns.snapshot.error = Some(error.clone());
                ns.push_at(public(Step::SnapshotFailed { error }), None);
            }
        }
        let mut reports = self.changed(cookie, Evidence::Snapshot { at: read_at });
        reports.extend(self.settle(cookie, now));
        reports
    }

    /// Feeds one kernel event.
    pub fn feed(&mut self, event: &TraceEvent) -> Vec<Report> {
        self.latest_event = self.latest_event.max(Some(event.at));
        *self
            .metrics
            .events
            .entry(provisioner_common::kind::name(event.kind.kind()))
            .or_default() += 1;
        let mut reports = Vec::new();
        let touched = match &event.kind {
            EventKind::NetnsCreated(created) => {
                self.on_created(event, created);
                None
            }
            EventKind::BindMount(mount) => self.on_bind_mount(event, mount),
            EventKind::NetlinkRequest(request) => self.on_request(event, request),
            EventKind::NetlinkReply(reply) => self.on_reply(event, reply),
            EventKind::Extack(extack) => {
                self.requests.extack(event.task.tid, extack.message.clone());
                None
            }
            EventKind::DevUp(dev) => self.on_dev(event, dev, true),
            EventKind::DevGone(dev) => {
                if dev.netns_dying {
                    reports.extend(self.on_destroyed(event, dev.netns.cookie));
                    None
                } else {
                    self.on_dev(event, dev, false)
                }
            }
            EventKind::Exec(exec) => self.on_exec(event, exec),
            EventKind::ExecEnv(env) => self.on_exec_env(event, env),
        };
        if let Some(cookie) = touched {
            reports.extend(self.changed(cookie, Evidence::Trace));
        }
        reports
    }

    /// Gives the verdicts and intent answers due by `now`; asks for the reads they need.
    pub fn tick(&mut self, now: SystemTime) -> Vec<Report> {
        let deadline = self.config.deadline;
        let mut cookies: Vec<(SystemTime, u64)> = self
            .namespaces
            .iter()
            .filter(|(_, ns)| ns.verdict.is_none() && ns.deadline_from + deadline <= now)
            .map(|(cookie, ns)| (ns.deadline_from, *cookie))
            .collect();
        cookies.extend(
            self.intents
                .undecided_cookies()
                .into_iter()
                .filter_map(|c| self.namespaces.get(&c).map(|ns| (ns.deadline_from, c))),
        );
        cookies.extend(
            self.namespaces
                .iter()
                .filter(|(_, ns)| ns.recheck.is_some_and(|(at, _)| at <= now))
                .map(|(cookie, ns)| (ns.deadline_from, *cookie)),
        );
        cookies.sort_unstable();
        cookies.dedup();
        let mut reports = Vec::new();
        for (_, cookie) in cookies {
            reports.extend(self.settle(cookie, now));
        }
        reports
    }

    fn want(&mut self, cookie: u64) {
        match self.wanted.iter_mut().find(|(c, _)| *c == cookie) {
            Some(wanted) => wanted.1 = None,
            None => self.wanted.push((cookie, None)),
        }
    }

    /// Asks for a read of a namespace whose history was not seen (at `now`) and whose state was
    /// not read. Its creation may still be on its way (the ring buffer is read in batches, and
    /// the reader can lag on a loaded node): the read waits until an event later than `now` was
    /// fed, or [`HISTORY_GRACE`]; when the creation arrived meanwhile, nothing is read.
    fn want_history(&mut self, cookie: u64, now: SystemTime) {
        if self
            .namespaces
            .get(&cookie)
            .is_some_and(|ns| !ns.origin_known && ns.snapshot.answered_at.is_none())
            && !self.wanted.iter().any(|(c, _)| *c == cookie)
        {
            self.wanted.push((cookie, Some(now)));
        }
    }

    /// The namespace `netns`, tracked from `now` when it was not.
    fn track(&mut self, netns: NetnsRef, now: SystemTime) -> &mut Ns {
        if !self.namespaces.contains_key(&netns.cookie) && self.namespaces.len() >= MAX_NAMESPACES {
            self.evict_one();
        }
        let judged = self.judged.get(&netns.cookie).copied();
        self.namespaces.entry(netns.cookie).or_insert_with(|| {
            let mut ns = Ns::new(netns, now);
            ns.verdict = judged;
            ns
        })
    }

    /// Drops one namespace to stay within bounds: the oldest judged, else the oldest not
    /// expected, else the oldest.
    fn evict_one(&mut self) {
        let oldest = |keep: &dyn Fn(&Ns) -> bool| {
            self.namespaces
                .iter()
                .filter(|(_, ns)| keep(ns))
                .min_by_key(|(_, ns)| ns.created_at)
                .map(|(c, _)| *c)
        };
        let victim = oldest(&|ns| ns.verdict.is_some())
            .or_else(|| oldest(&|ns| !ns.expected))
            .or_else(|| oldest(&|_| true));
        if let Some(cookie) = victim {
            self.namespaces.remove(&cookie);
            self.metrics.evicted_namespaces += 1;
        }
    }

    fn on_created(&mut self, event: &TraceEvent, created: &super::events::NetnsCreated) {
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
        if let Some(previous) = self.namespaces.insert(netns.cookie, ns)
            && let Some(ns) = self.namespaces.get_mut(&netns.cookie)
        {
            // A timeline started early (an ADD named it first): keep what it knew.
            ns.expected |= previous.expected;
            ns.deadline_from = ns.deadline_from.max(previous.deadline_from);
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

    /// A binary's environment at exec: when it is a CNI call, its step and its pod go to the
    /// namespace `CNI_NETNS` names. An ADD naming one not known yet is kept a while (its pin
    /// may come later); other calls name namespaces that existed before (a DEL's may be judged
    /// and no longer followed).
    fn on_exec_env(&mut self, event: &TraceEvent, env: &ExecEnv) -> Option<u64> {
        let cni = env.cni.as_ref()?;
        let netns = NetnsName::parse(&cni.netns)?;
        let call = PendingCall {
            event: event.clone(),
            cni: cni.clone(),
            parent: env.parent_comm.clone(),
            uid: env.uid,
            netns,
        };
        let Some(cookie) = self.named_netns(&call.netns) else {
            if call.cni.command == "ADD" {
                self.pending_cni.push(call);
            }
            return None;
        };
        self.cni_call(cookie, &call);
        Some(cookie)
    }

    /// The tracked namespace a CNI call names (the latest created, when a pin path was
    /// reused).
    fn named_netns(&self, name: &NetnsName) -> Option<u64> {
        let has = |path: &std::path::Path| {
            self.namespaces
                .iter()
                .filter(|(_, ns)| {
                    ns.pins
                        .iter()
                        .chain(&ns.handles)
                        .any(|p| pods::spelled_alike(p, path))
                })
                .max_by_key(|(_, ns)| ns.created_at)
                .map(|(cookie, _)| *cookie)
        };
        match name {
            NetnsName::Path(path) => has(path),
            NetnsName::Process { pid, path } => self
                .by_pid
                .get(pid)
                .copied()
                .filter(|c| self.namespaces.contains_key(c))
                .or_else(|| has(path)),
        }
    }

    /// Adds a CNI call to the timeline of namespace `cookie`, and the pod it names.
    fn cni_call(&mut self, cookie: u64, call: &PendingCall) {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return;
        };
        let pod = pods::pod_of(&call.cni);
        let plugin = call.event.task.comm.clone();
        ns.pod.plugin_ran(&plugin, call.uid, pod.as_ref());
        ns.push(
            &call.event,
            Step::CniCall {
                command: call.cni.command.clone(),
                plugin,
                parent: call.parent.clone(),
                uid: call.uid,
                pod,
            },
            None,
        );
    }

    fn on_exec(&mut self, event: &TraceEvent, exec: &super::events::Exec) -> Option<u64> {
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

    fn on_request(&mut self, event: &TraceEvent, request: &NetlinkRequest) -> Option<u64> {
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

    fn on_reply(&mut self, event: &TraceEvent, reply: &NetlinkReply) -> Option<u64> {
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

    fn on_dev(&mut self, event: &TraceEvent, dev: &DevChange, up: bool) -> Option<u64> {
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

    fn on_destroyed(&mut self, event: &TraceEvent, cookie: u64) -> Vec<Report> {
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

    /// After a change to namespace `cookie`: intents confirmed or drifted, and an alarm given
    /// earlier revised when the namespace is networked now.
    fn changed(&mut self, cookie: u64, trigger: Evidence) -> Vec<Report> {
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return Vec::new();
        };
        // Most namespaces have neither an intent nor an alarm to revise: nothing to look at.
        if !ns.verdict.is_some_and(Verdict::is_alarm) && !self.intents.on(cookie) {
            return Vec::new();
        }
        let progress = ns.progress();
        let revise = ns.verdict.is_some_and(Verdict::is_alarm) && progress.networked.is_some();
        let by = ns.last_entry();
        let last_at = by.map(|e| e.at);
        let mut reports = self.intents.check(cookie, &progress, trigger, by);
        if revise
            && let Some(at) = last_at
            && let Some(verdict) = self.decide(cookie, Some(progress), at)
        {
            reports.push(Report::Verdict(verdict));
        }
        reports
    }

    /// Gives what is due for namespace `cookie` by `now`: its verdict, its intents' answers;
    /// asks for a read of its state first when an alarm would otherwise rest on less.
    fn settle(&mut self, cookie: u64, now: SystemTime) -> Vec<Report> {
        let deadline = self.config.deadline;
        let Some(ns) = self.namespaces.get_mut(&cookie) else {
            return Vec::new();
        };
        let progress = ns.progress();
        let alive = ns.destroyed_at.is_none();
        let pending = ns.snapshot.pending_since;
        if let Some(since) = pending
            && now.duration_since(since).unwrap_or_default() >= SNAPSHOT_WAIT
        {
            ns.snapshot.pending_since = None;
            ns.snapshot.answered_at = Some(since);
            ns.snapshot.error = Some(format!("no answer within {} ms", SNAPSHOT_WAIT.as_millis()));
        }
        let pending = ns.snapshot.pending_since.is_some();
        let answered_at = ns.snapshot.answered_at;
        let read_error = ns.snapshot.error.clone();
        let mut reports = Vec::new();

        // A sandbox judged an alarm is read again now and then while it lives.
        if let Some((at, every)) = ns.recheck
            && at <= now
        {
            ns.recheck = Some((now + every, (every * 2).min(MAX_RECHECK)));
            if alive && !pending {
                self.want(cookie);
            }
            return reports;
        }
        if ns.verdict.is_some() && self.intents.due(cookie, now, deadline).is_none() {
            return reports;
        }

        // The intents whose deadline passed: concluded on a read of the state made after it.
        if let Some(due) = self.intents.due(cookie, now, deadline) {
            if answered_at.is_some_and(|at| at >= due) || !alive {
                let evidence = answered_at.map_or(Evidence::Trace, |at| Evidence::Snapshot { at });
                reports.extend(self.intents.conclude(
                    cookie,
                    &progress,
                    evidence,
                    read_error.as_deref(),
                    now,
                    deadline,
                ));
            } else if !pending {
                self.want(cookie);
            }
        }

        let Some(ns) = self.namespaces.get(&cookie) else {
            return reports;
        };
        if ns.verdict.is_some() {
            return reports;
        }
        let due = ns.deadline_from + deadline;
        // A namespace found set up (its history not seen) is judged at once.
        let found_networked = !ns.origin_known && progress.networked.is_some();
        if due > now && !found_networked {
            return reports;
        }
        if sandbox_reason(ns, &self.config.rules).is_none() {
            if alive {
                // Not a sandbox and still alive: nothing to say about it.
                self.namespaces.remove(&cookie);
            }
            return reports;
        }
        let read_after_deadline = answered_at.is_some_and(|at| at >= due);
        if progress.networked.is_some() || read_after_deadline || !alive {
            if let Some(verdict) = self.decide(cookie, Some(progress), now) {
                reports.push(Report::Verdict(verdict));
            }
        } else if !pending {
            // An alarm is due: who the sandbox belongs to is asked with the read.
            if let Some(ns) = self.namespaces.get_mut(&cookie) {
                ns.pod.wanted = true;
            }
            self.want(cookie);
        }
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

    /// The verdict at `now`, or `None` for a live namespace that is not a sandbox (or when it
    /// would repeat the last one).
    fn decide(
        &mut self,
        cookie: u64,
        progress: Option<Arc<state::Progress>>,
        now: SystemTime,
    ) -> Option<NetnsVerdict> {
        let deadline = self.config.deadline;
        let ns = self.namespaces.get_mut(&cookie)?;
        let sandbox = sandbox_reason(ns, &self.config.rules);
        if sandbox.is_none() && ns.destroyed_at.is_none() {
            return None;
        }
        let progress = progress.unwrap_or_else(|| ns.progress());
        let judgement = match &sandbox {
            None => judge::Judgement {
                verdict: Verdict::Gone,
                reason: "not a sandbox; destroyed".to_owned(),
                evidence: Evidence::Trace,
            },
            Some(_) => judge(ns, &progress, deadline),
        };
        let previous = ns.verdict;
        if previous == Some(judgement.verdict) {
            return None;
        }
        let mut reason = judgement.reason;
        if let Some(destroyed) = ns.destroyed_at {
            if ns.origin_known {
                let lived = destroyed.duration_since(ns.created_at).unwrap_or_default();
                reason.push_str(&format!(
                    "; destroyed {} ms after creation",
                    lived.as_millis()
                ));
            } else {
                reason.push_str(&format!("; destroyed at {}", format_time(destroyed)));
            }
        }
        let due = ns.deadline_from + deadline;
        let revises = previous.filter(|v| v.is_alarm());
        let late_ms = revises.and(progress.networked).map(|r| {
            u64::try_from(r.at.duration_since(due).unwrap_or_default().as_millis())
                .unwrap_or(u64::MAX)
        });
        ns.verdict = Some(judgement.verdict);
        ns.recheck = (judgement.verdict.is_alarm() && ns.destroyed_at.is_none())
            .then(|| (now + deadline, (deadline * 2).min(MAX_RECHECK)));
        ns.push_at(
            TimelineEntry {
                at: now,
                pid: 0,
                comm: "provisioner".into(),
                step: Step::Verdict {
                    verdict: judgement.verdict,
                },
            },
            None,
        );
        let mut verdict = NetnsVerdict {
            pod: sandbox
                .is_some()
                .then(|| ns.pod.for_verdict(!ns.attributed_pids.is_empty())),
            netns: ns.netns,
            verdict: judgement.verdict,
            sandbox,
            creator: ns.creator.clone(),
            created_at: ns.created_at,
            destroyed_at: ns.destroyed_at,
            reason,
            evidence: judgement.evidence,
            revises,
            late_ms,
            diagnosis: None,
            timeline: ns.timeline(),
            repeat: None,
        };
        ns.at_rest();
        *self
            .metrics
            .verdicts
            .entry(verdict.verdict.as_str())
            .or_default() += 1;
        if let Some(old) = revises {
            *self.metrics.revised.entry(old.as_str()).or_default() += 1;
        }
        if verdict.verdict == Verdict::Skipped {
            verdict.repeat = Some(self.summarise_skip(&verdict));
        }
        if !verdict.verdict.is_alarm() && !self.intents.on(cookie) {
            // Said and final: nothing more to follow (its destruction is not always seen).
            self.namespaces.remove(&cookie);
            if self.judged_order.len() >= MAX_JUDGED
                && let Some(oldest) = self.judged_order.pop_front()
            {
                self.judged.remove(&oldest);
            }
            if self.judged.insert(cookie, verdict.verdict).is_none() {
                self.judged_order.push_back(cookie);
            }
        }
        Some(verdict)
    }

    fn summarise_skip(&mut self, verdict: &NetnsVerdict) -> SkipSummary {
        let key = verdict.creator.comm.clone();
        if !self.skips.contains_key(&key) && self.skips.len() >= MAX_SKIP_CREATORS {
            let stalest = self
                .skips
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone());
            if let Some(stalest) = stalest {
                self.skips.remove(&stalest);
            }
        }
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
        summary.clone()
    }
}

#[cfg(test)]
mod tests;
