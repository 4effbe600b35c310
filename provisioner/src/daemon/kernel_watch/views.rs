//! What the kernel showed of each sandbox namespace, kept for `provisioner sandboxes`: a view
//! per namespace (its verdict, its ADD's intent, the pod, drifts, removal, recent reports),
//! indexed by sandbox, the oldest dropped first, and the sandboxes found absent at start.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::Serialize;

use crate::metrics::alarms::SandboxAlarms;
use crate::pod::{Pod, PodName, PodSource};
use crate::sandbox::SandboxRef;
use crate::trace::render::{intent_line, report_lines, verdict_lines};
use crate::trace::verdict::format_time;
use crate::trace::{Drift, IntentKey, IntentVerdict, NetnsVerdict, Report, TraceMetrics};

use super::super::watch_log::Reported;

/// Sandboxes kept for `provisioner sandboxes` (oldest dropped first).
const KEPT_VIEWS: usize = 4096;
/// Reports kept per sandbox view.
const KEPT_TEXTS: usize = 16;

/// One sandbox namespace as the kernel showed it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SandboxView {
    /// The latest verdict (a revised one replaces the alarm it revises).
    #[serde(serialize_with = "serialize_shared")]
    pub verdict: Option<Arc<NetnsVerdict>>,
    /// The daemon's own ADD (or the audit at start) for this namespace, and whether the kernel
    /// confirmed it.
    #[serde(serialize_with = "serialize_shared")]
    pub intent: Option<Arc<IntentVerdict>>,
    pub container_id: Option<String>,
    /// The pod this sandbox belongs to; read it through [`SandboxView::pod`]. Set by the
    /// daemon's ADD (its `CNI_ARGS`) or the audit (the pod its allocation records).
    pub pod: Option<PodName>,
    pub drifts: Vec<Drift>,
    /// The sandbox was removed (by the runtime's DEL or GC) after its latest ADD: its intent
    /// is history, its addresses are free.
    pub removed: Option<RemovedSandbox>,
    /// The latest reports for this namespace, as `provisioner trace` prints them.
    pub text: Vec<ViewText>,
}

impl SandboxView {
    /// The pod of this sandbox as far as the daemon knows it: what every output and log line
    /// about the sandbox names.
    pub fn pod(&self) -> Option<&PodName> {
        self.pod
            .as_ref()
            .or_else(|| self.verdict.as_ref()?.pod.as_ref())
    }
}

/// One of a view's reports as `provisioner trace` prints it. A verdict or an intent's answer is
/// kept once, shared with [`SandboxView::verdict`] or [`SandboxView::intent`], and rendered
/// when asked for: a verdict's timeline, rendered, was the largest thing kept per sandbox, and
/// an intent's line was rendered at every ADD for a view rarely asked for.
#[derive(Clone, Debug)]
pub enum ViewText {
    Line(String),
    Verdict(Arc<NetnsVerdict>),
    /// An intent's answer and the pod of its sandbox.
    Intent(Arc<IntentVerdict>, Option<Pod>),
}

impl ViewText {
    /// The text as `provisioner sandboxes` shows it.
    pub fn render(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ViewText::Line(line) => line.into(),
            ViewText::Verdict(verdict) => verdict_lines(verdict).into(),
            ViewText::Intent(intent, pod) => intent_line(intent, pod.as_ref()).into(),
        }
    }
}

impl Serialize for ViewText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.render())
    }
}

fn serialize_shared<S: serde::Serializer, T: Serialize>(
    shared: &Option<Arc<T>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    shared.as_deref().serialize(serializer)
}

/// How and when a sandbox's wiring was removed.
#[derive(Clone, Debug, Serialize)]
pub struct RemovedSandbox {
    /// `del` or `gc`.
    pub by: &'static str,
    pub at: String,
    /// The addresses released.
    pub addresses: Vec<String>,
}

/// A sandbox of the store whose namespace could not be checked.
#[derive(Clone, Debug, Serialize)]
pub struct AbsentSandbox {
    pub container_id: String,
    pub ifname: String,
    /// The pod its allocation records.
    pub pod: Option<Pod>,
    pub addresses: Vec<String>,
    /// What happened, in words.
    pub what: String,
    pub at: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct SandboxesAnswer {
    /// `None` when tracing runs; else why it does not.
    pub tracing_unavailable: Option<String>,
    pub sandboxes: Vec<SandboxView>,
    /// Sandboxes found at start whose namespace was gone (released by reconciliation) or
    /// could not be found.
    pub absent: Vec<AbsentSandbox>,
    pub metrics: TraceMetrics,
}

/// The views and what else the watch keeps, behind one lock.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) unavailable: Option<String>,
    /// By netns cookie, insertion order kept in `order`. Each boxed: a map's table is sized to
    /// a power of two, and its empty slots are as large as what it holds.
    pub(super) views: HashMap<u64, Box<SandboxView>>,
    pub(super) order: VecDeque<u64>,
    /// The views (cookies) holding an ADD's intent, by (container id, ifname): found without
    /// a scan of every view on each ADD and DEL.
    by_sandbox: HashMap<(String, String), Vec<u64>>,
    /// The pod of each sandbox (container id, ifname) an ADD or the audit named, until its
    /// removal: what its intents and drifts are told with.
    pods: HashMap<(String, String), Pod>,
    pub(super) absent: VecDeque<AbsentSandbox>,
    pub(super) metrics: TraceMetrics,
    pub(super) alarms: SandboxAlarms,
}

impl Shared {
    fn view(&mut self, cookie: u64) -> &mut SandboxView {
        if !self.views.contains_key(&cookie) {
            self.order.push_back(cookie);
            while self.order.len() > KEPT_VIEWS {
                if let Some(old) = self.order.pop_front()
                    && let Some(gone) = self.views.remove(&old)
                {
                    self.unindex(&gone, old);
                }
            }
        }
        self.views.entry(cookie).or_default()
    }

    fn push_text(view: &mut SandboxView, text: ViewText) {
        if view.text.len() >= KEPT_TEXTS {
            view.text.remove(0);
        }
        view.text.push(text);
    }

    /// Applies `change` to the views of `sandbox`'s ADDs.
    pub(super) fn for_views_of(
        &mut self,
        sandbox: &SandboxRef,
        mut change: impl FnMut(&mut SandboxView),
    ) {
        let key = (sandbox.container_id.clone(), sandbox.ifname.clone());
        let Some(cookies) = self.by_sandbox.get(&key) else {
            return;
        };
        for cookie in cookies {
            if let Some(view) = self.views.get_mut(cookie) {
                change(view);
            }
        }
    }

    /// Files `cookie` under `key`, and no longer under `previous` (its view's former intent).
    fn index(&mut self, previous: Option<(String, String)>, key: (String, String), cookie: u64) {
        if previous.as_ref() == Some(&key) {
            return;
        }
        if let Some(previous) = previous
            && let Some(cookies) = self.by_sandbox.get_mut(&previous)
        {
            cookies.retain(|c| *c != cookie);
            if cookies.is_empty() {
                self.by_sandbox.remove(&previous);
            }
        }
        let cookies = self.by_sandbox.entry(key).or_default();
        if !cookies.contains(&cookie) {
            cookies.push(cookie);
        }
    }

    /// Drops `cookie` from the index entry of `view`'s intent.
    fn unindex(&mut self, view: &SandboxView, cookie: u64) {
        let Some(i) = &view.intent else {
            return;
        };
        let key = (
            i.intent.key.container_id.clone(),
            i.intent.key.ifname.clone(),
        );
        if let Some(cookies) = self.by_sandbox.get_mut(&key) {
            cookies.retain(|c| *c != cookie);
            if cookies.is_empty() {
                self.by_sandbox.remove(&key);
            }
        }
    }

    /// Remembers the pod `sandbox` names for its intents, and names it on the view of
    /// `cookie` (its namespace, when known).
    pub(super) fn name_pod(&mut self, sandbox: &SandboxRef, cookie: Option<u64>) {
        let Some(pod) = &sandbox.pod else {
            return;
        };
        self.pods.insert(
            (sandbox.container_id.clone(), sandbox.ifname.clone()),
            pod.clone(),
        );
        if let Some(cookie) = cookie {
            self.view(cookie).pod = Some(cni_call(pod));
        }
    }

    /// The pod the daemon knows for the sandbox of `key`.
    fn pod_of(&self, key: &IntentKey) -> Option<&Pod> {
        self.pods
            .get(&(key.container_id.clone(), key.ifname.clone()))
    }

    /// The pod a recorded report is about: its sandbox's (an intent's, a drift's), else its
    /// view's (which holds the report).
    pub(super) fn pod_of_report(&self, report: &Reported) -> Option<PodName> {
        let (cookie, key) = match report {
            Reported::Verdict(v) => (v.netns.cookie, None),
            Reported::Intent(i) => (i.intent.netns_cookie, Some(&i.intent.key)),
            Reported::Drift(d) => (d.netns_cookie, Some(&d.key)),
        };
        key.and_then(|key| self.pod_of(key))
            .map(cni_call)
            .or_else(|| self.views.get(&cookie)?.pod().cloned())
    }

    /// Marks the views of `sandbox`'s ADDs as removed (their intents are history).
    pub(super) fn removed(
        &mut self,
        sandbox: &SandboxRef,
        by: &'static str,
        addresses: Vec<String>,
    ) {
        self.pods
            .remove(&(sandbox.container_id.clone(), sandbox.ifname.clone()));
        let at = format_time(SystemTime::now());
        self.for_views_of(sandbox, |view| {
            if view.removed.is_some() {
                return;
            }
            Self::push_text(
                view,
                ViewText::Line(format!(
                    "{at} REMOVED container {} ({}) by {}: addresses [{}] released",
                    sandbox.container_id,
                    sandbox.ifname,
                    by.to_uppercase(),
                    addresses.join(", ")
                )),
            );
            view.removed = Some(RemovedSandbox {
                by,
                at: at.clone(),
                addresses: addresses.clone(),
            });
        });
    }

    #[cfg(test)]
    fn record(&mut self, reports: Vec<Report>) {
        for report in reports {
            self.record_one(report);
        }
    }

    /// Files `report` in its view; what was filed, for the log.
    pub(super) fn record_one(&mut self, report: Report) -> Reported {
        let cookie = match &report {
            Report::Verdict(v) => v.netns.cookie,
            Report::Intent(i) => i.intent.netns_cookie,
            Report::Drift(d) => d.netns_cookie,
        };
        // A verdict's or an intent's text is rendered from it when asked for.
        let line = match &report {
            Report::Verdict(_) | Report::Intent(_) => None,
            other => Some(ViewText::Line(report_lines(other))),
        };
        let view = self.view(cookie);
        if let Some(line) = line {
            Self::push_text(view, line);
        }
        match report {
            Report::Verdict(mut v) => {
                // The pod our own CNI call named, where the trace saw no plugin run by a
                // runtime name it: the verdict names it too, as the view and the log line do.
                if !matches!(v.pod, Some(PodName::Known { .. }))
                    && matches!(view.pod, Some(PodName::Known { .. }))
                {
                    v.pod.clone_from(&view.pod);
                }
                let verdict = Arc::new(v);
                Self::push_text(view, ViewText::Verdict(Arc::clone(&verdict)));
                view.verdict = Some(Arc::clone(&verdict));
                Reported::Verdict(verdict)
            }
            Report::Intent(i) => {
                let key_of = |i: &IntentVerdict| {
                    (
                        i.intent.key.container_id.clone(),
                        i.intent.key.ifname.clone(),
                    )
                };
                let previous = view.intent.as_deref().map(key_of);
                let key = key_of(&i);
                view.container_id = Some(i.intent.key.container_id.clone());
                let pod = self.pods.get(&key).cloned();
                let view = self.view(cookie);
                if let Some(pod) = &pod {
                    view.pod = Some(cni_call(pod));
                }
                let intent = Arc::new(i);
                Self::push_text(view, ViewText::Intent(Arc::clone(&intent), pod));
                view.intent = Some(Arc::clone(&intent));
                self.index(previous, key, cookie);
                Reported::Intent(intent)
            }
            Report::Drift(d) => {
                if view.drifts.len() < KEPT_TEXTS {
                    view.drifts.push(d.clone());
                }
                Reported::Drift(Box::new(d))
            }
        }
    }

    pub(super) fn absent(
        &mut self,
        sandbox: &SandboxRef,
        pod: Option<Pod>,
        addresses: Vec<String>,
        what: String,
    ) {
        if self.absent.len() >= KEPT_VIEWS {
            self.absent.pop_front();
        }
        self.absent.push_back(AbsentSandbox {
            container_id: sandbox.container_id.clone(),
            ifname: sandbox.ifname.clone(),
            pod,
            addresses,
            what,
            at: format_time(SystemTime::now()),
        });
    }
}

/// A pod named by the daemon's own CNI call.
fn cni_call(pod: &Pod) -> PodName {
    PodName::Known {
        pod: pod.clone(),
        source: PodSource::CniCall,
    }
}

pub(super) fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::sandbox_filter::SandboxFilter;
    use crate::trace::verdict::{IntentStatus, fixtures};

    fn intent(cookie: u64, container_id: &str) -> Report {
        Report::Intent(fixtures::intent(
            cookie,
            container_id,
            IntentStatus::Confirmed,
            &[],
        ))
    }

    fn sandbox(container_id: &str) -> SandboxRef {
        SandboxRef {
            container_id: container_id.to_owned(),
            ifname: "eth0".to_owned(),
            netns: None,
            pod: None,
        }
    }

    fn removed(shared: &Shared) -> Vec<u64> {
        let mut cookies: Vec<u64> = shared
            .views
            .iter()
            .filter(|(_, v)| v.removed.is_some())
            .map(|(c, _)| *c)
            .collect();
        cookies.sort_unstable();
        cookies
    }

    #[test]
    fn a_removal_marks_the_views_of_that_sandbox_only_and_the_next_add_clears_them() {
        let mut shared = Shared::default();
        // c1's first ADD in netns 1, its retry in netns 2; c2 in netns 3.
        shared.record(vec![intent(1, "c1"), intent(2, "c1"), intent(3, "c2")]);
        shared.removed(&sandbox("c1"), "del", vec!["10.0.0.2/24".to_owned()]);
        assert_eq!(removed(&shared), [1, 2]);
        assert!(
            shared.views[&1]
                .text
                .iter()
                .any(|t| t.render().contains("REMOVED container c1"))
        );
        shared.for_views_of(&sandbox("c1"), |view| view.removed = None);
        assert_eq!(removed(&shared), Vec::<u64>::new());
        // Netns 2 now holds c3's intent: c1's removal no longer reaches it.
        shared.record(vec![intent(2, "c3")]);
        shared.removed(&sandbox("c1"), "gc", Vec::new());
        assert_eq!(removed(&shared), [1]);
        shared.removed(&sandbox("c3"), "del", Vec::new());
        assert_eq!(removed(&shared), [1, 2]);
    }

    fn web0() -> Pod {
        Pod::from_cni_args(
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-0;K8S_POD_INFRA_CONTAINER_ID=c1",
        )
        .expect("a pod")
    }

    #[test]
    fn a_verdict_the_trace_could_not_name_names_the_pod_of_our_add() {
        let mut shared = Shared::default();
        let named = SandboxRef {
            pod: Some(web0()),
            ..sandbox("c1")
        };
        shared.name_pod(&named, Some(1));
        let verdict = |cookie: u64| {
            Report::Verdict(fixtures::verdict(
                cookie,
                crate::trace::Verdict::Networked,
                Some(PodName::Unknown {
                    reason: "no CNI call naming it was seen and no runtime was asked".to_owned(),
                }),
                "seen being set up",
            ))
        };
        shared.record_one(verdict(1));
        let stored = shared.views[&1].verdict.clone().expect("a verdict");
        assert_eq!(stored.pod.as_ref().and_then(PodName::known), Some(&web0()));
        let text = shared.views[&1].text[0].render().into_owned();
        assert!(
            text.contains("VERDICT NETWORKED pod default/web-0"),
            "{text}"
        );
        // A namespace no ADD of ours named keeps the trace's answer.
        shared.record_one(verdict(2));
        let other = shared.views[&2].verdict.clone().expect("a verdict");
        assert!(
            matches!(other.pod, Some(PodName::Unknown { .. })),
            "{other:?}"
        );
    }

    #[test]
    fn the_pod_an_add_names_is_on_its_view_its_intent_and_the_filter() {
        let mut shared = Shared::default();
        let named = SandboxRef {
            pod: Some(web0()),
            ..sandbox("c1")
        };
        // The ADD knows its namespace's cookie: the view is named before any report.
        shared.name_pod(&named, Some(1));
        assert_eq!(
            shared.views[&1].pod().and_then(PodName::known),
            Some(&web0())
        );
        // The ADD of c2 names no pod; its intent (netns 2) and c1's (netns 1) come later.
        shared.name_pod(&sandbox("c2"), Some(2));
        let filed = shared.record_one(intent(1, "c1"));
        assert_eq!(
            shared
                .pod_of_report(&filed)
                .as_ref()
                .and_then(PodName::known),
            Some(&web0())
        );
        let filed = shared.record_one(intent(2, "c2"));
        assert_eq!(shared.pod_of_report(&filed), None);
        let text = shared.views[&1].text[0].render().into_owned();
        assert!(
            text.starts_with(
                "INTENT CONFIRMED pod default/web-0 (uid u-0, sandbox c1) container c1"
            ),
            "{text}"
        );
        assert_eq!(shared.views[&2].pod(), None);
        let filter = |pod: &str| SandboxFilter {
            pod: Some(pod.to_owned()),
            verdict: None,
        };
        let kept = |f: &SandboxFilter| {
            let mut cookies: Vec<u64> = shared
                .views
                .iter()
                .filter(|(_, v)| f.keeps(v))
                .map(|(c, _)| *c)
                .collect();
            cookies.sort_unstable();
            cookies
        };
        assert_eq!(kept(&filter("default/web-0")), [1]);
        assert_eq!(kept(&filter("web-0")), [1]);
        assert_eq!(kept(&filter("other/web-0")), Vec::<u64>::new());
        assert_eq!(kept(&SandboxFilter::default()), [1, 2]);
        let skipped = SandboxFilter::parse(None, Some("skipped")).expect("a verdict");
        assert_eq!(kept(&skipped), Vec::<u64>::new(), "no verdict yet");
        let why = crate::daemon::why::explain(&shared.views[&1]);
        assert!(
            why.starts_with("pod default/web-0 (uid u-0, sandbox c1), named by its CNI call"),
            "{why}"
        );
        assert!(why.contains("verdict: none yet"), "{why}");
        // Removed: its next intents name no pod until an ADD names it again.
        shared.removed(&named, "del", Vec::new());
        let filed = shared.record_one(intent(3, "c1"));
        assert_eq!(shared.pod_of_report(&filed), None);
    }

    #[test]
    fn evicted_views_leave_the_index() {
        let mut shared = Shared::default();
        shared.record(vec![intent(1, "c1")]);
        let reports: Vec<Report> = (2..=KEPT_VIEWS as u64 + 1)
            .map(|cookie| intent(cookie, &format!("other{cookie}")))
            .collect();
        shared.record(reports);
        assert!(!shared.views.contains_key(&1), "the oldest view went");
        assert!(
            !shared
                .by_sandbox
                .contains_key(&("c1".to_owned(), "eth0".to_owned()))
        );
        assert_eq!(shared.by_sandbox.len(), KEPT_VIEWS);
    }
}
