//! Start-up reconciliation of the allocation store with the kernel.
//!
//! The kernel is the truth about which addresses live sandboxes hold: each host veth of ours
//! (`pvn*`) routes its pod's addresses (host routes through it). So:
//! - an allocation whose host veth is gone is released: the veth pair dies with the sandbox's
//!   netns. Unless no host veth of ours is visible at all while the node did not reboot: that
//!   is a daemon looking at the wrong netns (`--host-netns`), not every sandbox gone, and
//!   nothing is released (the daemon reports why);
//! - a host veth of ours that no allocation owns and that routes pod addresses is *adopted*:
//!   its addresses are reserved under [`AllocationKey::adopted`] (store file lost, network
//!   renamed, a crash between the kernel setup and the durable commit), so they are never handed
//!   out while it lives; DEL of its sandbox, GC or a later reconciliation releases them;
//! - a host veth of ours that no allocation owns and that routes nothing is a leftover of an
//!   interrupted ADD: deleted. Retired (graveyard) veths are deleted.
//!
//! When the kernel cannot be read, the store cannot be trusted to know every owner: the
//! network is not put in force (requests are answered "try again later" with the reason).

use std::collections::HashSet;
use std::sync::Arc;

use crate::dataplane::Inventory;
use crate::ipam::{Allocation, OpenReport, RoutedOwner};
use crate::sandbox::{SandboxService, host_link_of};

/// Why reconciliation did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The kernel or the store could not be read or written: owners may be unknown, so the
    /// network must not allocate.
    #[error(
        "cannot rebuild the owners of addresses from the kernel ({0}); not allocating, since live \
         sandboxes may hold addresses the store does not know: fix the cause and restart the daemon"
    )]
    Unknown(String),
    /// Releasing every allocation was refused (see the module doc).
    #[error(
        "none of the {allocations} sandboxes in the store has its host veth in host netns \
         {netns}, which shows no host veth of ours at all although the node did not reboot: not \
         releasing their addresses (is --host-netns right?); if those sandboxes are really gone, \
         DEL them or let the runtime's GC remove them"
    )]
    MassRelease { allocations: usize, netns: String },
}

impl ReconcileError {
    /// Whether the network must not be put in force.
    #[must_use]
    pub fn refuses_service(&self) -> bool {
        matches!(self, ReconcileError::Unknown(_))
    }
}

pub fn report_store(report: &OpenReport) {
    tracing::info!(store = %report.path.display(), allocations = report.allocations, "allocation store open");
    for allocation in &report.out_of_range {
        tracing::warn!(key = %allocation.key, ips = ?allocation.ips, "allocation outside the configured ranges: kept reserved until its sandbox is deleted");
    }
    for (key, reason) in &report.unreadable {
        tracing::warn!(%key, %reason, "unreadable allocation record kept");
    }
}

/// What the store knows before reconciliation: why it was started empty (lost, or kept aside
/// as broken), and whether the node did not reboot since it was last opened.
pub struct StoreOrigin<'a> {
    pub lost: Option<&'a str>,
    pub same_boot: bool,
}

/// Reconciles the store of `service` with the kernel. A store started empty is rebuilt by
/// adoption, and said in one line: what was lost, what was recovered, what could not be.
pub async fn with_kernel(
    service: &SandboxService,
    origin: StoreOrigin<'_>,
) -> Result<(), ReconcileError> {
    let rebuilt = reconcile(service, origin.same_boot, origin.lost.is_some()).await;
    if let Some(lost) = origin.lost {
        let store = service.allocator().path().display().to_string();
        match &rebuilt {
            Ok(adopted) => {
                tracing::error!(%store, %lost, recovered = ?adopted.recovered, not_recovered = ?adopted.not_recovered,
                    "allocation store lost: started a new one and rebuilt from the kernel {} sandboxes' \
                     addresses (adopted from their host veths, never handed out twice); not recoverable: \
                     the allocations of sandboxes whose host veth is gone (their addresses are free again){}",
                    adopted.recovered.len(),
                    if adopted.not_recovered.is_empty() { "" } else { ", and the addresses listed as not_recovered" });
            }
            Err(err) => {
                tracing::error!(%store, %lost, error = %err,
                    "allocation store lost: started a new one, but rebuilding it from the kernel failed");
            }
        }
    }
    rebuilt.map(|_| ())
}

/// What adoption recovered, and routed addresses it could not reserve, for the log.
#[derive(Default)]
struct Adopted {
    /// `<host veth>: <addresses>`.
    recovered: Vec<String>,
    /// `<host veth> <address>: <why>`.
    not_recovered: Vec<String>,
}

async fn reconcile(
    service: &SandboxService,
    same_boot: bool,
    rebuilding: bool,
) -> Result<Adopted, ReconcileError> {
    let unknown = |e: &dyn std::fmt::Display| ReconcileError::Unknown(e.to_string());
    let inventory: Inventory = service
        .dataplane()
        .inventory()
        .await
        .map_err(|e| unknown(&e))?;
    let allocations = service.list().await.map_err(|e| unknown(&e))?;
    let present: HashSet<&str> = inventory.veths.iter().map(|v| v.name.as_str()).collect();
    let owned: HashSet<String> = allocations.iter().map(|a| host_link_of(&a.key)).collect();
    let gone: Vec<&Allocation> = allocations
        .iter()
        .filter(|a| !present.contains(host_link_of(&a.key).as_str()))
        .collect();

    let mut refused = None;
    if !gone.is_empty() && inventory.veths.is_empty() && same_boot {
        let err = ReconcileError::MassRelease {
            allocations: gone.len(),
            netns: service.dataplane().host_netns().to_owned(),
        };
        tracing::error!(error = %err, "reconciliation: mass release refused");
        refused = Some(err);
    } else {
        for allocation in gone {
            let key = &allocation.key;
            let who = crate::pod::describe(allocation.pod.as_ref());
            crate::pod_event!(tracing::Level::WARN, allocation.pod.as_ref(), Some(key.container_id.as_str()),
                %key, host_link = %host_link_of(key),
                "sandbox of {who} gone (no host veth): releasing its allocation");
            if let Err(err) = service.release_gone(key).await {
                tracing::error!(%key, error = %err, "release of a gone sandbox failed");
            }
        }
    }

    for link in &inventory.retired {
        tracing::info!(host_link = %link, "retired host veth left by a previous run: deleting");
        if let Err(err) = service.dataplane().delete_host_link(link).await {
            tracing::error!(host_link = %link, error = %err, "delete retired host veth");
        }
    }

    let mut owners = Vec::new();
    for veth in inventory.veths.iter().filter(|v| !owned.contains(&v.name)) {
        if veth.routed.is_empty() {
            // An interrupted ADD's veth (no pod reaches anything through it).
            tracing::warn!(host_link = %veth.name, "host veth without allocation that routes no pod address: deleting");
            if let Err(err) = service.dataplane().delete_host_link(&veth.name).await {
                tracing::error!(host_link = %veth.name, error = %err, "delete leftover host veth");
            }
        } else {
            owners.push(RoutedOwner {
                host_link: veth.name.clone(),
                addresses: veth.routed.clone(),
            });
        }
    }
    let adopted = if owners.is_empty() {
        Adopted::default()
    } else {
        adopt(service, owners, rebuilding).await?
    };
    refused.map_or(Ok(adopted), Err)
}

/// Reserves the addresses routed through host veths no allocation owns. When `rebuilding` a
/// lost store, each one is logged at info level: the caller sums them up in one line.
async fn adopt(
    service: &SandboxService,
    owners: Vec<RoutedOwner>,
    rebuilding: bool,
) -> Result<Adopted, ReconcileError> {
    let allocator = Arc::clone(service.allocator());
    let report = tokio::task::spawn_blocking(move || allocator.adopt(&owners))
        .await
        .map_err(|e| ReconcileError::Unknown(format!("adoption worker: {e}")))?
        .map_err(|e| ReconcileError::Unknown(e.to_string()))?;
    let network = &service.network().name;
    let mut adopted = Adopted::default();
    for allocation in &report.adopted {
        let ips: Vec<String> = allocation
            .ips
            .iter()
            .map(|ip| ip.address.to_string())
            .collect();
        let link = allocation.key.adopted_link().unwrap_or_default();
        adopted.recovered.push(format!("{link}: {}", ips.join(" ")));
        if rebuilding {
            tracing::info!(key = %allocation.key, ?ips, %network, "adopted from its host veth");
        } else {
            tracing::warn!(key = %allocation.key, ?ips, %network,
                "host veth routes addresses the store did not hold: adopted (reserved until the veth is removed)");
        }
    }
    for (link, ip, holder) in &report.held_elsewhere {
        adopted
            .not_recovered
            .push(format!("{link} {ip}: reserved for {holder}"));
        tracing::warn!(host_link = %link, %ip, %holder, "host veth routes an address reserved for another key: left alone");
    }
    for (link, ip) in &report.out_of_range {
        adopted
            .not_recovered
            .push(format!("{link} {ip}: outside the ranges of {network}"));
        tracing::warn!(host_link = %link, %ip, %network,
            "host veth routes an address outside this network's ranges: left in place (another network's sandbox?)");
    }
    Ok(adopted)
}
