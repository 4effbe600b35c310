//! What the host netns shows of our sandboxes, read from the kernel alone: every host veth of
//! ours ([`is_host_ifname`]) with the pod addresses the host routes through it (host routes, /32
//! or /128, without gateway, through the veth), and the retired links not deleted yet (see
//! [`super::naming::GRAVEYARD_GROUP`]). Two dumps (links, routes), whatever the number of
//! sandboxes.

use std::collections::HashMap;
use std::net::IpAddr;

use super::error::DataplaneError;
use super::naming::{is_graveyard_ifname, is_host_ifname};
use super::{Dataplane, link, route};

/// A host veth of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVeth {
    pub name: String,
    pub index: u32,
    /// Pod addresses routed through it (host routes), sorted.
    pub routed: Vec<IpAddr>,
}

/// Our links in the host netns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub veths: Vec<HostVeth>,
    /// Retired links (in the graveyard group, or named `pvx*`) waiting for deletion.
    pub retired: Vec<String>,
}

impl Inventory {
    pub fn veth(&self, name: &str) -> Option<&HostVeth> {
        self.veths.iter().find(|v| v.name == name)
    }
}

impl Dataplane {
    /// Lists our host veths with the pod addresses routed through each, and retired links.
    pub async fn inventory(&self) -> Result<Inventory, DataplaneError> {
        let host = self.host().await?;
        let mut inventory = Inventory::default();
        let mut by_index: HashMap<u32, usize> = HashMap::new();
        for l in link::all(host).await? {
            if l.retired || is_graveyard_ifname(&l.name) {
                inventory.retired.push(l.name);
            } else if is_host_ifname(&l.name) {
                by_index.insert(l.index, inventory.veths.len());
                inventory.veths.push(HostVeth {
                    name: l.name,
                    index: l.index,
                    routed: Vec::new(),
                });
            }
        }
        if by_index.is_empty() {
            return Ok(inventory);
        }
        for r in route::list_main(host).await? {
            let host_route =
                r.gw.is_none() && r.dst.prefix() == if r.dst.is_ipv4() { 32 } else { 128 };
            if let (true, Some(at)) = (host_route, r.oif.and_then(|o| by_index.get(&o)))
                && let Some(veth) = inventory.veths.get_mut(*at)
            {
                veth.routed.push(r.dst.ip());
            }
        }
        for veth in &mut inventory.veths {
            veth.routed.sort();
            veth.routed.dedup();
        }
        Ok(inventory)
    }
}
