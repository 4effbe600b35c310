//! Network namespace handles and running a closure inside a netns.
//!
//! Work that must happen "inside" a namespace runs either on the calling thread for an instant
//! (`run_here`: creating a netlink socket; the thread is back in its netns before the call
//! returns) or, when it touches files (`/proc/sys/net`), on one of a few long-lived worker
//! threads: it enters the namespace with `setns(CLONE_NEWNET)`, runs the job and goes back to
//! its home netns (the process's), so no worker pins a sandbox netns after its job. Spawning a
//! thread per job cost more than the job itself.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Mutex, OnceLock, PoisonError};

use nix::sched::{CloneFlags, setns};
use nix::sys::statfs::NSFS_MAGIC;

use super::error::DataplaneError;
use crate::nsfs::{self, NsIdentity};

/// An open network namespace file (`/run/netns/x`, `/proc/<pid>/ns/net`, ...).
#[derive(Debug)]
pub(crate) struct NetnsFile {
    file: File,
    label: String,
}

impl NetnsFile {
    /// Opens the network namespace at `path` without blocking (`O_NONBLOCK`: a FIFO or a device
    /// put there cannot hang the caller) and checks what was opened: a namespace file (nsfs) of
    /// a network namespace. A missing path is reported as `OpenNetns` with `ENOENT`; anything
    /// else that is not a network namespace as [`DataplaneError::BadNetns`].
    pub(crate) fn open(path: &Path) -> Result<Self, DataplaneError> {
        let label = path.display().to_string();
        match nsfs::open(path) {
            Ok(file) => Ok(Self { file, label }),
            Err(e) => Err(DataplaneError::of_netns_file(label, e)),
        }
    }

    /// [`Self::open`] when it cannot block the caller: `None` when it might (the path is not
    /// all in the dentry cache, or leads to something other than a namespace file, or the
    /// kernel predates `RESOLVE_CACHED`): then open it from a blocking thread.
    ///
    /// The path is resolved from the dentry cache alone, to an `O_PATH` handle (`openat2` with
    /// `RESOLVE_CACHED`: no file system code runs, a FUSE or NFS path that needs asking fails
    /// at once with `EAGAIN`); only a namespace file (nsfs, told by its device from cached
    /// attributes) is then opened for real, through that handle, and nsfs waits for nothing.
    fn open_cached(path: &Path) -> Option<Result<Self, DataplaneError>> {
        use std::os::unix::fs::OpenOptionsExt;
        let label = path.display().to_string();
        let located = match open_path_cached(path) {
            Ok(located) => located,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::ENOSYS | libc::EINVAL | libc::E2BIG)
                ) =>
            {
                return None;
            }
            Err(source) => {
                return Some(Err(DataplaneError::OpenNetns {
                    netns: label,
                    source,
                }));
            }
        };
        if cached_device(&located)? != nsfs_device()? {
            return None;
        }
        // Without /proc the blocking open still can.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(format!("/proc/thread-self/fd/{}", located.as_raw_fd()))
            .ok()?;
        let ns = Self { file, label };
        Some(ns.check_is_netns().map(|()| ns))
    }

    /// [`Self::open`] without blocking the caller's thread: from the dentry cache when it can
    /// ([`Self::open_cached`]), else from a blocking thread.
    pub(crate) async fn open_nonblocking(path: &Path) -> Result<Self, DataplaneError> {
        if let Some(opened) = Self::open_cached(path) {
            return opened;
        }
        let label = path.display().to_string();
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open(&path))
            .await
            .map_err(|e| DataplaneError::Protocol {
                op: "open the netns".to_owned(),
                netns: label,
                detail: format!("the blocking task failed: {e}"),
            })?
    }

    /// A namespace a sandbox may use: none of `not_sandboxes` (the node's netns, the daemon's
    /// own).
    pub(crate) fn check_sandbox(&self, not_sandboxes: &[NsIdentity]) -> Result<(), DataplaneError> {
        nsfs::check_sandbox(&self.file, not_sandboxes)
            .map_err(|e| DataplaneError::of_netns_file(self.label.clone(), e))
    }

    /// nsfs, and a network namespace (see [`nsfs::check_is_netns`]).
    fn check_is_netns(&self) -> Result<(), DataplaneError> {
        nsfs::check_is_netns(&self.file)
            .map_err(|e| DataplaneError::of_netns_file(self.label.clone(), e))
    }

    /// Device and inode of the namespace: which namespace it is while it lives.
    pub(crate) fn identity(&self) -> Result<NsIdentity, DataplaneError> {
        nsfs::identity(&self.file).map_err(|source| DataplaneError::OpenNetns {
            netns: self.label.clone(),
            source,
        })
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

    /// A second handle on the same netns.
    pub(crate) fn try_clone(&self) -> Result<Self, DataplaneError> {
        let file = self
            .file
            .try_clone()
            .map_err(|source| DataplaneError::OpenNetns {
                netns: self.label.clone(),
                source,
            })?;
        Ok(Self {
            file,
            label: self.label.clone(),
        })
    }

    /// Moves the calling thread into this netns for good: only for a dedicated thread that
    /// provisioner started for work in this netns (e.g. the link reaper).
    pub(crate) fn enter_current_thread(&self) -> Result<(), DataplaneError> {
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| DataplaneError::EnterNetns {
            netns: self.label.clone(),
            source: io::Error::from(e),
        })
    }

    /// Inode of the namespace (not its identity: inodes are recycled at once; see the cookie).
    pub(crate) fn inode(&self) -> Result<u64, DataplaneError> {
        use std::os::unix::fs::MetadataExt;
        self.file
            .metadata()
            .map(|m| m.ino())
            .map_err(|source| DataplaneError::OpenNetns {
                netns: self.label.clone(),
                source,
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

    /// Runs `f` on a pooled worker thread that entered this netns (and returns to its home netns
    /// afterwards), without blocking the async caller.
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
        pool().submit(Box::new(move || {
            let res = setns(file.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)
                .map(|()| f());
            drop(file);
            // The receiver only goes away when the caller was cancelled.
            let _ = tx.send(res);
        }));
        let res = rx.await.map_err(|_| DataplaneError::EnterNetns {
            netns: self.label.clone(),
            source: io::Error::other("netns worker thread died"),
        })?;
        res.map_err(|source| DataplaneError::EnterNetns {
            netns: self.label.clone(),
            source,
        })
    }

    /// Runs `f` on the calling thread inside this netns, and puts the thread back in the netns
    /// it was in before returning: for a job that cannot block and is cheaper than the two
    /// thread wake-ups of handing it to a worker (creating a socket: an open of the thread's
    /// netns file and two `setns` against about 30 us of wake-ups per ADD on the daemon's
    /// path). Nothing else runs on the thread meanwhile: `f` is synchronous.
    pub(crate) fn run_here<T>(&self, f: impl FnOnce() -> T) -> Result<T, DataplaneError> {
        let enter_failed = |source: io::Error| DataplaneError::EnterNetns {
            netns: self.label.clone(),
            source,
        };
        let back = File::open("/proc/thread-self/ns/net").map_err(enter_failed)?;
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| enter_failed(io::Error::from(e)))?;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        if let Err(e) = setns(back.as_fd(), CloneFlags::CLONE_NEWNET) {
            // Going on would open every later socket of this thread in the sandbox's netns.
            // A restart converges (nothing the daemon keeps depends on this thread's state).
            tracing::error!(netns = %self.label, error = %e, "cannot leave a sandbox netns; aborting");
            std::process::abort();
        }
        match result {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// The cookie (`SO_NETNS_COOKIE`) of the network namespace `socket` lives in: the identity of
/// a namespace (unlike its inode, never reused while the system runs).
pub fn socket_netns_cookie(socket: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`, a valid u64, and `socket`
    // is an open fd for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The cookie of the calling thread's network namespace (of a socket it creates).
pub fn current_netns_cookie() -> io::Result<u64> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    socket_netns_cookie(sock.as_fd())
}

/// `NS_GET_ID` (`_IOR(0xb7, 13, __u64)`): the id of the namespace of an nsfs file.
const NS_GET_ID: libc::c_ulong = 0x8008_b70d;

/// The cookie of the network namespace of nsfs file `file` without entering it, when the
/// kernel gives it (see `ns_id_is_cookie`); otherwise `None`.
pub fn netns_cookie_of_file(file: &File) -> Option<u64> {
    ns_id_is_cookie().then(|| ns_id(file).ok()).flatten()
}

/// Whether `NS_GET_ID` gives a network namespace's cookie on this kernel. Decided once, on a
/// namespace made for the check by a thread that ends at once: not on the initial namespace,
/// whose id and cookie could both be 1 on a kernel that counts them apart. (It makes a
/// namespace: call it before the kernel watch attaches, as [`super::Dataplane`] does.)
pub fn ns_id_is_cookie() -> bool {
    static DECIDED: OnceLock<bool> = OnceLock::new();
    *DECIDED.get_or_init(|| {
        std::thread::Builder::new()
            .name("netns-id-check".to_owned())
            .spawn(|| -> io::Result<bool> {
                nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                let own = File::open("/proc/thread-self/ns/net")?;
                Ok(ns_id(&own)? == current_netns_cookie()?)
            })
            .ok()
            .and_then(|check| check.join().ok())
            .and_then(Result::ok)
            .unwrap_or(false)
    })
}

fn ns_id(file: &File) -> io::Result<u64> {
    let mut id: u64 = 0;
    // SAFETY: NS_GET_ID writes one u64 through the pointer, which points at `id`; `file` stays
    // open for the duration of the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_ID as _, &raw mut id) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

impl NetnsFile {
    /// Its namespace's cookie, when the kernel gives it without entering the namespace (see
    /// [`netns_cookie_of_file`]).
    pub(crate) fn cookie_without_entering(&self) -> Option<u64> {
        netns_cookie_of_file(&self.file)
    }
}

/// Inode and cookie of the network namespace at `path` (checked to be one); the cookie from
/// [`netns_cookie_of_file`], else read on a pooled netns worker (no thread created per call);
/// `None` where the kernel gives no cookie (`SO_NETNS_COOKIE`, Linux 5.14).
pub async fn netns_inode_and_cookie(path: &Path) -> Result<(u64, Option<u64>), DataplaneError> {
    let ns = NetnsFile::open_nonblocking(path).await?;
    let inode = ns.inode()?;
    if let Some(cookie) = netns_cookie_of_file(&ns.file) {
        return Ok((inode, Some(cookie)));
    }
    let cookie = ns
        .run(|| without_cookies_as_none(current_netns_cookie()))
        .await?
        .map_err(|source| DataplaneError::OpenNetns {
            netns: ns.label().to_owned(),
            source,
        })?;
    Ok((inode, cookie))
}

/// `read`'s cookie, or `None` when the kernel has no `SO_NETNS_COOKIE` (`ENOPROTOOPT`).
pub(crate) fn without_cookies_as_none(read: io::Result<u64>) -> io::Result<Option<u64>> {
    match read {
        Ok(cookie) => Ok(Some(cookie)),
        Err(err) if err.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(None),
        Err(err) => Err(err),
    }
}

/// An `O_PATH` handle on `path`, resolved from the dentry cache alone (`EAGAIN` when that is
/// not enough).
fn open_path_cached(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain old data; every field is set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_CACHED;
    // SAFETY: a NUL-terminated path and a valid open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            &raw const how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: openat2 just returned this fd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The device of the file behind `fd`, from its cached attributes (`AT_STATX_DONT_SYNC`: a
/// network or FUSE file system is not asked); `None` when they cannot be read.
fn cached_device(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: statx is plain old data, filled by the kernel.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty path with AT_EMPTY_PATH names `fd` itself; `st` is a valid out-pointer.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            &raw mut st,
        )
    };
    (rc == 0).then(|| libc::makedev(st.stx_dev_major, st.stx_dev_minor))
}

/// The device of nsfs, the file system of every namespace file.
fn nsfs_device() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    static DEVICE: OnceLock<Option<u64>> = OnceLock::new();
    *DEVICE.get_or_init(|| std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.dev()))
}

/// Is `path` an existing namespace file (and not, e.g., a plain file left where a bind mount
/// was)? Looks at the path without opening it, so a FIFO cannot block the caller.
pub(crate) fn is_netns(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .ok()
        .is_some_and(|st| st.filesystem_type() == NSFS_MAGIC)
}

/// Number of netns worker threads: jobs are short (setns, a socket, a few file writes).
const WORKERS: usize = 2;

type Job = Box<dyn FnOnce() + Send>;

/// The process-wide netns worker pool.
struct Pool {
    tx: Mutex<Sender<Job>>,
    rx: Mutex<Receiver<Job>>,
    /// The netns workers return to after each job (the process's), opened once; without it a
    /// worker exits after its job and is replaced.
    home: Option<File>,
    alive: AtomicUsize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        // The netns of the thread that starts the pool: provisioner never moves the netns of
        // its own threads (workers go back home), so this is the process's netns.
        let home = File::open("/proc/thread-self/ns/net").ok();
        Pool {
            tx: Mutex::new(tx),
            rx: Mutex::new(rx),
            home,
            alive: AtomicUsize::new(0),
        }
    })
}

impl Pool {
    fn submit(&'static self, job: Job) {
        while self.alive.load(Ordering::Acquire) < WORKERS {
            if !self.spawn_worker() {
                break;
            }
        }
        if self.alive.load(Ordering::Acquire) == 0 {
            // No worker could be started: run the job on a thread of its own.
            std::thread::spawn(job);
            return;
        }
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job);
        if let Err(std::sync::mpsc::SendError(job)) = sent {
            // The receiver lives as long as the pool (never dropped); kept for completeness.
            std::thread::spawn(job);
        }
    }

    /// Starts one worker; false when the thread could not be created.
    fn spawn_worker(&'static self) -> bool {
        self.alive.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("netns-worker".to_owned())
            .spawn(move || {
                loop {
                    let job = {
                        let rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner);
                        match rx.recv() {
                            Ok(job) => job,
                            Err(_) => break,
                        }
                    };
                    // A panicking job drops its answer channel: the caller sees an error.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    let home = match &self.home {
                        Some(home) => setns(home.as_fd(), CloneFlags::CLONE_NEWNET),
                        None => Err(nix::errno::Errno::ENOENT),
                    };
                    if let Err(e) = home {
                        // Possibly stuck in a foreign netns: never run another job here (nor
                        // pin that netns); the next submit starts a replacement.
                        tracing::warn!(error = %e, "netns worker cannot return home; retiring it");
                        break;
                    }
                }
                self.alive.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.alive.fetch_sub(1, Ordering::AcqRel);
            tracing::error!(error = %e, "spawn netns worker");
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::nsfs::BadNetns;

    /// A new network namespace (made by a thread that ends at once; its open file keeps it),
    /// and its cookie as a socket inside it reads it.
    fn fresh_netns() -> (File, u64) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let made = nix::sched::unshare(CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)
                .and_then(|()| {
                    let cookie = current_netns_cookie()?;
                    Ok((File::open("/proc/thread-self/ns/net")?, cookie))
                });
            let _ = tx.send(made);
        });
        rx.recv().expect("thread answers").expect("unshare (root)")
    }

    /// `file`'s namespace bind-mounted on a file in `dir`, as `ip netns add` pins one; unmounted
    /// when dropped.
    struct Pinned(PathBuf);

    impl Pinned {
        fn new(dir: &Path, file: &File) -> Self {
            let path = dir.join("pinned");
            File::create(&path).expect("mount point");
            let source = format!("/proc/self/fd/{}", file.as_raw_fd());
            nix::mount::mount(
                Some(source.as_str()),
                &path,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .expect("bind mount (root)");
            Self(path)
        }
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    #[test]
    fn a_pinned_namespace_is_opened_from_the_dentry_cache_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (file, _) = fresh_netns();
        let pinned = Pinned::new(dir.path(), &file);
        let expected = NetnsFile {
            file,
            label: "fresh".to_owned(),
        }
        .identity()
        .expect("identity");
        let ns = NetnsFile::open_cached(&pinned.0)
            .expect("a pin just made is cached")
            .expect("a network namespace");
        assert!(ns.identity().expect("identity").same_namespace(&expected));
        match ns.check_sandbox(&[expected.named("the node's")]) {
            Err(DataplaneError::BadNetns {
                reason: BadNetns::NotASandbox(what),
                ..
            }) => assert_eq!(what, "the node's"),
            other => panic!("the node's namespace as a sandbox's: {other:?}"),
        }
    }

    #[test]
    fn what_is_no_namespace_file_is_left_to_the_blocking_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = dir.path().join("plain");
        File::create(&plain).expect("plain file");
        assert!(NetnsFile::open_cached(&plain).is_none());
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("fifo");
        assert!(NetnsFile::open_cached(&fifo).is_none());
        // The blocking open names what it found.
        assert!(matches!(
            NetnsFile::open(&plain),
            Err(DataplaneError::BadNetns {
                reason: BadNetns::NotANamespace { .. },
                ..
            })
        ));
    }

    #[test]
    fn run_here_works_inside_the_netns_and_leaves_the_thread_where_it_was() {
        let (file, cookie) = fresh_netns();
        let ns = NetnsFile {
            file,
            label: "fresh".to_owned(),
        };
        let before = current_netns_cookie().expect("cookie before");
        let inside = ns.run_here(current_netns_cookie).expect("enter");
        assert_eq!(inside.expect("cookie inside"), cookie);
        assert_eq!(current_netns_cookie().expect("cookie after"), before);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ns.run_here(|| panic!("job panics"))
        }));
        assert!(panicked.is_err(), "the job's panic reaches the caller");
        assert_eq!(
            current_netns_cookie().expect("cookie after a panic"),
            before,
            "back in its netns after a panicking job too"
        );
    }

    #[test]
    fn the_cookie_read_from_the_file_is_the_one_a_socket_inside_reads() {
        let (file, cookie) = fresh_netns();
        match netns_cookie_of_file(&file) {
            Some(read) => assert_eq!(read, cookie),
            // Kernels without NS_GET_ID (or where it is not the cookie): the setns path.
            None => assert!(ns_id(&file).is_err() || ns_id(&file).ok() != Some(cookie)),
        }
        let (other, other_cookie) = fresh_netns();
        assert_ne!(cookie, other_cookie);
        if let Some(read) = netns_cookie_of_file(&other) {
            assert_eq!(read, other_cookie);
        }
    }

    fn reason(err: &DataplaneError) -> Option<BadNetns> {
        match err {
            DataplaneError::BadNetns { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    #[test]
    fn only_network_namespaces_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let regular = dir.path().join("regular");
        std::fs::write(&regular, b"x").expect("write");
        let e = NetnsFile::open(&regular).expect_err("a regular file");
        assert!(
            matches!(reason(&e), Some(BadNetns::NotANamespace { .. })),
            "{e}"
        );
        assert!(
            e.to_string().contains(&regular.display().to_string()),
            "{e}"
        );

        let e = NetnsFile::open(Path::new("/proc/self/ns/mnt")).expect_err("a mount namespace");
        assert!(
            matches!(reason(&e), Some(BadNetns::NotNetwork { .. })),
            "{e}"
        );

        let e = NetnsFile::open(&dir.path().join("missing")).expect_err("missing");
        assert_eq!(e.errno(), Some(libc::ENOENT));

        NetnsFile::open(Path::new("/proc/self/ns/net")).expect("a network namespace");
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(NetnsFile::open(&path).map(drop));
        });
        let e = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("answers at once")
            .expect_err("a FIFO is not a netns");
        assert!(
            matches!(reason(&e), Some(BadNetns::NotANamespace { .. })),
            "{e}"
        );
    }

    #[test]
    fn the_namespaces_the_daemon_keeps_are_no_sandboxes() {
        let own = NetnsFile::open(Path::new("/proc/self/ns/net")).expect("own netns");
        let forbidden = [own.identity().expect("identity").named("the test's own")];
        let e = NetnsFile::open(Path::new("/proc/thread-self/ns/net"))
            .and_then(|ns| ns.check_sandbox(&forbidden))
            .expect_err("the same namespace by another path");
        assert_eq!(reason(&e), Some(BadNetns::NotASandbox("the test's own")));
        assert!(
            e.to_string().contains("is the test's own, not a sandbox's"),
            "{e}"
        );
        own.check_sandbox(&[]).expect("nothing forbidden");
    }
}
