//! Typed link operations: create the veth pair, look links up, set them up, delete them.

use std::os::fd::RawFd;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkExtentMask, LinkFlags, LinkMessage,
};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth};

use super::error::DataplaneError;
use super::naming::GRAVEYARD_GROUP;
use super::netlink::{Conn, Req};

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
    let msg = veth_message(host_name, peer_name, peer_netns_fd, mtu, peer_mac);
    let echoed = conn
        .ack_echo(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("create veth {host_name} with peer {peer_name}"),
        )
        .await?;
    Ok(echoed.iter().find_map(|m| match m {
        RouteNetlinkMessage::NewLink(l) => {
            let link = parse_link(l);
            (link.name == host_name && link.peer_index.is_some()).then_some(link)
        }
        _ => None,
    }))
}

/// The request [`create_veth`] sends.
fn veth_message(
    host_name: &str,
    peer_name: &str,
    peer_netns_fd: RawFd,
    mtu: Option<u32>,
    peer_mac: Option<[u8; 6]>,
) -> LinkMessage {
    let mut peer = LinkUnspec::new_with_name(peer_name).setns_by_fd(peer_netns_fd);
    if let Some(mac) = peer_mac {
        peer = peer.address(mac.to_vec());
    }
    let mut host =
        LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth).name(host_name);
    if let Some(mtu) = mtu {
        peer = peer.mtu(mtu);
        host = host.mtu(mtu);
    }
    // One queue each, said explicitly: without it veth allocates one per CPU and then cuts
    // each end down to one while registered, which waits for an expedited RCU grace period
    // (synchronize_net) twice per pair, with rtnl held. The host's two go after LinkInfo,
    // appended to the built message (the builder puts LinkInfo last): the tracer reads only the
    // first 256 bytes of the request.
    let one_queue = [LinkAttribute::NumTxQueues(1), LinkAttribute::NumRxQueues(1)];
    for attr in one_queue.clone() {
        peer = peer.append_extra_attribute(attr);
    }
    let mut msg = host
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build())))
        .build();
    msg.attributes.extend(one_queue);
    msg
}

/// Sets the link `index` (named `name` in messages) up.
pub(crate) fn set_up_req(index: u32, name: &str) -> Req {
    Req::new(
        RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).up().build()),
        0,
        format!("set link {name} up"),
    )
}

/// Sets the link `index` down.
pub(crate) fn set_down_req(index: u32, name: &str) -> Req {
    Req::new(
        RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).down().build()),
        0,
        format!("set link {name} down"),
    )
}

/// Renames the (down) link `index` to `new`.
pub(crate) fn rename_req(index: u32, name: &str, new: &str) -> Req {
    Req::new(
        RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).name(new).build()),
        0,
        format!("rename link {name} to {new}"),
    )
}

/// Retires the link `index`: sets it down and moves it to the graveyard group, where the
/// reaper deletes it (one request: neither change needs the other done first).
pub(crate) fn retire_req(index: u32, name: &str) -> Req {
    let msg = LinkUnspec::new_with_index(index)
        .down()
        .link_group(GRAVEYARD_GROUP)
        .build();
    Req::new(
        RouteNetlinkMessage::SetLink(msg),
        0,
        format!("set link {name} down into the graveyard group"),
    )
}

/// Deletes every link of link group `group` at once (`ip link del group N`): the kernel
/// unregisters them in one batch, paying the RCU grace periods once for all. Returns whether
/// any link was in the group.
pub(crate) async fn delete_group(conn: &Conn, group: u32) -> Result<bool, DataplaneError> {
    match conn
        .ack(
            RouteNetlinkMessage::DelLink(delete_group_message(group)),
            0,
            &format!("delete link group {group}"),
        )
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == Some(ENODEV) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the link `index`; a link already gone counts as success.
pub(crate) async fn delete(conn: &Conn, index: u32, name: &str) -> Result<(), DataplaneError> {
    match conn
        .ack(
            RouteNetlinkMessage::DelLink(delete_message(index)),
            0,
            &format!("delete link {name}"),
        )
        .await
    {
        Err(e) if e.errno() == Some(ENODEV) => Ok(()),
        other => other,
    }
}

fn delete_group_message(group: u32) -> LinkMessage {
    LinkMessageBuilder::<LinkUnspec>::new()
        .link_group(group)
        .build()
}

fn delete_message(index: u32) -> LinkMessage {
    LinkUnspec::new_with_index(index).build()
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
    use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_ECHO, NLM_F_REQUEST};

    use super::*;
    use crate::dataplane::netlink::{req_hex as req, wire_hex};

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    /// What `create_veth` sends, with names of the longest length a link takes.
    fn veth(mtu: Option<u32>, mac: Option<[u8; 6]>) -> String {
        let msg = veth_message("h0123456789abcd", "eth0123456789ab", 7, mtu, mac);
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO | NLM_F_CREATE | NLM_F_EXCL;
        wire_hex(RouteNetlinkMessage::NewLink(msg), flags)
    }

    #[test]
    fn veth_with_mtu_and_mac_bytes() {
        assert_eq!(
            veth(Some(1450), Some(MAC)),
            [
                "b400000010000d060100000000000000",         // nlmsghdr
                "00000000000000000000000000000000",         // ifinfomsg
                "1400030068303132333435363738396162636400", // IFLA_IFNAME
                "08000400aa050000",                         // IFLA_MTU
                "68001200",                                 // IFLA_LINKINFO
                "090001007665746800000000",                 //   IFLA_INFO_KIND "veth"
                "58000200",                                 //   IFLA_INFO_DATA
                "54000100",                                 //     VETH_INFO_PEER
                "00000000000000000000000000000000",         //     ifinfomsg
                "1400030065746830313233343536373839616200", //     IFLA_IFNAME
                "08001c0007000000",                         //     IFLA_NET_NS_FD
                "0a0001000211223344550000",                 //     IFLA_ADDRESS
                "08000400aa050000",                         //     IFLA_MTU
                "08001f0001000000",                         //     IFLA_NUM_TX_QUEUES
                "0800200001000000",                         //     IFLA_NUM_RX_QUEUES
                "08001f0001000000",                         // IFLA_NUM_TX_QUEUES
                "0800200001000000",                         // IFLA_NUM_RX_QUEUES
            ]
            .concat()
        );
    }

    #[test]
    fn veth_with_mtu_bytes() {
        assert_eq!(
            veth(Some(1450), None),
            [
                "a800000010000d060100000000000000",         // nlmsghdr
                "00000000000000000000000000000000",         // ifinfomsg
                "1400030068303132333435363738396162636400", // IFLA_IFNAME
                "08000400aa050000",                         // IFLA_MTU
                "5c001200",                                 // IFLA_LINKINFO
                "090001007665746800000000",                 //   IFLA_INFO_KIND "veth"
                "4c000200",                                 //   IFLA_INFO_DATA
                "48000100",                                 //     VETH_INFO_PEER
                "00000000000000000000000000000000",         //     ifinfomsg
                "1400030065746830313233343536373839616200", //     IFLA_IFNAME
                "08001c0007000000",                         //     IFLA_NET_NS_FD
                "08000400aa050000",                         //     IFLA_MTU
                "08001f0001000000",                         //     IFLA_NUM_TX_QUEUES
                "0800200001000000",                         //     IFLA_NUM_RX_QUEUES
                "08001f0001000000",                         // IFLA_NUM_TX_QUEUES
                "0800200001000000",                         // IFLA_NUM_RX_QUEUES
            ]
            .concat()
        );
    }

    #[test]
    fn veth_with_mac_bytes() {
        assert_eq!(
            veth(None, Some(MAC)),
            [
                "a400000010000d060100000000000000",         // nlmsghdr
                "00000000000000000000000000000000",         // ifinfomsg
                "1400030068303132333435363738396162636400", // IFLA_IFNAME
                "60001200",                                 // IFLA_LINKINFO
                "090001007665746800000000",                 //   IFLA_INFO_KIND "veth"
                "50000200",                                 //   IFLA_INFO_DATA
                "4c000100",                                 //     VETH_INFO_PEER
                "00000000000000000000000000000000",         //     ifinfomsg
                "1400030065746830313233343536373839616200", //     IFLA_IFNAME
                "08001c0007000000",                         //     IFLA_NET_NS_FD
                "0a0001000211223344550000",                 //     IFLA_ADDRESS
                "08001f0001000000",                         //     IFLA_NUM_TX_QUEUES
                "0800200001000000",                         //     IFLA_NUM_RX_QUEUES
                "08001f0001000000",                         // IFLA_NUM_TX_QUEUES
                "0800200001000000",                         // IFLA_NUM_RX_QUEUES
            ]
            .concat()
        );
    }

    #[test]
    fn veth_bare_bytes() {
        assert_eq!(
            veth(None, None),
            [
                "9800000010000d060100000000000000",         // nlmsghdr
                "00000000000000000000000000000000",         // ifinfomsg
                "1400030068303132333435363738396162636400", // IFLA_IFNAME
                "54001200",                                 // IFLA_LINKINFO
                "090001007665746800000000",                 //   IFLA_INFO_KIND "veth"
                "44000200",                                 //   IFLA_INFO_DATA
                "40000100",                                 //     VETH_INFO_PEER
                "00000000000000000000000000000000",         //     ifinfomsg
                "1400030065746830313233343536373839616200", //     IFLA_IFNAME
                "08001c0007000000",                         //     IFLA_NET_NS_FD
                "08001f0001000000",                         //     IFLA_NUM_TX_QUEUES
                "0800200001000000",                         //     IFLA_NUM_RX_QUEUES
                "08001f0001000000",                         // IFLA_NUM_TX_QUEUES
                "0800200001000000",                         // IFLA_NUM_RX_QUEUES
            ]
            .concat()
        );
    }

    #[test]
    fn set_up_bytes() {
        assert_eq!(
            req(set_up_req(12, "h1")),
            [
                "20000000130005000100000000000000", // nlmsghdr
                "000000000c0000000100000001000000", // ifinfomsg
            ]
            .concat()
        );
    }

    #[test]
    fn set_down_bytes() {
        assert_eq!(
            req(set_down_req(12, "h1")),
            [
                "20000000130005000100000000000000", // nlmsghdr
                "000000000c0000000000000001000000", // ifinfomsg
            ]
            .concat()
        );
    }

    #[test]
    fn rename_bytes() {
        assert_eq!(
            req(rename_req(12, "eth0", "gy12")),
            [
                "2c000000130005000100000000000000", // nlmsghdr
                "000000000c0000000000000000000000", // ifinfomsg
                "090003006779313200000000",         // IFLA_IFNAME
            ]
            .concat()
        );
    }

    #[test]
    fn retire_bytes() {
        assert_eq!(
            req(retire_req(12, "h1")),
            [
                "28000000130005000100000000000000", // nlmsghdr
                "000000000c0000000000000001000000", // ifinfomsg
                "08001b0078767000",                 // IFLA_GROUP
            ]
            .concat()
        );
    }

    #[test]
    fn delete_group_bytes() {
        assert_eq!(
            wire_hex(
                RouteNetlinkMessage::DelLink(delete_group_message(GRAVEYARD_GROUP)),
                NLM_F_REQUEST | NLM_F_ACK
            ),
            [
                "28000000110005000100000000000000", // nlmsghdr
                "00000000000000000000000000000000", // ifinfomsg
                "08001b0078767000",                 // IFLA_GROUP
            ]
            .concat()
        );
    }

    #[test]
    fn delete_bytes() {
        assert_eq!(
            wire_hex(
                RouteNetlinkMessage::DelLink(delete_message(12)),
                NLM_F_REQUEST | NLM_F_ACK
            ),
            [
                "20000000110005000100000000000000", // nlmsghdr
                "000000000c0000000000000000000000", // ifinfomsg
            ]
            .concat()
        );
    }

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
