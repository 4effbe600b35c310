//! The daemon on its own: start to ready (fresh, and with N allocations to reconcile), and its
//! RSS idle, with N sandboxes, and after a restart on that state.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use super::machine::wait_quiet;
use super::stats::{Samples, Summary};
use super::ways::{self, ADD, DEL, Way};
use super::{
    Daemon, Netns, Options, provisioner_conflist, sandbox_namespaces, step, trace_overhead,
};
use crate::step::detail;
use testkit::daemon::write_conflist;

/// Fresh daemons started for start-to-ready, the last one the daemon the ways use.
const FRESH_STARTS: usize = 4;
/// The RSS phase's daemon judges its sandboxes this soon after their ADD...
const RSS_TRACE_DEADLINE: Duration = Duration::from_secs(1);
/// ...and the RSS is read this long after that (the verdicts come at the driver's next tick).
const VERDICT_SETTLE: Duration = Duration::from_secs(2);
/// The kernel watch loads in the background after ready: the RSS after a restart is read
/// this long after ready.
const RESTART_SETTLE: Duration = Duration::from_secs(2);

/// The daemon the ways use, its network, and what its start measured.
pub type Started = (Daemon, Value, DaemonResults);

/// What the daemon phases measured.
#[derive(Default)]
pub struct DaemonResults {
    pub fresh_starts: Vec<Duration>,
    pub rss_idle_kib: u64,
    pub rss_loaded_kib: u64,
    pub restart_ready: Duration,
    /// [`RESTART_SETTLE`] after the restart's ready.
    pub rss_after_restart_kib: u64,
    /// The API ADDs that provisioned the sandboxes.
    pub provision: Option<Summary>,
}

/// Starts a daemon in `dir` (its conf written there) and waits for ready; start-to-ready time.
fn start_daemon(
    (bin, node, dir): (&Path, &Netns, &Path),
    opts: &Options,
    args: &[&str],
) -> Result<(Daemon, Value, Duration)> {
    let conflist = provisioner_conflist(&dir.join("provisioner.sock"));
    write_conflist(dir, &conflist)?;
    let no_trace = opts.no_trace.then_some("--no-trace");
    let args: Vec<&str> = args.iter().copied().chain(no_trace).collect();
    let daemon = Daemon::spawn(bin, node, dir, &args)?;
    let ready = daemon.wait_ready(Duration::from_secs(10))?;
    Ok((daemon, conflist, ready))
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// [`FRESH_STARTS`] fresh daemons started, all but the last stopped; the last is the one the
/// ways use.
pub fn start(opts: &Options, bin: &Path, node: &Netns, tmp: &Path) -> Result<Started> {
    let what = format!("provisioner daemon: start to ready, {FRESH_STARTS} fresh starts");
    step(what);
    let mut results = DaemonResults::default();
    let mut start = |i: usize| -> Result<(Daemon, Value)> {
        let dir = tmp.join(format!("start{i}"));
        let (daemon, conflist, ready) = start_daemon((bin, node, &dir), opts, &[])?;
        results.fresh_starts.push(ready);
        Ok((daemon, conflist))
    };
    for i in 1..FRESH_STARTS {
        start(i)?.0.stop()?;
    }
    let (daemon, conflist) = start(FRESH_STARTS)?;
    results.rss_idle_kib = daemon.rss_kib()?;
    let (starts, rss) = (&results.fresh_starts, mib(results.rss_idle_kib));
    detail(&format!(
        "ready after {starts:.1?}; RSS {rss:.1} MiB, no sandbox"
    ));
    Ok((daemon, conflist, results))
}

/// `n` sandbox namespaces named `<prefix><i>`, created once `daemon`'s kernel watch is attached
/// (when it runs one), not timed: a runtime creates a sandbox's netns just before its ADD, with
/// the kernel watch running (a netns created before costs a read of its state at its first ADD).
pub fn seen_created(daemon: &Daemon, opts: &Options, prefix: &str, n: usize) -> Result<Vec<Netns>> {
    if !opts.no_trace {
        daemon.wait_tracing(trace_overhead::ATTACH_WITHIN)?;
    }
    let created = Instant::now();
    let pods = sandbox_namespaces(prefix, n)?;
    let took = created.elapsed();
    detail(&format!("{n} sandbox netns in {took:.1?}"));
    Ok(pods)
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
    let (mut daemon, _, mut results) = started;
    daemon.stop()?;
    ways::settle(node)?;
    let (dir, n) = (tmp.join("rss"), opts.sandboxes);
    let deadline = RSS_TRACE_DEADLINE.as_secs().to_string();
    let args = ["--trace-deadline", deadline.as_str()];
    let (mut daemon, _, _) = start_daemon((bin, node, &dir), opts, &args)?;
    let pods = seen_created(&daemon, opts, "s", n)?;
    wait_quiet("the RSS phase", opts.quiet_wait)?;
    let callers = opts.concurrency;
    let what = format!("RSS with {n} sandboxes ({callers} callers through the API)");
    step(format!("provisioner daemon (fresh): {what}"));
    let provision = Summary::of(&through_api(&daemon, &pods, ADD, opts)?);
    if !opts.no_trace {
        std::thread::sleep(RSS_TRACE_DEADLINE + VERDICT_SETTLE);
    }
    // Read before the daemon answers a request about every sandbox.
    results.rss_loaded_kib = daemon.rss_kib()?;
    let mut judged = String::new();
    if !opts.no_trace {
        let answer = daemon.request(&json!({"op": "sandboxes"}))?;
        let views = answer["sandboxes"].as_array().cloned().unwrap_or_default();
        let given = views.iter().filter(|v| !v["verdict"].is_null()).count();
        judged = format!(", {given} of {} sandbox views judged", views.len());
    }
    let (line, rss) = (provision.line(), mib(results.rss_loaded_kib));
    detail(&format!("provisioned: {line}; RSS {rss:.1} MiB{judged}"));
    results.provision = Some(provision);
    daemon.stop()?;
    let mut daemon = restart(opts, (bin, node, &dir), &mut results)?;
    step(format!("cleanup: DEL of the {n} sandboxes"));
    through_api(&daemon, &pods, DEL, opts)?;
    ways::settle(node)?;
    daemon.stop()?;
    Ok(results)
}

/// `verb` of one sandbox in each of `pods` through the API, by `--concurrency` callers.
fn through_api(daemon: &Daemon, pods: &[Netns], verb: &str, opts: &Options) -> Result<Samples> {
    let lane = [(Way("api", None, Some(daemon)), pods)];
    let (n, callers) = (pods.len(), opts.concurrency);
    Ok(ways::interleaved(&lane, (verb, "rss"), n, n, callers)?.remove(0))
}

/// A daemon started on the state in `dir`, its start to ready and its RSS once the kernel
/// watch loaded written to `results`.
fn restart(
    opts: &Options,
    at: (&Path, &Netns, &Path),
    results: &mut DaemonResults,
) -> Result<Daemon> {
    let n = opts.sandboxes;
    step(format!(
        "provisioner daemon: restart with {n} allocations, start to ready"
    ));
    let (daemon, _, ready) = start_daemon(at, opts, &[])?;
    let listed = daemon.request(&json!({"op": "list"}))?;
    std::thread::sleep(RESTART_SETTLE);
    (results.restart_ready, results.rss_after_restart_kib) = (ready, daemon.rss_kib()?);
    let (allocations, settle) = (
        listed.as_array().map_or(0, Vec::len),
        RESTART_SETTLE.as_secs(),
    );
    let rss = format!(
        "RSS {:.1} MiB {settle} s later",
        mib(results.rss_after_restart_kib)
    );
    let line = format!("ready after {ready:.1?}, {allocations} allocations; {rss}");
    detail(&line);
    Ok(daemon)
}
