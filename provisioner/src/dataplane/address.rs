//! Typed address operations: list a link's addresses, delete one (the requests are
//! provisioner-netlink's).

use ipnetwork::IpNetwork;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use provisioner_netlink as req;

use super::error::DataplaneError;
use super::netlink::Conn;

/// An address found on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Addr {
    pub net: IpNetwork,
    pub flags: AddressFlags,
    pub link_local: bool,
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
    let req = req::address::del(index, ifname, net);
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
