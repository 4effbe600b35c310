//! Network namespace files (nsfs): opening one without blocking, telling whether it is a
//! network namespace, and which one. The CNI plugin checks its `CNI_NETNS` with it before it
//! asks the daemon, and the dataplane every sandbox's netns: one check, one set of reasons.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::sys::statfs::{FsType, NSFS_MAGIC};

/// Why a path did not open as a sandbox's network namespace.
#[derive(Debug)]
pub(crate) enum NetnsFileError {
    /// Opening or reading the file failed (`ENOENT`: nothing at the path).
    Io(io::Error),
    /// What is there is not a network namespace a sandbox may use.
    Bad(BadNetns),
}

/// Why a path is not usable as a sandbox's network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadNetns {
    /// Not a namespace file at all (a regular file, a FIFO, a directory...).
    NotANamespace { fs_type: FsType },
    /// A namespace of another type (mount, pid...): the `CLONE_NEW*` flag.
    NotNetwork { ns_type: i32 },
    /// A network namespace the daemon keeps for itself (named).
    NotASandbox(&'static str),
}

impl std::fmt::Display for BadNetns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadNetns::NotANamespace { fs_type } => write!(
                f,
                "not a namespace file (filesystem type {:#x}, not nsfs)",
                fs_type.0
            ),
            BadNetns::NotNetwork { ns_type } => {
                write!(f, "not a network namespace (namespace type {ns_type:#x})")
            }
            BadNetns::NotASandbox(what) => write!(f, "is {what}, not a sandbox's"),
        }
    }
}

/// Which namespace a namespace file is (device and inode of nsfs): stable while the namespace
/// lives, so good to recognise namespaces the daemon keeps alive (its own, the node's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NsIdentity {
    dev: u64,
    ino: u64,
    /// What this namespace is, for messages.
    what: &'static str,
}

impl NsIdentity {
    pub(crate) fn same_namespace(&self, other: &NsIdentity) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    #[must_use]
    pub(crate) fn named(mut self, what: &'static str) -> Self {
        self.what = what;
        self
    }
}

/// Opens the network namespace at `path` without blocking (`O_NONBLOCK`: a FIFO or a device
/// put there cannot hang the caller) and checks what was opened ([`check_is_netns`]).
pub(crate) fn open(path: &Path) -> Result<File, NetnsFileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(NetnsFileError::Io)?;
    check_is_netns(&file)?;
    Ok(file)
}

/// `file` is on nsfs, and a network namespace (`NS_GET_NSTYPE`, Linux >= 4.11).
pub(crate) fn check_is_netns(file: &File) -> Result<(), NetnsFileError> {
    let fs = nix::sys::statfs::fstatfs(file).map_err(|e| NetnsFileError::Io(e.into()))?;
    let fs_type = fs.filesystem_type();
    if fs_type != NSFS_MAGIC {
        return Err(NetnsFileError::Bad(BadNetns::NotANamespace { fs_type }));
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd, which `file` keeps open.
    let ns_type = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if ns_type < 0 {
        return Err(NetnsFileError::Io(io::Error::last_os_error()));
    }
    if ns_type != libc::CLONE_NEWNET {
        return Err(NetnsFileError::Bad(BadNetns::NotNetwork { ns_type }));
    }
    Ok(())
}

/// Device and inode of the namespace `file` is: which namespace it is while it lives.
pub(crate) fn identity(file: &File) -> io::Result<NsIdentity> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    Ok(NsIdentity {
        dev: meta.dev(),
        ino: meta.ino(),
        what: "",
    })
}

/// A namespace a sandbox may use: none of `not_sandboxes` (the node's netns, the daemon's
/// own).
pub(crate) fn check_sandbox(
    file: &File,
    not_sandboxes: &[NsIdentity],
) -> Result<(), NetnsFileError> {
    let id = identity(file).map_err(NetnsFileError::Io)?;
    match not_sandboxes.iter().find(|f| f.same_namespace(&id)) {
        Some(forbidden) => Err(NetnsFileError::Bad(BadNetns::NotASandbox(forbidden.what))),
        None => Ok(()),
    }
}

/// Whether `path` is a network namespace other than the calling process's own (named `own`
/// in the error): the sandbox netns check of the CNI plugin process, the same one the daemon
/// makes against the node's and its own namespaces.
pub(crate) fn check_netns_path(path: &Path, own: &'static str) -> Result<(), NetnsFileError> {
    let own = identity(&open(Path::new("/proc/self/ns/net"))?)
        .map_err(NetnsFileError::Io)?
        .named(own);
    check_sandbox(&open(path)?, &[own])
}
