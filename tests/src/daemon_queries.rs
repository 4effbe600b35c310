//! What a test reads from a running daemon beyond the harness's status and sandboxes: its
//! allocations, and the kernel watch's views of particular sandbox namespaces.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use provisioner::daemon::api::AllocationInfo;
use provisioner::pod::{Pod, PodName};
use serde_json::Value;

use crate::daemon_harness::Daemon;
use crate::wait_until;

/// `provisioner list --json`.
pub fn allocations(daemon: &Daemon) -> Result<Vec<AllocationInfo>> {
    let out = daemon.cli(&["list", "--json"])?;
    if !out.status.success() {
        bail!("list: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).context("provisioner list --json: not a list")
}

/// The netns cookie a sandbox view is about.
pub fn cookie_of(view: &Value) -> Option<u64> {
    view["verdict"]["netns"]["cookie"]
        .as_u64()
        .or_else(|| view["intent"]["intent"]["netns_cookie"].as_u64())
}

/// The views of the namespaces in `cookies` that one `provisioner sandboxes --json` answer holds
/// (while kernel tracing is starting, those it holds then); an error when tracing is
/// unavailable for any other reason.
pub fn views_of(daemon: &Daemon, cookies: &HashSet<u64>) -> Result<Vec<Value>> {
    views_where(daemon, |v| {
        cookie_of(v).is_some_and(|c| cookies.contains(&c))
    })
}

/// The views `keep` keeps of one `provisioner sandboxes --json` answer (see [`views_of`]).
pub fn views_where(daemon: &Daemon, keep: impl Fn(&Value) -> bool) -> Result<Vec<Value>> {
    let answer = daemon.sandboxes()?;
    if let Some(reason) = answer["tracing_unavailable"].as_str()
        && reason != "kernel tracing is starting"
    {
        bail!("tracing unavailable: {reason}");
    }
    Ok(answer["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| keep(v))
        .cloned()
        .collect())
}

/// The inode of the namespace a view's verdict is about: how a test that holds the namespace
/// (so that its inode is not reused) tells it apart on every kernel.
pub fn inode_of(view: &Value) -> Option<u64> {
    view["verdict"]["netns"]["inode"].as_u64()
}

/// `verdict+intent status` of a view, e.g. `networked+confirmed` or `skipped+none`.
pub fn verdict_and_intent(view: &Value) -> String {
    format!(
        "{}+{}",
        view["verdict"]["verdict"].as_str().unwrap_or("none"),
        view["intent"]["status"].as_str().unwrap_or("none")
    )
}

/// The container id of a view: the sandbox of the daemon's ADD (or audit) it holds.
pub fn container_of(view: &Value) -> Option<&str> {
    view["container_id"].as_str()
}

/// The views of the daemon's sandboxes with these container ids, in one `provisioner
/// sandboxes --json` answer. Unlike a cookie, a container id names a sandbox the same way to
/// the test and to the daemon on every kernel (without `SO_NETNS_COOKIE`, the daemon's cookies
/// are its kernel watch's own).
pub fn views_of_containers(daemon: &Daemon, containers: &HashSet<String>) -> Result<Vec<Value>> {
    views_where(daemon, |v| {
        container_of(v).is_some_and(|c| containers.contains(c))
    })
}

/// Waits (bounded) until every namespace in `cookies` has a verdict, and an intent status too
/// when `with_intent`; returns their views.
pub fn wait_views_of(
    daemon: &Daemon,
    cookies: &HashSet<u64>,
    with_intent: bool,
    limit: Duration,
) -> Result<Vec<Value>> {
    wait_views(daemon, cookies.len(), limit, |view| {
        cookie_of(view).is_some_and(|c| cookies.contains(&c))
            && !view["verdict"].is_null()
            && (!with_intent || !view["intent"].is_null())
    })
}

/// Waits (bounded) until the views of the sandboxes of `containers` have a verdict, and an
/// intent status too when `with_intent`; returns them.
pub fn wait_views_of_containers(
    daemon: &Daemon,
    containers: &HashSet<String>,
    with_intent: bool,
    limit: Duration,
) -> Result<Vec<Value>> {
    wait_views(daemon, containers.len(), limit, |view| {
        container_of(view).is_some_and(|c| containers.contains(c))
            && !view["verdict"].is_null()
            && (!with_intent || !view["intent"].is_null())
    })
}

/// Waits (bounded) until `count` namespaces created by process `pid` have a verdict; returns
/// their views.
pub fn wait_views_created_by(
    daemon: &Daemon,
    pid: u32,
    count: usize,
    limit: Duration,
) -> Result<Vec<Value>> {
    wait_views(daemon, count, limit, |view| {
        view["verdict"]["creator"]["pid"].as_u64() == Some(u64::from(pid))
    })
}

/// Waits (bounded) until `count` views for which `ours` holds have a verdict (e.g. those of
/// [`crate::RuntimeNetns::is_view_of`]); returns them.
pub fn wait_views_where(
    daemon: &Daemon,
    count: usize,
    limit: Duration,
    ours: impl Fn(&Value) -> bool,
) -> Result<Vec<Value>> {
    wait_views(daemon, count, limit, |v| !v["verdict"].is_null() && ours(v))
}

fn wait_views(
    daemon: &Daemon,
    count: usize,
    limit: Duration,
    ours: impl Fn(&Value) -> bool,
) -> Result<Vec<Value>> {
    let mut views = Vec::new();
    wait_until(&format!("{count} sandbox verdicts"), limit, || {
        let answer = daemon.sandboxes()?;
        if let Some(reason) = answer["tracing_unavailable"].as_str() {
            bail!("tracing unavailable: {reason}");
        }
        views = answer["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| ours(v))
            .cloned()
            .collect();
        Ok((views.len() >= count).then(|| views.clone()))
    })
    .with_context(|| format!("judged so far: {views:#?}\n{}", daemon.log()))
}

/// `key=value` of a plain-text log line: the value up to the next space, without the quotes
/// a string field is written with.
pub fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split(' ').next().map(|v| v.trim_matches('"'))
}

/// The objects of a `--log-format json` log: every line must be one.
pub fn json_log(log: &str) -> Result<Vec<Value>> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect()
}

/// The lines of a plain-text log about the namespaces the daemon names `cookies` (their
/// `netns_cookie` field; take them from the daemon's views of what the test made): of the whole
/// node's kernel watch, those about the test's own.
pub fn log_lines_about<'a>(
    log: &'a str,
    cookies: &'a HashSet<u64>,
) -> impl Iterator<Item = &'a str> + 'a {
    log.lines().filter(|l| {
        log_field(l, "netns_cookie")
            .and_then(|c| c.parse::<u64>().ok())
            .is_some_and(|c| cookies.contains(&c))
    })
}

/// Whether a log line carries the pod fields of `pod`: namespace, name, uid and sandbox id.
pub fn names_pod_in_fields(line: &str, pod: &Pod) -> bool {
    log_field(line, "pod_namespace") == Some(pod.namespace.as_str())
        && log_field(line, "pod_name") == Some(pod.name.as_str())
        && log_field(line, "pod_uid") == pod.uid.as_deref()
        && log_field(line, "sandbox_id") == pod.sandbox_id.as_deref()
}

/// The pod a sandbox view (of `provisioner sandboxes --json`) names, when it names one.
pub fn pod_of_view(view: &Value) -> Option<Pod> {
    serde_json::from_value::<Option<PodName>>(view["pod"].clone())
        .ok()
        .flatten()
        .and_then(|name| name.known().cloned())
}
