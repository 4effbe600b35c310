//! `provisioner trace`: print kernel events and sandbox verdicts as they happen.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::TraceError;
use super::correlator::{Correlator, CorrelatorConfig, NetnsKey};
use super::events::TraceEvent;
use super::loader::{KernelTracer, LossCounters};
use super::metrics::TraceMetrics;
use super::netns_id::netns_of_path;
use super::render::{event_line, report_lines};
use super::sandbox_rules::SandboxRules;
use super::verdict::Report;

/// What to trace and how to print it.
#[derive(Clone, Debug)]
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
    pub rules: SandboxRules,
    /// Print verdicts only, not every event.
    pub verdicts_only: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            json: false,
            duration: None,
            netns: None,
            comm: None,
            deadline: Duration::from_secs(10),
            rules: SandboxRules::default(),
            verdicts_only: false,
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
                        super::events::EventKind::NetnsCreated(c) if &c.parent_comm == comm)
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

/// Traces until `opts.duration` passes or Ctrl-C, writing one line per event and per verdict.
pub async fn run(opts: SessionOptions, out: &mut dyn Write) -> Result<SessionSummary, TraceError> {
    let (tracer, mut rx) = KernelTracer::start(65_536)?;
    let mut correlator = Correlator::new(CorrelatorConfig {
        deadline: opts.deadline,
        rules: opts.rules.clone(),
    });
    let cookie = match &opts.netns {
        Some(path) => {
            let netns = netns_of_path(path).map_err(|source| TraceError::Netns {
                path: path.clone(),
                source,
            })?;
            correlator.expect_sandbox(NetnsKey::Cookie(netns.cookie), SystemTime::now());
            Some(netns.cookie)
        }
        None => None,
    };
    let filter = Filter {
        cookie,
        comm: opts.comm.clone(),
    };
    let mut summary = SessionSummary::default();
    if opts.json {
        writeln!(out, "{}", serde_json::json!({ "report": "started" }))
    } else {
        writeln!(out, "tracing started (deadline {:?})", opts.deadline)
    }
    .and_then(|()| out.flush())
    .map_err(TraceError::Output)?;
    let end = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticker = tokio::time::interval(Duration::from_millis(50));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            event = rx.recv() => {
                let Some(event) = event else { break };
                handle_event(&opts, &filter, &mut correlator, &mut summary, &event, out)?;
            }
            _ = ticker.tick() => {
                let reports = correlator.tick(SystemTime::now());
                write_reports(&opts, &filter, &reports, &mut summary, out)?;
            }
            () = sleep_until(end) => break,
            _ = &mut ctrl_c => break,
        }
    }
    while let Ok(event) = rx.try_recv() {
        handle_event(&opts, &filter, &mut correlator, &mut summary, &event, out)?;
    }
    let reports = correlator.tick(SystemTime::now());
    write_reports(&opts, &filter, &reports, &mut summary, out)?;
    summary.loss = tracer.loss_counters();
    summary.metrics = TraceMetrics::collect(&correlator.metrics(), &summary.loss);
    if opts.json {
        let line = serde_json::json!({ "report": "summary", "summary": &summary });
        writeln!(out, "{line}").map_err(TraceError::Output)?;
    } else {
        writeln!(
            out,
            "SUMMARY events={} verdicts={:?} lost-in-kernel={:?} undecodable={:?}",
            summary.events,
            summary.verdicts,
            summary.metrics.lost_by_kind,
            summary.metrics.undecodable_by_kind
        )
        .map_err(TraceError::Output)?;
    }
    Ok(summary)
}

async fn sleep_until(end: Option<tokio::time::Instant>) {
    match end {
        Some(end) => tokio::time::sleep_until(end).await,
        None => std::future::pending().await,
    }
}

fn handle_event(
    opts: &SessionOptions,
    filter: &Filter,
    correlator: &mut Correlator,
    summary: &mut SessionSummary,
    event: &TraceEvent,
    out: &mut dyn Write,
) -> Result<(), TraceError> {
    summary.events += 1;
    let reports = correlator.feed(event);
    if !opts.verdicts_only && filter.event(event) {
        summary.printed_events += 1;
        let line = if opts.json {
            serde_json::to_string(event).unwrap_or_default()
        } else {
            event_line(event)
        };
        writeln!(out, "{line}").map_err(TraceError::Output)?;
    }
    write_reports(opts, filter, &reports, summary, out)
}

fn write_reports(
    opts: &SessionOptions,
    filter: &Filter,
    reports: &[Report],
    summary: &mut SessionSummary,
    out: &mut dyn Write,
) -> Result<(), TraceError> {
    for report in reports.iter().filter(|r| filter.report(r)) {
        if let Report::Verdict(v) = report {
            *summary.verdicts.entry(v.verdict.as_str()).or_default() += 1;
        }
        let text = if opts.json {
            serde_json::to_string(report).unwrap_or_default()
        } else {
            report_lines(report)
        };
        writeln!(out, "{text}").map_err(TraceError::Output)?;
    }
    out.flush().map_err(TraceError::Output)
}
