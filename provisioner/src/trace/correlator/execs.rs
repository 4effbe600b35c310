//! Recent execs, to show which binaries led to a process touching a namespace.

use std::collections::VecDeque;
use std::time::SystemTime;

const MAX_RECENT_EXECS: usize = 512;

#[derive(Clone, Debug)]
pub(super) struct RecentExec {
    pub at: SystemTime,
    pub pid: u32,
    pub parent_pid: u32,
    pub comm: String,
    pub filename: String,
}

#[derive(Default)]
pub(super) struct RecentExecs {
    ring: VecDeque<RecentExec>,
}

impl RecentExecs {
    pub(super) fn push(&mut self, exec: RecentExec) {
        if self.ring.len() >= MAX_RECENT_EXECS {
            self.ring.pop_front();
        }
        self.ring.push_back(exec);
    }

    /// The binaries executed since `since`.
    pub(super) fn since(&self, since: SystemTime) -> Vec<String> {
        self.ring
            .iter()
            .filter(|e| e.at >= since)
            .map(|e| e.filename.clone())
            .collect()
    }

    /// The execs of `pid` and of its children.
    pub(super) fn leading_to(&self, pid: u32) -> impl Iterator<Item = &RecentExec> {
        self.ring
            .iter()
            .filter(move |e| e.pid == pid || e.parent_pid == pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(pid: u32, parent_pid: u32) -> RecentExec {
        RecentExec {
            at: SystemTime::UNIX_EPOCH,
            pid,
            parent_pid,
            comm: "x".into(),
            filename: format!("/bin/{pid}"),
        }
    }

    #[test]
    fn execs_of_a_process_and_its_children_bounded() {
        let mut r = RecentExecs::default();
        r.push(exec(10, 1));
        r.push(exec(11, 10));
        r.push(exec(12, 2));
        let found: Vec<u32> = r.leading_to(10).map(|e| e.pid).collect();
        assert_eq!(found, [10, 11]);
        for i in 0..2 * MAX_RECENT_EXECS {
            r.push(exec(100 + u32::try_from(i).expect("small"), 1));
        }
        assert_eq!(r.ring.len(), MAX_RECENT_EXECS);
        assert_eq!(r.leading_to(10).count(), 0);
    }
}
