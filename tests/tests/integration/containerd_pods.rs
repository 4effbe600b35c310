//! containerd 1.6 with its CRI plugin runs pods through provisioner, as a kubelet drives it;
//! `list`, `sandboxes`, `why` and the daemon's log name each pod as the kubelet named it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use ipnetwork::Ipv4Network;
use provisioner::pod::Pod as NamedPod;
use provisioner_tests::containerd::Containerd;
use provisioner_tests::cri::{self, Cri};
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::{
    allocations, cookie_of, names_pod_in_fields, pod_of_view, verdict_and_intent, wait_views_of,
};
use provisioner_tests::oci_image::BUSYBOX_IMAGE;
use provisioner_tests::pod_net::{check_pod_network, wait_node_bare};
use provisioner_tests::{Netns, netns_cookie, wait_until};

const PODS: usize = 20;
const SUBNET: &str = "10.251.0.0/24";

struct RunningPod {
    pod: cri::Pod,
    /// The pod as the kubelet named it (and its sandbox id, once run).
    named: NamedPod,
    ip: String,
    netns: PathBuf,
}

/// Pod `i` as the kubelet names it: two namespaces, a UUID for a uid.
fn kubelet_pod(i: usize) -> NamedPod {
    NamedPod {
        namespace: if i.is_multiple_of(2) {
            "shop"
        } else {
            "team-b"
        }
        .to_owned(),
        name: format!("web-{i}"),
        uid: Some(format!("6f0c2b8e-4d7e-4c1b-9a51-{i:012x}")),
        sandbox_id: None,
    }
}

#[test]
fn containerd_pods_get_network_and_leave_nothing() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--trace-deadline", "2"], |socket| {
        conflist("ctrdnet", "1.0.0", socket, SUBNET, None)
    })?;
    daemon.wait_ready(Duration::from_secs(10))?;
    daemon.wait_tracing(Duration::from_secs(30))?;

    let mut containerd = Containerd::start_reading(&node, &daemon)?;
    let subnet: Ipv4Network = SUBNET.parse()?;

    let mut pods = Vec::new();
    for i in 0..PODS {
        let mut named = kubelet_pod(i);
        let config = Cri::kubelet_pod_config(
            &named.namespace,
            &named.name,
            named.uid.as_deref().unwrap_or_default(),
            &containerd.log_dir,
        );
        let ready = containerd
            .cri()
            .run_ready_pod_of(&config)
            .with_context(|| daemon.log())?;
        named.sandbox_id = Some(ready.pod.id.clone());
        let ip = ready.ips[0].clone();
        assert!(
            subnet.contains(ip.parse()?),
            "pod-{i} got {ip}, outside {SUBNET}"
        );
        check_pod_network(&ready.netns, &ip).with_context(|| format!("pod-{i}"))?;
        node.ping(&ip)?;
        pods.push(RunningPod {
            pod: ready.pod,
            named,
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

    // `list` names each pod as the kubelet did: namespace, name, uid, sandbox id.
    let listed: HashMap<String, Option<NamedPod>> = allocations(&daemon)?
        .into_iter()
        .map(|a| (a.container_id, a.pod))
        .collect();
    for p in &pods {
        assert_eq!(listed[&p.pod.id].as_ref(), Some(&p.named), "{listed:#?}");
    }
    let text = String::from_utf8_lossy(&daemon.cli(&["list"])?.stdout).into_owned();
    for p in &pods {
        let line = format!(
            "{}\t{}\teth0\t{}/24",
            p.named.qualified_name(),
            p.pod.id,
            p.ip
        );
        assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
    }

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
    for p in &pods {
        let cookie = netns_cookie(&p.netns)?;
        let view = views
            .iter()
            .find(|v| cookie_of(v) == Some(cookie))
            .with_context(|| format!("{}'s view", p.named.qualified_name()))?;
        assert_eq!(pod_of_view(view).as_ref(), Some(&p.named), "{view:#}");
    }
    let text = String::from_utf8_lossy(&daemon.cli(&["sandboxes"])?.stdout).into_owned();
    for p in &pods {
        let who = format!("pod {} container {}: ", p.named.qualified_name(), p.pod.id);
        assert!(
            text.lines().any(|l| l.starts_with(&who)),
            "{who:?} not in:\n{text}"
        );
    }

    // `why NAMESPACE/NAME`: networked, and the daemon's ADD confirmed by the kernel.
    for p in &pods {
        let who = p.named.qualified_name();
        let out = daemon.cli(&["why", &who])?;
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "why {who}: {out:?}");
        assert!(
            said.starts_with(&format!("pod {}, named by its CNI call", p.named)),
            "{said}"
        );
        assert!(said.contains("verdict: NETWORKED"), "{said}");
        assert!(said.contains("INTENT CONFIRMED"), "{said}");
    }

    // The daemon's log: each pod's ADD line and verdict line carry its namespace, name, uid and
    // sandbox id as fields, and name it in the message.
    let log = wait_until(
        "every pod's verdict logged",
        Duration::from_secs(30),
        || {
            let log = daemon.log();
            let all = pods.iter().all(|p| {
                let verdict = format!("VERDICT NETWORKED pod {}", p.named);
                log.lines().any(|l| l.contains(&verdict))
            });
            Ok(all.then_some(log))
        },
    )
    .with_context(|| daemon.log())?;
    for p in &pods {
        for message in [
            format!("ADD pod {}: added", p.named),
            format!("VERDICT NETWORKED pod {}", p.named),
        ] {
            let line = log
                .lines()
                .find(|l| l.contains(&message))
                .with_context(|| format!("{message:?} not logged:\n{log}"))?;
            assert!(names_pod_in_fields(line, &p.named), "{line}");
        }
    }

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
