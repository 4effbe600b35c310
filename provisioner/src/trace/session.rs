//! `provisioner trace`: print kernel events and sandbox verdicts as they happen.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use super::TraceError;
use super::correlator::CorrelatorConfig;
use super::counters::TraceMetrics;
use super::diagnosis::CniSetup;
use super::driver::{self, Command, DriverOptions, Sink};
use super::kernel::events::TraceEvent;
use super::kernel::{Attached, BackendChoices, LossCounters};
use super::render::{event_line, report_lines};
use super::sandbox_rules::SandboxRules;
use super::verdict::Report;

/// What to trace and how to print it.
#[derive(Clone)]
pub struct SessionOptions {
    /// JSON lines instead of human-readable lines.
    pub json: bool,
    /// Stop after this long (else at Ctrl-C).
    pub duration: Option<Duration>,
    /// Only this namespace (it is also treated as a sandbox).
    pub netns: Option<PathBuf>,
    /// Only events whose task (or the namespace's creator) has this comm.
    pub comm: Option<String>,
    /// Time a sandbox has to get its network.
    pub deadline: Duration,
    /// Time a read of a sandbox's state (and the runtime's answer about its pod) may take.
    pub read_wait: Duration,
    pub rules: SandboxRules,
    /// Print verdicts only, not every event.
    pub verdicts_only: bool,
    /// The CNI conf dir assumed for a runtime whose own cannot be read (skip diagnoses).
    pub cni_conf_dir: PathBuf,
    /// Asked for the pod of an alarmed sandbox no CNI call named (the node's CRI runtime).
    pub pod_resolver: Option<std::sync::Arc<dyn crate::pod::PodResolver>>,
    /// Backends chosen instead of the probe's.
    pub backends: BackendChoices,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            json: false,
            duration: None,
            netns: None,
            comm: None,
            deadline: Duration::from_secs(10),
            read_wait: super::SNAPSHOT_WAIT,
            rules: SandboxRules::default(),
            verdicts_only: false,
            cni_conf_dir: PathBuf::from("/etc/cni/net.d"),
            pod_resolver: None,
            backends: BackendChoices::default(),
        }
    }
}

/// What a session saw.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SessionSummary {
    pub events: u64,
    pub printed_events: u64,
    pub verdicts: BTreeMap<&'static str, u64>,
    pub loss: LossCounters,
    pub metrics: TraceMetrics,
}

struct Filter {
    cookie: Option<u64>,
    comm: Option<String>,
}

impl Filter {
    fn event(&self, event: &TraceEvent) -> bool {
        self.cookie
            .is_none_or(|c| event.kind.netns_cookies().contains(&c))
            && self.comm.as_ref().is_none_or(|comm| {
                &event.task.comm == comm
                    || matches!(&event.kind,
                        super::kernel::events::EventKind::NetnsCreated(c) if &c.parent_comm == comm)
            })
    }

    fn report(&self, report: &Report) -> bool {
        match report {
            Report::Verdict(v) => {
                self.cookie.is_none_or(|c| v.netns.cookie == c)
                    && self
                        .comm
                        .as_ref()
                        .is_none_or(|comm| &v.creator.comm == comm)
            }
            Report::Intent(i) => self.cookie.is_none_or(|c| i.intent.netns_cookie == c),
            Report::Drift(d) => self.cookie.is_none_or(|c| d.netns_cookie == c),
        }
    }
}

struct Printer<'a> {
    opts: &'a SessionOptions,
    filter: Filter,
    summary: SessionSummary,
    out: &'a mut dyn Write,
    /// The first write error; the session stops printing after it.
    error: Option<std::io::Error>,
    /// `--netns` could not be named once the programs were attached.
    netns_error: Option<std::io::Error>,
    /// Ends the session (`--netns` could not be named).
    abort: std::sync::Arc<tokio::sync::Notify>,
}

impl Printer<'_> {
    fn write(&mut self, line: &str) {
        if self.error.is_none()
            && let Err(err) = writeln!(self.out, "{line}").and_then(|()| self.out.flush())
        {
            self.error = Some(err);
        }
    }
}

impl Sink for Printer<'_> {
    fn attached(&mut self, attached: &Attached) {
        if let Some(path) = &self.opts.netns {
            // Named as this run of the watch names namespaces (see `NetnsIds`).
            match attached.ids.of_path(path) {
                Ok(netns) => self.filter.cookie = Some(netns.cookie),
                Err(err) => {
                    self.netns_error = Some(err);
                    self.abort.notify_one();
                }
            }
        }
        let line = if self.opts.json {
            serde_json::json!({ "report": "started", "observations": &attached.observations })
                .to_string()
        } else {
            let mut text = format!("tracing started (deadline {:?})", self.opts.deadline);
            for observation in &attached.observations {
                text.push_str("\n  ");
                text.push_str(&observation.line());
            }
            text
        };
        self.write(&line);
    }

    fn event(&mut self, event: &TraceEvent) {
        self.summary.events += 1;
        if self.opts.verdicts_only || !self.filter.event(event) {
            return;
        }
        self.summary.printed_events += 1;
        let line = if self.opts.json {
            serde_json::to_string(event).unwrap_or_default()
        } else {
            event_line(event)
        };
        self.write(&line);
    }

    fn reports(&mut self, reports: Vec<Report>) {
        for report in reports {
            if !self.filter.report(&report) {
                continue;
            }
            if let Report::Verdict(v) = &report {
                *self.summary.verdicts.entry(v.verdict.as_str()).or_default() += 1;
            }
            let text = if self.opts.json {
                serde_json::to_string(&report).unwrap_or_default()
            } else {
                report_lines(&report)
            };
            self.write(&text);
        }
    }
}

/// Traces until `opts.duration` passes or Ctrl-C, writing one line per event and per verdict.
/// Sandbox namespaces pinned when it starts are judged from their state.
pub async fn run(opts: SessionOptions, out: &mut dyn Write) -> Result<SessionSummary, TraceError> {
    let (commands, rx) = mpsc::unbounded_channel();
    if let Some(path) = &opts.netns {
        crate::dataplane::netns_inode_and_cookie(path)
            .await
            .map_err(|err| TraceError::Netns {
                path: path.clone(),
                source: std::io::Error::other(err),
            })?;
        let _ = commands.send(Command::Expect(path.clone()));
    }
    let mut printer = Printer {
        opts: &opts,
        filter: Filter {
            cookie: None,
            comm: opts.comm.clone(),
        },
        summary: SessionSummary::default(),
        out,
        error: None,
        netns_error: None,
        abort: std::sync::Arc::default(),
    };
    let abort = std::sync::Arc::clone(&printer.abort);
    let stop = async {
        let ctrl_c = tokio::signal::ctrl_c();
        match opts.duration {
            Some(d) => {
                tokio::select! {
                    () = tokio::time::sleep(d) => {}
                    _ = ctrl_c => {}
                }
            }
            None => {
                let _ = ctrl_c.await;
            }
        }
    };
    let driver_opts = DriverOptions {
        correlator: CorrelatorConfig {
            deadline: opts.deadline,
            rules: opts.rules.clone(),
            read_wait: opts.read_wait,
        },
        scan_pins: true,
        cni_fallback: CniSetup::assumed(&opts.cni_conf_dir),
        pod_resolver: opts.pod_resolver.clone(),
        backends: opts.backends.clone(),
    };
    let stop_or_abort = async {
        tokio::select! {
            () = stop => {}
            () = abort.notified() => {}
        }
    };
    let run = driver::run(driver_opts, rx, &mut printer, stop_or_abort).await?;
    drop(commands);
    if let (Some(path), Some(source)) = (&opts.netns, printer.netns_error.take()) {
        return Err(TraceError::Netns {
            path: path.clone(),
            source,
        });
    }
    if let Some(err) = printer.error.take() {
        return Err(TraceError::Output(err));
    }
    let mut summary = std::mem::take(&mut printer.summary);
    summary.loss = run.loss;
    summary.metrics = run.metrics;
    let line = if opts.json {
        serde_json::json!({ "report": "summary", "summary": &summary }).to_string()
    } else {
        format!(
            "SUMMARY events={} verdicts={:?} lost-in-kernel={:?} undecodable={:?}",
            summary.events,
            summary.verdicts,
            summary.metrics.lost_by_kind,
            summary.metrics.undecodable_by_kind
        )
    };
    printer.write(&line);
    printer
        .error
        .take()
        .map_or(Ok(summary), |err| Err(TraceError::Output(err)))
}
