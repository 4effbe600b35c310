//! Whether the network a request claims (its name and IPAM config) is the one in force.

use crate::cni::CniError;
use crate::ipam::IpamConfig;
use crate::sandbox::Network;

use crate::daemon::api::{NetworkClaim, Response};

/// `None` when `claim` is absent or names the network in force; else the error to answer:
/// another network (code 7), or a claim that is no valid config.
pub(super) fn claim_mismatch(network: &Network, claim: Option<&NetworkClaim>) -> Option<Response> {
    let claim = claim?;
    let claimed = serde_json::from_value::<IpamConfig>(claim.ipam.clone())
        .map_err(|e| e.to_string())
        .and_then(|ipam| Network::new(&claim.name, None, ipam).map_err(|e| e.to_string()));
    match claimed {
        Ok(claimed) => {
            let reason = network.mismatch(&claimed)?;
            Some(CniError::new(CniError::CONFIG_MISMATCH, reason).into())
        }
        Err(err) => Some(
            CniError::invalid_config(format!("request's network config is invalid: {err}")).into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[test]
    fn a_claim_is_served_when_its_name_and_ranges_are_the_daemons() {
        let loaded = serde_json::json!({
            "type": "provisioner",
            "ranges": [[{"subnet": "10.244.0.0/22"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        });
        let ipam = IpamConfig::deserialize(&loaded).expect("ipam");
        let network = Network::new("pods", None, ipam).expect("network");
        let claim = |name: &str, ipam: serde_json::Value| NetworkClaim {
            name: name.to_owned(),
            ipam,
        };
        let code = |claim: &NetworkClaim| match claim_mismatch(&network, Some(claim)) {
            None => None,
            Some(Response::Error { code, msg, .. }) => Some((code, msg)),
            Some(other) => panic!("not an error: {other:?}"),
        };
        assert_eq!(code(&claim("pods", loaded.clone())), None);
        // Other routes, the same ranges: still this network.
        let other_routes = serde_json::json!({"ranges": [[{"subnet": "10.244.0.0/22"}]]});
        assert_eq!(code(&claim("pods", other_routes)), None);
        let (c, msg) = code(&claim("other", loaded)).expect("another network");
        assert_eq!(c, CniError::CONFIG_MISMATCH, "{msg}");
        assert!(msg.contains("\"other\""), "{msg}");
        let other_ranges = serde_json::json!({"ranges": [[{"subnet": "10.245.0.0/22"}]]});
        let (c, msg) = code(&claim("pods", other_ranges)).expect("other ranges");
        assert_eq!(c, CniError::CONFIG_MISMATCH, "{msg}");
        assert!(msg.contains("10.245.0.0/22"), "{msg}");
        let invalid = serde_json::json!({"ranges": [[{"subnet": "10.245.0.0/33"}]]});
        let (c, msg) = code(&claim("pods", invalid)).expect("invalid");
        assert_eq!(c, CniError::INVALID_NETWORK_CONFIG, "{msg}");
    }
}
