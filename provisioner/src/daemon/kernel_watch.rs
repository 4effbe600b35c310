//! The daemon's kernel watch: runs the tracer and correlator next to the daemon, registers the
//! intent of every ADD, and keeps what the kernel showed for `provisioner sandboxes`.
//!
//! Tracing is best effort: when the kernel refuses the programs, the daemon keeps provisioning
//! and reports tracing as unavailable.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use ipnetwork::IpNetwork;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::trace::render::report_lines;
use crate::trace::{
    Correlator, CorrelatorConfig, Drift, Intent, IntentId, IntentVerdict, KernelTracer,
    NetnsVerdict, Report, RouteIntent, SandboxRules, TraceMetrics, netns_of_path,
};

/// Verdicts kept for `provisioner sandboxes` (oldest dropped first).
const KEPT_VERDICTS: usize = 4096;

/// `tracing_unavailable` while the programs load.
pub const STARTING: &str = "kernel tracing is starting";

/// Parsing the kernel's BTF allocates tens of MiB that the allocator keeps after it is freed;
/// hand it back so the daemon's resident size reflects what it uses.
fn release_freed_memory() {
    // SAFETY: malloc_trim only releases free heap memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What the daemon asks of the watch.
enum Command {
    Added {
        key: (String, String),
        netns: PathBuf,
        ifname: String,
        addresses: Vec<IpNetwork>,
        routes: Vec<RouteIntent>,
    },
    Deleted {
        key: (String, String),
    },
}

/// One sandbox namespace as the kernel showed it.
#[derive(Clone, Debug, Serialize)]
pub struct SandboxView {
    pub verdict: Option<NetnsVerdict>,
    /// The daemon's own ADD for this namespace, and whether the kernel confirmed it.
    pub intent: Option<IntentVerdict>,
    pub container_id: Option<String>,
    pub drifts: Vec<Drift>,
    /// Every report for this namespace, as `provisioner trace` prints it.
    pub text: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SandboxesAnswer {
    /// `None` when tracing runs; else why it does not.
    pub tracing_unavailable: Option<String>,
    pub sandboxes: Vec<SandboxView>,
    pub metrics: TraceMetrics,
}

#[derive(Default)]
struct Shared {
    unavailable: Option<String>,
    /// By netns cookie, insertion order kept in `order`.
    views: HashMap<u64, SandboxView>,
    order: VecDeque<u64>,
    metrics: TraceMetrics,
}

impl Shared {
    fn view(&mut self, cookie: u64) -> &mut SandboxView {
        if !self.views.contains_key(&cookie) {
            self.order.push_back(cookie);
            while self.order.len() > KEPT_VERDICTS {
                if let Some(old) = self.order.pop_front() {
                    self.views.remove(&old);
                }
            }
        }
        self.views.entry(cookie).or_insert_with(|| SandboxView {
            verdict: None,
            intent: None,
            container_id: None,
            drifts: Vec::new(),
            text: Vec::new(),
        })
    }

    fn record(&mut self, reports: Vec<Report>, containers: &HashMap<IntentId, String>) {
        for report in reports {
            let text = report_lines(&report);
            let cookie = match &report {
                Report::Verdict(v) => v.netns.cookie,
                Report::Intent(i) => i.intent.netns_cookie,
                Report::Drift(d) => d.netns_cookie,
            };
            self.view(cookie).text.push(text);
            match report {
                Report::Verdict(v) => {
                    let cookie = v.netns.cookie;
                    self.view(cookie).verdict = Some(v);
                }
                Report::Intent(i) => {
                    let container = containers.get(&i.id).cloned();
                    let view = self.view(i.intent.netns_cookie);
                    view.container_id = container;
                    view.intent = Some(i);
                }
                Report::Drift(d) => self.view(d.netns_cookie).drifts.push(d),
            }
        }
    }
}

/// Handle held by the daemon; cheap to clone.
#[derive(Clone)]
pub struct KernelWatch {
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<Mutex<Shared>>,
}

impl KernelWatch {
    /// Starts the tracer on the current runtime; never fails (see [`SandboxesAnswer`]).
    pub fn start(deadline: Duration, rules: SandboxRules) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Mutex::new(Shared {
            unavailable: Some(STARTING.to_owned()),
            ..Shared::default()
        }));
        // Loading takes a few hundred ms (BTF parsing, verification): readiness does not wait.
        tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                match KernelTracer::start(65_536) {
                    Ok((tracer, events)) => {
                        release_freed_memory();
                        tracing::info!(
                            ?deadline,
                            "kernel tracing of sandbox network setup started"
                        );
                        lock(&shared).unavailable = None;
                        let correlator = Correlator::new(CorrelatorConfig { deadline, rules });
                        run(tracer, events, rx, correlator, shared).await;
                    }
                    Err(err) => {
                        tracing::error!(error = %err, "kernel tracing unavailable; provisioning continues without it");
                        lock(&shared).unavailable = Some(err.to_string());
                    }
                }
            }
        });
        Self { commands, shared }
    }

    /// Registers an ADD's intent: the kernel must show its interface, addresses and routes.
    pub fn added(
        &self,
        container_id: &str,
        ifname: &str,
        netns: PathBuf,
        addresses: Vec<IpNetwork>,
        routes: Vec<RouteIntent>,
    ) {
        let _ = self.commands.send(Command::Added {
            key: (container_id.to_owned(), ifname.to_owned()),
            netns,
            ifname: ifname.to_owned(),
            addresses,
            routes,
        });
    }

    /// The sandbox was deleted by the daemon: no drift is reported for it any more.
    pub fn deleted(&self, container_id: &str, ifname: &str) {
        let _ = self.commands.send(Command::Deleted {
            key: (container_id.to_owned(), ifname.to_owned()),
        });
    }

    pub fn sandboxes(&self) -> SandboxesAnswer {
        let shared = lock(&self.shared);
        SandboxesAnswer {
            tracing_unavailable: shared.unavailable.clone(),
            sandboxes: shared
                .order
                .iter()
                .filter_map(|c| shared.views.get(c).cloned())
                .collect(),
            metrics: shared.metrics.clone(),
        }
    }

    pub fn metrics(&self) -> (Option<String>, TraceMetrics) {
        let shared = lock(&self.shared);
        (shared.unavailable.clone(), shared.metrics.clone())
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn run(
    tracer: KernelTracer,
    mut events: mpsc::Receiver<crate::trace::TraceEvent>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut correlator: Correlator,
    shared: Arc<Mutex<Shared>>,
) {
    let mut intents: HashMap<(String, String), IntentId> = HashMap::new();
    let mut containers: HashMap<IntentId, String> = HashMap::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    loop {
        let reports = tokio::select! {
            event = events.recv() => match event {
                Some(event) => correlator.feed(&event),
                None => {
                    tracing::error!("kernel event stream ended; tracing stopped");
                    lock(&shared).unavailable = Some("kernel event stream ended".into());
                    return;
                }
            },
            Some(command) = commands.recv() => match command {
                Command::Added { key, netns, ifname, addresses, routes } => {
                    match netns_of_path(&netns) {
                        Ok(id) => {
                            if let Some(old) = intents.remove(&key) {
                                correlator.remove_intent(old);
                                containers.remove(&old);
                            }
                            let intent = Intent { netns_cookie: id.cookie, ifname, addresses, routes };
                            let (intent_id, reports) = correlator.register_intent(intent, SystemTime::now());
                            containers.insert(intent_id, key.0.clone());
                            intents.insert(key, intent_id);
                            reports
                        }
                        Err(err) => {
                            tracing::warn!(netns = %netns.display(), error = %err, "cannot identify the sandbox netns for tracing");
                            Vec::new()
                        }
                    }
                }
                Command::Deleted { key } => {
                    if let Some(id) = intents.remove(&key) {
                        correlator.remove_intent(id);
                        containers.remove(&id);
                    }
                    Vec::new()
                }
            },
            _ = ticker.tick() => {
                let reports = correlator.tick(SystemTime::now());
                let metrics = TraceMetrics::collect(&correlator.metrics(), &tracer.loss_counters());
                lock(&shared).metrics = metrics;
                reports
            }
        };
        if !reports.is_empty() {
            lock(&shared).record(reports, &containers);
        }
    }
}
