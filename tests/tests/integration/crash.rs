//! The daemon killed (SIGKILL, by a failpoint) at every step of ADD and DEL, restarted, and the
//! runtime's retry (ADD again, DEL, or GC): the node converges, with no leaked address, no
//! address with two owners, no orphan veth or route, and the store equal to the kernel.
//! Needs root and the daemon built with `--features fault-injection` (`cargo xtask test` does).

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::Netns;
use provisioner_tests::crash_harness::{CrashDaemon, assert_converged};
use provisioner_tests::pod_net::wait_node_bare;

/// `commit.slow` delays the durable commit: the crash in setup then comes before it.
const ADD_POINTS: &[&str] = &[
    "add.reserved",
    "commit.slow,add.reserved",
    "setup.create-veth",
    "commit.slow,setup.create-veth",
    "setup.host-address",
    "commit.slow,setup.host-address",
    "setup.sandbox-routes",
    "commit.slow,setup.sandbox-routes",
    "add.durable",
    "add.before-reply",
];
/// `teardown.slow`: the release is on disk while the veth still routes the address.
const DEL_POINTS: &[&str] = &[
    "teardown.slow,del.release-durable",
    "del.release-durable",
    "del.teardown",
    "del.released",
];

/// Runs `command` with the daemon armed at `point` and expects the daemon to die there and the
/// plugin to answer an error.
fn crash_at(
    daemon: &mut CrashDaemon,
    node: &Netns,
    point: &str,
    command: &str,
    container_id: &str,
    netns: &Path,
) -> Result<()> {
    daemon.start(node, Some(point))?;
    let run = daemon.plugin(command, container_id, Some(netns))?;
    daemon.wait_exit(Duration::from_secs(10)).with_context(|| {
        format!(
            "failpoint {point} not reached (is the daemon built with --features \
             fault-injection?); {command} answered {run:?}"
        )
    })?;
    ensure!(
        run.code != 0,
        "{command} {container_id} succeeded although the daemon died at {point}: {run:?}"
    );
    Ok(())
}

fn ok(daemon: &CrashDaemon, command: &str, container_id: &str, netns: &Path) -> Result<()> {
    let run = daemon.plugin(command, container_id, Some(netns))?;
    if run.code != 0 {
        bail!("{command} {container_id}: {run:?}\nlog:\n{}", daemon.log());
    }
    Ok(())
}

/// A crash in ADD, healed by the runtime retrying the ADD, then by a DEL of another crashed ADD.
fn add_point_converges(point: &str) -> Result<()> {
    let node = Netns::new("crnode")?;
    let pods: Vec<Netns> = (0..3).map(|_| Netns::new("crpod")).collect::<Result<_>>()?;
    let mut daemon = CrashDaemon::new("crashnet", "10.251.7.0/24")?;
    daemon.start(&node, None)?;
    ok(&daemon, "ADD", "c0", pods[0].path())?;
    daemon.kill()?;

    // Retry by ADD.
    crash_at(&mut daemon, &node, point, "ADD", "c1", pods[1].path())?;
    daemon.start(&node, None)?;
    ok(&daemon, "ADD", "c1", pods[1].path())?;
    let held = assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    ensure!(held.len() == 2, "{point}: after the ADD retry: {held:?}");
    daemon.kill()?;

    // Retry by DEL.
    crash_at(&mut daemon, &node, point, "ADD", "c2", pods[2].path())?;
    daemon.start(&node, None)?;
    ok(&daemon, "DEL", "c2", pods[2].path())?;
    let held = assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    let ids: HashSet<&str> = held.iter().map(|a| a.container_id.as_str()).collect();
    ensure!(
        ids == HashSet::from(["c0", "c1"]),
        "{point}: after the DEL retry: {held:?}"
    );

    // Nothing leaked: a new sandbox gets an address nobody holds, and after DEL of all the node
    // is bare and the store empty.
    let before: Vec<String> = daemon.addresses()?;
    ok(&daemon, "ADD", "c2", pods[2].path())?;
    let after: Vec<String> = daemon.addresses()?;
    ensure!(after.len() == 3, "{after:?}");
    for (i, pod) in pods.iter().enumerate() {
        ok(&daemon, "DEL", &format!("c{i}"), pod.path())?;
    }
    ensure!(
        daemon.allocations()?.is_empty(),
        "{point}: leaked {:?} (held before {before:?})",
        daemon.allocations()?
    );
    wait_node_bare(&node, Duration::from_secs(10))?;
    Ok(())
}

#[test]
fn a_crash_at_any_step_of_add_converges_after_the_runtimes_retry() -> Result<()> {
    for point in ADD_POINTS {
        add_point_converges(point).with_context(|| format!("failpoint {point}"))?;
    }
    Ok(())
}

#[test]
fn a_crash_at_any_step_of_del_converges_after_the_runtimes_retry() -> Result<()> {
    for point in DEL_POINTS {
        let node = Netns::new("crnode")?;
        let pods: Vec<Netns> = (0..2).map(|_| Netns::new("crpod")).collect::<Result<_>>()?;
        let mut daemon = CrashDaemon::new("crashnet", "10.251.8.0/24")?;
        daemon.start(&node, None)?;
        ok(&daemon, "ADD", "c0", pods[0].path())?;
        ok(&daemon, "ADD", "c1", pods[1].path())?;
        daemon.kill()?;
        crash_at(&mut daemon, &node, point, "DEL", "c1", pods[1].path())
            .with_context(|| format!("failpoint {point}"))?;
        daemon.start(&node, None)?;
        ok(&daemon, "DEL", "c1", pods[1].path())?;
        let held = assert_converged(&daemon, &node)
            .with_context(|| format!("failpoint {point}; log:\n{}", daemon.log()))?;
        ensure!(
            held.len() == 1 && held[0].container_id == "c0",
            "{point}: {held:?}"
        );
        ok(&daemon, "DEL", "c0", pods[0].path())?;
        ensure!(daemon.allocations()?.is_empty(), "{point}");
        wait_node_bare(&node, Duration::from_secs(10))?;
    }
    Ok(())
}

#[test]
fn gc_removes_what_a_crashed_add_left() -> Result<()> {
    for point in ["setup.sandbox-routes", "commit.slow,setup.sandbox-routes"] {
        gc_after_crash(point).with_context(|| format!("failpoint {point}"))?;
    }
    Ok(())
}

fn gc_after_crash(point: &str) -> Result<()> {
    let node = Netns::new("crnode")?;
    let pods: Vec<Netns> = (0..2).map(|_| Netns::new("crpod")).collect::<Result<_>>()?;
    let mut daemon = CrashDaemon::new("crashnet", "10.251.9.0/24")?;
    daemon.start(&node, None)?;
    ok(&daemon, "ADD", "c0", pods[0].path())?;
    daemon.kill()?;
    crash_at(&mut daemon, &node, point, "ADD", "c1", pods[1].path())?;
    daemon.start(&node, None)?;
    // The runtime gave up on c1: its GC lists only c0.
    let gc = daemon.gc(&["c0".to_owned()])?;
    ensure!(gc.code == 0, "GC: {gc:?}");
    let held = assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    ensure!(held.len() == 1 && held[0].container_id == "c0", "{held:?}");
    Ok(())
}
