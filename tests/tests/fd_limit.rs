//! A daemon short of file descriptors: a 16-way burst of 64 ADDs with the daemon's open-files
//! limit lowered to 128 (prlimit, while it runs). Every ADD succeeds, the daemon survives, and
//! the store equals the kernel. Needs root and prlimit (util-linux).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::Netns;
use provisioner_tests::crash_harness::{CrashDaemon, assert_converged};
use provisioner_tests::pod_net::wait_node_bare;

const CALLERS: usize = 16;
const PER_CALLER: usize = 4;

#[test]
fn a_burst_under_a_low_fd_limit_succeeds_and_the_daemon_survives() -> Result<()> {
    let node = Netns::new("fdnode")?;
    let mut daemon = CrashDaemon::new("fdnet", "10.251.18.0/24")?;
    daemon.start(&node, None)?;
    let pid = daemon.pid().context("the daemon runs")?;
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=128:128"])
        .output()?;
    ensure!(out.status.success(), "prlimit: {out:?}");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    ensure!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(" 128 ")),
        "{limits}"
    );
    let pods: Arc<Vec<Netns>> = Arc::new(
        (0..CALLERS * PER_CALLER)
            .map(|_| Netns::new("fdpod"))
            .collect::<Result<_>>()?,
    );
    let daemon = Arc::new(daemon);
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (pods, daemon) = (Arc::clone(&pods), Arc::clone(&daemon));
            std::thread::spawn(move || -> Result<()> {
                for k in 0..PER_CALLER {
                    let i = c * PER_CALLER + k;
                    let run = daemon.plugin("ADD", &format!("fd{i}"), Some(pods[i].path()))?;
                    ensure!(run.code == 0, "ADD fd{i}: {run:?}");
                }
                Ok(())
            })
        })
        .collect();
    for caller in callers {
        caller
            .join()
            .unwrap_or_else(|_| bail!("a caller thread panicked"))
            .with_context(|| daemon.log())?;
    }
    ensure!(daemon.running(), "the daemon died:\n{}", daemon.log());
    let allocations = assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    ensure!(allocations.len() == CALLERS * PER_CALLER, "{allocations:?}");
    let addresses: HashSet<&String> = allocations.iter().flat_map(|a| &a.addresses).collect();
    ensure!(addresses.len() == allocations.len(), "{allocations:?}");
    for (i, pod) in pods.iter().enumerate() {
        let run = daemon.plugin("DEL", &format!("fd{i}"), Some(pod.path()))?;
        ensure!(run.code == 0, "DEL fd{i}: {run:?}");
    }
    wait_node_bare(&node, Duration::from_secs(10))
}
