//! What a namespace's network adds up to: a [`State`] at each point of its timeline, and the
//! [`Progress`] folded over the whole timeline (the best it reached, when it was networked,
//! when its teardown began).
//!
//! A verdict rests on what a sandbox reached before its teardown began: a sandbox wired, used
//! and torn down (a Job, a `--rm` container) was networked, whatever its last state.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::SystemTime;

use crate::dataplane::NetnsSnapshot;
use crate::trace::verdict::{Evidence, RequestStatus, Step, errno_text};

use super::effects::{Effect, RouteKey};
use super::name_set::NameSet;
use super::timeline::Entry;

/// `lo` has index 1 in every network namespace.
pub(super) const LOOPBACK_IFINDEX: u32 = 1;

/// The network of a namespace at one point in time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    /// Non-loopback interfaces present, by name.
    pub links: NameSet,
    /// Non-loopback interfaces up, by name.
    pub up: NameSet,
    pub lo_up: bool,
    /// `(ifindex, address, prefix)`
    pub addrs: Vec<(u32, IpAddr, u8)>,
    pub routes: Vec<RouteKey>,
}

impl State {
    /// The state a snapshot shows (link-local addresses are the kernel's own, not configured).
    pub(super) fn from_snapshot(snapshot: &NetnsSnapshot) -> Self {
        let mut state = Self::default();
        for link in &snapshot.links {
            if link.index == LOOPBACK_IFINDEX {
                state.lo_up = link.up;
                continue;
            }
            state.links.insert(link.name.clone());
            if link.up {
                state.up.insert(link.name.clone());
            }
        }
        state.addrs = snapshot
            .addresses
            .iter()
            .filter(|a| !a.link_local)
            .map(|a| (a.ifindex, a.net.ip(), a.net.prefix()))
            .collect();
        state.routes = snapshot
            .routes
            .iter()
            .filter(|r| !is_kernel_route(&r.dst))
            .map(|r| RouteKey {
                dst: (r.dst.prefix() > 0).then(|| r.dst.network()),
                dst_len: r.dst.prefix(),
                gateway: r.gateway,
                oif: r.oif,
                default: r.dst.prefix() == 0,
            })
            .collect();
        state
    }

    fn mark_up(&mut self, ifindex: u32, name: String) {
        if ifindex == LOOPBACK_IFINDEX || name == "lo" {
            self.lo_up = true;
        } else {
            self.links.insert(name.clone());
            self.up.insert(name);
        }
    }

    fn forget_link(&mut self, ifindex: u32, name: &str) {
        self.up.remove(name);
        self.links.remove(name);
        self.addrs.retain(|(idx, _, _)| *idx != ifindex);
        self.routes.retain(|r| r.oif != Some(ifindex));
    }

    pub(super) fn has_default_route(&self) -> bool {
        self.routes.iter().any(|r| r.default)
    }

    pub(super) fn has_address(&self) -> bool {
        self.addrs
            .iter()
            .any(|(idx, a, _)| *idx != LOOPBACK_IFINDEX && !a.is_loopback())
    }

    /// A non-loopback interface up, with an address and a default route.
    pub(super) fn is_networked(&self) -> bool {
        !self.up.is_empty() && self.has_address() && self.has_default_route()
    }

    /// How many of the three things a networked sandbox has are there.
    fn score(&self) -> u8 {
        u8::from(!self.up.is_empty())
            + u8::from(self.has_address())
            + u8::from(self.has_default_route())
    }

    /// Anything configured besides loopback.
    fn configured(&self) -> bool {
        !self.links.is_empty() || self.has_address() || !self.routes.is_empty()
    }

    /// `interfaces up [eth0], addresses [10.0.0.2/24], default route yes, lo up`
    pub(super) fn summary(&self) -> String {
        let addrs: Vec<String> = self
            .addrs
            .iter()
            .filter(|(idx, a, _)| *idx != LOOPBACK_IFINDEX && !a.is_loopback())
            .map(|(_, a, p)| format!("{a}/{p}"))
            .collect();
        let down: Vec<&str> = self
            .links
            .iter()
            .filter(|l| !self.up.contains(l))
            .map(String::as_str)
            .collect();
        let mut s = format!(
            "interfaces up [{}]",
            self.up
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !down.is_empty() {
            let _ = write!(s, ", down [{}]", down.join(", "));
        }
        let _ = write!(
            s,
            ", addresses [{}], default route {}, lo {}",
            addrs.join(", "),
            if self.has_default_route() {
                "yes"
            } else {
                "no"
            },
            if self.lo_up { "up" } else { "not brought up" }
        );
        s
    }

    /// Applies `effect`; an interface a request names by index only is named from `names`, and
    /// that index is added to `named_by_index` (a later name for it changes this state).
    fn apply(
        &mut self,
        effect: &Effect,
        names: &HashMap<u32, String>,
        named_by_index: &mut Vec<u32>,
    ) {
        let mut name = |ifindex: u32, ifname: &Option<String>| {
            ifname.clone().unwrap_or_else(|| {
                if !named_by_index.contains(&ifindex) {
                    named_by_index.push(ifindex);
                }
                names
                    .get(&ifindex)
                    .cloned()
                    .unwrap_or_else(|| format!("#{ifindex}"))
            })
        };
        match effect {
            Effect::LinkNew { ifname } => {
                if let Some(n) = ifname.as_ref().filter(|n| *n != "lo") {
                    self.links.insert(n.clone());
                }
            }
            Effect::LinkUp { ifindex, ifname } => self.mark_up(*ifindex, name(*ifindex, ifname)),
            Effect::DevUp { ifindex, ifname } => self.mark_up(*ifindex, ifname.clone()),
            Effect::LinkDown { ifindex, ifname } => {
                let n = name(*ifindex, ifname);
                if *ifindex == LOOPBACK_IFINDEX || n == "lo" {
                    self.lo_up = false;
                }
                self.up.remove(&n);
                // The kernel flushes the routes through a link that goes down.
                self.routes.retain(|r| r.oif != Some(*ifindex));
            }
            Effect::LinkDel { ifindex, ifname } => {
                let n = name(*ifindex, ifname);
                self.forget_link(*ifindex, &n);
            }
            Effect::DevGone { ifindex, ifname } => self.forget_link(*ifindex, ifname),
            Effect::AddrAdd {
                ifindex,
                addr,
                prefix,
            } => {
                let added = (*ifindex, *addr, *prefix);
                if !self.addrs.contains(&added) {
                    self.addrs.push(added);
                }
            }
            Effect::AddrDel { addr, prefix, .. } => {
                self.addrs.retain(|(_, a, p)| !(a == addr && p == prefix));
            }
            Effect::RouteAdd(route) => {
                if !self.routes.contains(route) {
                    self.routes.push(route.clone());
                }
            }
            Effect::RouteDel(route) => self.routes.retain(|r| !r.deleted_by(route)),
            Effect::Snapshot(state) => *self = (**state).clone(),
        }
    }
}

/// Routes the kernel adds by itself (IPv6 link-local and multicast prefixes).
fn is_kernel_route(dst: &ipnetwork::IpNetwork) -> bool {
    match dst {
        ipnetwork::IpNetwork::V6(v6) => {
            let first = v6.network().segments()[0];
            (first & 0xffc0) == 0xfe80 || (first & 0xff00) == 0xff00
        }
        ipnetwork::IpNetwork::V4(_) => false,
    }
}

/// When a namespace was first networked, and on what evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reached {
    pub at: SystemTime,
    pub evidence: Evidence,
}

/// The timeline folded: where it is, the best it reached, and what went wrong on the way.
#[derive(Clone, Debug, Default)]
pub(crate) struct Progress {
    pub now: State,
    /// The most complete state reached (the latest one, on a tie), when it is not `now`: kept
    /// only once a step lowers the state, rather than copied at every step of a setup.
    best: Option<State>,
    pub networked: Option<Reached>,
    /// When it stopped being networked (its teardown began).
    pub torn_down: Option<SystemTime>,
    /// Configuration steps besides loopback (requests, or a state read showing some).
    pub config_steps: usize,
    /// Requests the kernel rejected before the namespace was networked.
    pub rejected: Vec<String>,
    /// The last state read from the kernel, if any.
    pub last_snapshot: Option<SystemTime>,
    /// Interfaces that steps named by index only (see [`State::apply`]).
    pub named_by_index: Vec<u32>,
}

impl Progress {
    /// Folds `entries` (in time order) onto `self`.
    pub(super) fn fold<'a>(
        mut self,
        entries: impl IntoIterator<Item = &'a Entry>,
        names: &HashMap<u32, String>,
    ) -> Self {
        for entry in entries {
            self.step(entry, names);
        }
        self
    }

    pub(super) fn step(&mut self, entry: &Entry, names: &HashMap<u32, String>) {
        if let Some(rejection) = rejection(entry) {
            if self.networked.is_none() {
                self.rejected.push(rejection);
            }
            return;
        }
        let Some(effect) = &entry.effect else {
            return;
        };
        let evidence = match effect {
            Effect::Snapshot(state) => {
                self.last_snapshot = Some(entry.public.at);
                if state.configured() {
                    self.config_steps += 1;
                }
                Evidence::Snapshot {
                    at: entry.public.at,
                }
            }
            _ => {
                if configures(effect) {
                    self.config_steps += 1;
                }
                Evidence::Trace
            }
        };
        if self.best.is_none() && lowers(effect) {
            self.best = Some(self.now.clone());
        }
        self.now.apply(effect, names, &mut self.named_by_index);
        // On a tie the later state wins, unless it only lost lo (a loopback DEL brings it down).
        if let Some(best) = &self.best
            && (self.now.score(), self.now.lo_up) >= (best.score(), best.lo_up)
        {
            self.best = None;
        }
        if self.now.is_networked() {
            if self.networked.is_none() {
                self.networked = Some(Reached {
                    at: entry.public.at,
                    evidence,
                });
            }
        } else if self.networked.is_some() && self.torn_down.is_none() {
            self.torn_down = Some(entry.public.at);
        }
    }

    /// The most complete state reached (the latest one, on a tie).
    pub(crate) fn best(&self) -> &State {
        self.best.as_ref().unwrap_or(&self.now)
    }
}

/// Whether `effect` can take something away from a state (the others only add to it).
fn lowers(effect: &Effect) -> bool {
    match effect {
        Effect::LinkNew { .. }
        | Effect::LinkUp { .. }
        | Effect::DevUp { .. }
        | Effect::AddrAdd { .. }
        | Effect::RouteAdd(_) => false,
        Effect::LinkDown { .. }
        | Effect::LinkDel { .. }
        | Effect::DevGone { .. }
        | Effect::AddrDel { .. }
        | Effect::RouteDel(_)
        | Effect::Snapshot(_) => true,
    }
}

/// A step that configures something besides loopback.
fn configures(effect: &Effect) -> bool {
    match effect {
        Effect::LinkNew { ifname } => ifname.as_deref() != Some("lo"),
        Effect::LinkUp { ifindex, ifname } => {
            *ifindex != LOOPBACK_IFINDEX && ifname.as_deref() != Some("lo")
        }
        Effect::DevUp { ifindex, ifname } => *ifindex != LOOPBACK_IFINDEX && ifname != "lo",
        Effect::AddrAdd { ifindex, addr, .. } => {
            *ifindex != LOOPBACK_IFINDEX && !addr.is_loopback()
        }
        Effect::RouteAdd(_) => true,
        _ => false,
    }
}

/// The rejection an entry records, in words.
fn rejection(entry: &Entry) -> Option<String> {
    let (mut text, extack) = match &entry.public.step {
        Step::Request {
            status: RequestStatus::Rejected { errno, extack },
            op,
            detail,
        } => (
            format!("{op} {detail}: {}", errno_text(*errno)),
            extack.as_ref().or(entry.extack.as_ref()),
        ),
        Step::UnmatchedReply { op, errno, extack } => {
            (format!("{op}: {}", errno_text(*errno)), extack.as_ref())
        }
        _ => return None,
    };
    if let Some(msg) = extack {
        let _ = write!(text, " ({msg})");
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::{SnapshotAddress, SnapshotLink, SnapshotRoute};
    use crate::trace::verdict::TimelineEntry;
    use std::time::{Duration, UNIX_EPOCH};

    fn t(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn entry(ms: u64, effect: Effect) -> Entry {
        Entry {
            id: ms,
            public: std::sync::Arc::new(TimelineEntry {
                at: t(ms),
                pid: 1,
                comm: "plugin".into(),
                step: Step::DevUp {
                    ifname: String::new(),
                    ifindex: 0,
                },
            }),
            effect: Some(effect),
            extack: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn wired() -> Vec<Entry> {
        vec![
            entry(
                1,
                Effect::LinkUp {
                    ifindex: 2,
                    ifname: Some("eth0".into()),
                },
            ),
            entry(
                2,
                Effect::AddrAdd {
                    ifindex: 2,
                    addr: ip("10.0.0.2"),
                    prefix: 24,
                },
            ),
            entry(
                3,
                Effect::RouteAdd(RouteKey {
                    dst: None,
                    dst_len: 0,
                    gateway: Some(ip("10.0.0.1")),
                    oif: Some(2),
                    default: true,
                }),
            ),
        ]
    }

    #[test]
    fn networked_is_kept_through_teardown() {
        let mut entries = wired();
        entries.push(entry(
            4,
            Effect::AddrDel {
                ifindex: 2,
                addr: ip("10.0.0.2"),
                prefix: 24,
            },
        ));
        entries.push(entry(
            5,
            Effect::LinkDel {
                ifindex: 2,
                ifname: None,
            },
        ));
        let names = HashMap::from([(2, "eth0".to_owned())]);
        let p = Progress::default().fold(&entries, &names);
        assert_eq!(
            p.networked,
            Some(Reached {
                at: t(3),
                evidence: Evidence::Trace
            })
        );
        assert_eq!(p.torn_down, Some(t(4)));
        assert!(!p.now.is_networked());
        assert!(p.best().is_networked());
        assert!(p.now.routes.is_empty(), "the link's routes went with it");
    }

    #[test]
    fn a_snapshot_replaces_the_state_and_is_the_evidence() {
        let snapshot = NetnsSnapshot {
            cookie: 7,
            inode: 1,
            links: vec![
                SnapshotLink {
                    index: 1,
                    name: "lo".into(),
                    up: true,
                },
                SnapshotLink {
                    index: 2,
                    name: "eth0".into(),
                    up: true,
                },
            ],
            addresses: vec![
                SnapshotAddress {
                    ifindex: 2,
                    net: "10.0.0.2/24".parse().expect("net"),
                    link_local: false,
                },
                SnapshotAddress {
                    ifindex: 2,
                    net: "fe80::1/64".parse().expect("net"),
                    link_local: true,
                },
            ],
            routes: vec![
                SnapshotRoute {
                    dst: "0.0.0.0/0".parse().expect("net"),
                    gateway: Some(ip("10.0.0.1")),
                    oif: Some(2),
                },
                SnapshotRoute {
                    dst: "fe80::/64".parse().expect("net"),
                    gateway: None,
                    oif: Some(2),
                },
            ],
        };
        let state = State::from_snapshot(&snapshot);
        assert_eq!(
            state.addrs.len(),
            1,
            "link-local addresses are not configuration"
        );
        assert_eq!(
            state.routes.len(),
            1,
            "nor are the kernel's fe80::/64 routes"
        );
        let entries = [entry(10, Effect::Snapshot(Box::new(state)))];
        let p = Progress::default().fold(&entries, &HashMap::new());
        assert_eq!(
            p.networked,
            Some(Reached {
                at: t(10),
                evidence: Evidence::Snapshot { at: t(10) }
            })
        );
        assert_eq!(p.last_snapshot, Some(t(10)));
        assert_eq!(
            p.now.summary(),
            "interfaces up [eth0], addresses [10.0.0.2/24], default route yes, lo up"
        );
    }

    #[test]
    fn a_state_read_and_the_same_steps_traced_count_once() {
        let mut entries = wired();
        let mut state = State::default();
        state.apply(
            &Effect::AddrAdd {
                ifindex: 2,
                addr: ip("10.0.0.2"),
                prefix: 24,
            },
            &HashMap::new(),
            &mut Vec::new(),
        );
        entries.insert(0, entry(0, Effect::Snapshot(Box::new(state))));
        let names = HashMap::from([(2, "eth0".to_owned())]);
        let p = Progress::default().fold(&entries, &names);
        assert_eq!(p.now.addrs.len(), 1, "{:?}", p.now.addrs);
    }

    #[test]
    fn loopback_only_configures_nothing() {
        let entries = [entry(
            1,
            Effect::LinkUp {
                ifindex: 1,
                ifname: Some("lo".into()),
            },
        )];
        let p = Progress::default().fold(&entries, &HashMap::new());
        assert_eq!(p.config_steps, 0);
        assert!(p.now.lo_up);
        assert!(p.best().lo_up, "what it reached shows lo up");
        assert!(p.networked.is_none());
    }

    #[test]
    fn what_a_loopback_only_sandbox_reached_keeps_lo_up_after_its_del() {
        let lo = |at, up| {
            let ifname = Some("lo".into());
            let effect = if up {
                Effect::LinkUp { ifindex: 1, ifname }
            } else {
                Effect::LinkDown { ifindex: 1, ifname }
            };
            entry(at, effect)
        };
        let p = Progress::default().fold(&[lo(1, true), lo(2, false)], &HashMap::new());
        assert!(!p.now.lo_up);
        assert!(p.best().lo_up, "{}", p.best().summary());
    }
}
