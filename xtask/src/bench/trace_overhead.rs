//! What kernel tracing costs: unrelated sendto work on the node and ADD latency, with the
//! daemon's kernel watch running (the eBPF programs attached, the correlator fed) against the
//! same daemon with its watch paused (`kernel_watch` off: no program attached, no intent
//! checked; the daemon answers once its programs are detached). The sendto work is measured a
//! third time with the backends of older kernels (syscall tracepoints for rtnetlink, unshare
//! and mounts; namespaces named by inode generation), run by a second daemon of the round
//! (`--trace-backend`) while the first one's watch is paused: what a node on such a kernel
//! pays.
//!
//! The programs are attached to the whole node, so the two conditions cannot run side by side:
//! each round starts one daemon and measures both conditions in turn (which one goes first
//! swaps every round). The comparison stays within one process: ADD medians move by more from
//! one daemon to the next than the tracer adds. Each round measures
//! - UDP datagrams sent on `lo` in the node namespace, from a thread kept on one CPU: its CPU
//!   time per call (user + kernel, BPF included), the lowest of [`BLASTS`] measurements (other
//!   load on the machine disturbs a thread's CPU time for up to a few hundred ms);
//! - ADD then DEL of sandboxes through the CNI plugin path and the API, in blocks that
//!   alternate between the conditions (off, on, on, off; on, off, off, on in odd rounds), each
//!   after the machine is quiet, the two ways alternating call by call: an API ADD's latency
//!   has two modes a tenth of a millisecond apart, and a run of API calls stays in one of them
//!   for tens of calls. An ADD block whose calls lost more than [`DISTURBING_STEAL_PERCENT`]
//!   of the CPU time to the hypervisor is measured again.
//!
//! A row is the median of the rounds' own slowdowns (a round's figure with tracing on against
//! its figure off), with a 90 % interval from resampling the rounds (`pool::rows`).

use std::net::UdpSocket;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use serde_json::{Value, json};

use super::machine::{CpuTimes, DISTURBING_STEAL_PERCENT, wait_quiet};
use super::netns::Netns;
use super::report::Single;
use super::stats::{Samples, Summary, median_ms, thread_cpu};
use super::ways::{self, ADD, DEL, Lane, Way};
use super::{
    Options, check_interrupted, plugin, pool, provisioner_conflist, sandbox_namespaces, step,
};
use crate::step::detail;
use testkit::cni::{Plugin, plugin_stdin};
use testkit::daemon::{Daemon, write_conflist};

/// Datagrams per sendto measurement, after [`WARMUP_SENDS`].
/// Longest wait for a daemon's kernel watch to attach its programs.
pub const ATTACH_WITHIN: Duration = Duration::from_secs(20);
const SENDS: usize = 25_000;
const WARMUP_SENDS: usize = 1000;
/// Sendto measurements per round and condition; the round's figure is the lowest: more,
/// shorter measurements find an undisturbed one more often than a few long ones.
const BLASTS: usize = 6;
/// Sandboxes added (then deleted) per ADD block, per way.
const ADDS: usize = 60;
/// A round's ADD blocks, tracing on or off: off, on, on, off (on, off, off, on in odd rounds).
const BLOCKS: [bool; 4] = [false, true, true, false];
/// Most extra measurements of an ADD block that lost more than [`DISTURBING_STEAL_PERCENT`] to
/// steal. The last one counts whatever its steal.
const STEAL_RETRIES: usize = 2;
/// The rounds' daemons keep their files on tmpfs (`/dev/shm`, on every Linux node with a C
/// library's shared memory): an ADD waits for its allocation's fsync,
/// whose latency on a VM's disk moves a block's median by more than the tracer adds. On tmpfs
/// an ADD is as short as its CPU work, and the tracer's share of it the largest it can be.
const TMPFS_DIR: &str = "/dev/shm";
/// At most this much slower with tracing, in percent.
pub const TARGET_PERCENT: f64 = 5.0;
/// At most this much slower with the older kernels' backends, in percent.
pub const OLDER_BACKENDS_TARGET_PERCENT: f64 = 10.0;

fn condition(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// What the rounds measured, one figure per round: `[off, on]`.
#[derive(Default)]
pub struct Results {
    /// Nanoseconds of CPU per sendto.
    sendto_ns: [Vec<f64>; 2],
    /// Nanoseconds of CPU per sendto with the older kernels' backends attached.
    sendto_older_backends_ns: Vec<f64>,
    /// The backends forced for that measurement (`observation=backend`, comma separated).
    older_backends: String,
    /// ADD medians in ms, `[way]` with way 0 the plugin and 1 the API.
    add_medians_ms: [[Vec<f64>; 2]; 2],
    /// ADD block measurements redone because of steal.
    remeasured: usize,
}

/// Runs `--rounds` rounds with `bin` (a provisioner binary) in namespaces of its own, its
/// daemons' files on tmpfs.
pub fn run(opts: &Options, bin: &Path) -> Result<Results> {
    let rounds = opts.rounds;
    step(format!(
        "tracer overhead: {rounds} rounds of a daemon with its kernel watch paused and \
             running: {BLASTS} x {SENDS} UDP sendto in each condition, then ADD + DEL x{ADDS} \
             (plugin and API) in {} blocks alternating between them",
        BLOCKS.len()
    ));
    let files = tempfile::Builder::new()
        .prefix("provisioner-overhead")
        .tempdir_in(TMPFS_DIR);
    let files = files.with_context(|| format!("a directory on {TMPFS_DIR}"))?;
    let node = Netns::new("ovhnode")?;
    let older = crate::matrix::older_kernels_backends_here(bin);
    detail(&format!(
        "older kernels' backends forced on this host: {older}"
    ));
    let older_args: Vec<String> = older
        .split(',')
        .flat_map(|choice| ["--trace-backend".to_owned(), choice.to_owned()])
        .collect();
    let older_args: Vec<&str> = older_args.iter().map(String::as_str).collect();
    let mut results = Results {
        older_backends: older.clone(),
        ..Results::default()
    };
    for index in 0..rounds {
        let dir = files.path().join(format!("overhead-{index}"));
        let conflist = provisioner_conflist(&dir.join("provisioner.sock"));
        write_conflist(&dir, &conflist)?;
        let mut daemon = Daemon::spawn(bin, &node, &dir, &[])?;
        daemon.wait_ready(Duration::from_secs(10))?;
        daemon.wait_tracing(ATTACH_WITHIN)?;
        let older_dir = files.path().join(format!("overhead-{index}-older"));
        write_conflist(
            &older_dir,
            &provisioner_conflist(&older_dir.join("provisioner.sock")),
        )?;
        let mut older_daemon = Daemon::spawn(bin, &node, &older_dir, &older_args)?;
        older_daemon.wait_ready(Duration::from_secs(10))?;
        older_daemon.wait_tracing(ATTACH_WITHIN)?;
        switch_kernel_watch(&older_daemon, false)?;
        let plugin = plugin(bin, plugin_stdin(&conflist)?, &node);
        let quiet = opts.quiet_wait / 3;
        Round {
            index,
            plugin,
            daemon: &daemon,
            older: &older_daemon,
            quiet,
        }
        .measure(&mut results)?;
        daemon.stop()?;
        older_daemon.stop()?;
        // What could not be removed goes with `files`.
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&older_dir);
    }
    Ok(results)
}

/// One round's daemon, and what its measurements need.
struct Round<'a> {
    index: usize,
    plugin: Plugin<'a>,
    daemon: &'a Daemon,
    /// A daemon whose kernel watch runs on the older kernels' backends (paused but for its
    /// sendto measurement).
    older: &'a Daemon,
    /// Longest wait for a quiet machine before a measurement.
    quiet: Duration,
}

impl Round<'_> {
    /// Both conditions' sendto, then the ADD blocks, into `results`.
    fn measure(&self, results: &mut Results) -> Result<()> {
        let odd = self.index % 2 == 1;
        let mut sendto = [0.0; 2];
        for on in [odd, !odd] {
            check_interrupted()?;
            switch_kernel_watch(self.daemon, on)?;
            wait_quiet(&self.what("sendto", on), self.quiet)?;
            sendto[usize::from(on)] = lowest_sendto_cpu_ns(self.plugin.node)?;
        }
        switch_kernel_watch(self.daemon, false)?;
        switch_kernel_watch(self.older, true)?;
        wait_quiet(
            &self.what("sendto, older kernels' backends", true),
            self.quiet,
        )?;
        let older_ns = lowest_sendto_cpu_ns(self.plugin.node)?;
        switch_kernel_watch(self.older, false)?;
        results.sendto_older_backends_ns.push(older_ns);
        let ([off_ns, on_ns], index) = (sendto, self.index);
        let line = format!(
            "round {index}: sendto off {off_ns:.0} ns, on {on_ns:.0} ns, older kernels' backends {older_ns:.0} ns"
        );
        detail(&line);
        // `[tracing][way]`
        let mut walls: [[Vec<Duration>; 2]; 2] = Default::default();
        for (block, on) in BLOCKS.map(|on| on != odd).into_iter().enumerate() {
            check_interrupted()?;
            let added = self.add_block(block, on, &mut results.remeasured)?;
            for (way, samples) in added.into_iter().enumerate() {
                walls[usize::from(on)][way].extend(samples.wall);
            }
        }
        for (on, (ns, walls)) in sendto.into_iter().zip(&walls).enumerate() {
            results.sendto_ns[on].push(ns);
            for (way, walls) in walls.iter().enumerate() {
                results.add_medians_ms[way][on].push(median_ms(walls));
            }
        }
        Ok(())
    }

    fn what(&self, part: &str, on: bool) -> String {
        format!("round {}, {part}, tracing {}", self.index, condition(on))
    }

    /// ADD then DEL of [`ADDS`] sandboxes through the plugin and the API with tracing `on` or
    /// off: (plugin, API). As on a node, the sandbox namespaces are created (not timed) in the
    /// block's condition: a namespace the kernel watch did not see being created is read at its
    /// first ADD, which is the cost of a restart, not of an ADD.
    fn add_block(&self, block: usize, on: bool, redone: &mut usize) -> Result<Vec<Samples>> {
        switch_kernel_watch(self.daemon, on)?;
        let tag = format!("{}{}b{block}", condition(on), self.index);
        let plugin_pods = sandbox_namespaces(&format!("ovp{tag}-"), ADDS)?;
        let api_pods = sandbox_namespaces(&format!("ova{tag}-"), ADDS)?;
        let lanes: [Lane; 2] = [
            (
                Way("plugin", Some(&self.plugin), Some(self.daemon)),
                &plugin_pods,
            ),
            (Way("api", None, Some(self.daemon)), &api_pods),
        ];
        let what = self.what(&format!("ADD block {block}"), on);
        let mut attempt = 0;
        loop {
            // The block before's DELs and namespaces leave kernel work behind.
            wait_quiet(&what, self.quiet)?;
            let phase = format!("o{tag}a{attempt}-");
            let cpu_before = CpuTimes::now()?;
            let added = ways::interleaved(&lanes, (ADD, &phase), ADDS, 1, 1)?;
            let steal = CpuTimes::now()?.since(&cpu_before).steal_percent();
            ways::interleaved(&lanes, (DEL, &phase), ADDS, 1, 1)?;
            if steal <= DISTURBING_STEAL_PERCENT || attempt == STEAL_RETRIES {
                ways::settle(self.plugin.node)?;
                let [plugin, api] = [0, 1].map(|way| Summary::of(&added[way]).median_ms);
                let medians = format!("plugin {plugin:.2} ms, api {api:.2} ms");
                detail(&format!("{what}: ADD median {medians} (steal {steal:.1}%)"));
                return Ok(added);
            }
            detail(&format!("{what}: {steal:.1}% stolen: measured again"));
            attempt += 1;
            *redone += 1;
        }
    }
}

/// Resumes the daemon's kernel watch and waits until its programs are attached, or pauses it
/// (the daemon answers once the programs are detached).
fn switch_kernel_watch(daemon: &Daemon, on: bool) -> Result<()> {
    daemon.request(&json!({"op": "kernel_watch", "on": on}))?;
    if on {
        daemon.wait_tracing(ATTACH_WITHIN)
    } else {
        Ok(())
    }
}

/// The lowest of [`BLASTS`] measurements of CPU nanoseconds per UDP sendto on `lo` of `node`,
/// on a thread that entered it and stays on the last CPU this process may run on (the CPUs of
/// a VM differ in speed from time to time).
fn lowest_sendto_cpu_ns(node: &testkit::Netns) -> Result<f64> {
    let mask = sched_getaffinity(Pid::from_raw(0))?;
    let cpu = (0..CpuSet::count()).rfind(|&cpu| mask.is_set(cpu).unwrap_or(false));
    let cpu = cpu.context("no CPU in this process's affinity mask")?;
    let measure = || -> Result<f64> {
        let mut only = CpuSet::new();
        only.set(cpu)?;
        sched_setaffinity(Pid::from_raw(0), &only)?;
        node.enter_thread()?;
        let rx = UdpSocket::bind("127.0.0.1:0")?;
        let tx = UdpSocket::bind("127.0.0.1:0")?;
        let (to, payload) = (rx.local_addr()?, [0u8; 64]);
        let mut lowest = f64::INFINITY;
        for _ in 0..BLASTS {
            for _ in 0..WARMUP_SENDS {
                tx.send_to(&payload, to)?;
            }
            let start = thread_cpu()?;
            for _ in 0..SENDS {
                tx.send_to(&payload, to)?;
            }
            let per_call = thread_cpu()?.saturating_sub(start).as_secs_f64() * 1e9 / SENDS as f64;
            lowest = lowest.min(per_call);
        }
        Ok(lowest)
    };
    let joined = std::thread::scope(|s| s.spawn(measure).join());
    joined.map_err(|_| anyhow!("sendto thread panicked"))?
}

impl Results {
    /// The run's tracer rows (see `pool::rows`).
    pub fn singles(&self) -> Result<Vec<Single>> {
        pool::rows(&[("this run".into(), self.json())])
    }

    pub fn json(&self) -> Value {
        let pair = |v: &[Vec<f64>; 2]| json!({ "off": v[0], "on": v[1] });
        let add = |way: usize| json!({ "round_medians_ms": pair(&self.add_medians_ms[way]) });
        json!({
            "rounds": self.sendto_ns[0].len(),
            "sends_per_measurement": SENDS,
            "measurements_per_round": BLASTS,
            "adds_per_block_and_way": ADDS,
            "add_blocks_per_condition": BLOCKS.len() / 2,
            "steal_retry_percent": DISTURBING_STEAL_PERCENT,
            "measurements_redone_for_steal": self.remeasured,
            "sendto_cpu_ns": pair(&self.sendto_ns),
            "older_kernels_backends": self.older_backends,
            "sendto_cpu_ns_older_kernels_backends": {
                "off": self.sendto_ns[0],
                "on": self.sendto_older_backends_ns,
            },
            "plugin_add": add(0),
            "api_add": add(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_come_from_the_rounds_in_the_json() -> Result<()> {
        let results = Results {
            sendto_ns: [vec![700.0; 16], vec![721.0; 16]],
            sendto_older_backends_ns: vec![756.0; 16],
            older_backends: "rtnetlink=syscall_tracepoints".into(),
            add_medians_ms: [
                [vec![1.0; 16], vec![1.02; 16]],
                [vec![0.5; 16], vec![0.52; 16]],
            ],
            remeasured: 0,
        };
        let slower: Vec<f64> = results.singles()?.iter().map(|r| r.value).collect();
        let expected = [2.0, 4.0, 3.0, 8.0];
        assert_eq!(slower.len(), expected.len(), "{slower:?}");
        for (got, want) in slower.iter().zip(expected) {
            assert!((got - want).abs() < 0.2, "{slower:?}");
        }
        Ok(())
    }
}
