//! The daemon killed while containerd creates pods: the plugin answers "try again later" (CNI
//! code 11), no pod is ready without network, and once the daemon is back every pod the kubelet
//! retries gets network, with no address leaked or handed out twice.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use provisioner_tests::containerd::Containerd;
use provisioner_tests::cri::{Cri, Pod, PodSandboxConfig, PodSandboxState};
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::daemon_queries::allocations;
use provisioner_tests::pod_net::{check_pod_network, wait_node_bare};
use provisioner_tests::{Netns, netns_cookie};

const PODS: usize = 24;
/// Pods that must have been created before the daemon is killed.
const BEFORE_KILL: usize = 6;
const SUBNET: &str = "10.250.0.0/24";

/// Every sandbox containerd reports ready has its address on eth0.
fn assert_ready_pods_have_network(cri: &mut Cri) -> Result<usize> {
    let mut ready = 0;
    for sandbox in cri.list_pods()? {
        if sandbox.state != PodSandboxState::SandboxReady as i32 {
            continue;
        }
        ready += 1;
        let (status, _) = cri.pod_status(&sandbox.id)?;
        let ip = status
            .network
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty())
            .with_context(|| format!("sandbox {} is ready without an address", sandbox.id))?;
        check_pod_network(&cri.pod_netns(&sandbox.id)?, &ip)
            .with_context(|| format!("sandbox {} is ready without network", sandbox.id))?;
    }
    Ok(ready)
}

#[test]
fn daemon_killed_during_pod_creation_then_retried_pods_get_network() -> Result<()> {
    let node = Netns::new("node")?;
    let mut daemon = Daemon::start_with_conflist(&node, &[], |socket| {
        conflist("restartnet", "1.0.0", socket, SUBNET, None)
    })?;
    let network: serde_json::Value = serde_json::from_slice(&std::fs::read(
        daemon.conf_dir.join("10-provisioner.conflist"),
    )?)?;
    daemon.wait_ready(Duration::from_secs(10))?;
    let mut containerd = Containerd::start_reading(&node, &daemon)?;

    // A kubelet creates pods one after the other; the daemon is killed on the way.
    let created = AtomicUsize::new(0);
    let configs: Vec<PodSandboxConfig> = (0..PODS)
        .map(|i| Cri::pod_config(&format!("rs-{i}"), &containerd.log_dir))
        .collect();
    let results: Vec<Result<Pod, tonic::Status>> = std::thread::scope(|scope| {
        let creator = scope.spawn(|| -> Result<Vec<Result<Pod, tonic::Status>>> {
            let mut cri = Cri::connect(&containerd.socket, Duration::from_secs(10))?;
            Ok(configs
                .iter()
                .map(|config| {
                    let result = cri.run_pod(config);
                    created.fetch_add(1, Ordering::SeqCst);
                    result
                })
                .collect())
        });
        let started = Instant::now();
        while created.load(Ordering::SeqCst) < BEFORE_KILL && !creator.is_finished() {
            if started.elapsed() > Duration::from_secs(60) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        daemon.kill()?;
        creator
            .join()
            .map_err(|_| anyhow::anyhow!("pod creator panicked"))?
    })?;

    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!(
        (BEFORE_KILL..PODS).contains(&ok),
        "{ok} of {PODS} pods created: the kill did not land while pods were created"
    );
    assert!(
        results[..ok].iter().all(Result::is_ok),
        "a pod was created after one failed"
    );
    // Every later pod failed with the plugin's "try again later" answer: the daemon was not
    // running, or (the pod in flight at the kill) stopped while serving it.
    for (i, result) in results.iter().enumerate().skip(ok) {
        let err = result
            .as_ref()
            .err()
            .context("a pod got network while the daemon was dead")?;
        assert!(
            err.message().contains("is `provisioner daemon` running?")
                || err.message().contains("try again once it is back"),
            "rs-{i}: {err}"
        );
    }
    // What containerd read from the plugin is CNI code 11: try again later.
    let probe = Netns::new("probe")?;
    let stdin = serde_json::to_vec(&plugin_stdin(&network, "1.0.0"))?;
    let answer = run_plugin("ADD", "probe", Some(probe.path()), "eth0", &stdin)?;
    assert_eq!(answer.error_code(), Some(11), "{answer:?}");
    drop(probe);
    // Whatever containerd holds now, none of it is ready without network.
    assert_ready_pods_have_network(containerd.cri())?;

    // The daemon comes back on the same state; the kubelet cleans up sandboxes that are not
    // ready and retries every pod that failed, with the next attempt number.
    daemon.restart(&node, &[])?;
    daemon.wait_ready(Duration::from_secs(10))?;
    for sandbox in containerd.cri().list_pods()? {
        if sandbox.state != PodSandboxState::SandboxReady as i32 {
            containerd.cri().stop_pod(&sandbox.id)?;
            containerd.cri().remove_pod(&sandbox.id)?;
        }
    }
    let mut pods: Vec<Pod> = Vec::new();
    for (config, result) in configs.iter().zip(results) {
        match result {
            Ok(pod) => pods.push(pod),
            Err(_) => {
                let mut retry = config.clone();
                if let Some(meta) = retry.metadata.as_mut() {
                    meta.attempt += 1;
                }
                let pod = containerd.cri().run_pod(&retry).map_err(|s| {
                    anyhow::anyhow!("retry of {:?}: {s}\n{}", config.metadata, daemon.log())
                })?;
                pods.push(pod);
            }
        }
    }

    // Every pod has network, each its own address, and the allocator holds exactly those.
    assert_eq!(assert_ready_pods_have_network(containerd.cri())?, PODS);
    let mut by_pod: HashMap<String, String> = HashMap::new();
    for pod in &pods {
        let (status, _) = containerd.cri().pod_status(&pod.id)?;
        let ip = status.network.map(|n| n.ip).unwrap_or_default();
        node.ping(&ip)?;
        by_pod.insert(pod.id.clone(), format!("{ip}/24"));
    }
    let distinct: HashSet<&String> = by_pod.values().collect();
    assert_eq!(
        distinct.len(),
        PODS,
        "an address was handed out twice: {by_pod:?}"
    );
    let held: HashMap<String, String> = allocations(&daemon)?
        .into_iter()
        .map(|a| (a.container_id, a.addresses.join(",")))
        .collect();
    assert_eq!(held, by_pod, "allocations differ from the pods' addresses");
    let cookies: HashSet<u64> = pods
        .iter()
        .map(|p| {
            containerd
                .cri()
                .pod_netns(&p.id)
                .and_then(|n| netns_cookie(&n))
        })
        .collect::<Result<_>>()?;
    assert_eq!(cookies.len(), PODS);

    let netns: Vec<PathBuf> = pods
        .iter()
        .map(|p| containerd.cri().pod_netns(&p.id))
        .collect::<Result<_>>()?;
    for pod in &pods {
        containerd.cri().stop_pod(&pod.id)?;
        containerd.cri().remove_pod(&pod.id)?;
    }
    assert!(allocations(&daemon)?.is_empty());
    assert!(netns.iter().all(|n| !n.exists()));
    wait_node_bare(&node, Duration::from_secs(20))?;
    containerd.shutdown()
}
