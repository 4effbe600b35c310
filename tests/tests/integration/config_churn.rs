//! Config churn: the conf dir's network file rewritten in place 50 times a second (two valid
//! configs that differ only in MTU, and a broken one; each written in two pieces, so that a
//! reader can catch it half-written) while 16 callers ADD and DEL for 10 s. Every ADD is
//! served by one whole valid config (its pod's MTU is one of the two), none fails, and the
//! daemon never says it is ready on the broken config. Needs root.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::Netns;
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::pod_net::{ip_in, wait_node_bare};
use serde_json::Value;

const CALLERS: usize = 16;
const CHURN: Duration = Duration::from_secs(10);
/// 50 rewrites a second.
const REWRITE_EVERY: Duration = Duration::from_millis(20);
const MTUS: [u64; 2] = [1400, 1450];
/// What the broken config says: never in force.
const BROKEN_MTU: u64 = 9000;
const SUBNET: &str = "10.251.17.0/24";

fn config_file(daemon: &Daemon) -> Result<PathBuf> {
    let dir = daemon
        .socket
        .parent()
        .context("the daemon's socket has a directory")?;
    Ok(dir.join("net.d").join("10-provisioner.conflist"))
}

/// The three contents: valid with each MTU, then broken (a subnet no network can have).
fn contents(socket: &Path) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for mtu in MTUS {
        let mut config = conflist("churnnet", "1.1.0", socket, SUBNET, None);
        config["plugins"][0]["mtu"] = Value::from(mtu);
        out.push(serde_json::to_vec_pretty(&config)?);
    }
    let mut broken = conflist("churnnet", "1.1.0", socket, "10.251.17.0/33", None);
    broken["plugins"][0]["mtu"] = Value::from(BROKEN_MTU);
    out.push(serde_json::to_vec_pretty(&broken)?);
    Ok(out)
}

/// Rewrites `file` in place (truncate, then two writes) until `stop`; how many rewrites.
fn churn(file: &Path, contents: &[Vec<u8>], stop: &AtomicBool) -> Result<usize> {
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let bytes = &contents[n % contents.len()];
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(file)
            .with_context(|| format!("open {}", file.display()))?;
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        f.write_all(head)?;
        f.flush()?;
        std::thread::sleep(Duration::from_millis(1));
        f.write_all(tail)?;
        drop(f);
        n += 1;
        std::thread::sleep(REWRITE_EVERY);
    }
    Ok(n)
}

/// The MTU of eth0 in `pod`.
fn pod_mtu(pod: &Netns) -> Result<u64> {
    let link = ip_in(pod.path(), &["-o", "link", "show", "dev", "eth0"])?;
    let words: Vec<&str> = link.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "mtu")
        .and_then(|i| words.get(i + 1))
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("no mtu in {link:?}"))
}

/// One caller: ADD, check the pod's MTU, DEL, until `stop`; how many cycles.
/// The MTUs pods were wired with go into `seen`.
fn caller(
    c: usize,
    pod: &Netns,
    stdin: &[u8],
    stop: &AtomicBool,
    seen: &Mutex<BTreeSet<u64>>,
) -> Result<usize> {
    let id = format!("churn{c}");
    let mut cycles = 0;
    while !stop.load(Ordering::SeqCst) {
        let add = run_plugin("ADD", &id, Some(pod.path()), "eth0", stdin)?;
        if add.code != 0 {
            bail!("ADD {id} failed during the churn: {add:?}");
        }
        let mtu = pod_mtu(pod)?;
        ensure!(
            MTUS.contains(&mtu),
            "{id} wired with MTU {mtu}, not one of {MTUS:?}"
        );
        seen.lock()
            .map_err(|_| anyhow::anyhow!("a caller panicked"))?
            .insert(mtu);
        let del = run_plugin("DEL", &id, Some(pod.path()), "eth0", stdin)?;
        if del.code != 0 {
            bail!("DEL {id} failed during the churn: {del:?}");
        }
        cycles += 1;
    }
    Ok(cycles)
}

/// Polls the status until `stop`: the daemon is ready throughout (the last good config stays
/// in force) and never on the broken config; how many polls.
fn watch_status(daemon_cli: &dyn Fn() -> Result<Value>, stop: &AtomicBool) -> Result<usize> {
    let mut polls = 0;
    while !stop.load(Ordering::SeqCst) {
        let status = daemon_cli()?;
        let mtu = status["network"]["mtu"].as_u64();
        ensure!(
            status["ready"] == true,
            "not ready during the churn: {status}"
        );
        ensure!(
            mtu.is_some_and(|m| MTUS.contains(&m)),
            "ready with MTU {mtu:?}: {status}"
        );
        let ranges = status["network"]["ranges"].to_string();
        ensure!(ranges.contains(SUBNET), "ready with ranges {ranges}");
        polls += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(polls)
}

#[test]
fn config_rewritten_in_place_under_load_never_serves_a_broken_or_half_written_one() -> Result<()> {
    let node = Netns::new("ccnode")?;
    let daemon = Daemon::start_with_conflist(&node, &["--no-trace"], |socket| {
        let mut config = conflist("churnnet", "1.1.0", socket, SUBNET, None);
        config["plugins"][0]["mtu"] = Value::from(MTUS[0]);
        config
    })?;
    daemon.wait_ready(Duration::from_secs(20))?;
    let file = config_file(&daemon)?;
    ensure!(
        file.exists(),
        "{} is not the daemon's config",
        file.display()
    );
    let contents = contents(&daemon.socket)?;
    let stdin = serde_json::to_vec(&plugin_stdin(
        &serde_json::from_slice(&contents[0])?,
        "1.1.0",
    ))?;
    let pods: Vec<Netns> = (0..CALLERS)
        .map(|_| Netns::new("ccpod"))
        .collect::<Result<_>>()?;

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Mutex::new(BTreeSet::new());
    let started = Instant::now();
    let outcome = std::thread::scope(|scope| {
        let writer = scope.spawn(|| churn(&file, &contents, &stop));
        let status = scope.spawn(|| {
            let cli = || -> Result<Value> {
                let out = daemon.cli(&["status", "--json"])?;
                serde_json::from_slice(&out.stdout).context("status --json")
            };
            watch_status(&cli, &stop)
        });
        let callers: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(c, pod)| {
                let (stdin, stop, seen) = (&stdin, &stop, &seen);
                scope.spawn(move || caller(c, pod, stdin, stop, seen))
            })
            .collect();
        // Any failure stops everyone at once.
        while started.elapsed() < CHURN
            && !writer.is_finished()
            && !status.is_finished()
            && !callers
                .iter()
                .any(std::thread::ScopedJoinHandle::is_finished)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::SeqCst);
        let join = |r: std::thread::Result<Result<usize>>| {
            r.unwrap_or_else(|_| Err(anyhow::anyhow!("a thread panicked")))
        };
        let rewrites = join(writer.join())?;
        let polls = join(status.join())?;
        let mut cycles = 0;
        for c in callers {
            cycles += join(c.join())?;
        }
        Ok::<_, anyhow::Error>((rewrites, polls, cycles))
    });
    let (rewrites, polls, cycles) = outcome.with_context(|| daemon.log())?;
    ensure!(
        started.elapsed() >= CHURN,
        "stopped early after {:?}",
        started.elapsed()
    );
    ensure!(
        rewrites >= 100 && polls >= 10 && cycles >= CALLERS,
        "too little happened: {rewrites} rewrites, {polls} status polls, {cycles} ADD+DEL cycles"
    );

    let seen = seen.into_inner().unwrap_or_default();
    ensure!(
        seen.len() == MTUS.len(),
        "pods were wired with MTUs {seen:?} only: the rewrites were not followed"
    );

    // A valid config written last: the daemon settles on it.
    std::fs::write(&file, &contents[1])?;
    daemon.wait_for_status(
        "the last valid config in force",
        Duration::from_secs(10),
        |status| status["ready"] == true && status["network"]["mtu"] == MTUS[1],
    )?;
    wait_node_bare(&node, Duration::from_secs(10))
}
