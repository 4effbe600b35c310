//! The daemon's kernel watch: its own ADDs confirmed by the kernel (also those that arrive
//! before tracing attached), the sandboxes already there audited at restart, drift reported,
//! and a late network revising an alarm.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::daemon_queries::{
    container_of, cookie_of, log_lines_about, views_of_containers, views_where,
};
use provisioner_tests::{Netns, NetnsCookie, RuntimeNetns, scaled_secs, wait_until};
use serde_json::Value;

/// Bound on the waits for the watch's answers (a loaded machine, a state read).
const PATIENCE: Duration = Duration::from_secs(30);

/// The daemon's views kept by `key_of` under one of `keys`, once `done` holds for every one of
/// them (bounded wait).
fn wait_keyed<K: std::hash::Hash + Eq + Clone>(
    daemon: &Daemon,
    keys: &HashSet<K>,
    key_of: impl Fn(&Value) -> Option<K>,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<HashMap<K, Value>> {
    let mut last = HashMap::new();
    let waited = wait_until(what, PATIENCE, || {
        last = views_where(daemon, |v| key_of(v).is_some_and(|k| keys.contains(&k)))?
            .into_iter()
            .filter_map(|v| Some((key_of(&v)?, v)))
            .collect();
        Ok((last.len() == keys.len() && last.values().all(&done)).then(|| last.clone()))
    });
    waited.with_context(|| {
        format!(
            "views: {:#?}\nlog:\n{}",
            last.values().collect::<Vec<_>>(),
            daemon.log()
        )
    })
}

/// The daemon's views of `cookies`, once `done` holds for every one of them (bounded wait).
fn wait_views(
    daemon: &Daemon,
    cookies: &HashSet<u64>,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<HashMap<u64, Value>> {
    wait_keyed(daemon, cookies, cookie_of, what, done)
}

/// The daemon's views of the sandboxes of `containers` (the same to the test and to the daemon
/// on every kernel), once `done` holds for every one of them (bounded wait).
fn wait_sandboxes(
    daemon: &Daemon,
    containers: &HashSet<String>,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<HashMap<String, Value>> {
    wait_keyed(
        daemon,
        containers,
        |v| container_of(v).map(str::to_owned),
        what,
        done,
    )
}

/// `prefix-0`, `prefix-1`, ...: the container ids of `n` sandboxes.
fn containers(prefix: &str, n: usize) -> HashSet<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn verdict(view: &Value) -> &str {
    view["verdict"]["verdict"].as_str().unwrap_or("none")
}

fn intent_status(view: &Value) -> &str {
    view["intent"]["status"].as_str().unwrap_or("none")
}

fn networked_and_confirmed(view: &Value) -> bool {
    verdict(view) == "networked" && intent_status(view) == "confirmed"
}

/// Every report a view kept, as one text.
fn reports_text(view: &Value) -> String {
    view["text"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join("\n")
}

/// No alarm was ever raised on these views.
fn assert_no_alarm<K>(views: &HashMap<K, Value>) {
    for view in views.values() {
        let text = reports_text(view);
        for alarm in ["SKIPPED", "PARTIAL", "FAILED", "UNKNOWN", "UNCONFIRMED"] {
            assert!(
                !text.contains(alarm),
                "{alarm} raised on a healthy sandbox:\n{text}"
            );
        }
    }
}

/// No skip of the sandboxes of `views` was warned about, nor revised (the kernel watch sees
/// the whole node: the log's lines about other runtimes' sandboxes are not the test's).
fn assert_not_warned_about<K>(daemon: &Daemon, views: &HashMap<K, Value>) {
    let cookies: HashSet<u64> = views.values().filter_map(cookie_of).collect();
    let log = daemon.log();
    let warned: Vec<&str> = log_lines_about(&log, &cookies)
        .filter(|l| l.contains("SKIPPED"))
        .collect();
    assert!(
        warned.is_empty(),
        "a healthy sandbox was warned about:\n{}",
        warned.join("\n")
    );
}

/// A daemon of network `name` on `subnet` with a 1 s trace deadline, once its tracing is
/// attached, and the plugin stdin for that network.
fn traced_daemon(node: &Netns, name: &str, subnet: &str) -> Result<(Daemon, Vec<u8>)> {
    let daemon =
        Daemon::start_with_conflist(node, &["--trace-deadline", &scaled_secs(1.0)], |socket| {
            conflist(name, "1.0.0", socket, subnet, None)
        })?;
    let config = conflist(name, "1.0.0", &daemon.socket, subnet, None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    daemon.wait_tracing(PATIENCE)?;
    Ok((daemon, stdin))
}

fn add(container: &str, netns: &Path, stdin: &[u8]) -> Result<()> {
    wait_until(&format!("ADD {container}"), PATIENCE, || {
        let out = run_plugin("ADD", container, Some(netns), "eth0", stdin)?;
        match (out.code, out.error_code()) {
            (0, _) => Ok(Some(())),
            // Not listening or not ready yet: a runtime retries.
            (_, Some(11)) => Ok(None),
            _ => bail!("ADD {container}: {out:?}"),
        }
    })
}

fn del(container: &str, netns: Option<&Path>, stdin: &[u8]) -> Result<()> {
    let out = run_plugin("DEL", container, netns, "eth0", stdin)?;
    if out.code != 0 {
        bail!("DEL {container}: {out:?}");
    }
    Ok(())
}

#[test]
fn adds_arriving_before_tracing_attached_are_networked_and_confirmed() -> Result<()> {
    const N: usize = 20;
    let node = Netns::new("node")?;
    let pods: Vec<Netns> = (0..N).map(|_| Netns::new("trp")).collect::<Result<_>>()?;
    let cookies: HashSet<u64> = pods.iter().map(Netns::cookie).collect::<Result<_>>()?;
    let dir = tempfile::tempdir()?;
    // The ADDs are fired first: they retry until the daemon answers, as a runtime does after
    // a node reboot, and so arrive within the daemon's first moments, before its programs attach.
    let socket_link = dir.path().join("socket");
    let config = conflist("trearly", "1.0.0", &socket_link, "10.254.4.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let daemon = std::thread::scope(|scope| -> Result<Daemon> {
        let adders: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let stdin = &stdin;
                scope.spawn(move || add(&format!("early-{i}"), pod.path(), stdin))
            })
            .collect();
        let daemon = Daemon::start_with_conflist(
            &node,
            &["--trace-deadline", &scaled_secs(1.0)],
            |socket| {
                let _ = std::os::unix::fs::symlink(socket, &socket_link);
                conflist("trearly", "1.0.0", &socket_link, "10.254.4.0/24", None)
            },
        )?;
        for adder in adders {
            adder
                .join()
                .map_err(|_| anyhow::anyhow!("ADD thread panicked"))??;
        }
        Ok(daemon)
    })?;
    let views = wait_views(
        &daemon,
        &cookies,
        "every early sandbox networked and confirmed",
        networked_and_confirmed,
    )?;
    let from_state = views
        .values()
        .filter(|v| v["intent"]["evidence"]["by"] == "snapshot")
        .count();
    eprintln!(
        "{from_state} of {N} ADDs were done before tracing attached (confirmed from their state)"
    );
    assert_no_alarm(&views);
    assert_not_warned_about(&daemon, &views);
    for (i, pod) in pods.iter().enumerate() {
        del(&format!("early-{i}"), Some(pod.path()), &stdin)?;
    }
    Ok(())
}

#[test]
fn daemon_adds_are_networked_and_confirmed_and_drift_names_what_was_removed() -> Result<()> {
    const N: usize = 200;
    let node = Netns::new("node")?;
    let (daemon, stdin) = traced_daemon(&node, "trnet", "10.254.0.0/22")?;
    // All namespaces first, then one ADD after another: late ADDs must not be judged on how
    // long the earlier ones took.
    let pods: Vec<Netns> = (0..N).map(|_| Netns::new("trp")).collect::<Result<_>>()?;
    for (i, pod) in pods.iter().enumerate() {
        add(&format!("tr-{i}"), pod.path(), &stdin)?;
    }
    let sandboxes = containers("tr", N);
    let views = wait_sandboxes(
        &daemon,
        &sandboxes,
        "every sandbox networked and confirmed",
        networked_and_confirmed,
    )?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for view in views.values() {
        *counts
            .entry(format!("{}+{}", verdict(view), intent_status(view)))
            .or_default() += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("networked+confirmed".to_owned(), N)])
    );
    assert_no_alarm(&views);

    // Someone deletes the default route of a provisioned sandbox: drift, naming the route.
    pods[0].ip(&["route", "del", "default"])?;
    let drifted = wait_sandboxes(
        &daemon,
        &HashSet::from(["tr-0".to_owned()]),
        "a drift naming the default route",
        |v| {
            v["drifts"].as_array().into_iter().flatten().any(|d| {
                d["what"]
                    .as_str()
                    .is_some_and(|w| w.contains("route 0.0.0.0/0 via 10.254.0.1"))
            })
        },
    )?;
    let text = String::from_utf8_lossy(&daemon.cli(&["sandboxes"])?.stdout).into_owned();
    assert!(
        text.contains("container tr-0")
            && text.contains("DRIFT")
            && text.contains("route 0.0.0.0/0"),
        "{text}\n{drifted:?}"
    );
    // Our own DEL is teardown, not drift.
    for (i, pod) in pods.iter().enumerate() {
        del(&format!("tr-{i}"), Some(pod.path()), &stdin)?;
    }
    let views = views_of_containers(&daemon, &sandboxes)?;
    let drifts_after: usize = views
        .iter()
        .map(|v| v["drifts"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(
        drifts_after, 1,
        "only the deleted route drifted: {views:#?}"
    );
    // After DEL a view is history: removed by DEL, naming the addresses it released (the
    // marking happens before the DEL answers: no wait).
    for view in &views {
        let allocated = view["intent"]["intent"]["addresses"][0]
            .as_str()
            .unwrap_or_default();
        assert_eq!(view["removed"]["by"], "del", "{view}");
        assert_eq!(
            view["removed"]["addresses"],
            serde_json::json!([allocated]),
            "{view}"
        );
    }
    let text = String::from_utf8_lossy(&daemon.cli(&["sandboxes"])?.stdout).into_owned();
    assert!(
        text.lines().any(|l| l.starts_with("container tr-0: ")
            && l.contains("REMOVED container tr-0 (eth0) by DEL")),
        "{text}"
    );
    Ok(())
}

/// An ADD's intent is confirmed by what the trace saw of its requests, as they happen: not by a
/// read of the namespace's state at the deadline (which is 60 s here, beyond every wait).
#[test]
fn daemon_adds_are_confirmed_from_the_trace_before_their_deadline() -> Result<()> {
    const N: usize = 5;
    let node = Netns::new("node")?;
    let daemon =
        Daemon::start_with_conflist(&node, &["--trace-deadline", &scaled_secs(60.0)], |socket| {
            conflist("trnow", "1.0.0", socket, "10.253.0.0/24", None)
        })?;
    let config = conflist("trnow", "1.0.0", &daemon.socket, "10.253.0.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    daemon.wait_tracing(PATIENCE)?;
    let pods: Vec<Netns> = (0..N).map(|_| Netns::new("trn")).collect::<Result<_>>()?;
    for (i, pod) in pods.iter().enumerate() {
        add(&format!("trn-{i}"), pod.path(), &stdin)?;
    }
    let views = wait_sandboxes(
        &daemon,
        &containers("trn", N),
        "every intent confirmed",
        |v| intent_status(v) == "confirmed",
    )?;
    for view in views.values() {
        assert_eq!(view["intent"]["evidence"]["by"], "trace", "{view:#}");
    }
    assert_no_alarm(&views);
    Ok(())
}

/// How the daemon goes down before its restart.
#[derive(Clone, Copy, Debug)]
enum Down {
    Sigterm,
    Sigkill,
}

fn restart_audits_live_sandboxes(down: Down) -> Result<()> {
    const N: usize = 30;
    let node = Netns::new("node")?;
    let mut daemon = Daemon::start_with_conflist(&node, &[], |socket| {
        conflist("traudit", "1.0.0", socket, "10.254.8.0/24", None)
    })?;
    let config = conflist("traudit", "1.0.0", &daemon.socket, "10.254.8.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let mut pods: Vec<Netns> = (0..N).map(|_| Netns::new("tra")).collect::<Result<_>>()?;
    for (i, pod) in pods.iter().enumerate() {
        add(&format!("audit-{i}"), pod.path(), &stdin)?;
    }
    let gone_address = daemon
        .cli(&["list", "--json"])
        .ok()
        .and_then(|out| serde_json::from_slice::<Value>(&out.stdout).ok())
        .and_then(|list| {
            list.as_array()?
                .iter()
                .find(|a| a["container_id"] == "audit-1")
                .map(|a| a["addresses"][0].as_str().unwrap_or_default().to_owned())
        })
        .context("audit-1's address in `provisioner list`")?;
    match down {
        Down::Sigterm => {
            daemon.stop_status()?;
        }
        Down::Sigkill => daemon.kill()?,
    }
    // While it is down: one sandbox loses its default route, another its namespace.
    pods[0].ip(&["route", "del", "default"])?;
    pods[1].delete()?;
    // The kernel destroys a namespace after its last reference goes, asynchronously: while the
    // daemon is down, audit-1's veth pair goes with it.
    let gone_veth = provisioner::dataplane::host_ifname("audit-1", "eth0");
    wait_until(
        &format!("{gone_veth} gone with its namespace"),
        Duration::from_secs(10),
        || Ok((!node.links()?.contains(&gone_veth)).then_some(())),
    )?;
    daemon.restart(&node, &[])?;

    let live: HashSet<String> = (0..N)
        .filter(|i| *i != 1)
        .map(|i| format!("audit-{i}"))
        .collect();
    let views = wait_sandboxes(&daemon, &live, "every live sandbox audited", |v| {
        intent_status(v) != "none"
    })?;
    for (container, view) in &views {
        if container == "audit-0" {
            assert_eq!(intent_status(view), "drifted", "{view:#}");
            let drifts: Vec<&str> = view["drifts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d["what"].as_str())
                .collect();
            assert!(
                drifts
                    .iter()
                    .any(|d| d.contains("route 0.0.0.0/0 via 10.254.8.1")),
                "{drifts:?}"
            );
        } else {
            assert_eq!(intent_status(view), "confirmed", "{view:#}");
            assert_eq!(view["intent"]["evidence"]["by"], "snapshot", "{view:#}");
        }
    }
    let confirmed: HashSet<String> = live.into_iter().filter(|c| c != "audit-0").collect();
    let views = wait_sandboxes(&daemon, &confirmed, "found set up: networked", |v| {
        verdict(v) == "networked"
    })?;
    assert_no_alarm(&views);

    let answer = daemon.sandboxes()?;
    let absent = answer["absent"].as_array().cloned().unwrap_or_default();
    assert!(
        absent.iter().any(|a| a["container_id"] == "audit-1"
            && a["what"].as_str().is_some_and(|w| w.contains("netns gone"))),
        "{answer:#}"
    );
    let list = String::from_utf8_lossy(&daemon.cli(&["list"])?.stdout).into_owned();
    assert!(
        !list.contains("audit-1 "),
        "released by reconciliation: {list}"
    );
    assert!(
        !list.contains(&gone_address),
        "{gone_address} released: {list}"
    );
    for (i, pod) in pods.iter().enumerate() {
        del(&format!("audit-{i}"), (i != 1).then(|| pod.path()), &stdin)?;
    }
    Ok(())
}

#[test]
fn restart_after_sigterm_audits_live_sandboxes() -> Result<()> {
    restart_audits_live_sandboxes(Down::Sigterm)
}

#[test]
fn restart_after_sigkill_audits_live_sandboxes() -> Result<()> {
    restart_audits_live_sandboxes(Down::Sigkill)
}

#[test]
fn network_after_the_deadline_revises_the_skip_in_the_timeline_and_the_log() -> Result<()> {
    let node = Netns::new("node")?;
    let (daemon, stdin) = traced_daemon(&node, "trlate", "10.254.12.0/24")?;
    // A runtime creates the sandbox and calls its plugin only after the deadline.
    let sandbox = RuntimeNetns::new("cni-late")?;
    let path = sandbox.path();
    let cookie = sandbox.cookie()?;
    let cookies = HashSet::from([cookie]);
    let skipped = wait_views(&daemon, &cookies, "the skip", |v| verdict(v) == "skipped")?;
    let diagnosis = skipped[&cookie]["verdict"]["diagnosis"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        diagnosis.contains("no CNI plugin binary was executed for it")
            && diagnosis.contains(&daemon.conf_dir.display().to_string())
            && diagnosis.contains("network trlate from 10-provisioner.conflist (type provisioner)"),
        "the skip says why: {diagnosis}"
    );
    add("late-1", &path, &stdin)?;
    let views = wait_views(
        &daemon,
        &cookies,
        "the late network",
        networked_and_confirmed,
    )?;
    let view = &views[&cookie];
    assert_eq!(view["verdict"]["revises"], "skipped", "{view:#}");
    assert!(view["verdict"]["late_ms"].as_u64().is_some(), "{view:#}");
    let steps: Vec<&str> = view["verdict"]["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["verdict"].as_str())
        .collect();
    assert_eq!(
        steps,
        ["skipped", "networked"],
        "both verdicts in the timeline: {view:#}"
    );
    let log = daemon.log();
    assert!(log.contains("VERDICT SKIPPED"), "{log}");
    assert!(
        log.contains("resolving the earlier SKIPPED warning"),
        "{log}"
    );
    del("late-1", Some(&path), &stdin)?;
    Ok(())
}

/// eBPF programs and links process `pid` holds (its descriptors that are
/// `anon_inode:bpf-prog` or `anon_inode:bpf_link`).
fn bpf_programs_and_links(pid: u32) -> Result<usize> {
    let mut held = 0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // A descriptor closed between the listing and the read is not held any more.
        if let Ok(target) = std::fs::read_link(fd?.path())
            && matches!(
                target.to_string_lossy().as_ref(),
                "anon_inode:bpf-prog" | "anon_inode:bpf_link"
            )
        {
            held += 1;
        }
    }
    Ok(held)
}

#[test]
fn a_paused_watch_holds_no_program_and_audits_what_was_wired_meanwhile_once_resumed() -> Result<()>
{
    let node = Netns::new("node")?;
    let (daemon, stdin) = traced_daemon(&node, "trpause", "10.254.8.0/24")?;
    let pid = daemon.pid().context("the daemon's pid")?;
    assert!(
        bpf_programs_and_links(pid)? > 0,
        "tracing, yet no program attached"
    );

    let off = daemon.cli(&["kernel-watch", "off"])?;
    assert!(off.status.success(), "kernel-watch off: {off:?}");
    // Detached by the time the answer came: no wait.
    assert_eq!(
        bpf_programs_and_links(pid)?,
        0,
        "paused, yet programs still attached"
    );
    let paused = daemon.sandboxes()?;
    assert!(
        paused["tracing_unavailable"]
            .as_str()
            .is_some_and(|why| why.contains("paused")),
        "{paused}"
    );

    // Wired while nothing watched.
    let pod = Netns::new("trp")?;
    add("paused-0", pod.path(), &stdin)?;
    let on = daemon.cli(&["kernel-watch", "on"])?;
    assert!(on.status.success(), "kernel-watch on: {on:?}");
    daemon.wait_tracing(PATIENCE)?;
    assert!(
        bpf_programs_and_links(pid)? > 0,
        "resumed, yet no program attached"
    );
    let views = wait_views(
        &daemon,
        &HashSet::from([pod.cookie()?]),
        "the sandbox wired while paused, networked and confirmed",
        networked_and_confirmed,
    )?;
    assert_no_alarm(&views);
    assert_not_warned_about(&daemon, &views);
    del("paused-0", Some(pod.path()), &stdin)?;
    Ok(())
}
