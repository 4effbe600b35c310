//! A `provisioner daemon` process started for a test, the bench or the demo, spoken to over its
//! socket with serde_json (one request line, one answer line), and stopped by pid on drop.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::Netns;

/// How long one request may take before the caller gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long SIGTERM is given before SIGKILL.
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// Where the daemon process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Inside the node namespace (as on a node: its metrics address is the node's).
    InNode,
    /// In the caller's namespace, told the node's with `--host-netns` only.
    Outside,
}

/// How long a daemon may take to answer on its socket after its start.
const LISTENING_WITHIN: Duration = Duration::from_secs(10);

/// A running daemon whose host side is a "node" namespace: `<bin> daemon` with its socket, conf
/// dir (`net.d`), data dir (`data`) and log (`daemon.log`) under one directory (a temp dir it
/// owns, for the daemons the `start*` constructors start); stopped (SIGTERM, by pid) on drop.
pub struct Daemon {
    child: Option<Child>,
    spawned_at: Instant,
    bin: PathBuf,
    pub socket: PathBuf,
    pub conf_dir: PathBuf,
    pub data_dir: PathBuf,
    pub log_file: PathBuf,
    /// Removed after the process is stopped (fields drop after [`Drop::drop`]).
    _dir: Option<tempfile::TempDir>,
}

/// Starting a test's daemon: the `provisioner` of this build ([`crate::provisioner_bin`]) in the
/// caller's namespace (told the node's with `--host-netns`) unless said otherwise, its files in
/// a temp dir of its own, waiting until its socket answers.
impl Daemon {
    /// Starts a daemon watching a fresh conf dir that holds `config` (if any) as
    /// `10-provisioner.conflist`.
    pub fn start(node: &Netns, config: Option<&Value>) -> Result<Self> {
        Self::start_with(node, config, &[])
    }

    /// Like [`Daemon::start`] with extra daemon arguments.
    pub fn start_with(node: &Netns, config: Option<&Value>, extra: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        if let Some(config) = config {
            write_conflist(dir.path(), config)?;
        }
        Self::start_in_dir(node, dir, extra, Placement::Outside)
    }

    /// Starts a second daemon on the state of a stopped one: same conf dir and data dir.
    pub fn start_on_state_of(node: &Netns, stopped: &Daemon) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::os::unix::fs::symlink(&stopped.conf_dir, dir.path().join("net.d"))?;
        std::os::unix::fs::symlink(&stopped.data_dir, dir.path().join("data"))?;
        Self::start_in_dir(node, dir, &[], Placement::Outside)
    }

    /// Like [`Daemon::start_with`], the config built from the daemon's socket path (a config
    /// whose plugins talk to this daemon), written before the daemon starts.
    pub fn start_with_conflist(
        node: &Netns,
        extra: &[&str],
        config: impl FnOnce(&Path) -> Value,
    ) -> Result<Self> {
        Self::start_placed_with_conflist(node, extra, config, Placement::Outside)
    }

    /// Like [`Daemon::start_with_conflist`], the process placed inside `node` (as on a node,
    /// where the daemon lives in the host netns) rather than outside it.
    pub fn start_in_node_with_conflist(
        node: &Netns,
        extra: &[&str],
        config: impl FnOnce(&Path) -> Value,
    ) -> Result<Self> {
        Self::start_placed_with_conflist(node, extra, config, Placement::InNode)
    }

    fn start_placed_with_conflist(
        node: &Netns,
        extra: &[&str],
        config: impl FnOnce(&Path) -> Value,
        placement: Placement,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = config(&dir.path().join("provisioner.sock"));
        write_conflist(dir.path(), &config)?;
        Self::start_in_dir(node, dir, extra, placement)
    }

    fn start_in_dir(
        node: &Netns,
        dir: tempfile::TempDir,
        extra: &[&str],
        placement: Placement,
    ) -> Result<Self> {
        let mut daemon = Self::spawn_placed(
            &crate::provisioner_bin(),
            node,
            placement,
            dir.path(),
            extra,
        )?;
        daemon._dir = Some(dir);
        daemon.wait_listening(LISTENING_WITHIN)?;
        Ok(daemon)
    }

    /// Starts the process again on the same socket, conf dir and data dir, after it was
    /// stopped or killed, and waits until its socket answers.
    pub fn restart(&mut self, node: &Netns, extra: &[&str]) -> Result<()> {
        self.restart_with_env(node, extra, &[])
    }

    /// [`Self::restart`] with `env` set for the process (e.g. a failpoint).
    pub fn restart_with_env(
        &mut self,
        node: &Netns,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        self.respawn_with_env(node, Placement::Outside, extra, env)?;
        self.wait_listening(LISTENING_WITHIN)?;
        Ok(())
    }
}

impl Daemon {
    /// Spawns the daemon inside `node` with its files under `dir`. Does not wait.
    pub fn spawn(bin: &Path, node: &Netns, dir: &Path, extra: &[&str]) -> Result<Self> {
        Self::spawn_placed(bin, node, Placement::InNode, dir, extra)
    }

    /// Spawns the daemon, placed as said, with its files under `dir`. Does not wait.
    pub fn spawn_placed(
        bin: &Path,
        node: &Netns,
        placement: Placement,
        dir: &Path,
        extra: &[&str],
    ) -> Result<Self> {
        let mut daemon = Self::unspawned(bin, dir)?;
        daemon.respawn(node, placement, extra)?;
        Ok(daemon)
    }

    /// A daemon of `bin` with its files under `dir` (the conf dir created), not started yet:
    /// [`Self::respawn`] starts it.
    pub fn unspawned(bin: &Path, dir: &Path) -> Result<Self> {
        let conf_dir = dir.join("net.d");
        std::fs::create_dir_all(&conf_dir)
            .with_context(|| format!("create {}", conf_dir.display()))?;
        Ok(Self {
            child: None,
            spawned_at: Instant::now(),
            bin: bin.to_path_buf(),
            socket: dir.join("provisioner.sock"),
            conf_dir,
            data_dir: dir.join("data"),
            log_file: dir.join("daemon.log"),
            _dir: None,
        })
    }

    /// Starts the process again on the same socket, conf dir, data dir and log, after it was
    /// stopped or killed. Does not wait.
    pub fn respawn(&mut self, node: &Netns, placement: Placement, extra: &[&str]) -> Result<()> {
        self.respawn_with_env(node, placement, extra, &[])
    }

    /// Like [`Self::respawn`], with `env` set for the process.
    pub fn respawn_with_env(
        &mut self,
        node: &Netns,
        placement: Placement,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        if self.child.is_some() {
            bail!("the daemon still runs");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .with_context(|| format!("open {}", self.log_file.display()))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("daemon")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--conf-dir")
            .arg(&self.conf_dir)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--host-netns")
            .arg(node.path())
            .args(harness_args())
            .args(extra)
            .env("PROVISIONER_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if placement == Placement::InNode {
            node.enter(&mut cmd)?;
        }
        self.spawned_at = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {} daemon", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process runs (it was spawned and not seen exiting, stopped or killed).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process has exited by itself (e.g. it crashed); reaps it.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else {
            bail!("the daemon is not running");
        };
        let status = child.try_wait()?;
        if status.is_some() {
            self.child = None;
        }
        Ok(status)
    }

    /// Runs a CLI verb of the same binary against this daemon (`<bin> <args> --socket S`).
    pub fn cli(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(&self.bin)
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .with_context(|| format!("run {} {}", self.bin.display(), args.join(" ")))
    }

    /// `provisioner status --json`, as the CLI prints it (null when it prints nothing).
    pub fn status(&self) -> Result<Value> {
        let out = self.cli(&["status", "--json"])?;
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    }

    /// `provisioner sandboxes --json`.
    pub fn sandboxes(&self) -> Result<Value> {
        let out = self.cli(&["sandboxes", "--json"])?;
        if !out.status.success() {
            bail!("sandboxes: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Polls `status` until the daemon answers (any readiness); time since spawn.
    pub fn wait_listening(&self, limit: Duration) -> Result<Duration> {
        self.wait_for_status("answering", limit, |_| true)?;
        Ok(self.spawned_at.elapsed())
    }

    /// Polls `status` until it says ready; time since spawn.
    pub fn wait_ready(&self, limit: Duration) -> Result<Duration> {
        self.wait_for_status("ready", limit, |status| status["ready"] == true)?;
        Ok(self.spawned_at.elapsed())
    }

    /// Polls the daemon's `status` answer until `done` holds for it (at most `limit`,
    /// stretched by [`crate::scaled`]); that answer. Fails at once when the process exits.
    pub fn wait_for_status(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let started = Instant::now();
        let limit = crate::scaled(limit);
        let mut last = Value::Null;
        while started.elapsed() < limit {
            if self.has_exited() {
                bail!("the daemon exited; log:\n{}", self.log_tail());
            }
            if let Ok(status) = self.request(&json!({"op": "status"})) {
                if done(&status) {
                    return Ok(status);
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        bail!(
            "the daemon's status not {what} within {limit:?}; last status {last}; log:\n{}",
            self.log_tail()
        )
    }

    /// Whether the spawned process has exited (a zombie not reaped yet).
    fn has_exited(&self) -> bool {
        self.pid().is_some_and(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let state = stat.rsplit_once(") ")?.1.chars().next()?;
                    Some(state == 'Z' || state == 'X')
                })
                .unwrap_or(true)
        })
    }

    /// Waits (at most `limit`) until the daemon's kernel tracing is attached: it loads in the
    /// background after ready, and `sandboxes` says why it is unavailable until then.
    pub fn wait_tracing(&self, limit: Duration) -> Result<()> {
        let mut why = String::new();
        crate::wait_until("kernel tracing to attach", limit, || {
            let answer = self.request(&json!({"op": "sandboxes"}))?;
            match answer["tracing_unavailable"].as_str() {
                None => Ok(Some(())),
                Some(reason) => {
                    reason.clone_into(&mut why);
                    Ok(None)
                }
            }
        })
        .with_context(|| format!("tracing unavailable: {why}; log:\n{}", self.log_tail()))
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

    /// CPU time each of the daemon's live threads used so far, added up by thread name (the
    /// main thread is `main`), from the scheduler's statistics (nanosecond resolution). Threads
    /// that already ended are not in it; [`Daemon::cpu_time`] counts them.
    pub fn cpu_time_by_thread(&self) -> Result<BTreeMap<String, Duration>> {
        let pid = self.pid().context("daemon not running")?;
        let tasks = format!("/proc/{pid}/task");
        let mut by_name = BTreeMap::new();
        for task in std::fs::read_dir(&tasks).with_context(|| format!("read {tasks}"))? {
            let dir = task.with_context(|| format!("read {tasks}"))?.path();
            // A thread that ended since the directory was read has nothing left to count.
            let (Ok(comm), Ok(stat)) = (
                std::fs::read_to_string(dir.join("comm")),
                std::fs::read_to_string(dir.join("schedstat")),
            ) else {
                continue;
            };
            let ns: u64 = stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{}/schedstat: {stat:?}", dir.display()))?;
            let name = if dir.file_name() == Some(std::ffi::OsStr::new(&pid.to_string())) {
                "main".to_owned()
            } else {
                comm.trim_end().to_owned()
            };
            *by_name.entry(name).or_insert(Duration::ZERO) += Duration::from_nanos(ns);
        }
        Ok(by_name)
    }

    /// The daemon's log so far (every run of it).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    /// The last lines of the daemon's log.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM by pid, then waits (SIGKILL after 10 s); fails unless it exited with success.
    /// Nothing to do when it does not run.
    pub fn stop(&mut self) -> Result<()> {
        if self.child.is_none() {
            return Ok(());
        }
        let exit = self.stop_status()?;
        if !exit.success() {
            bail!("daemon exited with {exit}; log:\n{}", self.log_tail());
        }
        Ok(())
    }

    /// SIGTERM by pid, then waits (SIGKILL after 10 s, an error then); how it exited.
    pub fn stop_status(&mut self) -> Result<ExitStatus> {
        let mut child = self.child.take().context("daemon already stopped")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .context("SIGTERM the daemon")?;
        let deadline = Instant::now() + crate::scaled(STOP_LIMIT);
        loop {
            if let Some(exit) = child.try_wait()? {
                return Ok(exit);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("daemon ignored SIGTERM for {STOP_LIMIT:?}: killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL (as a crash would), by pid, and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        let mut child = self.child.take().context("daemon already stopped")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop_status();
        }
    }
}

/// Writes `conflist` as `<dir>/net.d/10-provisioner.conflist`: the conf dir of a daemon whose
/// files are under `dir`.
pub fn write_conflist(dir: &Path, conflist: &Value) -> Result<()> {
    let conf_dir = dir.join("net.d");
    std::fs::create_dir_all(&conf_dir).with_context(|| format!("create {}", conf_dir.display()))?;
    let file = conf_dir.join("10-provisioner.conflist");
    std::fs::write(&file, serde_json::to_vec_pretty(conflist)?)
        .with_context(|| format!("write {}", file.display()))
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

/// The environment variable naming backends the tests' kernel watches run on instead of the
/// kernel's choice (`observation=backend`, comma separated): how the host runs the backends of
/// older kernels (`cargo xtask test` sets it for a second run of the kernel-level tests).
pub const TRACE_BACKENDS_ENV: &str = "PROVISIONER_TEST_TRACE_BACKENDS";

/// What the test environment adds to every daemon's arguments: `--trace-backend` for the
/// choices of [`TRACE_BACKENDS_ENV`], and state reads given as long as the other waits are
/// stretched (see [`crate::scaled`]).
fn harness_args() -> Vec<String> {
    let mut args: Vec<String> = std::env::var(TRACE_BACKENDS_ENV)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|choice| !choice.is_empty())
        .flat_map(|choice| ["--trace-backend".to_owned(), choice.to_owned()])
        .collect();
    if crate::scaled(Duration::from_secs(1)) > Duration::from_secs(1) {
        args.extend(["--trace-read-timeout".to_owned(), crate::scaled_secs(3.0)]);
    }
    args
}
