//! The loopback-only failure (containerd/cri#1033) with the real runtime: containerd creates pod
//! namespaces and never calls a network plugin for them. provisioner's kernel watch flags every one
//! `skipped`, naming containerd as the creator, and says why: the conf dir containerd reads (from
//! containerd's own config) and what it holds. Each skip names the pod RunPodSandbox was called
//! for, from the environment of the plugin containerd ran for it (read in the kernel at exec), or
//! says why the pod is not known; never a wrong pod.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri::Cri;
use provisioner_tests::daemon_harness::Daemon;
use provisioner_tests::daemon_queries::{pod_of_view, wait_views_created_by};
use provisioner_tests::{Netns, scaled_secs};
use serde_json::Value;

const PODS: usize = 5;

/// Runs `PODS` pods that must all fail with `expected_error`; returns the kernel watch's views
/// of the namespaces containerd created meanwhile.
fn failing_pods(
    daemon: &Daemon,
    containerd: &mut Containerd,
    expected_error: &str,
) -> Result<Vec<Value>> {
    for i in 0..PODS {
        let config = Cri::pod_config(&format!("lo-only-{i}"), &containerd.log_dir);
        match containerd.cri().run_pod(&config) {
            Ok(pod) => bail!(
                "RunPodSandbox lo-only-{i} succeeded ({}) without a network",
                pod.id
            ),
            Err(status) => assert!(
                status.message().contains(expected_error),
                "lo-only-{i}: {status}"
            ),
        }
    }
    let pid = containerd.pid().unwrap_or_default();
    let views = wait_views_created_by(daemon, pid, PODS, Duration::from_secs(30))?;
    assert_eq!(views.len(), PODS, "one namespace per pod: {views:#?}");
    Ok(views)
}

/// Every view is a skip by containerd, diagnosed: which plugins ran (`ran`), the conf dir
/// containerd reads (from its own config) and `content`, what that dir holds.
fn assert_skipped_by_containerd(
    views: &[Value],
    containerd: &Containerd,
    ran: &str,
    content: &str,
) {
    let reads = reads(containerd);
    for view in views {
        assert_eq!(view["verdict"]["verdict"], "skipped", "{view:#}");
        assert_eq!(view["verdict"]["creator"]["comm"], "containerd", "{view:#}");
        assert!(view["intent"].is_null(), "{view:#}");
        let diagnosis = view["verdict"]["diagnosis"].as_str().unwrap_or_default();
        for part in [ran, &reads, content] {
            assert!(
                diagnosis.contains(part),
                "diagnosis lacks {part:?}: {diagnosis}"
            );
        }
    }
}

/// How a diagnosis names the conf dir containerd reads, from containerd's own config.
fn reads(containerd: &Containerd) -> String {
    format!(
        "containerd reads CNI networks from {} (per containerd's config {})",
        containerd.conf_dir.display(),
        containerd.config_path().display()
    )
}

/// `provisioner why default/lo-only-0`, as an operator asks after `kubectl describe pod` showed
/// the pod's failure: the explanation of the sandbox this test's containerd created (the
/// node may hold sandboxes of a pod of that name from another containerd: they are told apart
/// by their creator's pid), checked for the pod it names (`named by ...`), the SKIPPED verdict
/// with its creator, a timeline and the diagnosis naming the conf dir containerd reads.
fn why_first_pod(
    daemon: &Daemon,
    containerd: &Containerd,
    views: &[Value],
    named_by: &str,
) -> Result<String> {
    let view = views
        .iter()
        .find(|v| named_pod(v).as_deref() == Ok("default/lo-only-0"))
        .context("a view of default/lo-only-0")?;
    let pod = pod_of_view(view).with_context(|| format!("the view names no pod: {view:#}"))?;
    let out = daemon.cli(&["why", "--json", "default/lo-only-0"])?;
    ensure!(out.status.success(), "why default/lo-only-0: {out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).context("why --json")?;
    let pid = containerd.pid().context("containerd's pid")?;
    let creator = format!("created by containerd (pid {pid},");
    let said = answer["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|s| s.contains(&creator))
        .with_context(|| format!("no sandbox {creator}...: {answer:#}"))?
        .to_owned();
    let head = format!("pod {pod}, named by {named_by}\n  verdict: SKIPPED (netns cookie=");
    assert!(said.starts_with(&head), "{head:?} expected:\n{said}");
    assert!(said.contains("\n  timeline:\n"), "{said}");
    assert!(said.contains(" netns created ("), "{said}");
    let diagnosis = said
        .split_once("\n  diagnosis: ")
        .map(|(_, d)| d)
        .with_context(|| format!("no diagnosis: {said}"))?;
    assert!(
        diagnosis.starts_with("no CNI plugin set its network up: "),
        "{diagnosis}"
    );
    assert!(diagnosis.contains(&reads(containerd)), "{diagnosis}");
    eprintln!("provisioner why default/lo-only-0:\n{said}");
    Ok(said)
}

/// The pods `failing_pods` asked for: `default/lo-only-0`, ...
fn failing_pod_names() -> Vec<String> {
    (0..PODS).map(|i| format!("default/lo-only-{i}")).collect()
}

/// The pod a view's verdict names (`namespace/name`), checked against its uid; `Err` with the
/// reason when it names none.
fn named_pod(view: &Value) -> Result<String, String> {
    let pod = &view["verdict"]["pod"];
    match pod["status"].as_str() {
        Some("known") => {
            let (namespace, name) = (
                pod["pod"]["namespace"].as_str().unwrap_or_default(),
                pod["pod"]["name"].as_str().unwrap_or_default(),
            );
            assert_eq!(
                pod["pod"]["uid"].as_str(),
                Some(format!("uid-{name}").as_str()),
                "{view:#}"
            );
            Ok(format!("{namespace}/{name}"))
        }
        Some("unknown") => Err(pod["reason"].as_str().unwrap_or_default().to_owned()),
        _ => panic!("a sandbox's verdict names its pod or why not: {view:#}"),
    }
}

/// A conf dir for containerd alone: the daemon watches another, so the diagnosis must come
/// from containerd's own config.
fn containerd_conf_dir(files: &[(&str, &str)]) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content)?;
    }
    Ok(dir)
}

#[test]
fn loopback_only_conf_dir_network_ready_but_pods_skipped() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with(&node, None, &["--trace-deadline", &scaled_secs(2.0)])?;
    daemon.wait_tracing(Duration::from_secs(30))?;
    let conf_dir = containerd_conf_dir(&[(
        "10-loopback.conf",
        r#"{"cniVersion": "0.4.0", "name": "lo", "type": "loopback"}"#,
    )])?;
    let mut containerd = Containerd::start(&node, &CniSetup::reading(conf_dir.path()))?;
    // The lie at the root of the loopback-only failure: a loopback network is enough for NetworkReady.
    containerd
        .cri()
        .wait_network_ready(true, Duration::from_secs(10))?;
    let views = failing_pods(
        &daemon,
        &mut containerd,
        "failed to find network info for sandbox",
    )?;
    // containerd runs its own `cni-loopback` network for every pod.
    assert_skipped_by_containerd(
        &views,
        &containerd,
        "only the loopback plugin ran for it",
        "holds only 10-loopback.conf (type loopback): the runtime has no network to call",
    );
    // ... and hands the loopback plugin the pod: every skip names its own pod, though the
    // namespace was gone within ~30 ms.
    let mut named: Vec<String> = views
        .iter()
        .map(|view| named_pod(view).unwrap_or_else(|why| panic!("pod unknown ({why}): {view:#}")))
        .collect();
    named.sort();
    assert_eq!(
        named,
        failing_pod_names(),
        "one skip per pod, each naming its own"
    );
    for view in &views {
        assert_eq!(
            view["verdict"]["pod"]["source"]["plugin"], "loopback",
            "{view:#}"
        );
    }
    let said = why_first_pod(
        &daemon,
        &containerd,
        &views,
        "the environment of CNI plugin loopback",
    )?;
    assert!(
        said.contains("CNI ADD by loopback (run by containerd) for pod default/lo-only-0 (uid"),
        "the plugin's call in the timeline:\n{said}"
    );
    assert!(
        said.contains("holds only 10-loopback.conf (type loopback)"),
        "{said}"
    );
    containerd.shutdown()
}

#[test]
fn empty_conf_dir_pods_skipped() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with(&node, None, &["--trace-deadline", &scaled_secs(2.0)])?;
    daemon.wait_tracing(Duration::from_secs(30))?;
    let conf_dir = containerd_conf_dir(&[])?;
    let mut containerd = Containerd::start(&node, &CniSetup::reading(conf_dir.path()))?;
    let conditions = containerd.cri().conditions()?;
    assert!(!conditions.network_ready, "{conditions:?}");
    assert!(
        conditions
            .network_message
            .contains("cni plugin not initialized"),
        "{conditions:?}"
    );
    let views = failing_pods(&daemon, &mut containerd, "cni plugin not initialized")?;
    assert_skipped_by_containerd(
        &views,
        &containerd,
        "no CNI plugin binary was executed for it",
        "holds no network file: the runtime has no network to call",
    );
    // No plugin ran: the daemon asked containerd over CRI (its socket found from containerd's
    // command line), and each netns is named after the pod RunPodSandbox was called for.
    let mut named = Vec::new();
    for view in &views {
        let pod = named_pod(view).unwrap_or_else(|why| panic!("pod unknown ({why}): {view:#}"));
        assert_eq!(
            view["verdict"]["pod"]["source"]["by"].as_str(),
            Some("cri"),
            "{view:#}"
        );
        named.push(pod);
    }
    named.sort();
    assert_eq!(named, failing_pod_names(), "each pod named once");
    let said = why_first_pod(&daemon, &containerd, &views, "containerd over CRI")?;
    assert!(said.contains("holds no network file"), "{said}");
    assert!(
        !said.contains("CNI ADD"),
        "no plugin ran, none is in the timeline:\n{said}"
    );
    containerd.shutdown()
}
