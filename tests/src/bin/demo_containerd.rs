//! The real-runtime act of `cargo xtask demo`: containerd (Debian's, with its CRI plugin) in a
//! private "node" namespace, driven over CRI as the kubelet drives it.
//!
//! 1. The loopback-only failure: containerd's conf dir holds a leftover `10-loopback.conf`.
//!    containerd reports NetworkReady, so the kubelet's pod CIDR (CRI UpdateRuntimeConfig) is never
//!    rendered from the `conf_template`, and every pod fails with "failed to find network info for
//!    sandbox". No plugin logs anything; provisioner flags each pod's netns `skipped`, names
//!    containerd and says why.
//! 2. The fix an operator makes: remove the stray file. containerd is not ready any more, renders
//!    the template on the next UpdateRuntimeConfig, provisioner becomes ready from the same
//!    file, and pods come up `networked` with their ADD `confirmed` by the kernel.
//!
//! It runs the `provisioner` binary next to itself (`cargo xtask demo` builds both) and exits
//! non-zero when the story does not hold.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri::{Cri, Pod};
use provisioner_tests::daemon_harness::Daemon;
use provisioner_tests::daemon_queries::{
    allocations, cookie_of, verdict_and_intent, wait_views_created_by, wait_views_of,
};
use provisioner_tests::pod_net::{check_pod_network, wait_node_bare};
use provisioner_tests::{Netns, netns_cookie, wait_until};

/// The node's pod CIDRs, as the kubelet passes them.
const POD_CIDRS: &str = "10.244.9.0/24,fd00:10:244:9::/64";
const PODS: usize = 2;
/// Bound on every wait (a loaded machine, containerd's image import, the kernel watch).
const PATIENCE: Duration = Duration::from_secs(60);
/// What containerd 1.6 names the file it renders from its `conf_template`.
const RENDERED: &str = "10-containerd-net.conflist";

fn announce(what: &str) {
    eprintln!("==> [demo] {what}");
}

fn detail(what: &str) {
    for line in what.lines() {
        eprintln!("    {line}");
    }
}

fn main() -> Result<()> {
    let started = Instant::now();
    announce("the real runtime: containerd with its CRI plugin, driven over CRI like the kubelet");
    let node = Netns::new("ctrd-node")?;
    let daemon = Daemon::start_with(&node, None, &["--trace-deadline", "2"])?;
    daemon.wait_tracing(PATIENCE)?;
    let stray = daemon.conf_dir.join("10-loopback.conf");
    std::fs::write(
        &stray,
        r#"{"cniVersion": "0.4.0", "name": "lo", "type": "loopback"}"#,
    )?;
    let mut containerd = Containerd::start(&node, &CniSetup::deploy_template_for(&daemon)?)?;
    detail(&format!(
        "containerd pid {}, config {}\nconf dir {} (provisioner watches it too), conf_template {}",
        containerd.pid().unwrap_or_default(),
        containerd.config_path().display(),
        containerd.conf_dir.display(),
        containerd
            .template
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string()),
    ));

    loopback_only_failure(&daemon, &mut containerd)?;
    std::fs::remove_file(&stray).with_context(|| format!("remove {}", stray.display()))?;
    let pods = template_path(&daemon, &mut containerd, &node)?;
    teardown(&daemon, &mut containerd, &node, &pods)?;
    containerd.shutdown()?;
    announce(&format!(
        "real runtime done in {:.1} s; containerd stopped, namespaces removed",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The loopback-only config: NetworkReady from a loopback network alone; pods fail; provisioner
/// says why.
fn loopback_only_failure(daemon: &Daemon, containerd: &mut Containerd) -> Result<()> {
    announce("the loopback-only failure: the conf dir holds only a leftover 10-loopback.conf");
    containerd.cri().wait_network_ready(true, PATIENCE)?;
    containerd.cri().update_pod_cidr(POD_CIDRS)?;
    let conditions = containerd.cri().conditions()?;
    detail(&format!(
        "containerd: NetworkReady={} (a loopback network is enough for it), so the kubelet's \
         pod CIDR {POD_CIDRS} was not rendered from the template",
        conditions.network_ready
    ));
    if std::fs::exists(containerd.conf_dir.join(RENDERED))? {
        bail!("containerd rendered its template although a network was loaded");
    }
    show_cli(daemon, &["status"])?;
    for i in 0..PODS {
        let config = Cri::pod_config(&format!("lo-only-{i}"), &containerd.log_dir);
        match containerd.cri().run_pod(&config) {
            Ok(pod) => bail!(
                "RunPodSandbox lo-only-{i} succeeded ({}) without network",
                pod.id
            ),
            Err(status) => detail(&format!("RunPodSandbox lo-only-{i}: {}", status.message())),
        }
    }
    announce("provisioner sandboxes: each pod's netns skipped, with the reason");
    let pid = containerd.pid().unwrap_or_default();
    let views = wait_views_created_by(daemon, pid, PODS, PATIENCE)?;
    for view in &views {
        if view["verdict"]["verdict"] != "skipped" {
            bail!("a failing pod's netns is not skipped: {view:#}");
        }
    }
    show_cli(daemon, &["sandboxes"])?;
    Ok(())
}

/// The fix: containerd renders the template, both become ready, pods are networked.
fn template_path(daemon: &Daemon, containerd: &mut Containerd, node: &Netns) -> Result<Vec<Pod>> {
    announce(
        "the fix: remove the stray file; the kubelet's next UpdateRuntimeConfig renders the template",
    );
    containerd.cri().wait_network_ready(false, PATIENCE)?;
    containerd.cri().update_pod_cidr(POD_CIDRS)?;
    containerd.cri().wait_network_ready(true, PATIENCE)?;
    daemon.wait_ready(PATIENCE)?;
    detail(&format!(
        "containerd rendered {} and is NetworkReady; provisioner is ready from the same file",
        containerd.conf_dir.join(RENDERED).display()
    ));
    let mut pods = Vec::new();
    let mut cookies = HashSet::new();
    for i in 0..PODS {
        let ready = containerd
            .run_ready_pod(&format!("web-{i}"))
            .with_context(|| daemon.log())?;
        check_pod_network(&ready.netns, &ready.ips[0])?;
        node.ping(&ready.ips[0])?;
        detail(&format!(
            "RunPodSandbox web-{i}: SANDBOX_READY, {}, eth0 up, ping from the node answered",
            ready.ips.join(" ")
        ));
        cookies.insert(netns_cookie(&ready.netns)?);
        pods.push(ready.pod);
    }
    announce("provisioner sandboxes: networked, and each ADD confirmed by the kernel");
    wait_views_of(daemon, &cookies, true, PATIENCE)?;
    wait_until("every pod networked+confirmed", PATIENCE, || {
        let answer = daemon.sandboxes()?;
        let done = answer["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| cookie_of(v).is_some_and(|c| cookies.contains(&c)))
            .filter(|v| verdict_and_intent(v) == "networked+confirmed")
            .count();
        Ok((done == cookies.len()).then_some(()))
    })
    .with_context(|| format!("{:#}", daemon.sandboxes().unwrap_or_default()))?;
    show_cli(daemon, &["sandboxes"])?;
    Ok(pods)
}

/// Stop and Remove (two DELs, the second without a netns): nothing left.
fn teardown(
    daemon: &Daemon,
    containerd: &mut Containerd,
    node: &Netns,
    pods: &[Pod],
) -> Result<()> {
    announce("StopPodSandbox + RemovePodSandbox: nothing left");
    for pod in pods {
        containerd.cri().stop_pod(&pod.id)?;
        containerd.cri().remove_pod(&pod.id)?;
    }
    let left = allocations(daemon)?;
    if !left.is_empty() {
        bail!("allocations left after RemovePodSandbox: {left:?}");
    }
    wait_node_bare(node, PATIENCE)?;
    detail("no allocation, no veth or route on the node");
    Ok(())
}

fn show_cli(daemon: &Daemon, args: &[&str]) -> Result<()> {
    eprintln!("    $ provisioner {}", args.join(" "));
    let out = daemon.cli(args)?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        eprintln!("      {line}");
    }
    Ok(())
}
