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
//! Parts: `timeline` (entries of one namespace, bounded), `kernel_events` (what each kernel
//! event adds to the timelines), `effects` (what a request does), `state` (the timeline
//! folded), `requests` (request/answer pairing), `execs` (binaries that led to a change),
//! `snapshots` (reads of namespace states asked for and answered), `judge` (sandbox or not,
//! and the verdict), `verdicts` (a verdict given, counted and remembered), `intents` (the
//! daemon's intents and drift), `pods` (the pod a CNI plugin's environment or a resolver
//! named, and the CNI calls that name a namespace).

mod effects;
mod execs;
mod intents;
mod judge;
mod kernel_events;
mod name_set;
mod pods;
mod requests;
mod snapshots;
mod state;
mod timeline;
mod verdicts;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::dataplane::NetnsSnapshot;

use super::kernel::events::{EventKind, NetnsRef, TraceEvent};
use super::sandbox_rules::SandboxRules;
use super::verdict::{Evidence, Intent, IntentKey, Report, SkipSummary, TimelineEntry, Verdict};

use execs::RecentExecs;
pub use intents::IntentCounts;
use intents::Intents;
use judge::sandbox_reason;
use pods::PendingCalls;
use requests::Requests;
pub use snapshots::{PodQuery, SnapshotRequest};
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
/// How long a state read (and the runtime's answer asked with it) may take by default; see
/// [`CorrelatorConfig::read_wait`].
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
    /// How long a read of a namespace's state, and the runtime's answer about its pod asked
    /// with it, may each take (the driver bounds both). A read not answered within twice
    /// that is given up: the judgement goes on without it.
    pub read_wait: Duration,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(10),
            rules: SandboxRules::default(),
            read_wait: SNAPSHOT_WAIT,
        }
    }
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
    /// Each boxed: a map's table is sized to a power of two, and its empty slots are as large
    /// as what it holds.
    namespaces: HashMap<u64, Box<Ns>>,
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

    /// How long a read from the kernel or the node (a namespace's state, a runtime's files) is
    /// waited for.
    pub fn read_wait(&self) -> Duration {
        self.config.read_wait
    }

    /// Whether the namespace is tracked.
    pub fn is_tracked(&self, cookie: u64) -> bool {
        self.namespaces.contains_key(&cookie)
    }

    /// The timeline of a tracked namespace so far.
    pub fn timeline(&self, cookie: u64) -> Option<Vec<Arc<TimelineEntry>>> {
        self.namespaces.get(&cookie).map(|ns| ns.timeline())
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
            .filter(|(_, ns)| ns.verdict.is_none() && ns.due(deadline) <= now)
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

    /// The namespace `netns`, tracked from `now` when it was not.
    fn track(&mut self, netns: NetnsRef, now: SystemTime) -> &mut Ns {
        if !self.namespaces.contains_key(&netns.cookie) && self.namespaces.len() >= MAX_NAMESPACES {
            self.evict_one();
        }
        let judged = self.judged.get(&netns.cookie).copied();
        self.namespaces.entry(netns.cookie).or_insert_with(|| {
            let mut ns = Box::new(Ns::new(netns, now));
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
        let given_up = 2 * self.config.read_wait;
        if let Some(since) = pending
            && now.duration_since(since).unwrap_or_default() >= given_up
        {
            ns.snapshot.pending_since = None;
            ns.snapshot.answered_at = Some(since);
            ns.snapshot.error = Some(format!("no answer within {} ms", given_up.as_millis()));
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
        let due = ns.due(deadline);
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
}

#[cfg(test)]
mod tests;
