//! Private network namespaces for the bench and the demo: created with `ip netns add`, removed on
//! drop (also when a step fails), and entered by child processes with setns(2) before exec.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Prefix of every namespace xtask creates: `pxt<pid>-<what>`, so a later run can remove what a
/// killed run left behind.
const PREFIX: &str = "pxt";

/// A named network namespace under /run/netns with `lo` up; deleted on drop.
pub struct Netns {
    name: String,
    path: PathBuf,
    /// Opened on the first [`Netns::enter`] and held, so children can setns(2) into it without
    /// opening anything after fork. Only namespaces that children enter hold a descriptor: with
    /// thousands of sandbox namespaces open, every fork and exec of the bench would copy and
    /// close them all (a cost no runtime's exec pays).
    file: std::sync::OnceLock<File>,
}

impl Netns {
    /// Creates `/run/netns/pxt<pid>-<what>`.
    pub fn new(what: &str) -> Result<Self> {
        let name = format!("{PREFIX}{}-{what}", std::process::id());
        ip(&["netns", "add", &name])?;
        let path = PathBuf::from(format!("/run/netns/{name}"));
        let netns = Self {
            name,
            path,
            file: std::sync::OnceLock::new(),
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

    /// Runs `ip -n <name> <args>`; its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Makes `cmd` enter this namespace (network only) between fork and exec, so the child
    /// runs there without the extra exec of `ip netns exec` and still sees /run/netns.
    pub fn enter(&self, cmd: &mut Command) -> Result<()> {
        let file = match self.file.get() {
            Some(file) => file,
            None => {
                let file = File::open(&self.path)
                    .with_context(|| format!("open {}", self.path.display()))?;
                self.file.get_or_init(|| file)
            }
        };
        let fd: RawFd = file.as_raw_fd();
        // SAFETY: the closure only calls setns(2), which is async-signal-safe, on an fd that the
        // parent keeps open for the lifetime of `self`.
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
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs `ip <args>`; its stdout, or an error with its stderr.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("run `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Deletes namespaces left by earlier xtask runs whose process no longer exists.
pub fn remove_stale() -> usize {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
            removed += 1;
        }
    }
    removed
}

/// Fails early with a clear message unless running as root.
pub fn require_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("`cargo xtask {what}` needs root (network namespaces, netlink): run it as root");
    }
    Ok(())
}
