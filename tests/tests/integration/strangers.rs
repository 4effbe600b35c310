//! Strangers where the daemon reaches out: a process named like a runtime whose command line
//! names a config that is no file (`/dev/zero`, a FIFO), the same unprivileged or from an
//! executable that is not root's, binaries and processes whose names hold a newline and a
//! terminal escape, and a flood of connections to the metrics endpoint. Each is bounded (not
//! trusted, not read, escaped, closed) and the daemon keeps serving ADDs meanwhile.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner::daemon::api::{Request, Response, SandboxRequest};
use provisioner::daemon::client;
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::wait_views_created_by;
use provisioner_tests::{Netns, provisioner_bin, unique_name, wait_until};

/// The kernel watch's deadline in these tests: verdicts come quickly.
const DEADLINE_ARG: &[&str] = &["--trace-deadline", "3"];
const PATIENCE: Duration = Duration::from_secs(30);
/// The user strangers run as.
const NOBODY: u32 = 65534;
/// What a forged line would look like, were a name printed raw.
const FORGED: &str = "2026-12-06T00:00:00.000Z VERDICT SKIPPED pod forged-pod";

fn start(node: &Netns, extra: &[&str]) -> Result<Daemon> {
    let mut args = DEADLINE_ARG.to_vec();
    args.extend_from_slice(extra);
    let daemon = Daemon::start_in_node_with_conflist(node, &args, |socket| {
        conflist("strangers", "1.1.0", socket, "10.78.0.0/24", None)
    })?;
    daemon.wait_ready(Duration::from_secs(10))?;
    daemon.wait_tracing(PATIENCE)?;
    Ok(daemon)
}

/// An ADD into a fresh sandbox namespace is answered with its address, and its DEL too.
fn serves_an_add(daemon: &Daemon, container_id: &str) -> Result<()> {
    let sandbox = Netns::new("strangersbox")?;
    let request = |add: bool| {
        let req = SandboxRequest {
            container_id: container_id.to_owned(),
            ifname: "eth0".to_owned(),
            netns: Some(sandbox.path().to_path_buf()),
            network: None,
            prev_result: None,
            pod: None,
        };
        if add {
            Request::Add(req)
        } else {
            Request::Del(req)
        }
    };
    for (add, what) in [(true, "ADD"), (false, "DEL")] {
        match client::call(&daemon.socket, &request(add), Duration::from_secs(20))? {
            Response::Ok { .. } => {}
            Response::Error { code, msg, .. } => {
                bail!(
                    "{what} {container_id}: code {code}: {msg}\n{}",
                    daemon.log()
                )
            }
        }
    }
    Ok(())
}

/// The test binary `netns_holder`, copied to `dir/name` (root's, mode 0755, or `owner`'s).
fn holder_named(dir: &Path, name: &str, owner: Option<u32>) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::copy(env!("CARGO_BIN_EXE_netns_holder"), &path)
        .with_context(|| format!("copy netns_holder to {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    if let Some(uid) = owner {
        std::os::unix::fs::chown(&path, Some(uid), Some(uid))?;
    }
    Ok(path)
}

/// A directory every user may enter (the strangers run as nobody too).
fn open_dir() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// A stranger holding its own network namespace, killed (by pid) on drop.
struct Stranger {
    child: Child,
}

impl Stranger {
    /// Runs `exe hold-seconds args...` (as `uid` when given) and waits until it holds its
    /// namespace.
    fn start(exe: &Path, args: &[&str], uid: Option<u32>) -> Result<Self> {
        let mut cmd = Command::new(exe);
        cmd.arg("30").args(args).stdout(Stdio::piped());
        if let Some(uid) = uid {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, uid);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("start {}", exe.display()))?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("no stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        let stranger = Self { child };
        ensure!(
            line.trim() == "holding",
            "{} did not take a namespace: {line:?}",
            exe.display()
        );
        Ok(stranger)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text of every view in `views`, JSON included: what `sandboxes` and `why` are made of.
fn text_of(views: &[serde_json::Value]) -> String {
    views
        .iter()
        .map(serde_json::Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A root process from an executable named `containerd` (root's, not writable by others) is
/// taken for containerd: its `--config` is read, but a `/dev/zero` or a FIFO there is refused
/// before a byte is read (not a regular file), its diagnosis says so, and the watch, its
/// memory and the daemon's ADDs carry on.
#[test]
fn a_runtimes_config_that_is_no_file_is_refused_unread() -> Result<()> {
    let node = Netns::new("strangers")?;
    let daemon = start(&node, &[])?;
    let rss_before = daemon.rss_kib()?;
    let dir = open_dir()?;
    let containerd = holder_named(dir.path(), "containerd", None)?;
    let fifo = dir.path().join("config.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU)?;
    let fifo = fifo.display().to_string();
    for config in ["/dev/zero", fifo.as_str()] {
        let stranger = Stranger::start(&containerd, &["--config", config], None)?;
        let views = wait_views_created_by(&daemon, stranger.pid(), 1, PATIENCE)?;
        let view = &views[0];
        assert_eq!(view["verdict"]["verdict"], "skipped", "{view}");
        let diagnosis = view["verdict"]["diagnosis"].as_str().unwrap_or_default();
        assert!(
            diagnosis.contains(&format!(
                "containerd's config {config}, which is not a regular file: containerd's \
                 defaults assumed"
            )),
            "{diagnosis}"
        );
        serves_an_add(&daemon, &unique_name("afterconfig"))?;
    }
    let rss_after = daemon.rss_kib()?;
    ensure!(
        rss_after < rss_before + 16 * 1024,
        "RSS {rss_before} KiB -> {rss_after} KiB"
    );
    Ok(())
}

/// A process named `containerd` that is no runtime (its executable not root's; or run by an
/// unprivileged user in its own user namespace) is not trusted: nothing its command line
/// names is read, and the diagnosis says why.
#[test]
fn a_process_named_like_a_runtime_is_not_trusted_by_its_name() -> Result<()> {
    let node = Netns::new("strangers")?;
    let daemon = start(&node, &[])?;
    let dir = open_dir()?;
    let by_nobody = holder_named(dir.path(), "containerd", Some(NOBODY))?;
    let stranger = Stranger::start(&by_nobody, &["--config", "/dev/zero"], None)?;
    let views = wait_views_created_by(&daemon, stranger.pid(), 1, PATIENCE)?;
    let diagnosis = views[0]["verdict"]["diagnosis"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        diagnosis.contains("is not trusted as a runtime: its executable")
            && diagnosis.contains("may be written by others than root")
            && !diagnosis.contains("/dev/zero"),
        "{diagnosis}"
    );
    drop(stranger);

    // Unprivileged, in a user namespace of its own: its namespace may be judged (its name is a
    // runtime's), never trusted.
    let roots = open_dir()?;
    let root_owned = holder_named(roots.path(), "containerd", None)?;
    let unprivileged = Stranger::start(&root_owned, &["--config", "/dev/zero"], Some(NOBODY))?;
    std::thread::sleep(Duration::from_secs(3));
    let answer = daemon.sandboxes()?;
    for view in answer["sandboxes"].as_array().into_iter().flatten() {
        if view["verdict"]["creator"]["pid"].as_u64() == Some(u64::from(unprivileged.pid())) {
            let diagnosis = view["verdict"]["diagnosis"].as_str().unwrap_or_default();
            assert!(
                diagnosis.contains("it does not run as root") && !diagnosis.contains("/dev/zero"),
                "{diagnosis}"
            );
        }
    }
    serves_an_add(&daemon, &unique_name("untrusted"))
}

/// A name with a newline and a terminal escape: a binary exec'd by nobody inside a sandbox,
/// and the process that created that sandbox. `provisioner trace`, `sandboxes` and the
/// daemon's text log print them escaped: no line of theirs is forged, no escape reaches the
/// terminal.
#[test]
fn names_with_a_newline_and_an_escape_forge_no_line() -> Result<()> {
    let node = Netns::new("strangers")?;
    let daemon = start(&node, &[])?;
    let dir = open_dir()?;
    let evil_exec = dir.path().join(format!("true\n{FORGED} \u{1b}[2J"));
    std::fs::copy("/bin/true", &evil_exec)?;
    std::fs::set_permissions(&evil_exec, std::fs::Permissions::from_mode(0o755))?;
    let evil_creator = holder_named(dir.path(), "h\n\u{1b}[31mVERDICT", None)?;

    let mut trace = Command::new(provisioner_bin())
        .args(["trace", "--duration", "12"])
        .env_remove("CNI_COMMAND")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("provisioner trace")?;
    // Read as it comes: a full pipe would hold the session.
    let mut trace_out = trace.stdout.take().context("trace's stdout")?;
    let traced = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = trace_out.read_to_string(&mut text);
        text
    });
    // The session attaches within a few seconds; what it sees from then on is what counts.
    std::thread::sleep(Duration::from_secs(4));

    let stranger = Stranger::start(&evil_creator, &[], None)?;
    let pin = PathBuf::from(format!("/run/netns/{}", unique_name("cni-strangers")));
    std::fs::write(&pin, b"")?;
    let pinned = Command::new("mount")
        .arg("--bind")
        .arg(format!("/proc/{}/ns/net", stranger.pid()))
        .arg(&pin)
        .status()?;
    let unpin = Unpin(pin.clone());
    ensure!(pinned.success(), "mount --bind the stranger's netns");
    let ran = Command::new("nsenter")
        .arg(format!("--net={}", pin.display()))
        .args([
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ])
        .arg(&evil_exec)
        .status()
        .context("nsenter (util-linux) ... setpriv")?;
    ensure!(ran.success(), "the evil binary: {ran}");

    let views = wait_views_created_by(&daemon, stranger.pid(), 1, PATIENCE)?;
    let json = text_of(&views);
    ensure!(
        json.contains("VERDICT"),
        "the creator's name is not in {json}"
    );
    let out = daemon.cli(&["sandboxes"])?;
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = daemon.log();
    let _ = trace.wait();
    let traced = traced
        .join()
        .map_err(|_| anyhow::anyhow!("the trace reader panicked"))?;
    for (what, text) in [
        ("provisioner sandboxes", &listed),
        ("the daemon's log", &log),
        ("provisioner trace", &traced),
    ] {
        ensure!(
            !text.contains('\u{1b}'),
            "{what} carries a terminal escape:\n{text}"
        );
        ensure!(
            !text.lines().any(|l| l.starts_with(FORGED)),
            "{what} holds a forged line:\n{text}"
        );
    }
    ensure!(
        listed.contains("h\\n\\u{1b}[31mVERDICT"),
        "the creator not named (escaped) in `provisioner sandboxes`:\n{listed}"
    );
    ensure!(
        log.contains("h\\n\\u{1b}[31mVERDICT"),
        "the creator not named (escaped) in the log:\n{log}"
    );
    ensure!(
        traced.contains(&format!("true\\n{FORGED} \\u{{1b}}[2J")),
        "the exec not shown (escaped) by `provisioner trace`:\n{traced}"
    );
    drop(unpin);
    drop(stranger);
    serves_an_add(&daemon, &unique_name("escaped"))
}

/// Unmounts and removes a pin on drop.
struct Unpin(PathBuf);

impl Drop for Unpin {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Open descriptors of process `pid`.
fn open_fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// More connections to the metrics endpoint than it serves, all held open: the daemon's
/// descriptors stay bounded (the listener's cap), ADDs are served meanwhile, and the endpoint
/// answers again once the flood is gone.
#[test]
fn a_connection_flood_costs_a_bounded_number_of_descriptors() -> Result<()> {
    const FLOOD: usize = 600;
    let node = Netns::new("strangers")?;
    let addr = "127.0.0.1:9640";
    let daemon = start(&node, &["--metrics-addr", addr])?;
    let pid = daemon.pid().context("daemon pid")?;
    let get = |path: &str| -> Result<String> {
        provisioner_tests::in_netns(node.path(), || -> Result<String> {
            let mut stream = std::net::TcpStream::connect(addr)?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            stream.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())?;
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            Ok(answer)
        })?
    };
    wait_until("the metrics endpoint", PATIENCE, || {
        Ok(get("/healthz")?.starts_with("HTTP/1.1 200").then_some(()))
    })?;
    let before = open_fds(pid)?;
    let node_path = node.path().to_path_buf();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (opened, flood_ready) = std::sync::mpsc::channel::<Result<usize>>();
    let flood = std::thread::spawn(move || {
        let held = provisioner_tests::in_netns(&node_path, || {
            (0..FLOOD)
                .filter_map(|_| std::net::TcpStream::connect(addr).ok())
                .collect::<Vec<_>>()
        });
        let _ = opened.send(
            held.as_ref()
                .map(Vec::len)
                .map_err(|e| anyhow::anyhow!("{e:#}")),
        );
        let _ = stopped.recv_timeout(Duration::from_secs(60));
        drop(held);
    });
    let connected = flood_ready.recv_timeout(PATIENCE)??;
    ensure!(connected > 200, "only {connected} connections opened");
    std::thread::sleep(Duration::from_millis(500));
    let during = open_fds(pid)?;
    let cap = provisioner::metrics::MAX_HTTP_CONNECTIONS;
    serves_an_add(&daemon, &unique_name("flooded"))?;
    let _ = stop.send(());
    let _ = flood.join();
    ensure!(
        during <= before + cap + 16,
        "{during} descriptors open during a flood of {connected} connections ({before} before, \
         cap {cap})"
    );
    wait_until("the endpoint after the flood", PATIENCE, || {
        Ok(get("/healthz")?.starts_with("HTTP/1.1 200").then_some(()))
    })?;
    Ok(())
}
