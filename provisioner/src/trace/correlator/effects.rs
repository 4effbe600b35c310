//! What an rtnetlink request does to a namespace, as far as verdicts care, and its rendering
//! for the timeline.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::trace::netlink_parse::{NlRequest, RtRequest};
use crate::trace::render::RequestDetail;

/// The effect of one request (or device event, or state read) on a namespace's network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Effect {
    LinkNew {
        ifname: Option<String>,
    },
    LinkUp {
        ifindex: u32,
        ifname: Option<String>,
    },
    LinkDown {
        ifindex: u32,
        ifname: Option<String>,
    },
    /// Deleted, or moved out of the namespace.
    LinkDel {
        ifindex: u32,
        ifname: Option<String>,
    },
    AddrAdd {
        ifindex: u32,
        addr: IpAddr,
        prefix: u8,
    },
    AddrDel {
        ifindex: u32,
        addr: IpAddr,
        prefix: u8,
    },
    RouteAdd(RouteKey),
    RouteDel(RouteKey),
    DevUp {
        ifindex: u32,
        ifname: String,
    },
    DevGone {
        ifindex: u32,
        ifname: String,
    },
    /// The whole state as read from the kernel: replaces what the timeline added up to.
    Snapshot(Box<super::state::State>),
}

/// A route as far as verdicts care.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct RouteKey {
    pub dst: Option<IpAddr>,
    pub dst_len: u8,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    /// `0.0.0.0/0` or `::/0` in the main table.
    pub default: bool,
}

impl RouteKey {
    /// Whether deleting `del` removes this route (an unspecified gateway matches any).
    pub(super) fn deleted_by(&self, del: &RouteKey) -> bool {
        self.dst_len == del.dst_len
            && self.dst == del.dst
            && (del.gateway.is_none() || self.gateway == del.gateway)
    }
}

/// A human description and the effect of a request; `None` for requests that change nothing
/// a verdict cares about (dumps, gets, iproute2's empty feature probes).
pub(super) fn describe(
    message: &NlRequest,
    ifnames: &HashMap<u32, String>,
) -> Option<(RequestDetail, Option<Effect>)> {
    let detail = RequestDetail::new(&message.body, ifnames)?;
    let effect = match &message.body {
        RtRequest::NewLink(link) | RtRequest::SetLink(link) => {
            let ifindex = link.ifindex.unsigned_abs();
            let ifname = link.ifname.clone();
            if link.sets_up() {
                Effect::LinkUp { ifindex, ifname }
            } else if link.sets_down() {
                Effect::LinkDown { ifindex, ifname }
            } else if link.netns.is_some() {
                // Moved out of this namespace.
                Effect::LinkDel { ifindex, ifname }
            } else {
                Effect::LinkNew { ifname }
            }
        }
        RtRequest::DelLink(link) => Effect::LinkDel {
            ifindex: link.ifindex.unsigned_abs(),
            ifname: link.ifname.clone(),
        },
        RtRequest::NewAddr(addr) | RtRequest::DelAddr(addr) => {
            let (ifindex, addr_ip, prefix) = (addr.ifindex, addr.addr()?, addr.prefix_len);
            if matches!(message.body, RtRequest::NewAddr(_)) {
                Effect::AddrAdd {
                    ifindex,
                    addr: addr_ip,
                    prefix,
                }
            } else {
                Effect::AddrDel {
                    ifindex,
                    addr: addr_ip,
                    prefix,
                }
            }
        }
        RtRequest::NewRoute(route) | RtRequest::DelRoute(route) => {
            let key = RouteKey {
                dst: route.dst,
                dst_len: route.dst_len,
                gateway: route.gateway,
                oif: route.oif,
                default: route.is_default(),
            };
            if matches!(message.body, RtRequest::NewRoute(_)) {
                Effect::RouteAdd(key)
            } else {
                Effect::RouteDel(key)
            }
        }
        RtRequest::Other { .. } => return None,
    };
    Some((detail, Some(effect)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::netlink_parse::{
        AddrMsg, LinkMsg, NlHeader, RTM_NEWADDR, RTM_NEWROUTE, RTM_SETLINK, RouteMsg,
    };

    fn msg(msg_type: u16, body: RtRequest) -> NlRequest {
        NlRequest {
            header: NlHeader {
                len: 40,
                msg_type,
                flags: 5,
                seq: 1,
                port: 0,
            },
            body,
            truncated: false,
        }
    }

    #[test]
    fn link_up_by_index_is_named_from_known_interfaces() {
        let names = HashMap::from([(3, "eth0".to_owned())]);
        let up = msg(
            RTM_SETLINK,
            RtRequest::SetLink(LinkMsg {
                ifindex: 3,
                flags: 1,
                change: 1,
                ..LinkMsg::default()
            }),
        );
        let (detail, effect) = describe(&up, &names).expect("a change");
        assert_eq!(detail.to_string(), "eth0 up");
        assert_eq!(
            effect,
            Some(Effect::LinkUp {
                ifindex: 3,
                ifname: None
            })
        );
    }

    #[test]
    fn address_and_default_route_are_described_with_their_device() {
        let names = HashMap::from([(3, "eth0".to_owned())]);
        let addr = msg(
            RTM_NEWADDR,
            RtRequest::NewAddr(AddrMsg {
                family: 2,
                prefix_len: 24,
                ifindex: 3,
                local: Some("10.0.0.2".parse().expect("ip")),
                address: None,
            }),
        );
        assert_eq!(
            describe(&addr, &names)
                .map(|(d, _)| d.to_string())
                .as_deref(),
            Some("10.0.0.2/24 dev eth0")
        );
        let route = msg(
            RTM_NEWROUTE,
            RtRequest::NewRoute(RouteMsg {
                family: 2,
                table: 254,
                gateway: Some("10.0.0.1".parse().expect("ip")),
                oif: Some(3),
                ..RouteMsg::default()
            }),
        );
        let (detail, effect) = describe(&route, &names).expect("a change");
        assert_eq!(detail.to_string(), "default via 10.0.0.1 dev eth0");
        assert!(matches!(
            effect,
            Some(Effect::RouteAdd(RouteKey { default: true, .. }))
        ));
    }

    #[test]
    fn dumps_and_empty_probes_change_nothing() {
        let names = HashMap::new();
        assert!(describe(&msg(18, RtRequest::Other { msg_type: 18 }), &names).is_none());
        let probe = msg(RTM_SETLINK, RtRequest::SetLink(LinkMsg::default()));
        assert!(describe(&probe, &names).is_none());
    }

    #[test]
    fn a_route_delete_without_gateway_matches_any_gateway() {
        let route = RouteKey {
            dst: None,
            dst_len: 0,
            gateway: Some("10.0.0.1".parse().expect("ip")),
            oif: Some(3),
            default: true,
        };
        let del_any = RouteKey {
            gateway: None,
            oif: None,
            ..route.clone()
        };
        let del_other = RouteKey {
            gateway: Some("10.0.0.9".parse().expect("ip")),
            ..route.clone()
        };
        assert!(route.deleted_by(&del_any));
        assert!(!route.deleted_by(&del_other));
    }
}
