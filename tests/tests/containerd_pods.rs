//! containerd 1.6 with its CRI plugin runs pods through provisioner, as a kubelet drives it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use ipnetwork::Ipv4Network;
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri;
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::{allocations, verdict_and_intent, wait_views_of};
use provisioner_tests::oci_image::BUSYBOX_IMAGE;
use provisioner_tests::pod_net::{check_pod_network, wait_node_bare};
use provisioner_tests::{Netns, netns_cookie};

const PODS: usize = 20;
const SUBNET: &str = "10.251.0.0/24";

struct RunningPod {
    pod: cri::Pod,
    ip: String,
    netns: PathBuf,
}

#[test]
fn containerd_pods_get_network_and_leave_nothing() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--trace-deadline", "2"], |socket| {
        conflist("ctrdnet", "1.0.0", socket, SUBNET, None)
    })?;
    daemon.wait_ready(Duration::from_secs(10))?;
    daemon.wait_tracing(Duration::from_secs(30))?;

    // containerd reads the daemon's conf dir, as both read /etc/cni/net.d on a node.
    let mut containerd = Containerd::start(&node, &CniSetup::reading(&daemon.conf_dir))?;
    containerd
        .cri()
        .wait_network_ready(true, Duration::from_secs(10))?;
    let subnet: Ipv4Network = SUBNET.parse()?;

    let mut pods = Vec::new();
    for i in 0..PODS {
        let log_dir = containerd.log_dir.clone();
        let ready = containerd
            .cri()
            .run_ready_pod(&format!("pod-{i}"), &log_dir)
            .with_context(|| daemon.log())?;
        let ip = ready.ips[0].clone();
        assert!(
            subnet.contains(ip.parse()?),
            "pod-{i} got {ip}, outside {SUBNET}"
        );
        check_pod_network(&ready.netns, &ip).with_context(|| format!("pod-{i}"))?;
        node.ping(&ip)?;
        pods.push(RunningPod {
            pod: ready.pod,
            ip,
            netns: ready.netns,
        });
    }

    // Every address is ours: the allocator holds exactly one per pod, keyed by the sandbox id.
    let held: HashMap<String, Vec<String>> = allocations(&daemon)?
        .into_iter()
        .map(|a| (a.container_id, a.addresses))
        .collect();
    let expected: HashMap<String, Vec<String>> = pods
        .iter()
        .map(|p| (p.pod.id.clone(), vec![format!("{}/24", p.ip)]))
        .collect();
    assert_eq!(held, expected);

    // The kernel watch saw each pod namespace get its network from our ADD.
    let cookies: HashSet<u64> = pods
        .iter()
        .map(|p| netns_cookie(&p.netns))
        .collect::<Result<_>>()?;
    let views = wait_views_of(&daemon, &cookies, true, Duration::from_secs(30))?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for view in &views {
        *counts.entry(verdict_and_intent(view)).or_default() += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("networked+confirmed".to_owned(), PODS)]),
        "{views:#?}"
    );

    // A container in the first pod checks its own eth0 and address.
    let first = &pods[0];
    let container = containerd.cri().start_container(
        &first.pod,
        "netcheck",
        BUSYBOX_IMAGE.name,
        &[
            "/bin/sh",
            "-c",
            "ip -o -4 addr show dev eth0 && ip -o -4 addr show dev eth0 | grep -q \" inet $EXPECTED/\" && ip route show default | grep -q 'default via .* dev eth0'",
        ],
        &[("EXPECTED", &first.ip)],
    )?;
    let code = containerd
        .cri()
        .wait_container_exit(&container, Duration::from_secs(30))?;
    let log = cri::log_lines(&cri::container_log_path(&first.pod, "netcheck"))?;
    assert_eq!(code, 0, "the container's own check failed: {log:?}");
    assert!(
        log.iter()
            .any(|l| l.contains("eth0") && l.contains(&format!("inet {}/24", first.ip))),
        "{log:?}"
    );
    containerd.cri().remove_container(&container)?;

    // Stop (DEL with the netns) then Remove (DEL with an empty netns): nothing remains.
    for p in &pods {
        containerd.cri().stop_pod(&p.pod.id)?;
        containerd.cri().remove_pod(&p.pod.id)?;
    }
    assert_eq!(containerd.cri().list_pods()?.len(), 0);
    let left = allocations(&daemon)?;
    assert!(left.is_empty(), "allocations left: {left:?}");
    for p in &pods {
        assert!(
            !p.netns.exists(),
            "netns pin {} still exists",
            p.netns.display()
        );
    }
    wait_node_bare(&node, Duration::from_secs(20))?;
    containerd.shutdown()?;
    Ok(())
}
