//! Pure planning: validates a spec and computes the [`ExpectedState`] of the sandbox, every
//! address and route setup will create (ptp wiring). Setup, CHECK, the tracer's intent and the
//! audit at start all work from it. Unit-tested without root.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::error::DataplaneError;
use super::naming::host_ifname;
use super::route::{Route, Scope};
use super::spec::{PodAddress, RouteSpec, SandboxSpec};

/// The wiring of one address family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPlan {
    /// Pod address with the subnet prefix, on the sandbox end.
    pub pod: IpNetwork,
    pub gateway: IpAddr,
    /// The gateway as /32 (/128) on the host end.
    pub host_address: IpNetwork,
    /// `pod/32 dev host scope host`.
    pub host_route: Route,
}

/// What a sandbox must have after ADD: everything setup creates, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedState {
    /// The interface inside the sandbox.
    pub ifname: String,
    pub mtu: Option<u32>,
    pub host_ifname: String,
    pub families: Vec<FamilyPlan>,
    /// Sandbox routes through the sandbox interface, in install order (gateway first).
    pub sandbox_routes: Vec<Route>,
    pub uses_v6: bool,
}

/// What a sandbox's veth pair needs valid: a container id, an interface name and an MTU the
/// kernel takes.
pub(crate) fn check_link(
    container_id: &str,
    ifname: &str,
    mtu: Option<u32>,
) -> Result<(), DataplaneError> {
    crate::names::sandbox(container_id, ifname).map_err(|err| invalid(err.to_string()))?;
    if let Some(mtu) = mtu
        && !(68..=65535).contains(&mtu)
    {
        return Err(invalid(format!("mtu {mtu} out of range")));
    }
    Ok(())
}

fn invalid(msg: String) -> DataplaneError {
    DataplaneError::InvalidSpec(msg)
}

fn full_prefix(net: IpNetwork) -> u8 {
    if net.is_ipv4() { 32 } else { 128 }
}

fn host_net(ip: IpAddr) -> IpNetwork {
    let prefix = if ip.is_ipv4() { 32 } else { 128 };
    // A full-length prefix is always valid.
    IpNetwork::new(ip, prefix).unwrap_or_else(|_| IpNetwork::from(ip))
}

fn default_dst(v4: bool) -> IpNetwork {
    let (ip, prefix): (IpAddr, u8) = if v4 {
        (IpAddr::from([0u8; 4]), 0)
    } else {
        (IpAddr::from([0u16; 8]), 0)
    };
    IpNetwork::new(ip, prefix).unwrap_or_else(|_| IpNetwork::from(ip))
}

/// The node's route to pod address `pod` through its host veth: `pod/32 scope host`.
pub(crate) fn host_route_to(pod: IpAddr) -> Route {
    Route {
        dst: host_net(pod),
        gw: None,
        src: None,
        scope: Scope::Host,
    }
}

/// Normalizes `net` to its network address (`10.0.0.5/8` -> `10.0.0.0/8`).
pub(crate) fn network_of(net: IpNetwork) -> IpNetwork {
    IpNetwork::new(net.network(), net.prefix()).unwrap_or(net)
}

impl ExpectedState {
    /// The pod addresses on the sandbox interface, v4 first.
    pub fn sandbox_addresses(&self) -> impl Iterator<Item = IpNetwork> + '_ {
        self.families.iter().map(|f| f.pod)
    }
}

/// Validates `spec` and plans the ptp wiring.
pub fn plan(spec: &SandboxSpec) -> Result<ExpectedState, DataplaneError> {
    check_link(&spec.container_id, &spec.ifname, spec.mtu)?;
    let uses_v6 = check_families(spec)?;
    let mut families = Vec::new();
    let mut routes: Vec<Route> = Vec::new();
    // v4 first for a stable order.
    let mut addrs = spec.addresses.clone();
    addrs.sort_by_key(|a| a.address.is_ipv6());
    for a in &addrs {
        families.push(plan_family(a, &mut routes)?);
    }
    for r in &spec.routes {
        add_configured_route(r, &families, &mut routes)?;
    }
    Ok(ExpectedState {
        ifname: spec.ifname.clone(),
        mtu: spec.mtu,
        host_ifname: host_ifname(&spec.container_id, &spec.ifname),
        uses_v6,
        families,
        sandbox_routes: routes,
    })
}

/// At least one address, at most one of each family, an MTU IPv6 takes when it is used;
/// true when the sandbox uses IPv6.
fn check_families(spec: &SandboxSpec) -> Result<bool, DataplaneError> {
    if spec.addresses.is_empty() {
        return Err(invalid("no address".to_owned()));
    }
    let v4 = spec
        .addresses
        .iter()
        .filter(|a| a.address.is_ipv4())
        .count();
    let v6 = spec.addresses.len() - v4;
    if v4 > 1 || v6 > 1 {
        return Err(invalid("more than one address of a family".to_owned()));
    }
    if v6 > 0 && spec.mtu.is_some_and(|m| m < 1280) {
        return Err(invalid("IPv6 needs an mtu of at least 1280".to_owned()));
    }
    Ok(v6 > 0)
}

/// Validates one pod address and its gateway, plans its family and appends its sandbox routes
/// (gateway, subnet, default) to `routes`.
fn plan_family(a: &PodAddress, routes: &mut Vec<Route>) -> Result<FamilyPlan, DataplaneError> {
    let pod = a.address;
    let gw = a.gateway;
    let is_v4 = pod.is_ipv4();
    if gw.is_ipv4() != is_v4 {
        return Err(invalid(format!(
            "gateway {gw} is not of the family of {pod}"
        )));
    }
    if gw == pod.ip() {
        return Err(invalid(format!("gateway {gw} equals the pod address")));
    }
    if pod.ip() == pod.network() && pod.prefix() < full_prefix(pod) {
        return Err(invalid(format!(
            "{pod} is the network address of its subnet"
        )));
    }
    let src = if is_v4 { Some(pod.ip()) } else { None };
    // `10.244.1.1 dev eth0 scope link src 10.244.1.2`
    routes.push(Route {
        dst: host_net(gw),
        gw: None,
        src,
        scope: Scope::Link,
    });
    // `10.244.1.0/24 via 10.244.1.1 src 10.244.1.2` (instead of the connected route)
    if pod.prefix() < full_prefix(pod) {
        routes.push(Route {
            dst: network_of(pod),
            gw: Some(gw),
            src,
            scope: Scope::Universe,
        });
    }
    // `default via 10.244.1.1`
    routes.push(Route {
        dst: default_dst(is_v4),
        gw: Some(gw),
        src: None,
        scope: Scope::Universe,
    });
    Ok(FamilyPlan {
        pod,
        gateway: gw,
        host_address: host_net(gw),
        host_route: host_route_to(pod.ip()),
    })
}

/// Appends a route of the network config to `routes`, through its family's gateway unless it
/// names one; a route already planned with the same gateway is skipped, with another refused.
fn add_configured_route(
    r: &RouteSpec,
    families: &[FamilyPlan],
    routes: &mut Vec<Route>,
) -> Result<(), DataplaneError> {
    let dst = network_of(r.dst);
    let Some(fam) = families.iter().find(|f| f.pod.is_ipv4() == dst.is_ipv4()) else {
        return Err(invalid(format!("route {dst}: no address of its family")));
    };
    let gw = r.gw.unwrap_or(fam.gateway);
    if gw.is_ipv4() != dst.is_ipv4() {
        return Err(invalid(format!(
            "route {dst}: gateway {gw} of another family"
        )));
    }
    match routes.iter().find(|p| p.dst == dst) {
        Some(p) if p.gw == Some(gw) => {} // exact duplicate (e.g. the default): skip
        Some(p) => {
            return Err(invalid(format!("route {dst} via {gw} conflicts with {p}")));
        }
        None => routes.push(Route {
            dst,
            gw: Some(gw),
            src: None,
            scope: Scope::Universe,
        }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::spec::{PodAddress, RouteSpec};

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("test cidr")
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test ip")
    }

    fn spec(addrs: &[(&str, &str)], routes: &[(&str, Option<&str>)]) -> SandboxSpec {
        SandboxSpec::new("c1", "/run/netns/x", "eth0")
            .with_addresses(addrs.iter().map(|(a, g)| PodAddress::new(net(a), ip(g))))
            .with_mtu(Some(1460))
            .with_routes(
                routes
                    .iter()
                    .map(|(d, g)| RouteSpec::new(net(d), g.map(ip))),
            )
    }

    fn show(p: &ExpectedState) -> Vec<String> {
        p.sandbox_routes.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn ptp_v4_wiring() {
        let p = plan(&spec(
            &[("10.244.1.2/24", "10.244.1.1")],
            &[("0.0.0.0/0", None)],
        ))
        .expect("plan");
        assert_eq!(
            show(&p),
            [
                "10.244.1.1/32 scope link src 10.244.1.2",
                "10.244.1.0/24 via 10.244.1.1 src 10.244.1.2",
                "0.0.0.0/0 via 10.244.1.1",
            ]
        );
        assert_eq!(p.families[0].host_address, net("10.244.1.1/32"));
        assert_eq!(
            p.families[0].host_route.to_string(),
            "10.244.1.2/32 scope host"
        );
        assert!(!p.uses_v6);
        assert_eq!(p.host_ifname, host_ifname("c1", "eth0"));
    }

    #[test]
    fn dual_stack_and_extra_routes() {
        let p = plan(&spec(
            &[
                ("fd00:1::2/64", "fd00:1::1"),
                ("10.244.1.2/24", "10.244.1.1"),
            ],
            &[
                ("10.96.0.5/12", None),
                ("::/0", None),
                ("fd00:9::/64", Some("fd00:1::1")),
            ],
        ))
        .expect("plan");
        assert!(p.uses_v6);
        assert_eq!(p.families[0].pod, net("10.244.1.2/24"));
        assert_eq!(p.families[1].host_address, net("fd00:1::1/128"));
        assert_eq!(
            show(&p),
            [
                "10.244.1.1/32 scope link src 10.244.1.2",
                "10.244.1.0/24 via 10.244.1.1 src 10.244.1.2",
                "0.0.0.0/0 via 10.244.1.1",
                "fd00:1::1/128 scope link",
                "fd00:1::/64 via fd00:1::1",
                "::/0 via fd00:1::1",
                "10.96.0.0/12 via 10.244.1.1",
                "fd00:9::/64 via fd00:1::1",
            ]
        );
    }

    #[test]
    fn rejects_bad_specs() {
        let bad = [
            spec(&[], &[]),
            spec(
                &[("10.0.0.2/24", "10.0.0.1"), ("10.0.1.2/24", "10.0.1.1")],
                &[],
            ),
            spec(&[("10.0.0.2/24", "fd00::1")], &[]),
            spec(&[("10.0.0.1/24", "10.0.0.1")], &[]),
            spec(&[("10.0.0.0/24", "10.0.0.1")], &[]),
            spec(&[("10.0.0.2/24", "10.0.0.1")], &[("fd00::/64", None)]),
            spec(
                &[("10.0.0.2/24", "10.0.0.1")],
                &[("0.0.0.0/0", Some("10.0.0.9"))],
            ),
        ];
        for s in &bad {
            assert!(
                matches!(plan(s), Err(DataplaneError::InvalidSpec(_))),
                "{s:?} accepted"
            );
        }
        let mut s = spec(&[("10.0.0.2/24", "10.0.0.1")], &[]);
        s.ifname = "this-name-is-too-long".to_owned();
        assert!(plan(&s).is_err());
        let mut s = spec(&[("fd00::2/64", "fd00::1")], &[]);
        s.mtu = Some(1000);
        assert!(plan(&s).is_err());
    }
}
