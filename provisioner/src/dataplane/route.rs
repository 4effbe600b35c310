//! Typed route operations and the route model shared by planning and checking.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::RouteMessageBuilder;

use super::error::DataplaneError;
use super::netlink::{Conn, Req};

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

/// A route the kernel answered with: from a dump of the main table, or the entry a FIB lookup
/// ended in (whatever its table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoundRoute {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub msg: RouteMessage,
}

/// `blackhole 10.1.0.0/16 table 77`, `unicast 10.1.0.5/32 via 10.1.0.1 oif 12 table 254`.
impl fmt::Display for FoundRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = format!("{:?}", self.msg.header.kind).to_lowercase();
        write!(f, "{kind} {}", self.dst)?;
        if let Some(gw) = self.gw {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " oif {oif}")?;
        }
        let table = self
            .msg
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or_else(|| u32::from(self.msg.header.table));
        write!(f, " table {table}")
    }
}

impl FoundRoute {
    /// Does this kernel route implement `want` through link `oif`?
    pub(crate) fn matches(&self, want: &Route, oif: u32) -> bool {
        self.dst == want.dst && self.gw == want.gw && self.oif == Some(oif)
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
pub(crate) fn add_req(oif: u32, ifname: &str, route: &Route) -> Req {
    Req::new(
        RouteNetlinkMessage::NewRoute(message(oif, route)),
        NLM_F_CREATE | NLM_F_EXCL,
        format!("add route {route} dev {ifname}"),
    )
}

/// Deletes `route` through link `oif`; pass the result through [`del_result`].
pub(crate) fn del_req(oif: u32, ifname: &str, route: &Route) -> Req {
    Req::new(
        RouteNetlinkMessage::DelRoute(message(oif, route)),
        0,
        format!("delete route {route} dev {ifname}"),
    )
}

/// A route already gone counts as deleted.
pub(crate) fn del_result(res: Result<(), DataplaneError>) -> Result<(), DataplaneError> {
    match res {
        Err(e) if matches!(e.errno(), Some(libc::ESRCH | libc::ENODEV)) => Ok(()),
        other => other,
    }
}

/// Deletes `route` through link `oif`; a route already gone counts as success.
pub(crate) async fn del(
    conn: &Conn,
    oif: u32,
    ifname: &str,
    route: &Route,
) -> Result<(), DataplaneError> {
    let req = del_req(oif, ifname, route);
    del_result(conn.ack(req.msg, req.flags, &req.op).await)
}

fn addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The unicast routes of the main table through link `oif`, IPv4 and / or IPv6 (one dump per
/// family asked for). The kernel filters on table and output interface (strict checking on the
/// socket): only those routes cross the socket.
pub(crate) async fn list_main_via_families(
    conn: &Conn,
    oif: u32,
    v4: bool,
    v6: bool,
) -> Result<Vec<FoundRoute>, DataplaneError> {
    let routes = list_main_filtered(conn, Some(oif), v4, v6).await?;
    Ok(routes.into_iter().filter(|r| r.oif == Some(oif)).collect())
}

/// Every unicast route of the main table (both families).
pub(crate) async fn list_main(conn: &Conn) -> Result<Vec<FoundRoute>, DataplaneError> {
    list_main_filtered(conn, None, true, true).await
}

async fn list_main_filtered(
    conn: &Conn,
    oif: Option<u32>,
    v4: bool,
    v6: bool,
) -> Result<Vec<FoundRoute>, DataplaneError> {
    let mut out = Vec::new();
    let families = [(v4, AddressFamily::Inet), (v6, AddressFamily::Inet6)];
    for family in families
        .into_iter()
        .filter(|(asked, _)| *asked)
        .map(|(_, f)| f)
    {
        // Hand-built: RouteMessageBuilder's protocol (static) and type would filter a strict dump.
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        req.header.table = RouteHeader::RT_TABLE_MAIN;
        let what = match oif {
            Some(oif) => {
                req.attributes.push(RouteAttribute::Oif(oif));
                format!("list {family:?} routes of link {oif}")
            }
            None => format!("list {family:?} routes"),
        };
        let msgs = match conn.dump(RouteNetlinkMessage::GetRoute(req), &what).await {
            Ok(msgs) => msgs,
            // The kernel ends a dump of a table it has not created yet (no route of the family
            // in the netns so far) with ENOENT, and one filtered on a link that is gone with
            // ENODEV: no routes.
            Err(e) if e.errno() == Some(libc::ENOENT) => Vec::new(),
            Err(e) if oif.is_some() && e.errno() == Some(libc::ENODEV) => Vec::new(),
            Err(e) => return Err(e),
        };
        out.extend(msgs.into_iter().filter_map(parse_main));
    }
    Ok(out)
}

/// What the kernel's FIB holds for the host route `dst` (`ip route get <dst> fibmatch`):
/// one lookup, independent of the size of the table; `Ok(None)` when nothing routes it.
pub(crate) async fn fib_match(
    conn: &Conn,
    dst: IpNetwork,
) -> Result<Option<FoundRoute>, DataplaneError> {
    // Hand-built: RouteMessageBuilder presets table, protocol and type, which a strict get refuses.
    let mut req = RouteMessage::default();
    req.header.address_family = if dst.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    req.header.destination_prefix_length = dst.prefix();
    // IPv4 answers name the table the lookup ended in only with LookupTable (else always
    // main); IPv6 ones always do, and IPv6 refuses the flag.
    req.header.flags = if dst.is_ipv4() {
        RouteFlags::FibMatch | RouteFlags::LookupTable
    } else {
        RouteFlags::FibMatch
    };
    req.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst.ip())));
    match conn
        .get(
            RouteNetlinkMessage::GetRoute(req),
            &format!("look up route to {dst}"),
        )
        .await
    {
        Ok(RouteNetlinkMessage::NewRoute(m)) => Ok(parse_any(m)),
        Ok(other) => Err(DataplaneError::Protocol {
            op: format!("look up route to {dst}"),
            netns: conn.netns().to_owned(),
            detail: format!("unexpected answer {other:?}"),
        }),
        Err(e)
            if matches!(
                e.errno(),
                Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ESRCH)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn parse_main(m: RouteNetlinkMessage) -> Option<FoundRoute> {
    let RouteNetlinkMessage::NewRoute(m) = m else {
        return None;
    };
    let table = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) || m.header.kind != RouteType::Unicast {
        return None;
    }
    parse_any(m)
}

fn parse_any(m: RouteMessage) -> Option<FoundRoute> {
    let mut dst = None;
    let mut gw = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = addr(d),
            RouteAttribute::Gateway(g) => gw = addr(g),
            RouteAttribute::Oif(o) => oif = Some(*o),
            _ => {}
        }
    }
    let base = dst.unwrap_or(if m.header.address_family == AddressFamily::Inet6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    });
    let dst = IpNetwork::new(base, m.header.destination_prefix_length).ok()?;
    Some(FoundRoute {
        dst,
        gw,
        oif,
        msg: m,
    })
}

/// The bytes the kernel receives for each request, header and attributes in order (the netlink
/// header with sequence number 1).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::netlink::req_hex as req;

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
            req(add_req(
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
            req(add_req(
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
            req(add_req(
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
            req(add_req(
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
            req(add_req(
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
            req(add_req(
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
            req(add_req(
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
            req(add_req(
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
            req(del_req(
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
            req(del_req(
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
            req(add_req(12, "eth0", &r)),
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
            req(add_req(12, "eth0", &r)),
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
