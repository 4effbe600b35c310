//! What the allocator hands out: one [`Allocation`] per [`AllocationKey`] (container id +
//! interface name), holding one [`AllocatedIp`] per range set.

use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::pod::Pod;

/// Who owns an allocation: the CNI `CNI_CONTAINERID` and `CNI_IFNAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocationKey {
    pub container_id: String,
    pub ifname: String,
}

impl AllocationKey {
    pub fn new(container_id: impl Into<String>, ifname: impl Into<String>) -> Self {
        AllocationKey {
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }
}

impl fmt::Display for AllocationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "container {} ifname {}", self.container_id, self.ifname)
    }
}

/// One address handed out from one range set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatedIp {
    /// The address with its subnet's prefix, e.g. `10.244.1.2/24`.
    pub address: IpNetwork,
    /// The gateway of the range the address came from.
    pub gateway: IpAddr,
}

/// All addresses held by one key, in range-set order, and the pod its latest ADD named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub key: AllocationKey,
    pub ips: Vec<AllocatedIp>,
    /// `None`: no ADD of this key named a pod (a runtime without Kubernetes metadata, or an
    /// allocation kept from a store format without pods, until its next ADD).
    pub pod: Option<Pod>,
}
