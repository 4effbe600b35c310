//! Pairing rtnetlink requests with the kernel's answers (and the extack that precedes them).

use std::collections::HashMap;

/// Requests in flight and extacks waiting for their request; both bounded.
const MAX_PENDING: usize = 8192;

/// A request by (pid, fd, sequence number).
pub(super) type RequestKey = (u32, u32, u32);

/// Where a request was recorded: (netns cookie, entry id).
pub(super) type Recorded = (u64, u64);

#[derive(Default)]
pub(super) struct Requests {
    /// `None` for requests that do not matter to verdicts (their answers are dropped too).
    pending: HashMap<RequestKey, Option<Recorded>>,
    /// Extack messages per thread, waiting for the request they belong to: the kernel reports a
    /// request once it has processed it, so its extack comes first.
    extack: HashMap<u32, String>,
    /// Entries dropped because the maps were full (a flood of unanswered requests).
    pub dropped: u64,
}

impl Requests {
    pub(super) fn sent(&mut self, key: RequestKey, recorded: Option<Recorded>) {
        if self.pending.len() >= MAX_PENDING {
            self.dropped += self.pending.len() as u64;
            self.pending.clear();
        }
        self.pending.insert(key, recorded);
    }

    /// The request `key` answers: `Some(None)` for one that does not matter, `None` when it
    /// was not seen.
    pub(super) fn answered(&mut self, key: RequestKey) -> Option<Option<Recorded>> {
        self.pending.remove(&key)
    }

    pub(super) fn extack(&mut self, tid: u32, message: String) {
        if self.extack.len() >= MAX_PENDING {
            self.dropped += self.extack.len() as u64;
            self.extack.clear();
        }
        self.extack.insert(tid, message);
    }

    pub(super) fn take_extack(&mut self, tid: u32) -> Option<String> {
        self.extack.remove(&tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_finds_its_request_once() {
        let mut r = Requests::default();
        r.sent((1, 3, 7), Some((100, 0)));
        r.sent((1, 3, 8), None);
        assert_eq!(r.answered((1, 3, 7)), Some(Some((100, 0))));
        assert_eq!(r.answered((1, 3, 7)), None);
        assert_eq!(r.answered((1, 3, 8)), Some(None));
    }

    #[test]
    fn a_flood_is_bounded_and_counted() {
        let mut r = Requests::default();
        for seq in 0..=u32::try_from(MAX_PENDING).expect("small") {
            r.sent((1, 3, seq), None);
        }
        assert!(r.pending.len() <= MAX_PENDING);
        assert_eq!(r.dropped, MAX_PENDING as u64);
    }
}
