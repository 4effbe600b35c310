//! `deploy/`: the manifests are valid Kubernetes objects, what they run is accepted by the binary,
//! and the init step and readiness probe do what the node relies on.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::{Netns, deploy, provisioner_bin};

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
    let daemon = container(spec, "provisioner")?;
    assert_eq!(
        daemon.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let m = mounts(spec, daemon);
    for (path, host) in [
        ("/etc/cni/net.d", "/etc/cni/net.d"),
        ("/run/provisioner", "/run/provisioner"),
        ("/var/lib/provisioner", "/var/lib/provisioner"),
        ("/run/netns", "/run/netns"),
        ("/sys/fs/bpf", "/sys/fs/bpf"),
        ("/sys/kernel/tracing", "/sys/kernel/tracing"),
    ] {
        assert_eq!(m.get(path).map(String::as_str), Some(host), "{path}: {m:?}");
    }
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

#[test]
fn commands_the_manifests_run_are_accepted_by_the_binary() -> Result<()> {
    let ds = daemon_set()?;
    let spec = pod_spec(&ds)?;
    let daemon = container(spec, "provisioner")?;
    let run = argv(daemon);
    assert_eq!(run.get(1).map(String::as_str), Some("daemon"), "{run:?}");
    assert_accepted(&run)?;
    let probe = daemon
        .readiness_probe
        .as_ref()
        .and_then(|p| p.exec.as_ref())
        .and_then(|e| e.command.clone())
        .context("no exec readiness probe")?;
    assert_eq!(
        probe.get(1).map(String::as_str),
        Some("status"),
        "{probe:?}"
    );
    assert_accepted(&probe)
}

/// The probe's command against a real daemon: failing while the daemon has no network, passing
/// once it is ready.
#[test]
fn readiness_probe_follows_daemon_readiness() -> Result<()> {
    let ds = daemon_set()?;
    let probe = pod_spec(&ds)?
        .containers
        .iter()
        .find_map(|c| c.readiness_probe.as_ref()?.exec.as_ref()?.command.clone())
        .context("no exec readiness probe")?;
    let node = Netns::new("node")?;
    let daemon = Daemon::start(&node, None)?;
    let run_probe = || -> Result<bool> {
        let args: Vec<String> = probe[1..]
            .iter()
            .map(|a| match a.strip_prefix("--socket=") {
                Some(_) => format!("--socket={}", daemon.socket.display()),
                None => a.clone(),
            })
            .collect();
        Ok(Command::new(provisioner_bin())
            .args(&args)
            .output()?
            .status
            .success())
    };
    assert!(!run_probe()?, "probe passes with no network loaded");
    let network = conflist("deploynet", "1.0.0", &daemon.socket, "10.248.0.0/24", None);
    std::fs::write(
        daemon.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&network)?,
    )?;
    daemon.wait_ready(Duration::from_secs(10))?;
    assert!(run_probe()?, "probe fails on a ready daemon");
    Ok(())
}

/// The init container's script, run with its mounts mapped under a temp dir: it installs the
/// plugin (this build's binary) and the ConfigMap's template where the node expects them.
#[test]
fn init_step_installs_plugin_and_template() -> Result<()> {
    let ds = daemon_set()?;
    let spec = pod_spec(&ds)?;
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "install")
        .context("no init container `install`")?;
    let script_argv = argv(init);
    let [shell, flag, script] = script_argv.as_slice() else {
        bail!("expected `/bin/sh -c SCRIPT`: {script_argv:?}");
    };
    assert_eq!((shell.as_str(), flag.as_str()), ("/bin/sh", "-c"));

    let root = tempfile::tempdir()?;
    let mut mapped = script.replace(IMAGE_BINARY, &provisioner_bin().display().to_string());
    let mut host_of = BTreeMap::new();
    for mount in init.volume_mounts.iter().flatten() {
        let inside = root.path().join(mount.mount_path.trim_start_matches('/'));
        std::fs::create_dir_all(&inside)?;
        mapped = mapped.replace(&mount.mount_path, &inside.display().to_string());
        host_of.insert(mount.mount_path.clone(), inside);
    }
    let template = deploy::cni_template()?;
    let config_dir = init
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "cni-template")
        .map(|m| host_of[&m.mount_path].clone())
        .context("the ConfigMap is not mounted in the init container")?;
    std::fs::write(config_dir.join("cni.template"), &template)?;
    let out = Command::new("/bin/sh").args(["-c", &mapped]).output()?;
    assert!(
        out.status.success(),
        "init script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let hosts = host_paths(spec);
    let mounted = |host: &str| -> Result<PathBuf> {
        let volume = hosts
            .iter()
            .find(|(_, path)| path.as_str() == host)
            .map(|(name, _)| name.clone())
            .with_context(|| format!("no hostPath volume for {host}"))?;
        init.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume)
            .map(|m| host_of[&m.mount_path].clone())
            .with_context(|| format!("{host} is not mounted in the init container"))
    };
    let plugin = mounted("/opt/cni/bin")?.join("provisioner");
    assert_eq!(std::fs::read(&plugin)?, std::fs::read(provisioner_bin())?);
    assert!(std::fs::metadata(&plugin)?.permissions().mode() & 0o111 != 0);
    assert_eq!(
        std::fs::read_to_string(mounted("/etc/provisioner")?.join("cni.template"))?,
        template
    );
    // The installed file is a working CNI plugin.
    let version = Command::new(&plugin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::null())
        .output()?;
    let answer: serde_json::Value = serde_json::from_slice(&version.stdout)?;
    assert!(answer["supportedVersions"].is_array(), "{answer}");
    assert_no_leftovers(root.path())
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
            assert!(!name.ends_with(".new"), "leftover {}", path.display());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    Ok(())
}
