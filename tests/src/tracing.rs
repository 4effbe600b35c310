//! The product's trace driver run in the background of a test, collecting its reports.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use provisioner::trace::diagnosis::CniSetup;
use provisioner::trace::driver::{self, Command, DriverOptions, RunSummary, Sink};
use provisioner::trace::{
    Attached, BackendChoices, CorrelatorConfig, IntentVerdict, NetnsIds, NetnsVerdict, Report,
    SandboxRules, netns_of_path,
};
use testkit::scaled;
use tokio::sync::{mpsc, oneshot};

/// What the driver said, in order.
enum Said {
    Attached(Box<Attached>),
    Report(Box<Report>),
}

struct Forward(mpsc::UnboundedSender<Said>);

impl Sink for Forward {
    fn attached(&mut self, attached: &Attached) {
        let _ = self.0.send(Said::Attached(Box::new(attached.clone())));
    }

    fn reports(&mut self, reports: Vec<Report>) {
        for report in reports {
            let _ = self.0.send(Said::Report(Box::new(report)));
        }
    }
}

/// A running trace driver; stopped when dropped.
pub struct Tracing {
    said: mpsc::UnboundedReceiver<Said>,
    commands: mpsc::UnboundedSender<Command>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<RunSummary>>>,
    /// Every verdict so far, with when it arrived.
    pub verdicts: Vec<(Instant, NetnsVerdict)>,
    pub intents: Vec<IntentVerdict>,
    /// What the kernel let the driver attach, and how it names namespaces.
    pub attached: Option<Attached>,
}

pub use testkit::daemon::TRACE_BACKENDS_ENV;

/// The backends [`TRACE_BACKENDS_ENV`] chooses (none when unset): those the in-process kernel
/// watches of the tests run on; the daemons of the tests get them as `--trace-backend`.
pub fn chosen_backends() -> Result<BackendChoices> {
    match std::env::var(TRACE_BACKENDS_ENV) {
        Ok(text) => text
            .parse()
            .map_err(|err| anyhow::anyhow!("{TRACE_BACKENDS_ENV}: {err}")),
        Err(_) => Ok(BackendChoices::default()),
    }
}

impl Tracing {
    /// Starts the driver (judging the sandbox pins already there) with `deadline` stretched by
    /// [`scaled`], and waits until its programs are attached.
    pub async fn start(rules: SandboxRules, deadline: Duration) -> Result<Self> {
        let deadline = scaled(deadline);
        crate::require_root();
        let (tx, said) = mpsc::unbounded_channel();
        let (commands, rx) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let opts = DriverOptions {
            correlator: CorrelatorConfig {
                deadline,
                rules,
                read_wait: scaled(provisioner::trace::SNAPSHOT_WAIT),
            },
            scan_pins: true,
            cni_fallback: CniSetup::default(),
            pod_resolver: None,
            backends: chosen_backends()?,
        };
        let task = tokio::spawn(async move {
            let mut sink = Forward(tx);
            let stop = async {
                let _ = stopped.await;
            };
            driver::run(opts, rx, &mut sink, stop)
                .await
                .context("trace driver")
        });
        let mut tracing = Self {
            said,
            commands,
            stop: Some(stop),
            task: Some(task),
            verdicts: Vec::new(),
            intents: Vec::new(),
            attached: None,
        };
        match tokio::time::timeout(scaled(Duration::from_secs(30)), tracing.said.recv()).await {
            Ok(Some(Said::Attached(attached))) => {
                tracing.attached = Some(*attached);
                Ok(tracing)
            }
            Ok(_) => {
                let task = tracing.task.take().context("driver task")?;
                match task.await? {
                    Err(err) => Err(err),
                    Ok(_) => bail!("the trace driver stopped before attaching"),
                }
            }
            Err(_) => bail!("the trace driver did not attach within 30 s"),
        }
    }

    /// The cookie of the namespace at `path` as this driver names it (its identity; inodes are
    /// recycled).
    pub fn cookie_of(&self, path: &Path) -> Result<u64> {
        named(&self.ids()?, path)
    }

    /// How this driver names namespaces (for a closure that outlives a borrow of `self`).
    pub fn ids(&self) -> Result<NetnsIds> {
        self.attached
            .as_ref()
            .map(|a| a.ids.clone())
            .context("the driver has not attached")
    }

    /// Treats the namespace at `path` as a sandbox.
    pub fn expect(&self, path: &Path) {
        let _ = self.commands.send(Command::Expect(path.to_path_buf()));
    }

    /// Collects what the driver says for `span` (stretched by [`scaled`]).
    pub async fn collect(&mut self, span: Duration) {
        let end = tokio::time::Instant::now() + scaled(span);
        while let Ok(Some(said)) = tokio::time::timeout_at(end, self.said.recv()).await {
            self.keep(said);
        }
    }

    fn keep(&mut self, said: Said) {
        let Said::Report(report) = said else {
            return;
        };
        match *report {
            Report::Verdict(v) => self.verdicts.push((Instant::now(), v)),
            Report::Intent(i) => self.intents.push(i),
            Report::Drift(_) => {}
        }
    }

    /// The first verdict on namespace `cookie` matching `wanted`, waiting at most `within`
    /// (stretched by [`scaled`]).
    pub async fn verdict_where(
        &mut self,
        cookie: u64,
        within: Duration,
        wanted: impl Fn(&NetnsVerdict) -> bool,
    ) -> Result<(Instant, NetnsVerdict)> {
        let within = scaled(within);
        let end = tokio::time::Instant::now() + within;
        loop {
            if let Some(found) = self
                .verdicts
                .iter()
                .find(|(_, v)| v.netns.cookie == cookie && wanted(v))
            {
                return Ok(found.clone());
            }
            match tokio::time::timeout_at(end, self.said.recv()).await {
                Ok(Some(said)) => self.keep(said),
                Ok(None) => bail!("the trace driver stopped"),
                Err(_) => bail!(
                    "no verdict for netns cookie {cookie} within {within:?}; verdicts so far: {:?}",
                    self.verdicts_on(cookie)
                        .iter()
                        .map(|v| (v.verdict, v.reason.clone()))
                        .collect::<Vec<_>>()
                ),
            }
        }
    }

    /// The first verdict on namespace `cookie`, waiting at most `within`.
    pub async fn verdict(
        &mut self,
        cookie: u64,
        within: Duration,
    ) -> Result<(Instant, NetnsVerdict)> {
        self.verdict_where(cookie, within, |_| true).await
    }

    /// Every verdict on namespace `cookie` so far.
    pub fn verdicts_on(&self, cookie: u64) -> Vec<&NetnsVerdict> {
        self.verdicts
            .iter()
            .map(|(_, v)| v)
            .filter(|v| v.netns.cookie == cookie)
            .collect()
    }

    /// Stops the driver; what it ran with.
    pub async fn stop(mut self) -> Result<RunSummary> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().context("driver task")?;
        task.await?
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The cookie of the namespace at `path` as `ids` names it.
pub fn named(ids: &NetnsIds, path: &Path) -> Result<u64> {
    ids.of_path(path)
        .map(|n| n.cookie)
        .with_context(|| format!("identify netns {}", path.display()))
}

/// The cookie of the calling thread's namespace as `ids` names it. Allocates nothing: a child
/// of `clone` may call it.
pub fn own_netns_name(ids: &NetnsIds) -> Option<u64> {
    let inode = nix::sys::stat::stat("/proc/thread-self/ns/net")
        .ok()?
        .st_ino;
    ids.name(inode, provisioner::dataplane::current_netns_cookie().ok())
}

/// The kernel's cookie of the namespace at `path` (its identity; inodes are recycled): how
/// every kernel watch names it on a kernel that gives cookies (`SO_NETNS_COOKIE`).
pub fn cookie_of(path: &Path) -> Result<u64> {
    netns_of_path(path)
        .map(|n| n.cookie)
        .with_context(|| format!("identify netns {}", path.display()))
}

/// `/run/netns/<name>`
pub fn pin_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{name}"))
}
