//! Naming a network namespace as the watch's records do, from a path (`/run/netns/x`,
//! `/proc/<pid>/ns/net`) or from its inode and the kernel's cookie.
//!
//! Where the kernel gives a namespace's cookie to userspace (`SO_NETNS_COOKIE`, Linux 5.14),
//! records carry it and a namespace file is named by it. Elsewhere the programs name a
//! namespace `generation << 32 | inode` (the eBPF crate's `netns_id.rs` says why that is
//! sound), and a file is named by looking its inode's generation up in their map: names then
//! hold for one run of the watch.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use aya::maps::{HashMap as BpfHashMap, MapData};

use super::backends::Backend;
use super::events::NetnsRef;

/// How one run of the watch names namespaces; cheap to clone.
#[derive(Clone)]
pub struct NetnsIds(Arc<Ids>);

enum Ids {
    KernelCookies,
    /// The programs' `NETNS_GENERATIONS` map: namespaces created per inode number.
    InodeGenerations(BpfHashMap<MapData, u32, u32>),
}

impl std::fmt::Debug for NetnsIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.backend().name())
    }
}

impl NetnsIds {
    /// Names are the kernel's cookies.
    pub fn kernel_cookies() -> Self {
        Self(Arc::new(Ids::KernelCookies))
    }

    /// Names are inode generations, counted in `generations`.
    pub(super) fn inode_generations(generations: BpfHashMap<MapData, u32, u32>) -> Self {
        Self(Arc::new(Ids::InodeGenerations(generations)))
    }

    pub fn backend(&self) -> Backend {
        match *self.0 {
            Ids::KernelCookies => Backend::KernelCookie,
            Ids::InodeGenerations(_) => Backend::InodeGeneration,
        }
    }

    /// The name of the namespace whose file has `inode`, given the kernel's cookie of it when
    /// the kernel gives one; `None` when it cannot be named.
    pub fn name(&self, inode: u64, kernel_cookie: Option<u64>) -> Option<u64> {
        match &*self.0 {
            Ids::KernelCookies => kernel_cookie,
            Ids::InodeGenerations(generations) => {
                let inode = u32::try_from(inode).ok()?;
                // A missing key is generation 0: a namespace no program saw created.
                let generation = generations.get(&inode, 0).unwrap_or(0);
                Some((u64::from(generation) << 32) | u64::from(inode))
            }
        }
    }

    /// Inode and name of the namespace at `path`, for synchronous callers (tests); the daemon
    /// and `provisioner trace` use [`Self::identify`].
    pub fn of_path(&self, path: &Path) -> std::io::Result<NetnsRef> {
        let file = File::open(path)?;
        let inode = file.metadata()?.ino();
        let kernel_cookie = match self.backend() {
            Backend::KernelCookie => Some(kernel_cookie_of_file(&file)?),
            _ => None,
        };
        self.named(path, inode, kernel_cookie)
    }

    /// [`Self::of_path`] for async callers, on the dataplane's pooled netns workers (no thread
    /// is created per namespace: the daemon names one per ADD).
    pub async fn identify(&self, path: &Path) -> std::io::Result<NetnsRef> {
        let (inode, kernel_cookie) = crate::dataplane::netns_inode_and_cookie(path)
            .await
            .map_err(std::io::Error::other)?;
        self.named(path, inode, kernel_cookie)
    }

    fn named(
        &self,
        path: &Path,
        inode: u64,
        kernel_cookie: Option<u64>,
    ) -> std::io::Result<NetnsRef> {
        let cookie = self.name(inode, kernel_cookie).ok_or_else(|| {
            std::io::Error::other(format!(
                "{} cannot be named: this kernel gives no namespace cookie (SO_NETNS_COOKIE, Linux 5.14)",
                path.display()
            ))
        })?;
        let inode = u32::try_from(inode).map_err(std::io::Error::other)?;
        Ok(NetnsRef { cookie, inode })
    }
}

/// The kernel's cookie of the namespace of `file`: from the file when the kernel gives it
/// ([`crate::dataplane::netns_cookie_of_file`]), else `SO_NETNS_COOKIE` on a socket created by
/// a short-lived thread that entered the namespace.
fn kernel_cookie_of_file(file: &File) -> std::io::Result<u64> {
    if let Some(cookie) = crate::dataplane::netns_cookie_of_file(file) {
        return Ok(cookie);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> std::io::Result<u64> {
                nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                crate::dataplane::current_netns_cookie()
            })
            .join()
            .map_err(|_| std::io::Error::other("netns cookie thread panicked"))?
    })
}

/// Whether this kernel gives userspace a namespace's cookie (`SO_NETNS_COOKIE`).
pub fn kernel_gives_cookies() -> bool {
    crate::dataplane::current_netns_cookie().is_ok()
}

/// The kernel's name of the namespace at `path` (its cookie), where the kernel gives it: what
/// every run of the watch names it on such a kernel.
pub fn netns_of_path(path: &Path) -> std::io::Result<NetnsRef> {
    NetnsIds::kernel_cookies().of_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_cookies_name_a_namespace_by_its_cookie_only() {
        let ids = NetnsIds::kernel_cookies();
        assert_eq!(ids.name(4_026_531_840, Some(7)), Some(7));
        assert_eq!(ids.name(4_026_531_840, None), None);
        assert_eq!(ids.backend(), Backend::KernelCookie);
    }

    #[test]
    fn the_own_namespace_is_named_by_its_cookie() -> std::io::Result<()> {
        let own = netns_of_path(Path::new("/proc/self/ns/net"))?;
        assert_eq!(own.cookie, crate::dataplane::current_netns_cookie()?);
        let inode = std::fs::metadata("/proc/self/ns/net")?.ino();
        assert_eq!(u64::from(own.inode), inode);
        Ok(())
    }
}
