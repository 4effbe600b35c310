//! A read of one namespace's network state (links, addresses, main-table routes) straight from
//! the kernel: the evidence the tracer judges on when it did not see a namespace's history.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;

use ipnetwork::IpNetwork;

use super::error::DataplaneError;
use super::netlink::{Conn, socket_in};
use super::netns::{NetnsFile, socket_netns_cookie, without_cookies_as_none};
use super::{address, link, route};

/// The network state of one namespace, as the kernel held it when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetnsSnapshot {
    /// The kernel's cookie of the namespace read (`SO_NETNS_COOKIE`: its identity; inode
    /// numbers are recycled), or 0 where the kernel gives none (before Linux 5.14). The kernel
    /// watch names namespaces its own way (`trace::kernel::NetnsIds`).
    pub cookie: u64,
    /// Inode of the namespace file.
    pub inode: u64,
    pub links: Vec<SnapshotLink>,
    pub addresses: Vec<SnapshotAddress>,
    /// Unicast routes of the main table.
    pub routes: Vec<SnapshotRoute>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotLink {
    pub index: u32,
    pub name: String,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotAddress {
    pub ifindex: u32,
    pub net: IpNetwork,
    pub link_local: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRoute {
    pub dst: IpNetwork,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
}

/// Reads the namespace at `path`: one socket created inside it, three dumps.
pub(crate) async fn take(path: &Path) -> Result<NetnsSnapshot, DataplaneError> {
    let ns = NetnsFile::open_nonblocking(path).await?;
    let inode = ns.inode()?;
    let socket = socket_in(&ns)?;
    let cookie = without_cookies_as_none(socket_netns_cookie(socket.as_fd()))
        .map_err(|source| DataplaneError::Socket {
            netns: ns.label().to_owned(),
            source,
        })?
        .unwrap_or(0);
    let conn = Conn::from_socket(socket, ns.label())?;
    let (links, addresses, routes) = futures::join!(
        link::all(&conn),
        address::all(&conn),
        route::list_main(&conn)
    );
    Ok(NetnsSnapshot {
        cookie,
        inode,
        links: links?
            .into_iter()
            .map(|l| SnapshotLink {
                index: l.index,
                name: l.name,
                up: l.up,
            })
            .collect(),
        addresses: addresses?
            .into_iter()
            .map(|(ifindex, a)| SnapshotAddress {
                ifindex,
                net: a.net,
                link_local: a.link_local,
            })
            .collect(),
        routes: routes?
            .into_iter()
            .map(|r| SnapshotRoute {
                dst: r.dst,
                gateway: r.gw,
                oif: r.oif,
            })
            .collect(),
    })
}
