//! Executing a CNI plugin exactly as a runtime does: CNI_* environment, the plugin's config on
//! stdin, the result on stdout; the child enters the "node" namespace with setns(2) first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::netns::Netns;

/// One plugin binary with the config a runtime would pass it.
pub struct Plugin<'a> {
    pub bin: PathBuf,
    /// CNI_PATH (where the plugin finds its IPAM plugin).
    pub cni_path: String,
    /// The plugin object with `cniVersion` and `name` added.
    pub stdin: Vec<u8>,
    pub node: &'a Netns,
}

/// What one invocation did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// fork + exec + plugin + exit, as a runtime waits for it.
    pub elapsed: Duration,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or(Value::Null)
    }
}

impl Plugin<'_> {
    /// Runs `command` (ADD, DEL, ...) for `container_id` in `netns` (ifname eth0).
    pub fn exec(&self, command: &str, container_id: &str, netns: &Path) -> Result<Run> {
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.cni_path)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.node.enter(&mut cmd);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", self.bin.display()))?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(&self.stdin)?;
        }
        let out = child.wait_with_output()?;
        let elapsed = started.elapsed();
        Ok(Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed,
        })
    }

    /// Like [`Plugin::exec`], failing unless the plugin exits 0.
    pub fn exec_ok(&self, command: &str, container_id: &str, netns: &Path) -> Result<Run> {
        let run = self.exec(command, container_id, netns)?;
        if run.code != 0 {
            bail!(
                "{} {command} {container_id} exited {}: {}{}",
                self.bin.display(),
                run.code,
                run.stdout.trim(),
                run.stderr.trim()
            );
        }
        Ok(run)
    }
}

/// The stdin a runtime passes for the first plugin of `conflist`.
pub fn plugin_stdin(conflist: &Value) -> Result<Vec<u8>> {
    let mut plugin = conflist["plugins"][0].clone();
    if !plugin.is_object() {
        bail!("conflist without plugins: {conflist}");
    }
    plugin["cniVersion"] = conflist["cniVersion"].clone();
    plugin["name"] = conflist["name"].clone();
    Ok(serde_json::to_vec(&plugin)?)
}
