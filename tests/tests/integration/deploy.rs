//! `deploy/`: the manifests are valid Kubernetes objects with least privilege, what they run is
//! accepted by the binary, and the install step and the probes do what the node relies on.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use provisioner_tests::daemon_harness::conflist;
use provisioner_tests::{Netns, deploy, kubelet, provisioner_bin};

/// Where the image holds the binary (the init step copies it from there).
const IMAGE_BINARY: &str = "/usr/local/bin/provisioner";

fn daemon_set() -> Result<DaemonSet> {
    let manifests = deploy::load()?;
    assert_eq!(manifests.daemon_sets.len(), 1, "{manifests:?}");
    assert_eq!(manifests.config_maps.len(), 1, "{manifests:?}");
    manifests
        .daemon_sets
        .into_iter()
        .next()
        .context("no DaemonSet")
}

fn pod_spec(ds: &DaemonSet) -> Result<&PodSpec> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .context("DaemonSet without a pod spec")
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> Result<&'a Container> {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .with_context(|| format!("no container {name}"))
}

/// Host path of each volume, by volume name.
fn host_paths(spec: &PodSpec) -> BTreeMap<String, String> {
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v.name.clone(), v.host_path.as_ref()?.path.clone())))
        .collect()
}

/// Host path mounted at each mount path of `c`.
fn mounts(spec: &PodSpec, c: &Container) -> BTreeMap<String, String> {
    let hosts = host_paths(spec);
    c.volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| Some((m.mount_path.clone(), hosts.get(&m.name)?.clone())))
        .collect()
}

/// The argv a container (or probe) runs.
fn argv(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}

/// Parses `argv` (which must run the provisioner binary) with the binary's own command line
/// definition: `--help` after the arguments makes clap check every flag and value before it
/// prints help, without running the command.
fn assert_accepted(argv: &[String]) -> Result<()> {
    let (program, args) = argv.split_first().context("empty command")?;
    assert_eq!(program, IMAGE_BINARY, "{argv:?}");
    assert!(
        args.iter().all(|a| !a.contains("$(")),
        "variable references are not checked here: {argv:?}"
    );
    let out = Command::new(provisioner_bin())
        .args(args)
        .arg("--help")
        .env_remove("CNI_COMMAND")
        .output()?;
    if !out.status.success() {
        bail!(
            "the binary rejects {argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The longest the daemon drains on SIGTERM (operations in flight: daemon/server/mod.rs).
const DRAIN_LIMIT_SECONDS: i64 = 60;

#[test]
fn manifests_parse_as_typed_kubernetes_objects() -> Result<()> {
    let ds = daemon_set()?;
    let spec = pod_spec(&ds)?;
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.host_pid, Some(true));
    assert!(
        spec.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "must run on NotReady and tainted nodes: {:?}",
        spec.tolerations
    );
    assert_eq!(
        spec.node_selector
            .as_ref()
            .and_then(|s| s.get("kubernetes.io/os"))
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(spec.automount_service_account_token, Some(false));
    let grace = spec
        .termination_grace_period_seconds
        .context("no terminationGracePeriodSeconds")?;
    assert!(
        grace > DRAIN_LIMIT_SECONDS,
        "grace period {grace} s is not above the drain's {DRAIN_LIMIT_SECONDS} s"
    );
    let daemon = container(spec, "provisioner")?;
    let m = mounts(spec, daemon);
    let expected = [
        ("/etc/cni/net.d", "/etc/cni/net.d"),
        ("/run/provisioner", "/run/provisioner"),
        ("/var/lib/provisioner", "/var/lib/provisioner"),
        ("/run/netns", "/run/netns"),
        ("/sys/kernel/tracing", "/sys/kernel/tracing"),
        ("/host/proc/sys/net", "/proc/sys/net"),
        ("/run/containerd", "/run/containerd"),
    ];
    for (path, host) in expected {
        assert_eq!(m.get(path).map(String::as_str), Some(host), "{path}: {m:?}");
    }
    assert_eq!(m.len(), expected.len(), "a mount nothing uses: {m:?}");
    // The container's own /proc/sys is read-only: the daemon sets its sysctls through the
    // host's /proc/sys/net, mounted writable where --proc-sys points.
    let proc_sys = argv(daemon)
        .iter()
        .find_map(|a| a.strip_prefix("--proc-sys=").map(str::to_owned))
        .context("the daemon has no --proc-sys")?;
    let sysctl_mount = daemon
        .volume_mounts
        .iter()
        .flatten()
        .find(|v| v.mount_path == format!("{proc_sys}/net"))
        .with_context(|| format!("nothing mounted at {proc_sys}/net"))?;
    assert_ne!(sysctl_mount.read_only, Some(true), "{proc_sys}/net");
    // Namespace pins created after the pod started must reach it.
    let netns_mount = daemon
        .volume_mounts
        .iter()
        .flatten()
        .find(|v| v.mount_path == "/run/netns")
        .context("no /run/netns mount")?;
    assert_eq!(
        netns_mount.mount_propagation.as_deref(),
        Some("HostToContainer")
    );
    Ok(())
}

/// No container is privileged: each drops every capability, adds only what it needs, and has
/// a read-only root filesystem.
#[test]
fn containers_run_with_least_privilege() -> Result<()> {
    let ds = daemon_set()?;
    let spec = pod_spec(&ds)?;
    let expected_adds: [(&str, &[&str]); 2] = [
        ("install", &[]),
        ("provisioner", &["NET_ADMIN", "SYS_ADMIN"]),
    ];
    for (name, adds) in expected_adds {
        let c = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .with_context(|| format!("no container {name}"))?;
        let sc = c
            .security_context
            .as_ref()
            .with_context(|| format!("{name}: no securityContext"))?;
        assert_ne!(sc.privileged, Some(true), "{name} is privileged");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
        let caps = sc.capabilities.as_ref().context("no capabilities")?;
        assert_eq!(
            caps.drop.as_deref(),
            Some(&["ALL".to_owned()][..]),
            "{name}"
        );
        let added: Vec<&str> = caps.add.iter().flatten().map(String::as_str).collect();
        assert_eq!(added, adds, "{name}");
    }
    let seccomp = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref())
        .context("the pod sets no seccompProfile")?;
    assert_eq!(seccomp.type_, "RuntimeDefault");
    Ok(())
}

/// The values of `--flag=VALUE` in `argv`.
fn flag_values<'a>(argv: &'a [String], flag: &str) -> Vec<&'a str> {
    argv.iter()
        .filter_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
        .collect()
}

/// The daemon serves /metrics on the node's address, from the downward API, at the port and
/// path its annotations, its declared port, the PodMonitor and the example scrape job name;
/// the CRI socket it asks is pinned (and mounted), not taken from a process on the node.
#[test]
fn the_cluster_can_scrape_what_the_manifests_say() -> Result<()> {
    let ds = daemon_set()?;
    let spec = pod_spec(&ds)?;
    let daemon = container(spec, "provisioner")?;
    let run = argv(daemon);
    let template = &ds.spec.as_ref().context("no spec")?.template;
    let meta = template.metadata.as_ref().context("no pod metadata")?;
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
            .with_context(|| format!("no annotation {key}"))
    };
    assert_eq!(annotation("prometheus.io/scrape")?, "true");
    let port: u16 = annotation("prometheus.io/port")?.parse()?;
    let path = annotation("prometheus.io/path")?;
    assert_eq!(path, "/metrics");
    let declared = daemon
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .context("no container port named metrics")?;
    assert_eq!(declared.container_port, i32::from(port));

    // `--metrics-addr=$(NODE_IP)`, NODE_IP being the node's address: the downward API's
    // status.hostIP; the binary's default port is the annotated one.
    let node_ip = daemon
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_IP")
        .context("no env NODE_IP")?;
    let field = node_ip
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .context("NODE_IP is not from the downward API")?;
    assert_eq!(field.field_path, "status.hostIP");
    let addrs = flag_values(&run, "--metrics-addr");
    assert!(addrs.contains(&"$(NODE_IP)"), "{addrs:?}");
    assert!(
        addrs.contains(&format!("127.0.0.1:{port}").as_str()),
        "{addrs:?}"
    );
    let alone =
        provisioner::metrics::http::parse_addr("10.0.0.5").map_err(|e| anyhow::anyhow!(e))?;
    assert_eq!(alone.port(), port);

    let sockets = flag_values(&run, "--cri-socket");
    assert_eq!(sockets, ["/run/containerd/containerd.sock"]);
    assert!(
        mounts(spec, daemon).contains_key("/run/containerd"),
        "the pinned CRI socket's dir is not mounted"
    );

    let monitor: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(deploy::pod_monitor_path())?)?;
    assert_eq!(monitor["kind"], "PodMonitor");
    let namespace = ds.metadata.namespace.as_deref().context("no namespace")?;
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"][0],
        namespace
    );
    let pod_labels = meta.labels.clone().unwrap_or_default();
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .context("PodMonitor without matchLabels")?;
    for (key, value) in selector {
        let (Some(key), Some(value)) = (key.as_str(), value.as_str()) else {
            bail!("PodMonitor matchLabels: {key:?}: {value:?}");
        };
        assert_eq!(
            pod_labels.get(key).map(String::as_str),
            Some(value),
            "{key}"
        );
    }
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["path"], path.as_str());
    let job = endpoint["relabelings"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|r| r["targetLabel"] == "job")
        .and_then(|r| r["replacement"].as_str())
        .context("the PodMonitor sets no job")?;
    let example: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(deploy::scrape_config_path())?)?;
    assert_eq!(example["scrape_configs"][0]["job_name"], job);
    Ok(())
}

#[test]
fn commands_the_manifests_run_are_accepted_by_the_binary() -> Result<()> {
    let ds = daemon_set()?;
    let spec = pod_spec(&ds)?;
    let daemon = container(spec, "provisioner")?;
    let run = argv(daemon);
    assert_eq!(run.get(1).map(String::as_str), Some("daemon"), "{run:?}");
    // As the kubelet expands them, on a node of either family.
    for node_ip in ["10.0.0.5", "fd00::5"] {
        let env = [provisioner_tests::cri::KeyValue {
            key: "NODE_IP".to_owned(),
            value: node_ip.to_owned(),
        }];
        let expanded: Vec<String> = run.iter().map(|a| kubelet::expand(a, &env)).collect();
        assert_accepted(&expanded)?;
    }
    let install = argv(init_container(spec)?);
    assert_eq!(
        install.get(1).map(String::as_str),
        Some("install"),
        "{install:?}"
    );
    assert_accepted(&install)
}

fn init_container(spec: &PodSpec) -> Result<&Container> {
    spec.init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "install")
        .context("no init container `install`")
}

/// The daemon's loopback `--metrics-addr`, where the kubelet probes it.
fn loopback_metrics_addr(daemon: &Container) -> Result<String> {
    let run = argv(daemon);
    flag_values(&run, "--metrics-addr")
        .into_iter()
        .find(|a| a.starts_with("127.0.0.1:"))
        .map(str::to_owned)
        .context("the daemon has no loopback --metrics-addr")
}

/// The httpGet action of a probe, checked to target the daemon's metrics listener the way a
/// host-network pod must: on 127.0.0.1, at the port of its loopback `--metrics-addr`.
fn http_probe<'a>(daemon: &Container, probe: Option<&'a Probe>, what: &str) -> Result<&'a str> {
    let get: &HTTPGetAction = probe
        .and_then(|p| p.http_get.as_ref())
        .with_context(|| format!("no httpGet {what} probe"))?;
    let listen = loopback_metrics_addr(daemon)?;
    let port = match &get.port {
        IntOrString::Int(port) => *port,
        IntOrString::String(name) => bail!("{what} probe: named port {name}"),
    };
    assert_eq!(
        format!("{}:{port}", get.host.as_deref().unwrap_or("")),
        listen,
        "{what} probe"
    );
    get.path.as_deref().context("probe without a path")
}

/// The probes against a real daemon run with the manifest's metrics address in a node
/// namespace: startup and liveness pass while the daemon has no network (not ready is a normal
/// state), readiness fails until the network is loaded, then passes.
#[test]
fn probes_follow_daemon_liveness_and_readiness() -> Result<()> {
    let ds = daemon_set()?;
    let spec = pod_spec(&ds)?;
    let c = container(spec, "provisioner")?;
    let startup = http_probe(c, c.startup_probe.as_ref(), "startup")?;
    let liveness = http_probe(c, c.liveness_probe.as_ref(), "liveness")?;
    let readiness = http_probe(c, c.readiness_probe.as_ref(), "readiness")?;
    let addr = loopback_metrics_addr(c)?;
    let metrics_arg = format!("--metrics-addr={addr}");

    let node = Netns::new("node")?;
    let dir = tempfile::tempdir()?;
    // In the node namespace, as on a node: the manifest's 127.0.0.1 is the node's loopback.
    let daemon =
        testkit::daemon::Daemon::spawn(&provisioner_bin(), &node, dir.path(), &[&metrics_arg])?;
    daemon.wait_listening(Duration::from_secs(10))?;
    let mut startup_code = None;
    provisioner_tests::wait_until(
        "the startup probe to answer",
        Duration::from_secs(10),
        || {
            startup_code = deploy::probe_status(&node, &addr, startup)?;
            Ok(startup_code.map(|_| ()))
        },
    )?;
    assert_eq!(startup_code, Some(200), "startup probe");
    assert_eq!(
        deploy::probe_status(&node, &addr, liveness)?,
        Some(200),
        "liveness"
    );
    assert_eq!(
        deploy::probe_status(&node, &addr, readiness)?,
        Some(503),
        "readiness with no network"
    );
    let network = conflist("deploynet", "1.0.0", &daemon.socket, "10.248.0.0/24", None);
    std::fs::write(
        daemon.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&network)?,
    )?;
    daemon.wait_ready(Duration::from_secs(10))?;
    assert_eq!(
        deploy::probe_status(&node, &addr, readiness)?,
        Some(200),
        "ready"
    );
    assert_eq!(
        deploy::probe_status(&node, &addr, liveness)?,
        Some(200),
        "liveness"
    );
    Ok(())
}

/// The init container's command, with its mounts mapped under a temp dir.
struct InitRun {
    root: tempfile::TempDir,
    argv: Vec<String>,
    /// Inside path of each mount -> the temp dir standing for it.
    mapped: BTreeMap<String, PathBuf>,
    /// Host path of each hostPath volume the init container mounts -> its temp dir.
    hosts: BTreeMap<String, PathBuf>,
    template: String,
}

impl InitRun {
    fn new() -> Result<Self> {
        let ds = daemon_set()?;
        let spec = pod_spec(&ds)?;
        let init = init_container(spec)?;
        let root = tempfile::tempdir()?;
        let volume_hosts = host_paths(spec);
        let mut mapped = BTreeMap::new();
        let mut hosts = BTreeMap::new();
        for mount in init.volume_mounts.iter().flatten() {
            let inside = root.path().join(mount.mount_path.trim_start_matches('/'));
            std::fs::create_dir_all(&inside)?;
            if let Some(host) = volume_hosts.get(&mount.name) {
                hosts.insert(host.clone(), inside.clone());
            }
            mapped.insert(mount.mount_path.clone(), inside);
        }
        let template = deploy::cni_template()?;
        let config_dir = init
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "cni-template")
            .map(|m| mapped[&m.mount_path].clone())
            .context("the ConfigMap is not mounted in the init container")?;
        std::fs::write(config_dir.join("cni.template"), &template)?;
        Ok(Self {
            root,
            argv: argv(init),
            mapped,
            hosts,
            template,
        })
    }

    /// Runs the init command (this build's binary), its paths mapped, plus `extra` arguments.
    fn run(&self, extra: &[&str]) -> Result<Output> {
        self.run_verb("install", extra)
    }

    /// Runs the init command with `verb` in place of its `install`.
    fn run_verb(&self, verb: &str, extra: &[&str]) -> Result<Output> {
        let [program, install, args @ ..] = self.argv.as_slice() else {
            bail!("not `provisioner install ARGS`: {:?}", self.argv);
        };
        assert_eq!(
            (program.as_str(), install.as_str()),
            (IMAGE_BINARY, "install")
        );
        let args = args.iter().map(|a| {
            self.mapped
                .iter()
                .find(|(inside, _)| a.contains(inside.as_str()))
                .map_or_else(
                    || a.clone(),
                    |(inside, temp)| a.replace(inside.as_str(), &temp.display().to_string()),
                )
        });
        Ok(Command::new(provisioner_bin())
            .arg(verb)
            .args(args)
            .args(extra)
            .env_remove("CNI_COMMAND")
            .output()?)
    }

    fn run_ok(&self, extra: &[&str]) -> Result<String> {
        let out = self.run(extra)?;
        ensure!(
            out.status.success(),
            "{:?} {extra:?} failed: {}",
            self.argv,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Where a host path the init container writes to stands in this run.
    fn host(&self, host: &str) -> Result<&Path> {
        self.hosts
            .get(host)
            .map(PathBuf::as_path)
            .with_context(|| format!("{host} is not mounted in the init container"))
    }

    fn plugin(&self) -> Result<PathBuf> {
        Ok(self.host("/opt/cni/bin")?.join("provisioner"))
    }

    fn template_dest(&self) -> Result<PathBuf> {
        Ok(self.host("/etc/provisioner")?.join("cni.template"))
    }
}

/// The init container's command installs the plugin (this build's binary) and the ConfigMap's
/// template where the node expects them; run again, it changes nothing and says so.
#[test]
fn install_step_installs_plugin_and_template_idempotently() -> Result<()> {
    let init = InitRun::new()?;
    let first = init.run_ok(&[])?;
    let plugin = init.plugin()?;
    let template = init.template_dest()?;
    assert_eq!(
        first,
        format!(
            "installed plugin {}\ninstalled template {}\n",
            plugin.display(),
            template.display()
        )
    );
    assert_eq!(std::fs::read(&plugin)?, std::fs::read(provisioner_bin())?);
    assert_eq!(
        std::fs::metadata(&plugin)?.permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(std::fs::read_to_string(&template)?, init.template);
    let installed_at = std::fs::metadata(&plugin)?.modified()?;

    let second = init.run_ok(&[])?;
    assert_eq!(
        second,
        format!(
            "unchanged plugin {}\nunchanged template {}\n",
            plugin.display(),
            template.display()
        )
    );
    assert_eq!(std::fs::metadata(&plugin)?.modified()?, installed_at);
    assert_eq!(std::fs::read(&plugin)?, std::fs::read(provisioner_bin())?);

    // The installed file is a working CNI plugin.
    let version = Command::new(&plugin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::null())
        .output()?;
    let answer: serde_json::Value = serde_json::from_slice(&version.stdout)?;
    assert!(answer["supportedVersions"].is_array(), "{answer}");
    assert_no_leftovers(init.root.path())
}

/// A binary in the way that is not provisioner's is refused and left as it was; `--force`
/// replaces it. `uninstall` removes what is ours, and refuses a foreign plugin.
#[test]
fn install_refuses_a_foreign_plugin_and_uninstall_removes_its_own() -> Result<()> {
    let init = InitRun::new()?;
    let plugin = init.plugin()?;
    std::fs::copy("/bin/true", &plugin)?;
    let foreign = std::fs::read(&plugin)?;
    let refused = init.run(&[])?;
    assert!(
        !refused.status.success(),
        "a foreign plugin was overwritten"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&plugin.display().to_string()) && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&plugin)?, foreign);

    let refused = init.run_verb("uninstall", &[])?;
    assert!(!refused.status.success(), "a foreign plugin was removed");
    assert_eq!(std::fs::read(&plugin)?, foreign);

    let forced = init.run_ok(&["--force"])?;
    assert!(
        forced.starts_with(&format!("replaced plugin {}\n", plugin.display())),
        "{forced}"
    );
    assert_eq!(std::fs::read(&plugin)?, std::fs::read(provisioner_bin())?);

    let removed = init.run_verb("uninstall", &[])?;
    ensure!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert_eq!(
        String::from_utf8(removed.stdout)?,
        format!(
            "removed plugin {}\nremoved template {}\n",
            plugin.display(),
            init.template_dest()?.display()
        )
    );
    assert!(!plugin.exists());
    assert!(!init.template_dest()?.exists());
    assert_no_leftovers(init.root.path())
}

/// Nothing half-copied is left next to what was installed.
fn assert_no_leftovers(root: &Path) -> Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            assert!(!name.ends_with(".tmp"), "leftover {}", path.display());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    Ok(())
}

/// deploy/provisioner.service.
fn systemd_unit() -> Result<String> {
    let path = deploy::manifest_path().with_file_name("provisioner.service");
    std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
}

/// The values of `key=` lines of a unit file, in order.
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

/// `systemd-analyze verify` accepts the unit (its ExecStart pointed at this build's binary, as
/// verify checks that it exists), without a warning about it. Without `systemd-analyze` the
/// test fails naming the package (systemd) that `cargo xtask test` installs.
#[test]
fn systemd_unit_passes_systemd_analyze_verify() -> Result<()> {
    let analyze = testkit::tools::SYSTEMD_ANALYZE.require()?;
    let dir = tempfile::tempdir()?;
    let unit = dir.path().join("provisioner.service");
    let text = systemd_unit()?.replace(IMAGE_BINARY, &provisioner_bin().display().to_string());
    std::fs::write(&unit, text)?;
    let out = Command::new(analyze).arg("verify").arg(&unit).output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("provisioner.service"), "{said}");
    Ok(())
}

/// The unit runs the daemon the binary accepts, with the DaemonSet's capabilities, writable
/// store and socket dirs, and a stop timeout above the drain.
#[test]
fn systemd_unit_matches_the_daemonset() -> Result<()> {
    let unit = systemd_unit()?;
    let [exec] = unit_values(&unit, "ExecStart")[..] else {
        bail!("expected one ExecStart");
    };
    let argv: Vec<String> = exec.split_whitespace().map(str::to_owned).collect();
    assert_eq!(argv.get(1).map(String::as_str), Some("daemon"), "{argv:?}");
    assert_accepted(&argv)?;

    let ds = daemon_set()?;
    let adds: Vec<String> = container(pod_spec(&ds)?, "provisioner")?
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default()
        .iter()
        .map(|c| format!("CAP_{c}"))
        .collect();
    let bounding: Vec<String> = unit_values(&unit, "CapabilityBoundingSet")
        .iter()
        .flat_map(|v| v.split_whitespace())
        .map(str::to_owned)
        .collect();
    assert_eq!(bounding, adds);
    assert_eq!(unit_values(&unit, "ProtectSystem"), ["strict"]);
    assert_eq!(unit_values(&unit, "Restart"), ["on-failure"]);
    let writable: Vec<&str> = unit_values(&unit, "ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace())
        .collect();
    let value_of = |flag: &str| {
        argv.iter()
            .find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
            .map(str::to_owned)
            .with_context(|| format!("ExecStart has no {flag}"))
    };
    let socket = PathBuf::from(value_of("--socket")?);
    let socket_dir = socket.parent().context("socket without a dir")?;
    for dir in [
        PathBuf::from(value_of("--data-dir")?),
        socket_dir.to_path_buf(),
    ] {
        assert!(
            writable.iter().any(|w| Path::new(w) == dir),
            "{} is not in ReadWritePaths {writable:?}",
            dir.display()
        );
    }
    let [stop] = unit_values(&unit, "TimeoutStopSec")[..] else {
        bail!("expected one TimeoutStopSec");
    };
    let seconds: i64 = stop.trim_end_matches('s').parse()?;
    assert!(seconds > DRAIN_LIMIT_SECONDS, "TimeoutStopSec={stop}");
    Ok(())
}
