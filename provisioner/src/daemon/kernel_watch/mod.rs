//! The daemon's kernel watch: runs the trace driver next to the daemon, observes the sandbox
//! service (each ADD's intent, each teardown, the sandboxes found at start), and pauses and
//! resumes the tracer at the operator's word.
//!
//! Tracing is best effort: when the kernel refuses the programs, the daemon keeps provisioning
//! and reports tracing as unavailable.
//!
//! - `views`: what the kernel showed of each sandbox, kept for `provisioner sandboxes`;
//! - `sink`: the driver's reports, filed into the views and logged.

mod sink;
pub(super) mod views;

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::dataplane::ExpectedState;
use crate::ipam::Allocation;
use crate::metrics::alarms::AlarmSeries;
use crate::pod::PodResolver;
use crate::sandbox::{Removal, SandboxObserver, SandboxRef, SandboxService};
use crate::trace::diagnosis::CniSetup;
use crate::trace::driver::{self, Command, DriverOptions, IntentSpec};
use crate::trace::{
    BackendChoices, CorrelatorConfig, IntentKey, IntentOrigin, SandboxRules, TraceMetrics,
};

use super::TraceOptions;
use super::sandbox_filter::SandboxFilter;
use sink::WatchSink;
pub use views::{AbsentSandbox, RemovedSandbox, SandboxView, SandboxesAnswer, ViewText};
use views::{Shared, lock};

/// `tracing_unavailable` while the programs load.
pub const STARTING: &str = "kernel tracing is starting";
/// `tracing_unavailable` while the operator has paused tracing.
pub const PAUSED: &str = "kernel tracing is paused (`provisioner kernel-watch on` resumes it)";
/// Longest wait for a paused run to detach its programs.
const PAUSE_WAIT: Duration = Duration::from_secs(10);

/// Handle held by the daemon; cheap to clone. It observes the sandbox service.
#[derive(Clone)]
pub struct KernelWatch {
    settings: Arc<Settings>,
    /// The tracer's current run; `None` while the operator has paused it.
    run: Arc<Mutex<Option<Run>>>,
    shared: Arc<Mutex<Shared>>,
}

/// What every run of the tracer is started with.
struct Settings {
    deadline: Duration,
    read_wait: Duration,
    rules: SandboxRules,
    cni_fallback: CniSetup,
    pod_resolver: Option<Arc<dyn PodResolver>>,
    backends: BackendChoices,
}

/// One run of the tracer, from loading the programs to their detachment.
struct Run {
    commands: mpsc::UnboundedSender<Command>,
    stop: oneshot::Sender<()>,
    /// Fires once the run ended: its programs are detached.
    ended: oneshot::Receiver<()>,
}

impl KernelWatch {
    /// Starts the tracer on a thread of its own; never fails (see [`SandboxesAnswer`]). Intents
    /// sent before the programs are attached wait for them.
    pub fn start(opts: &TraceOptions, cni_conf_dir: &Path) -> Self {
        let watch = Self {
            settings: Arc::new(Settings {
                deadline: opts.deadline,
                read_wait: opts.read_wait,
                rules: opts.rules.clone(),
                cni_fallback: CniSetup::assumed(cni_conf_dir),
                pod_resolver: opts.pod_resolver.clone(),
                backends: opts.backends.clone(),
            }),
            run: Arc::new(Mutex::new(None)),
            shared: Arc::new(Mutex::new(Shared::default())),
        };
        watch.launch();
        watch
    }

    /// Starts a run of the tracer: loads and attaches the programs in the background.
    fn launch(&self) {
        let (commands, rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        lock(&self.shared).unavailable = Some(STARTING.to_owned());
        let shared = Arc::clone(&self.shared);
        let settings = Arc::clone(&self.settings);
        // Loading takes a few hundred ms (BTF parsing, verification): readiness does not wait.
        let spawned = driver::spawn_background(async move {
            let mut sink = WatchSink {
                shared: Arc::clone(&shared),
                deadline: settings.deadline,
            };
            let opts = DriverOptions {
                correlator: CorrelatorConfig {
                    deadline: settings.deadline,
                    rules: settings.rules.clone(),
                    read_wait: settings.read_wait,
                },
                scan_pins: true,
                cni_fallback: settings.cni_fallback.clone(),
                pod_resolver: settings.pod_resolver.clone(),
                backends: settings.backends.clone(),
            };
            let stopped = async {
                let _ = stop_rx.await;
            };
            let why = match driver::run(opts, rx, &mut sink, stopped).await {
                Ok(_) => "kernel event stream ended".to_owned(),
                Err(err) => {
                    tracing::error!(error = %err, "kernel tracing unavailable; provisioning continues without it");
                    err.to_string()
                }
            };
            lock(&shared).unavailable = Some(why);
            let _ = ended_tx.send(());
        });
        if let Err(err) = spawned {
            tracing::error!(error = %err, "kernel watch thread could not start; provisioning continues without tracing");
            lock(&self.shared).unavailable =
                Some(format!("kernel watch thread could not start: {err}"));
        }
        *lock_run(&self.run) = Some(Run {
            commands,
            stop,
            ended,
        });
    }

    /// Stops tracing: the programs are detached when this returns (or after [`PAUSE_WAIT`],
    /// with a warning). The intents of ADDs made meanwhile are not checked; sandboxes seen
    /// before are forgotten until [`Self::resume`].
    pub async fn pause(&self) {
        let Some(run) = lock_run(&self.run).take() else {
            return;
        };
        let Run {
            commands,
            stop,
            ended,
        } = run;
        drop(commands);
        let _ = stop.send(());
        if tokio::time::timeout(PAUSE_WAIT, ended).await.is_err() {
            tracing::warn!(wait = ?PAUSE_WAIT, "kernel watch still stopping after the pause was asked for");
        }
        let mut shared = lock(&self.shared);
        // A resume that came meanwhile has started a run of its own.
        if lock_run(&self.run).is_none() {
            shared.unavailable = Some(PAUSED.to_owned());
        }
        drop(shared);
        tracing::info!("kernel tracing paused by the operator");
    }

    /// Starts tracing again after [`Self::pause`]; `false` when it was not paused. The caller
    /// hands the live sandboxes over again (the audit, as at start).
    pub fn resume(&self) -> bool {
        if lock_run(&self.run).is_some() {
            return false;
        }
        tracing::info!("kernel tracing resumed by the operator");
        self.launch();
        true
    }

    fn send(&self, command: Command) {
        // The driver only goes away when tracing failed or is paused; the intent then has no
        // one to check it.
        if let Some(run) = lock_run(&self.run).as_ref() {
            let _ = run.commands.send(command);
        }
    }

    /// The sandboxes (and absent ones) `filter` lets through, each view's `pod` the one
    /// [`SandboxView::pod`] names.
    pub fn sandboxes(&self, filter: &SandboxFilter) -> SandboxesAnswer {
        let shared = lock(&self.shared);
        SandboxesAnswer {
            tracing_unavailable: shared.unavailable.clone(),
            sandboxes: shared
                .order
                .iter()
                .filter_map(|c| shared.views.get(c))
                .filter(|view| filter.keeps(view))
                .map(|view| SandboxView {
                    pod: view.pod().cloned(),
                    ..SandboxView::clone(view)
                })
                .collect(),
            absent: shared
                .absent
                .iter()
                .filter(|absent| filter.keeps_absent(absent))
                .cloned()
                .collect(),
            metrics: shared.metrics.clone(),
        }
    }

    pub fn metrics(&self) -> (Option<String>, TraceMetrics) {
        let shared = lock(&self.shared);
        (shared.unavailable.clone(), shared.metrics.clone())
    }

    /// The sandboxes whose latest verdict is an alarm, by verdict and pod.
    pub fn alarms(&self) -> Vec<AlarmSeries> {
        lock(&self.shared).alarms.current(Instant::now())
    }
}

/// The audit: every sandbox `service` holds is handed to the kernel watch, to be checked against
/// the kernel (at start, and when a paused watch resumes: `occasion` says which, in the log).
pub async fn audit_existing(service: &SandboxService, occasion: &str) {
    match service.announce_existing().await {
        Ok(n) => tracing::info!(
            sandboxes = n,
            occasion,
            "live sandboxes handed to the kernel watch"
        ),
        Err(err) => tracing::warn!(error = %err, occasion, "audit of the live sandboxes"),
    }
}

fn key_of(sandbox: &SandboxRef) -> IntentKey {
    IntentKey {
        container_id: sandbox.container_id.clone(),
        ifname: sandbox.ifname.clone(),
    }
}

fn addresses_of(allocation: Option<&Allocation>) -> Vec<String> {
    allocation
        .map(|a| a.ips.iter().map(|ip| ip.address.to_string()).collect())
        .unwrap_or_default()
}

impl SandboxObserver for KernelWatch {
    fn planned(&self, sandbox: &SandboxRef, netns_cookie: Option<u64>, expected: &ExpectedState) {
        {
            let mut shared = lock(&self.shared);
            // A new ADD of a removed sandbox: wired again (a late report of the removed ADD must
            // not undo its removal, so this is the one place that does).
            shared.for_views_of(sandbox, |view| view.removed = None);
            shared.name_pod(sandbox, netns_cookie);
        }
        if let Some(netns) = &sandbox.netns {
            self.send(Command::Intent(
                IntentSpec::new(key_of(sandbox), IntentOrigin::Add, netns.clone(), expected)
                    .known_as(netns_cookie),
            ));
        }
    }

    fn rolled_back(&self, sandbox: &SandboxRef) {
        self.send(Command::Forget(key_of(sandbox)));
    }

    fn removing(&self, sandbox: &SandboxRef, _cause: Removal) {
        self.send(Command::Forget(key_of(sandbox)));
    }

    fn removed(&self, sandbox: &SandboxRef, cause: Removal, released: Option<&Allocation>) {
        match cause {
            Removal::Del => lock(&self.shared).removed(sandbox, "del", addresses_of(released)),
            Removal::Gc => lock(&self.shared).removed(sandbox, "gc", addresses_of(released)),
            Removal::NetnsGone => {}
        }
        if cause == Removal::NetnsGone {
            // Reconciliation knows the sandbox by its key: its pod is the one its store recorded.
            let pod = released
                .and_then(|a| a.pod.clone())
                .or_else(|| sandbox.pod.clone());
            lock(&self.shared).absent(
                sandbox,
                pod,
                addresses_of(released),
                "netns gone while the daemon was down (no host veth); its addresses were \
                 released by reconciliation"
                    .to_owned(),
            );
        }
    }

    fn found(&self, sandbox: &SandboxRef, netns: Option<&Path>, expected: &ExpectedState) {
        match netns {
            Some(netns) => {
                lock(&self.shared).name_pod(sandbox, None);
                self.send(Command::Intent(IntentSpec::new(
                    key_of(sandbox),
                    IntentOrigin::Audit,
                    netns.to_path_buf(),
                    expected,
                )));
            }
            None => {
                let who = crate::pod::describe(sandbox.pod.as_ref());
                crate::pod_event!(tracing::Level::WARN, sandbox.pod.as_ref(), Some(sandbox.container_id.as_str()),
                    container = %sandbox.container_id, ifname = %sandbox.ifname,
                    "sandbox of {who} found at start: its namespace could not be found (no pin, no process in it)");
                lock(&self.shared).absent(
                    sandbox,
                    sandbox.pod.clone(),
                    expected
                        .sandbox_addresses()
                        .map(|a| a.to_string())
                        .collect(),
                    "found at start, but its namespace could not be found (no pin, no \
                     process in it): not checked"
                        .to_owned(),
                );
            }
        }
    }
}

fn lock_run(run: &Mutex<Option<Run>>) -> std::sync::MutexGuard<'_, Option<Run>> {
    run.lock().unwrap_or_else(PoisonError::into_inner)
}
