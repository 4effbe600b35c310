//! podman 4 with its CNI backend runs containers through provisioner.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::{
    allocations, verdict_and_intent, wait_views_of_containers,
};
use provisioner_tests::pod_net::{check_pod_network, wait_node_bare};
use provisioner_tests::podman::{IMAGE, Podman};
use provisioner_tests::{Netns, scaled_secs};

const NETWORK: &str = "podnet";
const SUBNET: &str = "10.249.0.0/24";

#[test]
fn podman_container_gets_our_address_and_rm_releases_it() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon =
        Daemon::start_with_conflist(&node, &["--trace-deadline", &scaled_secs(2.0)], |socket| {
            conflist(NETWORK, "1.0.0", socket, SUBNET, None)
        })?;
    daemon.wait_ready(Duration::from_secs(10))?;
    daemon.wait_tracing(Duration::from_secs(30))?;
    let mut podman = Podman::new(&node, &daemon.conf_dir)?;

    let id = podman.run(&[
        "run",
        "--detach",
        "--name",
        "web",
        "--network",
        NETWORK,
        IMAGE,
        "sleep",
        "1000",
    ])?;
    let inspect = podman.inspect("web")?;
    let ip = inspect["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
        .as_str()
        .filter(|ip| !ip.is_empty())
        .with_context(|| format!("no address on {NETWORK}: {inspect:#}"))?
        .to_owned();
    let netns = inspect["NetworkSettings"]["SandboxKey"]
        .as_str()
        .map(PathBuf::from)
        .with_context(|| format!("no netns: {inspect:#}"))?;

    // Ours: the allocator holds exactly this address for this container.
    let held = allocations(&daemon)?;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].container_id, id);
    assert_eq!(held[0].addresses, [format!("{ip}/24")]);
    // podman names the container as the pod in CNI_ARGS (K8S_POD_NAME), with no namespace.
    let pod = held[0]
        .pod
        .as_ref()
        .context("podman's CNI_ARGS name the pod")?;
    assert_eq!((pod.namespace.as_str(), pod.name.as_str()), ("", "web"));
    check_pod_network(&netns, &ip)?;
    // The container sees it on its own eth0.
    let seen = podman.run(&[
        "exec", "web", "ip", "-o", "-4", "addr", "show", "dev", "eth0",
    ])?;
    assert!(seen.contains(&format!("inet {ip}/24")), "{seen}");
    node.ping(&ip)?;
    let views = wait_views_of_containers(
        &daemon,
        &HashSet::from([id.clone()]),
        true,
        Duration::from_secs(30),
    )?;
    assert_eq!(
        verdict_and_intent(&views[0]),
        "networked+confirmed",
        "{views:#?}"
    );
    assert_eq!(
        views[0]["verdict"]["creator"]["comm"], "podman",
        "{views:#?}"
    );
    // podman names the container to its CNI plugins (`K8S_POD_NAME`, no namespace): the
    // kernel watch reads it from the plugin's environment.
    assert_eq!(views[0]["verdict"]["pod"]["status"], "known", "{views:#?}");
    assert_eq!(
        views[0]["verdict"]["pod"]["pod"]["name"], "web",
        "{views:#?}"
    );
    let why = daemon.cli(&["why", "web"])?;
    let said = String::from_utf8_lossy(&why.stdout);
    assert!(why.status.success(), "{why:?}");
    assert!(said.starts_with("pod web, named by its CNI call"), "{said}");
    assert!(said.contains("verdict: NETWORKED"), "{said}");

    podman.run(&["rm", "--force", "--time", "0", "web"])?;
    let started = Instant::now();
    while !allocations(&daemon)?.is_empty() {
        if started.elapsed() > Duration::from_secs(10) {
            bail!(
                "podman rm did not release {ip}: {:?}",
                allocations(&daemon)?
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!netns.exists(), "netns pin {} left", netns.display());
    wait_node_bare(&node, Duration::from_secs(20))?;
    podman.shutdown()
}

/// A container that exits by itself: its DEL comes from conmon's cleanup process, not from
/// the podman command that ran it.
#[test]
fn podman_container_exit_releases_its_address() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--no-trace"], |socket| {
        conflist(NETWORK, "1.0.0", socket, SUBNET, None)
    })?;
    daemon.wait_ready(Duration::from_secs(10))?;
    let mut podman = Podman::new(&node, &daemon.conf_dir)?;
    podman.run(&[
        "run",
        "--detach",
        "--name",
        "once",
        "--network",
        NETWORK,
        IMAGE,
        "sh",
        "-c",
        "ip -o -4 addr show dev eth0",
    ])?;
    let started = Instant::now();
    loop {
        let state = podman.inspect("once")?;
        if state["State"]["Status"] == "exited" && allocations(&daemon)?.is_empty() {
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            bail!(
                "after the container exited its address is still held: {:?}\n{}",
                allocations(&daemon)?,
                daemon.log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs = podman.run(&["logs", "once"])?;
    assert!(logs.contains("inet 10.249.0."), "{logs}");
    wait_node_bare(&node, Duration::from_secs(20))?;
    podman.shutdown()
}
