//! Looking at what a runtime's pod namespace and the node namespace hold, with `ip`, from a
//! thread that entered the namespace (works for pins under /run/netns and `/proc/<pid>/ns/net`).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::{Netns, in_netns, run, wait_until};

/// `ip <args>` run inside the namespace at `netns`.
pub fn ip_in(netns: &Path, args: &[&str]) -> Result<String> {
    in_netns(netns, || run("ip", args))?
}

/// Asserts that `netns` has `eth0` up holding `address` and a default route.
pub fn check_pod_network(netns: &Path, address: &str) -> Result<()> {
    let addrs = ip_in(netns, &["-o", "addr", "show", "dev", "eth0"])?;
    if !addrs.contains(&format!(" {address}/")) {
        bail!(
            "eth0 in {} does not hold {address}: {addrs}",
            netns.display()
        );
    }
    let link = ip_in(netns, &["-o", "link", "show", "dev", "eth0"])?;
    if !link.contains(",UP") {
        bail!("eth0 in {} is not up: {link}", netns.display());
    }
    let family = if address.contains(':') { "-6" } else { "-4" };
    let routes = ip_in(netns, &[family, "route", "show", "default"])?;
    if !routes.contains("default via") || !routes.contains("dev eth0") {
        bail!(
            "no default route via eth0 in {}: {routes:?}",
            netns.display()
        );
    }
    Ok(())
}

/// The sysctls the daemon turns on in the node namespace for dual-stack pods.
pub const FORWARDING_SYSCTLS: [&str; 2] = [
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/net/ipv6/conf/all/forwarding",
];

/// The [`FORWARDING_SYSCTLS`] of the node namespace, as `path=value`.
pub fn node_forwarding(node: &Netns) -> Result<Vec<String>> {
    in_netns(node.path(), || {
        FORWARDING_SYSCTLS
            .iter()
            .map(|path| {
                std::fs::read_to_string(path)
                    .map(|v| format!("{path}={}", v.trim()))
                    .with_context(|| format!("read {path} in the node namespace"))
            })
            .collect::<Result<Vec<_>>>()
    })?
}

/// What the node namespace holds besides `lo`: links, and IPv4/IPv6 main-table routes.
pub fn node_leftovers(node: &Netns) -> Result<Vec<String>> {
    let mut left: Vec<String> = node
        .links()?
        .into_iter()
        .map(|name| format!("link {name}"))
        .collect();
    for family in ["-4", "-6"] {
        left.extend(
            node.ip(&[family, "route", "show"])?
                .lines()
                .map(|r| format!("route {r}")),
        );
    }
    Ok(left)
}

/// Waits (bounded) until the node namespace holds nothing but `lo`: retired host veths are
/// deleted by the daemon's background reaper, so they may outlive the DEL briefly.
pub fn wait_node_bare(node: &Netns, limit: Duration) -> Result<()> {
    let mut left = Vec::new();
    wait_until(
        &format!("node {} to hold only lo", node.name()),
        limit,
        || {
            left = node_leftovers(node)?;
            Ok(left.is_empty().then_some(()))
        },
    )
    .with_context(|| format!("left: {left:?}"))
}
