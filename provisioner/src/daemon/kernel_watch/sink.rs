//! The driver's output: each report filed into the views (a namespace that is no sandbox only
//! counted), its alarm recorded, and logged naming the pod its view names.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::pod::PodName;
use crate::trace::driver::Sink;
use crate::trace::{Attached, Report, TraceMetrics};

use super::super::watch_log::{Reported, log};
use super::views::{Shared, lock};

/// The driver's output, into [`Shared`].
pub(super) struct WatchSink {
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) deadline: Duration,
}

impl Sink for WatchSink {
    fn attached(&mut self, attached: &Attached) {
        crate::memory::return_freed_memory();
        let observations: Vec<String> = attached.observations.iter().map(|o| o.line()).collect();
        tracing::info!(deadline = ?self.deadline, observations = ?observations, "kernel tracing of sandbox network setup started");
        let mut shared = lock(&self.shared);
        shared.unavailable = None;
        shared
            .metrics
            .observations
            .clone_from(&attached.observations);
    }

    fn reports(&mut self, reports: Vec<Report>) {
        // Namespaces that are not sandboxes (a verdict without a reason to be one: `gone`) are
        // counted, not kept: a node creates thousands and they would crowd the sandboxes out.
        // Each report is logged once filed, naming the pod its view names then.
        let filed: Vec<(Reported, Option<PodName>)> = {
            let mut shared = lock(&self.shared);
            let now = Instant::now();
            reports
                .into_iter()
                .filter(|r| !matches!(r, Report::Verdict(v) if v.sandbox.is_none()))
                .map(|report| {
                    let filed = shared.record_one(report);
                    let pod = shared.pod_of_report(&filed);
                    if let Reported::Verdict(v) = &filed {
                        let named = pod.as_ref().and_then(PodName::known);
                        shared.alarms.record(v.netns.cookie, v.verdict, named, now);
                    }
                    (filed, pod)
                })
                .collect()
        };
        for (report, pod) in &filed {
            log(report, pod.as_ref());
        }
    }

    fn metrics(&mut self, metrics: TraceMetrics) {
        lock(&self.shared).metrics = metrics;
    }
}
