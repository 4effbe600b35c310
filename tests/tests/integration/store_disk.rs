//! A full or read-only data dir: the daemon says it is not ready (naming the store and the OS
//! error) while its store cannot commit, an ADD fails with nothing wired, and once the disk
//! takes writes again the daemon reopens the store by itself, rebuilt from the store and the
//! kernel, and serves again: no restart, no address handed out twice. The data dir is a small
//! tmpfs each test mounts (and unmounts, also on failure). Needs root.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner::cni::CniError;
use provisioner::dataplane::host_ifname;
use provisioner_tests::crash_harness::{CrashDaemon, assert_converged};
use provisioner_tests::pod_net::wait_node_bare;
use provisioner_tests::{Netns, wait_until};
use serde_json::Value;

const TRY_AGAIN_LATER: u64 = CniError::TRY_AGAIN_LATER as u64;

/// Longest time the daemon may take to notice that the disk takes writes again and serve.
const HEAL_WITHIN: Duration = Duration::from_secs(10);

/// A tmpfs mounted over a directory; unmounted (lazily, so a process still using it does not
/// stop it) when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Result<Self> {
        std::fs::create_dir_all(path)?;
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
            &path.display().to_string(),
        ])?;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    fn remount(&self, option: &str) -> Result<()> {
        mount(&[
            "-o",
            &format!("remount,{option}"),
            &self.path.display().to_string(),
        ])
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new(testkit::tools::UMOUNT.path)
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

fn mount(args: &[&str]) -> Result<()> {
    let out = Command::new(testkit::tools::MOUNT.require()?)
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "mount {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Writes a file into `dir` until the filesystem is full.
fn fill(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path)?;
    let chunk = vec![0x5a_u8; 64 * 1024];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(err) => return Err(err).context("fill the data dir"),
        }
    }
    // The last bytes that fit.
    while matches!(file.write(&[0x5a]), Ok(1)) {}
    Ok(path)
}

fn status(daemon: &CrashDaemon) -> Result<Value> {
    let out = daemon.cli(&["status", "--json"])?;
    serde_json::from_slice(&out.stdout).context("status --json")
}

/// Waits until the daemon says it is not ready for a reason naming the store file and
/// `errno_text` (e.g. "os error 28").
fn wait_unready(daemon: &CrashDaemon, errno_text: &str) -> Result<Value> {
    let store = daemon.data_dir.join("ipam.redb").display().to_string();
    wait_until(
        "not ready, naming the store",
        Duration::from_secs(10),
        || {
            let status = status(daemon)?;
            let named = status["reasons"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .any(|r| r.contains(&store) && r.contains(errno_text));
            Ok((status["ready"] == false && named).then_some(status))
        },
    )
    .with_context(|| format!("status {:?}\nlog:\n{}", status(daemon), daemon.log()))
}

/// A free loopback port for the metrics listener.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The HTTP status of `GET /readyz` on the metrics listener at `port`.
fn readyz(port: u16) -> Result<u16> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP answer: {answer:?}"))
}

fn wait_readyz(port: u16, want: u16) -> Result<()> {
    wait_until(&format!("/readyz {want}"), HEAL_WITHIN, || {
        Ok((readyz(port)? == want).then_some(()))
    })
}

/// Fails if the daemon says it is ready at any moment during `span`.
fn stays_unready(daemon: &CrashDaemon, span: Duration) -> Result<()> {
    let until = std::time::Instant::now() + span;
    while std::time::Instant::now() < until {
        let status = status(daemon)?;
        ensure!(status["ready"] == false, "ready on a full disk: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn add(daemon: &CrashDaemon, container_id: &str, pod: &Netns) -> Result<()> {
    let run = daemon.plugin("ADD", container_id, Some(pod.path()))?;
    ensure!(
        run.code == 0,
        "ADD {container_id}: {run:?}\nlog:\n{}",
        daemon.log()
    );
    Ok(())
}

/// An ADD that fails, with nothing of it wired: the CNI error's code and message.
fn add_fails_clean(
    daemon: &CrashDaemon,
    node: &Netns,
    id: &str,
    pod: &Netns,
) -> Result<(Option<u64>, String)> {
    let run = daemon.plugin("ADD", id, Some(pod.path()))?;
    ensure!(run.code != 0, "ADD {id} succeeded on a full disk: {run:?}");
    let error: Value = serde_json::from_str(&run.stdout).unwrap_or_default();
    let links = pod.links()?;
    ensure!(links.is_empty(), "{id}: the pod holds {links:?}");
    let host = host_ifname(id, "eth0");
    ensure!(
        !node.links()?.contains(&host),
        "{id}: host veth {host} left on the node"
    );
    Ok((
        error["code"].as_u64(),
        error["msg"].as_str().unwrap_or(&run.stdout).to_owned(),
    ))
}

fn distinct(daemon: &CrashDaemon) -> Result<()> {
    let all: Vec<String> = daemon.addresses()?;
    let set: HashSet<&String> = all.iter().collect();
    ensure!(set.len() == all.len(), "an address held twice: {all:?}");
    Ok(())
}

#[test]
fn a_full_data_dir_makes_the_daemon_unready_and_it_heals_when_space_is_freed() -> Result<()> {
    let node = Netns::new("sdnode")?;
    let pods: Vec<Netns> = (0..7).map(|_| Netns::new("sdpod")).collect::<Result<_>>()?;
    let mut daemon = CrashDaemon::new("disknet", "10.251.12.0/28")?;
    let port = free_port()?;
    daemon.set_args(&["--metrics-addr", &format!("127.0.0.1:{port}")]);
    let disk = Tmpfs::mount(&daemon.data_dir, "2m")?;
    daemon.start(&node, None)?;
    wait_readyz(port, 200)?;
    add(&daemon, "d0", &pods[0])?;
    add(&daemon, "d1", &pods[1])?;

    let filler = fill(&disk.path)?;
    // redb may still find room in pages its file already holds: such an ADD succeeds, durably.
    // Within a few, one needs a page the disk cannot give.
    let mut failed = None;
    let mut live = vec!["d0".to_owned()];
    for i in [2, 4, 5, 6] {
        let run = daemon.plugin("ADD", &format!("d{i}"), Some(pods[i].path()))?;
        if run.code != 0 {
            failed = Some((i, run));
            break;
        }
        live.push(format!("d{i}"));
    }
    let (i, run) = failed.context("every ADD on the full disk succeeded")?;
    ensure!(
        pods[i].links()?.is_empty()
            && !node
                .links()?
                .contains(&host_ifname(&format!("d{i}"), "eth0")),
        "the ADD d{i} that failed on the full disk left something wired: {run:?}"
    );
    ensure!(run.stdout.contains("No space left on device"), "{run:?}");
    wait_unready(&daemon, "os error 28")?;
    wait_readyz(port, 503)?;
    // No heal while the disk is full: not ready through a few of the daemon's checks.
    stays_unready(&daemon, Duration::from_millis(1500))?;
    // Refused while the store cannot commit: try again later, naming why.
    let (code, msg) = add_fails_clean(&daemon, &node, "d3", &pods[3])?;
    ensure!(code == Some(TRY_AGAIN_LATER), "{code:?} {msg}");
    ensure!(msg.contains("os error 28"), "{msg}");

    // DEL while the store cannot commit: the kernel side goes now, the release later.
    let run = daemon.plugin("DEL", "d1", Some(pods[1].path()))?;
    let host = host_ifname("d1", "eth0");
    // The veth pair is retired at once and deleted in the background.
    wait_until(
        "the DEL's kernel side gone",
        Duration::from_secs(10),
        || Ok((!node.links()?.contains(&host) && pods[1].links()?.is_empty()).then_some(())),
    )
    .with_context(|| format!("DEL on a full disk left the kernel side: {run:?}"))?;
    ensure!(
        run.error_code() == Some(TRY_AGAIN_LATER),
        "DEL whose release cannot be written: {run:?}"
    );

    std::fs::remove_file(&filler)?;
    daemon.wait_ready(HEAL_WITHIN)?;
    wait_readyz(port, 200)?;
    ensure!(daemon.running(), "the daemon restarted or stopped");
    let held: Vec<String> = daemon
        .allocations()?
        .into_iter()
        .map(|a| a.container_id)
        .collect();
    ensure!(
        held == live,
        "after the heal the store holds {held:?}, not the live pods {live:?}"
    );
    // The ADDs again (as the runtime retries them): new ones, and those that made it.
    for (i, pod) in pods.iter().enumerate().skip(2) {
        add(&daemon, &format!("d{i}"), pod)?;
    }
    distinct(&daemon)?;
    assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    for (i, pod) in pods.iter().enumerate().filter(|(i, _)| *i != 1) {
        let run = daemon.plugin("DEL", &format!("d{i}"), Some(pod.path()))?;
        ensure!(run.code == 0, "DEL d{i}: {run:?}");
    }
    ensure!(daemon.allocations()?.is_empty());
    wait_node_bare(&node, Duration::from_secs(10))?;
    daemon.kill()?;
    drop(disk);
    Ok(())
}

/// A running daemon holds its store open for writing, so the kernel refuses to remount its
/// data dir read-only (EBUSY): the read-only disk is met where it can be, at a (re)open. The
/// pods' store is written, the daemon stopped, the data dir remounted read-only; the daemon
/// starts not ready (EROFS, naming the store), refuses ADDs with nothing wired, and serves once
/// the data dir is writable again, with the live pods' addresses still held.
#[test]
fn a_read_only_data_dir_makes_the_daemon_unready_and_it_heals_when_writable() -> Result<()> {
    let node = Netns::new("sdnode")?;
    let pods: Vec<Netns> = (0..4).map(|_| Netns::new("sdpod")).collect::<Result<_>>()?;
    let mut daemon = CrashDaemon::new("ronet", "10.251.13.0/28")?;
    let disk = Tmpfs::mount(&daemon.data_dir, "2m")?;
    daemon.start(&node, None)?;
    add(&daemon, "r0", &pods[0])?;
    add(&daemon, "r1", &pods[1])?;
    let live: HashSet<String> = daemon.addresses()?;
    daemon.kill()?;

    disk.remount("ro")?;
    daemon.start_unready(&node)?;
    wait_unready(&daemon, "os error 30")?;
    add_fails_clean(&daemon, &node, "r2", &pods[2])?;

    disk.remount("rw")?;
    daemon.wait_ready(HEAL_WITHIN)?;
    ensure!(daemon.running(), "the daemon restarted or stopped");
    let now: HashSet<String> = daemon.addresses()?;
    ensure!(now == live, "held after the heal: {now:?}, live: {live:?}");
    add(&daemon, "r2", &pods[2])?;
    add(&daemon, "r3", &pods[3])?;
    distinct(&daemon)?;
    assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    for (i, pod) in pods.iter().enumerate() {
        let run = daemon.plugin("DEL", &format!("r{i}"), Some(pod.path()))?;
        ensure!(run.code == 0, "DEL r{i}: {run:?}");
    }
    wait_node_bare(&node, Duration::from_secs(10))?;
    daemon.kill()?;
    drop(disk);
    Ok(())
}
