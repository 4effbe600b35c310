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

impl SandboxSpec {
    /// `ifname` in the netns at `netns` for `container_id`: no address, the kernel's MTU and no
    /// extra route until the `with_` methods give them.
    pub fn new(
        container_id: impl Into<String>,
        netns: impl Into<PathBuf>,
        ifname: impl Into<String>,
    ) -> Self {
        Self {
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            addresses: Vec::new(),
            mtu: None,
            routes: Vec::new(),
        }
    }

    pub fn with_addresses(mut self, addresses: impl IntoIterator<Item = PodAddress>) -> Self {
        self.addresses = addresses.into_iter().collect();
        self
    }

    pub fn with_mtu(mut self, mtu: Option<u32>) -> Self {
        self.mtu = mtu;
        self
    }

    pub fn with_routes(mut self, routes: impl IntoIterator<Item = RouteSpec>) -> Self {
        self.routes = routes.into_iter().collect();
        self
    }
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

impl PodAddress {
    pub const fn new(address: IpNetwork, gateway: IpAddr) -> Self {
        Self { address, gateway }
    }
}

/// An extra route in the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    /// `None`: via the gateway of the route's family.
    pub gw: Option<IpAddr>,
}

impl RouteSpec {
    pub const fn new(dst: IpNetwork, gw: Option<IpAddr>) -> Self {
        Self { dst, gw }
    }
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
