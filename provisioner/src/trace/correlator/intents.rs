//! The daemon's intents (what it configures in a sandbox) checked against the kernel, and the
//! drift of a confirmed one.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use crate::trace::verdict::{
    Drift, Evidence, Intent, IntentKey, IntentOrigin, IntentStatus, IntentVerdict, Report,
    TimelineEntry,
};

use super::judge::{intent_parts_missing, missing_steps};
use super::state::Progress;

struct Registered {
    intent: Intent,
    registered_at: SystemTime,
    status: Option<IntentStatus>,
    /// What was reported missing since it was confirmed.
    drifted: HashSet<String>,
}

/// Counters of intent outcomes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IntentCounts {
    pub confirmed: u64,
    pub unconfirmed: u64,
    /// Found at start lacking something.
    pub drifted: u64,
    /// Something went missing after confirmation.
    pub drifts: u64,
}

/// The intents, by the namespace they are on (every lookup is by namespace).
#[derive(Default)]
pub(super) struct Intents {
    by_cookie: HashMap<u64, Vec<Registered>>,
    cookie_of: HashMap<IntentKey, u64>,
    pub counts: IntentCounts,
}

impl Intents {
    /// Registers `intent`, replacing an earlier one for the same key.
    pub(super) fn register(&mut self, intent: Intent, now: SystemTime) {
        self.remove(&intent.key);
        self.cookie_of
            .insert(intent.key.clone(), intent.netns_cookie);
        self.by_cookie
            .entry(intent.netns_cookie)
            .or_default()
            .push(Registered {
                intent,
                registered_at: now,
                status: None,
                drifted: HashSet::new(),
            });
    }

    pub(super) fn remove(&mut self, key: &IntentKey) {
        let Some(cookie) = self.cookie_of.remove(key) else {
            return;
        };
        if let Some(on) = self.by_cookie.get_mut(&cookie) {
            on.retain(|r| r.intent.key != *key);
            if on.is_empty() {
                self.by_cookie.remove(&cookie);
            }
        }
    }

    /// Forgets every intent on namespace `cookie`; the confirmed ones report the namespace
    /// destroyed as drift.
    pub(super) fn destroyed(&mut self, cookie: u64, by: &TimelineEntry) -> Vec<Report> {
        let mut reports = Vec::new();
        for r in self.by_cookie.remove(&cookie).unwrap_or_default() {
            self.cookie_of.remove(&r.intent.key);
            if r.status == Some(IntentStatus::Confirmed) {
                self.counts.drifts += 1;
                reports.push(Report::Drift(Drift {
                    key: r.intent.key,
                    netns_cookie: cookie,
                    what: "namespace destroyed".into(),
                    by: Some(by.clone()),
                }));
            }
        }
        reports
    }

    /// The earliest time an undecided intent on `cookie` came due by `now` (the deadline of
    /// an ADD; at once for an audit, decided on the first state read).
    pub(super) fn due(
        &self,
        cookie: u64,
        now: SystemTime,
        deadline: Duration,
    ) -> Option<SystemTime> {
        self.by_cookie
            .get(&cookie)?
            .iter()
            .filter(|r| r.status.is_none())
            .map(|r| due_at(r, deadline))
            .filter(|due| *due <= now)
            .min()
    }

    /// Whether an intent names namespace `cookie`.
    pub(super) fn on(&self, cookie: u64) -> bool {
        self.by_cookie.contains_key(&cookie)
    }

    /// Cookies with an undecided intent.
    pub(super) fn undecided_cookies(&self) -> HashSet<u64> {
        self.by_cookie
            .iter()
            .filter(|(_, on)| on.iter().any(|r| r.status.is_none()))
            .map(|(cookie, _)| *cookie)
            .collect()
    }

    /// Checks the intents on `cookie` after a change: confirms those the state now shows in
    /// full; reports what went missing from confirmed ones.
    pub(super) fn check(
        &mut self,
        cookie: u64,
        progress: &Progress,
        trigger: Evidence,
        by: Option<&TimelineEntry>,
    ) -> Vec<Report> {
        let mut reports = Vec::new();
        for r in self.by_cookie.get_mut(&cookie).into_iter().flatten() {
            let complete = intent_parts_missing(&r.intent, &progress.now)
                .next()
                .is_none();
            match r.status {
                None | Some(IntentStatus::Unconfirmed | IntentStatus::Drifted) if complete => {
                    r.status = Some(IntentStatus::Confirmed);
                    r.drifted.clear();
                    self.counts.confirmed += 1;
                    reports.push(Report::Intent(IntentVerdict {
                        intent: r.intent.clone(),
                        status: IntentStatus::Confirmed,
                        missing: Vec::new(),
                        evidence: trigger,
                    }));
                }
                Some(IntentStatus::Confirmed) if !complete => {
                    for what in missing_steps(&r.intent, &progress.now) {
                        if r.drifted.insert(what.clone()) {
                            self.counts.drifts += 1;
                            reports.push(Report::Drift(Drift {
                                key: r.intent.key.clone(),
                                netns_cookie: cookie,
                                what: format!("{what} removed"),
                                by: by.cloned(),
                            }));
                        }
                    }
                }
                _ => {}
            }
        }
        reports
    }

    /// Decides the intents on `cookie` that are due (their deadline passed and the state was
    /// read after it): `unconfirmed` for an ADD, `drifted` (each missing part a drift) for an
    /// audit.
    pub(super) fn conclude(
        &mut self,
        cookie: u64,
        progress: &Progress,
        evidence: Evidence,
        read_failed: Option<&str>,
        now: SystemTime,
        deadline: Duration,
    ) -> Vec<Report> {
        let mut reports = Vec::new();
        for r in self
            .by_cookie
            .get_mut(&cookie)
            .into_iter()
            .flatten()
            .filter(|r| r.status.is_none())
        {
            if due_at(r, deadline) > now {
                continue;
            }
            let mut missing = missing_steps(&r.intent, &progress.now);
            if missing.is_empty() {
                continue;
            }
            if let Some(err) = read_failed {
                missing.push(format!("(its state could not be read: {err})"));
            }
            let status = match r.intent.origin {
                IntentOrigin::Add => IntentStatus::Unconfirmed,
                IntentOrigin::Audit => IntentStatus::Drifted,
            };
            r.status = Some(status);
            match status {
                IntentStatus::Drifted => {
                    self.counts.drifted += 1;
                    for what in &missing {
                        r.drifted.insert(what.clone());
                        reports.push(Report::Drift(Drift {
                            key: r.intent.key.clone(),
                            netns_cookie: cookie,
                            what: format!("{what} missing (found at start)"),
                            by: None,
                        }));
                    }
                }
                _ => self.counts.unconfirmed += 1,
            }
            reports.push(Report::Intent(IntentVerdict {
                intent: r.intent.clone(),
                status,
                missing,
                evidence,
            }));
        }
        reports
    }
}

fn due_at(r: &Registered, deadline: Duration) -> SystemTime {
    match r.intent.origin {
        IntentOrigin::Audit => r.registered_at,
        IntentOrigin::Add => r.registered_at + deadline,
    }
}
