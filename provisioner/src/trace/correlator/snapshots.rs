//! Reads of namespace states: which namespaces the correlator wants read, the requests it
//! hands out for them, and the answers (a state, or why it could not be read).

use std::path::PathBuf;
use std::time::SystemTime;

use crate::dataplane::NetnsSnapshot;
use crate::pod::{NetnsCreator, PodName};
use crate::trace::verdict::{Evidence, Report, Step, TimelineEntry};

use super::effects::Effect;
use super::state::State;
use super::{Correlator, HISTORY_GRACE};

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

impl Correlator {
    /// At most `most` of the reads of namespace states wanted, oldest first; the rest stay
    /// wanted. A read's time to answer ([`super::SNAPSHOT_WAIT`]) runs from now, when it is
    /// handed out: the caller asks for as many as it starts at once, so that reads waiting
    /// their turn in a burst are not judged unanswered.
    pub fn take_snapshot_requests(&mut self, now: SystemTime, most: usize) -> Vec<SnapshotRequest> {
        let mut requests = Vec::new();
        for (cookie, after) in std::mem::take(&mut self.wanted) {
            if requests.len() >= most {
                self.wanted.push((cookie, after));
                continue;
            }
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

    pub(super) fn want(&mut self, cookie: u64) {
        match self.wanted.iter_mut().find(|(c, _)| *c == cookie) {
            Some(wanted) => wanted.1 = None,
            None => self.wanted.push((cookie, None)),
        }
    }

    /// Asks for a read of a namespace whose history was not seen (at `now`) and whose state was
    /// not read. Its creation may still be on its way (the ring buffer is read in batches, and
    /// the reader can lag on a loaded node): the read waits until an event later than `now` was
    /// fed, or [`HISTORY_GRACE`]; when the creation arrived meanwhile, nothing is read.
    pub(super) fn want_history(&mut self, cookie: u64, now: SystemTime) {
        if self
            .namespaces
            .get(&cookie)
            .is_some_and(|ns| !ns.origin_known && ns.snapshot.answered_at.is_none())
            && !self.wanted.iter().any(|(c, _)| *c == cookie)
        {
            self.wanted.push((cookie, Some(now)));
        }
    }
}
