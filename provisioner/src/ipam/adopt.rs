//! Adoption: addresses the kernel shows routed to a sandbox (a host veth of ours with a host
//! route to the pod address) but that the store does not hold (store file lost, network renamed,
//! a crash between the kernel setup and the durable commit) are reserved under a key named after
//! the host veth, [`AllocationKey::adopted`], so that they are never handed out while the
//! sandbox lives. The adopted allocation is released like any other once its veth is gone (DEL
//! of the sandbox the veth belongs to, GC, reconciliation).

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use redb::ReadableTable;

use super::allocation::{AllocatedIp, Allocation, AllocationKey};
use super::allocator::Allocator;
use super::error::IpamError;
use super::store::{addr_key, decode, encode};

/// Container-id prefix of an adopted allocation's key (its ifname is empty, which no CNI
/// request can carry).
pub const ADOPTED_PREFIX: &str = "adopted:";

impl AllocationKey {
    /// The key of the addresses adopted from host veth `host_link`.
    #[must_use]
    pub fn adopted(host_link: &str) -> Self {
        AllocationKey::new(format!("{ADOPTED_PREFIX}{host_link}"), "")
    }

    /// The host veth of an adopted allocation's key; `None` for a sandbox's own key.
    #[must_use]
    pub fn adopted_link(&self) -> Option<&str> {
        if self.ifname.is_empty() {
            self.container_id.strip_prefix(ADOPTED_PREFIX)
        } else {
            None
        }
    }
}

/// A host veth of ours and the pod addresses the host routes through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedOwner {
    pub host_link: String,
    pub addresses: Vec<IpAddr>,
}

/// What [`Allocator::adopt`] did.
#[derive(Debug, Default)]
pub struct AdoptReport {
    /// Allocations written (or extended) under [`AllocationKey::adopted`] keys.
    pub adopted: Vec<Allocation>,
    /// Addresses routed to a veth but reserved for another key: (veth, address, holder).
    pub held_elsewhere: Vec<(String, IpAddr, AllocationKey)>,
    /// Addresses outside every configured range: nothing to reserve, never handed out here.
    pub out_of_range: Vec<(String, IpAddr)>,
}

impl Allocator {
    /// Reserves the addresses of `owners` not reserved yet, in one durable transaction, each
    /// veth's under its adopted key. Idempotent.
    pub fn adopt(&self, owners: &[RoutedOwner]) -> Result<AdoptReport, IpamError> {
        let s = self.store();
        let mut report = AdoptReport::default();
        let txn = s.begin_write()?;
        let mut wrote = false;
        {
            let mut t = s.tables(&txn)?;
            for owner in owners {
                let key = AllocationKey::adopted(&owner.host_link);
                let k = (key.container_id.as_str(), key.ifname.as_str());
                let mut ips = match t.alloc.get(k).map_err(s.err("read allocation"))? {
                    Some(v) => {
                        decode(key.clone(), v.value())
                            .map_err(|r| s.corrupt(key.to_string(), r))?
                            .ips
                    }
                    None => Vec::new(),
                };
                let before = ips.len();
                for &ip in &owner.addresses {
                    let Some((set, range)) = self.ranges().position(ip) else {
                        report.out_of_range.push((owner.host_link.clone(), ip));
                        continue;
                    };
                    let a = addr_key(ip);
                    if let Some(holder) = t.addr.get(a).map_err(s.err("read address"))? {
                        let (cid, ifname) = holder.value();
                        if (cid, ifname) != k {
                            report.held_elsewhere.push((
                                owner.host_link.clone(),
                                ip,
                                AllocationKey::new(cid, ifname),
                            ));
                        }
                        continue;
                    }
                    let Some(r) = self
                        .ranges()
                        .sets()
                        .get(set)
                        .and_then(|rs| rs.ranges().get(range))
                    else {
                        continue;
                    };
                    let address = IpNetwork::new(ip, r.subnet().prefix())
                        .map_err(|e| s.corrupt(ip.to_string(), e.to_string()))?;
                    t.addr.insert(a, k).map_err(s.err("write address"))?;
                    ips.push(AllocatedIp {
                        address,
                        gateway: r.gateway(),
                    });
                }
                if ips.len() > before {
                    t.alloc
                        .insert(k, encode(&ips, None).as_slice())
                        .map_err(s.err("write allocation"))?;
                    wrote = true;
                    report.adopted.push(Allocation {
                        key,
                        ips,
                        pod: None,
                    });
                }
            }
        }
        if wrote {
            s.commit(txn)?;
        }
        Ok(report)
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use super::*;
    use crate::ipam::IpamConfig;

    fn open(dir: &std::path::Path) -> Allocator {
        let ranges = IpamConfig::from_json(r#"{"subnet":"10.244.1.0/28"}"#)
            .unwrap()
            .validate()
            .unwrap();
        Allocator::open(dir, "net", &ranges).unwrap().0
    }

    fn owner(link: &str, ips: &[&str]) -> RoutedOwner {
        RoutedOwner {
            host_link: link.to_owned(),
            addresses: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn adopted_addresses_are_never_handed_out_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path());
        let held = a.allocate(&AllocationKey::new("c0", "eth0")).unwrap(); // .2
        let report = a
            .adopt(&[
                owner("pvn000000000001", &["10.244.1.3", "10.244.1.2", "10.9.9.9"]),
                owner("pvn000000000002", &["10.244.1.4"]),
            ])
            .unwrap();
        assert_eq!(report.adopted.len(), 2);
        assert_eq!(report.held_elsewhere.len(), 1);
        assert_eq!(report.held_elsewhere[0].2, held.key);
        assert_eq!(report.out_of_range.len(), 1);
        // Idempotent.
        assert!(
            a.adopt(&[owner("pvn000000000002", &["10.244.1.4"])])
                .unwrap()
                .adopted
                .is_empty()
        );
        let next = a.allocate(&AllocationKey::new("c1", "eth0")).unwrap();
        assert_eq!(next.ips[0].address.ip().to_string(), "10.244.1.5");
        let key = AllocationKey::adopted("pvn000000000001");
        assert_eq!(key.adopted_link(), Some("pvn000000000001"));
        assert_eq!(AllocationKey::new("adopted:x", "eth0").adopted_link(), None);
        let released = a.release(&key).unwrap().unwrap();
        assert_eq!(released.ips[0].address.ip().to_string(), "10.244.1.3");
        assert_eq!(a.count().unwrap(), 3);
    }
}
