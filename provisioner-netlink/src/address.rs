//! Address requests: add and delete a link's addresses.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::Req;

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
#[must_use]
pub fn add(index: u32, ifname: &str, net: IpNetwork, no_prefix_route: bool) -> Req {
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

/// Deletes `net` from link `index`; the provisioner counts an address already gone as deleted.
#[must_use]
pub fn del(index: u32, ifname: &str, net: IpNetwork) -> Req {
    Req::new(
        RouteNetlinkMessage::DelAddress(message(index, net)),
        0,
        format!("delete address {net} from {ifname}"),
    )
}

/// The bytes the kernel receives for each request, header and attributes in order (the netlink
/// header with sequence number 1).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::req_hex as req;

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("test cidr")
    }

    #[test]
    fn add_v4_bytes() {
        assert_eq!(
            req(add(12, "h1", net("10.244.1.2/24"), false)),
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
            req(add(12, "eth0", net("10.244.1.2/32"), true)),
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
            req(add(12, "h1", net("fd00:1::2/64"), false)),
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
            req(add(12, "eth0", net("fd00:1::2/128"), true)),
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
            req(del(12, "h1", net("10.244.1.2/24"))),
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
            req(del(12, "h1", net("fd00:1::2/64"))),
            [
                "2c000000150005000100000000000000",         // nlmsghdr
                "0a4000000c000000",                         // ifaddrmsg
                "14000100fd000001000000000000000000000002", // IFA_ADDRESS
            ]
            .concat()
        );
    }
}
