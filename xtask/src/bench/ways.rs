//! The ways of wiring a sandbox, and phases that run them interleaved in blocks: block 1 of
//! every way, then block 2 of every way, ... so that a change of load on this shared machine
//! hits every way alike and the ratios stay meaningful. Each round starts with the next way:
//! the kernel work a way leaves behind (deferred device deletion, RCU callbacks, workqueue
//! items) slows whichever way runs next, and no way should always be the one that pays.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use super::check_interrupted;
use super::netns::Netns;
use super::stats::Samples;
use crate::step::detail;
use testkit::cni::Plugin;
use testkit::daemon::{self, Daemon, sandbox_request};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verb {
    Add,
    Del,
}

impl Verb {
    fn cni(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
        }
    }

    fn api(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Del => "del",
        }
    }
}

/// One way of wiring a sandbox.
pub enum Way<'a> {
    /// ptp + host-local, exec'd.
    Reference(Plugin<'a>),
    /// provisioner exec'd in CNI plugin mode, served by `daemon`.
    Plugin(Plugin<'a>, &'a Daemon),
    /// One request on the daemon's socket from this process (no exec).
    Api(&'a Daemon),
}

impl Way<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Reference(_) => "reference",
            Self::Plugin(..) => "plugin",
            Self::Api(_) => "api",
        }
    }

    /// Makes the calling thread a runtime's thread on this way's node: in its node namespace,
    /// where the plugins it spawns start.
    fn enter_node(&self) -> Result<()> {
        match self {
            Self::Reference(plugin) | Self::Plugin(plugin, _) => plugin.node.enter_thread(),
            Self::Api(_) => Ok(()),
        }
    }

    /// One call, from a thread that entered the node ([`Way::enter_node`]): its latency as the
    /// caller sees it and the CPU time of the process it exec'd. Fails unless it succeeded.
    fn call(&self, verb: Verb, id: &str, netns: &Path) -> Result<(Duration, Duration)> {
        match self {
            Self::Reference(plugin) | Self::Plugin(plugin, _) => {
                let run = plugin.exec_ok_from_node_thread(verb.cni(), id, netns)?;
                Ok((run.elapsed, run.cpu))
            }
            Self::Api(daemon) => {
                let request = sandbox_request(verb.api(), id, netns);
                let started = Instant::now();
                let response = daemon::call(&daemon.socket, &request)?;
                let elapsed = started.elapsed();
                daemon::ok(response).with_context(|| format!("{} {id}", verb.api()))?;
                Ok((elapsed, Duration::ZERO))
            }
        }
    }

    fn daemon(&self) -> Option<&Daemon> {
        match self {
            Self::Reference(_) => None,
            Self::Plugin(_, d) | Self::Api(d) => Some(d),
        }
    }
}

/// A way with its own sandbox namespaces.
pub struct Lane<'a> {
    pub way: Way<'a>,
    pub pods: &'a [Netns],
}

/// Container ids of a phase of a lane: `<way>-<phase><i>`.
pub fn ids(lane: &Lane, phase: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{}-{phase}{i}", lane.way.name()))
        .collect()
}

/// Runs `verb` for `ids[i]` in `lane.pods[i]`, every lane in turn by blocks of `block`, with
/// `workers` concurrent callers inside a block (1: sequential). One `Samples` per lane.
pub fn interleaved(
    lanes: &[Lane],
    verb: Verb,
    ids: &[Vec<String>],
    block: usize,
    workers: usize,
) -> Result<Vec<Samples>> {
    let n = ids.first().map_or(0, Vec::len);
    let mut out = vec![Samples::default(); lanes.len()];
    let mut start = 0;
    let mut round = 0;
    while start < n {
        let end = (start + block.max(1)).min(n);
        for k in 0..lanes.len() {
            let i = (round + k) % lanes.len();
            let (lane, lane_ids, samples) = (&lanes[i], &ids[i], &mut out[i]);
            check_interrupted()?;
            let daemon_before = lane.way.daemon().map(Daemon::cpu_time).transpose()?;
            let started = Instant::now();
            let calls = calls(
                lane,
                verb,
                &lane_ids[start..end],
                &lane.pods[start..end],
                workers,
            )?;
            let elapsed = started.elapsed();
            let daemon_cpu = match (lane.way.daemon(), daemon_before) {
                (Some(d), Some(before)) => d.cpu_time()?.saturating_sub(before),
                _ => Duration::ZERO,
            };
            samples.extend(Samples {
                wall: calls.iter().map(|c| c.0).collect(),
                process_cpu: calls.iter().map(|c| c.1).collect(),
                daemon_cpu,
                elapsed,
            });
        }
        start = end;
        round += 1;
    }
    Ok(out)
}

/// One block of one lane: `workers` callers (threads of their own, in the lane's node
/// namespace) take the next id until none is left; the first to fail stops the others.
fn calls(
    lane: &Lane,
    verb: Verb,
    ids: &[String],
    pods: &[Netns],
    workers: usize,
) -> Result<Vec<(Duration, Duration)>> {
    let (next, failed) = (AtomicUsize::new(0), AtomicBool::new(false));
    let worker = || -> Result<Vec<(Duration, Duration)>> {
        let mut mine = Vec::new();
        let result = lane.way.enter_node().and_then(|()| {
            loop {
                check_interrupted()?;
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= ids.len() || failed.load(Ordering::SeqCst) {
                    return Ok(());
                }
                mine.push(lane.way.call(verb, &ids[i], pods[i].path())?);
            }
        });
        failed.fetch_or(result.is_err(), Ordering::SeqCst);
        result.map(|()| mine)
    };
    std::thread::scope(|scope| {
        let callers: Vec<_> = (0..workers.max(1)).map(|_| scope.spawn(worker)).collect();
        let mut all = Vec::with_capacity(ids.len());
        for caller in callers {
            all.extend(
                caller
                    .join()
                    .map_err(|_| anyhow!("a caller thread panicked"))??,
            );
        }
        Ok(all)
    })
}

/// Waits until `node` holds no link but `lo` (every veth of the last phase is gone).
pub fn settle(node: &Netns) -> Result<()> {
    let started = Instant::now();
    loop {
        let links = node.links()?;
        if links.is_empty() {
            if started.elapsed() > Duration::from_millis(50) {
                detail(&format!(
                    "{} settled after {:.0} ms",
                    node.name(),
                    started.elapsed().as_secs_f64() * 1e3
                ));
            }
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "{} links left in node netns {} after DEL: {}",
                links.len(),
                node.name(),
                links.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
