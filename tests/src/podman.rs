//! A private podman 4 (Debian) for one test: CNI network backend, runc, vfs storage, every piece
//! of state in a temp dir, run from inside the test's "node" namespace.
//!
//! The configuration is passed as files through CONTAINERS_CONF and CONTAINERS_STORAGE_CONF and
//! repeated as global flags: conmon's cleanup process (which runs the DEL when a container
//! exits) gets the flags on its command line and CONTAINERS_CONF from conmon, so it finds the
//! same conf dir and plugin dir as the podman that ran the ADD.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result};
use serde_json::Value;

use testkit::tools;

use crate::process::{pids_where, spawn_in_netns, unmount_under};
use crate::{Netns, oci_image, provisioner_bin};

/// The image every container runs: busybox, imported from a rootfs tar (no registry).
pub const IMAGE: &str = "localhost/busybox:latest";

pub struct Podman {
    dir: tempfile::TempDir,
    node: PathBuf,
    shut_down: bool,
}

impl Podman {
    /// A podman whose CNI networks are read from `conf_dir` (e.g. the daemon's) and whose plugin
    /// dir holds `provisioner` and `loopback`; imports [`IMAGE`].
    pub fn new(node: &Netns, conf_dir: &Path) -> Result<Self> {
        for tool in [tools::PODMAN, tools::CONMON, tools::RUNC, tools::LOOPBACK] {
            tool.require()?;
        }
        let dir = tempfile::Builder::new().prefix("podm").tempdir()?;
        let base = dir.path();
        let bin = base.join("cni-bin");
        std::fs::create_dir_all(&bin)?;
        std::os::unix::fs::symlink(provisioner_bin(), bin.join("provisioner"))?;
        std::os::unix::fs::symlink(tools::LOOPBACK.path, bin.join("loopback"))?;
        let b = base.display();
        // The default ulimits exceed this machine's hard limits.
        std::fs::write(
            base.join("containers.conf"),
            format!(
                r#"[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{conf}"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{b}/events.log"
runtime = "runc"
tmp_dir = "{b}/tmp"
volume_path = "{b}/volumes"
"#,
                bin = bin.display(),
                conf = conf_dir.display(),
            ),
        )?;
        std::fs::write(
            base.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\nrunroot = \"{b}/runroot\"\ngraphroot = \"{b}/root\"\n"
            ),
        )?;
        let podman = Self {
            node: node.path().to_path_buf(),
            dir,
            shut_down: false,
        };
        let rootfs = oci_image::write_rootfs_tar(podman.dir.path())?;
        podman.run(&[
            "import",
            "--change",
            r#"CMD ["/bin/sh"]"#,
            &rootfs.display().to_string(),
            IMAGE,
        ])?;
        Ok(podman)
    }

    fn command(&self) -> Command {
        let base = self.dir.path();
        let mut cmd = Command::new(tools::PODMAN.path);
        cmd.env("CONTAINERS_CONF", base.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", base.join("storage.conf"))
            .arg("--root")
            .arg(base.join("root"))
            .arg("--runroot")
            .arg(base.join("runroot"))
            .arg("--tmpdir")
            .arg(base.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
                "--runtime",
                "runc",
                "--network-backend",
                "cni",
            ]);
        cmd
    }

    /// Runs `podman <args>` in the node namespace; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        let stdout = testkit::stdout_of(&format!("podman {}", args.join(" ")), &out)?;
        Ok(stdout.trim().to_owned())
    }

    /// Runs `podman <args>` in the node namespace and returns what it did.
    pub fn output(&self, args: &[&str]) -> Result<Output> {
        let mut cmd = self.command();
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        spawn_in_netns(&mut cmd, &self.node)?
            .wait_with_output()
            .with_context(|| format!("wait for podman {}", args.join(" ")))
    }

    /// `podman inspect` of one container.
    pub fn inspect(&self, name: &str) -> Result<Value> {
        let text = self.run(&["inspect", "--type", "container", name])?;
        let all: Value = serde_json::from_str(&text)
            .with_context(|| format!("podman inspect {name}: not JSON"))?;
        all.get(0)
            .cloned()
            .with_context(|| format!("podman inspect {name}: empty answer"))
    }

    /// Removes every container, then anything left of this instance: processes (conmon) whose
    /// arguments point into its dir, mounts under it.
    pub fn shutdown(&mut self) -> Result<()> {
        self.shut_down = true;
        let removed = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let base = self.dir.path().as_os_str().as_encoded_bytes().to_vec();
        for pid in pids_where(|arg| arg.starts_with(&base)) {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        unmount_under(self.dir.path());
        removed.map(|_| ())
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        if !self.shut_down
            && let Err(e) = self.shutdown()
        {
            eprintln!("podman cleanup: {e:#}");
        }
    }
}
