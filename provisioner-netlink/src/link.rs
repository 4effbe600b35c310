//! Link requests: create the veth pair, set links up or down, rename, retire and delete them.

use std::os::fd::RawFd;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkMessage};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth};

use crate::Req;

/// Creates the veth pair `host_name` (in the socket's netns) <-> `peer_name` created directly in
/// the netns `peer_netns_fd`, both with `mtu`, both down, the peer with `peer_mac` if given.
#[must_use]
pub fn veth(
    host_name: &str,
    peer_name: &str,
    peer_netns_fd: RawFd,
    mtu: Option<u32>,
    peer_mac: Option<[u8; 6]>,
) -> Req {
    Req::new(
        RouteNetlinkMessage::NewLink(veth_message(
            host_name,
            peer_name,
            peer_netns_fd,
            mtu,
            peer_mac,
        )),
        NLM_F_CREATE | NLM_F_EXCL,
        format!("create veth {host_name} with peer {peer_name}"),
    )
}

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
#[must_use]
pub fn set_up(index: u32, name: &str) -> Req {
    Req::new(
        RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).up().build()),
        0,
        format!("set link {name} up"),
    )
}

/// Sets the link `index` down.
#[must_use]
pub fn set_down(index: u32, name: &str) -> Req {
    Req::new(
        RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).down().build()),
        0,
        format!("set link {name} down"),
    )
}

/// Renames the (down) link `index` to `new`.
#[must_use]
pub fn rename(index: u32, name: &str, new: &str) -> Req {
    Req::new(
        RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).name(new).build()),
        0,
        format!("rename link {name} to {new}"),
    )
}

/// Retires the link `index`: sets it down and moves it to link group `graveyard`, where a reaper
/// deletes it (one request: neither change needs the other done first).
#[must_use]
pub fn retire(index: u32, name: &str, graveyard: u32) -> Req {
    let msg = LinkUnspec::new_with_index(index)
        .down()
        .link_group(graveyard)
        .build();
    Req::new(
        RouteNetlinkMessage::SetLink(msg),
        0,
        format!("set link {name} down into the graveyard group"),
    )
}

/// Deletes every link of link group `group` at once (`ip link del group N`).
#[must_use]
pub fn delete_group(group: u32) -> Req {
    let msg = LinkMessageBuilder::<LinkUnspec>::new()
        .link_group(group)
        .build();
    Req::new(
        RouteNetlinkMessage::DelLink(msg),
        0,
        format!("delete link group {group}"),
    )
}

/// Deletes the link `index` (named `name` in messages).
#[must_use]
pub fn delete(index: u32, name: &str) -> Req {
    Req::new(
        RouteNetlinkMessage::DelLink(LinkUnspec::new_with_index(index).build()),
        0,
        format!("delete link {name}"),
    )
}

/// The bytes the kernel receives for each request, header and attributes in order (the netlink
/// header with sequence number 1).
#[cfg(test)]
mod tests {
    use netlink_packet_core::{NLM_F_ACK, NLM_F_ECHO, NLM_F_REQUEST};

    use super::*;
    use crate::{req_hex as req, wire_hex};

    /// The link group of retired links in the provisioner.
    const GRAVEYARD: u32 = 0x0070_7678;

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    /// What creating a veth sends (echo asked for), with names of the longest length a link
    /// takes.
    fn veth_hex(mtu: Option<u32>, mac: Option<[u8; 6]>) -> String {
        let req = veth("h0123456789abcd", "eth0123456789ab", 7, mtu, mac);
        wire_hex(req.msg, NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO | req.flags)
    }

    #[test]
    fn veth_with_mtu_and_mac_bytes() {
        assert_eq!(
            veth_hex(Some(1450), Some(MAC)),
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
            veth_hex(Some(1450), None),
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
            veth_hex(None, Some(MAC)),
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
            veth_hex(None, None),
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
            req(set_up(12, "h1")),
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
            req(set_down(12, "h1")),
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
            req(rename(12, "eth0", "gy12")),
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
            req(retire(12, "h1", GRAVEYARD)),
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
            req(delete_group(GRAVEYARD)),
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
            req(delete(12, "h1")),
            [
                "20000000110005000100000000000000", // nlmsghdr
                "000000000c0000000000000000000000", // ifinfomsg
            ]
            .concat()
        );
    }
}
