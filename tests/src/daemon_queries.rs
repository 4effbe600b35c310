//! What a test asks a running daemon through the CLI, as an operator would: readiness,
//! allocations, and the kernel watch's view of sandbox namespaces.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use provisioner::daemon::api::{AllocationInfo, Status};
use serde_json::Value;

use crate::daemon_harness::Daemon;

fn cli_json(daemon: &Daemon, args: &[&str]) -> Result<Value> {
    let out = daemon.cli(args)?;
    // `status` exits 3 when not ready and still prints the document.
    if out.stdout.is_empty() {
        bail!(
            "provisioner {} ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("provisioner {}: output is not JSON", args.join(" ")))
}

/// `provisioner status --json`.
pub fn status(daemon: &Daemon) -> Result<Status> {
    Ok(serde_json::from_value(cli_json(
        daemon,
        &["status", "--json"],
    )?)?)
}

/// Waits (bounded) until the daemon reports ready.
pub fn wait_ready(daemon: &Daemon, limit: Duration) -> Result<Status> {
    let started = Instant::now();
    loop {
        let status = status(daemon)?;
        if status.ready {
            return Ok(status);
        }
        if started.elapsed() > limit {
            bail!(
                "daemon not ready within {limit:?}: {:?}\n{}",
                status.reasons,
                daemon.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `provisioner list --json`.
pub fn allocations(daemon: &Daemon) -> Result<Vec<AllocationInfo>> {
    Ok(serde_json::from_value(cli_json(
        daemon,
        &["list", "--json"],
    )?)?)
}

/// `provisioner sandboxes --json`.
pub fn sandboxes(daemon: &Daemon) -> Result<Value> {
    cli_json(daemon, &["sandboxes", "--json"])
}

/// Waits (bounded) until the kernel watch runs (it loads in the background; sandboxes created
/// before it is attached cannot be judged).
pub fn wait_tracing(daemon: &Daemon, limit: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let answer = sandboxes(daemon)?;
        if answer["tracing_unavailable"].is_null() {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("kernel tracing did not start within {limit:?}: {answer}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The netns cookie a sandbox view is about.
pub fn cookie_of(view: &Value) -> Option<u64> {
    view["verdict"]["netns"]["cookie"]
        .as_u64()
        .or_else(|| view["intent"]["intent"]["netns_cookie"].as_u64())
}

/// `verdict+intent status` of a view, e.g. `networked+confirmed` or `skipped+none`.
pub fn verdict_and_intent(view: &Value) -> String {
    format!(
        "{}+{}",
        view["verdict"]["verdict"].as_str().unwrap_or("none"),
        view["intent"]["status"].as_str().unwrap_or("none")
    )
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

fn wait_views(
    daemon: &Daemon,
    count: usize,
    limit: Duration,
    ours: impl Fn(&Value) -> bool,
) -> Result<Vec<Value>> {
    let started = Instant::now();
    loop {
        let answer = sandboxes(daemon)?;
        if let Some(reason) = answer["tracing_unavailable"].as_str() {
            bail!("tracing unavailable: {reason}");
        }
        let views: Vec<Value> = answer["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| ours(v))
            .cloned()
            .collect();
        if views.len() >= count {
            return Ok(views);
        }
        if started.elapsed() > limit {
            bail!(
                "{} of {count} sandbox namespaces judged within {limit:?}: {views:#?}\n{}",
                views.len(),
                daemon.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
