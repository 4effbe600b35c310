//! Giving a verdict on a namespace: judged, noted on its timeline, counted, and remembered
//! once final.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::trace::verdict::{
    Evidence, NetnsVerdict, SkipSummary, Step, TimelineEntry, Verdict, format_time,
};

use super::judge::{self, judge, sandbox_reason};
use super::state;
use super::timeline::Ns;
use super::{Correlator, MAX_JUDGED, MAX_RECHECK, MAX_SKIP_CREATORS};

impl Correlator {
    /// The verdict at `now`, or `None` for a live namespace that is not a sandbox (or when it
    /// would repeat the last one).
    pub(super) fn decide(
        &mut self,
        cookie: u64,
        progress: Option<Arc<state::Progress>>,
        now: SystemTime,
    ) -> Option<NetnsVerdict> {
        let deadline = self.config.deadline;
        let ns = self.namespaces.get_mut(&cookie)?;
        let sandbox = sandbox_reason(ns, &self.config.rules);
        if sandbox.is_none() && ns.destroyed_at.is_none() {
            return None;
        }
        let progress = progress.unwrap_or_else(|| ns.progress());
        let judgement = match &sandbox {
            None => judge::Judgement {
                verdict: Verdict::Gone,
                reason: "not a sandbox; destroyed".to_owned(),
                evidence: Evidence::Trace,
            },
            Some(_) => judge(ns, &progress, deadline),
        };
        let previous = ns.verdict;
        if previous == Some(judgement.verdict) {
            return None;
        }
        let mut reason = judgement.reason;
        push_destruction(&mut reason, ns);
        let due = ns.due(deadline);
        let revises = previous.filter(|v| v.is_alarm());
        let late_ms = revises.and(progress.networked).map(|r| late_ms(r.at, due));
        mark_judged(ns, judgement.verdict, now, deadline);
        let mut verdict = NetnsVerdict {
            pod: sandbox
                .is_some()
                .then(|| ns.pod.for_verdict(!ns.attributed_pids.is_empty())),
            netns: ns.netns,
            verdict: judgement.verdict,
            sandbox,
            creator: ns.creator.clone(),
            created_at: ns.created_at,
            destroyed_at: ns.destroyed_at,
            reason,
            evidence: judgement.evidence,
            revises,
            late_ms,
            diagnosis: None,
            timeline: ns.timeline(),
            repeat: None,
        };
        ns.at_rest();
        self.count_verdict(verdict.verdict, revises);
        if verdict.verdict == Verdict::Skipped {
            verdict.repeat = Some(self.summarise_skip(&verdict));
        }
        if !verdict.verdict.is_alarm() && !self.intents.on(cookie) {
            self.forget_judged(cookie, verdict.verdict);
        }
        Some(verdict)
    }

    fn count_verdict(&mut self, verdict: Verdict, revises: Option<Verdict>) {
        *self.metrics.verdicts.entry(verdict.as_str()).or_default() += 1;
        if let Some(old) = revises {
            *self.metrics.revised.entry(old.as_str()).or_default() += 1;
        }
    }

    /// Stops following namespace `cookie`, its final verdict remembered (within bounds).
    fn forget_judged(&mut self, cookie: u64, verdict: Verdict) {
        // Said and final: nothing more to follow (its destruction is not always seen).
        self.namespaces.remove(&cookie);
        if self.judged_order.len() >= MAX_JUDGED
            && let Some(oldest) = self.judged_order.pop_front()
        {
            self.judged.remove(&oldest);
        }
        if self.judged.insert(cookie, verdict).is_none() {
            self.judged_order.push_back(cookie);
        }
    }

    fn summarise_skip(&mut self, verdict: &NetnsVerdict) -> SkipSummary {
        let key = verdict.creator.comm.clone();
        if !self.skips.contains_key(&key) && self.skips.len() >= MAX_SKIP_CREATORS {
            let stalest = self
                .skips
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone());
            if let Some(stalest) = stalest {
                self.skips.remove(&stalest);
            }
        }
        let summary = self.skips.entry(key).or_insert_with(|| SkipSummary {
            creator_comm: verdict.creator.comm.clone(),
            creator_pid: verdict.creator.pid,
            count: 0,
            first: verdict.created_at,
            last: verdict.created_at,
        });
        summary.count += 1;
        summary.creator_pid = verdict.creator.pid;
        summary.first = summary.first.min(verdict.created_at);
        summary.last = summary.last.max(verdict.created_at);
        summary.clone()
    }
}

/// Appends to `reason` when the namespace was destroyed (how long after its creation, when
/// that was seen).
fn push_destruction(reason: &mut String, ns: &Ns) {
    let Some(destroyed) = ns.destroyed_at else {
        return;
    };
    if ns.origin_known {
        let lived = destroyed.duration_since(ns.created_at).unwrap_or_default();
        reason.push_str(&format!(
            "; destroyed {} ms after creation",
            lived.as_millis()
        ));
    } else {
        reason.push_str(&format!("; destroyed at {}", format_time(destroyed)));
    }
}

/// How long after its deadline `due` a network arrived at `networked_at`.
fn late_ms(networked_at: SystemTime, due: SystemTime) -> u64 {
    u64::try_from(
        networked_at
            .duration_since(due)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// Sets the verdict on `ns`, a recheck while it is a live alarm, and the verdict's step on its
/// timeline.
fn mark_judged(ns: &mut Ns, verdict: Verdict, now: SystemTime, deadline: Duration) {
    ns.verdict = Some(verdict);
    ns.recheck = (verdict.is_alarm() && ns.destroyed_at.is_none())
        .then(|| (now + deadline, (deadline * 2).min(MAX_RECHECK)));
    ns.push_at(
        TimelineEntry {
            at: now,
            pid: 0,
            comm: "provisioner".into(),
            step: Step::Verdict { verdict },
        },
        None,
    );
}
