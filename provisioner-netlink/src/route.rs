//! Route requests, and the route model the provisioner plans, installs and checks.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::route::{RouteAttribute, RouteMessage, RouteProtocol, RouteScope};
use rtnetlink::RouteMessageBuilder;

use crate::Req;

/// Scope of a planned route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Via a gateway, or the default for v6.
    Universe,
    /// Directly on the link (e.g. the route to the gateway in the pod).
    Link,
    /// The host-side route to the pod (`scope host`, as ptp does).
    Host,
}

/// One route to be installed through `dev` (the interface is given separately).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub src: Option<IpAddr>,
    pub scope: Scope,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gw {
            write!(f, " via {gw}")?;
        }
        match self.scope {
            Scope::Link => write!(f, " scope link")?,
            Scope::Host => write!(f, " scope host")?,
            Scope::Universe => {}
        }
        if let Some(src) = self.src {
            write!(f, " src {src}")?;
        }
        Ok(())
    }
}

fn message(oif: u32, route: &Route) -> RouteMessage {
    match route.dst {
        IpNetwork::V4(dst) => {
            let scope = match route.scope {
                Scope::Universe => RouteScope::Universe,
                Scope::Link => RouteScope::Link,
                Scope::Host => RouteScope::Host,
            };
            let mut b = RouteMessageBuilder::<Ipv4Addr>::new().scope(scope);
            if dst.prefix() > 0 {
                b = b.destination_prefix(dst.network(), dst.prefix());
            }
            b = match route.gw {
                Some(IpAddr::V4(gw)) => b.gateway(gw),
                Some(gw) => foreign(b, RouteAttribute::Gateway(gw.into())),
                None => b,
            };
            b = match route.src {
                Some(IpAddr::V4(src)) => b.pref_source(src),
                Some(src) => foreign(b, RouteAttribute::PrefSource(src.into())),
                None => b,
            };
            finish(b, oif)
        }
        // Universe scope, whatever `route.scope` says.
        IpNetwork::V6(dst) => {
            let mut b = RouteMessageBuilder::<Ipv6Addr>::new();
            if dst.prefix() > 0 {
                b = b.destination_prefix(dst.network(), dst.prefix());
            }
            b = match route.gw {
                Some(IpAddr::V6(gw)) => b.gateway(gw),
                Some(gw) => foreign(b, RouteAttribute::Gateway(gw.into())),
                None => b,
            };
            b = match route.src {
                Some(IpAddr::V6(src)) => b.pref_source(src),
                Some(src) => foreign(b, RouteAttribute::PrefSource(src.into())),
                None => b,
            };
            finish(b, oif)
        }
    }
}

/// An address of the other family than the route's (the plan refuses them), sent as it is for
/// the kernel to refuse.
fn foreign<T>(mut b: RouteMessageBuilder<T>, attr: RouteAttribute) -> RouteMessageBuilder<T> {
    b.get_mut().attributes.push(attr);
    b
}

/// The table (main), type (unicast) and family are the builder's; the protocol is `boot`, as
/// `ip route` sends.
fn finish<T>(b: RouteMessageBuilder<T>, oif: u32) -> RouteMessage {
    b.protocol(RouteProtocol::Boot)
        .output_interface(oif)
        .build()
}

/// Adds `route` through link `oif` (named `ifname` in messages).
#[must_use]
pub fn add(oif: u32, ifname: &str, route: &Route) -> Req {
    Req::new(
        RouteNetlinkMessage::NewRoute(message(oif, route)),
        NLM_F_CREATE | NLM_F_EXCL,
        format!("add route {route} dev {ifname}"),
    )
}

/// Deletes `route` through link `oif`; the provisioner counts a route already gone as deleted.
#[must_use]
pub fn del(oif: u32, ifname: &str, route: &Route) -> Req {
    Req::new(
        RouteNetlinkMessage::DelRoute(message(oif, route)),
        0,
        format!("delete route {route} dev {ifname}"),
    )
}

/// The bytes the kernel receives for each request, header and attributes in order (the netlink
/// header with sequence number 1).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::req_hex as req;

    fn route(dst: &str, gw: Option<&str>, src: Option<&str>, scope: Scope) -> Route {
        Route {
            dst: dst.parse().expect("test cidr"),
            gw: gw.map(|g| g.parse().expect("test ip")),
            src: src.map(|s| s.parse().expect("test ip")),
            scope,
        }
    }

    #[test]
    fn add_v4_link_scope_with_src_bytes() {
        assert_eq!(
            req(add(
                12,
                "eth0",
                &route("10.244.1.1/32", None, Some("10.244.1.2"), Scope::Link)
            )),
            [
                "34000000180005060100000000000000", // nlmsghdr
                "02200000fe03fd0100000000",         // rtmsg
                "080001000af40101",                 // RTA_DST
                "080007000af40102",                 // RTA_PREFSRC
                "080004000c000000",                 // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v4_via_gateway_with_src_bytes() {
        assert_eq!(
            req(add(
                12,
                "eth0",
                &route(
                    "10.244.1.0/24",
                    Some("10.244.1.1"),
                    Some("10.244.1.2"),
                    Scope::Universe
                )
            )),
            [
                "3c000000180005060100000000000000", // nlmsghdr
                "02180000fe03000100000000",         // rtmsg
                "080001000af40100",                 // RTA_DST
                "080005000af40101",                 // RTA_GATEWAY
                "080007000af40102",                 // RTA_PREFSRC
                "080004000c000000",                 // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v4_default_bytes() {
        assert_eq!(
            req(add(
                12,
                "eth0",
                &route("0.0.0.0/0", Some("10.244.1.1"), None, Scope::Universe)
            )),
            [
                "2c000000180005060100000000000000", // nlmsghdr
                "02000000fe03000100000000",         // rtmsg
                "080005000af40101",                 // RTA_GATEWAY
                "080004000c000000",                 // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v4_host_scope_bytes() {
        assert_eq!(
            req(add(
                12,
                "h1",
                &route("10.244.1.2/32", None, None, Scope::Host)
            )),
            [
                "2c000000180005060100000000000000", // nlmsghdr
                "02200000fe03fe0100000000",         // rtmsg
                "080001000af40102",                 // RTA_DST
                "080004000c000000",                 // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v6_link_scope_bytes() {
        assert_eq!(
            req(add(
                12,
                "eth0",
                &route("fd00:1::1/128", None, None, Scope::Link)
            )),
            [
                "38000000180005060100000000000000",         // nlmsghdr
                "0a800000fe03000100000000",                 // rtmsg
                "14000100fd000001000000000000000000000001", // RTA_DST
                "080004000c000000",                         // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v6_via_gateway_bytes() {
        assert_eq!(
            req(add(
                12,
                "eth0",
                &route("fd00:1::/64", Some("fd00:1::1"), None, Scope::Universe)
            )),
            [
                "4c000000180005060100000000000000",         // nlmsghdr
                "0a400000fe03000100000000",                 // rtmsg
                "14000100fd000001000000000000000000000000", // RTA_DST
                "14000500fd000001000000000000000000000001", // RTA_GATEWAY
                "080004000c000000",                         // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v6_default_bytes() {
        assert_eq!(
            req(add(
                12,
                "eth0",
                &route("::/0", Some("fd00:1::1"), None, Scope::Universe)
            )),
            [
                "38000000180005060100000000000000",         // nlmsghdr
                "0a000000fe03000100000000",                 // rtmsg
                "14000500fd000001000000000000000000000001", // RTA_GATEWAY
                "080004000c000000",                         // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v6_host_scope_with_src_bytes() {
        assert_eq!(
            req(add(
                12,
                "h1",
                &route("fd00:1::2/128", None, Some("fd00:1::1"), Scope::Host)
            )),
            [
                "4c000000180005060100000000000000",         // nlmsghdr
                "0a800000fe03000100000000",                 // rtmsg
                "14000100fd000001000000000000000000000002", // RTA_DST
                "14000700fd000001000000000000000000000001", // RTA_PREFSRC
                "080004000c000000",                         // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn del_v4_host_scope_bytes() {
        assert_eq!(
            req(del(
                12,
                "h1",
                &route("10.244.1.2/32", None, None, Scope::Host)
            )),
            [
                "2c000000190005000100000000000000", // nlmsghdr
                "02200000fe03fe0100000000",         // rtmsg
                "080001000af40102",                 // RTA_DST
                "080004000c000000",                 // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn del_v6_default_bytes() {
        assert_eq!(
            req(del(
                12,
                "eth0",
                &route("::/0", Some("fd00:1::1"), None, Scope::Universe)
            )),
            [
                "38000000190005000100000000000000",         // nlmsghdr
                "0a000000fe03000100000000",                 // rtmsg
                "14000500fd000001000000000000000000000001", // RTA_GATEWAY
                "080004000c000000",                         // RTA_OIF
            ]
            .concat()
        );
    }

    /// A gateway or source of the other family (the plan refuses them) reaches the kernel as it
    /// is, for the kernel to refuse, rather than being dropped or turned into RTA_VIA.
    #[test]
    fn add_v4_with_v6_gateway_and_src_bytes() {
        let r = route(
            "10.244.1.0/24",
            Some("fd00:1::1"),
            Some("fd00:1::2"),
            Scope::Universe,
        );
        assert_eq!(
            req(add(12, "eth0", &r)),
            [
                "54000000180005060100000000000000",         // nlmsghdr
                "02180000fe03000100000000",                 // rtmsg
                "080001000af40100",                         // RTA_DST
                "14000500fd000001000000000000000000000001", // RTA_GATEWAY
                "14000700fd000001000000000000000000000002", // RTA_PREFSRC
                "080004000c000000",                         // RTA_OIF
            ]
            .concat()
        );
    }

    #[test]
    fn add_v6_with_v4_gateway_and_src_bytes() {
        let r = route(
            "fd00:1::/64",
            Some("10.244.1.1"),
            Some("10.244.1.2"),
            Scope::Universe,
        );
        assert_eq!(
            req(add(12, "eth0", &r)),
            [
                "48000000180005060100000000000000",         // nlmsghdr
                "0a400000fe03000100000000",                 // rtmsg
                "14000100fd000001000000000000000000000000", // RTA_DST
                "080005000af40101",                         // RTA_GATEWAY
                "080007000af40102",                         // RTA_PREFSRC
                "080004000c000000",                         // RTA_OIF
            ]
            .concat()
        );
    }
}
