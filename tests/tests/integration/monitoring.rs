//! What an operator watches, evaluated by a real Prometheus (Debian's `prometheus`): the alert
//! rules and the dashboard of deploy/monitoring/ against a daemon in its node netns, the
//! health endpoints, the JSON log, and `promtool` on the rules.
//!
//! The rules that wait (`for: 5m`, `10m`) are loaded from a copy whose `for:` the test shortens
//! to [`FOR_IN_TEST`] (deploy/monitoring/rules.yaml itself is only read): the real Prometheus
//! holds them pending, then fires them. The rules the scenario fires are read back from
//! Prometheus (its `ALERTS` series); a rule it cannot make fire (ProvisionerKernelWatchLosingEvents:
//! the scenario loses no kernel event) has promtool's rule tests (rules_test.yaml) as its only
//! firing check, and the test requires one there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::daemon_queries::json_log;
use provisioner_tests::prometheus::{Prometheus, http_get};
use provisioner_tests::{Netns, OwnRuntime, RuntimeNetns, wait_until};
use serde_json::Value;
use testkit::daemon::write_conflist;

/// Bound on the waits for the daemon, the kernel watch and Prometheus (a loaded machine).
const PATIENCE: Duration = Duration::from_secs(40);
/// Prometheus' scrape and rule evaluation interval in the test.
const INTERVAL: Duration = Duration::from_secs(1);
/// The `for:` of every rule that has one, in the copy of the rules the test loads: long enough
/// to see the alert pending first, at this interval.
const FOR_IN_TEST: Duration = Duration::from_secs(5);
const METRICS_PORT: u16 = 9640;
/// The job name the dashboard's `$job` variable defaults to.
const JOB: &str = "provisioner";
/// What the test gives the dashboard's `$__rate_interval`: covers the whole scenario.
const RATE_INTERVAL: &str = "3m";
/// The test's pod range: 13 addresses (.2 to .14, gateway .1).
const SUBNET: &str = "10.254.38.0/28";
const CAPACITY: usize = 13;

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// Starts Prometheus in `netns` scraping the daemon's loopback metrics port with the rules of
/// deploy/monitoring (their `for:` shortened, [`rules_for_the_test`]), and waits until it is
/// ready.
fn start_prometheus(netns: &Netns) -> Result<Prometheus<'_>> {
    let shipped = std::fs::read_to_string(monitoring_dir().join("rules.yaml"))?;
    let rules = rules_for_the_test(&shipped)?;
    let config = format!(
        "global:\n  scrape_interval: {i}s\n  evaluation_interval: {i}s\n\
         rule_files:\n  - rules.yaml\n\
         scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      \
         - targets: ['127.0.0.1:{METRICS_PORT}']\n",
        i = INTERVAL.as_secs(),
    );
    Prometheus::start_with_files(netns, &config, &[("rules.yaml", &rules)])
}

/// The rules of `shipped` (rules.yaml's text) with every `for:` set to [`FOR_IN_TEST`], line
/// by line; everything else as it is. Checked: the copy holds the same rules, differing only
/// in `for:`, and every rule that waits was shortened.
fn rules_for_the_test(shipped: &str) -> Result<String> {
    let short = format!("{}s", FOR_IN_TEST.as_secs());
    let mut copy = String::new();
    for line in shipped.lines() {
        match line.split_once("for: ") {
            Some((indent, _)) if indent.trim().is_empty() => {
                copy.push_str(&format!("{indent}for: {short}"));
            }
            _ => copy.push_str(line),
        }
        copy.push('\n');
    }
    let rules = |text: &str| -> Result<Vec<serde_norway::Value>> {
        let parsed: serde_norway::Value = serde_norway::from_str(text)?;
        Ok(parsed["groups"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
            .collect())
    };
    let (before, after) = (rules(shipped)?, rules(&copy)?);
    ensure!(before.len() == after.len(), "the copy lost rules:\n{copy}");
    let mut waiting = 0;
    for (mut was, mut is) in before.into_iter().zip(after) {
        let waits = was.get("for").is_some();
        waiting += usize::from(waits);
        ensure!(
            !waits || is["for"].as_str() == Some(short.as_str()),
            "a `for:` left as shipped: {is:?}"
        );
        for rule in [&mut was, &mut is] {
            if let Some(map) = rule.as_mapping_mut() {
                map.remove("for");
            }
        }
        ensure!(
            was == is,
            "the copy changed more than `for:`: {was:?} -> {is:?}"
        );
    }
    ensure!(waiting > 0, "no rule waits: nothing to shorten");
    Ok(copy)
}

/// The alerts `promtool test rules rules_test.yaml` expects firing at some evaluation.
fn fired_by_promtool_tests() -> Result<BTreeSet<String>> {
    let text = std::fs::read_to_string(monitoring_dir().join("rules_test.yaml"))?;
    let tests: serde_norway::Value = serde_norway::from_str(&text)?;
    Ok(tests["tests"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|t| {
            t["alert_rule_test"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|case| {
            case["exp_alerts"]
                .as_sequence()
                .is_some_and(|alerts| !alerts.is_empty())
        })
        .filter_map(|case| case["alertname"].as_str().map(str::to_owned))
        .collect())
}

/// Every alert rule of rules.yaml, with its name.
fn alert_rules() -> Result<Vec<(String, serde_norway::Value)>> {
    let text = std::fs::read_to_string(monitoring_dir().join("rules.yaml"))?;
    let rules: serde_norway::Value = serde_norway::from_str(&text)?;
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            let name = rule["alert"]
                .as_str()
                .context("a rule without alert name")?;
            out.push((name.to_owned(), rule.clone()));
        }
    }
    ensure!(!out.is_empty(), "no rule in rules.yaml");
    Ok(out)
}

/// Every (alert name, expression) of rules.yaml.
fn rule_expressions() -> Result<Vec<(String, String)>> {
    alert_rules()?
        .into_iter()
        .map(|(name, rule)| {
            let expr = rule["expr"].as_str().context("a rule without expr")?;
            Ok((name, expr.trim().to_owned()))
        })
        .collect()
}

/// The quantity an alert expression compares (`<quantity> <op> <threshold>`).
fn quantity(expr: &str) -> &str {
    [" == ", " < ", " > "]
        .iter()
        .filter_map(|op| expr.rfind(op))
        .max()
        .map_or(expr, |at| &expr[..at])
}

/// Every expression of the dashboard, its variables given the test's values.
fn dashboard_expressions() -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(monitoring_dir().join("dashboard.json"))?;
    let dashboard: Value = serde_json::from_str(&text)?;
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().context("a target without expr")?;
            let expr = expr
                .replace("$__rate_interval", RATE_INTERVAL)
                .replace("$job", JOB);
            ensure!(
                !expr.contains('$'),
                "a variable the test does not give: {expr}"
            );
            out.push((panel["title"].as_str().unwrap_or("?").to_owned(), expr));
        }
    }
    ensure!(!out.is_empty(), "no panel expression in dashboard.json");
    Ok(out)
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2026-12-04T05:23:18.123456Z`).
fn rfc3339_seconds(text: &str) -> Result<f64> {
    let bad = || format!("not an RFC 3339 UTC time: {text}");
    let (date, time) = text.split_once('T').with_context(bad)?;
    let mut ymd = date.split('-').map(str::parse::<i64>);
    let (Some(Ok(y)), Some(Ok(m)), Some(Ok(d))) = (ymd.next(), ymd.next(), ymd.next()) else {
        bail!(bad());
    };
    let time = time.strip_suffix('Z').with_context(bad)?;
    let mut hms = time.splitn(3, ':');
    let (Some(h), Some(min), Some(s)) = (hms.next(), hms.next(), hms.next()) else {
        bail!(bad());
    };
    // Days from the civil date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days as f64 * 86_400.0
        + h.parse::<f64>().with_context(bad)? * 3600.0
        + min.parse::<f64>().with_context(bad)? * 60.0
        + s.parse::<f64>().with_context(bad)?)
}

fn add(container: &str, netns: &Path, stdin: &[u8]) -> Result<()> {
    let out = run_plugin("ADD", container, Some(netns), "eth0", stdin)?;
    ensure!(out.code == 0, "ADD {container}: {out:?}");
    Ok(())
}

fn del(container: &str, netns: &Path, stdin: &[u8]) -> Result<()> {
    let out = run_plugin("DEL", container, Some(netns), "eth0", stdin)?;
    ensure!(out.code == 0, "DEL {container}: {out:?}");
    Ok(())
}

/// The daemon's view of `sandbox` (by its inode and creator), once `done` holds for it.
fn wait_view(
    daemon: &Daemon,
    sandbox: &RuntimeNetns,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<Value> {
    wait_until(what, PATIENCE, || {
        let answer = daemon.sandboxes()?;
        Ok(answer["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| sandbox.is_view_of(v) && done(v))
            .cloned())
    })
    .with_context(|| format!("log:\n{}", daemon.log()))
}

/// The netns cookie the daemon names a view's namespace by (the alert's label).
fn daemon_cookie(view: &Value) -> Result<u64> {
    view["verdict"]["netns"]["cookie"]
        .as_u64()
        .with_context(|| format!("no cookie: {view:#}"))
}

/// The time (seconds since the epoch) of the view's `verdict` in its timeline.
fn verdict_time(view: &Value, verdict: &str) -> Result<f64> {
    view["verdict"]["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["verdict"] == verdict)
        .and_then(|e| e["at"].as_f64())
        .with_context(|| format!("no {verdict} in the timeline: {view:#}"))
}

/// The alarm series of `cookie`: the alert names it by its netns cookie (and pod, once known).
fn alert_of(alerts: &[Value], cookie: u64) -> Option<&Value> {
    alerts
        .iter()
        .find(|a| a["labels"]["netns_cookie"] == cookie.to_string().as_str())
}

fn assert_non_empty(prometheus: &Prometheus<'_>, what: &str, expr: &str) -> Result<()> {
    let result = prometheus.query(expr)?;
    ensure!(!result.is_empty(), "{what}: `{expr}` returned nothing");
    Ok(())
}

#[test]
fn a_real_prometheus_fires_the_alerts_and_evaluates_every_rule_and_panel() -> Result<()> {
    let node = Netns::new("node")?;
    let metrics_addr = format!("127.0.0.1:{METRICS_PORT}");
    // Not ready first: the conf dir holds a config the daemon refuses.
    let daemon = Daemon::start_in_node_with_conflist(
        &node,
        &[
            "--metrics-addr",
            &metrics_addr,
            "--trace-deadline",
            "1",
            "--log-format",
            "json",
        ],
        |_| serde_json::json!({"cniVersion": "1.0.0", "name": "monnet", "plugins": []}),
    )?;
    let config = conflist("monnet", "1.0.0", &daemon.socket, SUBNET, None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;

    // The metrics listener starts next to the socket: the first connection may come first.
    let health = wait_until("the metrics listener", PATIENCE, || {
        Ok(http_get(&node, METRICS_PORT, "/healthz")
            .ok()
            .map(|(status, _)| status))
    })?;
    let (ready, body) = http_get(&node, METRICS_PORT, "/readyz")?;
    assert_eq!(health, 200, "alive while not ready");
    assert_eq!(ready, 503, "not ready: {body}");

    let prometheus = start_prometheus(&node)?;
    let rules = rule_expressions()?;
    prometheus.wait_pending_then_firing("ProvisionerNotReady", PATIENCE)?;

    let files = daemon.conf_dir.parent().context("the daemon's files")?;
    write_conflist(files, &config)?;
    daemon.wait_ready(PATIENCE)?;
    assert_eq!(http_get(&node, METRICS_PORT, "/readyz")?.0, 200);
    assert_eq!(http_get(&node, METRICS_PORT, "/healthz")?.0, 200);
    daemon.wait_tracing(PATIENCE)?;

    // One sandbox the runtime leaves unwired (skipped), one it wires after the deadline
    // (skipped, then revised to networked), and networked ones until the range is full.
    let runtime = OwnRuntime::new()?;
    let skipped = RuntimeNetns::created_by(&runtime, "cni-mon")?;
    let late = RuntimeNetns::created_by(&runtime, "cni-mla")?;
    let pods: Vec<Netns> = (0..CAPACITY - 1)
        .map(|_| Netns::new("mpod"))
        .collect::<Result<_>>()?;
    for (i, pod) in pods.iter().enumerate() {
        add(&format!("mon-{i}"), pod.path(), &stdin)?;
    }
    let skipped_view = wait_view(&daemon, &skipped, "the skip", |v| {
        v["verdict"]["verdict"] == "skipped"
    })?;
    let skipped_cookie = daemon_cookie(&skipped_view)?;
    let verdict_at = verdict_time(&skipped_view, "skipped")?;
    // Its text, as `provisioner sandboxes` prints it, gives times in RFC 3339 UTC.
    let text = skipped_view["text"].to_string();
    let printed: Vec<f64> = text
        .split(|c: char| c.is_whitespace() || c == '"' || c == '\\')
        .filter(|w| w.ends_with('Z') && w.contains('T'))
        .filter_map(|w| rfc3339_seconds(w).ok())
        .collect();
    assert!(
        printed.iter().any(|t| (t - verdict_at).abs() < 60.0),
        "no RFC 3339 time near the verdict ({verdict_at}) in {text}"
    );
    let alert = wait_until("the skipped sandbox's alert", PATIENCE, || {
        let firing = prometheus.firing("ProvisionerSandboxNotNetworked")?;
        Ok(alert_of(&firing, skipped_cookie).cloned())
    })
    .with_context(|| prometheus.log())?;
    assert_eq!(alert["labels"]["verdict"], "skipped", "{alert:#}");
    let active_at = rfc3339_seconds(alert["activeAt"].as_str().unwrap_or_default())?;
    // Prometheus' own evaluation time against the kernel watch's verdict time: a scrape and
    // then a rule evaluation, each at most one interval away.
    assert!(
        active_at - verdict_at <= 2.0 * INTERVAL.as_secs_f64(),
        "alert active at {active_at}, verdict at {verdict_at}: more than 2 intervals"
    );

    let late_view = wait_view(&daemon, &late, "the late one's skip", |v| {
        v["verdict"]["verdict"] == "skipped"
    })?;
    let late_cookie = daemon_cookie(&late_view)?;
    add("mon-late", &late.path(), &stdin)?;
    wait_view(&daemon, &late, "the late network", |v| {
        v["verdict"]["verdict"] == "networked" && v["verdict"]["revises"] == "skipped"
    })?;
    // Full, then one released: 12 of 13 held, under 10 % free.
    let last = pods.last().context("no pod")?;
    del(&format!("mon-{}", CAPACITY - 2), last.path(), &stdin)?;
    wait_until("the exhaustion alert", PATIENCE, || {
        let firing = prometheus.firing("ProvisionerAddressesNearlyExhausted")?;
        Ok(firing
            .iter()
            .any(|a| a["labels"]["subnet"] == SUBNET && a["labels"]["network"] == "monnet")
            .then_some(()))
    })
    .with_context(|| prometheus.log())?;
    wait_until("the revised sandbox's alert gone", PATIENCE, || {
        let firing = prometheus.firing("ProvisionerSandboxNotNetworked")?;
        Ok(alert_of(&firing, late_cookie).is_none().then_some(()))
    })?;
    // The range was full (the alert fires then too): the DEL shows once a scrape after it
    // is in.
    let allocated = format!("provisioner_ipam_addresses_allocated{{subnet=\"{SUBNET}\"}}");
    let mut usage = Vec::new();
    wait_until("12 addresses allocated in Prometheus", PATIENCE, || {
        usage = prometheus.query(&allocated)?;
        Ok((usage.len() == 1 && usage[0]["value"][1] == "12").then_some(()))
    })
    .with_context(|| format!("last answer: {usage:?}"))?;

    // Every expression parses and has data: each rule's quantity, each dashboard panel's.
    for (alert, expr) in &rules {
        assert_non_empty(&prometheus, alert, quantity(expr))?;
    }
    for (panel, expr) in dashboard_expressions()? {
        assert_non_empty(&prometheus, &panel, &expr)?;
    }
    // The kernel watch paused: its alert is pending, then fires.
    let out = daemon.cli(&["kernel-watch", "off"])?;
    ensure!(out.status.success(), "kernel-watch off: {out:?}");
    prometheus.wait_pending_then_firing("ProvisionerKernelWatchDown", PATIENCE)?;
    // Which rules fired, as Prometheus recorded them; every other rule must be fired by
    // promtool's rule tests, its only firing check.
    let fired = prometheus.fired()?;
    let by_promtool = fired_by_promtool_tests()?;
    let unfired: Vec<&str> = rules
        .iter()
        .map(|(alert, _)| alert.as_str())
        .filter(|alert| !fired.contains(*alert))
        .collect();
    eprintln!("fired by the real Prometheus: {fired:?}; by promtool's tests only: {unfired:?}");
    for alert in &unfired {
        assert!(
            by_promtool.contains(*alert),
            "{alert}: fired neither by this scenario nor by rules_test.yaml"
        );
    }
    assert!(
        fired
            .iter()
            .all(|f| rules.iter().any(|(alert, _)| alert == f)),
        "fired {fired:?}, not all rules of {rules:?}"
    );

    // The JSON log: one object per line; the skip's line carries the sandbox's fields as keys.
    let log = daemon.log();
    let lines = json_log(&log)?;
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["message"].is_string())
    );
    assert!(
        lines.iter().any(|l| l["netns_cookie"] == skipped_cookie
            && l["message"].as_str().is_some_and(|m| m.contains("SKIPPED"))),
        "no JSON line for the skip with its netns_cookie:\n{log}"
    );

    for (i, pod) in pods.iter().enumerate().take(CAPACITY - 2) {
        del(&format!("mon-{i}"), pod.path(), &stdin)?;
    }
    del("mon-late", &late.path(), &stdin)?;
    Ok(())
}

#[test]
fn promtool_checks_and_tests_the_rules() -> Result<()> {
    let promtool = testkit::tools::PROMTOOL.require()?;
    let dir = monitoring_dir();
    for args in [
        &["check", "rules", "rules.yaml"][..],
        &["test", "rules", "rules_test.yaml"][..],
    ] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .context("run promtool")?;
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The sections every runbook has, in order.
const RUNBOOK_SECTIONS: &[&str] = &[
    "## What fired",
    "## What it means for",
    "## Diagnose",
    "## Mitigate",
];

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every (alert name, `runbook_url` annotation) of rules.yaml.
fn runbook_urls() -> Result<Vec<(String, Option<String>)>> {
    Ok(alert_rules()?
        .into_iter()
        .map(|(name, rule)| {
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .map(str::to_owned);
            (name, url)
        })
        .collect())
}

/// The `provisioner ...` commands a page tells the operator to run: code-block lines and inline
/// code spans starting with `provisioner `, cut at a shell pipe or comment.
fn provisioner_commands(page: &str) -> Vec<Vec<String>> {
    let mut candidates: Vec<&str> = Vec::new();
    let mut in_block = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if in_block {
            candidates.push(line.trim());
        } else {
            candidates.extend(line.split('`').skip(1).step_by(2));
        }
    }
    candidates
        .into_iter()
        .filter_map(|c| c.strip_prefix("provisioner "))
        .map(|c| {
            let end = [c.find(" |"), c.find(" #")].into_iter().flatten().min();
            c[..end.unwrap_or(c.len())]
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// Every alert links the runbook under docs/runbooks/ named after it, every runbook page is
/// linked by the alert it is named after, each page has the sections of a runbook, and every
/// `provisioner` command a page tells the operator to run is one the binary accepts.
#[test]
fn every_alert_has_its_runbook_and_every_runbook_its_alert() -> Result<()> {
    let root = repository_root();
    let alerts = runbook_urls()?;
    for (alert, url) in &alerts {
        let url = url
            .as_deref()
            .with_context(|| format!("alert {alert} has no runbook_url annotation"))?;
        ensure!(
            url == format!("docs/runbooks/{alert}.md"),
            "alert {alert}: runbook_url {url} is not docs/runbooks/{alert}.md"
        );
        let page = std::fs::read_to_string(root.join(url))
            .with_context(|| format!("alert {alert}: its runbook {url}"))?;
        ensure!(
            page.lines().next() == Some(format!("# {alert}").as_str()),
            "{url} does not start with the title # {alert}"
        );
        let mut from = 0;
        for section in RUNBOOK_SECTIONS {
            let at = page[from..]
                .find(section)
                .with_context(|| format!("{url}: no section {section:?} (in order)"))?;
            from += at + section.len();
        }
        let commands = provisioner_commands(&page);
        ensure!(!commands.is_empty(), "{url} names no provisioner command");
        for args in commands {
            let out = Command::new(provisioner_tests::provisioner_bin())
                .args(&args)
                .arg("--help")
                .env_remove("CNI_COMMAND")
                .output()
                .context("run provisioner")?;
            ensure!(
                out.status.success(),
                "{url}: `provisioner {}` is refused by the binary: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let linked: BTreeSet<String> = alerts.iter().map(|(a, _)| format!("{a}.md")).collect();
    for entry in std::fs::read_dir(root.join("docs/runbooks"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        ensure!(
            linked.contains(&name),
            "docs/runbooks/{name} is the runbook of no alert in rules.yaml"
        );
    }
    Ok(())
}

#[test]
fn runbook_commands_are_read_as_written() {
    let page = "run `provisioner why NS/NAME` or\n```sh\nprovisioner status   # ready?\n\
                provisioner sandboxes --json | grep x\nls\n```\n`kubectl get`";
    assert_eq!(
        provisioner_commands(page),
        vec![
            vec!["why".to_owned(), "NS/NAME".to_owned()],
            vec!["status".to_owned()],
            vec!["sandboxes".to_owned(), "--json".to_owned()],
        ]
    );
}

/// Rust crates of the workspace, as code spells them: not metric names.
const CRATE_NAMES: &[&str] = &[
    "provisioner_tests",
    "provisioner_common",
    "provisioner_ebpf",
];

/// Every `provisioner_*` / `process_*` name written in `text` (a name ending in `_`, a prefix
/// written as `provisioner_trace_*`, is no metric name).
fn metric_names(text: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    for prefix in ["provisioner_", "process_"] {
        for (at, _) in text.match_indices(prefix) {
            if text[..at].chars().next_back().is_some_and(word) {
                continue;
            }
            let name: String = text[at..].chars().take_while(|c| word(*c)).collect();
            if !name.ends_with('_') && !CRATE_NAMES.contains(&name.as_str()) {
                names.insert(name);
            }
        }
    }
    names
}

/// The files whose metric names an operator reads.
fn documents() -> Result<Vec<PathBuf>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "docs/runbooks", "deploy/monitoring"] {
        for entry in std::fs::read_dir(root.join(dir))? {
            let path = entry?.path();
            if path
                .extension()
                .is_some_and(|e| e == "md" || e == "yaml" || e == "json")
            {
                files.push(path);
            }
        }
    }
    Ok(files)
}

/// The metric names a scrape serves: each sample's, each family's, and a histogram's base name.
fn served_names(exposition: &str) -> BTreeSet<String> {
    let mut served = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let mut parts = family.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                served.insert(name.to_owned());
                if kind == "histogram" {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        served.insert(format!("{name}{suffix}"));
                    }
                }
            }
        } else if !line.starts_with('#') {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                served.insert(name);
            }
        }
    }
    served
}

#[test]
fn every_metric_name_in_the_docs_is_served() -> Result<()> {
    let node = Netns::new("node")?;
    let metrics_addr = format!("127.0.0.1:{METRICS_PORT}");
    let daemon =
        Daemon::start_in_node_with_conflist(&node, &["--metrics-addr", &metrics_addr], |socket| {
            conflist("docnet", "1.0.0", socket, "10.254.39.0/24", None)
        })?;
    // The operations' families are served once an operation was, the kernel watch's while it
    // runs.
    let config = conflist("docnet", "1.0.0", &daemon.socket, "10.254.39.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let pod = Netns::new("dpod")?;
    add("doc-1", pod.path(), &stdin)?;
    del("doc-1", pod.path(), &stdin)?;
    daemon.wait_tracing(PATIENCE)?;
    let exposition = wait_until("a scrape with the kernel watch up", PATIENCE, || {
        let Ok((200, body)) = http_get(&node, METRICS_PORT, "/metrics") else {
            return Ok(None);
        };
        Ok(body
            .lines()
            .any(|l| l == "provisioner_tracing_up 1")
            .then_some(body))
    })?;
    let served = served_names(&exposition);
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in documents()? {
        let text = std::fs::read_to_string(&file)?;
        for name in metric_names(&text) {
            checked += 1;
            if !served.contains(&name) {
                missing.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} metric names found in the docs"
    );
    assert!(
        missing.is_empty(),
        "metric names in the docs that /metrics does not serve:\n{}\n\nserved:\n{exposition}",
        missing.join("\n")
    );
    Ok(())
}

#[test]
fn names_are_read_from_text_as_written() {
    let text = "`provisioner_ready` and provisioner_trace_events_total{kind}; \
                provisioner_trace_* families; the provisioner_tests crate; \
                rate(process_cpu_seconds_total[5m]); my_provisioner_x";
    assert_eq!(
        metric_names(text),
        BTreeSet::from([
            "process_cpu_seconds_total".to_owned(),
            "provisioner_ready".to_owned(),
            "provisioner_trace_events_total".to_owned(),
        ])
    );
    let served = served_names(
        "# TYPE provisioner_operation_duration_seconds histogram\n\
         provisioner_operation_duration_seconds_sum{op=\"add\"} 1\n\
         # TYPE provisioner_ready gauge\nprovisioner_ready 1\n",
    );
    assert!(served.contains("provisioner_operation_duration_seconds"));
    assert!(served.contains("provisioner_operation_duration_seconds_bucket"));
    assert!(served.contains("provisioner_ready"));
    assert!(!served.contains("provisioner_sandboxes"));
}

#[test]
fn the_rules_copy_shortens_every_for_and_changes_nothing_else() -> Result<()> {
    let shipped = std::fs::read_to_string(monitoring_dir().join("rules.yaml"))?;
    let copy = rules_for_the_test(&shipped)?;
    let fors: Vec<&str> = copy
        .lines()
        .filter_map(|l| l.trim().strip_prefix("for: "))
        .collect();
    assert!(!fors.is_empty(), "{copy}");
    let short = format!("{}s", FOR_IN_TEST.as_secs());
    assert!(fors.iter().all(|f| *f == short), "{fors:?}");
    // A `for:` that is not a rule's key (here inside a folded description) is left alone, and
    // a rule written so that the line rewrite misses its `for:` is refused.
    let text = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n        \
                for: 10m\n        annotations:\n          description: >-\n            down\n            \
                for: ten minutes\n";
    let err = rules_for_the_test(text).expect_err("the folded line is not a key");
    assert!(err.to_string().contains("changed more than"), "{err:#}");
    let inline = "groups:\n  - name: g\n    rules:\n      - {alert: A, expr: up == 0, for: 10m}\n";
    let err = rules_for_the_test(inline).expect_err("an inline `for` is not rewritten");
    assert!(err.to_string().contains("left as shipped"), "{err:#}");
    Ok(())
}
