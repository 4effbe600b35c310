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
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri::{self, Pod};
use provisioner_tests::daemon_queries::{cookie_of, verdict_and_intent};
use provisioner_tests::pod_net::node_forwarding;
use provisioner_tests::podman::Podman;
use provisioner_tests::{Netns, deploy, kubelet, netns_cookie, provisioner_bin, wait_until};

/// The node's pod CIDRs, as the kubelet passes them to the runtime: dual-stack.
const POD_CIDR: &str = "10.247.0.0/24,fd00:247::/64";
const WORKLOAD_PODS: usize = 3;

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
fn image_loads_into_containerd_and_podman() -> Result<()> {
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
    podman.shutdown()
}

/// The DaemonSet's pod spec, and the two containers.
struct Manifest {
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
    Ok(Manifest {
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
        // containerd execs plugins from its own bin dir: that is the node's /opt/cni/bin.
        host_dirs.insert("/opt/cni/bin".into(), containerd.bin_dir.clone());
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
            containerd,
            volumes,
            host_dirs,
            _root: root,
        })
    }

    fn socket(&self) -> PathBuf {
        self.host_dirs["/run/provisioner"].join("provisioner.sock")
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
    let init = kubelet::container_config(&m.spec, &m.init, 0, &node.volumes)?;
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
    let daemon = kubelet::container_config(&m.spec, &m.daemon, 0, &node.volumes)?;
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
    // hostPID is for): the daemon opens another process's namespace.
    let by_pid = ProcSandbox::start()?;
    let added = node.cli(&[
        "add",
        "--container-id",
        "ds-by-pid",
        "--netns",
        &by_pid.netns().display().to_string(),
    ])?;
    ensure!(
        added.status.success(),
        "ADD into {}: {}\n{}",
        by_pid.netns().display(),
        String::from_utf8_lossy(&added.stderr),
        container_log(&daemon_log)
    );
    let mut cookies: HashSet<u64> = pods.iter().map(|p| p.cookie).collect();
    cookies.insert(netns_cookie(&by_pid.netns())?);
    wait_confirmed(&node, &cookies, &daemon_log)?;

    // A rolling update: the daemon container is stopped (its grace period) and a new one
    // started from the image; the pods keep their network and the new daemon confirms them.
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
    let daemon = kubelet::container_config(&m.spec, &m.daemon, 1, &node.volumes)?;
    daemon_id = node.containerd.cri().run_container(&ds_pod, daemon)?;
    daemon_log = pod_log(&m.daemon, 1);
    run_probes(&node, &m.daemon, &daemon_log, Duration::from_secs(30))?;
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
