//! The daemon on its own: start to ready (fresh, and with N allocations to reconcile), and its
//! RSS idle, with N sandboxes, and after a restart on that state.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use super::stats::{Samples, Summary};
use super::ways::{self, Lane, Verb, Way};
use super::{
    Daemon, Netns, Options, QUIET_BEFORE_PHASE, provisioner_conflist, quiet, sandbox_namespaces,
    trace_overhead,
};
use crate::step::{announce, detail};
use testkit::daemon::write_conflist;

/// Fresh daemon starts measured for start-to-ready before the one the ways use.
const EXTRA_STARTS: usize = 3;
/// The RSS phase's daemon judges its sandboxes this soon after their ADD...
const RSS_TRACE_DEADLINE: Duration = Duration::from_secs(1);
/// ...and the RSS is read this long after that (the verdicts come at the driver's next tick).
const VERDICT_SETTLE: Duration = Duration::from_secs(2);
/// The kernel watch loads in the background after ready: the RSS after a restart is read
/// this long after ready.
const RESTART_SETTLE: Duration = Duration::from_secs(2);

/// The daemon the ways use, and what its start measured.
pub struct Started {
    pub daemon: Daemon,
    pub conflist: Value,
    fresh_starts_ms: Vec<f64>,
    rss_idle_kib: u64,
}

/// What the daemon phases measured.
pub struct DaemonResults {
    pub fresh_starts_ms: Vec<f64>,
    pub rss_idle_kib: u64,
    pub rss_loaded_kib: u64,
    pub restart_ready_ms: f64,
    /// [`RESTART_SETTLE`] after the restart's ready.
    pub rss_after_restart_kib: u64,
    /// The API ADDs that provisioned the sandboxes.
    pub provision: Summary,
}

/// Starts a daemon in `dir` (its conf written there) and waits for ready; start-to-ready time.
fn start_daemon(
    bin: &Path,
    node: &Netns,
    dir: &Path,
    opts: &Options,
    args: &[&str],
) -> Result<(Daemon, Value, Duration)> {
    let conflist = provisioner_conflist(&dir.join("provisioner.sock"));
    write_conflist(dir, &conflist)?;
    let mut extra = args.to_vec();
    if opts.no_trace {
        extra.push("--no-trace");
    }
    let mut daemon = Daemon::spawn(bin, node, dir, &extra)?;
    let ready = daemon.wait_ready(Duration::from_secs(10))?;
    Ok((daemon, conflist, ready))
}

#[expect(clippy::cast_precision_loss, reason = "KiB values are far below 2^52")]
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// [`EXTRA_STARTS`] fresh daemons started and stopped, then the one the ways use.
pub fn start(opts: &Options, bin: &Path, node: &Netns, tmp: &Path) -> Result<Started> {
    announce(
        "bench",
        &format!(
            "provisioner daemon: start to ready, {} fresh starts",
            EXTRA_STARTS + 1
        ),
    );
    let mut fresh_starts_ms = Vec::new();
    for i in 0..EXTRA_STARTS {
        let (mut daemon, _, ready) =
            start_daemon(bin, node, &tmp.join(format!("start{i}")), opts, &[])?;
        fresh_starts_ms.push(ready.as_secs_f64() * 1e3);
        daemon.stop()?;
    }
    let (daemon, conflist, ready) = start_daemon(bin, node, &tmp.join("daemon"), opts, &[])?;
    fresh_starts_ms.push(ready.as_secs_f64() * 1e3);
    let rss_idle_kib = daemon.rss_kib()?;
    let starts: Vec<String> = fresh_starts_ms.iter().map(|v| format!("{v:.1}")).collect();
    detail(&format!(
        "ready after {} ms; RSS {:.1} MiB with no sandbox",
        starts.join(", "),
        mib(rss_idle_kib)
    ));
    Ok(Started {
        daemon,
        conflist,
        fresh_starts_ms,
        rss_idle_kib,
    })
}

/// `n` sandbox namespaces named `<prefix><i>`, created once `daemon`'s kernel watch is attached
/// (when it runs one), not timed: a runtime creates a sandbox's netns just before its ADD, with
/// the kernel watch running (a netns created before costs a read of its state at its first ADD).
pub fn seen_created(daemon: &Daemon, opts: &Options, prefix: &str, n: usize) -> Result<Vec<Netns>> {
    if !opts.no_trace {
        trace_overhead::wait_attached(daemon)?;
    }
    let created = Instant::now();
    let pods = sandbox_namespaces(prefix, n)?;
    detail(&format!(
        "{n} sandbox netns in {:.1} s",
        created.elapsed().as_secs_f64()
    ));
    Ok(pods)
}

/// How many of the daemon's sandbox views hold a verdict, in words.
fn verdicts_given(daemon: &mut Daemon) -> Result<String> {
    let answer = daemon.request(&json!({"op": "sandboxes"}))?;
    let views = answer["sandboxes"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let judged = views.iter().filter(|v| !v["verdict"].is_null()).count();
    Ok(format!("{judged} of {} sandbox views judged", views.len()))
}

/// RSS with `--sandboxes` sandboxes, then a restart on that state, by a daemon started once
/// the ways' daemon stopped and its namespaces are gone: the kernel watch keeps state per
/// namespace of the node, and a node with N sandboxes does not hold the bench's thousands of
/// other namespaces. The sandboxes are judged (their verdicts kept) before the RSS is read.
pub fn memory(
    opts: &Options,
    bin: &Path,
    node: &Netns,
    tmp: &Path,
    started: Started,
) -> Result<DaemonResults> {
    let Started {
        mut daemon,
        fresh_starts_ms,
        rss_idle_kib,
        ..
    } = started;
    daemon.stop()?;
    ways::settle(node)?;
    let (dir, n) = (tmp.join("rss"), opts.sandboxes);
    let deadline = RSS_TRACE_DEADLINE.as_secs().to_string();
    let (mut daemon, _, _) = start_daemon(bin, node, &dir, opts, &["--trace-deadline", &deadline])?;
    let pods = seen_created(&daemon, opts, "s", n)?;
    quiet::wait("the RSS phase", QUIET_BEFORE_PHASE)?;
    announce(
        "bench",
        &format!(
            "provisioner daemon (fresh): RSS with {n} sandboxes ({} callers through the API)",
            opts.concurrency
        ),
    );
    let provision = Summary::of(&through_api(&daemon, &pods, Verb::Add, opts)?);
    if !opts.no_trace {
        std::thread::sleep(RSS_TRACE_DEADLINE + VERDICT_SETTLE);
    }
    let rss_loaded_kib = daemon.rss_kib()?;
    let judged = if opts.no_trace {
        String::new()
    } else {
        format!(", {}", verdicts_given(&mut daemon)?)
    };
    detail(&format!(
        "provisioned: {}; RSS {:.1} MiB{judged}",
        provision.line(),
        mib(rss_loaded_kib)
    ));
    daemon.stop()?;
    let (mut daemon, restart_ready_ms, rss_after_restart_kib) = restart(opts, bin, node, &dir)?;
    announce("bench", &format!("cleanup: DEL of the {n} sandboxes"));
    through_api(&daemon, &pods, Verb::Del, opts)?;
    ways::settle(node)?;
    daemon.stop()?;
    Ok(DaemonResults {
        fresh_starts_ms,
        rss_idle_kib,
        rss_loaded_kib,
        restart_ready_ms,
        rss_after_restart_kib,
        provision,
    })
}

/// `verb` of one sandbox in each of `pods` through the API, by `--concurrency` callers.
fn through_api(daemon: &Daemon, pods: &[Netns], verb: Verb, opts: &Options) -> Result<Samples> {
    let lane = [Lane {
        way: Way::Api(daemon),
        pods,
    }];
    let ids = [ways::ids(&lane[0], "rss", pods.len())];
    let mut out = ways::interleaved(&lane, verb, &ids, pods.len(), opts.concurrency)?;
    Ok(out.remove(0))
}

/// A daemon started on the state in `dir`: it, its start to ready in ms, and its RSS once the
/// kernel watch loaded.
fn restart(opts: &Options, bin: &Path, node: &Netns, dir: &Path) -> Result<(Daemon, f64, u64)> {
    announce(
        "bench",
        &format!(
            "provisioner daemon: restart with {} allocations, start to ready",
            opts.sandboxes
        ),
    );
    let (daemon, _, ready) = start_daemon(bin, node, dir, opts, &[])?;
    let listed = daemon.request(&json!({"op": "list"}))?;
    std::thread::sleep(RESTART_SETTLE);
    let rss_kib = daemon.rss_kib()?;
    let ready_ms = ready.as_secs_f64() * 1e3;
    detail(&format!(
        "ready after {ready_ms:.1} ms with {} allocations; RSS {:.1} MiB {} s later",
        listed.as_array().map_or(0, Vec::len),
        mib(rss_kib),
        RESTART_SETTLE.as_secs()
    ));
    Ok((daemon, ready_ms, rss_kib))
}
