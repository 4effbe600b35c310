//! The CNI error codes docs/operating.md promises, end to end: the binary exec'd as a runtime does
//! against a running daemon, each error naming what it is about (the sandbox, the netns, the
//! socket) and leaving nothing behind. (4, 6, 7, 11, 50, 102, 103 are in cni_plugin.rs and
//! malformed_input.rs.)

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;

use anyhow::{Context, Result};
use provisioner_tests::crash_harness::CrashDaemon;
use provisioner_tests::daemon_harness::{Daemon, PluginRun, conflist, plugin_stdin, run_plugin};
use provisioner_tests::daemon_queries::allocations;
use provisioner_tests::{Netns, wait_only_lo};
use serde_json::Value;

fn msg(run: &PluginRun) -> String {
    run.json()["msg"].as_str().unwrap_or_default().to_owned()
}

/// A ready daemon serving `v4` (and `v6`), and the stdin of its plugin.
fn ready_daemon(node: &Netns, name: &str, v4: &str, v6: Option<&str>) -> Result<(Daemon, Vec<u8>)> {
    let daemon = Daemon::start_with_conflist(node, &["--no-trace"], |socket| {
        conflist(name, "1.1.0", socket, v4, v6)
    })?;
    daemon.wait_ready(std::time::Duration::from_secs(10))?;
    let config = conflist(name, "1.1.0", &daemon.socket, v4, v6);
    Ok((daemon, serde_json::to_vec(&plugin_stdin(&config, "1.1.0"))?))
}

#[test]
fn missing_netns_and_unknown_container_answer_3_naming_them() -> Result<()> {
    let node = Netns::new("node")?;
    let (daemon, stdin) = ready_daemon(&node, "errthree", "10.250.20.0/24", None)?;
    let missing = Path::new("/run/netns/provisioner-tests-no-such-netns");
    let add = run_plugin("ADD", "c-missing", Some(missing), "eth0", &stdin)?;
    assert_eq!(add.error_code(), Some(3), "{add:?}");
    assert!(
        msg(&add).contains(&missing.display().to_string()),
        "{add:?}"
    );
    assert!(allocations(&daemon)?.is_empty());

    // CHECK of a sandbox never added: 3, naming it.
    let pod = Netns::new("pod")?;
    let real = run_plugin("ADD", "c-real", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(real.code, 0, "{real:?}");
    let mut check_conf: Value = serde_json::from_slice(&stdin)?;
    check_conf["prevResult"] = real.json();
    let check = run_plugin(
        "CHECK",
        "c-never-added",
        Some(pod.path()),
        "eth1",
        &serde_json::to_vec(&check_conf)?,
    )?;
    assert_eq!(check.error_code(), Some(3), "{check:?}");
    assert!(msg(&check).contains("c-never-added"), "{check:?}");
    assert_eq!(
        run_plugin("DEL", "c-real", Some(pod.path()), "eth0", &stdin)?.code,
        0
    );
    Ok(())
}

#[test]
fn exhausted_range_answers_101_naming_the_sandbox_and_wires_nothing() -> Result<()> {
    let node = Netns::new("node")?;
    // A /29: 8 addresses less network, broadcast and gateway.
    let (daemon, stdin) = ready_daemon(&node, "errexh", "10.250.21.0/29", None)?;
    let pods: Vec<Netns> = (0..6).map(|_| Netns::new("exh")).collect::<Result<_>>()?;
    let mut added = 0;
    let mut failed = None;
    for (i, pod) in pods.iter().enumerate() {
        let add = run_plugin(
            "ADD",
            &format!("c-exh-{i}"),
            Some(pod.path()),
            "eth0",
            &stdin,
        )?;
        if add.code == 0 {
            added += 1;
        } else {
            failed = Some((i, add));
            break;
        }
    }
    let (i, add) = failed.context("a /29 never ran out of addresses")?;
    assert_eq!(added, 5, "every free address was handed out first");
    assert_eq!(add.error_code(), Some(101), "{add:?}");
    assert!(msg(&add).contains(&format!("c-exh-{i}")), "{add:?}");
    assert!(pods[i].links()?.is_empty(), "the refused sandbox was wired");
    assert_eq!(allocations(&daemon)?.len(), added);
    for (i, pod) in pods.iter().enumerate().take(added) {
        let del = run_plugin(
            "DEL",
            &format!("c-exh-{i}"),
            Some(pod.path()),
            "eth0",
            &stdin,
        )?;
        assert_eq!(del.code, 0, "{del:?}");
    }
    Ok(())
}

#[test]
fn failing_netlink_operation_answers_104_naming_the_sandbox_and_rolls_back() -> Result<()> {
    let node = Netns::new("node")?;
    let (daemon, stdin) = ready_daemon(&node, "errdp", "10.250.22.0/24", Some("fd00:250:22::/64"))?;
    // IPv6 off in the sandbox: the kernel refuses its v6 address, after the veth and the v4
    // address were set up.
    let pod = Netns::new("pod")?;
    for key in ["all", "default"] {
        pod.exec(
            "sysctl",
            &["-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=1")],
        )?;
    }
    let add = run_plugin("ADD", "c-dp", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(add.error_code(), Some(104), "{add:?}\n{}", daemon.log());
    assert!(msg(&add).contains("c-dp"), "{add:?}");
    assert!(
        pod.links()?.is_empty(),
        "the failed ADD left a link in the pod"
    );
    assert!(
        allocations(&daemon)?.is_empty(),
        "the failed ADD kept its addresses"
    );
    wait_only_lo(&node, std::time::Duration::from_secs(10))?;
    Ok(())
}

/// The store cannot commit (failpoint `commit.fail`, as on a failing disk): the ADD answers 100
/// naming the sandbox, and nothing is wired or kept.
#[test]
fn failing_store_answers_100_naming_the_sandbox_and_wires_nothing() -> Result<()> {
    let node = Netns::new("node")?;
    let mut daemon = CrashDaemon::new("errstore", "10.250.23.0/24")?;
    daemon.start(&node, Some("commit.fail"))?;
    let pod = Netns::new("pod")?;
    let add = daemon.plugin("ADD", "c-store", Some(pod.path()))?;
    assert_eq!(add.error_code(), Some(100), "{add:?}\n{}", daemon.log());
    assert!(msg(&add).contains("c-store"), "{add:?}");
    assert!(msg(&add).contains("commit"), "{add:?}");
    assert!(
        pod.links()?.is_empty(),
        "the failed ADD left a link in the pod"
    );
    wait_only_lo(&node, std::time::Duration::from_secs(10))?;
    Ok(())
}

/// A "daemon" that answers every request with a line that is not JSON: the plugin reports an
/// I/O failure (5) naming the socket, not a retryable 11.
#[test]
fn undecodable_daemon_answer_is_5_naming_the_socket() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("garbled.sock");
    let listener = UnixListener::bind(&socket)?;
    let server = std::thread::spawn(move || -> Result<()> {
        let (stream, _) = listener.accept()?;
        let mut request = String::new();
        BufReader::new(&stream).read_line(&mut request)?;
        (&stream).write_all(b"this is not JSON\n")?;
        Ok(())
    });
    let pod = Netns::new("pod")?;
    let config = conflist("errio", "1.1.0", &socket, "10.250.23.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.1.0"))?;
    let add = run_plugin("ADD", "c-io", Some(pod.path()), "eth0", &stdin)?;
    server
        .join()
        .map_err(|_| anyhow::anyhow!("fake daemon panicked"))??;
    assert_eq!(add.error_code(), Some(5), "{add:?}");
    assert!(msg(&add).contains(&socket.display().to_string()), "{add:?}");
    assert!(pod.links()?.is_empty());
    Ok(())
}
