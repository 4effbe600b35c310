//! Releasing while the kernel withdraws: a DEL's durable release runs at the same time as its
//! teardown, so that the commit's fsync overlaps the kernel work instead of following it.
//!
//! The address must not reach another sandbox while the teardown may still route it, so
//! [`Allocator::release_holding`] releases durably and *holds* the freed addresses: no
//! allocation picks a held address (neither from a cursor nor from the free list) until
//! [`Allocator::end_hold`]. If the teardown fails, [`Allocator::reinstate`] writes the released
//! allocation back under its key, as if the DEL had never released it, and the runtime's retry
//! finishes the job.
//!
//! A hold is placed when the committer applies the release, and stays if that transaction is
//! then dropped (the store still reserves the addresses: holding them changes nothing until
//! the hold ends). Holds live in memory only. A crash after the durable release and before
//! the teardown ends leaves a host veth of ours routing addresses no allocation owns;
//! reconciliation at start adopts them (nothing hands them out while the veth lives) and the
//! runtime's retried DEL removes the veth and releases them.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use redb::ReadableTable;

use super::allocation::{Allocation, AllocationKey};
use super::allocator::Allocator;
use super::error::IpamError;
use super::store::{AddrT, addr_key, encode};

/// Addresses released but not to be handed out yet, with the key that released them.
#[derive(Debug, Default)]
pub(crate) struct HeldAddresses {
    held: Mutex<HashMap<AddrT, AllocationKey>>,
}

impl HeldAddresses {
    pub(crate) fn hold(&self, key: &AllocationKey, addresses: &[AddrT]) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        for a in addresses {
            held.insert(*a, key.clone());
        }
    }

    pub(crate) fn is_held(&self, address: AddrT) -> bool {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&address)
    }

    fn end(&self, key: &AllocationKey) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, holder| holder != key);
    }
}

impl Allocator {
    /// Ends the hold on what [`Self::release_holding`] released for `key`: the addresses may
    /// be handed out again. Call it once nothing routes them any more.
    pub fn end_hold(&self, key: &AllocationKey) {
        self.held().end(key);
    }

    /// Writes `allocation` back under its key, durably: the undo of a release whose teardown
    /// failed, as if it had never run. One of its addresses that another key reserves is left
    /// alone, as the release left it (it was not this key's). The free-list entries the release
    /// made stay: reserved again, their addresses are dropped from the list by the next
    /// allocation that meets them, as every entry whose address is no longer free is.
    pub fn reinstate(&self, allocation: &Allocation) -> Result<(), IpamError> {
        let s = self.store();
        let key = &allocation.key;
        let k = (key.container_id.as_str(), key.ifname.as_str());
        let txn = s.begin_write()?;
        {
            let mut t = s.tables(&txn)?;
            for ip in &allocation.ips {
                let ip = ip.address.ip();
                let a = addr_key(ip);
                if let Some(holder) = t.addr.get(a).map_err(s.err("read address"))? {
                    let (cid, ifname) = holder.value();
                    if (cid, ifname) != k {
                        tracing::warn!(network = %self.network(), %key, %ip, holder = %AllocationKey::new(cid, ifname),
                            "reinstating an allocation: address reserved for another key; left alone");
                        continue;
                    }
                }
                t.addr.insert(a, k).map_err(s.err("write address"))?;
            }
            t.alloc
                .insert(
                    k,
                    encode(&allocation.ips, allocation.pod.as_ref()).as_slice(),
                )
                .map_err(s.err("write allocation"))?;
        }
        s.commit(txn)
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use futures::executor::block_on;

    use super::*;
    use crate::ipam::allocator::tests::{key, open};

    fn ip_of(a: &Allocation) -> String {
        a.ips[0].address.ip().to_string()
    }

    /// .2 to .6: five addresses.
    const SMALL: &str = r#"{"subnet":"10.244.1.0/29"}"#;

    #[test]
    fn a_held_address_is_handed_out_only_after_the_hold_ends() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), SMALL);
        for i in 0..5 {
            a.allocate(&key(i)).unwrap();
        }
        let released = block_on(a.release_holding(&key(0))).unwrap().unwrap();
        assert_eq!(ip_of(&released), "10.244.1.2");
        assert!(a.get(&key(0)).unwrap().is_none());
        let err = a.allocate(&key(5)).unwrap_err();
        assert!(matches!(err, IpamError::Exhausted { .. }), "{err}");
        a.end_hold(&key(0));
        assert_eq!(ip_of(&a.allocate(&key(5)).unwrap()), "10.244.1.2");
        // The release was durable.
        drop(a);
        let a = open(dir.path(), SMALL);
        assert!(a.get(&key(0)).unwrap().is_none());
        assert_eq!(a.count().unwrap(), 5);
    }

    #[test]
    fn a_held_address_above_the_cursor_is_passed_and_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), SMALL);
        assert_eq!(ip_of(&a.allocate(&key(0)).unwrap()), "10.244.1.2");
        drop(a);
        // Another range config: the cursors start afresh, below c0's address.
        let a = open(
            dir.path(),
            r#"{"subnet":"10.244.1.0/29","rangeStart":"10.244.1.2","rangeEnd":"10.244.1.5"}"#,
        );
        block_on(a.release_holding(&key(0))).unwrap().unwrap();
        assert_eq!(ip_of(&a.allocate(&key(1)).unwrap()), "10.244.1.3");
        a.end_hold(&key(0));
        let rest: Vec<String> = (2..5)
            .map(|i| ip_of(&a.allocate(&key(i)).unwrap()))
            .collect();
        assert_eq!(rest, ["10.244.1.4", "10.244.1.5", "10.244.1.2"]);
    }

    #[test]
    fn reinstate_undoes_a_held_release_and_leaves_another_keys_address_alone() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), SMALL);
        let c0 = a.allocate(&key(0)).unwrap();
        let released = block_on(a.release_holding(&key(0))).unwrap().unwrap();
        assert_eq!(released, c0);
        a.reinstate(&released).unwrap();
        a.end_hold(&key(0));
        assert_eq!(a.get(&key(0)).unwrap(), Some(c0.clone()));
        // Its free-list entry is not handed out: the next ones come from the cursor.
        let others: Vec<String> = (1..5)
            .map(|i| ip_of(&a.allocate(&key(i)).unwrap()))
            .collect();
        assert_eq!(
            others,
            ["10.244.1.3", "10.244.1.4", "10.244.1.5", "10.244.1.6"]
        );
        assert!(matches!(
            a.allocate(&key(5)),
            Err(IpamError::Exhausted { .. })
        ));

        // A record listing an address another key holds: that one is left alone.
        a.release(&key(0)).unwrap();
        assert_eq!(ip_of(&a.allocate(&key(5)).unwrap()), "10.244.1.2");
        a.reinstate(&c0).unwrap();
        assert_eq!(a.get(&key(0)).unwrap(), Some(c0));
        a.release(&key(0)).unwrap();
        assert_eq!(ip_of(&a.get(&key(5)).unwrap().unwrap()), "10.244.1.2");
        assert!(matches!(
            a.allocate(&key(6)),
            Err(IpamError::Exhausted { .. })
        ));
    }
}
