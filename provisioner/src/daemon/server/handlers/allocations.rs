//! The verbs over every allocation of the network in force: GC (release those not named valid)
//! and LIST.

use crate::cni::CniError;
use crate::ipam::AllocationKey;

use super::claim::claim_mismatch;
use super::ok;
use crate::daemon::api::{AllocationInfo, AttachmentRef, NetworkClaim, Response};
use crate::daemon::errors::cni_error;
use crate::daemon::state::Active;

/// GC: releases every allocation not in `valid`, of the network the caller claims.
pub(super) async fn gc(
    active: &Active,
    network: Option<&NetworkClaim>,
    valid: &[AttachmentRef],
) -> Response {
    let service = &active.service;
    if let Some(mismatch) = claim_mismatch(service.network(), network) {
        return mismatch;
    }
    let valid: Vec<AllocationKey> = valid
        .iter()
        .map(|v| AllocationKey::new(v.container_id.clone(), v.ifname.clone()))
        .collect();
    let outcome = match service.gc(&valid).await {
        Ok(outcome) => outcome,
        Err(err) => return cni_error(&err).into(),
    };
    tracing::info!(
        released = outcome.released.len(),
        in_flight = outcome.in_flight.len(),
        "GC"
    );
    if outcome.errors.is_empty() {
        let released: Vec<String> = outcome.released.iter().map(ToString::to_string).collect();
        ok(&serde_json::json!({ "released": released }))
    } else {
        let errors: Vec<String> = outcome.errors.iter().map(ToString::to_string).collect();
        CniError::internal(format!("GC: {}", errors.join("; "))).into()
    }
}

/// LIST: every allocation, with its addresses and pod.
pub(super) async fn list(active: &Active) -> Response {
    match active.service.list().await {
        Ok(allocations) => ok(&allocations
            .iter()
            .map(|a| AllocationInfo {
                container_id: a.key.container_id.clone(),
                ifname: a.key.ifname.clone(),
                addresses: a.ips.iter().map(|ip| ip.address.to_string()).collect(),
                pod: a.pod.clone(),
            })
            .collect::<Vec<_>>()),
        Err(err) => cni_error(&err).into(),
    }
}
