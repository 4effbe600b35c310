//! The CLI as an operator uses it: in-process add/check/del, render-config, the metrics endpoint.

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::{Netns, provisioner_bin, wait_only_lo, wait_until};
use serde_json::Value;

/// Runs the binary inside `node` (as an operator on the node would), returning stdout.
fn in_node(node: &Netns, args: &[&str]) -> Result<std::process::Output> {
    let bin = provisioner_bin();
    let mut full = vec![
        "netns",
        "exec",
        node.name(),
        bin.to_str().unwrap_or_default(),
    ];
    full.extend_from_slice(args);
    Ok(Command::new(testkit::tools::IP.require()?)
        .args(&full)
        .output()?)
}

#[test]
fn in_process_add_check_del() -> Result<()> {
    let node = Netns::new("node")?;
    let pod = Netns::new("pod")?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("net.conflist");
    let data = dir.path().join("data");
    std::fs::write(
        &config,
        serde_json::to_vec(&conflist(
            "clinet",
            "1.0.0",
            &dir.path().join("s"),
            "10.253.1.0/24",
            Some("fd00:253:1::/64"),
        ))?,
    )?;
    let (config, data, netns) = (
        config.to_str().unwrap_or_default(),
        data.to_str().unwrap_or_default(),
        pod.path().to_str().unwrap_or_default(),
    );
    let common = [
        "--config",
        config,
        "--data-dir",
        data,
        "--container-id",
        "c1",
        "--netns",
        netns,
    ];

    let pod_args = "K8S_POD_NAMESPACE=cli;K8S_POD_NAME=web-0;K8S_POD_UID=u-cli-0";
    let add = in_node(
        &node,
        &[&["add", "--json", "--cni-args", pod_args][..], &common[..]].concat(),
    )?;
    ensure!(
        add.status.success(),
        "add: {}",
        String::from_utf8_lossy(&add.stderr)
    );
    let result: Value = serde_json::from_slice(&add.stdout)?;
    let ips = result["ips"].as_array().cloned().unwrap_or_default();
    assert_eq!(ips.len(), 2, "dual-stack: {result}");
    let v4 = ips[0]["address"].as_str().unwrap_or_default().to_owned();
    assert!(v4.starts_with("10.253.1."), "{v4}");
    assert!(pod.ip(&["addr", "show", "eth0"])?.contains(&v4));

    let check = in_node(&node, &[&["check"][..], &common[..]].concat())?;
    ensure!(
        check.status.success(),
        "check: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let checked = String::from_utf8_lossy(&check.stdout);
    assert!(checked.contains(&v4), "{checked}");
    // The pod its ADD named is in the store: CHECK, another process, names it.
    assert!(
        checked.starts_with("ok: pod cli/web-0 (uid u-cli-0) c1 (eth0)"),
        "{checked}"
    );

    let del = in_node(&node, &[&["del"][..], &common[..]].concat())?;
    ensure!(
        del.status.success(),
        "del: {}",
        String::from_utf8_lossy(&del.stderr)
    );
    assert!(String::from_utf8_lossy(&del.stdout).contains("released"));
    // The allocation is gone (CHECK fails naming the sandbox) and so is the interface.
    let check = in_node(&node, &[&["check"][..], &common[..]].concat())?;
    assert!(!check.status.success());
    assert!(
        String::from_utf8_lossy(&check.stderr).contains("c1"),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(pod.links()?.is_empty(), "links left in the pod after del");
    // The node side too: the host veth goes (retired, then deleted) although the process that
    // removed it has exited.
    wait_only_lo(&node, Duration::from_secs(10))?;
    Ok(())
}

/// containerd's GCE-style template (the JSON-valid form).
const TEMPLATE: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "1.0.0",
  "plugins": [
    {
      "type": "provisioner",
      "mtu": 1460,
      "ipam": {
        "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
        "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}]
      }
    }
  ]
}"#;

#[test]
fn render_config_for_v4_v6_and_dual_stack() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let template = dir.path().join("cni.template");
    std::fs::write(&template, TEMPLATE)?;
    for (cidrs, subnets, routes) in [
        ("10.244.1.0/24", vec!["10.244.1.0/24"], vec!["0.0.0.0/0"]),
        ("fd00:1::/64", vec!["fd00:1::/64"], vec!["::/0"]),
        (
            "10.244.1.0/24,fd00:1::/64",
            vec!["10.244.1.0/24", "fd00:1::/64"],
            vec!["0.0.0.0/0", "::/0"],
        ),
    ] {
        let output = dir.path().join("out.conflist");
        let out = Command::new(provisioner_bin())
            .args(["render-config", "--template"])
            .arg(&template)
            .args(["--pod-cidr", cidrs, "--output"])
            .arg(&output)
            .output()?;
        ensure!(
            out.status.success(),
            "render {cidrs}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered: Value = serde_json::from_slice(&std::fs::read(&output)?)?;
        let ipam = &rendered["plugins"][0]["ipam"];
        let got: Vec<&str> = ipam["ranges"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|set| set[0]["subnet"].as_str())
            .collect();
        assert_eq!(got, subnets, "{rendered}");
        let got: Vec<&str> = ipam["routes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["dst"].as_str())
            .collect();
        assert_eq!(got, routes, "{rendered}");
    }
    // A bad CIDR is refused naming it, and the previous output stays.
    let output = dir.path().join("out.conflist");
    let before = std::fs::read(&output)?;
    let out = Command::new(provisioner_bin())
        .args(["render-config", "--template"])
        .arg(&template)
        .args(["--pod-cidr", "10.244.1.0/33", "--output"])
        .arg(&output)
        .output()?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("10.244.1.0/33"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&output)?, before);
    Ok(())
}

fn scrape(port: u16) -> Result<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

/// Scrapes the endpoint and parses the Prometheus text format.
fn scrape_parsed(port: u16) -> Result<prometheus_parse::Scrape> {
    let response = scrape(port)?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .context("no HTTP body")?;
    Ok(prometheus_parse::Scrape::parse(
        body.lines().map(|l| Ok(l.to_owned())),
    )?)
}

/// The value of the sample `metric` with exactly `labels`, if present.
fn sample(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == metric
                && s.labels.len() == labels.len()
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })
        .and_then(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        })
}

#[test]
fn metrics_follow_prometheus_conventions_and_count_what_happened() -> Result<()> {
    let node = Netns::new("node")?;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?.port()
    };
    let addr = format!("127.0.0.1:{port}");
    let mut daemon = Daemon::start_with_conflist(&node, &["--metrics-addr", &addr], |socket| {
        conflist("metnet", "1.0.0", socket, "10.253.2.0/24", None)
    })?;
    let config = conflist("metnet", "1.0.0", &daemon.socket, "10.253.2.0/24", None);
    daemon.wait_ready(std::time::Duration::from_secs(10))?;
    assert!(
        daemon
            .log()
            .contains(&format!("serving metrics on http://{addr}/metrics"))
    );
    let pod = Netns::new("pod")?;
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    ensure!(run_plugin("ADD", "m1", Some(pod.path()), "eth0", &stdin)?.code == 0);
    // A request for another network than the daemon's is refused by the daemon.
    let other = conflist("metnet", "1.0.0", &daemon.socket, "10.253.9.0/24", None);
    let refused = run_plugin(
        "ADD",
        "m2",
        Some(pod.path()),
        "eth1",
        &serde_json::to_vec(&plugin_stdin(&other, "1.0.0"))?,
    )?;
    let code = refused
        .error_code()
        .with_context(|| format!("an error code for another network: {refused:?}"))?;

    // Tracing attaches in the background and confirms the ADD from the kernel (from its state
    // when the ADD came first).
    wait_until(
        "tracing up and the ADD confirmed",
        std::time::Duration::from_secs(30),
        || {
            let scrape = scrape_parsed(port)?;
            let confirmed = sample(
                &scrape,
                "provisioner_sandbox_intents_total",
                &[("status", "confirmed")],
            );
            Ok((sample(&scrape, "provisioner_tracing_up", &[]) == Some(1.0)
                && confirmed >= Some(1.0))
            .then_some(()))
        },
    )?;
    // A namespace created now is a kernel event the tracer sees; its event counters are
    // published by the trace driver's periodic metrics update.
    let _seen = Netns::new("ev")?;
    let scrape = wait_until(
        "kernel events counted",
        std::time::Duration::from_secs(30),
        || {
            let scrape = scrape_parsed(port)?;
            let events_counted = scrape.samples.iter().any(|s| {
                s.metric == "provisioner_trace_events_total" && s.labels.get("kind").is_some()
            });
            Ok(events_counted.then_some(scrape))
        },
    )?;
    assert_eq!(
        sample(
            &scrape,
            "provisioner_operations_total",
            &[("op", "add"), ("result", "ok")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &scrape,
            "provisioner_operations_total",
            &[("op", "add"), ("result", &code.to_string())]
        ),
        Some(1.0)
    );
    assert_eq!(sample(&scrape, "provisioner_ready", &[]), Some(1.0));
    for verdict in [
        "networked",
        "skipped",
        "partial",
        "failed",
        "gone",
        "unknown",
    ] {
        assert!(
            sample(
                &scrape,
                "provisioner_sandbox_verdicts_total",
                &[("verdict", verdict)]
            )
            .is_some(),
            "every verdict is exported: {verdict}"
        );
    }
    let ring = sample(&scrape, "provisioner_trace_ring_bytes", &[]).unwrap_or(0.0);
    let backlog_peak =
        sample(&scrape, "provisioner_trace_ring_backlog_peak_bytes", &[]).unwrap_or(0.0);
    assert!(
        ring > 0.0 && backlog_peak > 0.0 && backlog_peak <= ring,
        "ring buffer size {ring} and its peak backlog {backlog_peak} after events were counted"
    );
    for s in &scrape.samples {
        if matches!(s.value, prometheus_parse::Value::Counter(_)) {
            assert!(
                s.metric.ends_with("_total"),
                "counter {} without _total",
                s.metric
            );
        }
        assert!(
            !s.labels.contains_key("name"),
            "{}: a label named `name`",
            s.metric
        );
        for (key, value) in s.labels.iter() {
            assert!(
                !value.chars().any(char::is_uppercase),
                "{}: label {key}={value} is not lower case",
                s.metric
            );
        }
    }
    ensure!(run_plugin("DEL", "m1", Some(pod.path()), "eth0", &stdin)?.code == 0);
    let scrape = scrape_parsed(port)?;
    assert_eq!(
        sample(
            &scrape,
            "provisioner_operations_total",
            &[("op", "del"), ("result", "ok")]
        ),
        Some(1.0)
    );
    assert!(daemon.stop_status()?.success());
    Ok(())
}
