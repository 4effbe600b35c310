//! Sandbox verdicts from the real kernel: the product's trace driver runs while stand-in
//! runtimes, the reference CNI plugins and provisioner's own plugin act on namespaces these
//! tests create.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use provisioner::pod::{PodName, PodSource};
use provisioner::trace::render::verdict_lines;
use provisioner::trace::{NetnsVerdict, SandboxRules, Step, Verdict};
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::reference::Ptp;
use provisioner_tests::tracing::{Tracing, named, pin_path};
use provisioner_tests::{
    Netns, RuntimeNetns, run, runtime, runtime_runs_plugin, scaled, unique_name,
};

const DEADLINE: Duration = Duration::from_secs(1);
/// The deadline of sandboxes the tests set up (one `ip -batch`, or a reference plugin): the
/// setup's process must get its first request in before it, under emulation on a loaded machine
/// too (a Go plugin took over 6 s there).
const SETUP_DEADLINE: Duration = Duration::from_secs(2);
/// Bound on a verdict's arrival after its deadline (a state read, a loaded machine).
const SLACK: Duration = Duration::from_secs(5);
const SANDBOX_PREFIX: &str = "trsb";

/// A sandbox namespace created and pinned by the stand-in runtime.
type Sandbox = RuntimeNetns;

fn sandbox() -> Result<Sandbox> {
    RuntimeNetns::new(SANDBOX_PREFIX)
}

fn rules() -> SandboxRules {
    SandboxRules {
        pin_prefixes: vec![SANDBOX_PREFIX.into()],
        ..SandboxRules::default()
    }
}

async fn tracing() -> Result<Tracing> {
    Tracing::start(rules(), DEADLINE).await
}

async fn tracing_setups() -> Result<Tracing> {
    Tracing::start(rules(), SETUP_DEADLINE).await
}

fn timeline_text(v: &NetnsVerdict) -> String {
    v.timeline
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs blocking setup steps off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await?
}

/// The commands that make a veth `v0` (up) in a sandbox.
const INTERFACE: [&str; 2] = ["link add v0 type veth peer name v1", "link set v0 up"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_created_sandboxes_without_network_are_skipped_naming_the_creator() -> Result<()> {
    let mut t = tracing().await?;
    let sandboxes = blocking(|| (0..3).map(|_| sandbox()).collect::<Result<Vec<_>>>()).await?;
    for sb in &sandboxes {
        let (_, v) = t
            .verdict(t.cookie_of(&sb.path())?, DEADLINE + SLACK)
            .await?;
        assert_eq!(
            v.verdict,
            Verdict::Skipped,
            "{}: {}",
            v.reason,
            timeline_text(&v)
        );
        assert_eq!(v.creator.comm, "containerd");
        assert!(v.reason.contains("no interface"), "{}", v.reason);
        assert!(
            v.timeline
                .iter()
                .any(|e| matches!(e.step, Step::Snapshot { .. })),
            "an alarm on a live namespace rests on its state read from the kernel:\n{}",
            timeline_text(&v)
        );
    }
    let repeats = t
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
    let mut t = tracing().await?;
    let sb = blocking(|| {
        let sb = sandbox()?;
        sb.ip(&["link", "set", "lo", "up"])?;
        Ok(sb)
    })
    .await?;
    let (_, v) = t
        .verdict(t.cookie_of(&sb.path())?, DEADLINE + SLACK)
        .await?;
    assert_eq!(v.verdict, Verdict::Skipped, "{}", v.reason);
    assert!(v.reason.contains("lo up"), "{}", v.reason);
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
    let mut t = tracing_setups().await?;
    let sb = blocking(|| {
        let sb = sandbox()?;
        sb.ip_batch(&INTERFACE)?;
        Ok(sb)
    })
    .await?;
    let (_, v) = t
        .verdict(t.cookie_of(&sb.path())?, SETUP_DEADLINE + SLACK)
        .await?;
    assert_eq!(
        v.verdict,
        Verdict::Partial,
        "{}\n{}",
        v.reason,
        timeline_text(&v)
    );
    assert!(v.reason.contains("an address"), "{}", v.reason);
    // The kernel's ACKs are read where each request was sent (none comes as a reply).
    let text = timeline_text(&v);
    for request in ["newlink v0 type veth peer v1 (ack)", "v0 up (ack)"] {
        assert!(text.contains(request), "{request} in\n{text}");
    }
    assert!(!text.contains("(sent)"), "{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_the_kernel_rejects_is_failed_with_the_reason() -> Result<()> {
    let mut t = tracing_setups().await?;
    let sb = blocking(|| {
        let sb = sandbox()?;
        let mut setup = INTERFACE.to_vec();
        setup.extend([
            "addr add 10.9.0.2/24 dev v0",
            "route add default via 10.10.0.1",
        ]);
        let rejected = sb.ip_batch(&setup);
        assert!(
            rejected
                .as_ref()
                .is_err_and(|e| format!("{e:#}").contains("Command failed -:4")),
            "the kernel must reject an unreachable gateway, the last command: {rejected:?}"
        );
        Ok(sb)
    })
    .await?;
    let (_, v) = t
        .verdict(t.cookie_of(&sb.path())?, SETUP_DEADLINE + SLACK)
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
    // Found where it was sent and read again as a reply: one rejection, of the request.
    let text = timeline_text(&v);
    assert_eq!(text.matches("REJECTED").count(), 1, "{text}");
    assert!(!text.contains(" rejected:"), "no unmatched reply\n{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_runtime_namespace_destroyed_after_100ms_is_gone_never_skipped() -> Result<()> {
    let mut t = tracing().await?;
    let name = unique_name("trnon");
    let ids = t.ids()?;
    let cookie = blocking(move || {
        run("ip", &["netns", "add", &name])?;
        let cookie = named(&ids, &pin_path(&name));
        run("ip", &["-n", &name, "link", "set", "lo", "up"])?;
        std::thread::sleep(Duration::from_millis(100));
        run("ip", &["netns", "del", &name])?;
        cookie
    })
    .await?;
    let (_, v) = t.verdict(cookie, DEADLINE + SLACK).await?;
    assert_eq!(v.verdict, Verdict::Gone, "{}", v.reason);
    assert!(v.sandbox.is_none(), "{:?}", v.sandbox);
    t.collect(DEADLINE).await;
    assert_eq!(
        t.verdicts_on(cookie).len(),
        1,
        "one verdict, never a later skip"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_sandbox_with_only_lo_destroyed_after_30ms_is_skipped_within_1s() -> Result<()> {
    let mut t = tracing().await?;
    let ids = t.ids()?;
    let (cookie, deleted_at) = blocking(move || {
        let mut sb = sandbox()?;
        let cookie = named(&ids, &sb.path())?;
        runtime(&["-n", sb.name(), "link", "set", "lo", "up"])?;
        std::thread::sleep(Duration::from_millis(30));
        sb.delete()?;
        Ok((cookie, Instant::now()))
    })
    .await?;
    let (at, v) = t.verdict(cookie, Duration::from_secs(5)).await?;
    assert_eq!(v.verdict, Verdict::Skipped, "{}", v.reason);
    assert!(v.reason.contains("lo up"), "{}", v.reason);
    assert!(
        v.destroyed_at.is_some(),
        "decided at destruction, not deadline"
    );
    assert!(
        at.saturating_duration_since(deleted_at) < scaled(DEADLINE),
        "reported {:?} after deletion, before its deadline",
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
    let mut t = tracing_setups().await?;
    let node = Netns::new("trnode")?;
    let data = tempfile::tempdir()?;
    let ptp = Ptp {
        node: &node,
        subnet: "10.244.7.0/24".into(),
        data_dir: data.path().to_path_buf(),
    };
    let sb = sandbox()?;
    let output = ptp.run("ADD", sb.name(), &sb.path())?;
    assert!(output.stdout.contains("10.244.7."), "{output:?}");
    let (_, v) = t
        .verdict(t.cookie_of(&sb.path())?, SETUP_DEADLINE + SLACK)
        .await?;
    let text = timeline_text(&v);
    assert_eq!(v.verdict, Verdict::Networked, "{}\n{text}", v.reason);
    assert!(v.reason.contains("seen being set up"), "{}", v.reason);
    assert!(
        v.timeline
            .iter()
            .any(|e| matches!(&e.step, Step::Exec { filename } if filename.ends_with("/ptp"))),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_pinned_before_tracing_starts_are_judged_from_their_state() -> Result<()> {
    let node = Netns::new("trnode")?;
    let data = tempfile::tempdir()?;
    let ptp = Ptp {
        node: &node,
        subnet: "10.244.8.0/24".into(),
        data_dir: data.path().to_path_buf(),
    };
    let lo_only = sandbox()?;
    lo_only.ip(&["link", "set", "lo", "up"])?;
    let wired = sandbox()?;
    ptp.run("ADD", wired.name(), &wired.path())?;
    let half = sandbox()?;
    half.ip_batch(&INTERFACE)?;

    let mut t = tracing().await?;
    let (_, v) = t.verdict(t.cookie_of(&wired.path())?, SLACK).await?;
    assert_eq!(v.verdict, Verdict::Networked, "{}", v.reason);
    assert!(v.reason.contains("found set up at"), "{}", v.reason);
    let (_, v) = t
        .verdict(t.cookie_of(&lo_only.path())?, DEADLINE + SLACK)
        .await?;
    assert_eq!(v.verdict, Verdict::Skipped, "{}", v.reason);
    assert!(v.reason.contains("created before tracing"), "{}", v.reason);
    let (_, v) = t
        .verdict(t.cookie_of(&half.path())?, DEADLINE + SLACK)
        .await?;
    assert_eq!(v.verdict, Verdict::Partial, "{}", v.reason);
    ptp.run("DEL", wired.name(), &wired.path())?;
    Ok(())
}

/// A sandbox wired, deleted and its netns destroyed at once, as `podman run --rm` does.
enum Wirer<'a> {
    Ours(&'a [u8]),
    Reference(&'a Ptp<'a>),
}

impl Wirer<'_> {
    fn wire_and_remove(&self, sb: &mut Sandbox) -> Result<()> {
        let path = sb.path();
        match self {
            Wirer::Ours(stdin) => {
                for command in ["ADD", "DEL"] {
                    let out = run_plugin(command, sb.name(), Some(&path), "eth0", stdin)?;
                    if out.code != 0 {
                        bail!("{command} {}: {out:?}", sb.name());
                    }
                }
            }
            Wirer::Reference(ptp) => {
                ptp.run("ADD", sb.name(), &path)?;
                ptp.run("DEL", sb.name(), &path)?;
            }
        }
        sb.delete()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_sandboxes_wired_then_removed_are_networked_with_their_teardown() -> Result<()>
{
    const EACH: usize = 25;
    let mut t = tracing().await?;
    let node = Netns::new("trnode")?;
    let data = tempfile::tempdir()?;
    let ptp = Ptp {
        node: &node,
        subnet: "10.244.9.0/24".into(),
        data_dir: data.path().to_path_buf(),
    };
    let daemon_node = Netns::new("trnode")?;
    let daemon = Daemon::start_with(&daemon_node, None, &["--no-trace"])?;
    let config = conflist("trshort", "1.0.0", &daemon.socket, "10.245.0.0/22", None);
    std::fs::write(
        daemon.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&config)?,
    )?;
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    daemon.wait_ready(Duration::from_secs(10))?;

    let mut cookies = Vec::new();
    for i in 0..2 * EACH {
        let wirer = if i % 2 == 0 {
            Wirer::Ours(&stdin)
        } else {
            Wirer::Reference(&ptp)
        };
        let mut sb = sandbox()?;
        cookies.push((i, t.cookie_of(&sb.path())?));
        wirer.wire_and_remove(&mut sb)?;
    }
    for (i, cookie) in cookies {
        let (_, v) = t.verdict(cookie, DEADLINE + SLACK).await?;
        let text = timeline_text(&v);
        let by = if i % 2 == 0 { "ours" } else { "ptp" };
        assert_eq!(
            v.verdict,
            Verdict::Networked,
            "sandbox {i} ({by}): {}\n{text}",
            v.reason
        );
        assert!(
            v.timeline.iter().any(|e| matches!(
                &e.step,
                Step::Request {
                    op: "deladdr" | "dellink" | "delroute",
                    ..
                }
            )),
            "sandbox {i} ({by}): the teardown is in its timeline:\n{text}"
        );
    }
    Ok(())
}

/// The pod a verdict names: `namespace/name`, or why it is not known.
fn pod_of(v: &NetnsVerdict) -> String {
    match &v.pod {
        Some(PodName::Known { pod, .. }) => pod.qualified_name(),
        Some(other) => other.to_string(),
        None => "no pod (not a sandbox)".into(),
    }
}

/// the loopback-only failure's shape: the runtime pins a namespace and runs only a short-lived plugin
/// for it, with the environment containerd gives its plugins; nobody wires it. The skip names
/// the pod from that environment, read in the kernel at exec (the plugin is long gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_skipped_after_a_runtime_ran_a_plugin_names_the_plugins_pod() -> Result<()> {
    let mut t = tracing().await?;
    let sb = blocking(sandbox).await?;
    let netns = format!("/var/run/netns/{}", sb.name());
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e-lo-only;K8S_POD_NAME=lo-only-0;\
                K8S_POD_INFRA_CONTAINER_ID=4bf982a7deadbeef;K8S_POD_UID=uid-lo-only-0";
    blocking(move || {
        runtime_runs_plugin(
            "loopback",
            None,
            &[
                ("PATH", "/usr/bin:/bin"),
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "4bf982a7deadbeef"),
                ("CNI_NETNS", &netns),
                ("CNI_ARGS", args),
                ("CNI_IFNAME", "lo"),
                ("CNI_PATH", "/opt/cni/bin"),
            ],
        )
    })
    .await?;
    let (_, v) = t
        .verdict(t.cookie_of(&sb.path())?, DEADLINE + SLACK)
        .await?;
    let text = timeline_text(&v);
    assert_eq!(v.verdict, Verdict::Skipped, "{}\n{text}", v.reason);
    let Some(PodName::Known { pod, source }) = &v.pod else {
        panic!("pod not named: {:?}\n{text}", v.pod);
    };
    assert_eq!(pod.qualified_name(), "e2e-lo-only/lo-only-0");
    assert_eq!(pod.uid.as_deref(), Some("uid-lo-only-0"));
    assert_eq!(
        source,
        &PodSource::PluginExec {
            plugin: "loopback".into()
        }
    );
    let line = verdict_lines(&v);
    assert!(
        line.contains(
            "VERDICT SKIPPED pod e2e-lo-only/lo-only-0 (uid uid-lo-only-0, sandbox 4bf982a7, via loopback) netns"
        ),
        "{line}"
    );
    assert!(
        text.contains("CNI ADD by loopback (run by containerd) for pod e2e-lo-only/lo-only-0"),
        "{text}"
    );
    Ok(())
}

/// The reference ptp plugin (and host-local, which it runs) run by hand with the pod in
/// `CNI_ARGS`: a plugin that is not ours names the pod too; one run without names none and
/// the verdict says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_ptp_sandbox_run_by_hand_with_cni_args_is_named() -> Result<()> {
    let mut t = tracing().await?;
    let node = Netns::new("trnode")?;
    let data = tempfile::tempdir()?;
    let ptp = Ptp {
        node: &node,
        subnet: "10.244.9.0/24".into(),
        data_dir: data.path().to_path_buf(),
    };
    let named = sandbox()?;
    let unnamed = sandbox()?;
    ptp.run_with_args(
        "ADD",
        named.name(),
        &named.path(),
        Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=uid-web-0"),
    )?;
    ptp.run_with_args(
        "ADD",
        unnamed.name(),
        &unnamed.path(),
        Some("IgnoreUnknown=1"),
    )?;
    let (_, v) = t
        .verdict(t.cookie_of(&named.path())?, DEADLINE + SLACK)
        .await?;
    let text = timeline_text(&v);
    assert_eq!(v.verdict, Verdict::Networked, "{}\n{text}", v.reason);
    assert_eq!(pod_of(&v), "default/web-0", "{text}");
    assert!(
        text.contains("CNI ADD by ptp") && text.contains("for pod default/web-0"),
        "{text}"
    );
    let (_, v) = t
        .verdict(t.cookie_of(&unnamed.path())?, DEADLINE + SLACK)
        .await?;
    assert_eq!(v.verdict, Verdict::Networked, "{}", v.reason);
    assert_eq!(
        v.pod,
        Some(PodName::Unknown {
            reason: "CNI plugin ptp ran with no K8S_POD_NAME in CNI_ARGS".into()
        }),
        "{}",
        timeline_text(&v)
    );
    Ok(())
}

/// Any user can run a binary named like a runtime's with any environment: a plugin run by a
/// user other than root does not name the pod, and the verdict says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_run_by_another_user_than_root_names_no_pod() -> Result<()> {
    let mut t = tracing().await?;
    let sb = blocking(sandbox).await?;
    let netns = format!("/run/netns/{}", sb.name());
    blocking(move || {
        runtime_runs_plugin(
            "loopback",
            Some(65_534),
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "feedface"),
                ("CNI_NETNS", &netns),
                (
                    "CNI_ARGS",
                    "K8S_POD_NAMESPACE=default;K8S_POD_NAME=not-this-one",
                ),
            ],
        )
    })
    .await?;
    let (_, v) = t
        .verdict(t.cookie_of(&sb.path())?, DEADLINE + SLACK)
        .await?;
    let text = timeline_text(&v);
    assert_eq!(v.verdict, Verdict::Skipped, "{}\n{text}", v.reason);
    assert_eq!(
        v.pod,
        Some(PodName::Unknown {
            reason: "only CNI plugin loopback run by uid 65534, not root, named one".into()
        }),
        "{text}"
    );
    assert!(text.contains("not taken: run by uid 65534"), "{text}");
    Ok(())
}
