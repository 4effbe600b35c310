//! The daemon never hands out an address a live pod holds: not after its store file is lost or
//! broken (garbage, truncated: kept aside, never deleted), not after the network is renamed,
//! and a daemon looking at the wrong host netns releases nothing. Needs root.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::crash_harness::{CrashDaemon, assert_converged};
use provisioner_tests::pod_net::wait_node_bare;
use provisioner_tests::{Netns, wait_until};

fn ok(daemon: &CrashDaemon, command: &str, container_id: &str, netns: &Netns) -> Result<()> {
    let run = daemon.plugin(command, container_id, Some(netns.path()))?;
    if run.code != 0 {
        bail!("{command} {container_id}: {run:?}\nlog:\n{}", daemon.log());
    }
    Ok(())
}

/// Store files kept aside in the data dir.
fn kept_aside(daemon: &CrashDaemon) -> Result<Vec<String>> {
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(&daemon.data_dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("ipam.redb.broken-") {
            kept.push(name);
        }
    }
    Ok(kept)
}

/// The log says once, in one line, that the store was lost, what was recovered (the three
/// live pods' host veths) and what could not be; `kept`: the line names the file kept aside.
fn said_once(daemon: &CrashDaemon, kept: Option<&str>) -> Result<()> {
    let log = daemon.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("allocation store lost"))
        .collect();
    ensure!(lines.len() == 1, "said {} times:\n{log}", lines.len());
    let line = lines[0];
    ensure!(line.contains("ERROR"), "not loud: {line}");
    ensure!(
        line.contains("rebuilt from the kernel 3 sandboxes"),
        "{line}"
    );
    ensure!(line.contains("not recoverable"), "{line}");
    if let Some(kept) = kept {
        ensure!(line.contains(kept), "does not name {kept}: {line}");
    }
    Ok(())
}

/// A store file that cannot be opened (`damage` writes it): kept aside as it was (but for the
/// repair flag redb sets in its header), a new store rebuilt from the kernel, said once.
fn a_broken_store_is_kept_aside(damage: impl FnOnce(&[u8]) -> Vec<u8>) -> Result<()> {
    let broken = std::cell::RefCell::new(Vec::new());
    live_pods_survive(
        |daemon| {
            let path = daemon.data_dir.join("ipam.redb");
            let bytes = damage(&std::fs::read(&path)?);
            std::fs::write(&path, &bytes)?;
            *broken.borrow_mut() = bytes;
            Ok(())
        },
        |daemon| {
            let kept = kept_aside(daemon)?;
            ensure!(kept.len() == 1, "kept aside: {kept:?}");
            let bytes = std::fs::read(daemon.data_dir.join(&kept[0]))?;
            let broken = broken.borrow();
            let differ: Vec<usize> = (0..bytes.len().max(broken.len()))
                .filter(|&i| bytes.get(i) != broken.get(i))
                .collect();
            // redb marks a file it starts repairing (after a kill) in a header flag byte.
            ensure!(
                differ.len() <= 1 && differ.iter().all(|&i| i < 64),
                "the file kept aside is not the broken one as it was: {} bytes, broken {}, differ at {:?}",
                bytes.len(),
                broken.len(),
                differ
            );
            said_once(daemon, Some(&kept[0]))
        },
    )
}

/// Three live pods; then `damage` while the daemon is down; after the restart `check` holds, a
/// new pod gets an address none of them holds, and DEL of every pod leaves nothing.
fn live_pods_survive(
    damage: impl FnOnce(&mut CrashDaemon) -> Result<()>,
    check: impl FnOnce(&CrashDaemon) -> Result<()>,
) -> Result<()> {
    let node = Netns::new("srnode")?;
    let pods: Vec<Netns> = (0..4).map(|_| Netns::new("srpod")).collect::<Result<_>>()?;
    let mut daemon = CrashDaemon::new("recnet", "10.251.10.0/28")?;
    daemon.start(&node, None)?;
    for (i, pod) in pods.iter().take(3).enumerate() {
        ok(&daemon, "ADD", &format!("p{i}"), pod)?;
    }
    let live: HashSet<String> = daemon.addresses()?;
    daemon.kill()?;
    damage(&mut daemon)?;
    daemon.start(&node, None)?;
    check(&daemon)?;
    ensure!(
        daemon.addresses::<HashSet<String>>()? == live,
        "the live pods' addresses are not all held after the restart: {:?} vs {live:?}\n{}",
        daemon.allocations()?,
        daemon.log()
    );
    ok(&daemon, "ADD", "p3", &pods[3])?;
    let now: HashSet<String> = daemon.addresses()?;
    ensure!(
        now.len() == 4,
        "a live pod's address was handed out again: {now:?}"
    );
    assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    for (i, pod) in pods.iter().enumerate() {
        ok(&daemon, "DEL", &format!("p{i}"), pod)?;
    }
    ensure!(
        daemon.allocations()?.is_empty(),
        "{:?}",
        daemon.allocations()?
    );
    wait_node_bare(&node, Duration::from_secs(10))
}

#[test]
fn a_deleted_store_file_is_rebuilt_from_the_kernel() -> Result<()> {
    live_pods_survive(
        |daemon| {
            std::fs::remove_file(daemon.data_dir.join("ipam.redb"))?;
            Ok(())
        },
        |daemon| said_once(daemon, None),
    )
}

#[test]
fn an_emptied_store_file_is_rebuilt_from_the_kernel() -> Result<()> {
    live_pods_survive(
        |daemon| {
            std::fs::File::create(daemon.data_dir.join("ipam.redb"))?;
            Ok(())
        },
        |daemon| said_once(daemon, None),
    )
}

#[test]
fn a_garbage_store_file_is_kept_aside_and_rebuilt_from_the_kernel() -> Result<()> {
    a_broken_store_is_kept_aside(|bytes| {
        (0..bytes.len().max(4096))
            .map(|i| u8::try_from(i * 31 % 251).unwrap_or_default())
            .collect()
    })
}

#[test]
fn a_truncated_store_file_is_kept_aside_and_rebuilt_from_the_kernel() -> Result<()> {
    a_broken_store_is_kept_aside(|bytes| bytes[..bytes.len() / 3].to_vec())
}

#[test]
fn a_renamed_network_does_not_hand_out_addresses_held_under_the_old_name() -> Result<()> {
    live_pods_survive(|daemon| daemon.rename_network("recnet-renamed"), |_| Ok(()))
}

#[test]
fn a_daemon_in_the_wrong_host_netns_releases_nothing() -> Result<()> {
    let node = Netns::new("srnode")?;
    let wrong = Netns::new("srwrong")?;
    let pods: Vec<Netns> = (0..2).map(|_| Netns::new("srpod")).collect::<Result<_>>()?;
    let mut daemon = CrashDaemon::new("wrongnet", "10.251.11.0/28")?;
    daemon.start(&node, None)?;
    for (i, pod) in pods.iter().enumerate() {
        ok(&daemon, "ADD", &format!("w{i}"), pod)?;
    }
    let live: HashSet<String> = daemon.addresses()?;
    daemon.kill()?;

    daemon.start_unready(&wrong)?;
    let status = wait_until("the refusal in the status", Duration::from_secs(20), || {
        let out = daemon.cli(&["status", "--json"])?;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let refused = status["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r.as_str().is_some_and(|r| r.contains("--host-netns")));
        Ok(refused.then_some(status))
    })
    .with_context(|| daemon.log())?;
    ensure!(status["ready"] == false, "{status}");
    ensure!(
        daemon.addresses::<HashSet<String>>()? == live,
        "released in the wrong netns"
    );
    daemon.kill()?;

    daemon.start(&node, None)?;
    ensure!(daemon.addresses::<HashSet<String>>()? == live);
    assert_converged(&daemon, &node)?;
    for (i, pod) in pods.iter().enumerate() {
        ok(&daemon, "DEL", &format!("w{i}"), pod)?;
    }
    wait_node_bare(&node, Duration::from_secs(10))
}

#[test]
fn a_second_daemon_on_the_same_store_waits_keeps_nothing_aside_and_takes_over() -> Result<()> {
    let node = Netns::new("srnode")?;
    let pods: Vec<Netns> = (0..2).map(|_| Netns::new("srpod")).collect::<Result<_>>()?;
    let mut first = CrashDaemon::new("twonet", "10.251.15.0/28")?;
    let mut second = CrashDaemon::new("twonet", "10.251.15.0/28")?;
    first.start(&node, None)?;
    ok(&first, "ADD", "t0", &pods[0])?;
    std::os::unix::fs::symlink(&first.data_dir, &second.data_dir)?;

    second.start_unready(&node)?;
    let status = wait_until(
        "the second daemon's reason",
        Duration::from_secs(10),
        || {
            let out = second.cli(&["status", "--json"])?;
            let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let held = status["reasons"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r.as_str().is_some_and(|r| r.contains("already open")));
            Ok(held.then_some(status))
        },
    )
    .with_context(|| second.log())?;
    ensure!(status["ready"] == false, "{status}");
    // Still waiting through a few of its retries, and the store it waits for is untouched.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let out = second.cli(&["status", "--json"])?;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        ensure!(
            status["ready"] == false,
            "ready while the store is held: {status}"
        );
        ensure!(kept_aside(&first)?.is_empty(), "{:?}", kept_aside(&first)?);
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(first.addresses::<HashSet<String>>()?.len() == 1);

    let live: HashSet<String> = first.addresses()?;
    first.kill()?;
    second
        .wait_ready(Duration::from_secs(10))
        .context("the second daemon")?;
    ensure!(
        second.addresses::<HashSet<String>>()? == live,
        "{:?}",
        second.allocations()?
    );
    ok(&second, "ADD", "t1", &pods[1])?;
    ensure!(second.addresses::<HashSet<String>>()?.len() == 2);
    ensure!(kept_aside(&second)?.is_empty());
    assert_converged(&second, &node).with_context(|| second.log())?;
    for (i, pod) in pods.iter().enumerate() {
        ok(&second, "DEL", &format!("t{i}"), pod)?;
    }
    wait_node_bare(&node, Duration::from_secs(10))
}
