//! Typed address operations.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::error::DataplaneError;
use super::netlink::{Conn, Req};

/// An address found on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Addr {
    pub net: IpNetwork,
    pub flags: AddressFlags,
    pub link_local: bool,
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

// Hand-built: AddressMessageBuilder adds IFA_BROADCAST to IPv4 (below /31), IFA_LOCAL to IPv6.
fn message(index: u32, net: IpNetwork) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = family(net.ip());
    msg.header.prefix_len = net.prefix();
    msg.header.index = index;
    msg.header.scope = AddressScope::Universe;
    if net.is_ipv4() {
        msg.attributes.push(AddressAttribute::Local(net.ip()));
    }
    msg.attributes.push(AddressAttribute::Address(net.ip()));
    msg
}

/// Adds `net` to link `index`. IPv6 addresses get `IFA_F_NODAD` (nothing left tentative);
/// `no_prefix_route` keeps the kernel from adding the connected prefix route.
pub(crate) fn add_req(index: u32, ifname: &str, net: IpNetwork, no_prefix_route: bool) -> Req {
    let mut msg = message(index, net);
    let mut flags = AddressFlags::empty();
    if net.is_ipv6() {
        flags |= AddressFlags::Nodad;
        msg.header.flags = AddressHeaderFlags::Nodad;
    }
    if no_prefix_route {
        flags |= AddressFlags::Noprefixroute;
    }
    if !flags.is_empty() {
        msg.attributes.push(AddressAttribute::Flags(flags));
    }
    Req::new(
        RouteNetlinkMessage::NewAddress(msg),
        NLM_F_CREATE | NLM_F_EXCL,
        format!("add address {net} to {ifname}"),
    )
}

/// Deletes `net` from link `index`; pass the result through [`del_result`].
pub(crate) fn del_req(index: u32, ifname: &str, net: IpNetwork) -> Req {
    Req::new(
        RouteNetlinkMessage::DelAddress(message(index, net)),
        0,
        format!("delete address {net} from {ifname}"),
    )
}

/// An address already gone counts as deleted.
pub(crate) fn del_result(res: Result<(), DataplaneError>) -> Result<(), DataplaneError> {
    match res {
        Err(e) if matches!(e.errno(), Some(libc::EADDRNOTAVAIL | libc::ENODEV)) => Ok(()),
        other => other,
    }
}

/// Deletes `net` from link `index`; an address already gone counts as success.
pub(crate) async fn del(
    conn: &Conn,
    index: u32,
    ifname: &str,
    net: IpNetwork,
) -> Result<(), DataplaneError> {
    let req = del_req(index, ifname, net);
    del_result(conn.ack(req.msg, req.flags, &req.op).await)
}

/// Lists the addresses of link `index` (both families). The socket's strict checking makes the
/// kernel send only that link's addresses (the cost does not grow with other links).
pub(crate) async fn list(
    conn: &Conn,
    index: u32,
    ifname: &str,
) -> Result<Vec<Addr>, DataplaneError> {
    // Hand-built, as in `all`: AddressMessageBuilder sets a family, and these dumps ask for both.
    let mut req = AddressMessage::default();
    req.header.index = index;
    let msgs = match conn
        .dump(
            RouteNetlinkMessage::GetAddress(req),
            &format!("list addresses of {ifname}"),
        )
        .await
    {
        Ok(msgs) => msgs,
        // The kernel ends a dump filtered on a link that is gone (e.g. deleted with its netns
        // meanwhile) with ENODEV: such a link holds no address.
        Err(e) if e.errno() == Some(libc::ENODEV) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(parse_all(msgs)
        .into_iter()
        .filter(|(i, _)| *i == index)
        .map(|(_, a)| a)
        .collect())
}

/// Every address of `conn`'s netns, with the index of its link.
pub(crate) async fn all(conn: &Conn) -> Result<Vec<(u32, Addr)>, DataplaneError> {
    let msgs = conn
        .dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            "list addresses",
        )
        .await?;
    Ok(parse_all(msgs))
}

fn parse_all(msgs: Vec<RouteNetlinkMessage>) -> Vec<(u32, Addr)> {
    let mut out = Vec::new();
    for m in msgs {
        let RouteNetlinkMessage::NewAddress(m) = m else {
            continue;
        };
        let mut ip = None;
        let mut local = None;
        let mut flags = AddressFlags::from_bits_retain(u32::from(m.header.flags.bits()));
        for a in &m.attributes {
            match a {
                AddressAttribute::Address(a) => ip = Some(*a),
                AddressAttribute::Local(a) => local = Some(*a),
                AddressAttribute::Flags(f) => flags = *f,
                _ => {}
            }
        }
        // IPv4: IFA_LOCAL is the interface address (IFA_ADDRESS is the peer on p2p links).
        let Some(ip) = local.or(ip) else { continue };
        let Ok(net) = IpNetwork::new(ip, m.header.prefix_len) else {
            continue;
        };
        out.push((
            m.header.index,
            Addr {
                net,
                flags,
                link_local: m.header.scope == AddressScope::Link,
            },
        ));
    }
    out
}

/// The bytes the kernel receives for each request, header and attributes in order (the netlink
/// header with sequence number 1).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::netlink::req_hex as req;

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("test cidr")
    }

    #[test]
    fn add_v4_bytes() {
        assert_eq!(
            req(add_req(12, "h1", net("10.244.1.2/24"), false)),
            [
                "28000000140005060100000000000000", // nlmsghdr
                "021800000c000000",                 // ifaddrmsg
                "080002000af40102",                 // IFA_LOCAL
                "080001000af40102",                 // IFA_ADDRESS
            ]
            .concat()
        );
    }

    #[test]
    fn add_v4_no_prefix_route_bytes() {
        assert_eq!(
            req(add_req(12, "eth0", net("10.244.1.2/32"), true)),
            [
                "30000000140005060100000000000000", // nlmsghdr
                "022000000c000000",                 // ifaddrmsg
                "080002000af40102",                 // IFA_LOCAL
                "080001000af40102",                 // IFA_ADDRESS
                "0800080000020000",                 // IFA_FLAGS
            ]
            .concat()
        );
    }

    #[test]
    fn add_v6_bytes() {
        assert_eq!(
            req(add_req(12, "h1", net("fd00:1::2/64"), false)),
            [
                "34000000140005060100000000000000",         // nlmsghdr
                "0a4002000c000000",                         // ifaddrmsg
                "14000100fd000001000000000000000000000002", // IFA_ADDRESS
                "0800080002000000",                         // IFA_FLAGS
            ]
            .concat()
        );
    }

    #[test]
    fn add_v6_no_prefix_route_bytes() {
        assert_eq!(
            req(add_req(12, "eth0", net("fd00:1::2/128"), true)),
            [
                "34000000140005060100000000000000",         // nlmsghdr
                "0a8002000c000000",                         // ifaddrmsg
                "14000100fd000001000000000000000000000002", // IFA_ADDRESS
                "0800080002020000",                         // IFA_FLAGS
            ]
            .concat()
        );
    }

    #[test]
    fn del_v4_bytes() {
        assert_eq!(
            req(del_req(12, "h1", net("10.244.1.2/24"))),
            [
                "28000000150005000100000000000000", // nlmsghdr
                "021800000c000000",                 // ifaddrmsg
                "080002000af40102",                 // IFA_LOCAL
                "080001000af40102",                 // IFA_ADDRESS
            ]
            .concat()
        );
    }

    #[test]
    fn del_v6_bytes() {
        assert_eq!(
            req(del_req(12, "h1", net("fd00:1::2/64"))),
            [
                "2c000000150005000100000000000000",         // nlmsghdr
                "0a4000000c000000",                         // ifaddrmsg
                "14000100fd000001000000000000000000000002", // IFA_ADDRESS
            ]
            .concat()
        );
    }
}
