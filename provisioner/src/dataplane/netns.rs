//! Network namespace handles and running a closure inside a netns.
//!
//! The calling thread never changes its netns: work that must happen "inside" a namespace
//! (creating a netlink socket, opening a `/proc/sys/net` file) runs on a short-lived thread that
//! entered the namespace with `setns(CLONE_NEWNET)` and exits afterwards.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

use super::error::DataplaneError;

/// An open network namespace file (`/run/netns/x`, `/proc/<pid>/ns/net`, ...).
#[derive(Debug)]
pub(crate) struct NetnsFile {
    file: File,
    label: String,
}

impl NetnsFile {
    /// Opens the netns at `path`. A missing path is reported as `OpenNetns` with `ENOENT`.
    pub(crate) fn open(path: &Path) -> Result<Self, DataplaneError> {
        let label = path.display().to_string();
        let file = File::open(path).map_err(|source| DataplaneError::OpenNetns {
            netns: label.clone(),
            source,
        })?;
        Ok(Self { file, label })
    }

    /// The netns of the calling thread.
    pub(crate) fn current_thread() -> Result<Self, DataplaneError> {
        let path = PathBuf::from("/proc/thread-self/ns/net");
        let file = File::open(&path).map_err(|source| DataplaneError::OpenNetns {
            netns: path.display().to_string(),
            source,
        })?;
        Ok(Self {
            file,
            label: "host".to_owned(),
        })
    }

    /// A name for messages: the path it was opened from.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The raw fd, e.g. for `IFLA_NET_NS_FD`; valid while `self` lives.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Runs `f` on a fresh thread that entered this netns, without blocking the async caller.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T, DataplaneError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let file = self
            .file
            .try_clone()
            .map_err(|source| DataplaneError::EnterNetns {
                netns: self.label.clone(),
                source,
            })?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("netns-worker".to_owned())
            .spawn(move || {
                let res = setns(file.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)
                    .map(|()| f());
                drop(file);
                // The receiver only goes away when the caller was cancelled.
                let _ = tx.send(res);
            })
            .map_err(|source| DataplaneError::EnterNetns {
                netns: self.label.clone(),
                source,
            })?;
        let res = rx.await.map_err(|_| DataplaneError::EnterNetns {
            netns: self.label.clone(),
            source: io::Error::other("netns worker thread died"),
        })?;
        res.map_err(|source| DataplaneError::EnterNetns {
            netns: self.label.clone(),
            source,
        })
    }

    /// Like [`Self::run`] but blocking the calling thread (for sync constructors).
    pub(crate) fn run_blocking<T, F>(&self, f: F) -> Result<T, DataplaneError>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let fd = self.file.as_fd();
        std::thread::scope(|scope| {
            scope
                .spawn(move || setns(fd, CloneFlags::CLONE_NEWNET).map(|()| f()))
                .join()
                .map_err(|_| io::Error::other("netns worker thread panicked"))?
                .map_err(io::Error::from)
        })
        .map_err(|source| DataplaneError::EnterNetns {
            netns: self.label.clone(),
            source,
        })
    }
}
