//! An allocation answered before it is durable: the caller wires the addresses while the commit
//! runs, then awaits [`Reservation::durable`] (see [`super::Allocator::reserve`]).

use std::path::{Path, PathBuf};

use tokio::sync::oneshot;

use super::{Done, Outcome, stopped_error};
use crate::ipam::allocation::Allocation;
use crate::ipam::error::IpamError;

/// An allocation answered before it is durable (see [`Allocator::reserve`]).
#[derive(Debug)]
pub struct Reservation {
    allocation: Allocation,
    new: bool,
    durable: oneshot::Receiver<Result<(), IpamError>>,
    store: PathBuf,
}

impl Reservation {
    /// A reservation that is already durable (an existing allocation; fakes in tests).
    pub fn durable_already(allocation: Allocation, new: bool, store: &Path) -> Self {
        let (tx, durable) = oneshot::channel();
        // The receiver is in hand: this cannot fail.
        let _ = tx.send(Ok(()));
        Self {
            allocation,
            new,
            durable,
            store: store.to_path_buf(),
        }
    }

    /// A reservation whose durability is reported later through the returned sender (fakes of
    /// the store in tests).
    pub fn pending(
        allocation: Allocation,
        new: bool,
        store: &Path,
    ) -> (Self, oneshot::Sender<Result<(), IpamError>>) {
        let (tx, durable) = oneshot::channel();
        (
            Self {
                allocation,
                new,
                durable,
                store: store.to_path_buf(),
            },
            tx,
        )
    }

    /// The reservation the committer's staged answer (outcome, written by this call) makes.
    pub(super) fn staged(
        (outcome, new): (Outcome, bool),
        durable: oneshot::Receiver<Result<(), IpamError>>,
        store: PathBuf,
    ) -> Result<Self, IpamError> {
        match outcome? {
            // An existing allocation may come from an earlier operation of the same batch:
            // waiting for the batch's commit covers that case too.
            Done::Allocated(allocation) => Ok(Self {
                allocation,
                new,
                durable,
                store,
            }),
            Done::Released(_) => Err(stopped_error(&store, "answered reserve with a release")),
        }
    }

    /// The addresses, usable at once (nothing else is handed them).
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// Whether this call created the allocation (`false`: the key already had it).
    pub fn is_new(&self) -> bool {
        self.new
    }

    /// Waits until the allocation is on disk. An error means it never will be: undo what was
    /// done with the addresses.
    pub async fn durable(self) -> Result<Allocation, IpamError> {
        let store = self.store;
        let answer = self
            .durable
            .await
            .map_err(|_| stopped_error(&store, "committer stopped before committing"))?;
        answer.map(|()| self.allocation)
    }

    /// [`Self::durable`] for synchronous callers (not from inside an async runtime).
    pub fn wait_durable(self) -> Result<Allocation, IpamError> {
        let store = self.store;
        let answer = self
            .durable
            .blocking_recv()
            .map_err(|_| stopped_error(&store, "committer stopped before committing"))?;
        answer.map(|()| self.allocation)
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use std::sync::Arc;

    use super::super::tests::{V4_28, key, open};
    use crate::ipam::error::IpamError;

    #[test]
    fn reserve_answers_before_durable_and_nothing_else_gets_the_address() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let r1 = a.reserve(&key(1), None).unwrap();
        assert!(r1.is_new());
        let first = r1.allocation().clone();
        // Before anyone awaited durability, the next callers get other addresses.
        let second = a.allocate(&key(2)).unwrap();
        let r3 = a.reserve(&key(3), None).unwrap();
        let ips: std::collections::HashSet<_> = [&first, &second, r3.allocation()]
            .iter()
            .map(|al| al.ips[0].address.ip())
            .collect();
        assert_eq!(ips.len(), 3);
        assert_eq!(r1.wait_durable().unwrap(), first);
        r3.wait_durable().unwrap();
        // Durable: a fresh allocator on the same file has them.
        drop(a);
        let a = open(dir.path(), V4_28);
        assert_eq!(a.get(&key(1)).unwrap(), Some(first));
        assert_eq!(a.count().unwrap(), 3);
    }

    #[tokio::test]
    async fn queued_reserve_and_release_answer_like_the_blocking_ones() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let held = a.allocate(&key(1)).unwrap();
        // Queued before anything is awaited: both are answered, with different addresses.
        let (r2, r3) = tokio::join!(
            a.reserve_queued(&key(2), None),
            a.reserve_queued(&key(3), None)
        );
        let (r2, r3) = (r2.unwrap(), r3.unwrap());
        assert!(r2.is_new() && r3.is_new());
        assert_ne!(r2.allocation().ips, r3.allocation().ips);
        assert_ne!(r2.allocation().ips, held.ips);
        let second = r2.durable().await.unwrap();
        r3.durable().await.unwrap();
        // An existing key comes back as it is, not new.
        let again = a.reserve_queued(&key(1), None).await.unwrap();
        assert!(!again.is_new());
        assert_eq!(again.durable().await.unwrap(), held);
        // Release: the allocation released; an unknown key is nothing, and writes nothing.
        assert_eq!(a.release_holding(&key(2)).await.unwrap(), Some(second));
        assert_eq!(a.release_holding(&key(9)).await.unwrap(), None);
        a.end_hold(&key(2));
        assert_eq!(a.get(&key(2)).unwrap(), None);
        drop(a);
        let a = open(dir.path(), V4_28);
        assert_eq!(a.count().unwrap(), 2, "key 1 and key 3, durable");
        assert_eq!(a.get(&key(1)).unwrap(), Some(held));
    }

    #[test]
    fn reserve_of_an_existing_key_is_not_new_and_already_durable() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let held = a.allocate(&key(1)).unwrap();
        let again = a.reserve(&key(1), None).unwrap();
        assert!(!again.is_new());
        assert_eq!(again.allocation(), &held);
        assert_eq!(again.wait_durable().unwrap(), held);
        assert_eq!(a.count().unwrap(), 1);
    }

    #[test]
    fn reserve_on_exhaustion_fails_and_reserves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        for i in 0..13 {
            a.allocate(&key(i)).unwrap();
        }
        assert!(matches!(
            a.reserve(&key(99), None),
            Err(IpamError::Exhausted { .. })
        ));
        assert_eq!(a.count().unwrap(), 13);
    }

    #[tokio::test]
    async fn reserve_durability_can_be_awaited() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(open(dir.path(), V4_28));
        let reserved = {
            let a = Arc::clone(&a);
            tokio::task::spawn_blocking(move || a.reserve(&key(1), None))
                .await
                .unwrap()
                .unwrap()
        };
        let want = reserved.allocation().clone();
        assert_eq!(reserved.durable().await.unwrap(), want);
        assert_eq!(a.get(&key(1)).unwrap(), Some(want));
    }
}
