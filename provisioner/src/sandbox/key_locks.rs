//! Serialises operations on the same (container id, ifname); others run in parallel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

type Key = (String, String);

#[derive(Default)]
pub struct KeyLocks {
    locks: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds one key's lock; the map entry goes away with its last holder.
pub struct KeyGuard<'a> {
    owner: &'a KeyLocks,
    key: Key,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyLocks {
    pub async fn lock(&self, container_id: &str, ifname: &str) -> KeyGuard<'_> {
        let key = (container_id.to_owned(), ifname.to_owned());
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(locks.entry(key.clone()).or_default())
        };
        let guard = lock.lock_owned().await;
        KeyGuard {
            owner: self,
            key,
            guard: Some(guard),
        }
    }

    /// The key's lock if nobody holds or waits for it; `None` while an operation is in flight.
    pub fn try_lock(&self, container_id: &str, ifname: &str) -> Option<KeyGuard<'_>> {
        let key = (container_id.to_owned(), ifname.to_owned());
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(locks.entry(key.clone()).or_default())
        };
        let guard = lock.try_lock_owned().ok();
        // Dropping a guard-less KeyGuard removes the map entry again when it is unused.
        let key_guard = KeyGuard {
            owner: self,
            key,
            guard,
        };
        key_guard.guard.is_some().then_some(key_guard)
    }

    /// Every key held or waited for now.
    pub fn held(&self) -> Vec<(String, String)> {
        self.locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self
            .owner
            .locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Only the map holds it now: nobody waits for this key.
        if locks
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn same_key_is_serialised_and_entries_are_dropped() {
        let locks = Arc::new(KeyLocks::default());
        let inside = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (locks, inside) = (Arc::clone(&locks), Arc::clone(&inside));
            tasks.push(tokio::spawn(async move {
                let _guard = locks.lock("c1", "eth0").await;
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn try_lock_fails_only_while_held() {
        let locks = KeyLocks::default();
        let held = locks.lock("c1", "eth0").await;
        assert!(locks.try_lock("c1", "eth0").is_none());
        assert!(locks.try_lock("c2", "eth0").is_some());
        drop(held);
        assert!(locks.try_lock("c1", "eth0").is_some());
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn different_keys_do_not_wait_for_each_other() {
        let locks = KeyLocks::default();
        let _a = locks.lock("c1", "eth0").await;
        let b = tokio::time::timeout(Duration::from_millis(100), locks.lock("c2", "eth0")).await;
        assert!(b.is_ok());
    }
}
