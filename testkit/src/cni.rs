//! Executing a CNI plugin exactly as a runtime does: CNI_* environment, the plugin's config on
//! stdin, the result on stdout. The child is reaped with wait4(2), which also gives the CPU
//! time it used (with its own children, e.g. host-local under ptp).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::Netns;

/// What one invocation printed and returned.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// fork + exec + plugin + exit, as a runtime waits for it.
    pub elapsed: Duration,
    /// User + system CPU time of the child and the children it waited for.
    pub cpu: Duration,
}

impl Run {
    /// stdout as JSON (Null when empty or not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or(Value::Null)
    }

    /// The CNI error code printed on stdout, if any.
    pub fn error_code(&self) -> Option<u64> {
        self.json().get("code").and_then(Value::as_u64)
    }
}

/// `bin` with the environment a runtime sets for `command` (ADD, DEL, ...) and nothing else;
/// stdin, stdout and stderr piped.
pub fn command(
    bin: &Path,
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    ifname: &str,
    cni_path: &str,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_NETNS", netns.unwrap_or(Path::new("")))
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", cni_path)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `cmd` (stdio piped), feeding it `stdin`.
pub fn run_with_stdin(mut cmd: Command, stdin: &[u8]) -> Result<Run> {
    let started = Instant::now();
    let child = cmd.spawn().with_context(|| format!("spawn {cmd:?}"))?;
    let (code, stdout, stderr, cpu) =
        feed_and_reap(child, stdin).with_context(|| format!("run {cmd:?}"))?;
    Ok(Run {
        code,
        stdout,
        stderr,
        elapsed: started.elapsed(),
        cpu,
    })
}

/// One plugin binary with the config a runtime would pass it, run in the "node" namespace.
pub struct Plugin<'a> {
    pub bin: PathBuf,
    /// CNI_PATH (where the plugin finds its IPAM plugin).
    pub cni_path: String,
    /// The plugin object with `cniVersion` and `name` added.
    pub stdin: Vec<u8>,
    pub node: &'a Netns,
}

impl Plugin<'_> {
    fn command(&self, command: &str, container_id: &str, netns: &Path) -> Command {
        self::command(
            &self.bin,
            command,
            container_id,
            Some(netns),
            "eth0",
            &self.cni_path,
        )
    }

    /// Runs `command` (ADD, DEL, ...) for `container_id` in `netns` (ifname eth0).
    pub fn exec(&self, command: &str, container_id: &str, netns: &Path) -> Result<Run> {
        let mut cmd = self.command(command, container_id, netns);
        self.node.enter(&mut cmd)?;
        run_with_stdin(cmd, &self.stdin)
    }

    /// Like [`Plugin::exec_ok`], with `CNI_ARGS` (e.g. the `K8S_POD_*` pairs a Kubernetes
    /// runtime passes to name the pod).
    pub fn exec_ok_with_args(
        &self,
        command: &str,
        container_id: &str,
        netns: &Path,
        cni_args: &str,
    ) -> Result<Run> {
        let mut cmd = self.command(command, container_id, netns);
        cmd.env("CNI_ARGS", cni_args);
        self.node.enter(&mut cmd)?;
        let run = run_with_stdin(cmd, &self.stdin)?;
        self.succeeded(command, container_id, run)
    }

    /// Like [`Plugin::exec`], failing unless the plugin exits 0.
    pub fn exec_ok(&self, command: &str, container_id: &str, netns: &Path) -> Result<Run> {
        let run = self.exec(command, container_id, netns)?;
        self.succeeded(command, container_id, run)
    }

    /// Like [`Plugin::exec_ok`], from a thread already in the node namespace
    /// ([`Netns::enter_thread`]): the child is spawned as a Go runtime (containerd, CRI-O)
    /// spawns a plugin, with a vfork-style clone (posix_spawn) that copies none of this
    /// process's memory mappings, where `exec` forks to run `setns` in the child.
    pub fn exec_ok_from_node_thread(
        &self,
        command: &str,
        container_id: &str,
        netns: &Path,
    ) -> Result<Run> {
        let run = run_with_stdin(self.command(command, container_id, netns), &self.stdin)?;
        self.succeeded(command, container_id, run)
    }

    fn succeeded(&self, command: &str, container_id: &str, run: Run) -> Result<Run> {
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

/// Writes `stdin` to the child, reads its stdout and stderr to the end and reaps it with
/// wait4(2): exit code, stdout, stderr and CPU time (user + system, its children included).
pub fn feed_and_reap(mut child: Child, stdin: &[u8]) -> Result<(i32, String, String, Duration)> {
    if let Some(mut pipe) = child.stdin.take() {
        match pipe.write_all(stdin) {
            // It exited without reading (e.g. /bin/true for the exec floor): its exit says more.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other?,
        }
    }
    let mut stdout = Vec::new();
    if let Some(mut pipe) = child.stdout.take() {
        pipe.read_to_end(&mut stdout)?;
    }
    // Plugins write little to stderr: reading it after stdout cannot fill the pipe.
    let mut stderr = Vec::new();
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_end(&mut stderr)?;
    }
    let pid = libc::pid_t::try_from(child.id())?;
    let mut status = 0;
    // SAFETY: rusage is plain old data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own unreaped child; both out-pointers are valid for writes.
    let reaped = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
    if reaped != pid {
        bail!("wait4 {pid}: {}", std::io::Error::last_os_error());
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    Ok((
        code,
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
        timeval(usage.ru_utime) + timeval(usage.ru_stime),
    ))
}

fn timeval(t: libc::timeval) -> Duration {
    Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
        + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
}

/// The config a runtime passes on stdin to the first plugin of `conflist`, labelled with
/// `cni_version`.
pub fn plugin_config(conflist: &Value, cni_version: &str) -> Value {
    let mut plugin = conflist["plugins"][0].clone();
    plugin["cniVersion"] = Value::from(cni_version);
    plugin["name"] = conflist["name"].clone();
    plugin
}

/// The stdin a runtime passes to the first plugin of `conflist`, in the conflist's version.
pub fn plugin_stdin(conflist: &Value) -> Result<Vec<u8>> {
    if !conflist["plugins"][0].is_object() {
        bail!("conflist without plugins: {conflist}");
    }
    let version = conflist["cniVersion"].as_str().unwrap_or_default();
    Ok(serde_json::to_vec(&plugin_config(conflist, version))?)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// `/bin/sh` as the "plugin": it runs the script on stdin and prints its netns.
    fn netns_printer(node: &Netns) -> Plugin<'_> {
        Plugin {
            bin: PathBuf::from("/bin/sh"),
            cni_path: String::new(),
            stdin: b"readlink /proc/self/ns/net".to_vec(),
            node,
        }
    }

    #[test]
    fn a_plugin_runs_in_the_node_namespace_spawned_either_way() -> Result<()> {
        let node = Netns::new("tknode")?;
        let sandbox = Netns::new("tkpod")?;
        let expected = format!("net:[{}]", std::fs::metadata(node.path())?.ino());
        let plugin = netns_printer(&node);

        let forked = plugin.exec_ok("ADD", "c1", sandbox.path())?;
        assert_eq!(forked.stdout.trim(), expected, "forked with setns");

        let (spawned, caller_after) = std::thread::scope(|s| {
            s.spawn(|| -> Result<(Run, PathBuf)> {
                node.enter_thread()?;
                let run = plugin.exec_ok_from_node_thread("ADD", "c2", sandbox.path())?;
                Ok((run, std::fs::read_link("/proc/thread-self/ns/net")?))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("spawning thread panicked"))
        })??;
        assert_eq!(
            spawned.stdout.trim(),
            expected,
            "spawned from a node thread"
        );
        assert_eq!(
            caller_after,
            PathBuf::from(&expected),
            "the spawning thread is in the node namespace"
        );
        assert_ne!(
            std::fs::read_link("/proc/thread-self/ns/net")?,
            PathBuf::from(&expected),
            "only the spawning thread enters the node"
        );
        Ok(())
    }
}
