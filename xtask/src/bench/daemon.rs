//! A `provisioner daemon` started for the bench or the demo, spoken to over its socket with
//! serde_json (xtask does not depend on the provisioner crate), and stopped by pid on drop.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::netns::Netns;

/// How long one request may take before the caller gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A running daemon whose host side is a "node" namespace; SIGTERM (by pid) on drop.
pub struct Daemon {
    child: Option<Child>,
    spawned_at: Instant,
    pub socket: PathBuf,
    pub conf_dir: PathBuf,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Spawns `bin daemon` with its socket, conf dir (`net.d`), data dir (`data`) and log under
    /// `dir`, running inside `node` and with `--host-netns` pointing at it. Does not wait.
    pub fn spawn(bin: &Path, node: &Netns, dir: &Path, extra: &[&str]) -> Result<Self> {
        let socket = dir.join("provisioner.sock");
        let conf_dir = dir.join("net.d");
        let data_dir = dir.join("data");
        let log = dir.join("daemon.log");
        std::fs::create_dir_all(&conf_dir)
            .with_context(|| format!("create {}", conf_dir.display()))?;
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("open {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("daemon")
            .arg("--socket")
            .arg(&socket)
            .arg("--conf-dir")
            .arg(&conf_dir)
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--host-netns")
            .arg(node.path())
            .args(extra)
            .env("PROVISIONER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        node.enter(&mut cmd)?;
        let spawned_at = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {} daemon", bin.display()))?;
        Ok(Self {
            child: Some(child),
            spawned_at,
            socket,
            conf_dir,
            data_dir,
            log,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Polls `status` until the daemon answers (any readiness); time since spawn.
    pub fn wait_listening(&mut self, limit: Duration) -> Result<Duration> {
        self.wait_for(limit, |_| true)
    }

    /// Polls `status` until it says ready; time since spawn.
    pub fn wait_ready(&mut self, limit: Duration) -> Result<Duration> {
        self.wait_for(limit, |status| status["ready"] == true)
    }

    fn wait_for(&mut self, limit: Duration, done: impl Fn(&Value) -> bool) -> Result<Duration> {
        let mut last = Value::Null;
        while self.spawned_at.elapsed() < limit {
            if let Some(child) = self.child.as_mut()
                && let Some(exit) = child.try_wait()?
            {
                self.child = None;
                bail!("daemon exited ({exit}); log:\n{}", self.log_tail());
            }
            if let Ok(status) = self.request(&json!({"op": "status"})) {
                if done(&status) {
                    return Ok(self.spawned_at.elapsed());
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        bail!(
            "daemon not ready within {limit:?}; last status {last}; log:\n{}",
            self.log_tail()
        )
    }

    /// Sends one request; the `result` of an ok answer, an error naming code and message else.
    pub fn request(&self, request: &Value) -> Result<Value> {
        ok(call(&self.socket, request)?)
    }

    /// VmRSS of the daemon, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let pid = self.pid().context("daemon not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .context("no VmRSS in /proc/<pid>/status")
    }

    /// CPU time (user + system, every thread, exited ones included) the daemon used so far,
    /// with nanosecond resolution (the process CPU clock, clock_getcpuclockid(3)).
    pub fn cpu_time(&self) -> Result<Duration> {
        let pid = libc::pid_t::try_from(self.pid().context("daemon not running")?)?;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `clock` is a valid out-pointer.
        let err = unsafe { libc::clock_getcpuclockid(pid, &raw mut clock) };
        if err != 0 {
            bail!(
                "clock_getcpuclockid({pid}): {}",
                std::io::Error::from_raw_os_error(err)
            );
        }
        // SAFETY: timespec is plain old data that clock_gettime fills in.
        let mut now: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: `now` is a valid out-pointer.
        if unsafe { libc::clock_gettime(clock, &raw mut now) } != 0 {
            bail!(
                "clock_gettime(cpu clock of {pid}): {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Duration::new(
            u64::try_from(now.tv_sec)?,
            u32::try_from(now.tv_nsec)?,
        ))
    }

    /// The last lines of the daemon's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM by pid, then waits (SIGKILL after 10 s).
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .context("SIGTERM the daemon")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(exit) = child.try_wait()? {
                if !exit.success() {
                    bail!("daemon exited with {exit}; log:\n{}", self.log_tail());
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("daemon ignored SIGTERM for 10 s: killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// One request line, one response line (the daemon's protocol).
pub fn call(socket: &Path, request: &Value) -> Result<Value> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("connect to the daemon at {}", socket.display()))?;
    stream.set_read_timeout(Some(CALL_TIMEOUT))?;
    stream.set_write_timeout(Some(CALL_TIMEOUT))?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer)?;
    if answer.is_empty() {
        bail!("daemon closed the connection without an answer");
    }
    serde_json::from_str(&answer).context("undecodable answer from the daemon")
}

/// The `result` of `{"status":"ok"}`, or the daemon's error.
pub fn ok(response: Value) -> Result<Value> {
    match response["status"].as_str() {
        Some("ok") => Ok(response["result"].clone()),
        _ => bail!(
            "daemon error {}: {}",
            response["code"],
            response["msg"].as_str().unwrap_or_default()
        ),
    }
}

/// A sandbox request (`add` or `del`) as the daemon's API takes it.
pub fn sandbox_request(op: &str, container_id: &str, netns: &Path) -> Value {
    json!({
        "op": op,
        "container_id": container_id,
        "ifname": "eth0",
        "netns": netns,
        "network": null,
    })
}
