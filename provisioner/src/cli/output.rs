//! Printing operation results: one human-readable line per fact, or CNI-like JSON.

use anyhow::Result;

use provisioner::cni::CniVersion;
use provisioner::ipam::Allocation;
use provisioner::sandbox::{AddOutcome, DelOutcome, SandboxRef};

fn print_json(value: &serde_json::Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn addresses(allocation: &Allocation) -> String {
    allocation
        .ips
        .iter()
        .map(|ip| format!("{} (gateway {})", ip.address, ip.gateway))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn print_add(outcome: &AddOutcome, json: bool) -> Result<()> {
    if json {
        return print_json(&outcome.cni_result().to_json(CniVersion::LATEST));
    }
    println!(
        "added {} in {}: {} <-> host {}; {}",
        outcome.setup.sandbox_ifname,
        outcome.spec.netns.display(),
        outcome.setup.sandbox_mac,
        outcome.setup.host_ifname,
        addresses(&outcome.allocation)
    );
    Ok(())
}

pub fn print_del(sandbox: &SandboxRef, outcome: &DelOutcome, json: bool) -> Result<()> {
    if json {
        return print_json(&serde_json::json!({
            "containerId": sandbox.container_id,
            "ifname": sandbox.ifname,
            "hostLinkDeleted": outcome.teardown.host_link_deleted,
            "sandboxCleaned": outcome.teardown.sandbox_cleaned,
            "released": outcome.released.as_ref().map(|a| a.ips.iter().map(|ip| ip.address.to_string()).collect::<Vec<_>>()),
        }));
    }
    match &outcome.released {
        Some(allocation) => println!(
            "deleted {} ({}); released {}",
            sandbox.container_id,
            sandbox.ifname,
            addresses(allocation)
        ),
        None => println!(
            "deleted {} ({}); it held no addresses",
            sandbox.container_id, sandbox.ifname
        ),
    }
    Ok(())
}

pub fn print_check(allocation: &Allocation, json: bool) -> Result<()> {
    if json {
        return print_json(&serde_json::json!({
            "containerId": allocation.key.container_id,
            "ifname": allocation.key.ifname,
            "ok": true,
            "addresses": allocation.ips.iter().map(|ip| ip.address.to_string()).collect::<Vec<_>>(),
            "pod": allocation.pod,
        }));
    }
    println!(
        "ok: {} {} ({}) has {}",
        provisioner::pod::describe(allocation.pod.as_ref()),
        allocation.key.container_id,
        allocation.key.ifname,
        addresses(allocation)
    );
    Ok(())
}
