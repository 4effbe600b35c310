//! Naming a network namespace from a path (`/run/netns/x`, `/proc/<pid>/ns/net`).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::events::NetnsRef;

/// Inode and cookie of the namespace at `path`, for synchronous callers (the tests' tracing
/// helpers; the daemon and `provisioner trace` use [`identify`]). The cookie comes from the
/// file when the kernel gives it ([`crate::dataplane::netns_cookie_of_file`]), else from
/// `SO_NETNS_COOKIE` on a socket created by a short-lived thread that entered the namespace.
pub fn netns_of_path(path: &Path) -> std::io::Result<NetnsRef> {
    let file = File::open(path)?;
    let inode = u32::try_from(file.metadata()?.ino()).map_err(std::io::Error::other)?;
    if let Some(cookie) = crate::dataplane::netns_cookie_of_file(&file) {
        return Ok(NetnsRef { cookie, inode });
    }
    let cookie = std::thread::scope(|scope| {
        scope
            .spawn(|| -> std::io::Result<u64> {
                nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                current_netns_cookie()
            })
            .join()
            .map_err(|_| std::io::Error::other("netns cookie thread panicked"))?
    })?;
    Ok(NetnsRef { cookie, inode })
}

/// [`netns_of_path`] for async callers, on the dataplane's pooled netns workers (no thread is
/// created per namespace: the daemon names one per ADD).
pub async fn identify(path: &Path) -> std::io::Result<NetnsRef> {
    let (inode, cookie) = crate::dataplane::netns_inode_and_cookie(path)
        .await
        .map_err(std::io::Error::other)?;
    let inode = u32::try_from(inode).map_err(std::io::Error::other)?;
    Ok(NetnsRef { cookie, inode })
}

pub use crate::dataplane::current_netns_cookie;
