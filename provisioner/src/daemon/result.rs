//! The CNI result of a provisioned sandbox.

use crate::cni::{CniResult, Interface, IpConfig, Route};
use crate::sandbox::AddOutcome;

/// `interfaces`: the host veth, then the sandbox interface; every IP is on the sandbox one.
pub fn cni_result(outcome: &AddOutcome) -> CniResult {
    let sandbox_index = 1;
    CniResult {
        interfaces: vec![
            Interface {
                name: outcome.setup.host_ifname.clone(),
                mac: Some(outcome.setup.host_mac.clone()),
                sandbox: None,
                mtu: outcome.spec.mtu,
            },
            Interface {
                name: outcome.setup.sandbox_ifname.clone(),
                mac: Some(outcome.setup.sandbox_mac.clone()),
                sandbox: Some(outcome.spec.netns.display().to_string()),
                mtu: outcome.spec.mtu,
            },
        ],
        ips: outcome
            .allocation
            .ips
            .iter()
            .map(|ip| IpConfig {
                address: ip.address,
                gateway: Some(ip.gateway),
                interface: Some(sandbox_index),
            })
            .collect(),
        routes: outcome
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
