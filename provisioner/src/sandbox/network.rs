//! The network a service provisions: name, MTU, address ranges and routes, resolved from the
//! plugin config.

use crate::config::NetworkConfig;
use crate::ipam::{IpamConfig, RangeSets, RouteConfig};

use super::SandboxError;

/// A validated network: what every sandbox of it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    pub name: String,
    pub mtu: Option<u32>,
    pub ranges: RangeSets,
    pub routes: Vec<RouteConfig>,
    /// The `ipam` section as given, to compare a request's config with the loaded one.
    pub ipam: IpamConfig,
}

impl Network {
    /// Resolves a plugin config; errors name the network and the field.
    pub fn from_config(config: &NetworkConfig) -> Result<Self, SandboxError> {
        let ipam: IpamConfig = serde_json::from_value(config.ipam.clone())
            .map_err(|e| SandboxError::Config(format!("network {}: ipam: {e}", config.name)))?;
        Self::new(&config.name, config.mtu, ipam)
    }

    pub fn new(name: &str, mtu: Option<u32>, ipam: IpamConfig) -> Result<Self, SandboxError> {
        let ranges = ipam
            .validate()
            .map_err(|e| SandboxError::Config(format!("network {name}: {e}")))?;
        Ok(Self {
            name: name.to_owned(),
            mtu,
            routes: ipam.routes.clone(),
            ranges,
            ipam,
        })
    }

    /// Describes how `other` differs from this network in what matters for allocation, or
    /// `None` when a request with `other` may be served by this network.
    pub fn mismatch(&self, other: &Network) -> Option<String> {
        if self.name != other.name {
            return Some(format!(
                "request is for network {:?} but the daemon serves {:?}",
                other.name, self.name
            ));
        }
        if self.ranges != other.ranges {
            return Some(format!(
                "request's ranges {} differ from the daemon's {} for network {}",
                other.ranges_summary(),
                self.ranges_summary(),
                self.name
            ));
        }
        None
    }

    /// `10.244.1.0/24,fd00::/64` style summary of the range sets.
    pub fn ranges_summary(&self) -> String {
        self.ranges
            .sets()
            .iter()
            .flat_map(|set| set.ranges().iter().map(|r| r.subnet().to_string()))
            .collect::<Vec<_>>()
            .join(",")
    }
}
