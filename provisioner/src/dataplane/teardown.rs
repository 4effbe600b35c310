//! Teardown of one sandbox: idempotent, keeps going, reports every error at the end.

use std::path::Path;

use super::error::DataplaneError;
use super::link::{self, Link};
use super::naming::host_ifname;
use super::netlink::Conn;
use super::netns::NetnsFile;
use super::spec::TeardownOutcome;
use super::{Dataplane, address, route};

pub(crate) async fn run(
    dp: &Dataplane,
    container_id: &str,
    ifname: &str,
    netns: Option<&Path>,
) -> Result<TeardownOutcome, DataplaneError> {
    let mut errors = Vec::new();
    let mut out = TeardownOutcome::default();
    let host_name = host_ifname(container_id, ifname);

    let host = match dp.host().await {
        Ok(h) => Some(h.clone()),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let host_link = match &host {
        Some(h) => match link::by_name(h, &host_name).await {
            Ok(l) => l,
            Err(e) => {
                errors.push(e);
                None
            }
        },
        None => None,
    };

    // Sandbox side: withdraw routes and addresses of our interface, if the netns still exists
    // and the interface there is the peer of our host veth (never touch a foreign interface).
    match open_sandbox(netns).await {
        Ok(None) => out.sandbox_netns_gone = true,
        Ok(Some(conn)) => {
            if let Some(host_link) = &host_link {
                match link::by_name(&conn, ifname).await {
                    Ok(Some(l)) if l.peer_index == Some(host_link.index) => {
                        withdraw(&conn, &l, &mut errors).await;
                        out.sandbox_cleaned = true;
                    }
                    Ok(_) => {}
                    Err(e) => errors.push(e),
                }
            }
        }
        Err(e) => errors.push(e),
    }

    // Host side: withdraw the host route and gateway address synchronously, then delete the
    // veth (that removes both ends).
    if let (Some(h), Some(l)) = (&host, &host_link) {
        withdraw(h, l, &mut errors).await;
        match link::delete(h, l.index, &host_name).await {
            Ok(()) => out.host_link_deleted = true,
            Err(e) => errors.push(e),
        }
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

/// Opens the sandbox netns; `Ok(None)` when it was not given, is gone or is not a netns.
async fn open_sandbox(netns: Option<&Path>) -> Result<Option<Conn>, DataplaneError> {
    let Some(path) = netns else { return Ok(None) };
    let ns = match NetnsFile::open(path) {
        Ok(ns) => ns,
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    match Conn::open(&ns).await {
        Ok(c) => Ok(Some(c)),
        // setns(2) on something that is not a netns (e.g. the bind mount was removed and
        // the path is now a plain file).
        Err(e) if e.errno() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes every main-table route through `l` and every non-link-local address of `l`.
async fn withdraw(conn: &Conn, l: &Link, errors: &mut Vec<DataplaneError>) {
    match route::list_main(conn).await {
        Ok(routes) => {
            // Routes via a gateway first, the on-link routes they depend on last.
            let (mut mine, _): (Vec<_>, Vec<_>) =
                routes.into_iter().partition(|r| r.oif == Some(l.index));
            mine.sort_by_key(|r| r.gw.is_none());
            for r in &mine {
                if let Err(e) = route::del_found(conn, r, &l.name).await {
                    errors.push(e);
                }
            }
        }
        Err(e) => errors.push(e),
    }
    match address::list(conn, l.index, &l.name).await {
        Ok(addrs) => {
            for a in addrs.iter().filter(|a| !a.link_local) {
                if let Err(e) = address::del(conn, l.index, &l.name, a.net).await {
                    errors.push(e);
                }
            }
        }
        Err(e) => errors.push(e),
    }
}
