//! The daemon's kernel watch: its own ADDs confirmed by the kernel, drift reported.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use provisioner_tests::Netns;
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use serde_json::Value;

fn sandboxes(daemon: &Daemon) -> Result<Value> {
    let out = daemon.cli(&["sandboxes", "--json"])?;
    if !out.status.success() {
        bail!("sandboxes: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn cookie_of(view: &Value) -> Option<u64> {
    view["verdict"]["netns"]["cookie"]
        .as_u64()
        .or_else(|| view["intent"]["intent"]["netns_cookie"].as_u64())
}

/// Verdict and intent status of each of `cookies`, once all have both (bounded wait).
fn wait_verdicts(daemon: &Daemon, cookies: &HashSet<u64>) -> Result<Vec<Value>> {
    let started = Instant::now();
    loop {
        let answer = sandboxes(daemon)?;
        if let Some(reason) = answer["tracing_unavailable"].as_str() {
            bail!("tracing unavailable: {reason}");
        }
        let ours: Vec<Value> = answer["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| cookie_of(v).is_some_and(|c| cookies.contains(&c)))
            .filter(|v| !v["verdict"].is_null() && !v["intent"].is_null())
            .cloned()
            .collect();
        if ours.len() == cookies.len() {
            return Ok(ours);
        }
        if started.elapsed() > Duration::from_secs(20) {
            bail!(
                "{} of {} sandboxes have a verdict and an intent status\n{}",
                ours.len(),
                cookies.len(),
                daemon.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn daemon_adds_are_networked_and_confirmed() -> Result<()> {
    const N: usize = 200;
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with(&node, None, &["--trace-deadline", "1"])?;
    let mut config = conflist("trnet", "1.0.0", &daemon.socket, "10.254.0.0/22", None);
    config["plugins"][0]["socket"] = Value::from(daemon.socket.display().to_string());
    std::fs::write(
        daemon.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&config)?,
    )?;
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    // The tracer loads in the background: ADDs made before it is attached cannot be confirmed.
    let loading = Instant::now();
    while !sandboxes(&daemon)?["tracing_unavailable"].is_null() {
        if loading.elapsed() > Duration::from_secs(10) {
            bail!("kernel tracing did not start: {}", sandboxes(&daemon)?);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pods: Vec<Netns> = (0..N).map(|_| Netns::new("trp")).collect::<Result<_>>()?;
    let started = Instant::now();
    for (i, pod) in pods.iter().enumerate() {
        loop {
            let add = run_plugin("ADD", &format!("tr-{i}"), Some(pod.path()), "eth0", &stdin)?;
            if add.code == 0 {
                break;
            }
            if add.error_code() != Some(11) || started.elapsed() > Duration::from_secs(10) {
                bail!("ADD tr-{i}: {add:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let cookies: HashSet<u64> = pods.iter().map(Netns::cookie).collect::<Result<_>>()?;
    let views = wait_verdicts(&daemon, &cookies)?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for view in &views {
        let verdict = view["verdict"]["verdict"].as_str().unwrap_or("none");
        let status = view["intent"]["status"].as_str().unwrap_or("none");
        *counts.entry(format!("{verdict}+{status}")).or_default() += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([("networked+confirmed".to_owned(), N)]),
        "{views:#?}"
    );

    // Someone deletes the default route of a provisioned sandbox: drift.
    pods[0].ip(&["route", "del", "default"])?;
    let cookie = pods[0].cookie()?;
    let started = Instant::now();
    loop {
        let answer = sandboxes(&daemon)?;
        let drifted = answer["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| {
                cookie_of(v) == Some(cookie)
                    && v["drifts"].as_array().is_some_and(|d| !d.is_empty())
            });
        if drifted {
            break;
        }
        if started.elapsed() > Duration::from_secs(5) {
            bail!("no drift reported after the default route was removed: {answer}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let human = daemon.cli(&["sandboxes"])?;
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("container tr-0") && text.contains("DRIFT"),
        "{text}"
    );
    for (i, pod) in pods.iter().enumerate() {
        assert_eq!(
            run_plugin("DEL", &format!("tr-{i}"), Some(pod.path()), "eth0", &stdin)?.code,
            0
        );
    }
    Ok(())
}
