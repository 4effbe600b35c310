//! A wired sandbox as the CNI result of its ADD.

use crate::cni::{CniResult, Interface, IpConfig, Route};

use super::AddOutcome;

impl AddOutcome {
    /// The CNI result of this ADD. `interfaces`: the host veth, then the sandbox interface;
    /// every IP is on the sandbox one.
    #[must_use]
    pub fn cni_result(&self) -> CniResult {
        let sandbox_index = 1;
        CniResult {
            interfaces: vec![
                Interface {
                    name: self.setup.host_ifname.clone(),
                    mac: Some(self.setup.host_mac.clone()),
                    sandbox: None,
                    mtu: self.spec.mtu,
                },
                Interface {
                    name: self.setup.sandbox_ifname.clone(),
                    mac: Some(self.setup.sandbox_mac.clone()),
                    sandbox: Some(self.spec.netns.display().to_string()),
                    mtu: self.spec.mtu,
                },
            ],
            ips: self
                .allocation
                .ips
                .iter()
                .map(|ip| IpConfig {
                    address: ip.address,
                    gateway: Some(ip.gateway),
                    interface: Some(sandbox_index),
                })
                .collect(),
            routes: self
                .spec
                .routes
                .iter()
                .map(|r| Route {
                    dst: r.dst,
                    gw: r.gw,
                })
                .collect(),
            dns: Default::default(),
        }
    }
}
