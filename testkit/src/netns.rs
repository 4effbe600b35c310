//! Named network namespaces under /run/netns, removed on drop (also when a test or a bench
//! step fails), and entered with setns(2) by child processes between fork and exec, or by a
//! thread of this process.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};

use crate::run;

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// Fails the calling test with a clear message unless it runs as root.
pub fn require_root() {
    assert!(
        crate::is_root(),
        "this test needs root (network namespaces, netlink, eBPF): run it as root"
    );
}

/// A short name unique to this process and call, at most 15 bytes with the prefix cut to 6.
pub fn unique_name(prefix: &str) -> String {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let prefix: String = prefix.chars().take(6).collect();
    format!("{prefix}{}x{id}", std::process::id() % 100_000)
}

/// A named network namespace under /run/netns with `lo` up; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    deleted: bool,
    /// Opened on the first [`Netns::enter`] and held, so children can setns(2) into it without
    /// opening anything after fork. Only namespaces that children enter hold a descriptor: with
    /// thousands of sandbox namespaces open, every fork and exec would copy and close them all.
    file: OnceLock<File>,
}

impl Netns {
    /// Creates `/run/netns/<unique name starting with prefix>` (a test's namespace).
    pub fn new(prefix: &str) -> Result<Self> {
        require_root();
        Self::create(unique_name(prefix))
    }

    /// Creates `/run/netns/<name>`.
    pub fn create(name: String) -> Result<Self> {
        run("ip", &["netns", "add", &name])?;
        let netns = Self {
            path: PathBuf::from(format!("/run/netns/{name}")),
            name,
            deleted: false,
            file: OnceLock::new(),
        };
        netns.ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `ip -n <name> <args>` and returns its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Runs `ip netns exec <name> <program> <args>` and returns its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Pings `addr` from inside this namespace (3 packets, 1 s deadline each).
    pub fn ping(&self, addr: &str) -> Result<()> {
        crate::tools::PING.require()?;
        self.exec("ping", &["-c", "1", "-W", "1", "-w", "3", addr])
            .map(|_| ())
            .with_context(|| format!("ping {addr} from netns {}", self.name))
    }

    /// Names of the links in this namespace other than `lo`.
    pub fn links(&self) -> Result<Vec<String>> {
        let out = self.ip(&["-o", "link", "show"])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or_default().to_owned())
            .filter(|n| n != "lo")
            .collect())
    }

    /// Names of the links in this namespace that are in link group `group`.
    pub fn links_in_group(&self, group: u32) -> Result<Vec<String>> {
        let out = self.ip(&["-o", "link", "show", "group", &group.to_string()])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or_default().to_owned())
            .collect())
    }

    /// The namespace file, opened once and kept open until `self` is dropped.
    fn file(&self) -> Result<&File> {
        if let Some(file) = self.file.get() {
            return Ok(file);
        }
        let file =
            File::open(&self.path).with_context(|| format!("open {}", self.path.display()))?;
        Ok(self.file.get_or_init(|| file))
    }

    /// Makes `cmd` enter this namespace (network only) between fork and exec, so the child
    /// runs there without the extra exec of `ip netns exec` and still sees /run/netns.
    pub fn enter(&self, cmd: &mut Command) -> Result<()> {
        let fd: RawFd = self.file()?.as_raw_fd();
        // SAFETY: the closure only calls setns(2), which is async-signal-safe, on an fd that
        // `self` keeps open until it is dropped.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        Ok(())
    }

    /// Moves the calling thread into this namespace (network only; the process's other threads
    /// stay where they are). Children it spawns start here, so they need no `setns` between
    /// fork and exec and can be spawned as a runtime spawns (posix_spawn, a vfork-style clone).
    pub fn enter_thread(&self) -> Result<()> {
        let fd = self.file()?.as_raw_fd();
        // SAFETY: setns(2) on an open descriptor; it changes only this thread.
        if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("setns into {} from this thread", self.path.display()));
        }
        Ok(())
    }

    /// Deletes the namespace now (a later drop does nothing).
    pub fn delete(&mut self) -> Result<()> {
        if !self.deleted {
            self.deleted = true;
            run("ip", &["netns", "del", &self.name])?;
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.deleted {
            delete_quietly(&self.name);
        }
    }
}

/// Deletes `/run/netns/<name>` on a best-effort basis (from a drop, where a failure has nowhere
/// to go).
pub fn delete_quietly(name: &str) {
    let _ = Command::new("ip").args(["netns", "del", name]).output();
}
