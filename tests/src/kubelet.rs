//! What the kubelet makes of a pod spec for CRI: the sandbox config and each container's
//! config, with the spec's settings carried over as they are (namespaces, capabilities,
//! seccomp profile, read-only root, mounts with their propagation, command, args, env with the
//! downward API's node address, `$(VAR)` references expanded). Volumes are given by the test as
//! host dirs, by volume name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, SeccompProfile};
use provisioner_cri::v1 as cri;

/// The paths the kubelet masks in a container that is not privileged
/// (k8s.io/kubernetes pkg/securitycontext: defaultMaskedPaths).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// The paths the kubelet makes read-only in a container that is not privileged
/// (defaultReadonlyPaths).
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn namespace_options(spec: &PodSpec) -> cri::NamespaceOption {
    let node_or = |host: Option<bool>, otherwise: cri::NamespaceMode| {
        if host == Some(true) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    cri::NamespaceOption {
        network: node_or(spec.host_network, cri::NamespaceMode::Pod),
        pid: node_or(spec.host_pid, cri::NamespaceMode::Container),
        ipc: node_or(spec.host_ipc, cri::NamespaceMode::Pod),
        ..cri::NamespaceOption::default()
    }
}

/// The sandbox of pod `name` (namespace `namespace`) of `spec`; container logs under `log_dir`.
pub fn sandbox_config(
    name: &str,
    namespace: &str,
    spec: &PodSpec,
    log_dir: &Path,
) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            namespace: namespace.to_owned(),
            attempt: 0,
        }),
        // A pod in the node's UTS namespace keeps the node's hostname: containerd 1.6 would pass
        // this one to runc, which refuses to set a hostname in a namespace it does not own.
        hostname: if spec.host_network == Some(true) {
            String::new()
        } else {
            name.to_owned()
        },
        log_directory: log_dir.join(name).display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec)),
                seccomp: pod_seccomp(spec).and_then(|p| security_profile(p).ok()),
                ..cri::LinuxSandboxSecurityContext::default()
            }),
            ..cri::LinuxPodSandboxConfig::default()
        }),
        ..cri::PodSandboxConfig::default()
    }
}

fn propagation(mode: Option<&str>) -> Result<i32> {
    Ok(match mode {
        None | Some("None") => cri::MountPropagation::PropagationPrivate,
        Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
        Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
        Some(other) => bail!("unknown mountPropagation {other}"),
    } as i32)
}

fn pod_seccomp(spec: &PodSpec) -> Option<&SeccompProfile> {
    spec.security_context.as_ref()?.seccomp_profile.as_ref()
}

/// A seccomp profile as the kubelet passes it over CRI.
fn security_profile(profile: &SeccompProfile) -> Result<cri::SecurityProfile> {
    let profile_type = match profile.type_.as_str() {
        "RuntimeDefault" => cri::security_profile::ProfileType::RuntimeDefault,
        "Unconfined" => cri::security_profile::ProfileType::Unconfined,
        other => bail!("seccomp profile type {other} is not played by the test's kubelet"),
    };
    Ok(cri::SecurityProfile {
        profile_type: profile_type as i32,
        ..cri::SecurityProfile::default()
    })
}

/// What the kubelet knows of the node a pod runs on.
#[derive(Clone, Debug)]
pub struct NodeInfo<'a> {
    /// The node's address: the downward API's `status.hostIP` (and `status.podIP` of a
    /// host-network pod).
    pub host_ip: &'a str,
    /// Volume name -> the host dir standing for it.
    pub volumes: &'a BTreeMap<String, PathBuf>,
}

/// The value of an env var: given, or from the downward API (the node's address only).
fn env_value(c: &Container, var: &EnvVar, node: &NodeInfo<'_>, spec: &PodSpec) -> Result<String> {
    if let Some(value) = &var.value {
        return Ok(value.clone());
    }
    let field = var
        .value_from
        .as_ref()
        .and_then(|from| from.field_ref.as_ref())
        .with_context(|| {
            format!(
                "container {}: env {} is neither a value nor a fieldRef",
                c.name, var.name
            )
        })?;
    match field.field_path.as_str() {
        "status.hostIP" => Ok(node.host_ip.to_owned()),
        "status.podIP" if spec.host_network == Some(true) => Ok(node.host_ip.to_owned()),
        other => bail!(
            "container {}: env {} from field {other}, which the test's kubelet does not fill",
            c.name,
            var.name
        ),
    }
}

/// `text` with each `$(NAME)` of a defined variable replaced by its value and `$$` made `$`,
/// as the kubelet expands a container's command and args; other references stay as written.
pub fn expand(text: &str, env: &[cri::KeyValue]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some((name, after)) = tail
            .strip_prefix("$(")
            .and_then(|t| t.split_once(')'))
            .filter(|(name, _)| env.iter().any(|kv| kv.key == *name))
        {
            let value = env.iter().rev().find(|kv| kv.key == name);
            out.push_str(value.map_or("", |kv| kv.value.as_str()));
            rest = after;
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Container `c` of `spec` (restart number `attempt`) on `node`.
pub fn container_config(
    spec: &PodSpec,
    c: &Container,
    attempt: u32,
    node: &NodeInfo<'_>,
) -> Result<cri::ContainerConfig> {
    let volumes = node.volumes;
    let image = c
        .image
        .clone()
        .with_context(|| format!("container {}: no image", c.name))?;
    let mut envs = Vec::new();
    for var in c.env.iter().flatten() {
        let value = env_value(c, var, node, spec)?;
        envs.push(cri::KeyValue {
            key: var.name.clone(),
            value: expand(&value, &envs),
        });
    }
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let host = volumes
            .get(&m.name)
            .with_context(|| format!("container {}: no dir for volume {}", c.name, m.name))?;
        mounts.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: m.read_only == Some(true),
            propagation: propagation(m.mount_propagation.as_deref())?,
            ..cri::Mount::default()
        });
    }
    let sc = c.security_context.clone().unwrap_or_default();
    let privileged = sc.privileged == Some(true);
    let capabilities = sc.capabilities.map(|caps| cri::Capability {
        add_capabilities: caps.add.unwrap_or_default(),
        drop_capabilities: caps.drop.unwrap_or_default(),
        ..cri::Capability::default()
    });
    let paths = |list: &[&str]| {
        if privileged {
            Vec::new()
        } else {
            list.iter().map(|p| (*p).to_owned()).collect()
        }
    };
    let seccomp = sc
        .seccomp_profile
        .as_ref()
        .or_else(|| pod_seccomp(spec))
        .map(security_profile)
        .transpose()?;
    let security = cri::LinuxContainerSecurityContext {
        capabilities,
        seccomp,
        privileged,
        namespace_options: Some(namespace_options(spec)),
        run_as_user: sc.run_as_user.map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem == Some(true),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: paths(MASKED_PATHS),
        readonly_paths: paths(READONLY_PATHS),
        ..cri::LinuxContainerSecurityContext::default()
    };
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image,
            ..cri::ImageSpec::default()
        }),
        command: c
            .command
            .iter()
            .flatten()
            .map(|a| expand(a, &envs))
            .collect(),
        args: c.args.iter().flatten().map(|a| expand(a, &envs)).collect(),
        envs,
        mounts,
        log_path: format!("{}_{attempt}.log", c.name),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(security),
            resources: Some(resources(c)?),
        }),
        ..cri::ContainerConfig::default()
    })
}

/// The container's requests and limits as the kubelet passes them: memory limit in bytes, CPU
/// request as shares (1024 per CPU, at least 2).
fn resources(c: &Container) -> Result<cri::LinuxContainerResources> {
    let reqs = c.resources.as_ref();
    let memory = reqs
        .and_then(|r| r.limits.as_ref()?.get("memory"))
        .map(|q| bytes(&q.0))
        .transpose()?
        .unwrap_or(0);
    let cpu_shares = reqs
        .and_then(|r| r.requests.as_ref()?.get("cpu"))
        .map(|q| millicpu(&q.0))
        .transpose()?
        .map_or(0, |milli| (milli * 1024 / 1000).max(2));
    Ok(cri::LinuxContainerResources {
        memory_limit_in_bytes: memory,
        cpu_shares,
        ..cri::LinuxContainerResources::default()
    })
}

/// A memory quantity with a binary suffix (`256Mi`) or none, in bytes.
fn bytes(quantity: &str) -> Result<i64> {
    let (digits, factor) = [("Ki", 1i64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)]
        .iter()
        .find_map(|(suffix, f)| Some((quantity.strip_suffix(suffix)?, *f)))
        .unwrap_or((quantity, 1));
    let n: i64 = digits
        .parse()
        .with_context(|| format!("memory quantity {quantity}"))?;
    Ok(n * factor)
}

/// A CPU quantity (`50m`, `1`), in thousandths of a CPU.
fn millicpu(quantity: &str) -> Result<i64> {
    match quantity.strip_suffix('m') {
        Some(milli) => milli.parse(),
        None => quantity.parse::<i64>().map(|cpus| cpus * 1000),
    }
    .with_context(|| format!("cpu quantity {quantity}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_as_the_kubelet_does() {
        let env = [cri::KeyValue {
            key: "NODE_IP".into(),
            value: "10.0.0.5".into(),
        }];
        assert_eq!(
            expand("--metrics-addr=$(NODE_IP)", &env),
            "--metrics-addr=10.0.0.5"
        );
        assert_eq!(
            expand("$(UNSET) $$(NODE_IP) $", &env),
            "$(UNSET) $(NODE_IP) $"
        );
        assert_eq!(expand("$(NODE_IP", &env), "$(NODE_IP");
    }
}
