//! A small, bounded parser for the first bytes of rtnetlink messages copied by the kernel side.
//!
//! The eBPF programs copy at most 256 bytes of a request or reply, so messages are often cut
//! short. netlink-packet-route's parsers reject a buffer shorter than `nlmsg_len`; this parser
//! reads whatever is complete and marks the rest as truncated instead of failing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use provisioner_common::NLMSG_ERROR;
pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_SETLINK: u16 = 19;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_DELROUTE: u16 = 25;

pub const IFF_UP: u32 = 1;
pub const NLM_F_ACK_TLVS: u16 = 0x200;
pub const NLM_F_CAPPED: u16 = 0x100;

const NLMSG_HDRLEN: usize = 16;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_PID: u16 = 19;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_TARGET_NETNSID: u16 = 46;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_TABLE: u16 = 15;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// `struct nlmsghdr`
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NlHeader {
    pub len: u32,
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub port: u32,
}

/// Where a link is sent (`IFLA_NET_NS_FD`, `IFLA_NET_NS_PID`, `IFLA_TARGET_NETNSID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetnsTarget {
    Fd(u32),
    Pid(u32),
    Id(i32),
}

/// The peer of a veth being created (`IFLA_INFO_DATA` / `VETH_INFO_PEER`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkPeer {
    pub ifname: Option<String>,
    pub netns: Option<NetnsTarget>,
}

/// RTM_NEWLINK / RTM_DELLINK / RTM_SETLINK
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkMsg {
    pub ifindex: i32,
    pub flags: u32,
    pub change: u32,
    pub ifname: Option<String>,
    pub kind: Option<String>,
    pub mtu: Option<u32>,
    pub netns: Option<NetnsTarget>,
    pub peer: Option<LinkPeer>,
}

impl LinkMsg {
    /// The request brings the link up (`ifi_change == 0` counts as "all flags", as in the kernel).
    pub fn sets_up(&self) -> bool {
        self.flags & IFF_UP != 0 && (self.change == 0 || self.change & IFF_UP != 0)
    }

    /// The request takes the link down.
    pub fn sets_down(&self) -> bool {
        self.flags & IFF_UP == 0 && self.change & IFF_UP != 0
    }
}

/// RTM_NEWADDR / RTM_DELADDR
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AddrMsg {
    pub family: u8,
    pub prefix_len: u8,
    pub ifindex: u32,
    pub address: Option<IpAddr>,
    pub local: Option<IpAddr>,
}

impl AddrMsg {
    /// The interface address (`IFA_LOCAL` when present, as the kernel uses it for IPv4).
    pub fn addr(&self) -> Option<IpAddr> {
        self.local.or(self.address)
    }
}

/// RTM_NEWROUTE / RTM_DELROUTE
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteMsg {
    pub family: u8,
    pub dst_len: u8,
    pub table: u32,
    pub protocol: u8,
    pub scope: u8,
    pub route_type: u8,
    pub dst: Option<IpAddr>,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub prefsrc: Option<IpAddr>,
}

impl RouteMsg {
    /// A default route (`0.0.0.0/0` or `::/0`) in the main table.
    pub fn is_default(&self) -> bool {
        self.dst_len == 0 && matches!(self.table, 0 | 254)
    }
}

/// The body of one rtnetlink request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RtRequest {
    NewLink(LinkMsg),
    DelLink(LinkMsg),
    SetLink(LinkMsg),
    NewAddr(AddrMsg),
    DelAddr(AddrMsg),
    NewRoute(RouteMsg),
    DelRoute(RouteMsg),
    /// Any other message type (dumps, neighbours, rules...).
    Other {
        msg_type: u16,
    },
}

impl RtRequest {
    /// Short operation name.
    pub fn op(&self) -> &'static str {
        op_name(match self {
            Self::NewLink(_) => RTM_NEWLINK,
            Self::DelLink(_) => RTM_DELLINK,
            Self::SetLink(_) => RTM_SETLINK,
            Self::NewAddr(_) => RTM_NEWADDR,
            Self::DelAddr(_) => RTM_DELADDR,
            Self::NewRoute(_) => RTM_NEWROUTE,
            Self::DelRoute(_) => RTM_DELROUTE,
            Self::Other { msg_type } => *msg_type,
        })
    }

    /// True for requests that change configuration (not dumps or gets).
    pub fn is_change(&self) -> bool {
        !matches!(self, Self::Other { .. })
    }
}

/// True for the message types that change links, addresses or routes.
pub fn is_change_type(msg_type: u16) -> bool {
    matches!(
        msg_type,
        RTM_NEWLINK
            | RTM_DELLINK
            | RTM_SETLINK
            | RTM_NEWADDR
            | RTM_DELADDR
            | RTM_NEWROUTE
            | RTM_DELROUTE
    )
}

/// Name of an rtnetlink message type.
pub fn op_name(msg_type: u16) -> &'static str {
    match msg_type {
        RTM_NEWLINK => "newlink",
        RTM_DELLINK => "dellink",
        18 => "getlink",
        RTM_SETLINK => "setlink",
        RTM_NEWADDR => "newaddr",
        RTM_DELADDR => "deladdr",
        22 => "getaddr",
        RTM_NEWROUTE => "newroute",
        RTM_DELROUTE => "delroute",
        26 => "getroute",
        28 => "newneigh",
        29 => "delneigh",
        30 => "getneigh",
        32 => "newrule",
        33 => "delrule",
        34 => "getrule",
        88 => "newnsid",
        90 => "getnsid",
        _ => "other",
    }
}

/// One request message as far as it was copied.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NlRequest {
    pub header: NlHeader,
    pub body: RtRequest,
    /// Attributes past the copied bytes were not seen.
    pub truncated: bool,
}

/// One `NLMSG_ERROR` reply: `error == 0` is an ACK.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NlReply {
    pub header: NlHeader,
    pub error: i32,
    /// The header of the request this answers (echoed by the kernel).
    pub request: Option<NlHeader>,
    /// `NLMSGERR_ATTR_MSG`, when the copied bytes hold it.
    pub extack: Option<String>,
}

/// Why copied bytes could not be parsed at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{0} bytes is shorter than a netlink header")]
    TooShort(usize),
    #[error("netlink header length {0} is invalid")]
    BadLength(u32),
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn header_at(b: &[u8], off: usize) -> Option<NlHeader> {
    Some(NlHeader {
        len: u32_at(b, off)?,
        msg_type: u16_at(b, off + 4)?,
        flags: u16_at(b, off + 6)?,
        seq: u32_at(b, off + 8)?,
        port: u32_at(b, off + 12)?,
    })
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Iterates the attributes in `b`; the flag says whether a cut-off attribute was found.
fn attributes(b: &[u8]) -> (Vec<(u16, &[u8])>, bool) {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= b.len() {
        let (Some(len), Some(kind)) = (u16_at(b, off), u16_at(b, off + 2)) else {
            break;
        };
        let len = usize::from(len);
        if len < 4 {
            return (out, false);
        }
        let Some(payload) = b.get(off + 4..off + len) else {
            return (out, true);
        };
        out.push((kind & NLA_TYPE_MASK, payload));
        off += align4(len);
    }
    (out, off < b.len())
}

fn string(payload: &[u8]) -> String {
    let end = payload
        .iter()
        .position(|c| *c == 0)
        .unwrap_or(payload.len());
    String::from_utf8_lossy(&payload[..end]).into_owned()
}

fn ip(family: u8, payload: &[u8]) -> Option<IpAddr> {
    match (family, payload.len()) {
        (AF_INET, 4) => {
            let o: [u8; 4] = payload.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(o)))
        }
        (AF_INET6, 16) => {
            let o: [u8; 16] = payload.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

fn netns_target(kind: u16, payload: &[u8]) -> Option<NetnsTarget> {
    let value = u32_at(payload, 0)?;
    match kind {
        IFLA_NET_NS_FD => Some(NetnsTarget::Fd(value)),
        IFLA_NET_NS_PID => Some(NetnsTarget::Pid(value)),
        IFLA_TARGET_NETNSID => Some(NetnsTarget::Id(i32::from_ne_bytes(value.to_ne_bytes()))),
        _ => None,
    }
}

/// `ifinfomsg` (16 bytes) followed by attributes.
fn parse_link(b: &[u8]) -> (LinkMsg, bool) {
    let mut link = LinkMsg {
        ifindex: u32_at(b, 4).map_or(0, |v| i32::from_ne_bytes(v.to_ne_bytes())),
        flags: u32_at(b, 8).unwrap_or(0),
        change: u32_at(b, 12).unwrap_or(0),
        ..LinkMsg::default()
    };
    if b.len() < 16 {
        return (link, true);
    }
    let (attrs, mut truncated) = attributes(&b[16..]);
    for (kind, payload) in attrs {
        match kind {
            IFLA_IFNAME => link.ifname = Some(string(payload)),
            IFLA_MTU => link.mtu = u32_at(payload, 0),
            IFLA_NET_NS_FD | IFLA_NET_NS_PID | IFLA_TARGET_NETNSID => {
                link.netns = netns_target(kind, payload);
            }
            IFLA_LINKINFO => {
                let (info, cut) = attributes(payload);
                truncated |= cut;
                for (info_kind, info_payload) in info {
                    match info_kind {
                        IFLA_INFO_KIND => link.kind = Some(string(info_payload)),
                        IFLA_INFO_DATA => {
                            let (data, cut) = attributes(info_payload);
                            truncated |= cut;
                            if let Some((_, peer)) = data.iter().find(|(k, _)| *k == VETH_INFO_PEER)
                            {
                                let (peer_link, cut) = parse_link(peer);
                                truncated |= cut;
                                link.peer = Some(LinkPeer {
                                    ifname: peer_link.ifname,
                                    netns: peer_link.netns,
                                });
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    (link, truncated)
}

/// `ifaddrmsg` (8 bytes) followed by attributes.
fn parse_addr(b: &[u8]) -> (AddrMsg, bool) {
    let mut addr = AddrMsg {
        family: b.first().copied().unwrap_or(0),
        prefix_len: b.get(1).copied().unwrap_or(0),
        ifindex: u32_at(b, 4).unwrap_or(0),
        ..AddrMsg::default()
    };
    if b.len() < 8 {
        return (addr, true);
    }
    let (attrs, truncated) = attributes(&b[8..]);
    for (kind, payload) in attrs {
        match kind {
            IFA_ADDRESS => addr.address = ip(addr.family, payload),
            IFA_LOCAL => addr.local = ip(addr.family, payload),
            _ => {}
        }
    }
    (addr, truncated)
}

/// `rtmsg` (12 bytes) followed by attributes.
fn parse_route(b: &[u8]) -> (RouteMsg, bool) {
    let byte = |i: usize| b.get(i).copied().unwrap_or(0);
    let mut route = RouteMsg {
        family: byte(0),
        dst_len: byte(1),
        table: u32::from(byte(4)),
        protocol: byte(5),
        scope: byte(6),
        route_type: byte(7),
        ..RouteMsg::default()
    };
    if b.len() < 12 {
        return (route, true);
    }
    let (attrs, truncated) = attributes(&b[12..]);
    for (kind, payload) in attrs {
        match kind {
            RTA_DST => route.dst = ip(route.family, payload),
            RTA_GATEWAY => route.gateway = ip(route.family, payload),
            RTA_PREFSRC => route.prefsrc = ip(route.family, payload),
            RTA_OIF => route.oif = u32_at(payload, 0),
            RTA_TABLE => route.table = u32_at(payload, 0).unwrap_or(route.table),
            _ => {}
        }
    }
    (route, truncated)
}

/// One message: header, the copied part of its body, whether the body was cut.
type RawMessage<'a> = (NlHeader, &'a [u8], bool);

/// Splits copied bytes into messages.
fn messages(bytes: &[u8]) -> Result<Vec<RawMessage<'_>>, ParseError> {
    let first = header_at(bytes, 0).ok_or(ParseError::TooShort(bytes.len()))?;
    if (first.len as usize) < NLMSG_HDRLEN {
        return Err(ParseError::BadLength(first.len));
    }
    let mut out = Vec::new();
    let mut off = 0;
    while let Some(header) = header_at(bytes, off) {
        let len = header.len as usize;
        if len < NLMSG_HDRLEN {
            break;
        }
        let end = off + len;
        let cut = end > bytes.len();
        let body = &bytes[off + NLMSG_HDRLEN..end.min(bytes.len())];
        out.push((header, body, cut));
        if cut {
            break;
        }
        off += align4(len);
    }
    Ok(out)
}

/// Parses the requests in a copied send buffer (usually one; batches show as several).
pub fn parse_requests(bytes: &[u8]) -> Result<Vec<NlRequest>, ParseError> {
    Ok(messages(bytes)?
        .into_iter()
        .map(|(header, body, cut)| {
            let (body, truncated) = match header.msg_type {
                RTM_NEWLINK | RTM_DELLINK | RTM_SETLINK => {
                    let (link, t) = parse_link(body);
                    let body = match header.msg_type {
                        RTM_NEWLINK => RtRequest::NewLink(link),
                        RTM_DELLINK => RtRequest::DelLink(link),
                        _ => RtRequest::SetLink(link),
                    };
                    (body, t)
                }
                RTM_NEWADDR | RTM_DELADDR => {
                    let (addr, t) = parse_addr(body);
                    let body = if header.msg_type == RTM_NEWADDR {
                        RtRequest::NewAddr(addr)
                    } else {
                        RtRequest::DelAddr(addr)
                    };
                    (body, t)
                }
                RTM_NEWROUTE | RTM_DELROUTE => {
                    let (route, t) = parse_route(body);
                    let body = if header.msg_type == RTM_NEWROUTE {
                        RtRequest::NewRoute(route)
                    } else {
                        RtRequest::DelRoute(route)
                    };
                    (body, t)
                }
                other => (RtRequest::Other { msg_type: other }, false),
            };
            NlRequest {
                header,
                body,
                truncated: truncated || cut,
            }
        })
        .collect())
}

/// Parses the `NLMSG_ERROR` messages (ACKs and errors) in a copied receive buffer.
pub fn parse_replies(bytes: &[u8]) -> Result<Vec<NlReply>, ParseError> {
    Ok(messages(bytes)?
        .into_iter()
        .filter(|(header, _, _)| header.msg_type == NLMSG_ERROR)
        .filter_map(|(header, body, _)| {
            let error = i32::from_ne_bytes(u32_at(body, 0)?.to_ne_bytes());
            let request = header_at(body, 4);
            let mut extack = None;
            if header.flags & NLM_F_ACK_TLVS != 0 {
                // The echoed request is the bare header when capped or on success.
                let echoed = if header.flags & NLM_F_CAPPED != 0 || error == 0 {
                    NLMSG_HDRLEN
                } else {
                    request.map_or(NLMSG_HDRLEN, |r| align4(r.len as usize))
                };
                if let Some(tlvs) = body.get(4 + echoed..) {
                    extack = attributes(tlvs)
                        .0
                        .into_iter()
                        .find(|(k, _)| *k == NLMSGERR_ATTR_MSG)
                        .map(|(_, p)| string(p));
                }
            }
            Some(NlReply {
                header,
                error,
                request,
                extack,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let len = u16::try_from(4 + payload.len()).expect("small");
        let mut v = len.to_ne_bytes().to_vec();
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(payload);
        v.resize(align4(v.len()), 0);
        v
    }

    fn msg(msg_type: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(16 + body.len()).expect("small");
        let mut v = len.to_ne_bytes().to_vec();
        v.extend_from_slice(&msg_type.to_ne_bytes());
        v.extend_from_slice(&flags.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(body);
        v
    }

    fn ifinfo(index: i32, flags: u32, change: u32) -> Vec<u8> {
        let mut v = vec![0u8; 4];
        v.extend_from_slice(&index.to_ne_bytes());
        v.extend_from_slice(&flags.to_ne_bytes());
        v.extend_from_slice(&change.to_ne_bytes());
        v
    }

    fn veth_request() -> Vec<u8> {
        let mut peer = ifinfo(0, 0, 0);
        peer.extend(attr(IFLA_IFNAME, b"eth0\0"));
        peer.extend(attr(IFLA_NET_NS_FD, &7u32.to_ne_bytes()));
        let data = attr(VETH_INFO_PEER, &peer);
        let mut info = attr(IFLA_INFO_KIND, b"veth\0");
        info.extend(attr(IFLA_INFO_DATA, &data));
        let mut body = ifinfo(0, 0, 0);
        body.extend(attr(IFLA_IFNAME, b"veth1234\0"));
        body.extend(attr(IFLA_MTU, &1460u32.to_ne_bytes()));
        body.extend(attr(IFLA_LINKINFO, &info));
        msg(RTM_NEWLINK, 0x605, 9, &body)
    }

    #[test]
    fn veth_with_peer_and_target_netns() {
        let parsed = parse_requests(&veth_request()).expect("parses");
        assert_eq!(parsed.len(), 1);
        assert!(!parsed[0].truncated);
        assert_eq!(parsed[0].header.seq, 9);
        let RtRequest::NewLink(link) = &parsed[0].body else {
            panic!("not newlink: {parsed:?}");
        };
        assert_eq!(link.ifname.as_deref(), Some("veth1234"));
        assert_eq!(link.kind.as_deref(), Some("veth"));
        assert_eq!(link.mtu, Some(1460));
        let peer = link.peer.as_ref().expect("peer");
        assert_eq!(peer.ifname.as_deref(), Some("eth0"));
        assert_eq!(peer.netns, Some(NetnsTarget::Fd(7)));
    }

    #[test]
    fn truncated_request_keeps_what_was_complete() {
        let full = veth_request();
        for cut in 16..full.len() {
            let parsed = parse_requests(&full[..cut]).expect("header is complete");
            assert!(parsed[0].truncated, "cut at {cut}");
        }
        let parsed = parse_requests(&full[..48]).expect("parses");
        let RtRequest::NewLink(link) = &parsed[0].body else {
            panic!("not newlink");
        };
        assert_eq!(link.ifname.as_deref(), Some("veth1234"));
        assert!(link.peer.is_none());
    }

    #[test]
    fn garbage_never_panics() {
        let mut state = 0x1234_5678u32;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (state >> 24) as u8
                })
                .collect();
            let _ = parse_requests(&bytes);
            let _ = parse_replies(&bytes);
        }
        assert_eq!(parse_requests(&[1, 2, 3]), Err(ParseError::TooShort(3)));
    }

    #[test]
    fn link_up_flags() {
        let body = ifinfo(5, IFF_UP, IFF_UP);
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        let RtRequest::NewLink(link) = &parsed[0].body else {
            panic!("not newlink");
        };
        assert!(link.sets_up());
        assert!(!link.sets_down());
        assert_eq!(link.ifindex, 5);
        let down = LinkMsg {
            flags: 0,
            change: IFF_UP,
            ..LinkMsg::default()
        };
        assert!(down.sets_down());
    }

    #[test]
    fn address_and_default_route() {
        let mut addr = vec![AF_INET, 24, 0, 0];
        addr.extend_from_slice(&3u32.to_ne_bytes());
        addr.extend(attr(IFA_LOCAL, &[10, 244, 1, 2]));
        addr.extend(attr(IFA_ADDRESS, &[10, 244, 1, 2]));
        let parsed = parse_requests(&msg(RTM_NEWADDR, 5, 2, &addr)).expect("parses");
        let RtRequest::NewAddr(a) = &parsed[0].body else {
            panic!("not newaddr");
        };
        assert_eq!(a.addr(), Some("10.244.1.2".parse().expect("ip")));
        assert_eq!((a.prefix_len, a.ifindex), (24, 3));

        let mut route = vec![AF_INET, 0, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0];
        route.extend(attr(RTA_GATEWAY, &[10, 244, 1, 1]));
        route.extend(attr(RTA_OIF, &3u32.to_ne_bytes()));
        let parsed = parse_requests(&msg(RTM_NEWROUTE, 5, 3, &route)).expect("parses");
        let RtRequest::NewRoute(r) = &parsed[0].body else {
            panic!("not newroute");
        };
        assert!(r.is_default());
        assert_eq!(r.gateway, Some("10.244.1.1".parse().expect("ip")));
        assert_eq!(r.oif, Some(3));
    }

    #[test]
    fn ack_and_error_with_extack() {
        let request = msg(RTM_NEWROUTE, 5, 77, &[0u8; 12]);
        let mut body = 0i32.to_ne_bytes().to_vec();
        body.extend_from_slice(&request[..16]);
        let ack = msg(NLMSG_ERROR, NLM_F_CAPPED, 77, &body);
        let replies = parse_replies(&ack).expect("parses");
        assert_eq!(replies[0].error, 0);
        assert_eq!(replies[0].request.map(|r| r.seq), Some(77));

        let mut body = (-101i32).to_ne_bytes().to_vec();
        body.extend_from_slice(&request[..16]);
        body.extend(attr(NLMSGERR_ATTR_MSG, b"Nexthop has invalid gateway\0"));
        let err = msg(NLMSG_ERROR, NLM_F_CAPPED | NLM_F_ACK_TLVS, 77, &body);
        let mut both = ack.clone();
        both.extend(err);
        let replies = parse_replies(&both).expect("parses");
        assert_eq!(replies.len(), 2);
        assert_eq!(replies[1].error, -101);
        assert_eq!(
            replies[1].extack.as_deref(),
            Some("Nexthop has invalid gateway")
        );
        assert_eq!(replies[1].request.map(|r| r.msg_type), Some(RTM_NEWROUTE));
    }

    #[test]
    fn up_and_down_follow_the_change_mask() {
        const IFF_RUNNING: u32 = 0x40;
        let link = |flags, change| LinkMsg {
            flags,
            change,
            ..LinkMsg::default()
        };
        // (flags, change) -> (sets_up, sets_down); change 0 means every flag, as in the kernel.
        for (flags, change, up, down) in [
            (IFF_UP, IFF_UP, true, false),
            (IFF_UP, 0, true, false),
            (IFF_UP, IFF_RUNNING, false, false),
            (0, IFF_UP, false, true),
            (IFF_RUNNING, IFF_UP | IFF_RUNNING, false, true),
            (0, 0, false, false),
            (0, IFF_RUNNING, false, false),
        ] {
            let l = link(flags, change);
            assert_eq!(
                (l.sets_up(), l.sets_down()),
                (up, down),
                "{flags:#x}/{change:#x}"
            );
        }
    }

    #[test]
    fn only_a_zero_length_route_of_the_main_table_is_default() {
        let route = |dst_len, table| RouteMsg {
            dst_len,
            table,
            ..RouteMsg::default()
        };
        assert!(route(0, 254).is_default());
        assert!(route(0, 0).is_default(), "no table given: main");
        assert!(!route(24, 254).is_default());
        assert!(!route(0, 100).is_default());
    }

    #[test]
    fn every_request_type_is_named_and_only_changes_count_as_changes() {
        let link = ifinfo(3, 0, 0);
        let addr = vec![AF_INET, 24, 0, 0, 3, 0, 0, 0];
        let route = vec![AF_INET, 0, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0];
        for (msg_type, body, name, change) in [
            (RTM_NEWLINK, &link, "newlink", true),
            (RTM_DELLINK, &link, "dellink", true),
            (RTM_SETLINK, &link, "setlink", true),
            (RTM_NEWADDR, &addr, "newaddr", true),
            (RTM_DELADDR, &addr, "deladdr", true),
            (RTM_NEWROUTE, &route, "newroute", true),
            (RTM_DELROUTE, &route, "delroute", true),
            (18, &link, "getlink", false),
            (22, &addr, "getaddr", false),
            (26, &route, "getroute", false),
        ] {
            let parsed = parse_requests(&msg(msg_type, 5, 1, body)).expect("parses");
            assert_eq!(parsed[0].body.op(), name);
            assert_eq!(parsed[0].body.is_change(), change, "{name}");
            assert_eq!(is_change_type(msg_type), change, "{name}");
        }
        for (msg_type, name) in [
            (28, "newneigh"),
            (29, "delneigh"),
            (30, "getneigh"),
            (32, "newrule"),
            (33, "delrule"),
            (34, "getrule"),
            (88, "newnsid"),
            (90, "getnsid"),
            (99, "other"),
        ] {
            assert_eq!(op_name(msg_type), name);
            assert!(!is_change_type(msg_type), "{name}");
        }
    }

    #[test]
    fn an_empty_attribute_is_skipped_and_a_zero_length_one_ends_the_list() {
        // An attribute with no payload (length 4) is valid: the ones after it count.
        let mut body = ifinfo(3, 0, 0);
        body.extend(attr(99, &[]));
        body.extend(attr(IFLA_IFNAME, b"eth0\0"));
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        let RtRequest::NewLink(link) = &parsed[0].body else {
            panic!("not newlink");
        };
        assert_eq!(link.ifname.as_deref(), Some("eth0"));
        assert!(!parsed[0].truncated);
        // A length below 4 is malformed: parsing stops there, and nothing was cut off.
        let mut body = ifinfo(3, 0, 0);
        body.extend_from_slice(&[0, 0, 0, 0]);
        body.extend(attr(IFLA_IFNAME, b"eth0\0"));
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        let RtRequest::NewLink(link) = &parsed[0].body else {
            panic!("not newlink");
        };
        assert_eq!(link.ifname, None);
        assert!(!parsed[0].truncated);
    }

    fn link_of(request: &NlRequest) -> &LinkMsg {
        match &request.body {
            RtRequest::NewLink(l) | RtRequest::DelLink(l) | RtRequest::SetLink(l) => l,
            other => panic!("not a link request: {other:?}"),
        }
    }

    #[test]
    fn link_fields_and_every_netns_target() {
        let mut body = ifinfo(7, 0, IFF_UP);
        body.extend(attr(IFLA_NET_NS_PID, &1234u32.to_ne_bytes()));
        let parsed = parse_requests(&msg(RTM_SETLINK, 5, 1, &body)).expect("parses");
        let link = link_of(&parsed[0]);
        assert_eq!((link.ifindex, link.flags, link.change), (7, 0, IFF_UP));
        assert!(link.sets_down());
        assert_eq!(link.netns, Some(NetnsTarget::Pid(1234)));
        let mut body = ifinfo(7, 0, 0);
        body.extend(attr(IFLA_TARGET_NETNSID, &(-2i32).to_ne_bytes()));
        let parsed = parse_requests(&msg(RTM_SETLINK, 5, 1, &body)).expect("parses");
        assert_eq!(link_of(&parsed[0]).netns, Some(NetnsTarget::Id(-2)));
    }

    #[test]
    fn bodies_without_attributes_are_complete() {
        let link = ifinfo(3, 0, 0);
        let addr = vec![AF_INET, 24, 0, 0, 3, 0, 0, 0];
        let route = vec![AF_INET, 0, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0];
        for (msg_type, body) in [
            (RTM_DELLINK, link),
            (RTM_DELADDR, addr),
            (RTM_DELROUTE, route),
        ] {
            let parsed = parse_requests(&msg(msg_type, 5, 1, &body)).expect("parses");
            assert!(!parsed[0].truncated, "{:?}", parsed[0]);
        }
    }

    #[test]
    fn trailing_bytes_are_truncation_missing_padding_is_not() {
        // The last attribute's padding may be left out of the message.
        let mut body = ifinfo(3, 0, 0);
        body.extend(attr(IFLA_IFNAME, b"eth0\0"));
        body.truncate(body.len() - 3);
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        assert_eq!(link_of(&parsed[0]).ifname.as_deref(), Some("eth0"));
        assert!(!parsed[0].truncated);
        // Two bytes of a next attribute header: something was cut off.
        let mut body = ifinfo(3, 0, 0);
        body.extend(attr(IFLA_IFNAME, b"eth0\0"));
        body.extend_from_slice(&[8, 0]);
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        assert!(parsed[0].truncated);
    }

    #[test]
    fn route_fields_and_its_table() {
        let mut route = vec![AF_INET6, 64, 0, 0, 254, 4, 253, 1, 0, 0, 0, 0];
        route.extend(attr(
            RTA_DST,
            &"fd00:1::".parse::<Ipv6Addr>().expect("ip").octets(),
        ));
        route.extend(attr(RTA_TABLE, &1000u32.to_ne_bytes()));
        let parsed = parse_requests(&msg(RTM_NEWROUTE, 5, 1, &route)).expect("parses");
        let RtRequest::NewRoute(r) = &parsed[0].body else {
            panic!("not newroute");
        };
        assert_eq!(
            (r.family, r.dst_len, r.protocol, r.scope, r.route_type),
            (AF_INET6, 64, 4, 253, 1)
        );
        assert_eq!(r.dst, Some("fd00:1::".parse().expect("ip")));
        assert_eq!(r.table, 1000, "RTA_TABLE overrides the 8-bit table");
        let mut default = vec![AF_INET, 0, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0];
        default.extend(attr(RTA_TABLE, &1000u32.to_ne_bytes()));
        let parsed = parse_requests(&msg(RTM_NEWROUTE, 5, 1, &default)).expect("parses");
        let RtRequest::NewRoute(r) = &parsed[0].body else {
            panic!("not newroute");
        };
        assert!(
            !r.is_default(),
            "a /0 in table 1000 is not the default route"
        );
    }

    #[test]
    fn message_lengths_below_a_header_are_refused_or_end_the_batch() {
        let mut short = msg(RTM_NEWLINK, 5, 1, &[]);
        short[..4].copy_from_slice(&8u32.to_ne_bytes());
        assert_eq!(parse_requests(&short), Err(ParseError::BadLength(8)));
        // A bare header is a message with an empty body.
        let bare = msg(18, 5, 1, &[]);
        assert_eq!(parse_requests(&bare).expect("parses").len(), 1);
        // In a batch, a bad second length ends it; a bare second header is a message.
        let first = msg(RTM_NEWLINK, 5, 1, &ifinfo(3, 0, 0));
        let mut batch = first.clone();
        batch.extend_from_slice(&short);
        assert_eq!(parse_requests(&batch).expect("parses").len(), 1);
        let mut batch = first;
        batch.extend_from_slice(&bare);
        let parsed = parse_requests(&batch).expect("parses");
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[1].body, RtRequest::Other { msg_type: 18 });
    }

    #[test]
    fn without_the_tlv_flag_no_extack_is_read() {
        let request = msg(RTM_NEWROUTE, 5, 77, &[0u8; 12]);
        let mut body = (-22i32).to_ne_bytes().to_vec();
        body.extend_from_slice(&request[..16]);
        body.extend(attr(NLMSGERR_ATTR_MSG, b"not an extack\0"));
        let replies = parse_replies(&msg(NLMSG_ERROR, NLM_F_CAPPED, 77, &body)).expect("parses");
        assert_eq!(replies[0].error, -22);
        assert_eq!(replies[0].extack, None);
    }

    #[test]
    fn an_uncapped_error_echoes_the_whole_request_before_its_extack() {
        let request = msg(RTM_NEWROUTE, 5, 77, &[0u8; 12]);
        let mut body = (-22i32).to_ne_bytes().to_vec();
        body.extend_from_slice(&request);
        body.extend(attr(
            NLMSGERR_ATTR_MSG,
            b"Invalid prefix for given prefix length\0",
        ));
        let replies = parse_replies(&msg(NLMSG_ERROR, NLM_F_ACK_TLVS, 77, &body)).expect("parses");
        assert_eq!(
            replies[0].extack.as_deref(),
            Some("Invalid prefix for given prefix length")
        );
    }

    #[test]
    fn a_cut_veth_peer_marks_the_request_truncated() {
        let data = attr(VETH_INFO_PEER, &[0u8; 8]);
        let mut info = attr(IFLA_INFO_KIND, b"veth\0");
        info.extend(attr(IFLA_INFO_DATA, &data));
        let mut body = ifinfo(0, 0, 0);
        body.extend(attr(IFLA_LINKINFO, &info));
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        assert!(parsed[0].truncated);
    }

    /// A nested attribute header that claims more bytes than follow it.
    const CUT_NESTED: [u8; 4] = [0x20, 0x00, 0x01, 0x00];

    #[test]
    fn cut_link_info_or_info_data_marks_the_request_truncated() {
        let mut info = attr(IFLA_INFO_KIND, b"veth\0");
        info.extend_from_slice(&CUT_NESTED);
        let mut body = ifinfo(0, 0, 0);
        body.extend(attr(IFLA_LINKINFO, &info));
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        assert!(parsed[0].truncated, "cut IFLA_LINKINFO");

        let mut info = attr(IFLA_INFO_KIND, b"veth\0");
        info.extend(attr(IFLA_INFO_DATA, &CUT_NESTED));
        let mut body = ifinfo(0, 0, 0);
        body.extend(attr(IFLA_LINKINFO, &info));
        let parsed = parse_requests(&msg(RTM_NEWLINK, 5, 1, &body)).expect("parses");
        assert!(parsed[0].truncated, "cut IFLA_INFO_DATA");
    }

    #[test]
    fn a_point_to_point_address_is_its_local_one() {
        let mut addr = vec![AF_INET, 32, 0, 0];
        addr.extend_from_slice(&3u32.to_ne_bytes());
        addr.extend(attr(IFA_LOCAL, &[10, 244, 0, 5]));
        addr.extend(attr(IFA_ADDRESS, &[10, 244, 0, 9]));
        let parsed = parse_requests(&msg(RTM_NEWADDR, 5, 1, &addr)).expect("parses");
        let RtRequest::NewAddr(a) = &parsed[0].body else {
            panic!("not newaddr");
        };
        assert_eq!(a.addr(), Some("10.244.0.5".parse().expect("ip")));
    }

    #[test]
    fn address_without_local_and_route_source_and_table() {
        let mut addr = vec![AF_INET6, 64, 0, 0];
        addr.extend_from_slice(&3u32.to_ne_bytes());
        let v6: Ipv6Addr = "fd00::5".parse().expect("ip");
        addr.extend(attr(IFA_ADDRESS, &v6.octets()));
        let parsed = parse_requests(&msg(RTM_NEWADDR, 5, 1, &addr)).expect("parses");
        let RtRequest::NewAddr(a) = &parsed[0].body else {
            panic!("not newaddr");
        };
        assert_eq!(a.addr(), Some(IpAddr::V6(v6)));

        let mut route = vec![AF_INET, 24, 0, 0, 100, 3, 0, 1, 0, 0, 0, 0];
        route.extend(attr(RTA_PREFSRC, &[10, 244, 1, 2]));
        let parsed = parse_requests(&msg(RTM_NEWROUTE, 5, 1, &route)).expect("parses");
        let RtRequest::NewRoute(r) = &parsed[0].body else {
            panic!("not newroute");
        };
        assert_eq!(r.table, 100);
        assert_eq!(r.prefsrc, Some("10.244.1.2".parse().expect("ip")));
    }
}
