//! The image `cargo xtask image` builds, loaded by real runtimes, and deploy/provisioner.yaml run
//! for real: this test plays the kubelet for the DaemonSet's pod on a private containerd over
//! CRI, with exactly the manifest's settings, then runs workload pods that get their network from
//! the daemon inside the container, then updates the daemon as a rolling update does.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri::{self, Pod};
use provisioner_tests::daemon_queries::{cookie_of, verdict_and_intent};
use provisioner_tests::docker::Docker;
use provisioner_tests::pod_net::node_forwarding;
use provisioner_tests::podman::Podman;
use provisioner_tests::prometheus::Prometheus;
use provisioner_tests::{Netns, deploy, kubelet, netns_cookie, provisioner_bin, wait_until};

/// The node's pod CIDRs, as the kubelet passes them to the runtime: dual-stack.
const POD_CIDR: &str = "10.247.0.0/24,fd00:247::/64";
const WORKLOAD_PODS: usize = 3;
/// The node's address, and the address of the namespace the cluster's Prometheus scrapes from.
const NODE_IP: &str = "10.249.1.1";
const SCRAPER_IP: &str = "10.249.1.2";

/// Host paths the test does not stand in for: where containerd pins pod namespaces, the
/// kernel's tracefs, and the sysctls of network namespaces (a file of it resolves against the
/// namespace of the thread that opens it: the daemon writes those of the node namespace and of
/// its pods, never the root namespace's).
const REAL_HOST_PATHS: &[&str] = &["/run/netns", "/sys/kernel/tracing", "/proc/sys/net"];

fn ctr_import(containerd: &Containerd, archive: &Path) -> Result<()> {
    provisioner_tests::run(
        "ctr",
        &[
            "--address",
            &containerd.socket.display().to_string(),
            "-n",
            "k8s.io",
            "images",
            "import",
            &archive.display().to_string(),
        ],
    )
    .with_context(|| format!("ctr images import {}", archive.display()))?;
    Ok(())
}

#[test]
fn image_loads_into_containerd_podman_and_docker() -> Result<()> {
    let archive = deploy::image_archive()?;
    let reference = deploy::image_reference();
    let node = Netns::new("node")?;

    let mut containerd = Containerd::start(&node, &CniSetup::default())?;
    ctr_import(&containerd, &archive)?;
    ensure!(
        containerd.cri().has_image(&reference)?,
        "CRI does not list {reference} after the import"
    );
    // The manifests' short name resolves to it, as the kubelet asks for it.
    let short = format!("provisioner:{}", env!("CARGO_PKG_VERSION"));
    ensure!(containerd.cri().has_image(&short)?, "{short} not found");
    containerd.shutdown()?;

    let conf = tempfile::tempdir()?;
    let mut podman = Podman::new(&node, conf.path())?;
    let loaded = podman.run(&["load", "--input", &archive.display().to_string()])?;
    ensure!(loaded.contains(&reference), "podman load said: {loaded}");
    let config = podman.run(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config}}",
        &reference,
    ])?;
    let config: serde_json::Value = serde_json::from_str(&config)?;
    assert_eq!(config["Entrypoint"][0], "/usr/local/bin/provisioner");
    assert_eq!(
        config["Labels"]["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        config["Labels"]["org.opencontainers.image.revision"]
            .as_str()
            .is_some_and(|r| r.len() == 40),
        "{config}"
    );
    podman.shutdown()?;

    // `docker load`, into a Docker engine of the test's own.
    let docker = Docker::start(&node)?;
    let loaded = docker.run(&["load", "--input", &archive.display().to_string()])?;
    ensure!(loaded.contains(&short), "docker load said: {loaded}");
    let config = docker.run(&["image", "inspect", "--format", "{{json .Config}}", &short])?;
    let config: serde_json::Value = serde_json::from_str(&config)?;
    assert_eq!(config["Entrypoint"][0], "/usr/local/bin/provisioner");
    assert_eq!(
        config["Labels"]["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    Ok(())
}

/// The DaemonSet's pod spec, and the two containers.
struct Manifest {
    /// The pod template's labels and annotations.
    pod_metadata: ObjectMeta,
    spec: PodSpec,
    init: Container,
    daemon: Container,
    template: String,
}

fn manifest() -> Result<Manifest> {
    let manifests = deploy::load()?;
    let ds: &DaemonSet = manifests.daemon_sets.first().context("no DaemonSet")?;
    let spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .context("no pod spec")?;
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "install")
        .cloned()
        .context("no init container install")?;
    let daemon = spec
        .containers
        .iter()
        .find(|c| c.name == "provisioner")
        .cloned()
        .context("no container provisioner")?;
    let pod_metadata = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .context("no pod template metadata")?;
    Ok(Manifest {
        pod_metadata,
        spec,
        init,
        daemon,
        template: deploy::cni_template()?,
    })
}

/// The node as the test builds it: a private containerd in a node namespace, and a dir for each
/// volume of the pod.
struct Node {
    netns: Netns,
    /// The node's address (the downward API's `status.hostIP`), on a link to `scraper`.
    ip: String,
    /// Another network namespace, linked to the node's: where the cluster's Prometheus runs.
    scraper: Netns,
    containerd: Containerd,
    volumes: BTreeMap<String, PathBuf>,
    /// Host path -> the dir standing for it.
    host_dirs: BTreeMap<String, PathBuf>,
    _root: tempfile::TempDir,
}

impl Node {
    fn new(m: &Manifest) -> Result<Self> {
        // Forwarding is left off in the node namespace: the daemon in the container, whose own
        // /proc/sys is read-only, turns it on for both families.
        let netns = Netns::new("node")?;
        let scraper = Netns::new("scraper")?;
        netns.ip(&[
            "link",
            "add",
            "tonode",
            "type",
            "veth",
            "peer",
            "name",
            "toscraper",
            "netns",
            scraper.name(),
        ])?;
        netns.ip(&["addr", "add", &format!("{NODE_IP}/30"), "dev", "tonode"])?;
        netns.ip(&["link", "set", "tonode", "up"])?;
        scraper.ip(&[
            "addr",
            "add",
            &format!("{SCRAPER_IP}/30"),
            "dev",
            "toscraper",
        ])?;
        scraper.ip(&["link", "set", "toscraper", "up"])?;
        let root = tempfile::Builder::new().prefix("dsnode").tempdir()?;
        let mut host_dirs = BTreeMap::new();
        for v in m.spec.volumes.iter().flatten() {
            if let Some(host) = &v.host_path {
                let dir = if REAL_HOST_PATHS.contains(&host.path.as_str()) {
                    PathBuf::from(&host.path)
                } else {
                    root.path().join(host.path.trim_start_matches('/'))
                };
                std::fs::create_dir_all(&dir)?;
                host_dirs.insert(host.path.clone(), dir);
            }
        }
        let stand_in = |host: &str| {
            host_dirs
                .get(host)
                .cloned()
                .with_context(|| format!("no hostPath volume {host}"))
        };
        // The plugin containerd execs finds the daemon through the socket named in the conf:
        // on this node the socket's dir is the stand-in of /run/provisioner.
        let socket_dir = stand_in("/run/provisioner")?;
        let template = m
            .template
            .replace("/run/provisioner/", &format!("{}/", socket_dir.display()));
        let containerd = Containerd::start(
            &netns,
            &CniSetup {
                conf_dir: Some(stand_in("/etc/cni/net.d")?),
                template: Some(template),
                ..CniSetup::default()
            },
        )?;
        // containerd execs plugins from its own bin dir: that is the node's /opt/cni/bin; its
        // socket's dir is the node's /run/containerd (the daemon's --cri-socket).
        host_dirs.insert("/opt/cni/bin".into(), containerd.bin_dir.clone());
        let socket_dir = containerd
            .socket
            .parent()
            .context("containerd's socket has no dir")?;
        ensure!(
            containerd.socket.file_name() == Some("containerd.sock".as_ref()),
            "containerd's socket {} is not named as on a node",
            containerd.socket.display()
        );
        host_dirs.insert("/run/containerd".into(), socket_dir.to_path_buf());
        let mut volumes = BTreeMap::new();
        for v in m.spec.volumes.iter().flatten() {
            if let Some(host) = &v.host_path {
                volumes.insert(v.name.clone(), host_dirs[&host.path].clone());
            } else if let Some(cm) = &v.config_map {
                // The kubelet writes a ConfigMap volume's keys as files.
                let dir = root.path().join("configmaps").join(&v.name);
                std::fs::create_dir_all(&dir)?;
                ensure!(
                    cm.name == "provisioner-cni-template",
                    "unexpected ConfigMap {}",
                    cm.name
                );
                std::fs::write(dir.join("cni.template"), &m.template)?;
                volumes.insert(v.name.clone(), dir);
            } else {
                bail!("volume {} is neither hostPath nor configMap", v.name);
            }
        }
        Ok(Self {
            netns,
            ip: NODE_IP.to_owned(),
            scraper,
            containerd,
            volumes,
            host_dirs,
            _root: root,
        })
    }

    fn socket(&self) -> PathBuf {
        self.host_dirs["/run/provisioner"].join("provisioner.sock")
    }

    /// Container `c` of the DaemonSet's pod, as the kubelet of this node configures it.
    fn container(&self, m: &Manifest, c: &Container, attempt: u32) -> Result<cri::ContainerConfig> {
        kubelet::container_config(
            &m.spec,
            c,
            attempt,
            &kubelet::NodeInfo {
                host_ip: &self.ip,
                volumes: &self.volumes,
            },
        )
    }

    /// `provisioner <args> --socket <the daemon's socket on the host>`.
    fn cli(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(provisioner_bin())
            .args(args)
            .arg("--socket")
            .arg(self.socket())
            .env_remove("CNI_COMMAND")
            .output()
            .with_context(|| format!("run provisioner {args:?}"))
    }

    /// `provisioner <args> --json`, asked of the daemon in the container.
    fn ask(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut with_json = args.to_vec();
        with_json.push("--json");
        let out = self.cli(&with_json)?;
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "provisioner {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

/// The address and path of one of the daemon's httpGet probes.
fn probe_target(c: &Container, which: &str) -> Result<(String, String, Duration)> {
    let p = match which {
        "startup" => c.startup_probe.as_ref(),
        "liveness" => c.liveness_probe.as_ref(),
        _ => c.readiness_probe.as_ref(),
    }
    .with_context(|| format!("no {which} probe"))?;
    let get = p.http_get.as_ref().context("not an httpGet probe")?;
    let port = match &get.port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
            bail!("named port {s}")
        }
    };
    let budget = u64::try_from(p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3))?;
    Ok((
        format!("{}:{port}", get.host.as_deref().unwrap_or("127.0.0.1")),
        get.path.clone().unwrap_or_else(|| "/".into()),
        Duration::from_secs(budget),
    ))
}

/// Runs the probes as the kubelet does after a start: the startup probe until it passes (within
/// its budget), then liveness once, then readiness until it passes within `ready_limit`.
fn run_probes(node: &Node, c: &Container, log: &Path, ready_limit: Duration) -> Result<()> {
    let (addr, path, budget) = probe_target(c, "startup")?;
    wait_until("the startup probe", budget, || {
        Ok((deploy::probe_status(&node.netns, &addr, &path)? == Some(200)).then_some(()))
    })
    .with_context(|| container_log(log))?;
    let (addr, path, _) = probe_target(c, "liveness")?;
    ensure!(
        deploy::probe_status(&node.netns, &addr, &path)? == Some(200),
        "liveness probe failed: {}",
        container_log(log)
    );
    let (addr, path, _) = probe_target(c, "readiness")?;
    wait_until("the readiness probe", ready_limit, || {
        Ok((deploy::probe_status(&node.netns, &addr, &path)? == Some(200)).then_some(()))
    })
    .with_context(|| container_log(log))
}

fn container_log(path: &Path) -> String {
    match cri::log_lines(path) {
        Ok(lines) => format!("container log {}:\n{}", path.display(), lines.join("\n")),
        Err(e) => format!("{e:#}"),
    }
}

/// Waits until every pod namespace in `cookies` is `networked+confirmed` in the daemon's view.
fn wait_confirmed(node: &Node, cookies: &HashSet<u64>, log: &Path) -> Result<()> {
    let mut seen = BTreeMap::new();
    let mut unavailable = String::new();
    let judged = || -> Result<Option<()>> {
        let answer = node.ask(&["sandboxes"])?;
        if let Some(reason) = answer["tracing_unavailable"].as_str() {
            // "starting" while the programs load; any other reason stays until the bound.
            reason.clone_into(&mut unavailable);
            return Ok(None);
        }
        unavailable.clear();
        seen = answer["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((cookie_of(v)?, verdict_and_intent(v))))
            .filter(|(c, _)| cookies.contains(c))
            .collect::<BTreeMap<_, _>>();
        let all = seen.len() == cookies.len() && seen.values().all(|s| s == "networked+confirmed");
        Ok(all.then_some(()))
    };
    wait_until(
        "the pods networked + confirmed",
        Duration::from_secs(60),
        judged,
    )
    .with_context(|| {
        format!(
            "views of the pods: {seen:?}; kernel watch unavailable: {unavailable:?}\n{}",
            container_log(log)
        )
    })
}

/// A process alone in a new network namespace (`unshare -n sleep`), killed by pid on drop.
struct ProcSandbox {
    child: std::process::Child,
}

impl ProcSandbox {
    fn start() -> Result<Self> {
        let child = Command::new(testkit::tools::UNSHARE.require()?)
            .args(["--net", "sleep", "300"])
            .spawn()
            .context("spawn unshare --net sleep")?;
        let sandbox = Self { child };
        let ours = std::fs::read_link("/proc/self/ns/net")?;
        wait_until(
            "unshare to enter its namespace",
            Duration::from_secs(5),
            || {
                let theirs = std::fs::read_link(sandbox.netns()).ok();
                Ok(theirs.filter(|t| *t != ours).map(|_| ()))
            },
        )?;
        Ok(sandbox)
    }

    fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.child.id()))
    }
}

impl Drop for ProcSandbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `c` with `capability` added, as docs/kubernetes.md says to add one.
fn with_capability(c: &Container, capability: &str) -> Result<Container> {
    let mut c = c.clone();
    c.security_context
        .as_mut()
        .and_then(|sc| sc.capabilities.as_mut())
        .context("the daemon has no capabilities to add to")?
        .add
        .get_or_insert_with(Vec::new)
        .push(capability.to_owned());
    Ok(c)
}

/// A label name as Prometheus' Kubernetes discovery writes one (`prometheus.io/port` ->
/// `__meta_kubernetes_pod_annotation_prometheus_io_port`).
fn sd_label(kind: &str, key: &str) -> String {
    let key: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("__meta_kubernetes_pod_{kind}_{key}")
}

/// The cluster's Prometheus, in another network namespace, scrapes the daemon with the job of
/// deploy/monitoring/scrape-config.yaml, fed what Kubernetes' pod discovery says of the
/// DaemonSet's pod on this node: the pod's address (the node's: hostNetwork) with its declared
/// `metrics` port, its labels and annotations. It reads `provisioner_build_info`.
fn scrape_from_the_cluster(node: &Node, m: &Manifest) -> Result<()> {
    let meta = &m.pod_metadata;
    let port = m
        .daemon
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .context("the daemon declares no port named metrics")?
        .container_port;
    let mut labels = serde_json::Map::new();
    for (kind, pairs) in [("annotation", &meta.annotations), ("label", &meta.labels)] {
        for (key, value) in pairs.iter().flatten() {
            labels.insert(sd_label(kind, key), value.clone().into());
        }
    }
    labels.insert(
        "__meta_kubernetes_pod_container_port_name".into(),
        "metrics".into(),
    );
    labels.insert("__meta_kubernetes_pod_node_name".into(), "node1".into());
    labels.insert("__meta_kubernetes_namespace".into(), "kube-system".into());
    let pods = tempfile::tempdir()?;
    let pods_file = pods.path().join("pods.json");
    let target = format!("{}:{port}", node.ip);
    std::fs::write(
        &pods_file,
        serde_json::to_vec(&serde_json::json!([{"targets": [target], "labels": labels}]))?,
    )?;
    let example: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(deploy::scrape_config_path())?)?;
    let mut job = example["scrape_configs"][0].clone();
    let job_map = job
        .as_mapping_mut()
        .context("scrape-config.yaml: no scrape job")?;
    ensure!(
        job_map.remove("kubernetes_sd_configs").is_some(),
        "scrape-config.yaml: the job does not discover pods"
    );
    job_map.insert(
        "file_sd_configs".into(),
        serde_norway::from_str(&format!("[{{files: ['{}']}}]", pods_file.display()))?,
    );
    // The example's interval (30 s) would leave the first scrape anywhere in its first 30 s.
    job_map.insert("scrape_interval".into(), "2s".into());
    job_map.insert("scrape_timeout".into(), "2s".into());
    let job_name = job["job_name"].as_str().unwrap_or_default().to_owned();
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [job],
    });
    let prometheus = Prometheus::start(&node.scraper, &serde_json::to_string(&config)?)?;
    let info = wait_until(
        "Prometheus to scrape provisioner_build_info",
        Duration::from_secs(30),
        || {
            let found = prometheus.query("provisioner_build_info")?;
            Ok(found.into_iter().next())
        },
    )
    .with_context(|| {
        format!(
            "targets: {:?}\n{}",
            prometheus.api("/api/v1/targets"),
            prometheus.log()
        )
    })?;
    assert_eq!(info["metric"]["instance"], target.as_str(), "{info}");
    assert_eq!(info["metric"]["job"], job_name.as_str(), "{info}");
    assert_eq!(info["metric"]["node"], "node1", "{info}");
    assert_eq!(
        info["metric"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{info}"
    );
    let targets = prometheus.api("/api/v1/targets")?;
    let scraped: Vec<&str> = targets["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["scrapeUrl"].as_str())
        .collect();
    assert_eq!(
        scraped,
        [format!("http://{target}/metrics").as_str()],
        "{targets}"
    );
    Ok(())
}

struct Workload {
    pod: Pod,
    /// Its IPv4 and IPv6 address.
    ips: [String; 2],
    cookie: u64,
}

impl Workload {
    fn ping_from(&self, node: &Netns) -> Result<()> {
        for ip in &self.ips {
            node.ping(ip)
                .with_context(|| format!("pod {} at {ip}", self.pod.id))?;
        }
        Ok(())
    }
}

#[test]
fn daemonset_runs_under_containerd_with_its_capabilities() -> Result<()> {
    let archive = deploy::image_archive()?;
    let m = manifest()?;
    let mut node = Node::new(&m)?;
    ctr_import(&node.containerd, &archive)?;
    let log_dir = node.containerd.log_dir.clone();
    let sandbox = kubelet::sandbox_config("provisioner-node1", "kube-system", &m.spec, &log_dir);
    let ds_pod = node
        .containerd
        .cri()
        .run_pod(&sandbox)
        .map_err(|s| anyhow::anyhow!("RunPodSandbox of the DaemonSet's pod: {s}"))?;
    let pod_log = |c: &Container, attempt: u32| {
        PathBuf::from(&sandbox.log_directory).join(format!("{}_{attempt}.log", c.name))
    };

    // The init container runs to completion before the daemon starts.
    let init = node.container(&m, &m.init, 0)?;
    let init_id = node.containerd.cri().run_container(&ds_pod, init)?;
    let code = node
        .containerd
        .cri()
        .wait_container_exit(&init_id, Duration::from_secs(60))?;
    let init_log = pod_log(&m.init, 0);
    ensure!(
        code == 0,
        "install exited {code}: {}",
        container_log(&init_log)
    );
    let said = cri::log_lines(&init_log)?;
    let plugin = node.host_dirs["/opt/cni/bin"].join("provisioner");
    assert!(
        said.iter().any(|l| [
            "installed plugin /host/opt/cni/bin/provisioner",
            "replaced plugin /host/opt/cni/bin/provisioner"
        ]
        .contains(&l.as_str())),
        "{said:?}"
    );
    let installed = std::fs::read(&plugin)?;
    assert!(
        !plugin.symlink_metadata()?.file_type().is_symlink()
            && !testkit::oci::has_interpreter(&installed),
        "{} is not the image's static binary",
        plugin.display()
    );
    assert_eq!(
        std::fs::read_to_string(node.host_dirs["/etc/provisioner"].join("cni.template"))?,
        m.template
    );

    // The daemon: alive and not ready (no pod CIDR yet), then ready once the kubelet passes the
    // node's pod CIDR and containerd renders the template.
    let daemon = node.container(&m, &m.daemon, 0)?;
    let mut daemon_id = node.containerd.cri().run_container(&ds_pod, daemon)?;
    let mut daemon_log = pod_log(&m.daemon, 0);
    let (ready_addr, ready_path, _) = probe_target(&m.daemon, "readiness")?;
    let (live_addr, live_path, live_budget) = probe_target(&m.daemon, "startup")?;
    wait_until("the daemon to serve its probes", live_budget, || {
        Ok(deploy::probe_status(&node.netns, &live_addr, &live_path)?.map(|_| ()))
    })
    .with_context(|| container_log(&daemon_log))?;
    assert_eq!(
        deploy::probe_status(&node.netns, &ready_addr, &ready_path)?,
        Some(503),
        "ready without a network: {}",
        container_log(&daemon_log)
    );
    node.containerd.cri().update_pod_cidr(POD_CIDR)?;
    run_probes(&node, &m.daemon, &daemon_log, Duration::from_secs(30))?;
    node.containerd
        .cri()
        .wait_network_ready(true, Duration::from_secs(30))?;
    scrape_from_the_cluster(&node, &m).with_context(|| container_log(&daemon_log))?;

    // Workload pods get their network from the daemon in the container.
    let mut pods = Vec::new();
    for i in 0..WORKLOAD_PODS {
        let ready = node
            .containerd
            .run_ready_pod(&format!("web-{i}"))
            .with_context(|| container_log(&daemon_log))?;
        let [v4, v6] = ready.ips.as_slice() else {
            bail!("a dual-stack pod with addresses {:?}", ready.ips);
        };
        ensure!(
            v4.starts_with("10.247.0.") && v6.starts_with("fd00:247::"),
            "pod addresses {v4}, {v6} outside {POD_CIDR}"
        );
        let pod = Workload {
            cookie: netns_cookie(&ready.netns)?,
            ips: [v4.clone(), v6.clone()],
            pod: ready.pod,
        };
        pod.ping_from(&node.netns)?;
        pods.push(pod);
    }
    let forwarding = node_forwarding(&node.netns)?;
    ensure!(
        forwarding.iter().all(|f| f.ends_with("=1")),
        "the daemon did not turn forwarding on in the node namespace: {forwarding:?}"
    );
    // A sandbox named by a process's namespace, as CNI_NETNS=/proc/<pid>/ns/net names one (what
    // hostPID is for): opening another process's namespace needs SYS_PTRACE, which the manifest
    // leaves out (containerd pins its sandboxes' namespaces): refused, before anything is
    // allocated.
    let by_pid = ProcSandbox::start()?;
    let add_by_pid = |node: &Node| {
        node.cli(&[
            "add",
            "--container-id",
            "ds-by-pid",
            "--netns",
            &by_pid.netns().display().to_string(),
        ])
    };
    let refused = add_by_pid(&node)?;
    let said = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success() && said.contains("SYS_PTRACE"),
        "ADD into {} without SYS_PTRACE: {said}",
        by_pid.netns().display()
    );
    let mut cookies: HashSet<u64> = pods.iter().map(|p| p.cookie).collect();
    wait_confirmed(&node, &cookies, &daemon_log)?;

    // A rolling update: the daemon container is stopped (its grace period) and a new one
    // started from the image, with SYS_PTRACE added as docs/kubernetes.md says for a runtime
    // that names /proc/<pid>/ns/net; the pods keep their network and the new daemon confirms
    // them, and serves the ADD it refused.
    let grace = Duration::from_secs(u64::try_from(
        m.spec.termination_grace_period_seconds.unwrap_or(30),
    )?);
    node.containerd.cri().stop_container(&daemon_id, grace)?;
    let code = node
        .containerd
        .cri()
        .wait_container_exit(&daemon_id, Duration::from_secs(5))?;
    ensure!(
        code == 0,
        "the daemon exited {code} on SIGTERM: {}",
        container_log(&daemon_log)
    );
    node.containerd.cri().remove_container(&daemon_id)?;
    for p in &pods {
        p.ping_from(&node.netns)
            .context("a pod lost its network with the daemon down")?;
    }
    let with_ptrace = with_capability(&m.daemon, "SYS_PTRACE")?;
    let daemon = node.container(&m, &with_ptrace, 1)?;
    daemon_id = node.containerd.cri().run_container(&ds_pod, daemon)?;
    daemon_log = pod_log(&m.daemon, 1);
    run_probes(&node, &m.daemon, &daemon_log, Duration::from_secs(30))?;
    let added = add_by_pid(&node)?;
    ensure!(
        added.status.success(),
        "ADD into {} with SYS_PTRACE: {}\n{}",
        by_pid.netns().display(),
        String::from_utf8_lossy(&added.stderr),
        container_log(&daemon_log)
    );
    cookies.insert(netns_cookie(&by_pid.netns())?);
    wait_confirmed(&node, &cookies, &daemon_log)?;
    for p in &pods {
        p.ping_from(&node.netns)?;
    }
    let status = node.ask(&["status"])?;
    ensure!(status["ready"] == true, "after the update: {status}");

    let deleted = node.cli(&["del", "--container-id", "ds-by-pid"])?;
    ensure!(
        deleted.status.success(),
        "DEL ds-by-pid: {}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    drop(by_pid);
    // Tear down as a node drain does: workload pods first (their DEL goes to the daemon), then
    // the daemon's pod.
    for p in &pods {
        node.containerd.cri().stop_pod(&p.pod.id)?;
        node.containerd.cri().remove_pod(&p.pod.id)?;
    }
    let left = node.ask(&["list"])?;
    ensure!(
        left.as_array().is_some_and(Vec::is_empty),
        "allocations left after the pods' removal: {left}"
    );
    ensure!(node.containerd.cri().container_running(&daemon_id)?);
    node.containerd.cri().stop_container(&daemon_id, grace)?;
    node.containerd.shutdown()
}
