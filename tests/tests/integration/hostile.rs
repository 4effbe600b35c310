//! A hostile caller of the daemon socket: netns paths that are not a sandbox's network
//! namespace (a regular file, a FIFO, a missing path, the node's netns, the daemon's own),
//! names the kernel would choke on, an invalid network config, more connections than allowed.
//! Each is refused with its CNI code and a message naming what is wrong; nothing is allocated
//! and nothing is configured in any namespace. Likewise an ADD into a node whose own routing
//! sends the pod's address elsewhere: wired, found not in effect, rolled back.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use provisioner::cni::CniError;
use provisioner::daemon::api::{NetworkClaim, Request, Response, SandboxRequest};
use provisioner::daemon::client;
use provisioner::dataplane::host_ifname;
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::allocations;
use provisioner_tests::{Netns, wait_until};

/// Longest time any refusal may take: the FIFO used to hang the worker until the client gave up.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

fn start(node: &Netns, extra: &[&str]) -> Result<Daemon> {
    let daemon = Daemon::start_with_conflist(node, extra, |socket| {
        conflist("hostile", "1.1.0", socket, "10.77.0.0/24", None)
    })?;
    daemon.wait_ready(Duration::from_secs(10))?;
    Ok(daemon)
}

fn sandbox_request(container_id: &str, ifname: &str, netns: Option<&Path>) -> SandboxRequest {
    SandboxRequest {
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
        netns: netns.map(Path::to_path_buf),
        network: None,
        prev_result: None,
        pod: None,
    }
}

/// Sends `request` and returns the error's code and message (fails on success), within
/// [`ANSWER_WITHIN`].
fn refused(daemon: &Daemon, request: &Request) -> Result<(u32, String)> {
    let started = Instant::now();
    let response = client::call(&daemon.socket, request, ANSWER_WITHIN * 2)?;
    let took = started.elapsed();
    if took > ANSWER_WITHIN {
        bail!("the answer to {request:?} took {took:?}");
    }
    match response {
        Response::Error { code, msg, .. } => Ok((code, msg)),
        Response::Ok { result } => bail!("{request:?} succeeded: {result}"),
    }
}

/// Nothing of the sandbox anywhere: no allocation, no host veth in the node, no interface of
/// that name in the daemon's own (the test's root) namespace.
fn nothing_done(daemon: &Daemon, node: &Netns, container_id: &str, ifname: &str) -> Result<()> {
    let held = allocations(daemon)?;
    if !held.is_empty() {
        bail!("allocations made: {held:?}");
    }
    let links = node.links()?;
    if !links.is_empty() {
        bail!("links created in the node: {links:?}");
    }
    let host = host_ifname(container_id, ifname);
    for name in [host.as_str(), ifname] {
        if Path::new("/sys/class/net").join(name).exists() {
            bail!("interface {name} exists in the root namespace");
        }
    }
    Ok(())
}

/// An ADD of `container_id` into `sandbox` gets it `ifname`, and its DEL succeeds.
fn add_then_del(daemon: &Daemon, sandbox: &Netns, container_id: &str, ifname: &str) -> Result<()> {
    let request = Request::Add(sandbox_request(container_id, ifname, Some(sandbox.path())));
    let added = client::call(&daemon.socket, &request, ANSWER_WITHIN * 2)?;
    assert!(matches!(added, Response::Ok { .. }), "{added:?}");
    assert_eq!(sandbox.links()?, vec![ifname.to_owned()]);
    let request = Request::Del(sandbox_request(container_id, ifname, Some(sandbox.path())));
    let deleted = client::call(&daemon.socket, &request, ANSWER_WITHIN * 2)?;
    assert!(matches!(deleted, Response::Ok { .. }), "{deleted:?}");
    Ok(())
}

struct Fixture {
    _dir: tempfile::TempDir,
    regular: PathBuf,
    fifo: PathBuf,
    missing: PathBuf,
}

fn fixture() -> Result<Fixture> {
    let dir = tempfile::tempdir()?;
    let regular = dir.path().join("regular");
    std::fs::write(&regular, b"not a namespace")?;
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let missing = dir.path().join("missing");
    Ok(Fixture {
        regular,
        fifo,
        missing,
        _dir: dir,
    })
}

#[test]
fn add_into_a_path_that_is_not_a_sandbox_netns_is_refused_and_allocates_nothing() -> Result<()> {
    let node = Netns::new("hnode")?;
    let daemon = start(&node, &[])?;
    let files = fixture()?;
    let own = PathBuf::from(format!("/proc/{}/ns/net", daemon.pid().unwrap_or_default()));
    let id = format!("hostile{}", std::process::id());
    let ifname = "hst0";
    let cases: [(&str, &Path, u32, &str); 5] = [
        (
            "regular file",
            &files.regular,
            CniError::INVALID_ENV,
            "not a namespace file",
        ),
        (
            "FIFO",
            &files.fifo,
            CniError::INVALID_ENV,
            "not a namespace file",
        ),
        (
            "missing path",
            &files.missing,
            CniError::UNKNOWN_CONTAINER,
            "No such file",
        ),
        (
            "node netns",
            node.path(),
            CniError::INVALID_ENV,
            "the node's network namespace",
        ),
        (
            "daemon's own netns",
            &own,
            CniError::INVALID_ENV,
            "the daemon's own network namespace",
        ),
    ];
    for (what, path, code, reason) in cases {
        let request = Request::Add(sandbox_request(&id, ifname, Some(path)));
        let (got, msg) = refused(&daemon, &request)?;
        assert_eq!(got, code, "{what}: {msg}");
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains(reason),
            "{what}: the message names the path and why: {msg}"
        );
        nothing_done(&daemon, &node, &id, ifname)?;
    }
    // CHECK looks at the same paths (the FIFO must not hang it either).
    let request = Request::Check(sandbox_request(&id, ifname, Some(&files.fifo)));
    assert_eq!(refused(&daemon, &request)?.0, CniError::INVALID_ENV);
    // The daemon still serves: a real sandbox gets its network.
    let sandbox = Netns::new("hsbx")?;
    add_then_del(&daemon, &sandbox, &id, ifname)
}

#[test]
fn del_refuses_the_nodes_netns_and_tolerates_a_path_that_is_gone() -> Result<()> {
    let node = Netns::new("hnode")?;
    let daemon = start(&node, &[])?;
    let files = fixture()?;
    let id = format!("hostdel{}", std::process::id());
    let request = Request::Del(sandbox_request(&id, "eth0", Some(node.path())));
    let (code, msg) = refused(&daemon, &request)?;
    assert_eq!(code, CniError::INVALID_ENV, "{msg}");
    assert!(msg.contains("the node's network namespace"), "{msg}");
    // A runtime's DEL after its netns is gone (or with a FIFO there) succeeds, at once.
    for path in [&files.missing, &files.fifo, &files.regular] {
        let request = Request::Del(sandbox_request(&id, "eth0", Some(path)));
        let started = Instant::now();
        let answer = client::call(&daemon.socket, &request, ANSWER_WITHIN * 2)?;
        assert!(
            matches!(answer, Response::Ok { .. }),
            "{}: {answer:?}",
            path.display()
        );
        assert!(started.elapsed() < ANSWER_WITHIN);
    }
    Ok(())
}

#[test]
fn names_and_network_configs_that_cannot_work_are_refused_before_allocating() -> Result<()> {
    let node = Netns::new("hnode")?;
    let daemon = start(&node, &[])?;
    let sandbox = Netns::new("hsbx")?;
    let id = format!("hostname{}", std::process::id());
    for (container_id, ifname, what) in [
        (id.as_str(), "e\u{1}0", "interface name"),
        (id.as_str(), "..", "interface name"),
        (id.as_str(), "abcdefghijklmnop", "interface name"),
        ("-x", "eth0", "container id"),
        ("a\nb", "eth0", "container id"),
    ] {
        let request = Request::Add(sandbox_request(container_id, ifname, Some(sandbox.path())));
        let (code, msg) = refused(&daemon, &request)?;
        assert_eq!(code, CniError::INVALID_ENV, "{ifname:?}: {msg}");
        assert!(msg.contains(&format!("invalid {what}")), "{msg}");
        assert!(allocations(&daemon)?.is_empty());
        assert!(sandbox.links()?.is_empty());
    }
    // A request whose own network config is invalid: code 7 (not a "mismatch", 103).
    let mut request = sandbox_request(&id, "eth0", Some(sandbox.path()));
    request.network = Some(NetworkClaim {
        name: "hostile".to_owned(),
        ipam: serde_json::json!({ "ranges": [[{ "subnet": "10.77.0.0/33" }]] }),
    });
    let (code, msg) = refused(&daemon, &Request::Add(request))?;
    assert_eq!(code, CniError::INVALID_NETWORK_CONFIG, "{msg}");
    assert!(allocations(&daemon)?.is_empty());
    Ok(())
}

#[test]
fn add_into_a_node_whose_rules_divert_the_pod_address_is_rolled_back_and_named() -> Result<()> {
    let node = Netns::new("hnode")?;
    let daemon = start(&node, &[])?;
    let sandbox = Netns::new("hsbx")?;
    let id = format!("hostrule{}", std::process::id());
    let ifname = "hst0";
    node.ip(&[
        "rule",
        "add",
        "to",
        "10.77.0.0/24",
        "lookup",
        "77",
        "pref",
        "100",
    ])?;
    node.ip(&["route", "add", "10.77.0.0/24", "dev", "lo", "table", "77"])?;
    let request = Request::Add(sandbox_request(&id, ifname, Some(sandbox.path())));
    let (code, msg) = refused(&daemon, &request)?;
    assert_eq!(code, CniError::DATAPLANE_FAILURE, "{msg}");
    assert!(
        msg.contains(&id)
            && msg.contains(&host_ifname(&id, ifname))
            && msg.contains("not in effect")
            && msg.contains("10.77.0.0/24 oif 1 table 77"),
        "the message names the sandbox, the veth and the route the node uses: {msg}"
    );
    // Rolled back: no allocation, and the veth goes (the reaper deletes it in the background).
    assert!(allocations(&daemon)?.is_empty());
    wait_until("the rolled-back veth deleted", ANSWER_WITHIN, || {
        Ok(node.links()?.is_empty().then_some(()))
    })?;
    nothing_done(&daemon, &node, &id, ifname)?;
    // With the rule gone the same ADD succeeds.
    node.ip(&["rule", "del", "pref", "100"])?;
    add_then_del(&daemon, &sandbox, &id, ifname)
}

#[test]
fn connections_beyond_the_limit_are_told_to_try_again_later() -> Result<()> {
    let node = Netns::new("hnode")?;
    let daemon = start(&node, &["--max-connections", "4"])?;
    // The status query of `start` may still hold its connection for a moment.
    let idle: Vec<UnixStream> = (0..4)
        .map(|_| UnixStream::connect(&daemon.socket))
        .collect::<std::io::Result<_>>()?;
    // Served (not refused) connections answer nothing until they send a request: give them
    // a short read timeout and try again.
    let extra = wait_until(
        "a connection beyond the limit refused",
        ANSWER_WITHIN,
        || {
            let stream = UnixStream::connect(&daemon.socket)?;
            stream.set_read_timeout(Some(Duration::from_millis(500)))?;
            let mut line = String::new();
            Ok(BufReader::new(&stream)
                .read_line(&mut line)
                .ok()
                .filter(|n| *n > 0)
                .map(|_| line))
        },
    )?;
    let answer: Response = serde_json::from_str(&extra)?;
    match answer {
        Response::Error { code, msg, .. } => {
            assert_eq!(code, CniError::TRY_AGAIN_LATER, "{msg}");
            assert!(msg.contains("4 connections"), "{msg}");
        }
        Response::Ok { result } => bail!("served beyond the limit: {result}"),
    }
    // One idle connection goes away: STATUS is answered again.
    drop(idle);
    wait_until("STATUS answered again", ANSWER_WITHIN, || {
        let answer = client::call(&daemon.socket, &Request::Status, ANSWER_WITHIN)?;
        Ok(matches!(answer, Response::Ok { .. }).then_some(()))
    })?;
    Ok(())
}

#[test]
fn an_operation_over_its_deadline_is_told_to_try_again_later_and_converges() -> Result<()> {
    let node = Netns::new("hnode")?;
    let mut daemon = start(&node, &[])?;
    // Every durable commit takes 500 ms (failpoint commit.slow): every ADD is over a 200 ms
    // deadline, however fast the machine.
    daemon.stop_status()?;
    daemon.restart_with_env(
        &node,
        &["--operation-timeout", "0.2"],
        &[(provisioner::failpoint::ENV, "commit.slow")],
    )?;
    daemon.wait_ready(Duration::from_secs(10))?;
    let sandbox = Netns::new("hsbx")?;
    let id = format!("hostslow{}", std::process::id());
    let add = Request::Add(sandbox_request(&id, "eth0", Some(sandbox.path())));
    let (code, msg) = refused(&daemon, &add)?;
    assert_eq!(code, CniError::TRY_AGAIN_LATER, "{msg}");
    assert!(
        msg.contains("did not finish within 200ms; it goes on in the daemon"),
        "{msg}"
    );
    // The ADD was not abandoned half-way: it finishes in the daemon, STATUS answering meanwhile.
    wait_until("the ADD to finish in the daemon", ANSWER_WITHIN, || {
        let status = daemon.status()?;
        Ok((status["allocations"] == 1 && sandbox.links()? == ["eth0"]).then_some(()))
    })?;
    // The runtime's DEL after a failed ADD, then its retry, converge (with a usual deadline).
    daemon.stop_status()?;
    daemon.restart(&node, &[])?;
    daemon.wait_ready(Duration::from_secs(10))?;
    let del = Request::Del(sandbox_request(&id, "eth0", Some(sandbox.path())));
    let deleted = client::call(&daemon.socket, &del, ANSWER_WITHIN * 2)?;
    assert!(matches!(deleted, Response::Ok { .. }), "{deleted:?}");
    let added = client::call(&daemon.socket, &add, ANSWER_WITHIN * 2)?;
    assert!(matches!(added, Response::Ok { .. }), "{added:?}");
    assert_eq!(allocations(&daemon)?.len(), 1);
    let deleted = client::call(&daemon.socket, &del, ANSWER_WITHIN * 2)?;
    assert!(matches!(deleted, Response::Ok { .. }), "{deleted:?}");
    Ok(())
}

#[test]
fn idle_connections_garbage_and_huge_lines_leave_status_answered() -> Result<()> {
    use std::io::Write;
    let node = Netns::new("hnode")?;
    let daemon = start(&node, &[])?;
    // 2000 clients that connect and say nothing (below the default limit of 4096).
    let idle: Vec<UnixStream> = (0..2000)
        .map(|_| UnixStream::connect(&daemon.socket))
        .collect::<std::io::Result<_>>()?;
    let started = Instant::now();
    let status = client::call(&daemon.socket, &Request::Status, ANSWER_WITHIN)?;
    assert!(matches!(status, Response::Ok { .. }), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
    // A garbage line and an 8 MiB line: a decode error each, and the daemon goes on.
    for line in [b"garbage\n".to_vec(), vec![b'x'; 8 << 20]] {
        let stream = UnixStream::connect(&daemon.socket)?;
        stream.set_read_timeout(Some(ANSWER_WITHIN))?;
        let mut writer = stream.try_clone()?;
        // The daemon answers after 1 MiB and closes: the rest of the write may fail.
        let sender = std::thread::spawn(move || {
            let _ = writer.write_all(&line);
        });
        let mut answer = String::new();
        BufReader::new(&stream).read_line(&mut answer)?;
        let _ = sender.join();
        let answer: Response = serde_json::from_str(&answer)?;
        assert!(
            matches!(answer, Response::Error { code, .. } if code == CniError::DECODE_FAILURE),
            "{answer:?}"
        );
    }
    let status = client::call(&daemon.socket, &Request::Status, ANSWER_WITHIN)?;
    assert!(matches!(status, Response::Ok { .. }), "{status:?}");
    Ok(())
}
