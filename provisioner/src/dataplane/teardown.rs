//! Teardown of one sandbox: idempotent, keeps going, reports every error at the end.
//!
//! The host veth is not deleted here (the kernel needs ~24 ms of RCU grace periods for that):
//! it is *retired*. The sandbox end first, from the sandbox's socket: its addresses deleted,
//! set down and renamed, so that its interface name is free at once. Then the host end, from
//! the host socket in one batch: the host routes to the addresses the sandbox end held, its
//! own addresses, then down (which flushes whatever still routes through it) and into the
//! graveyard group in one request. The reaper deletes that group in the background. Only that
//! last request puts links in the group, so that a group deletion never takes a pair whose
//! teardown is still cleaning the sandbox end. When teardown returns, nothing in the host netns
//! routes the pod's addresses any more, so the caller may release them. The host end keeps its
//! name until it is deleted; a re-ADD of the same sandbox meanwhile renames it out of its way.

use std::net::IpAddr;
use std::path::Path;

use ipnetwork::IpNetwork;

use provisioner_netlink::{self as req, Req};

use super::error::DataplaneError;
use super::link::{self, Link};
use super::naming::{GRAVEYARD_GROUP, graveyard_ifname, host_ifname};
use super::netlink::Conn;
use super::netns::NetnsFile;
use super::plan::host_route_to;
use super::reaper::Doomed;
use super::spec::TeardownOutcome;
use super::{Dataplane, address, route};
use crate::nsfs::BadNetns;

pub(crate) async fn run(
    dp: &Dataplane,
    container_id: &str,
    ifname: &str,
    netns: Option<&Path>,
) -> Result<TeardownOutcome, DataplaneError> {
    let mut errors = Vec::new();
    let sandbox_ns = match netns {
        Some(path) => Some(dp.open_sandbox_netns(path).await),
        None => None,
    };
    let mut out = TeardownOutcome {
        sandbox_netns_gone: sandbox_ns.as_ref().is_none_or(|opened| {
            matches!(
                opened,
                Err(DataplaneError::OpenNetns { .. }
                    | DataplaneError::BadNetns {
                        reason: BadNetns::NotANamespace { .. },
                        ..
                    })
            )
        }),
        ..TeardownOutcome::default()
    };
    let host_name = host_ifname(container_id, ifname);

    match dp.host().await {
        Ok(host) => match link::by_name(host, &host_name).await {
            // Retired by an earlier teardown: the reaper deletes the pair, both ends.
            Ok(Some(l)) if l.retired => {}
            Ok(Some(l)) => {
                // The sandbox end first: its addresses name the pod's host routes, which the
                // host end then deletes by destination before its own address goes (the last
                // address of a link taking along routes through it walks the whole table).
                let sandbox_end = match sandbox_ns {
                    Some(opened) if !out.sandbox_netns_gone => {
                        withdraw_sandbox(opened, ifname, l.index).await
                    }
                    _ => SandboxEnd::default(),
                };
                let mut host_errors = Vec::new();
                let retired = withdraw_host(host, &l, &sandbox_end.pods, &mut host_errors).await;
                // Deleting the host end deletes its peer: only once the sandbox end is done
                // with, so that teardown never races the reaper.
                let host_ok = retired.map(|doomed| dp.reaper().queue(doomed)).is_some();
                out.host_link_deleted = host_ok;
                out.sandbox_cleaned = sandbox_end.cleaned;
                errors.extend(sandbox_end.errors);
                errors.extend(host_errors);
            }
            Ok(None) => {}
            Err(e) => errors.push(e),
        },
        Err(e) => errors.push(e),
    }

    if errors.is_empty() {
        Ok(out)
    } else {
        Err(DataplaneError::Teardown {
            container_id: container_id.to_owned(),
            errors,
        })
    }
}

/// The sandbox end of our veth (named `ifname` in the netns `opened`, peer of host link
/// `host_index`; a foreign interface is left alone): addresses deleted (the last IPv4 one takes
/// the IPv4 routes through it along), set down (IPv6 routes and addresses go) and renamed
/// `pvx<index>` so that `ifname` is free for a new setup at once. Returns whether it was
/// cleaned, the errors met and the pod addresses it held.
async fn withdraw_sandbox(
    opened: Result<NetnsFile, DataplaneError>,
    ifname: &str,
    host_index: u32,
) -> SandboxEnd {
    let ns = match opened {
        Ok(ns) => ns,
        Err(e) if e.errno() == Some(libc::ENOENT) => return SandboxEnd::default(),
        Err(e) => return SandboxEnd::failed(e),
    };
    let conn = match Conn::open(&ns) {
        Ok(c) => c,
        // Not a netns (any more): nothing to clean there.
        Err(e) if e.errno() == Some(libc::EINVAL) => return SandboxEnd::default(),
        Err(e) => return SandboxEnd::failed(e),
    };
    let l = match link::by_name(&conn, ifname).await {
        Ok(Some(l)) if l.peer_index == Some(host_index) => l,
        Ok(_) => return SandboxEnd::default(),
        Err(e) => return SandboxEnd::failed(e),
    };
    let pods: Vec<_> = match address::list(&conn, l.index, &l.name).await {
        Ok(a) => a
            .into_iter()
            .filter(|a| !a.link_local)
            .map(|a| a.net)
            .collect(),
        Err(e) => return SandboxEnd::failed(e),
    };
    let mut reqs: Vec<(Kind, Req)> = pods
        .iter()
        .map(|net| (Kind::Addr, req::address::del(l.index, &l.name, *net)))
        .collect();
    reqs.push((Kind::Link, req::link::set_down(l.index, &l.name)));
    reqs.push((
        Kind::Link,
        req::link::rename(l.index, &l.name, &graveyard_ifname(l.index)),
    ));
    let mut end = SandboxEnd {
        cleaned: true,
        errors: Vec::new(),
        pods: pods.iter().map(IpNetwork::ip).collect(),
    };
    for res in run_reqs(&conn, reqs).await {
        // The pair may be deleted meanwhile (netns going away, or the reaper): that is clean.
        match res {
            Err(e) if e.errno() == Some(libc::ENODEV) => {}
            Err(e) => {
                end.cleaned = false;
                end.errors.push(e);
            }
            Ok(()) => {}
        }
    }
    end
}

/// What withdrawing the sandbox end did.
#[derive(Debug, Default)]
struct SandboxEnd {
    cleaned: bool,
    errors: Vec<DataplaneError>,
    /// The pod addresses it held.
    pods: Vec<IpAddr>,
}

impl SandboxEnd {
    fn failed(error: DataplaneError) -> Self {
        Self {
            errors: vec![error],
            ..Self::default()
        }
    }
}

/// Sends `reqs` as one batch; results with "already gone" mapped to success per kind.
async fn run_reqs(conn: &Conn, reqs: Vec<(Kind, Req)>) -> Vec<Result<(), DataplaneError>> {
    let (kinds, reqs): (Vec<_>, Vec<_>) = reqs.into_iter().unzip();
    let results = conn.batch(reqs).await;
    kinds
        .into_iter()
        .zip(results)
        .map(|(kind, res)| match kind {
            Kind::Addr => address::del_result(res),
            Kind::Route => route::del_result(res),
            Kind::Link => res,
        })
        .collect()
}

/// [`withdraw_host`], then hands the link to the reaper. Returns whether it was handed over.
pub(crate) async fn retire(
    dp: &Dataplane,
    host: &Conn,
    l: &Link,
    errors: &mut Vec<DataplaneError>,
) -> bool {
    withdraw_host(host, l, &[], errors)
        .await
        .map(|doomed| dp.reaper().queue(doomed))
        .is_some()
}

/// Withdraws everything that routes through the host link `l`: the host routes to `pods`
/// (known from the sandbox end), its addresses, then the link down (which flushes every route
/// through it, IPv4 and IPv6, in the same request: no dump of the node's routing table, whose
/// size grows with the pods) and into the graveyard group. Returns the link for the reaper, or
/// `None` when it could not be retired (or vanished meanwhile).
async fn withdraw_host(
    host: &Conn,
    l: &Link,
    pods: &[IpAddr],
    errors: &mut Vec<DataplaneError>,
) -> Option<Doomed> {
    let addrs = match address::list(host, l.index, &l.name).await {
        Ok(a) => a,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    // One batch, in order: the pod routes, addresses (v6 link-local ones die with the link
    // going down), then the link down into the graveyard group.
    let mut reqs: Vec<(Kind, Req)> = pods
        .iter()
        .map(|pod| {
            let route = host_route_to(*pod);
            (Kind::Route, req::route::del(l.index, &l.name, &route))
        })
        .collect();
    for a in addrs.iter().filter(|a| !a.link_local) {
        reqs.push((Kind::Addr, req::address::del(l.index, &l.name, a.net)));
    }
    reqs.push((
        Kind::Link,
        req::link::retire(l.index, &l.name, GRAVEYARD_GROUP),
    ));
    let mut results = run_reqs(host, reqs).await;
    let retired = results.pop();
    errors.extend(results.into_iter().filter_map(Result::err));
    match retired {
        Some(Ok(())) => Some(Doomed {
            index: l.index,
            name: l.name.clone(),
        }),
        // Deleted meanwhile (e.g. its sandbox netns went away): nothing left to do.
        Some(Err(e)) if e.errno() == Some(libc::ENODEV) => None,
        Some(Err(e)) => {
            errors.push(e);
            None
        }
        None => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Addr,
    Route,
    Link,
}
