//! A private containerd (Debian's 1.6, CRI plugin) for one test: every piece of state in a temp
//! dir, the process started inside the test's "node" namespace and stopped by its pid. Shims it
//! left behind are found by the socket address on their command line, which is unique to this
//! instance, so other containerd processes on the machine are never touched.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cri::{Cri, ReadyPod};
use crate::daemon_harness::Daemon;
use crate::oci_image::{self, ImageSpec};
use crate::process::{pids_with_arg, spawn_in_netns, stop_pid, unmount_under};
use crate::{Netns, deploy, provisioner_bin, run};
use testkit::tools;

/// The CRI namespace of containerd's images and containers.
const K8S_NAMESPACE: &str = "k8s.io";

/// How long containerd may take to answer CRI after it was started.
const START_LIMIT: Duration = Duration::from_secs(30);

/// How the CRI plugin finds its network.
#[derive(Clone, Debug, Default)]
pub struct CniSetup {
    /// An existing conf dir to read (e.g. the daemon's); default: a fresh one.
    pub conf_dir: Option<PathBuf>,
    /// Files put in the conf dir before containerd starts: (file name, content).
    pub conf_files: Vec<(String, String)>,
    /// A `conf_template` (rendered by containerd on UpdateRuntimeConfig): its content.
    pub template: Option<String>,
}

impl CniSetup {
    /// containerd reads `conf_dir`, as a runtime and provisioner both read /etc/cni/net.d.
    pub fn reading(conf_dir: &Path) -> Self {
        Self {
            conf_dir: Some(conf_dir.to_path_buf()),
            ..Self::default()
        }
    }

    /// A node as the DaemonSet sets it up, for `daemon`: containerd reads the daemon's conf dir
    /// and renders the DaemonSet's template (deploy/) into it, the socket the template names
    /// replaced by `daemon`'s.
    pub fn deploy_template_for(daemon: &Daemon) -> Result<Self> {
        const SHIPPED_SOCKET: &str = "/run/provisioner/provisioner.sock";
        let shipped = deploy::cni_template()?;
        if !shipped.contains(SHIPPED_SOCKET) {
            bail!("the deploy template does not name {SHIPPED_SOCKET}: {shipped}");
        }
        Ok(Self {
            template: Some(shipped.replace(SHIPPED_SOCKET, &daemon.socket.display().to_string())),
            ..Self::reading(&daemon.conf_dir)
        })
    }
}

pub struct Containerd {
    child: Option<Child>,
    pub socket: PathBuf,
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub log_dir: PathBuf,
    /// Where the template is, when one was given.
    pub template: Option<PathBuf>,
    dir: tempfile::TempDir,
    cri: Option<Cri>,
}

impl Containerd {
    /// Starts containerd in `node` with a CNI bin dir holding `provisioner` and `loopback`, the
    /// conf dir and template of `cni`, and the pause and busybox images imported.
    pub fn start(node: &Netns, cni: &CniSetup) -> Result<Self> {
        require_tools()?;
        let dir = tempfile::Builder::new().prefix("ctrd").tempdir()?;
        let base = dir.path();
        let conf_dir = cni
            .conf_dir
            .clone()
            .unwrap_or_else(|| base.join("cni-net.d"));
        let bin_dir = base.join("cni-bin");
        let log_dir = base.join("pod-logs");
        for d in [&conf_dir, &bin_dir, &log_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
        }
        std::os::unix::fs::symlink(provisioner_bin(), bin_dir.join("provisioner"))?;
        std::os::unix::fs::symlink(tools::LOOPBACK.path, bin_dir.join("loopback"))?;
        for (name, content) in &cni.conf_files {
            std::fs::write(conf_dir.join(name), content)?;
        }
        let template = match &cni.template {
            Some(text) => {
                let path = base.join("cni.template");
                std::fs::write(&path, text)?;
                Some(path)
            }
            None => None,
        };
        let socket = base.join("containerd.sock");
        let config = config_toml(base, &socket, &conf_dir, &bin_dir, template.as_deref());
        let config_path = base.join("config.toml");
        std::fs::write(&config_path, config)?;

        let child = spawn_in_netns(
            Command::new(tools::CONTAINERD.path)
                .arg("--config")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(base.join("containerd.log"))?),
            node.path(),
        )?;
        let mut containerd = Self {
            child: Some(child),
            socket,
            conf_dir,
            bin_dir,
            log_dir,
            template,
            dir,
            cri: None,
        };
        let cri = Cri::connect(&containerd.socket, START_LIMIT)
            .with_context(|| format!("containerd log:\n{}", containerd.log()))?;
        containerd.cri = Some(cri);
        containerd.import(&oci_image::PAUSE)?;
        containerd.import(&oci_image::BUSYBOX_IMAGE)?;
        Ok(containerd)
    }

    /// Starts containerd in `node` reading `daemon`'s conf dir (as both read /etc/cni/net.d on
    /// a node), and waits until its CRI reports the network ready.
    pub fn start_reading(node: &Netns, daemon: &Daemon) -> Result<Self> {
        let mut containerd = Self::start(node, &CniSetup::reading(&daemon.conf_dir))?;
        containerd
            .cri()
            .wait_network_ready(true, Duration::from_secs(10))?;
        Ok(containerd)
    }

    /// The config file containerd was started with (`--config`).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    /// The CRI client of this containerd.
    pub fn cri(&mut self) -> &mut Cri {
        self.cri
            .as_mut()
            .expect("the CRI client is connected by Containerd::start")
    }

    /// [`Cri::run_ready_pod`] of pod `name`, its logs under this containerd's log dir.
    pub fn run_ready_pod(&mut self, name: &str) -> Result<ReadyPod> {
        let log_dir = self.log_dir.clone();
        self.cri().run_ready_pod(name, &log_dir)
    }

    /// The containerd log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// The containerd process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Builds `spec` as an OCI archive and imports it with `ctr`; waits until CRI sees it.
    fn import(&mut self, spec: &ImageSpec<'_>) -> Result<()> {
        let archive = self.dir.path().join("image.tar");
        oci_image::write_oci_archive(spec, &archive)?;
        let address = self.socket.display().to_string();
        let archive_arg = archive.display().to_string();
        run(
            "ctr",
            &[
                "--address",
                &address,
                "-n",
                K8S_NAMESPACE,
                "image",
                "import",
                &archive_arg,
            ],
        )
        .with_context(|| format!("import {} into containerd", spec.name))?;
        let started = Instant::now();
        while !self.cri().has_image(spec.name)? {
            if started.elapsed() > START_LIMIT {
                bail!("CRI does not list {} after ctr imported it", spec.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops and removes every sandbox, then stops containerd (SIGTERM by pid, SIGKILL after a
    /// bound) and anything it left: shims of this instance, netns pins of its sandboxes that it
    /// could not tear down (e.g. with no network config loaded, StopPodSandbox fails), mounts
    /// under its dir. Fails if a pin or shim could not be removed.
    pub fn shutdown(&mut self) -> Result<()> {
        let mut pins = Vec::new();
        if let Some(cri) = self.cri.as_mut() {
            for pod in cri.list_pods().unwrap_or_default() {
                if let Ok(netns) = cri.pod_netns(&pod.id) {
                    pins.push(netns);
                }
                if let Err(e) = cri.stop_pod(&pod.id).and_then(|()| cri.remove_pod(&pod.id)) {
                    eprintln!("containerd cleanup (pin removed below): {e:#}");
                }
            }
        }
        self.cri = None;
        if let Some(mut child) = self.child.take() {
            stop_pid(&mut child, Duration::from_secs(10))?;
        }
        let mut left = Vec::new();
        for pid in pids_with_arg(self.socket.as_os_str()) {
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_err() {
                left.push(format!("shim pid {pid}"));
            }
        }
        for pin in pins.iter().filter(|p| p.exists()) {
            let _ = nix::mount::umount2(pin, nix::mount::MntFlags::MNT_DETACH);
            if let Err(e) = std::fs::remove_file(pin) {
                left.push(format!("netns pin {}: {e}", pin.display()));
            }
        }
        unmount_under(self.dir.path());
        if left.is_empty() {
            Ok(())
        } else {
            bail!("containerd cleanup left {}", left.join(", "))
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Err(e) = self.shutdown()
        {
            eprintln!("{e:#}");
        }
    }
}

/// Fails with the package to install when containerd or one of its tools is missing.
pub fn require_tools() -> Result<()> {
    for tool in [
        tools::CONTAINERD,
        tools::CTR,
        tools::RUNC,
        tools::BUSYBOX,
        tools::LOOPBACK,
    ] {
        tool.require()?;
    }
    Ok(())
}

fn config_toml(
    base: &Path,
    socket: &Path,
    conf_dir: &Path,
    bin_dir: &Path,
    template: Option<&Path>,
) -> String {
    let b = base.display();
    let template = template.map_or_else(String::new, |t| {
        format!("conf_template = \"{}\"", t.display())
    });
    format!(
        r#"version = 2
root = "{b}/root"
state = "{b}/state"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{b}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin_dir}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
    {template}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"#,
        socket = socket.display(),
        pause = oci_image::PAUSE.name,
        bin_dir = bin_dir.display(),
        conf_dir = conf_dir.display(),
    )
}
