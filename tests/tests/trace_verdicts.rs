//! Sandbox verdicts from the real kernel: the tracer and the correlator run while stand-in
//! runtimes and the reference CNI plugins act on namespaces these tests create.

use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use provisioner::trace::{
    Correlator, CorrelatorConfig, KernelTracer, NetnsVerdict, Report, SandboxRules, Step,
    TraceEvent, Verdict,
};
use provisioner_tests::{Netns, require_root, run, unique_name};
use tokio::sync::mpsc::Receiver;

const DEADLINE: Duration = Duration::from_secs(1);
const SANDBOX_PREFIX: &str = "trsb";

/// A copy of `ip` named `containerd`: its comm is a runtime's.
fn runtime_ip() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("trace-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("containerd");
        std::fs::copy("/usr/sbin/ip", &path).expect("copy ip");
        path
    })
}

fn runtime(args: &[&str]) -> Result<String> {
    run(runtime_ip().to_str().context("path")?, args)
}

/// A sandbox namespace created and pinned by the stand-in runtime; deleted on drop.
struct Sandbox {
    name: String,
    deleted: bool,
}

impl Sandbox {
    fn new() -> Result<Self> {
        let name = unique_name(SANDBOX_PREFIX);
        runtime(&["netns", "add", &name])?;
        Ok(Self {
            name,
            deleted: false,
        })
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    fn delete(&mut self) -> Result<()> {
        self.deleted = true;
        runtime(&["netns", "del", &self.name]).map(|_| ())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .output();
        }
    }
}

struct Harness {
    _tracer: KernelTracer,
    rx: Receiver<TraceEvent>,
    correlator: Correlator,
    verdicts: Vec<(Instant, NetnsVerdict)>,
}

impl Harness {
    fn start() -> Result<Self> {
        require_root();
        let (tracer, rx) = KernelTracer::start(65_536)?;
        let rules = SandboxRules {
            pin_prefixes: vec![SANDBOX_PREFIX.into()],
            ..SandboxRules::default()
        };
        Ok(Self {
            _tracer: tracer,
            rx,
            correlator: Correlator::new(CorrelatorConfig {
                deadline: DEADLINE,
                rules,
            }),
            verdicts: Vec::new(),
        })
    }

    fn keep(&mut self, reports: Vec<Report>) {
        for report in reports {
            if let Report::Verdict(v) = report {
                self.verdicts.push((Instant::now(), v));
            }
        }
    }

    /// Feeds events and ticks until the verdict for the namespace pinned at `path` arrives.
    async fn verdict_for(
        &mut self,
        path: &Path,
        within: Duration,
    ) -> Result<(Instant, NetnsVerdict)> {
        let end = tokio::time::Instant::now() + within;
        loop {
            if let Some(found) = self.verdicts.iter().find(|(_, v)| pinned_at(v, path)) {
                return Ok(found.clone());
            }
            let next = tokio::time::Instant::now() + Duration::from_millis(20);
            if next > end {
                bail!("no verdict for {} within {within:?}", path.display());
            }
            while let Ok(Some(event)) = tokio::time::timeout_at(next, self.rx.recv()).await {
                let reports = self.correlator.feed(&event);
                self.keep(reports);
            }
            let reports = self.correlator.tick(SystemTime::now());
            self.keep(reports);
        }
    }

    /// Feeds events and ticks for `span`.
    async fn pump(&mut self, span: Duration) {
        let _ = self.verdict_for(Path::new("/nonexistent"), span).await;
    }
}

fn pinned_at(v: &NetnsVerdict, path: &Path) -> bool {
    v.timeline
        .iter()
        .any(|e| matches!(&e.step, Step::Pinned { path: p } if p == path))
}

fn timeline_text(v: &NetnsVerdict) -> String {
    v.timeline
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs blocking setup steps while the harness keeps consuming events.
async fn during<T: Send + 'static>(
    h: &mut Harness,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let task = tokio::task::spawn_blocking(f);
    tokio::pin!(task);
    loop {
        tokio::select! {
            done = &mut task => return done?,
            () = h.pump(Duration::from_millis(50)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_created_sandboxes_without_network_are_skipped_naming_the_creator() -> Result<()> {
    let mut h = Harness::start()?;
    let sandboxes = during(&mut h, || {
        (0..3).map(|_| Sandbox::new()).collect::<Result<Vec<_>>>()
    })
    .await?;
    let started = Instant::now();
    for sb in &sandboxes {
        let (at, v) = h
            .verdict_for(&sb.path(), DEADLINE + Duration::from_secs(1))
            .await?;
        assert_eq!(
            v.verdict,
            Verdict::Skipped,
            "{}: {}",
            v.reason,
            timeline_text(&v)
        );
        assert_eq!(v.creator.comm, "containerd");
        assert!(at.duration_since(started) <= DEADLINE + Duration::from_secs(1));
        assert!(v.reason.contains("no interface"), "{}", v.reason);
    }
    let repeats = h
        .verdicts
        .iter()
        .filter_map(|(_, v)| v.repeat.as_ref())
        .map(|r| r.count)
        .max();
    assert!(
        repeats >= Some(3),
        "skips are summarised per creator: {repeats:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_only_sandbox_is_skipped_and_its_timeline_shows_lo() -> Result<()> {
    let mut h = Harness::start()?;
    let sb = during(&mut h, || {
        let sb = Sandbox::new()?;
        sb.ip(&["link", "set", "lo", "up"])?;
        Ok(sb)
    })
    .await?;
    let (_, v) = h
        .verdict_for(&sb.path(), DEADLINE + Duration::from_secs(1))
        .await?;
    assert_eq!(v.verdict, Verdict::Skipped, "{}", v.reason);
    assert!(
        v.timeline
            .iter()
            .any(|e| matches!(&e.step, Step::DevUp { ifname, .. } if ifname == "lo")),
        "{}",
        timeline_text(&v)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interface_without_address_is_partial() -> Result<()> {
    let mut h = Harness::start()?;
    let sb = during(&mut h, || {
        let sb = Sandbox::new()?;
        sb.ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"])?;
        sb.ip(&["link", "set", "v0", "up"])?;
        Ok(sb)
    })
    .await?;
    let (_, v) = h
        .verdict_for(&sb.path(), DEADLINE + Duration::from_secs(1))
        .await?;
    assert_eq!(
        v.verdict,
        Verdict::Partial,
        "{}\n{}",
        v.reason,
        timeline_text(&v)
    );
    assert!(v.reason.contains("an address"), "{}", v.reason);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_the_kernel_rejects_is_failed_with_the_reason() -> Result<()> {
    let mut h = Harness::start()?;
    let sb = during(&mut h, || {
        let sb = Sandbox::new()?;
        sb.ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"])?;
        sb.ip(&["link", "set", "v0", "up"])?;
        sb.ip(&["addr", "add", "10.9.0.2/24", "dev", "v0"])?;
        let rejected = sb.ip(&["route", "add", "default", "via", "10.10.0.1"]);
        assert!(
            rejected.is_err(),
            "the kernel must reject an unreachable gateway"
        );
        Ok(sb)
    })
    .await?;
    let (_, v) = h
        .verdict_for(&sb.path(), DEADLINE + Duration::from_secs(1))
        .await?;
    assert_eq!(
        v.verdict,
        Verdict::Failed,
        "{}\n{}",
        v.reason,
        timeline_text(&v)
    );
    assert!(v.reason.contains("ENETUNREACH"), "{}", v.reason);
    assert!(
        v.reason.contains("Nexthop has invalid gateway"),
        "{}",
        v.reason
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_runtime_namespace_destroyed_after_100ms_is_gone_never_skipped() -> Result<()> {
    let mut h = Harness::start()?;
    let name = unique_name("trnon");
    let path = PathBuf::from(format!("/run/netns/{name}"));
    let n = name.clone();
    during(&mut h, move || {
        run("ip", &["netns", "add", &n])?;
        run("ip", &["-n", &n, "link", "set", "lo", "up"])?;
        std::thread::sleep(Duration::from_millis(100));
        run("ip", &["netns", "del", &n])?;
        Ok(())
    })
    .await?;
    h.pump(DEADLINE + Duration::from_millis(500)).await;
    let mine: Vec<&NetnsVerdict> = h
        .verdicts
        .iter()
        .map(|(_, v)| v)
        .filter(|v| pinned_at(v, &path))
        .collect();
    assert!(
        mine.iter().all(|v| v.verdict == Verdict::Gone),
        "{:?}",
        mine.iter()
            .map(|v| (v.verdict, &v.reason))
            .collect::<Vec<_>>()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_sandbox_with_only_lo_destroyed_after_30ms_is_skipped_within_1s() -> Result<()> {
    let mut h = Harness::start()?;
    let (path, deleted_at) = during(&mut h, || {
        let mut sb = Sandbox::new()?;
        runtime(&["-n", &sb.name, "link", "set", "lo", "up"])?;
        std::thread::sleep(Duration::from_millis(30));
        sb.delete()?;
        Ok((sb.path(), Instant::now()))
    })
    .await?;
    let (at, v) = h.verdict_for(&path, Duration::from_secs(1)).await?;
    assert_eq!(v.verdict, Verdict::Skipped, "{}", v.reason);
    assert!(
        v.destroyed_at.is_some(),
        "decided at destruction, not deadline"
    );
    assert!(
        at.saturating_duration_since(deleted_at) < Duration::from_secs(1),
        "reported {:?} after deletion",
        at.saturating_duration_since(deleted_at)
    );
    assert!(
        v.timeline.iter().any(|e| matches!(e.step, Step::Destroyed)),
        "{}",
        timeline_text(&v)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_ptp_plugin_sandbox_is_networked_and_the_plugin_exec_shows() -> Result<()> {
    if !Path::new("/usr/lib/cni/ptp").exists() {
        bail!("containernetworking-plugins are not installed (/usr/lib/cni/ptp)");
    }
    let mut h = Harness::start()?;
    let node = Netns::new("trnode")?;
    let data_dir = tempfile::tempdir()?;
    let node_path = node.path().to_path_buf();
    let data = data_dir.path().to_path_buf();
    let (sb, output) = during(&mut h, move || {
        let sb = Sandbox::new()?;
        let config = serde_json::json!({
            "cniVersion": "0.4.0", "name": "trace-net", "type": "ptp", "mtu": 1460,
            "ipam": {"type": "host-local", "subnet": "10.244.7.0/24",
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": data},
        });
        let node_fd = std::fs::File::open(&node_path)?;
        let mut cmd = Command::new("/usr/lib/cni/ptp");
        cmd.env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", &sb.name)
            .env("CNI_NETNS", sb.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: setns is async-signal-safe; the fd stays open until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                nix::sched::setns(node_fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, config.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "ptp ADD failed: {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok((sb, String::from_utf8_lossy(&out.stdout).into_owned()))
    })
    .await?;
    assert!(output.contains("10.244.7."), "{output}");
    let (_, v) = h
        .verdict_for(&sb.path(), DEADLINE + Duration::from_secs(1))
        .await?;
    let text = timeline_text(&v);
    assert_eq!(v.verdict, Verdict::Networked, "{}\n{text}", v.reason);
    assert!(
        v.timeline
            .iter()
            .any(|e| matches!(&e.step, Step::Exec { filename } if filename.ends_with("/ptp"))),
        "{text}"
    );
    println!("{}\n{text}", v.reason);
    drop(sb);
    drop(node);
    Ok(())
}
