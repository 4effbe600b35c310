//! Start-up reconciliation of the allocation store with the kernel.
//!
//! The veth pair of a sandbox dies with its netns, so a missing host veth means the sandbox is
//! gone: its allocation is released. A host veth named like ours with no allocation and no address
//! is a leftover: it is deleted; one that still holds addresses may belong to another network's
//! store and is left in place with a warning. Retired (graveyard) veths are deleted.

use std::collections::HashSet;

use crate::dataplane::{host_ifname, is_graveyard_ifname, is_host_ifname};
use crate::ipam::OpenReport;
use crate::sandbox::SandboxService;

pub fn report_store(report: &OpenReport) {
    tracing::info!(store = %report.path.display(), allocations = report.allocations, "allocation store open");
    for allocation in &report.out_of_range {
        tracing::warn!(key = %allocation.key, ips = ?allocation.ips, "allocation outside the configured ranges: kept reserved until its sandbox is deleted");
    }
    for (key, reason) in &report.unreadable {
        tracing::warn!(%key, %reason, "unreadable allocation record kept");
    }
}

pub async fn with_kernel(service: &SandboxService) -> Result<(), String> {
    let links: HashSet<String> = service
        .dataplane()
        .host_link_names()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    let allocations = service.list().await.map_err(|e| e.to_string())?;
    let mut expected = HashSet::new();
    for allocation in &allocations {
        let name = host_ifname(&allocation.key.container_id, &allocation.key.ifname);
        if links.contains(&name) {
            expected.insert(name);
            continue;
        }
        tracing::warn!(key = %allocation.key, host_link = %name, "sandbox gone (no host veth): releasing its allocation");
        if let Err(err) = service.release_gone(&allocation.key).await {
            tracing::error!(key = %allocation.key, error = %err, "release of a gone sandbox failed");
        }
    }
    for link in links.iter().filter(|l| is_graveyard_ifname(l)) {
        tracing::info!(host_link = %link, "retired host veth left by a previous run: deleting");
        if let Err(err) = service.dataplane().delete_host_link(link).await {
            tracing::error!(host_link = %link, error = %err, "delete retired host veth");
        }
    }
    for link in links
        .iter()
        .filter(|l| is_host_ifname(l) && !expected.contains(*l))
    {
        // An allocation is stored before its veth is created, so a veth of ours without one is
        // a leftover of a failed rollback, or belongs to another network's store (renamed
        // network, other data dir). Only a veth that routes nothing is safe to delete.
        let addresses = service
            .dataplane()
            .host_link_addresses(link)
            .await
            .map_err(|e| e.to_string())?;
        if !addresses.is_empty() {
            tracing::warn!(
                host_link = %link,
                ?addresses,
                network = %service.network().name,
                "host veth holds addresses but has no allocation in this network's store: left in place (another network's sandbox?)"
            );
            continue;
        }
        tracing::warn!(host_link = %link, "host veth without allocation or address: deleting");
        if let Err(err) = service.dataplane().delete_host_link(link).await {
            tracing::error!(host_link = %link, error = %err, "delete leftover host veth");
        }
    }
    Ok(())
}
