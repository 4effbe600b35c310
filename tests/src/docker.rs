//! A private Docker engine (Debian's `docker.io`) for one test: every piece of state in a temp
//! dir, run inside the test's "node" namespace with no bridge and no iptables rules of its own
//! (it only loads images here), stopped by pid on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::process::{spawn_in_netns, unmount_under};
use crate::{Netns, wait_until};
use testkit::tools;

/// How long the engine may take to answer after its start, and to stop.
const START_LIMIT: Duration = Duration::from_secs(60);
const STOP_LIMIT: Duration = Duration::from_secs(20);

pub struct Docker {
    child: Child,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Docker {
    /// Starts dockerd in `node` and waits until it answers.
    pub fn start(node: &Netns) -> Result<Self> {
        let dockerd = tools::DOCKERD.require()?;
        tools::DOCKER.require()?;
        let dir = tempfile::Builder::new().prefix("dockr").tempdir()?;
        let base = dir.path();
        let socket = base.join("docker.sock");
        let log = std::fs::File::create(base.join("dockerd.log"))?;
        let child = spawn_in_netns(
            Command::new(dockerd)
                .arg(format!("--data-root={}", base.join("root").display()))
                .arg(format!("--exec-root={}", base.join("exec").display()))
                .arg(format!("--pidfile={}", base.join("dockerd.pid").display()))
                .arg(format!("--host=unix://{}", socket.display()))
                .args([
                    "--bridge=none",
                    "--iptables=false",
                    "--ip6tables=false",
                    "--ip-masq=false",
                    "--storage-driver=vfs",
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
            node.path(),
        )?;
        let docker = Self { child, socket, dir };
        wait_until("dockerd to answer", START_LIMIT, || {
            Ok(docker.run(&["version"]).ok().map(|_| ()))
        })
        .with_context(|| docker.log())?;
        Ok(docker)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    /// `docker <args>` against this engine; its stdout.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(tools::DOCKER.path)
            .arg(format!("--host=unix://{}", self.socket.display()))
            .args(args)
            .output()
            .with_context(|| format!("run docker {args:?}"))?;
        if !out.status.success() {
            bail!(
                "docker {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Docker {
    /// SIGTERM (dockerd then stops the containerd it started), SIGKILL after [`STOP_LIMIT`].
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let stopped = wait_until("dockerd to stop", STOP_LIMIT, || {
            Ok(self.child.try_wait()?.map(|_| ()))
        });
        if stopped.is_err() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        unmount_under(self.dir.path());
    }
}
