//! A daemon short of file descriptors. Its open-files limit is lowered (prlimit, while it runs)
//! to a few above what it holds at rest, and 16 callers ADD at once, each ADD holding its
//! connection for half a second (the `add.slow` failpoint): the burst needs more descriptors
//! than the daemon has. Every descriptor the limit allows is seen taken, and an accept fails
//! with EMFILE.
//! Every caller is answered, the one whose connection waited in the backlog included: success,
//! or "try again later" (11) naming the EMFILE with nothing wired, which the caller retries as
//! a runtime does. Every ADD succeeds in the end, the daemon survives and holds no more
//! descriptors than before, and the store equals the kernel. Needs root and prlimit
//! (util-linux).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::crash_harness::{CrashDaemon, assert_converged};
use provisioner_tests::pod_net::wait_node_bare;
use provisioner_tests::{Netns, wait_until};

const CALLERS: usize = 16;
const PER_CALLER: usize = 2;
/// Descriptors the daemon may open beyond those it holds at rest: fewer than the burst's
/// connections alone.
const SPARE: usize = 8;
/// How long a caller keeps retrying an ADD answered "try again later".
const RETRY_FOR: Duration = Duration::from_secs(60);
const EMFILE: &str = "Too many open files (os error 24)";

/// How many descriptors the daemon holds with a number below `below`.
fn descriptors(pid: u32, below: usize) -> Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(entry) = entry else { continue };
        if entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|fd| fd < below)
        {
            count += 1;
        }
    }
    Ok(count)
}

/// Samples the daemon's descriptors below `limit` until stopped; the most seen at once.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl Sampler {
    fn start(pid: u32, limit: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(Ordering::Relaxed) {
                if let Ok(count) = descriptors(pid, limit) {
                    peak = peak.max(count);
                }
            }
            peak
        });
        Self { stop, thread }
    }

    fn stop(self) -> Result<usize> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the sampler panicked"))
    }
}

/// ADD `container` until it succeeds; an answer other than success must be "try again later"
/// naming the EMFILE. Counts those in `retried`.
fn add_retrying(
    daemon: &CrashDaemon,
    container: &str,
    pod: &Netns,
    retried: &AtomicUsize,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let run = daemon.plugin("ADD", container, Some(pod.path()))?;
        if run.code == 0 {
            return Ok(());
        }
        ensure!(
            run.stdout.contains("\"code\":11") && run.stdout.contains(EMFILE),
            "ADD {container}: neither success nor try again later for want of descriptors: {run:?}"
        );
        retried.fetch_add(1, Ordering::Relaxed);
        ensure!(
            started.elapsed() < RETRY_FOR,
            "ADD {container} still told to try again after {RETRY_FOR:?}: {run:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_burst_that_meets_the_fd_limit_is_answered_and_the_daemon_survives() -> Result<()> {
    let node = Netns::new("fdnode")?;
    let mut daemon = CrashDaemon::new("fdnet", "10.251.18.0/24")?;
    daemon.start(&node, Some("add.slow"))?;
    let pid = daemon.pid().context("the daemon runs")?;
    // Every descriptor it holds, whatever its number (it may hold one above the limit to come).
    let at_rest = descriptors(pid, usize::MAX)?;
    let limit = at_rest + SPARE;
    let prlimit = testkit::tools::PRLIMIT.require()?;
    let out = std::process::Command::new(prlimit)
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={limit}:{limit}"),
        ])
        .output()?;
    ensure!(out.status.success(), "prlimit: {out:?}");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    ensure!(
        limits.lines().any(|l| l.starts_with("Max open files")
            && l.split_whitespace().nth(3) == Some(limit.to_string().as_str())),
        "{limits}"
    );
    let pods: Arc<Vec<Netns>> = Arc::new(
        (0..CALLERS * PER_CALLER)
            .map(|_| Netns::new("fdpod"))
            .collect::<Result<_>>()?,
    );
    let daemon = Arc::new(daemon);
    let retried = Arc::new(AtomicUsize::new(0));
    let sampler = Sampler::start(pid, limit);
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (pods, daemon, retried) =
                (Arc::clone(&pods), Arc::clone(&daemon), Arc::clone(&retried));
            std::thread::spawn(move || -> Result<()> {
                for k in 0..PER_CALLER {
                    let i = c * PER_CALLER + k;
                    add_retrying(&daemon, &format!("fd{i}"), &pods[i], &retried)?;
                }
                Ok(())
            })
        })
        .collect();
    let mut failed = Vec::new();
    for caller in callers {
        match caller.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed.push(format!("{e:#}")),
            Err(_) => failed.push("a caller thread panicked".to_owned()),
        }
    }
    let peak = sampler.stop()?;
    let retried = retried.load(Ordering::Relaxed);
    eprintln!(
        "open-files limit {limit} ({at_rest} at rest + {SPARE}): peak {peak} of the {limit} \
         descriptors the limit allows; {retried} ADDs answered try again later"
    );
    if !failed.is_empty() {
        bail!("{}\n{}", failed.join("\n"), daemon.log());
    }
    let log = daemon.log();
    // The pressure: every descriptor the limit allows taken, and an accept that met it.
    ensure!(
        peak == limit,
        "the burst did not take every descriptor: {peak} of {limit}\n{log}"
    );
    ensure!(
        log.lines()
            .any(|l| l.contains("accept failed") && l.contains(EMFILE)),
        "no accept met EMFILE:\n{log}"
    );
    // Survived: running, answering, and back to the descriptors it held at rest.
    ensure!(daemon.running(), "the daemon died:\n{log}");
    let allocations = assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    ensure!(allocations.len() == CALLERS * PER_CALLER, "{allocations:?}");
    let addresses: HashSet<&String> = allocations.iter().flat_map(|a| &a.addresses).collect();
    ensure!(addresses.len() == allocations.len(), "{allocations:?}");
    for (i, pod) in pods.iter().enumerate() {
        let run = daemon.plugin("DEL", &format!("fd{i}"), Some(pod.path()))?;
        ensure!(run.code == 0, "DEL fd{i}: {run:?}");
    }
    wait_node_bare(&node, Duration::from_secs(10))?;
    let mut held = 0;
    wait_until(
        "the daemon back to its descriptors at rest",
        Duration::from_secs(10),
        || {
            held = descriptors(pid, usize::MAX)?;
            Ok((held <= at_rest).then_some(()))
        },
    )
    .with_context(|| format!("{held} held, {at_rest} at rest"))
}
