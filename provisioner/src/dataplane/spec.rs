//! The input and output shapes of setup / teardown.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnetwork::IpNetwork;

/// What one sandbox interface should look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    pub container_id: String,
    /// The sandbox netns path (`/run/netns/x`, `/proc/<pid>/ns/net`).
    pub netns: PathBuf,
    /// The interface name inside the sandbox (e.g. `eth0`).
    pub ifname: String,
    /// At most one per family: v4, v6 or both.
    pub addresses: Vec<PodAddress>,
    pub mtu: Option<u32>,
    pub routes: Vec<RouteSpec>,
}

/// The part of a [`SandboxSpec`] its veth pair needs: no address. ADD makes the pair with
/// it while the addresses are being reserved ([`crate::dataplane::Dataplane::start_setup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub container_id: String,
    pub netns: PathBuf,
    pub ifname: String,
    pub mtu: Option<u32>,
}

impl LinkSpec {
    pub fn of(spec: &SandboxSpec) -> Self {
        Self {
            container_id: spec.container_id.clone(),
            netns: spec.netns.clone(),
            ifname: spec.ifname.clone(),
            mtu: spec.mtu,
        }
    }
}

/// A pod address with its subnet prefix (e.g. `10.244.1.2/24`) and the gateway of its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodAddress {
    pub address: IpNetwork,
    pub gateway: IpAddr,
}

/// An extra route in the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    /// `None`: via the gateway of the route's family.
    pub gw: Option<IpAddr>,
}

/// What setup created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupOutcome {
    pub host_ifname: String,
    pub host_ifindex: u32,
    pub host_mac: String,
    pub sandbox_ifname: String,
    pub sandbox_mac: String,
    pub sandbox_ifindex: u32,
}

/// What teardown found and did (it succeeds whenever nothing is left behind).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeardownOutcome {
    /// The host veth existed and was deleted by this call.
    pub host_link_deleted: bool,
    /// The sandbox netns existed and its interface was cleaned.
    pub sandbox_cleaned: bool,
    /// The sandbox netns was not given, is gone or is not a netns.
    pub sandbox_netns_gone: bool,
}
