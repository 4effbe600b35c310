//! A node netns with a [`Dataplane`] on it, sandbox specs, and the checks that nothing of a
//! sandbox is left: shared by the dataplane tests.

use std::net::IpAddr;

use anyhow::{Result, ensure};
use ipnetwork::IpNetwork;
use provisioner::dataplane::{
    Dataplane, GRAVEYARD_IFNAME_PREFIX, HOST_IFNAME_PREFIX, PodAddress, RouteSpec, SandboxSpec,
};

use crate::Netns;

pub fn net(s: &str) -> IpNetwork {
    s.parse().expect("cidr literal")
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip literal")
}

/// `eth0` of sandbox `id` in `sandbox` with `addrs` (address, gateway), MTU 1460, and a default
/// route of the first address's family.
pub fn spec(id: &str, sandbox: &Netns, addrs: &[(&str, &str)]) -> SandboxSpec {
    let default = if addrs[0].0.contains(':') {
        "::/0"
    } else {
        "0.0.0.0/0"
    };
    SandboxSpec::new(id, sandbox.path(), "eth0")
        .with_addresses(addrs.iter().map(|(a, g)| PodAddress::new(net(a), ip(g))))
        .with_mtu(Some(1460))
        .with_routes([RouteSpec::new(net(default), None)])
}

pub fn node() -> Result<(Netns, Dataplane)> {
    let node = Netns::new("node")?;
    let dp = Dataplane::with_host_netns(node.path())?;
    Ok((node, dp))
}

/// Names of the links of a netns (`ip -o link`), without the `@peer` suffix.
pub fn links(ns: &Netns) -> Result<Vec<String>> {
    Ok(ns
        .ip(&["-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect())
}

pub fn veths(ns: &Netns) -> Result<Vec<String>> {
    Ok(links(ns)?
        .into_iter()
        .filter(|n| n.starts_with(HOST_IFNAME_PREFIX) || n.starts_with(GRAVEYARD_IFNAME_PREFIX))
        .collect())
}

/// Nothing of ours left in the node: no veth, no route (v4 or v6) naming a veth.
pub fn assert_node_clean(node: &Netns) -> Result<()> {
    ensure!(
        veths(node)?.is_empty(),
        "veth left in node: {:?}",
        veths(node)?
    );
    let r4 = node.ip(&["-4", "route", "show"])?;
    let r6 = node.ip(&["-6", "route", "show"])?;
    ensure!(
        !r4.contains(HOST_IFNAME_PREFIX) && !r6.contains(HOST_IFNAME_PREFIX),
        "route left in node: {r4}{r6}"
    );
    Ok(())
}

/// The sandbox holds only `lo` and no route.
pub fn assert_sandbox_clean(sandbox: &Netns) -> Result<()> {
    let l = links(sandbox)?;
    ensure!(l == ["lo"], "links left in sandbox: {l:?}");
    let r = sandbox.ip(&["route", "show"])?;
    ensure!(r.trim().is_empty(), "routes left in sandbox: {r}");
    Ok(())
}
