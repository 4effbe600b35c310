//! The daemon never hands out an address a live pod holds: not after its store file is lost,
//! not after the network is renamed, and a daemon looking at the wrong host netns releases
//! nothing. Needs root.

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

fn addresses(daemon: &CrashDaemon) -> Result<HashSet<String>> {
    Ok(daemon
        .allocations()?
        .into_iter()
        .flat_map(|a| a.addresses)
        .collect())
}

/// Three live pods; then `damage` while the daemon is down; after the restart a new pod gets
/// an address none of them holds, and DEL of every pod leaves nothing.
fn live_pods_survive(damage: impl FnOnce(&mut CrashDaemon) -> Result<()>) -> Result<()> {
    let node = Netns::new("srnode")?;
    let pods: Vec<Netns> = (0..4).map(|_| Netns::new("srpod")).collect::<Result<_>>()?;
    let mut daemon = CrashDaemon::new("recnet", "10.251.10.0/28")?;
    daemon.start(&node, None)?;
    for (i, pod) in pods.iter().take(3).enumerate() {
        ok(&daemon, "ADD", &format!("p{i}"), pod)?;
    }
    let live = addresses(&daemon)?;
    daemon.kill()?;
    damage(&mut daemon)?;
    daemon.start(&node, None)?;
    ensure!(
        addresses(&daemon)? == live,
        "the live pods' addresses are not all held after the restart: {:?} vs {live:?}\n{}",
        daemon.allocations()?,
        daemon.log()
    );
    ok(&daemon, "ADD", "p3", &pods[3])?;
    let now = addresses(&daemon)?;
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
    live_pods_survive(|daemon| {
        std::fs::remove_file(daemon.data_dir.join("ipam.redb"))?;
        Ok(())
    })
}

#[test]
fn an_emptied_store_file_is_rebuilt_from_the_kernel() -> Result<()> {
    live_pods_survive(|daemon| {
        std::fs::File::create(daemon.data_dir.join("ipam.redb"))?;
        Ok(())
    })
}

#[test]
fn a_renamed_network_does_not_hand_out_addresses_held_under_the_old_name() -> Result<()> {
    live_pods_survive(|daemon| daemon.rename_network("recnet-renamed"))
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
    let live = addresses(&daemon)?;
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
    ensure!(addresses(&daemon)? == live, "released in the wrong netns");
    daemon.kill()?;

    daemon.start(&node, None)?;
    ensure!(addresses(&daemon)? == live);
    assert_converged(&daemon, &node)?;
    for (i, pod) in pods.iter().enumerate() {
        ok(&daemon, "DEL", &format!("w{i}"), pod)?;
    }
    wait_node_bare(&node, Duration::from_secs(10))
}
