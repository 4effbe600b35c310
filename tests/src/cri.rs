//! A blocking CRI (v1) client over a runtime's unix socket: what the kubelet calls, one call at
//! a time, for tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hyper_util::rt::TokioIo;
use provisioner_cri::v1 as cri;
use provisioner_cri::v1::image_service_client::ImageServiceClient;
use provisioner_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

pub use provisioner_cri::v1::{
    ContainerConfig, ContainerState, KeyValue, PodSandboxConfig, PodSandboxState,
};

/// How long one CRI call may take before the test gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A pod created through [`Cri::run_pod`]: its sandbox id and the config it was created with
/// (CreateContainer needs it again).
#[derive(Clone, Debug)]
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
}

/// A pod the runtime reports ready: its addresses (the primary one first) and its netns.
pub struct ReadyPod {
    pub pod: Pod,
    pub ips: Vec<String>,
    pub netns: PathBuf,
}

/// The runtime's own conditions, as `crictl info` shows them.
#[derive(Debug)]
pub struct RuntimeConditions {
    pub runtime_ready: bool,
    pub network_ready: bool,
    /// `reason: message` of the NetworkReady condition when it is false.
    pub network_message: String,
}

pub struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    socket: PathBuf,
}

impl Cri {
    /// Connects to the CRI socket, waiting (bounded) until the runtime answers `Version`.
    pub fn connect(socket: &Path, limit: Duration) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("start a runtime for the CRI client")?;
        let path = socket.to_path_buf();
        let _in_runtime = rt.enter();
        let channel = Endpoint::try_from("http://[::]:0")?
            .timeout(CALL_TIMEOUT)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }));
        let mut client = Self {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            socket: socket.to_path_buf(),
        };
        let started = Instant::now();
        loop {
            let answer = client
                .rt
                .block_on(client.runtime.version(cri::VersionRequest::default()));
            match answer {
                Ok(_) => return Ok(client),
                Err(status) if started.elapsed() > limit => {
                    bail!(
                        "CRI on {} did not answer within {limit:?}: {status}",
                        client.socket.display()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The runtime's RuntimeReady and NetworkReady conditions (`Status`).
    pub fn conditions(&mut self) -> Result<RuntimeConditions> {
        let status = self
            .rt
            .block_on(self.runtime.status(cri::StatusRequest { verbose: false }))
            .context("CRI Status")?
            .into_inner()
            .status
            .context("CRI Status without a status")?;
        let find = |kind: &str| status.conditions.iter().find(|c| c.r#type == kind);
        let network = find("NetworkReady");
        Ok(RuntimeConditions {
            runtime_ready: find("RuntimeReady").is_some_and(|c| c.status),
            network_ready: network.is_some_and(|c| c.status),
            network_message: network
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default(),
        })
    }

    /// Waits (bounded) until NetworkReady is `ready`.
    pub fn wait_network_ready(&mut self, ready: bool, limit: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let conditions = self.conditions()?;
            if conditions.network_ready == ready {
                return Ok(());
            }
            if started.elapsed() > limit {
                bail!(
                    "NetworkReady did not become {ready} within {limit:?}: {}",
                    conditions.network_message
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the kubelet sends once it knows the node's pod CIDR (`UpdateRuntimeConfig`).
    pub fn update_pod_cidr(&mut self, pod_cidr: &str) -> Result<()> {
        let request = cri::UpdateRuntimeConfigRequest {
            runtime_config: Some(cri::RuntimeConfig {
                network_config: Some(cri::NetworkConfig {
                    pod_cidr: pod_cidr.to_owned(),
                }),
            }),
        };
        self.rt
            .block_on(self.runtime.update_runtime_config(request))
            .with_context(|| format!("CRI UpdateRuntimeConfig pod CIDR {pod_cidr}"))?;
        Ok(())
    }

    /// The config the kubelet would send for pod `name` in namespace `default`; container logs
    /// go under `log_dir`.
    pub fn pod_config(name: &str, log_dir: &Path) -> PodSandboxConfig {
        Self::kubelet_pod_config("default", name, &format!("uid-{name}"), log_dir)
    }

    /// The config the kubelet sends for pod `namespace/name` of uid `uid`: the metadata and
    /// the labels it sets on every sandbox; container logs go under `log_dir`.
    pub fn kubelet_pod_config(
        namespace: &str,
        name: &str,
        uid: &str,
        log_dir: &Path,
    ) -> PodSandboxConfig {
        let labels = HashMap::from([
            ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
            (
                "io.kubernetes.pod.namespace".to_owned(),
                namespace.to_owned(),
            ),
            ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
        ]);
        PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.to_owned(),
                namespace: namespace.to_owned(),
                attempt: 0,
            }),
            hostname: name.to_owned(),
            log_directory: log_dir.join(name).display().to_string(),
            labels,
            linux: Some(cri::LinuxPodSandboxConfig::default()),
            ..PodSandboxConfig::default()
        }
    }

    /// `RunPodSandbox`; the runtime's error is returned as is (the tests read its message).
    pub fn run_pod(&mut self, config: &PodSandboxConfig) -> Result<Pod, tonic::Status> {
        let request = cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let id = self
            .rt
            .block_on(self.runtime.run_pod_sandbox(request))?
            .into_inner()
            .pod_sandbox_id;
        Ok(Pod {
            id,
            config: config.clone(),
        })
    }

    /// RunPodSandbox `name` (logs under `log_dir`), then its status: it must be SANDBOX_READY
    /// with an address. The pod, its addresses (the primary one first) and its netns.
    pub fn run_ready_pod(&mut self, name: &str, log_dir: &Path) -> Result<ReadyPod> {
        self.run_ready_pod_of(&Self::pod_config(name, log_dir))
    }

    /// [`Self::run_ready_pod`] of the pod `config` describes.
    pub fn run_ready_pod_of(&mut self, config: &PodSandboxConfig) -> Result<ReadyPod> {
        let name = config
            .metadata
            .as_ref()
            .map_or_else(String::new, |m| format!("{}/{}", m.namespace, m.name));
        let pod = self
            .run_pod(config)
            .map_err(|s| anyhow::anyhow!("RunPodSandbox {name}: {s}"))?;
        let (status, _) = self.pod_status(&pod.id)?;
        if status.state != PodSandboxState::SandboxReady as i32 {
            bail!("pod {name} is not SANDBOX_READY: {status:?}");
        }
        let net = status
            .network
            .with_context(|| format!("pod {name}: no network in its status"))?;
        let ips: Vec<String> = std::iter::once(net.ip)
            .chain(net.additional_ips.into_iter().map(|ip| ip.ip))
            .filter(|ip| !ip.is_empty())
            .collect();
        if ips.is_empty() {
            bail!("pod {name} has no address in its status");
        }
        let netns = self.pod_netns(&pod.id)?;
        Ok(ReadyPod { pod, ips, netns })
    }

    /// `PodSandboxStatus` with the runtime's verbose info (JSON strings by key).
    pub fn pod_status(
        &mut self,
        id: &str,
    ) -> Result<(cri::PodSandboxStatus, HashMap<String, String>)> {
        let answer = self
            .rt
            .block_on(
                self.runtime
                    .pod_sandbox_status(cri::PodSandboxStatusRequest {
                        pod_sandbox_id: id.to_owned(),
                        verbose: true,
                    }),
            )
            .with_context(|| format!("CRI PodSandboxStatus {id}"))?
            .into_inner();
        let status = answer
            .status
            .with_context(|| format!("CRI PodSandboxStatus {id}: no status"))?;
        Ok((status, answer.info))
    }

    /// The pod's network namespace path, from the runtime's verbose status (containerd's
    /// `info.runtimeSpec.linux.namespaces`).
    pub fn pod_netns(&mut self, id: &str) -> Result<PathBuf> {
        let (_, info) = self.pod_status(id)?;
        let raw = info
            .get("info")
            .with_context(|| format!("pod {id}: verbose status has no \"info\""))?;
        let info: serde_json::Value = serde_json::from_str(raw)
            .with_context(|| format!("pod {id}: verbose info is not JSON"))?;
        info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|ns| ns["type"] == "network")
            .and_then(|ns| ns["path"].as_str())
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .with_context(|| format!("pod {id}: no network namespace path in {info}"))
    }

    pub fn stop_pod(&mut self, id: &str) -> Result<()> {
        self.rt
            .block_on(self.runtime.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }))
            .with_context(|| format!("CRI StopPodSandbox {id}"))?;
        Ok(())
    }

    pub fn remove_pod(&mut self, id: &str) -> Result<()> {
        self.rt
            .block_on(
                self.runtime
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: id.to_owned(),
                    }),
            )
            .with_context(|| format!("CRI RemovePodSandbox {id}"))?;
        Ok(())
    }

    /// Every sandbox the runtime knows, ready or not.
    pub fn list_pods(&mut self) -> Result<Vec<cri::PodSandbox>> {
        Ok(self
            .rt
            .block_on(
                self.runtime
                    .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }),
            )
            .context("CRI ListPodSandbox")?
            .into_inner()
            .items)
    }

    /// Whether the runtime's image store has `image` (imported with `ctr`, no registry).
    pub fn has_image(&mut self, image: &str) -> Result<bool> {
        let answer = self
            .rt
            .block_on(self.images.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.to_owned(),
                    ..cri::ImageSpec::default()
                }),
                verbose: false,
            }))
            .with_context(|| format!("CRI ImageStatus {image}"))?;
        Ok(answer.into_inner().image.is_some())
    }

    /// CreateContainer + StartContainer of `image` running `command` in `pod`; its output goes
    /// to `<pod log dir>/<name>.log`. Returns the container id.
    pub fn start_container(
        &mut self,
        pod: &Pod,
        name: &str,
        image: &str,
        command: &[&str],
        env: &[(&str, &str)],
    ) -> Result<String> {
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: image.to_owned(),
                ..cri::ImageSpec::default()
            }),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            envs: env
                .iter()
                .map(|(k, v)| cri::KeyValue {
                    key: (*k).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
            log_path: format!("{name}.log"),
            linux: Some(cri::LinuxContainerConfig::default()),
            ..cri::ContainerConfig::default()
        };
        self.run_container(pod, config)
    }

    /// CreateContainer + StartContainer of `config` in `pod`. Returns the container id.
    pub fn run_container(&mut self, pod: &Pod, config: cri::ContainerConfig) -> Result<String> {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let id = self
            .rt
            .block_on(self.runtime.create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            }))
            .with_context(|| format!("CRI CreateContainer {name} in pod {}", pod.id))?
            .into_inner()
            .container_id;
        self.rt
            .block_on(self.runtime.start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            }))
            .with_context(|| format!("CRI StartContainer {name} ({id})"))?;
        Ok(id)
    }

    /// Waits (bounded) for a container to exit; returns its exit code.
    pub fn wait_container_exit(&mut self, id: &str, limit: Duration) -> Result<i32> {
        let started = Instant::now();
        loop {
            let status = self
                .rt
                .block_on(self.runtime.container_status(cri::ContainerStatusRequest {
                    container_id: id.to_owned(),
                    verbose: false,
                }))
                .with_context(|| format!("CRI ContainerStatus {id}"))?
                .into_inner()
                .status
                .with_context(|| format!("CRI ContainerStatus {id}: no status"))?;
            if status.state == ContainerState::ContainerExited as i32 {
                return Ok(status.exit_code);
            }
            if started.elapsed() > limit {
                bail!("container {id} did not exit within {limit:?}: {status:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `StopContainer`: SIGTERM, then SIGKILL after `grace`, as the kubelet stops one.
    pub fn stop_container(&mut self, id: &str, grace: Duration) -> Result<()> {
        self.rt
            .block_on(self.runtime.stop_container(cri::StopContainerRequest {
                container_id: id.to_owned(),
                timeout: i64::try_from(grace.as_secs())?,
            }))
            .with_context(|| format!("CRI StopContainer {id}"))?;
        Ok(())
    }

    /// Whether container `id` is running.
    pub fn container_running(&mut self, id: &str) -> Result<bool> {
        let status = self
            .rt
            .block_on(self.runtime.container_status(cri::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            }))
            .with_context(|| format!("CRI ContainerStatus {id}"))?
            .into_inner()
            .status
            .with_context(|| format!("CRI ContainerStatus {id}: no status"))?;
        Ok(status.state == ContainerState::ContainerRunning as i32)
    }

    pub fn remove_container(&mut self, id: &str) -> Result<()> {
        self.rt
            .block_on(self.runtime.remove_container(cri::RemoveContainerRequest {
                container_id: id.to_owned(),
            }))
            .with_context(|| format!("CRI RemoveContainer {id}"))?;
        Ok(())
    }
}

/// Where the runtime writes the output of container `name` of `pod`.
pub fn container_log_path(pod: &Pod, name: &str) -> PathBuf {
    Path::new(&pod.config.log_directory).join(format!("{name}.log"))
}

/// The text lines of a CRI container log (`<time> <stream> <tag> <line>` per line).
pub fn log_lines(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read container log {}", path.display()))?;
    Ok(text
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or_default().to_owned())
        .collect())
}
