//! Helpers for integration tests that need root and network namespaces.
//!
//! Every test builds its own namespaces through [`Netns`]; they are removed on drop, so also
//! when a test panics. Nothing here touches the root namespace's links, routes or sysctls.
//! What the bench and the demo (xtask) need too lives in the `testkit` crate, re-exported here.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

pub mod containerd;
pub mod crash_harness;
pub mod cri;
pub mod daemon_harness;
pub mod daemon_queries;
pub mod dataplane_fixture;
pub mod deploy;
pub mod docker;
pub mod kubelet;
pub mod oci_image;
pub mod pod_net;
pub mod podman;
pub mod process;
pub mod prometheus;
pub mod reference;
pub mod tracing;

pub use testkit::netns::{require_root, unique_name};
pub use testkit::{Netns, provisioner_bin, run, scaled, scaled_secs, wait_until};

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
    provisioner::dataplane::current_netns_cookie()
        .context("read the netns cookie of the calling thread")
}

/// The cookie of the network namespace at `path` (its identity; inodes are recycled).
pub fn netns_cookie(path: &Path) -> Result<u64> {
    tracing::cookie_of(path)
}

/// The inode of the network namespace at `path` (a pin, or `/proc/<pid>/ns/net`): unique on
/// the node while the namespace lives, which a test that holds it ensures.
pub fn netns_inode(path: &Path) -> Result<u64> {
    nix::sys::stat::stat(path)
        .map(|st| st.st_ino)
        .with_context(|| format!("stat netns {}", path.display()))
}

/// The cookie of a test's [`Netns`], read as the daemon reads it.
pub trait NetnsCookie {
    fn cookie(&self) -> Result<u64>;
}

impl NetnsCookie for Netns {
    fn cookie(&self) -> Result<u64> {
        netns_cookie(self.path())
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
        let linked = stand_in("ip", "containerd", testkit::tools::IP.path);
        linked.unwrap_or_else(|e| panic!("the stand-in runtime: {e:#}"))
    })
}

/// `<tmp>/provisioner-stand-ins/<kind>/<name>`, a symlink to `target`, made when missing. The
/// links never change, so every test process of every run shares them: a run leaves nothing
/// behind but this one directory.
fn stand_in(kind: &str, name: &str, target: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir()
        .join("provisioner-stand-ins")
        .join(kind);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let path = dir.join(name);
    if std::fs::read_link(&path).is_ok_and(|to| to == Path::new(target)) {
        return Ok(path);
    }
    // Missing, or left pointing elsewhere by an older run: made again (a concurrent test
    // process makes the same link).
    let _ = std::fs::remove_file(&path);
    match std::os::unix::fs::symlink(target, &path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(e).with_context(|| format!("link {} to {target}", path.display()))
        }
        _ => Ok(path),
    }
}

/// A stand-in runtime running a stand-in CNI plugin: `sh` named `containerd` forks and execs
/// `/bin/true` named `plugin` (it lives about a millisecond, as containerd's `loopback` does),
/// with `env` as its whole environment (what containerd hands a plugin); as `uid` when given.
pub fn runtime_runs_plugin(plugin: &str, uid: Option<u32>, env: &[(&str, &str)]) -> Result<()> {
    // Symlinks, not copies (see `stand_in_runtime`).
    let runtime = stand_in("sh", "containerd", "/bin/sh")?;
    let plugin_path = stand_in("sh", plugin, "/bin/true")?;
    // `&` makes the shell fork, so the plugin's parent is the shell named `containerd`.
    let mut cmd = Command::new(runtime);
    if let Some(uid) = uid {
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
    }
    let status = cmd
        .env_clear()
        .envs(env.iter().copied())
        .arg("-c")
        .arg("\"$0\" & wait $!")
        .arg(plugin_path)
        .status()
        .context("run the stand-in runtime's plugin")?;
    anyhow::ensure!(status.success(), "stand-in plugin {plugin}: {status}");
    Ok(())
}

/// A runtime of the test's own: `ip` under a name no other process on the node has
/// (`runc-<pid>-<n>`, a runtime's name to the kernel watch). The namespaces it creates are told
/// apart from every other runtime's by their creator, whose skips the kernel watch also counts
/// apart.
#[derive(Debug)]
pub struct OwnRuntime {
    path: PathBuf,
    comm: String,
}

impl OwnRuntime {
    pub fn new() -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // At most 15 bytes, the kernel's comm: 5 + 6 + 1 + 3.
        let comm = format!("runc-{}-{}", std::process::id() % 1_000_000, n % 1000);
        let path = stand_in("ip", &comm, testkit::tools::IP.path)?;
        Ok(Self { path, comm })
    }

    /// Its name, as the kernel watch shows its namespaces' creator.
    pub fn comm(&self) -> &str {
        &self.comm
    }
}

/// Runs the stand-in runtime (`ip` named `containerd`) with `args`.
pub fn runtime(args: &[&str]) -> Result<String> {
    run(&stand_in_runtime().display().to_string(), args)
}

/// A namespace created and pinned under /run/netns by a stand-in runtime (by default `ip`
/// named `containerd`), deleted on drop.
#[derive(Debug)]
pub struct RuntimeNetns {
    name: String,
    deleted: bool,
    /// Its creator's name.
    creator: String,
    inode: u64,
}

impl RuntimeNetns {
    /// Creates `/run/netns/<prefix...>` (a unique name starting with `prefix`, cut to 6 bytes).
    pub fn new(prefix: &str) -> Result<Self> {
        Self::create(stand_in_runtime(), "containerd", prefix)
    }

    /// [`RuntimeNetns::new`], created by the test's own `runtime`.
    pub fn created_by(runtime: &OwnRuntime, prefix: &str) -> Result<Self> {
        Self::create(&runtime.path, &runtime.comm, prefix)
    }

    fn create(runtime: &Path, comm: &str, prefix: &str) -> Result<Self> {
        let name = unique_name(prefix);
        run(&runtime.display().to_string(), &["netns", "add", &name])?;
        let mut netns = Self {
            name,
            deleted: false,
            creator: comm.to_owned(),
            inode: 0,
        };
        netns.inode = netns_inode(&netns.path())?;
        Ok(netns)
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

    /// The namespace's inode: how the kernel watch's views name it on every kernel
    /// (`verdict.netns.inode`). Unique among the node's live namespaces (this pin holds it),
    /// not among the views: a namespace gone before may have had it.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether a `sandboxes` view is of this namespace: its inode and its creator's name (of
    /// an [`OwnRuntime`], no other namespace's, live or gone).
    pub fn is_view_of(&self, view: &serde_json::Value) -> bool {
        daemon_queries::inode_of(view) == Some(self.inode)
            && view["verdict"]["creator"]["comm"] == self.creator.as_str()
    }

    /// Runs `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Runs `commands` (each an `ip` command line without `ip`) in one `ip -n <name> -batch -`:
    /// one process, so its requests follow one another with no exec between them, as a
    /// runtime's or plugin's do. Stops at the first command that fails.
    pub fn ip_batch(&self, commands: &[&str]) -> Result<String> {
        use std::process::Stdio;
        let what = format!("ip -n {} -batch - ({})", self.name, commands.join("; "));
        let mut cmd = Command::new("ip");
        cmd.args(["-n", &self.name, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let run =
            testkit::cni::run_with_stdin(cmd, format!("{}\n", commands.join("\n")).as_bytes())?;
        if run.code != 0 {
            anyhow::bail!("{what} failed (exit {}): {}", run.code, run.stderr.trim());
        }
        Ok(run.stdout)
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
            testkit::netns::delete_quietly(&self.name);
        }
    }
}
