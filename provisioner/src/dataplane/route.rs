//! Typed route operations: dumps, FIB lookups, deletes (the requests that change routes, and
//! the route model shared by planning and checking, are provisioner-netlink's).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use provisioner_netlink as req;
pub use provisioner_netlink::route::{Route, Scope};

use super::error::DataplaneError;
use super::netlink::Conn;

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
    let req = req::route::del(oif, ifname, route);
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
