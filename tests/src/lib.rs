//! Helpers for integration tests that need root and network namespaces.
//!
//! Every test builds its own namespaces through [`Netns`]; they are removed on drop, so also
//! when a test panics. Nothing here touches the root namespace's links, routes or sysctls.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

pub mod containerd;
pub mod cri;
pub mod daemon_harness;
pub mod daemon_queries;
pub mod deploy;
pub mod oci_image;
pub mod pod_net;
pub mod podman;
pub mod process;
pub mod reference;
pub mod tracing;

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// Fails the test with a clear message unless it runs as root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (network namespaces, netlink, eBPF): run it as root"
    );
}

/// A short name unique to this process and call, at most 15 bytes with the prefix cut to 6.
pub fn unique_name(prefix: &str) -> String {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let prefix: String = prefix.chars().take(6).collect();
    format!("{prefix}{}x{id}", std::process::id() % 100_000)
}

/// A named network namespace under /run/netns, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    deleted: bool,
}

impl Netns {
    /// Creates `/run/netns/<unique name>` with `lo` up.
    pub fn new(prefix: &str) -> Result<Self> {
        require_root();
        let name = unique_name(prefix);
        run("ip", &["netns", "add", &name])?;
        let netns = Self {
            path: PathBuf::from(format!("/run/netns/{name}")),
            name,
            deleted: false,
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

    /// The netns cookie, read with SO_NETNS_COOKIE on a socket created inside the namespace.
    pub fn cookie(&self) -> Result<u64> {
        netns_cookie(&self.path)
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
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .output();
        }
    }
}

/// Runs `f` on a fresh thread that has entered the network namespace at `path`.
pub fn in_netns<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> Result<T> {
    let file = File::open(path).with_context(|| format!("open netns {}", path.display()))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || -> Result<T> {
                nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .with_context(|| format!("setns into {}", path.display()))?;
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("thread in netns {} panicked", path.display()))?
    })
}

/// The cookie of the network namespace the calling thread is in.
pub fn current_netns_cookie() -> Result<u64> {
    provisioner::trace::netns_id::current_netns_cookie().context("SO_NETNS_COOKIE")
}

/// The cookie of the network namespace at `path`.
pub fn netns_cookie(path: &Path) -> Result<u64> {
    tracing::cookie_of(path)
}

/// Polls `check` until it returns a value, at most `limit`; the error says what was awaited.
pub fn wait_until<T>(
    what: &str,
    limit: std::time::Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let started = std::time::Instant::now();
    loop {
        if let Some(done) = check()? {
            return Ok(done);
        }
        if started.elapsed() > limit {
            bail!("gave up waiting for {what} after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits (at most `limit`) until `netns` holds no link but `lo`: retired host veths are
/// deleted by a background reaper shortly after DEL returns.
pub fn wait_only_lo(netns: &Netns, limit: std::time::Duration) -> Result<()> {
    let mut left = Vec::new();
    wait_until(&format!("only lo in netns {}", netns.name()), limit, || {
        left = netns.links()?;
        Ok(left.is_empty().then_some(()))
    })
    .with_context(|| format!("links left: {left:?}"))
}

/// `ip` under the name `containerd`: the namespaces it creates have a runtime as creator.
///
/// A symlink, not a copy: the kernel takes a process's comm from the path given to execve,
/// and a binary written at test time fails to exec with ETXTBSY while another test thread
/// forks and holds the write descriptor until its own exec.
pub fn stand_in_runtime() -> &'static Path {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("stand-in-runtime-{}", std::process::id()));
        let path = dir.join("containerd");
        let _ = std::fs::remove_file(&path);
        let linked = std::fs::create_dir_all(&dir)
            .and_then(|()| std::os::unix::fs::symlink("/usr/sbin/ip", &path));
        assert!(
            linked.is_ok(),
            "link {} to /usr/sbin/ip: {linked:?}",
            path.display()
        );
        path
    })
}

/// Runs the stand-in runtime (`ip` named `containerd`) with `args`.
pub fn runtime(args: &[&str]) -> Result<String> {
    run(&stand_in_runtime().display().to_string(), args)
}

/// A namespace created and pinned under /run/netns by the stand-in runtime (its creator is
/// `containerd`), deleted on drop.
#[derive(Debug)]
pub struct RuntimeNetns {
    name: String,
    deleted: bool,
}

impl RuntimeNetns {
    /// Creates `/run/netns/<prefix...>` (a unique name starting with `prefix`, cut to 6 bytes).
    pub fn new(prefix: &str) -> Result<Self> {
        let name = unique_name(prefix);
        runtime(&["netns", "add", &name])?;
        Ok(Self {
            name,
            deleted: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        tracing::pin_path(&self.name)
    }

    pub fn cookie(&self) -> Result<u64> {
        tracing::cookie_of(&self.path())
    }

    /// Runs `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// The runtime deletes the namespace now.
    pub fn delete(&mut self) -> Result<()> {
        self.deleted = true;
        runtime(&["netns", "del", &self.name]).map(|_| ())
    }
}

impl Drop for RuntimeNetns {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .output();
        }
    }
}

/// Runs a command, failing with its stderr when it exits non-zero.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("spawn {program} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `provisioner` binary of this build (`cargo xtask test` builds it before the tests).
pub fn provisioner_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> -> target/<profile>/provisioner
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let bin = profile_dir.join("provisioner");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p provisioner` (cargo xtask test does)",
        bin.display()
    );
    bin
}
