//! The ways of wiring a sandbox, and the phases that run them interleaved in blocks: block 1 of
//! every way, then block 2 of every way, ... so that a change of load on this shared machine
//! hits every way alike and the ratios stay meaningful. Each round starts with the next way:
//! the kernel work a way leaves behind (deferred device deletion, RCU callbacks, workqueue
//! items) slows whichever way runs next, and no way should always be the one that pays.
//!
//! Each caller is a thread of its own that entered the way's node namespace and spawns the
//! plugin as a Go runtime does (posix_spawn, a vfork-style clone, in testkit's
//! `exec_ok_from_node_thread`): no exec'd way pays for a copy of this process's mappings.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use super::daemon_phase::{Started, seen_created};
use super::machine::{self, CpuTimes};
use super::stats::{Samples, Summary};
use super::{
    Netns, Options, check_interrupted, plugin, reference_conflist, sandbox_namespaces, step,
};
use crate::step::detail;
use testkit::cni::{Plugin, plugin_stdin};
use testkit::daemon::{self, Daemon, sandbox_request};

/// Calls per way before measuring (first exec, page cache, daemon warm-up).
const WARMUP: usize = 3;
/// The interleaved phases, in the order they run.
pub const PHASES: [&str; 4] = [
    "sequential_add",
    "sequential_del",
    "concurrent_add",
    "concurrent_del",
];
/// The CNI commands: ADD and DEL (and the API's `add` and `del`).
pub const ADD: &str = "ADD";
pub const DEL: &str = "DEL";

/// One way of wiring a sandbox: its name, the plugin it execs (none: one request on the
/// daemon's socket from this process), and the daemon serving it, whose CPU time each block of
/// its calls is charged.
pub struct Way<'a>(
    pub &'static str,
    pub Option<&'a Plugin<'a>>,
    pub Option<&'a Daemon>,
);

impl Way<'_> {
    /// One call, from a thread that entered the way's node namespace: its latency as the
    /// caller sees it and the CPU time of the process it exec'd. Fails unless it succeeded.
    fn call(&self, verb: &str, id: &str, netns: &Path) -> Result<(Duration, Duration)> {
        if let Some(plugin) = self.1 {
            let run = plugin.exec_ok_from_node_thread(verb, id, netns)?;
            return Ok((run.elapsed, run.cpu));
        }
        let socket = &self
            .2
            .context("a way with neither plugin nor daemon")?
            .socket;
        let op = verb.to_ascii_lowercase();
        let request = sandbox_request(&op, id, netns);
        let started = Instant::now();
        let response = daemon::call(socket, &request)?;
        let elapsed = started.elapsed();
        daemon::ok(response).with_context(|| format!("{op} {id}"))?;
        Ok((elapsed, Duration::ZERO))
    }
}

/// A way with its own sandbox namespaces.
pub type Lane<'a> = (Way<'a>, &'a [Netns]);

/// Runs `verb` for `n` sandboxes per lane, the `i`th in the lane's pod `i` with container id
/// `<way>-<tag><i>`, every lane in turn by blocks of `block`, with `workers` concurrent callers
/// inside a block (1: sequential). One `Samples` per lane.
pub fn interleaved(
    lanes: &[Lane],
    (verb, tag): (&str, &str),
    n: usize,
    block: usize,
    workers: usize,
) -> Result<Vec<Samples>> {
    let mut out = vec![Samples::default(); lanes.len()];
    for (round, start) in (0..n).step_by(block.max(1)).enumerate() {
        let end = (start + block.max(1)).min(n);
        for k in 0..lanes.len() {
            let i = (round + k) % lanes.len();
            check_interrupted()?;
            let (way, pods) = &lanes[i];
            let daemon_cpu = || way.2.map_or(Ok(Duration::ZERO), Daemon::cpu_time);
            let (cpu_before, started) = (daemon_cpu()?, Instant::now());
            let calls = calls(way, (verb, tag), (start..end, pods), workers)?;
            out[i].extend(Samples {
                elapsed: started.elapsed(),
                wall: calls.iter().map(|c| c.0).collect(),
                process_cpu: calls.iter().map(|c| c.1).collect(),
                daemon_cpu: daemon_cpu()?.saturating_sub(cpu_before),
            });
        }
    }
    Ok(out)
}

/// One block of one way, sandboxes `range`: `workers` callers take the next one until none is
/// left; the first to fail stops the others. Each caller is a thread of its own that entered
/// the way's node namespace, where the plugins it spawns start.
fn calls(
    way: &Way,
    (verb, tag): (&str, &str),
    (range, pods): (Range<usize>, &[Netns]),
    workers: usize,
) -> Result<Vec<(Duration, Duration)>> {
    let (next, failed) = (AtomicUsize::new(range.start), AtomicBool::new(false));
    let worker = || -> Result<Vec<(Duration, Duration)>> {
        let mut mine = Vec::new();
        let result = way
            .1
            .map_or(Ok(()), |p| p.node.enter_thread())
            .and_then(|()| {
                loop {
                    check_interrupted()?;
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= range.end || failed.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    let id = format!("{}-{tag}{i}", way.0);
                    mine.push(way.call(verb, &id, pods[i].path())?);
                }
            });
        failed.fetch_or(result.is_err(), Ordering::SeqCst);
        result.map(|()| mine)
    };
    std::thread::scope(|scope| {
        let callers: Vec<_> = (0..workers.max(1)).map(|_| scope.spawn(worker)).collect();
        let mut all = Vec::with_capacity(range.len());
        for caller in callers {
            all.extend(caller.join().map_err(|_| anyhow!("caller panicked"))??);
        }
        Ok(all)
    })
}

/// Waits until `node` holds no link but `lo` (every veth of the last phase is gone).
pub fn settle(node: &testkit::Netns) -> Result<()> {
    let started = Instant::now();
    loop {
        let (links, waited) = (node.links()?, started.elapsed());
        if links.is_empty() {
            if waited > Duration::from_millis(50) {
                let ms = waited.as_secs_f64() * 1e3;
                detail(&format!("{} settled after {ms:.0} ms", node.name()));
            }
            return Ok(());
        }
        if waited > Duration::from_secs(30) {
            let (n, name, left) = (links.len(), node.name(), links.join(" "));
            bail!("{n} links left in node netns {name} after DEL: {left}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ways' samples per phase ([`PHASES`]), one per lane (reference, plugin, api), and the
/// hypervisor's steal over each phase, percent of the CPU time.
#[derive(Default)]
pub struct Ways {
    pub phases: [Vec<Samples>; 4],
    pub steal: [f64; 4],
}

/// The three ways, interleaved: `bins` are provisioner's and the reference's, `node` the
/// provisioner daemon's node namespace.
pub fn measure(
    opts: &Options,
    (bin, reference): (&Path, &Path),
    node: &Netns,
    tmp: &Path,
    (daemon, conflist, _): &Started,
) -> Result<Ways> {
    let per_way = opts.count.max(opts.concurrent_count).max(WARMUP);
    let node_ref = Netns::new("noderef")?;
    let pods_ref = sandbox_namespaces("r", per_way)?;
    let pods_plugin = seen_created(daemon, opts, "p", per_way)?;
    let pods_api = seen_created(daemon, opts, "a", per_way)?;
    let reference_stdin = plugin_stdin(&reference_conflist(&tmp.join("host-local")))?;
    let reference = plugin(reference, reference_stdin, &node_ref);
    let ours = plugin(bin, plugin_stdin(conflist)?, node);
    let lanes: [Lane; 3] = [
        (Way("reference", Some(&reference), None), &pods_ref),
        (Way("plugin", Some(&ours), Some(daemon)), &pods_plugin),
        (Way("api", None, Some(daemon)), &pods_api),
    ];
    for lane in &lanes {
        // Warm-up (first exec, page cache, the daemon's first sandbox), ids of their own.
        for verb in [ADD, DEL] {
            interleaved(std::slice::from_ref(lane), (verb, "w"), WARMUP, WARMUP, 1)?;
        }
    }
    let (n, m, c, b) = (
        opts.count,
        opts.concurrent_count,
        opts.concurrency,
        opts.block,
    );
    let plans = [
        (ADD, n, 1, b),
        (DEL, n, 1, b),
        (ADD, m, c, 4 * b),
        (DEL, m, c, 4 * b),
    ];
    let mut ways = Ways::default();
    for (i, (verb, n, workers, block)) in plans.into_iter().enumerate() {
        let (kind, _) = PHASES[i].split_once('_').unwrap_or_default();
        if verb == ADD {
            settle(&node_ref)?;
            settle(node)?;
            machine::wait_quiet(&format!("the {kind} phases"), opts.quiet_wait)?;
        }
        let phase = phase(&lanes, (verb, &kind[..1]), n, block, workers)?;
        (ways.phases[i], ways.steal[i]) = phase;
    }
    settle(&node_ref)?;
    settle(node)?;
    Ok(ways)
}

/// Runs one interleaved phase of every lane (`verb` with ids tagged `tag`) and prints a line
/// per lane; returns the samples per lane and the hypervisor's steal over the phase (percent
/// of the CPU time).
fn phase(
    lanes: &[Lane],
    (verb, tag): (&str, &str),
    n: usize,
    block: usize,
    workers: usize,
) -> Result<(Vec<Samples>, f64)> {
    let names: Vec<&str> = lanes.iter().map(|(way, _)| way.0).collect();
    let plural = if workers > 1 { "callers" } else { "caller" };
    let callers = format!("{workers} {plural}");
    let blocks = format!("interleaved in blocks of {block} ({})", names.join(", "));
    step(format!("{callers}: {verb} x{n} per way, {blocks}"));
    let before = CpuTimes::now()?;
    let out = interleaved(lanes, (verb, tag), n, block, workers)?;
    let cpu = CpuTimes::now()?.since(&before);
    for (name, samples) in names.iter().zip(&out) {
        detail(&format!("{name:<9} {}", Summary::of(samples).line()));
    }
    let steal = cpu.steal_percent();
    let busy = cpu.not_idle_percent() - steal;
    detail(&format!("CPUs: {busy:.0}% busy, steal {steal:.1}%"));
    Ok((out, steal))
}
