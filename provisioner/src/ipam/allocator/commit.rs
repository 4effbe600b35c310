//! Group commit: one committer thread per allocator applies the queued writes in batches, one
//! redb write transaction each.
//!
//! `allocate` and `release` queue an operation and block until the committer answers. The
//! committer takes everything queued (up to [`MAX_BATCH`]), applies the operations in queue
//! order inside one redb write transaction, commits it once with `Durability::Immediate` (one
//! fsync) and only then answers every caller, so an answer is always durable. While a batch is
//! being fsynced the next one queues up, so under load n concurrent callers cost about one fsync
//! each round instead of n serialised ones; a lone caller pays one transaction of its own.
//!
//! Each operation is split into a read-only *plan* (choose every address, decode records, detect
//! exhaustion) and an *apply* that only writes what the plan chose. A plan that fails (exhaustion,
//! a corrupt record) writes nothing but harmless fixes, so it fails that operation alone and the
//! rest of the batch commits. Operations later in a batch read the writes of earlier ones, so a
//! batch behaves exactly like its operations run one after another: two operations on one key see
//! each other, and an address released in the batch goes to the back of the free list like any
//! other (the cursor is preferred, then the oldest release). If a write or the commit itself
//! fails, the transaction is dropped (nothing of it is durable) and its operations are run again
//! one transaction each, so each caller gets its own answer.

use std::path::Path;
use std::sync::{PoisonError, mpsc};

use tokio::sync::oneshot;

use super::plan::Wrote;
use super::{Core, Done, MAX_BATCH, Outcome, StoreWrite, broken_error, core_error};
use crate::ipam::error::IpamError;

pub(super) struct Request {
    pub(super) op: StoreWrite,
    pub(super) reply: Reply,
}

/// How the committer answers one request.
pub(super) enum Reply {
    /// Once, after the commit (`allocate`, `release`).
    Durable(Answer<Outcome>),
    /// The outcome as soon as the batch is applied, then whether its commit made it durable
    /// (`reserve`).
    Staged {
        /// The outcome, and whether this operation wrote it (a new allocation).
        applied: Answer<(Outcome, bool)>,
        durable: oneshot::Sender<Result<(), IpamError>>,
    },
}

/// Where an answer goes: to a thread blocked on it, or to a task awaiting it (no thread in
/// between: the `*_queued` calls).
pub(super) enum Answer<T> {
    Blocked(mpsc::SyncSender<T>),
    Awaited(oneshot::Sender<T>),
}

impl<T> Answer<T> {
    /// Sends `value`; a caller that went away (a cancelled task) needs no answer.
    fn send(self, value: T) {
        match self {
            Answer::Blocked(tx) => {
                let _ = tx.send(value);
            }
            Answer::Awaited(tx) => {
                let _ = tx.send(value);
            }
        }
    }
}

impl Reply {
    /// Answers with `reason` (the allocator refuses writes).
    fn refuse(self, path: &Path, reason: &str) {
        match self {
            Reply::Durable(reply) => reply.send(Err(broken_error(path, reason))),
            Reply::Staged { applied, .. } => applied.send((Err(broken_error(path, reason)), false)),
        }
    }
}

impl Core {
    /// After a failed commit (redb refuses every later write until the file is reopened):
    /// refuses writes from now on; the reason, which names the store and the OS error.
    fn mark_broken(&self, e: &IpamError) -> String {
        let reason = format!(
            "a commit failed ({e}); every write is refused until the daemon can reopen the store"
        );
        let mut broken = self.broken.lock().unwrap_or_else(PoisonError::into_inner);
        if broken.is_none() {
            tracing::error!(network = %self.network, store = %self.store.path().display(), error = %e,
                "ipam commit failed: refusing writes until the store is reopened");
            *broken = Some(reason.clone());
        }
        reason
    }

    /// The committer: one batch of queued operations per transaction until the queue is closed
    /// and empty.
    pub(super) fn commit_loop(&self, queue: &mpsc::Receiver<Request>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Ok(first) = queue.recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            if let Some(reason) = self.broken() {
                for request in batch.drain(..) {
                    request.reply.refuse(self.store.path(), &reason);
                }
            } else if batch.iter().all(|r| matches!(r.reply, Reply::Durable(_))) {
                let (ops, replies): (Vec<StoreWrite>, Vec<_>) =
                    batch.drain(..).map(|r| (r.op, r.reply)).unzip();
                for (reply, outcome) in replies.into_iter().zip(self.run(&ops)) {
                    if let Reply::Durable(reply) = reply {
                        reply.send(outcome);
                    }
                }
            } else {
                self.run_staged(std::mem::take(&mut batch));
            }
        }
    }

    /// A batch with reservations: applied, reservations answered, then committed. If applying
    /// fails nothing was answered and every request runs alone; if the commit fails, the
    /// reservations learn it, the allocator refuses every later write, and so do the other
    /// requests of the batch.
    fn run_staged(&self, batch: Vec<Request>) {
        let ops: Vec<StoreWrite> = batch.iter().map(|r| r.op.clone()).collect();
        let (txn, outcomes, wrote) = match self.apply(&ops) {
            Ok(applied) => applied,
            Err(e) => {
                tracing::warn!(network = %self.network, error = %e, ops = ops.len(),
                    "ipam batch failed; running its operations one by one");
                for request in batch {
                    self.run_staged_alone(request);
                }
                return;
            }
        };
        let mut waiting = Vec::new();
        let mut retry = Vec::new();
        let dirty = wrote.iter().any(|w| w.any());
        for ((request, outcome), wrote) in batch.into_iter().zip(outcomes).zip(wrote) {
            match request.reply {
                Reply::Staged { applied, durable } => {
                    let new = wrote == Wrote::Created && matches!(outcome, Ok(Done::Allocated(_)));
                    applied.send((outcome, new));
                    waiting.push(durable);
                }
                Reply::Durable(reply) => retry.push((request.op, reply, outcome)),
            }
        }
        let committed = if dirty {
            self.commit_staged(txn)
        } else {
            Ok(())
        };
        match committed {
            Ok(()) => {
                for durable in waiting {
                    let _ = durable.send(Ok(()));
                }
                for (_, reply, outcome) in retry {
                    reply.send(outcome);
                }
            }
            Err(e) => {
                // The operations of this commit fail with it; later ones are refused.
                let reason = self.mark_broken(&e);
                let failed = || {
                    core_error(
                        self.store.path(),
                        "commit",
                        std::io::Error::other(reason.clone()),
                    )
                };
                for durable in waiting {
                    let _ = durable.send(Err(failed()));
                }
                for (_, reply, _) in retry {
                    reply.send(Err(failed()));
                }
            }
        }
    }

    fn commit_staged(&self, txn: redb::WriteTransaction) -> Result<(), IpamError> {
        #[cfg(test)]
        if self
            .fail_next_staged_commit
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            drop(txn);
            return Err(self.stopped("injected commit failure"));
        }
        crate::failpoint::pause("commit.slow");
        if crate::failpoint::fails("commit.fail") {
            drop(txn);
            return Err(self.stopped("the durable commit failed (failpoint commit.fail)"));
        }
        self.store.commit(txn)
    }

    /// One request in a transaction of its own, answered in its own stages.
    fn run_staged_alone(&self, request: Request) {
        match request.reply {
            Reply::Durable(reply) => {
                let outcome = self.run(std::slice::from_ref(&request.op)).pop();
                reply.send(
                    outcome.unwrap_or_else(|| Err(self.stopped("no outcome for an operation"))),
                );
            }
            staged @ Reply::Staged { .. } => self.run_staged(vec![Request {
                op: request.op,
                reply: staged,
            }]),
        }
    }

    /// Runs `ops` in one transaction, or one transaction each if that fails. One outcome per op.
    pub(super) fn run(&self, ops: &[StoreWrite]) -> Vec<Outcome> {
        match self.run_in_one(ops) {
            Ok(outcomes) => outcomes,
            Err(e) if ops.len() == 1 => vec![Err(e)],
            Err(e) => {
                tracing::warn!(network = %self.network, error = %e, ops = ops.len(),
                    "ipam group commit failed; retrying its operations one by one");
                ops.iter()
                    .map(|op| match self.run_in_one(std::slice::from_ref(op)) {
                        Ok(outcomes) => outcomes
                            .into_iter()
                            .next()
                            .unwrap_or_else(|| Err(self.stopped("no outcome for an operation"))),
                        Err(e) => Err(e),
                    })
                    .collect()
            }
        }
    }

    /// Applies `ops` in order in one write transaction and commits it durably if anything was
    /// written. `Err` means the transaction as a whole failed and none of it is durable.
    fn run_in_one(&self, ops: &[StoreWrite]) -> Result<Vec<Outcome>, IpamError> {
        if let Some(reason) = self.broken() {
            return Err(broken_error(self.store.path(), &reason));
        }
        let (txn, outcomes, wrote) = self.apply(ops)?;
        if wrote.iter().any(|w| w.any()) {
            self.store.commit(txn).inspect_err(|e| {
                self.mark_broken(e);
            })?;
        }
        // Else dropping `txn` aborts it: every answer came from already committed data.
        Ok(outcomes)
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use super::super::tests::{V4_28, ip, key, open};
    use crate::ipam::allocation::AllocationKey;
    use crate::ipam::allocator::{Done, StoreWrite};
    use crate::ipam::error::IpamError;

    #[test]
    fn same_key_twice_in_a_batch_is_one_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let out = a.run_batch(&[
            StoreWrite::Allocate(key(1), None),
            StoreWrite::Allocate(key(1), None),
            StoreWrite::Allocate(key(2), None),
        ]);
        assert_eq!(ip(&out[0]), "10.244.1.2");
        assert_eq!(ip(&out[1]), "10.244.1.2");
        assert_eq!(ip(&out[2]), "10.244.1.3");
        assert_eq!(a.count().unwrap(), 2);
    }

    #[test]
    fn allocate_release_allocate_one_key_in_a_batch_is_serial() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let out = a.run_batch(&[
            StoreWrite::Release(key(1)),
            StoreWrite::Allocate(key(1), None),
            StoreWrite::Release(key(1)),
            StoreWrite::Allocate(key(1), None),
            StoreWrite::Release(key(2)),
        ]);
        assert!(matches!(out[0], Ok(Done::Released(None))), "{:?}", out[0]);
        assert_eq!(ip(&out[1]), "10.244.1.2");
        match &out[2] {
            Ok(Done::Released(Some(r))) => {
                assert_eq!(r.ips[0].address.ip().to_string(), "10.244.1.2")
            }
            other => panic!("{other:?}"),
        }
        // The released .2 went to the free list; the cursor still has fresh addresses.
        assert_eq!(ip(&out[3]), "10.244.1.3");
        assert!(matches!(out[4], Ok(Done::Released(None))));
        assert_eq!(
            a.get(&key(1)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.3"
        );
        assert_eq!(a.count().unwrap(), 1);
    }

    #[test]
    fn exhaustion_of_one_op_leaves_the_others_committed() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        for i in 0..12 {
            a.allocate(&key(i)).unwrap();
        }
        let out = a.run_batch(&[
            StoreWrite::Allocate(key(20), None),
            StoreWrite::Allocate(key(21), None),
            StoreWrite::Release(key(3)),
            StoreWrite::Allocate(key(21), None),
            StoreWrite::Allocate(key(22), None),
        ]);
        assert_eq!(ip(&out[0]), "10.244.1.14");
        assert!(
            matches!(out[1], Err(IpamError::Exhausted { .. })),
            "{:?}",
            out[1]
        );
        assert!(matches!(out[2], Ok(Done::Released(Some(_)))));
        assert_eq!(
            ip(&out[3]),
            "10.244.1.5",
            "the address released earlier in the batch"
        );
        assert!(
            matches!(out[4], Err(IpamError::Exhausted { .. })),
            "{:?}",
            out[4]
        );
        drop(a);
        // Durable: a fresh allocator on the same file sees the batch.
        let a = open(dir.path(), V4_28);
        assert_eq!(a.count().unwrap(), 13);
        assert_eq!(
            a.get(&key(20)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.14"
        );
        assert_eq!(
            a.get(&key(21)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.5"
        );
        assert!(a.get(&key(3)).unwrap().is_none());
        assert!(a.get(&key(22)).unwrap().is_none());
    }

    #[test]
    fn a_corrupt_record_fails_only_its_own_op() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        {
            let s = &a.core.store;
            let txn = s.begin_write().unwrap();
            {
                let mut t = s.tables(&txn).unwrap();
                t.alloc
                    .insert(("bad", "eth0"), b"not json".as_slice())
                    .unwrap();
            }
            s.commit(txn).unwrap();
        }
        let bad = AllocationKey::new("bad", "eth0");
        let out = a.run_batch(&[
            StoreWrite::Release(bad.clone()),
            StoreWrite::Allocate(key(1), None),
            StoreWrite::Allocate(bad, None),
        ]);
        assert!(
            matches!(out[0], Err(IpamError::Corrupt { .. })),
            "{:?}",
            out[0]
        );
        assert_eq!(ip(&out[1]), "10.244.1.2");
        assert!(
            matches!(out[2], Err(IpamError::Corrupt { .. })),
            "{:?}",
            out[2]
        );
        assert_eq!(
            a.get(&key(1)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.2"
        );
    }

    #[test]
    fn a_failed_commit_fails_the_reservation_and_refuses_later_writes() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        a.allocate(&key(0)).unwrap();
        a.core
            .fail_next_staged_commit
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let r = a.reserve(&key(1), None).unwrap();
        let err = r.wait_durable().unwrap_err();
        assert!(err.to_string().contains("injected commit failure"), "{err}");
        // Not on disk, and no later write may hand its address out again.
        assert!(a.get(&key(1)).unwrap().is_none());
        let why = a.unwritable().expect("unwritable after a failed commit");
        assert!(why.contains("injected commit failure"), "{why}");
        assert!(why.contains(&a.path().display().to_string()), "{why}");
        let refused = a.allocate(&key(2)).unwrap_err();
        assert!(
            refused.to_string().contains("reopen the store"),
            "{refused}"
        );
        assert!(a.release(&key(0)).is_err());
        // Reads still work; a reopened allocator works again.
        assert_eq!(a.count().unwrap(), 1);
        drop(a);
        let a = open(dir.path(), V4_28);
        assert!(a.unwritable().is_none());
        a.allocate(&key(2)).unwrap();
    }
}
