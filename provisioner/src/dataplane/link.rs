//! Typed link operations: create the veth pair, look links up, delete them (the requests are
//! provisioner-netlink's).

use std::os::fd::RawFd;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkExtentMask, LinkFlags, LinkMessage};
use provisioner_netlink::{self as req, Req};
use rtnetlink::{LinkMessageBuilder, LinkUnspec};

use super::error::DataplaneError;
use super::naming::GRAVEYARD_GROUP;
use super::netlink::Conn;

pub(crate) const ENODEV: i32 = libc::ENODEV;

/// What we need to know of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub index: u32,
    pub name: String,
    pub mac: String,
    pub mtu: Option<u32>,
    pub up: bool,
    /// `IFLA_LINK`: for a veth, the peer's index (in the peer's netns).
    pub peer_index: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the nsid (in this netns) of the peer's netns, when it is another.
    pub peer_netnsid: Option<i32>,
    /// In the graveyard group: retired by a teardown, waiting for the reaper.
    pub retired: bool,
}

/// Formats a hardware address as `aa:bb:cc:dd:ee:ff`.
pub(crate) fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn parse_link(msg: &LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mac: String::new(),
        mtu: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        peer_index: None,
        peer_netnsid: None,
        retired: false,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name.clone_from(n),
            LinkAttribute::Address(a) => link.mac = format_mac(a),
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            LinkAttribute::Link(l) => link.peer_index = Some(*l),
            LinkAttribute::LinkNetNsId(id) => link.peer_netnsid = Some(*id),
            LinkAttribute::Group(group) => link.retired = *group == GRAVEYARD_GROUP,
            _ => {}
        }
    }
    link
}

/// A link request without the statistics nobody here reads: the kernel skips summing the
/// per-CPU counters of the link and of its IPv6 state (a quarter of a veth's dump message, and
/// of the kernel's time filling it).
fn get_link_request() -> LinkMessageBuilder<LinkUnspec> {
    LinkMessageBuilder::<LinkUnspec>::new()
        .append_extra_attribute(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]))
}

fn by_name_message(name: &str) -> LinkMessage {
    get_link_request().name(name).build()
}

/// Looks a link up by name; `Ok(None)` when it does not exist.
pub(crate) async fn by_name(conn: &Conn, name: &str) -> Result<Option<Link>, DataplaneError> {
    match conn
        .get(
            RouteNetlinkMessage::GetLink(by_name_message(name)),
            &format!("get link {name}"),
        )
        .await
    {
        Ok(RouteNetlinkMessage::NewLink(m)) => Ok(Some(parse_link(&m))),
        Ok(other) => Err(DataplaneError::Protocol {
            op: format!("get link {name}"),
            netns: conn.netns().to_owned(),
            detail: format!("unexpected answer {other:?}"),
        }),
        Err(e) if e.errno() == Some(ENODEV) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A random locally administered unicast MAC address; `None` if the kernel gives no randomness.
pub(crate) fn random_mac() -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    // SAFETY: getrandom writes at most `mac.len()` bytes into `mac`.
    let n = unsafe { libc::getrandom(mac.as_mut_ptr().cast(), mac.len(), 0) };
    if usize::try_from(n).ok() != Some(mac.len()) {
        return None;
    }
    mac[0] = (mac[0] & 0xfe) | 0x02;
    Some(mac)
}

/// Creates the veth pair `host_name` (in `conn`'s netns) <-> `peer_name` created directly in the
/// netns `peer_netns_fd`, both with `mtu`, both down, the peer with `peer_mac` if given. Returns
/// the host link as the kernel echoed it (with the peer's index in `peer_index`), or `None` when
/// the kernel echoes nothing (Linux < 6.3): then look both ends up.
pub(crate) async fn create_veth(
    conn: &Conn,
    host_name: &str,
    peer_name: &str,
    peer_netns_fd: RawFd,
    mtu: Option<u32>,
    peer_mac: Option<[u8; 6]>,
) -> Result<Option<Link>, DataplaneError> {
    let Req { msg, flags, op } =
        req::link::veth(host_name, peer_name, peer_netns_fd, mtu, peer_mac);
    let echoed = conn.ack_echo(msg, flags, &op).await?;
    Ok(echoed.iter().find_map(|m| match m {
        RouteNetlinkMessage::NewLink(l) => {
            let link = parse_link(l);
            (link.name == host_name && link.peer_index.is_some()).then_some(link)
        }
        _ => None,
    }))
}

/// Deletes every link of link group `group` at once (`ip link del group N`): the kernel
/// unregisters them in one batch, paying the RCU grace periods once for all. Returns whether
/// any link was in the group.
pub(crate) async fn delete_group(conn: &Conn, group: u32) -> Result<bool, DataplaneError> {
    let Req { msg, flags, op } = req::link::delete_group(group);
    match conn.ack(msg, flags, &op).await {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == Some(ENODEV) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the link `index`; a link already gone counts as success.
pub(crate) async fn delete(conn: &Conn, index: u32, name: &str) -> Result<(), DataplaneError> {
    let Req { msg, flags, op } = req::link::delete(index, name);
    match conn.ack(msg, flags, &op).await {
        Err(e) if e.errno() == Some(ENODEV) => Ok(()),
        other => other,
    }
}

/// Every link in `conn`'s netns.
pub(crate) async fn all(conn: &Conn) -> Result<Vec<Link>, DataplaneError> {
    let replies = conn
        .dump(
            RouteNetlinkMessage::GetLink(get_link_request().build()),
            "list links",
        )
        .await?;
    Ok(replies
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) => Some(parse_link(link)),
            _ => None,
        })
        .collect())
}

/// The bytes the kernel receives for each request, header and attributes in order (the netlink
/// header with sequence number 1).
#[cfg(test)]
mod tests {
    use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};
    use provisioner_netlink::wire_hex;

    use super::*;

    #[test]
    fn get_by_name_bytes() {
        assert_eq!(
            wire_hex(
                RouteNetlinkMessage::GetLink(by_name_message("eth0")),
                NLM_F_REQUEST
            ),
            [
                "34000000120001000100000000000000", // nlmsghdr
                "00000000000000000000000000000000", // ifinfomsg
                "08001d0008000000",                 // IFLA_EXT_MASK
                "090003006574683000000000",         // IFLA_IFNAME
            ]
            .concat()
        );
    }

    #[test]
    fn dump_all_bytes() {
        assert_eq!(
            wire_hex(
                RouteNetlinkMessage::GetLink(get_link_request().build()),
                NLM_F_REQUEST | NLM_F_DUMP
            ),
            [
                "28000000120001030100000000000000", // nlmsghdr
                "00000000000000000000000000000000", // ifinfomsg
                "08001d0008000000",                 // IFLA_EXT_MASK
            ]
            .concat()
        );
    }
}
