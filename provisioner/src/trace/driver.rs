//! The one loop that drives the tracer: kernel events, commands (the daemon's intents, a
//! namespace to watch), reads of namespace states the correlator asks for, and the clock, into
//! the correlator; its reports out to a [`Sink`]. `provisioner trace` and the daemon's kernel
//! watch both run it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::dataplane::NetnsSnapshot;
use crate::pod::{PodName, PodResolver};

use super::correlator::{Correlator, CorrelatorConfig, SnapshotRequest};
use super::counters::TraceMetrics;
use super::diagnosis::{CniSetup, diagnose_within_deadline};
use super::kernel::events::{NetnsRef, TraceEvent};
use super::kernel::{
    Attached, Backend, BackendChoices, EventBatch, KernelTracer, LossCounters, NetnsIds,
};
use super::verdict::{Intent, IntentKey, IntentOrigin, Report, RouteIntent, Verdict};
use super::{TraceError, background};

/// Kernel events buffered between the ring buffer reader and the correlator.
const EVENT_CHANNEL: usize = 65_536;
/// How often verdicts that came due are given.
const TICK: Duration = Duration::from_millis(100);
/// Namespace states read at once.
const CONCURRENT_READS: usize = 4;
/// Events of a batch fed between two offers of the CPU (see `background::CpuTurns`).
const OFFER_EVERY: usize = 16;

/// What the sandbox must show for an intent (the namespace is named by its file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntentSpec {
    pub key: IntentKey,
    pub origin: IntentOrigin,
    pub netns: PathBuf,
    /// The kernel's cookie of the namespace, when the caller knows it (else the namespace is
    /// identified from `netns`).
    pub netns_cookie: Option<u64>,
    pub ifname: String,
    pub addresses: Vec<ipnetwork::IpNetwork>,
    pub routes: Vec<RouteIntent>,
}

impl IntentSpec {
    /// What `expected` (the dataplane's plan of the sandbox) shows inside the sandbox.
    pub fn new(
        key: IntentKey,
        origin: IntentOrigin,
        netns: PathBuf,
        expected: &crate::dataplane::ExpectedState,
    ) -> Self {
        Self {
            key,
            origin,
            netns,
            netns_cookie: None,
            ifname: expected.ifname.clone(),
            addresses: expected.sandbox_addresses().collect(),
            routes: expected
                .sandbox_routes
                .iter()
                .map(|r| RouteIntent {
                    dst: r.dst,
                    gateway: r.gw,
                })
                .collect(),
        }
    }

    /// The spec, with its namespace's cookie known to the caller.
    pub fn known_as(self, netns_cookie: Option<u64>) -> Self {
        Self {
            netns_cookie,
            ..self
        }
    }
}

/// What the driver is asked to do besides tracing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Check that the kernel shows this sandbox's setup.
    Intent(IntentSpec),
    /// Forget the intent (the sandbox is being torn down on purpose).
    Forget(IntentKey),
    /// Treat the namespace at this path as a sandbox, whoever created it.
    Expect(PathBuf),
}

/// Where the driver's output goes.
pub trait Sink {
    /// The programs are attached: events flow from now on. `attached` says what each
    /// observation runs on and how namespaces are named.
    fn attached(&mut self, _attached: &Attached) {}
    /// A kernel event, after the correlator saw it.
    fn event(&mut self, _event: &TraceEvent) {}
    fn reports(&mut self, reports: Vec<Report>);
    /// The counters, refreshed every tick.
    fn metrics(&mut self, _metrics: TraceMetrics) {}
}

/// Options of one tracing run.
#[derive(Clone)]
pub struct DriverOptions {
    pub correlator: CorrelatorConfig,
    /// Judge the sandbox namespaces pinned when tracing starts (from their state).
    pub scan_pins: bool,
    /// The CNI setup assumed for a runtime whose own cannot be read (skip diagnoses).
    pub cni_fallback: CniSetup,
    /// Asked who a sandbox belongs to when an alarm is due on it and no CNI plugin's
    /// environment named its pod (at most once per namespace, with the read of its state).
    pub pod_resolver: Option<Arc<dyn PodResolver>>,
    /// Backends chosen instead of the probe's (see [`BackendChoices`]).
    pub backends: BackendChoices,
}

impl std::fmt::Debug for DriverOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverOptions")
            .field("correlator", &self.correlator)
            .field("scan_pins", &self.scan_pins)
            .field("cni_fallback", &self.cni_fallback)
            .field("pod_resolver", &self.pod_resolver.is_some())
            .field("backends", &self.backends)
            .finish()
    }
}

/// What a run ends with.
#[derive(Clone, Debug, Default)]
pub struct RunSummary {
    pub loss: LossCounters,
    pub metrics: TraceMetrics,
}

/// An intent whose namespace is being identified (its cookie read from its file).
struct Identified {
    seq: u64,
    spec: IntentSpec,
    netns: std::io::Result<NetnsRef>,
}

enum Done {
    Identified(Identified),
    Expected(PathBuf, std::io::Result<NetnsRef>),
    /// A state read, with the pod resolver's answer when it was asked too.
    Read(
        u64,
        SystemTime,
        Result<NetnsSnapshot, String>,
        Option<PodName>,
    ),
    Found(PathBuf, SystemTime, Result<NetnsSnapshot, String>),
}

/// Runs `driver` (a [`run`] and what follows it) on a thread of its own with a single-threaded
/// runtime, in the background (nice +10 and a short slice, `trace/background.rs`): the tracer's
/// work (decoding, correlating, reading states) never takes a worker from the daemon's requests
/// and yields the CPU to them when both want it.
pub fn spawn_background<F>(driver: F) -> std::io::Result<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("kernel-watch")
        .build()?;
    std::thread::Builder::new()
        .name("kernel-watch".to_owned())
        .spawn(move || {
            // Per thread; the threads this one starts (the runtime's blocking pool) inherit it.
            background::make_this_thread_background();
            runtime.block_on(driver);
        })?;
    Ok(())
}

/// Loads the programs (off the async workers) and runs until `stop` completes or the event
/// stream ends. Fails only when the programs cannot be loaded.
pub async fn run<S: Sink>(
    opts: DriverOptions,
    commands: mpsc::UnboundedReceiver<Command>,
    sink: &mut S,
    stop: impl std::future::Future<Output = ()>,
) -> Result<RunSummary, TraceError> {
    let backends = opts.backends.clone();
    let (tracer, mut events) =
        tokio::task::spawn_blocking(move || KernelTracer::start(EVENT_CHANNEL, &backends))
            .await
            .map_err(|e| TraceError::Worker(e.to_string()))??;
    sink.attached(tracer.attached());
    let ids = tracer.attached().ids.clone();
    let mut correlator = Correlator::new(opts.correlator.clone());
    let mut work: JoinSet<Done> = JoinSet::new();
    let mut reads = Reads {
        ids: ids.clone(),
        wait: opts.correlator.read_wait,
        in_flight: 0,
    };
    let mut intake = Intake {
        commands,
        ids: ids.clone(),
        latest: HashMap::new(),
        seq: 0,
    };
    if opts.scan_pins {
        spawn_pin_reads(&opts.correlator, &ids, &mut work).await;
    }
    let mut ticker = tokio::time::interval(TICK);
    let mut turns = background::CpuTurns::new();
    tokio::pin!(stop);
    loop {
        turns.offer();
        // Commands are taken whenever the driver wakes for anything else (the ring is drained
        // every 20 ms, the ticker ticks every 100 ms) instead of each waking its thread: one
        // wake-up less per ADD.
        intake.take(&mut correlator, &mut work, sink, &opts);
        let reports = tokio::select! {
            biased;
            () = &mut stop => break,
            Some(done) = work.join_next(), if !work.is_empty() => match done {
                Ok(done) => {
                    let (reports, was_read) =
                        finish(&mut correlator, &mut intake.latest, done, &opts.correlator.rules);
                    reads.ended(was_read);
                    reports
                }
                Err(err) => {
                    tracing::warn!(error = %err, "tracer helper task failed");
                    Vec::new()
                }
            },
            batch = events.recv() => match batch {
                Some(batch) => {
                    // Taken first: a forget sent before a teardown (while the driver waited for
                    // this batch) is in effect before the teardown's events are fed.
                    intake.take(&mut correlator, &mut work, sink, &opts);
                    feed_batch(&mut correlator, &batch, sink, &opts.cni_fallback, &mut turns);
                    tracer.recycle(batch);
                    Vec::new()
                }
                None => {
                    tracing::error!("kernel event stream ended; tracing stopped");
                    break;
                }
            },
            _ = ticker.tick() => tick(&mut correlator, &tracer, sink),
        };
        if !reports.is_empty() {
            sink.reports(diagnosed(&correlator, reports, &opts.cni_fallback));
        }
        let free = CONCURRENT_READS.saturating_sub(reads.in_flight);
        if free > 0 {
            reads.start(
                correlator.take_snapshot_requests(SystemTime::now(), free),
                &mut work,
                &opts.pod_resolver,
            );
        }
    }
    Ok(wind_down(
        &mut correlator,
        &tracer,
        &mut events,
        sink,
        &opts.cni_fallback,
    ))
}

/// Reads of namespace states the correlator asked for: at most [`CONCURRENT_READS`] at once
/// (the correlator keeps the rest until a read ends), each bounded by `wait`.
struct Reads {
    ids: NetnsIds,
    wait: Duration,
    in_flight: usize,
}

impl Reads {
    /// A helper task ended; `was_read` says whether it was one of these reads.
    fn ended(&mut self, was_read: bool) {
        self.in_flight = self.in_flight.saturating_sub(usize::from(was_read));
    }

    /// Starts `requests` (each with the pod resolver's question when it carries one).
    fn start(
        &mut self,
        requests: Vec<SnapshotRequest>,
        work: &mut JoinSet<Done>,
        resolver: &Option<Arc<dyn PodResolver>>,
    ) {
        for request in requests {
            self.in_flight += 1;
            let resolver = resolver.clone();
            let (ids, wait) = (self.ids.clone(), self.wait);
            work.spawn(async move {
                let at = SystemTime::now();
                let (read, pod) = tokio::join!(
                    read_cookie(&request, &ids, wait),
                    resolve_pod(resolver, &request, wait)
                );
                Done::Read(request.cookie, at, read, pod)
            });
        }
    }
}

/// Starts a read of each sandbox pin present now (listed off the async workers).
async fn spawn_pin_reads(config: &CorrelatorConfig, ids: &NetnsIds, work: &mut JoinSet<Done>) {
    let (rules, wait) = (config.rules.clone(), config.read_wait);
    let pins = tokio::task::spawn_blocking(move || sandbox_pins(&rules))
        .await
        .unwrap_or_default();
    for path in pins {
        let ids = ids.clone();
        work.spawn(async move {
            let at = SystemTime::now();
            let read = read_state(&path, &ids, wait).await;
            Done::Found(path, at, read)
        });
    }
}

/// Feeds a batch of kernel events, offering the CPU every [`OFFER_EVERY`] events.
fn feed_batch<S: Sink>(
    correlator: &mut Correlator,
    batch: &[TraceEvent],
    sink: &mut S,
    fallback: &CniSetup,
    turns: &mut background::CpuTurns,
) {
    for events in batch.chunks(OFFER_EVERY) {
        feed(correlator, events, sink, fallback);
        turns.offer();
    }
}

/// The verdicts that came due, and the counters refreshed out to `sink`.
fn tick<S: Sink>(correlator: &mut Correlator, tracer: &KernelTracer, sink: &mut S) -> Vec<Report> {
    let reports = correlator.tick(SystemTime::now());
    sink.metrics(TraceMetrics::collect(
        &correlator.metrics(),
        &tracer.loss_counters(),
        tracer.ring_usage(),
        &tracer.attached().observations,
    ));
    reports
}

/// Feeds the events still buffered, gives the verdicts due and the final counters.
fn wind_down<S: Sink>(
    correlator: &mut Correlator,
    tracer: &KernelTracer,
    events: &mut mpsc::Receiver<EventBatch>,
    sink: &mut S,
    fallback: &CniSetup,
) -> RunSummary {
    while let Ok(batch) = events.try_recv() {
        feed(correlator, &batch, sink, fallback);
    }
    let reports = correlator.tick(SystemTime::now());
    if !reports.is_empty() {
        sink.reports(diagnosed(correlator, reports, fallback));
    }
    let loss = tracer.loss_counters();
    let metrics = TraceMetrics::collect(
        &correlator.metrics(),
        &loss,
        tracer.ring_usage(),
        &tracer.attached().observations,
    );
    sink.metrics(metrics.clone());
    RunSummary { loss, metrics }
}

/// The commands from the daemon, and what is needed to take them in order.
struct Intake {
    commands: mpsc::UnboundedReceiver<Command>,
    ids: NetnsIds,
    /// The latest intent command per key: an identification that finishes after a newer
    /// command (or a forget) for its key is dropped.
    latest: HashMap<IntentKey, u64>,
    seq: u64,
}

impl Intake {
    /// Takes the commands sent so far: intents registered (their namespace identified first
    /// when the command does not name it), forgotten, namespaces to watch.
    fn take<S: Sink>(
        &mut self,
        correlator: &mut Correlator,
        work: &mut JoinSet<Done>,
        sink: &mut S,
        opts: &DriverOptions,
    ) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Intent(spec) => {
                    self.seq += 1;
                    let this = self.seq;
                    self.latest.insert(spec.key.clone(), this);
                    // The caller's cookie is the kernel's: the name of a namespace where the
                    // watch names them by the kernel's cookies.
                    if let Some(cookie) = spec
                        .netns_cookie
                        .filter(|_| self.ids.backend() == Backend::KernelCookie)
                    {
                        // Known already: registered now (an identification of an older command
                        // for this key still under way is dropped when it finishes).
                        let (reports, _) = finish(
                            correlator,
                            &mut self.latest,
                            Done::Identified(Identified {
                                seq: this,
                                spec,
                                // Its inode is read with its state, when needed.
                                netns: Ok(NetnsRef { cookie, inode: 0 }),
                            }),
                            &opts.correlator.rules,
                        );
                        if !reports.is_empty() {
                            sink.reports(diagnosed(correlator, reports, &opts.cni_fallback));
                        }
                        continue;
                    }
                    let ids = self.ids.clone();
                    work.spawn(async move {
                        let netns = ids.identify(&spec.netns).await;
                        Done::Identified(Identified {
                            seq: this,
                            spec,
                            netns,
                        })
                    });
                }
                Command::Forget(key) => {
                    self.latest.remove(&key);
                    correlator.remove_intent(&key);
                }
                Command::Expect(path) => {
                    let ids = self.ids.clone();
                    work.spawn(async move {
                        let netns = ids.identify(&path).await;
                        Done::Expected(path, netns)
                    });
                }
            }
        }
    }
}

/// Feeds `events` to the correlator in order, each event and the reports it led to out to
/// `sink`.
fn feed<S: Sink>(
    correlator: &mut Correlator,
    events: &[TraceEvent],
    sink: &mut S,
    fallback: &CniSetup,
) {
    for event in events {
        let reports = correlator.feed(event);
        sink.event(event);
        if !reports.is_empty() {
            sink.reports(diagnosed(correlator, reports, fallback));
        }
    }
}

/// `reports` with a diagnosis on each skip of a sandbox whose creator is known: the runtime's
/// CNI conf dir and what it holds, and whether a plugin binary ran since the sandbox's creation.
fn diagnosed(
    correlator: &Correlator,
    mut reports: Vec<Report>,
    fallback: &CniSetup,
) -> Vec<Report> {
    for report in &mut reports {
        if let Report::Verdict(v) = report
            && v.verdict == Verdict::Skipped
            && !v.creator.comm.is_empty()
        {
            let ran = correlator.execs_since(v.created_at);
            v.diagnosis = Some(diagnose_within_deadline(
                correlator.read_wait(),
                v.creator.pid,
                &v.creator.comm,
                fallback,
                &ran,
            ));
        }
    }
    reports
}

/// Feeds a finished helper task to the correlator; whether it was a read of a state asked for.
fn finish(
    correlator: &mut Correlator,
    latest: &mut HashMap<IntentKey, u64>,
    done: Done,
    rules: &super::SandboxRules,
) -> (Vec<Report>, bool) {
    let now = SystemTime::now();
    match done {
        Done::Identified(Identified { seq, spec, netns }) => {
            if latest.get(&spec.key) != Some(&seq) {
                return (Vec::new(), false);
            }
            latest.remove(&spec.key);
            match netns {
                Ok(netns) => {
                    let intent = Intent {
                        key: spec.key,
                        origin: spec.origin,
                        netns_cookie: netns.cookie,
                        ifname: spec.ifname,
                        addresses: spec.addresses,
                        routes: spec.routes,
                    };
                    (correlator.register_intent(intent, spec.netns, now), false)
                }
                Err(err) => {
                    tracing::warn!(sandbox = %spec.key, netns = %spec.netns.display(), error = %err, "cannot identify the sandbox netns for tracing");
                    (Vec::new(), false)
                }
            }
        }
        Done::Expected(path, netns) => {
            match netns {
                Ok(netns) => correlator.expect_sandbox(netns, path, now),
                Err(err) => {
                    tracing::warn!(netns = %path.display(), error = %err, "cannot identify the netns to watch");
                }
            }
            (Vec::new(), false)
        }
        Done::Read(cookie, at, read, pod) => {
            if let Some(pod) = pod {
                correlator.pod_resolved(cookie, pod);
            }
            (
                correlator.snapshot_taken(cookie, read.as_ref().map_err(Clone::clone), at, now),
                true,
            )
        }
        Done::Found(path, at, read) => match read {
            Ok(snapshot) if rules.is_sandbox_pin(&path) => {
                (correlator.found(path, &snapshot, at, now), false)
            }
            Ok(_) => (Vec::new(), false),
            Err(err) => {
                tracing::debug!(pin = %path.display(), error = %err, "pinned namespace could not be read");
                (Vec::new(), false)
            }
        },
    }
}

/// Reads the state of the namespace at `path`, within `wait`; the snapshot names the namespace
/// as `ids` does.
async fn read_state(path: &Path, ids: &NetnsIds, wait: Duration) -> Result<NetnsSnapshot, String> {
    match tokio::time::timeout(wait, crate::dataplane::snapshot(path)).await {
        Ok(Ok(mut snapshot)) => {
            let kernel_cookie = (snapshot.cookie != 0).then_some(snapshot.cookie);
            snapshot.cookie = ids
                .name(snapshot.inode, kernel_cookie)
                .ok_or_else(|| format!("{} cannot be named on this kernel", path.display()))?;
            Ok(snapshot)
        }
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!(
            "reading {} took longer than {} ms",
            path.display(),
            wait.as_millis()
        )),
    }
}

/// Who the sandbox of `request` belongs to, when the request asks and a resolver is at hand
/// (an answer within `wait`).
async fn resolve_pod(
    resolver: Option<Arc<dyn PodResolver>>,
    request: &SnapshotRequest,
    wait: Duration,
) -> Option<PodName> {
    let query = request.pod_query.as_ref()?;
    let resolver = resolver?;
    // The read waits for the answer: a resolver that does not bound itself is cut off at the
    // read's own bound.
    let asked = resolver.pod_of_netns(&request.paths, query.creator.as_ref());
    Some(
        tokio::time::timeout(wait, asked)
            .await
            .unwrap_or_else(|_| PodName::Unknown {
                reason: format!(
                    "the runtime was asked and did not answer within {} ms",
                    wait.as_millis()
                ),
            }),
    )
}

/// Reads the state of namespace `request.cookie` from the first of its files that still is it.
async fn read_cookie(
    request: &SnapshotRequest,
    ids: &NetnsIds,
    wait: Duration,
) -> Result<NetnsSnapshot, String> {
    let mut tried = Vec::new();
    for path in &request.paths {
        match read_state(path, ids, wait).await {
            Ok(snapshot) if snapshot.cookie == request.cookie => return Ok(snapshot),
            Ok(_) => tried.push(format!("{} is another namespace now", path.display())),
            Err(err) => tried.push(err),
        }
    }
    if tried.is_empty() {
        return Err("no file of the namespace is known".to_owned());
    }
    Err(tried.join("; "))
}

/// The sandbox pins present now under the rules' pin directories (`/var/run` is usually a link
/// to `/run`: each directory is listed once).
fn sandbox_pins(rules: &super::SandboxRules) -> Vec<PathBuf> {
    let mut pins = Vec::new();
    let mut listed = std::collections::HashSet::new();
    for dir in &rules.pin_dirs {
        if !listed.insert(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone())) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if rules.is_sandbox_pin(&path) {
                pins.push(path);
            }
        }
    }
    pins
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::SNAPSHOT_WAIT;

    struct Discard;

    impl Sink for Discard {
        fn reports(&mut self, _reports: Vec<Report>) {}
    }

    fn spec(container_id: &str, netns_cookie: Option<u64>) -> IntentSpec {
        IntentSpec {
            key: IntentKey {
                container_id: container_id.to_owned(),
                ifname: "eth0".to_owned(),
            },
            origin: IntentOrigin::Add,
            netns: PathBuf::from("/proc/self/ns/net"),
            netns_cookie,
            ifname: "eth0".to_owned(),
            addresses: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// An intent whose cookie the daemon gave is registered when taken, without opening its
    /// namespace; one without is identified first; a later command for the same key wins over
    /// an identification still under way.
    #[tokio::test]
    async fn an_intent_naming_its_namespace_is_registered_at_once() {
        let (commands, taken) = mpsc::unbounded_channel();
        let mut intake = Intake {
            commands: taken,
            ids: NetnsIds::kernel_cookies(),
            latest: HashMap::new(),
            seq: 0,
        };
        let opts = DriverOptions {
            correlator: CorrelatorConfig::default(),
            scan_pins: false,
            cni_fallback: CniSetup::assumed(Path::new("/nonexistent/cni")),
            pod_resolver: None,
            backends: BackendChoices::default(),
        };
        let mut correlator = Correlator::new(opts.correlator.clone());
        let mut work = JoinSet::new();

        commands
            .send(Command::Intent(spec("a", None)))
            .expect("open");
        commands
            .send(Command::Intent(spec("a", Some(77))))
            .expect("open");
        intake.take(&mut correlator, &mut work, &mut Discard, &opts);
        assert!(correlator.is_tracked(77), "registered when taken");
        assert_eq!(
            work.len(),
            1,
            "only the intent without a cookie is identified"
        );

        let identified = work.join_next().await.expect("a task").expect("it ran");
        let Done::Identified(Identified { netns: Ok(own), .. }) = &identified else {
            panic!("this process's namespace identified");
        };
        let own = own.cookie;
        finish(
            &mut correlator,
            &mut intake.latest,
            identified,
            &opts.correlator.rules,
        );
        assert!(
            !correlator.is_tracked(own),
            "the older command's identification is dropped"
        );
    }

    /// Answers with the pod `web-0`, counting the questions and keeping the last one.
    #[derive(Default)]
    struct FakeResolver {
        asked: std::sync::Mutex<Vec<(Vec<PathBuf>, Option<crate::pod::NetnsCreator>)>>,
    }

    impl PodResolver for FakeResolver {
        fn pod_of_netns<'a>(
            &'a self,
            netns_paths: &'a [PathBuf],
            creator: Option<&'a crate::pod::NetnsCreator>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = PodName> + Send + 'a>> {
            Box::pin(async move {
                if let Ok(mut asked) = self.asked.lock() {
                    asked.push((netns_paths.to_vec(), creator.cloned()));
                }
                PodName::Known {
                    pod: crate::pod::Pod::from_cni_args("K8S_POD_NAME=web-0").unwrap_or_default(),
                    source: crate::pod::PodSource::Cri {
                        runtime: "containerd".into(),
                    },
                }
            })
        }
    }

    /// A finished read that carries the resolver's answer gives it to the correlator before
    /// the state: the alarm it leads to names the pod.
    #[test]
    fn the_resolvers_answer_is_taken_before_the_read_is_judged() {
        use crate::trace::kernel::events::{
            EventKind, NetnsCreated, NetnsOrigin, TaskInfo, TraceEvent,
        };
        let config = CorrelatorConfig {
            deadline: Duration::from_millis(100),
            ..CorrelatorConfig::default()
        };
        let mut correlator = Correlator::new(config.clone());
        let created_at = SystemTime::now() - Duration::from_secs(1);
        correlator.feed(&TraceEvent {
            at: created_at,
            task: TaskInfo {
                pid: 42,
                tid: 42,
                comm: "containerd".into(),
                cgroup_id: 1,
            },
            kind: EventKind::NetnsCreated(NetnsCreated {
                netns_cookie: 9,
                netns_inode: 4_026_532_009,
                origin: NetnsOrigin::Unshare,
                flags: 0x4000_0000,
                owner_pid: 42,
                parent_pid: 1,
                parent_comm: "init".into(),
            }),
        });
        let now = SystemTime::now();
        assert!(correlator.tick(now).is_empty(), "no alarm before a read");
        let requests = correlator.take_snapshot_requests(now, usize::MAX);
        assert_eq!(requests.len(), 1);
        assert!(requests[0].pod_query.is_some(), "{requests:?}");
        let pod = PodName::Known {
            pod: crate::pod::Pod::from_cni_args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0")
                .unwrap_or_default(),
            source: crate::pod::PodSource::Cri {
                runtime: "containerd".into(),
            },
        };
        let lo_only = NetnsSnapshot {
            cookie: 9,
            inode: 4_026_532_009,
            links: Vec::new(),
            addresses: Vec::new(),
            routes: Vec::new(),
        };
        let (reports, was_read) = finish(
            &mut correlator,
            &mut HashMap::new(),
            Done::Read(9, now, Ok(lo_only), Some(pod.clone())),
            &config.rules,
        );
        assert!(was_read);
        let verdict = reports.iter().find_map(|r| match r {
            Report::Verdict(v) => Some(v),
            _ => None,
        });
        assert_eq!(verdict.map(|v| v.verdict), Some(Verdict::Skipped));
        assert_eq!(verdict.and_then(|v| v.pod.clone()), Some(pod));
    }

    /// Never answers.
    struct SilentResolver;

    impl PodResolver for SilentResolver {
        fn pod_of_netns<'a>(
            &'a self,
            _netns_paths: &'a [PathBuf],
            _creator: Option<&'a crate::pod::NetnsCreator>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = PodName> + Send + 'a>> {
            Box::pin(std::future::pending())
        }
    }

    /// A resolver that does not answer does not hold the read beyond its own bound.
    #[tokio::test]
    async fn a_silent_resolver_is_cut_off_at_the_reads_bound() {
        let request = SnapshotRequest {
            cookie: 7,
            paths: Vec::new(),
            pod_query: Some(super::super::PodQuery { creator: None }),
        };
        let answer = resolve_pod(Some(Arc::new(SilentResolver)), &request, SNAPSHOT_WAIT).await;
        assert_eq!(
            answer,
            Some(PodName::Unknown {
                reason: format!(
                    "the runtime was asked and did not answer within {} ms",
                    SNAPSHOT_WAIT.as_millis()
                )
            })
        );
    }

    /// The resolver is asked only for a read that carries a query, with the namespace's files
    /// and creator; without a resolver, nothing answers.
    #[tokio::test]
    async fn the_resolver_is_asked_only_for_reads_that_carry_a_query() {
        let fake = Arc::new(FakeResolver::default());
        let resolver: Arc<dyn PodResolver> = fake.clone();
        let creator = crate::pod::NetnsCreator {
            pid: 42,
            comm: "containerd".into(),
        };
        let mut request = SnapshotRequest {
            cookie: 7,
            paths: vec![PathBuf::from("/run/netns/cni-1")],
            pod_query: None,
        };
        assert_eq!(
            resolve_pod(Some(resolver.clone()), &request, SNAPSHOT_WAIT).await,
            None
        );
        request.pod_query = Some(super::super::PodQuery {
            creator: Some(creator.clone()),
        });
        let answer = resolve_pod(Some(resolver), &request, SNAPSHOT_WAIT).await;
        assert_eq!(
            answer
                .as_ref()
                .and_then(PodName::known)
                .map(|p| p.name.as_str()),
            Some("web-0")
        );
        assert_eq!(resolve_pod(None, &request, SNAPSHOT_WAIT).await, None);
        let asked = fake.asked.lock().map(|a| a.clone()).unwrap_or_default();
        assert_eq!(
            asked,
            vec![(vec![PathBuf::from("/run/netns/cni-1")], Some(creator))]
        );
    }
}
