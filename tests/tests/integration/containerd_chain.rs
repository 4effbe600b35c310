//! Chained plugins after ours, as containerd's and GKE's templates chain them: a conflist of
//! provisioner, portmap and bandwidth, run by containerd over CRI for a pod with a hostPort and
//! bandwidth annotations. The hostPort reaches the pod from the node namespace, bandwidth's
//! qdisc is on our host veth, CHECK of the whole chain passes, the kernel watch gives the pod
//! one verdict (networked), and once the pod is removed no iptables rule, qdisc or device of it
//! is left. Traffic stays inside the test's namespaces.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri::Cri;
use provisioner_tests::daemon_harness::{Daemon, conflist, run_with_stdin};
use provisioner_tests::daemon_queries::{cookie_of, verdict_and_intent, wait_views_of};
use provisioner_tests::{Netns, in_netns, netns_cookie};
use serde_json::{Value, json};
use testkit::tools;

const SUBNET: &str = "10.252.7.0/24";
const NETWORK: &str = "chainnet";
/// The node's own address, on the node namespace's loopback: where the hostPort is asked.
const NODE_ADDR: &str = "10.252.8.1";
const HOST_PORT: u16 = 18080;
const POD_PORT: u16 = 8080;
/// What the pod answers on its port.
const HELLO: &[u8] = b"hello from the pod\n";

/// Our network with portmap and bandwidth chained after it, as containerd's templates do.
fn chained_conflist(socket: &Path) -> Value {
    let mut list = conflist(NETWORK, "1.0.0", socket, SUBNET, None);
    if let Some(plugins) = list["plugins"].as_array_mut() {
        plugins.push(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
        plugins.push(json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}));
    }
    list
}

/// `iptables-save` of the node namespace (every table).
fn iptables(node: &Netns) -> Result<String> {
    node.exec("iptables-save", &[])
        .context("iptables-save in the node namespace (apt-get install iptables)")
}

/// The result libcni cached for the chain's ADD (containerd keeps it for DEL and CHECK).
fn cached_result(sandbox_id: &str) -> Result<Value> {
    let path = format!("/var/lib/cni/results/{NETWORK}-{sandbox_id}-eth0");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    Ok(serde_json::from_str(&text)?)
}

/// CHECK of every plugin of the chain, in order, as libcni runs it: each gets its config, the
/// runtime config of the capabilities it declares, and the chain's result as `prevResult`.
fn check_chain(
    list: &Value,
    cached: &Value,
    bin_dir: &Path,
    node: &Netns,
    sandbox_id: &str,
    netns: &Path,
) -> Result<()> {
    let result = &cached["result"];
    let capability_args = &cached["capabilityArgs"];
    let v4_only = tempfile::tempdir()?;
    for tool in ["iptables", "iptables-save", "iptables-restore"] {
        std::os::unix::fs::symlink(Path::new("/usr/sbin").join(tool), v4_only.path().join(tool))?;
    }
    for plugin in list["plugins"].as_array().into_iter().flatten() {
        let kind = plugin["type"].as_str().context("a plugin without type")?;
        let mut stdin = plugin.clone();
        stdin["cniVersion"] = list["cniVersion"].clone();
        stdin["name"] = list["name"].clone();
        stdin["prevResult"] = result.clone();
        let mut runtime_config = serde_json::Map::new();
        for (capability, on) in plugin["capabilities"].as_object().into_iter().flatten() {
            if on == true && !capability_args[capability].is_null() {
                runtime_config.insert(capability.clone(), capability_args[capability].clone());
            }
        }
        if !runtime_config.is_empty() {
            stdin["runtimeConfig"] = Value::Object(runtime_config);
        }
        let mut cmd = testkit::cni::command(
            &bin_dir.join(kind),
            "CHECK",
            sandbox_id,
            Some(netns),
            "eth0",
            &bin_dir.display().to_string(),
        );
        if kind == "portmap" {
            // portmap 1.1.1's CHECK looks for the pod's chain in ip6tables too, whatever the
            // pod's family, and Debian's ip6tables (nf_tables 1.8.9) then reports the IPv4
            // chain of that name as present but incompatible: CHECK fails for any IPv4-only
            // pod. Its IPv4 check is what this pod has; ip6tables is left off its PATH.
            cmd.env("PATH", v4_only.path());
        }
        node.enter(&mut cmd)?;
        let run = run_with_stdin(cmd, &serde_json::to_vec(&stdin)?)?;
        ensure!(
            run.code == 0,
            "CHECK of {kind} exited {}: {}{}\nits stdin: {stdin:#}",
            run.code,
            run.stdout,
            run.stderr
        );
    }
    Ok(())
}

/// One connection from the node namespace to `addr`: what it was answered.
fn ask(node: &Netns, addr: &str) -> Result<Vec<u8>> {
    in_netns(node.path(), || -> Result<Vec<u8>> {
        let addr: std::net::SocketAddr = addr.parse()?;
        let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connect to {addr} from the node namespace"))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        Ok(answer)
    })?
}

/// Serves one connection on the pod's port, inside the pod's namespace, answering [`HELLO`].
fn serve_once_in_pod(netns: &Path) -> Result<std::thread::JoinHandle<Result<()>>> {
    let netns = netns.to_path_buf();
    let (bound, listening) = std::sync::mpsc::channel::<Result<()>>();
    let server = std::thread::spawn(move || -> Result<()> {
        in_netns(&netns, || -> Result<()> {
            let listener = match std::net::TcpListener::bind(("0.0.0.0", POD_PORT)) {
                Ok(listener) => {
                    let _ = bound.send(Ok(()));
                    listener
                }
                Err(e) => {
                    let _ = bound.send(Err(anyhow::anyhow!("bind :{POD_PORT} in the pod: {e}")));
                    bail!("bind failed");
                }
            };
            listener.set_nonblocking(false)?;
            let (mut stream, _) = listener.accept()?;
            stream.write_all(HELLO)?;
            Ok(())
        })?
    });
    listening.recv_timeout(Duration::from_secs(10))??;
    Ok(server)
}

#[test]
fn portmap_and_bandwidth_chained_after_provisioner_under_containerd() -> Result<()> {
    let node = Netns::new("chain")?;
    node.ip(&["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"])?;
    let daemon = Daemon::start_with_conflist(&node, &["--trace-deadline", "2"], chained_conflist)?;
    daemon.wait_ready(Duration::from_secs(10))?;
    daemon.wait_tracing(Duration::from_secs(30))?;
    let list = chained_conflist(&daemon.socket);
    let rules_before = iptables(&node)?;
    let links_before = node.links()?;

    let mut containerd = Containerd::start(&node, &CniSetup::reading(&daemon.conf_dir))?;
    for (name, plugin) in [("portmap", tools::PORTMAP), ("bandwidth", tools::BANDWIDTH)] {
        std::os::unix::fs::symlink(plugin.require()?, containerd.bin_dir.join(name))
            .with_context(|| format!("link {name} into containerd's CNI bin dir"))?;
    }
    containerd
        .cri()
        .wait_network_ready(true, Duration::from_secs(10))?;

    // The pod as the kubelet passes one with a hostPort and bandwidth limits.
    let mut config =
        Cri::kubelet_pod_config("shop", "web-chain", "uid-web-chain", &containerd.log_dir);
    config.port_mappings = vec![provisioner_cri::v1::PortMapping {
        protocol: provisioner_cri::v1::Protocol::Tcp as i32,
        container_port: i32::from(POD_PORT),
        host_port: i32::from(HOST_PORT),
        host_ip: String::new(),
    }];
    config
        .annotations
        .insert("kubernetes.io/ingress-bandwidth".into(), "10M".into());
    config
        .annotations
        .insert("kubernetes.io/egress-bandwidth".into(), "10M".into());
    let ready = containerd
        .cri()
        .run_ready_pod_of(&config)
        .with_context(|| daemon.log())?;
    let sandbox_id = ready.pod.id.clone();
    let pod_ip = ready.ips.first().context("no pod address")?.clone();

    // The hostPort, asked from the node namespace at the node's address, reaches the pod.
    let server = serve_once_in_pod(&ready.netns)?;
    let answer = ask(&node, &format!("{NODE_ADDR}:{HOST_PORT}"));
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("the pod's server panicked"))?;
    let answer = answer.with_context(|| {
        format!(
            "iptables of the node:\n{}",
            iptables(&node).unwrap_or_default()
        )
    })?;
    served?;
    assert_eq!(answer, HELLO);

    // bandwidth put its qdisc on our host veth: the interface of the result outside the pod.
    let cached = cached_result(&sandbox_id)?;
    let host_veth = cached["result"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["sandbox"].as_str().is_none_or(str::is_empty))
        .and_then(|i| i["name"].as_str())
        .context("no host interface in the chain's result")?
        .to_owned();
    let qdiscs = node.exec("tc", &["qdisc", "show", "dev", &host_veth])?;
    ensure!(
        qdiscs.contains("tbf"),
        "no bandwidth qdisc on {host_veth}: {qdiscs}"
    );
    let links_with_pod = node.links()?;
    ensure!(
        links_with_pod.contains(&host_veth),
        "{host_veth} not in the node namespace: {links_with_pod:?}"
    );

    // CHECK of the whole chain, as libcni runs it.
    check_chain(
        &list,
        &cached,
        &containerd.bin_dir,
        &node,
        &sandbox_id,
        &ready.netns,
    )?;

    // One verdict for the pod's namespace, networked, our ADD confirmed: portmap and bandwidth
    // ran in it too, and are not a sandbox of their own.
    let cookie = netns_cookie(&ready.netns)?;
    let cookies = HashSet::from([cookie]);
    let views = wait_views_of(&daemon, &cookies, true, Duration::from_secs(30))?;
    let ours: Vec<&Value> = views
        .iter()
        .filter(|v| cookie_of(v) == Some(cookie))
        .collect();
    ensure!(ours.len() == 1, "views of the pod: {ours:#?}");
    assert_eq!(
        verdict_and_intent(ours[0]),
        "networked+confirmed",
        "{ours:#?}"
    );
    // Removed as the kubelet removes it: nothing of it left in the node namespace.
    containerd.cri().stop_pod(&sandbox_id)?;
    containerd.cri().remove_pod(&sandbox_id)?;
    provisioner_tests::wait_until(
        "the pod's links and rules to go",
        Duration::from_secs(20),
        || {
            let rules = iptables(&node)?;
            let links = node.links()?;
            let rules_left = rules.contains(&pod_ip) || rules.contains(&sandbox_id);
            Ok((!rules_left && links == links_before).then_some(()))
        },
    )
    .with_context(|| {
        format!(
            "rules before the pod:\n{rules_before}\nnow:\n{}\nlinks before the pod: {links_before:?}, \
             with it: {links_with_pod:?}, now: {:?}",
            iptables(&node).unwrap_or_default(),
            node.links().unwrap_or_default()
        )
    })?;
    let qdisc_devices: Vec<String> = node
        .exec("tc", &["qdisc", "show"])?
        .lines()
        .filter(|l| l.contains("tbf") || l.contains("ingress"))
        .map(str::to_owned)
        .collect();
    ensure!(
        qdisc_devices.is_empty(),
        "bandwidth qdiscs left: {qdisc_devices:?}"
    );
    containerd.shutdown()
}
