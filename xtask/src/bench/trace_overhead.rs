//! What kernel tracing costs: unrelated sendto work on the node and ADD latency, with the
//! daemon's kernel watch running (the eBPF programs attached, the correlator fed) against the
//! same daemon with its watch paused (`kernel_watch` off: no program attached, no intent
//! checked, as with `--no-trace`).
//!
//! The programs are attached to the whole node, so the two conditions cannot run side by side:
//! each round starts one daemon and measures both conditions in turn (which one goes first
//! swaps every round), pausing or resuming its watch in between. The comparison stays within
//! one process: ADD medians move by more from one daemon to the next than the tracer adds.
//! Each round measures
//! - UDP datagrams sent on `lo` in the node namespace, from a thread kept on one CPU: its CPU
//!   time per call (user + kernel, BPF included), the lowest of [`BLASTS`] measurements (other
//!   load on the machine disturbs a thread's CPU time through caches and interrupts);
//! - ADD then DEL of sandboxes through the CNI plugin path and the API, in blocks that
//!   alternate between the conditions (off, on, on, off; on, off, off, on in odd rounds), each
//!   after the machine is quiet, the two ways alternating call by call: an API ADD's latency
//!   has two modes a tenth of a millisecond apart, and a run of API calls stays in one of them
//!   for tens of calls.
//!
//! A row is the median of the rounds' own slowdowns (a round's figure with tracing on against
//! its figure off), with a 90 % interval from resampling the rounds (`pool::rows`). An ADD
//! block whose calls lost more than [`DISTURBING_STEAL_PERCENT`] of the CPU time to the
//! hypervisor is measured again.

use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::netns::Netns;
use super::proc_stat::{CpuTimes, DISTURBING_STEAL_PERCENT};
use super::report::Single;
use super::stats::{Percentiles, Samples, Summary};
use super::ways::{self, Lane, Verb, Way};
use super::{REFERENCE_DIR, check_interrupted, cpus, pool, provisioner_conflist, quiet};
use crate::step::{announce, detail};
use testkit::cni::{Plugin, plugin_stdin};
use testkit::daemon::{Daemon, write_conflist};

/// Rounds (each a daemon measured with its kernel watch running and paused). A round's ADD
/// figures move by more between rounds of one condition than the tracer adds: each round
/// compares its own conditions, and the more rounds, the less one of them moves the median.
const ROUNDS: usize = 16;
/// Datagrams per sendto measurement, after [`WARMUP_SENDS`].
const SENDS: usize = 25_000;
const WARMUP_SENDS: usize = 1000;
/// Sendto measurements per round and condition; the round's figure is the lowest. A
/// disturbance lasts up to a few hundred ms: more, shorter measurements find an undisturbed
/// one more often than a few long ones.
const BLASTS: usize = 6;
/// Sandboxes added (then deleted) per ADD block, per way.
const ADDS: usize = 60;
/// ADD blocks per condition in a round (off, on, then on, off).
const BLOCKS_PER_CONDITION: usize = 2;
/// Longest wait for a quiet machine before a sendto measurement or an ADD block.
const QUIET_BEFORE_ROUND: Duration = Duration::from_secs(10);
/// Most extra measurements of an ADD block that lost more than [`DISTURBING_STEAL_PERCENT`] to
/// steal, which slows whichever condition it hits by tens of percent. The last one counts
/// whatever its steal.
const STEAL_RETRIES: usize = 2;
/// A tmpfs on every Linux node with a C library's shared memory.
const TMPFS_DIR: &str = "/dev/shm";
/// At most this much slower with tracing, in percent.
pub(super) const TARGET_PERCENT: f64 = 5.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tracing {
    Off,
    On,
}

impl Tracing {
    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        ["off", "on"][self.index()]
    }
}

/// ADD latencies of one round: `[way][tracing]`, way 0 the plugin and 1 the API.
type RoundWalls = [[Vec<Duration>; 2]; 2];

/// What the rounds measured.
#[derive(Default)]
pub struct Results {
    /// Nanoseconds of CPU per sendto, one per round: `[tracing]`.
    sendto_ns: [Vec<f64>; 2],
    /// Every ADD: `[way][tracing]`.
    adds: [[Samples; 2]; 2],
    round_walls: Vec<RoundWalls>,
    /// ADD block measurements redone because of steal.
    remeasured: usize,
}

/// Runs the rounds with `bin` (a provisioner binary) in namespaces of its own, its daemons'
/// files on tmpfs ([`files_on_tmpfs`]).
pub fn run(bin: &Path) -> Result<Results> {
    announce(
        "bench",
        &format!(
            "tracer overhead: {ROUNDS} rounds of a daemon with its kernel watch paused and \
             running: {BLASTS} x {SENDS} UDP sendto in each condition, then ADD + DEL x{ADDS} \
             (plugin and API) in {} blocks alternating between them",
            2 * BLOCKS_PER_CONDITION
        ),
    );
    let files = files_on_tmpfs()?;
    let node = Netns::new("ovhnode")?;
    let mut results = Results::default();
    for index in 0..ROUNDS {
        let dir = files.path().join(format!("overhead-{index}"));
        let conflist = provisioner_conflist(&dir.join("provisioner.sock"));
        write_conflist(&dir, &conflist)?;
        let mut daemon = Daemon::spawn(bin, &node, &dir, &[])?;
        daemon.wait_ready(Duration::from_secs(10))?;
        wait_attached(&daemon)?;
        let round = Round {
            index,
            bin,
            node: &node,
            daemon: &daemon,
            conflist: &conflist,
        };
        round.measure(&mut results)?;
        daemon.stop()?;
        if let Err(err) = std::fs::remove_dir_all(&dir) {
            detail(&format!("could not remove {}: {err}", dir.display()));
        }
    }
    Ok(results)
}

/// One round's daemon, and what its measurements need.
struct Round<'a> {
    index: usize,
    bin: &'a Path,
    node: &'a Netns,
    daemon: &'a Daemon,
    conflist: &'a Value,
}

impl Round<'_> {
    /// Both conditions' sendto, then the ADD blocks, into `results`.
    fn measure(&self, results: &mut Results) -> Result<()> {
        let order = if self.index.is_multiple_of(2) {
            [Tracing::Off, Tracing::On]
        } else {
            [Tracing::On, Tracing::Off]
        };
        let mut sendto = [0.0; 2];
        for tracing in order {
            check_interrupted()?;
            switch_kernel_watch(self.daemon, tracing)?;
            quiet::wait(&self.what("sendto", tracing), QUIET_BEFORE_ROUND)?;
            sendto[tracing.index()] = lowest_sendto_cpu_ns(self.node)?;
        }
        detail(&format!(
            "round {}: sendto CPU off {:.0} ns, on {:.0} ns",
            self.index, sendto[0], sendto[1]
        ));
        let mut walls = RoundWalls::default();
        let blocks = (0..BLOCKS_PER_CONDITION).flat_map(|cycle| {
            if cycle % 2 == 0 {
                order
            } else {
                [order[1], order[0]]
            }
        });
        for (block, tracing) in blocks.enumerate() {
            check_interrupted()?;
            let added = self.add_block(block, tracing, &mut results.remeasured)?;
            for (way, samples) in added.into_iter().enumerate() {
                walls[way][tracing.index()].extend_from_slice(&samples.wall);
                results.adds[way][tracing.index()].extend(samples);
            }
        }
        for (all, this) in results.sendto_ns.iter_mut().zip(sendto) {
            all.push(this);
        }
        results.round_walls.push(walls);
        Ok(())
    }

    fn what(&self, part: &str, tracing: Tracing) -> String {
        format!("round {}, {part}, tracing {}", self.index, tracing.name())
    }

    /// ADD then DEL of [`ADDS`] sandboxes through the plugin and the API in the condition
    /// `tracing`: (plugin, API). As on a node, the sandbox namespaces are created (not timed)
    /// in the block's condition: a namespace the kernel watch did not see being created is read
    /// at its first ADD, which is the cost of a restart, not of an ADD.
    fn add_block(
        &self,
        block: usize,
        tracing: Tracing,
        redone: &mut usize,
    ) -> Result<[Samples; 2]> {
        switch_kernel_watch(self.daemon, tracing)?;
        let tag = format!("{}{}b{block}", tracing.name(), self.index);
        let plugin_pods = super::sandbox_namespaces(&format!("ovp{tag}-"), ADDS)?;
        let api_pods = super::sandbox_namespaces(&format!("ova{tag}-"), ADDS)?;
        let what = self.what(&format!("ADD block {block}"), tracing);
        let plugin = Plugin {
            bin: self.bin.to_path_buf(),
            cni_path: REFERENCE_DIR.to_owned(),
            stdin: plugin_stdin(self.conflist)?,
            node: self.node,
        };
        let lanes = [
            Lane {
                way: Way::Plugin(plugin, self.daemon),
                pods: &plugin_pods,
            },
            Lane {
                way: Way::Api(self.daemon),
                pods: &api_pods,
            },
        ];
        let mut attempt = 0;
        let (added, steal) = loop {
            // The block before's DELs and namespaces leave kernel work behind.
            quiet::wait(&what, QUIET_BEFORE_ROUND)?;
            let phase = format!("o{tag}a{attempt}-");
            let ids: Vec<Vec<String>> = lanes.iter().map(|l| ways::ids(l, &phase, ADDS)).collect();
            let cpu_before = CpuTimes::now()?;
            let added = ways::interleaved(&lanes, Verb::Add, &ids, 1, 1)?;
            let steal = CpuTimes::now()?.since(&cpu_before).steal_percent();
            ways::interleaved(&lanes, Verb::Del, &ids, 1, 1)?;
            if steal <= DISTURBING_STEAL_PERCENT || attempt == STEAL_RETRIES {
                break (added, steal);
            }
            detail(&format!(
                "{what}: {steal:.1}% of the CPU time stolen: measured again"
            ));
            attempt += 1;
            *redone += 1;
        };
        ways::settle(self.node)?;
        let medians: Vec<String> = added
            .iter()
            .map(|s| format!("{:.2}", Summary::of(s).median_ms))
            .collect();
        detail(&format!(
            "{what}: ADD median plugin, api {} ms (steal {steal:.1}%)",
            medians.join(", ")
        ));
        <[Samples; 2]>::try_from(added).map_err(|_| anyhow::anyhow!("{what}: not two ways"))
    }
}

/// A directory on tmpfs for the rounds' daemons (state, socket, log). An ADD waits for its
/// allocation's fsync, whose latency on a VM's disk moves a block's API ADD median by more
/// than the tracer adds, and the tracer adds nothing to it. On tmpfs an ADD is as short as its
/// CPU work, so what the tracer adds is the largest share it can be of an ADD. Where there is
/// no tmpfs to use, the rounds run on the system's temporary directory, and say so.
fn files_on_tmpfs() -> Result<tempfile::TempDir> {
    let builder = || {
        let mut builder = tempfile::Builder::new();
        builder.prefix("provisioner-overhead");
        builder
    };
    let on_tmpfs = builder()
        .tempdir_in(TMPFS_DIR)
        .map_err(anyhow::Error::from)
        .and_then(|dir| {
            let fs = nix::sys::statfs::statfs(dir.path())
                .with_context(|| format!("statfs {}", dir.path().display()))?;
            if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
                bail!("{TMPFS_DIR} is not a tmpfs");
            }
            Ok(dir)
        });
    on_tmpfs.or_else(|why| {
        detail(&format!(
            "{why:#}: the tracer's rounds keep their daemons' state on disk"
        ));
        Ok(builder().tempdir()?)
    })
}

/// Resumes the daemon's kernel watch and waits until its programs are attached, or pauses it
/// and waits until the programs it held are gone (the kernel frees a program shortly after its
/// last descriptor closes).
fn switch_kernel_watch(daemon: &Daemon, tracing: Tracing) -> Result<()> {
    let held = programs_held(daemon)?;
    daemon.request(&json!({"op": "kernel_watch", "on": tracing == Tracing::On}))?;
    match tracing {
        Tracing::On => wait_attached(daemon),
        Tracing::Off => wait_freed(&held),
    }
}

/// Polls the daemon until its kernel watch has attached the programs.
pub(super) fn wait_attached(daemon: &Daemon) -> Result<()> {
    let started = Instant::now();
    loop {
        let answer = daemon.request(&json!({"op": "sandboxes"}))?;
        match answer["tracing_unavailable"].as_str() {
            None => return Ok(()),
            Some(why) if started.elapsed() > Duration::from_secs(20) => {
                bail!(
                    "kernel watch not attached after 20 s: {why}; log:\n{}",
                    daemon.log_tail()
                )
            }
            Some(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The ids of the eBPF programs `daemon` holds a descriptor of (a program's or a link's
/// fdinfo names its `prog_id`): its own, where other daemons on the machine load the same.
fn programs_held(daemon: &Daemon) -> Result<Vec<u32>> {
    let pid = daemon.pid().context("the bench's daemon has exited")?;
    let dir = format!("/proc/{pid}/fdinfo");
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("read {dir}"))? {
        // A descriptor closed since the listing has no fdinfo left.
        let Ok(info) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let prog_ids = info.lines().filter_map(|l| l.strip_prefix("prog_id:"));
        ids.extend(prog_ids.filter_map(|id| id.trim().parse::<u32>().ok()));
    }
    Ok(ids)
}

fn wait_freed(ids: &[u32]) -> Result<()> {
    let started = Instant::now();
    while started.elapsed() < QUIET_BEFORE_ROUND {
        let loaded = aya::programs::loaded_programs().filter_map(Result::ok);
        if !loaded.map(|info| info.id()).any(|id| ids.contains(&id)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("the tracer's programs {ids:?} are still loaded after its watch was paused")
}

/// The lowest of [`BLASTS`] measurements of CPU nanoseconds per UDP sendto on `lo` of `node`,
/// on a thread that entered it and stays on the last CPU this process may run on (the CPUs of
/// a VM differ in speed from time to time).
fn lowest_sendto_cpu_ns(node: &Netns) -> Result<f64> {
    let cpu = cpus::last()?;
    let thread_cpu = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map(Duration::from)
            .context("CLOCK_THREAD_CPUTIME_ID")
    };
    let measure = || -> Result<f64> {
        cpus::pin_this_thread(cpu)?;
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
            #[expect(clippy::cast_precision_loss, reason = "SENDS is small")]
            let per_call = thread_cpu()?.saturating_sub(start).as_secs_f64() * 1e9 / SENDS as f64;
            lowest = lowest.min(per_call);
        }
        Ok(lowest)
    };
    std::thread::scope(|scope| {
        scope
            .spawn(measure)
            .join()
            .map_err(|_| anyhow::anyhow!("sendto thread panicked"))?
    })
}

impl Results {
    /// `way`'s ADD median of each round, in ms.
    fn round_medians_ms(&self, way: usize, tracing: Tracing) -> Vec<f64> {
        let median = |walls: &RoundWalls| Percentiles::of(&walls[way][tracing.index()]).ms(50.0);
        self.round_walls.iter().map(median).collect()
    }

    /// The run's tracer rows (see `pool::rows`).
    pub fn singles(&self) -> Result<Vec<Single>> {
        pool::rows(&[("this run".into(), self.json())])
    }

    pub fn json(&self) -> Value {
        let add = |way: usize| {
            json!({
                "off": Summary::of(&self.adds[way][0]).json(),
                "on": Summary::of(&self.adds[way][1]).json(),
                "round_medians_ms": {
                    "off": self.round_medians_ms(way, Tracing::Off),
                    "on": self.round_medians_ms(way, Tracing::On),
                },
            })
        };
        json!({
            "rounds": ROUNDS,
            "sends_per_measurement": SENDS,
            "measurements_per_round": BLASTS,
            "adds_per_block_and_way": ADDS,
            "add_blocks_per_condition": BLOCKS_PER_CONDITION,
            "steal_retry_percent": DISTURBING_STEAL_PERCENT,
            "measurements_redone_for_steal": self.remeasured,
            "sendto_cpu_ns": { "off": self.sendto_ns[0], "on": self.sendto_ns[1] },
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
        let calls = |ms: f64| vec![Duration::from_secs_f64(ms / 1e3); 8];
        let round: RoundWalls = [[calls(1.0), calls(1.02)], [calls(0.5), calls(0.52)]];
        let results = Results {
            sendto_ns: [vec![700.0; ROUNDS], vec![721.0; ROUNDS]],
            round_walls: vec![round; ROUNDS],
            ..Results::default()
        };
        let rows = results.singles()?;
        let slower: Vec<f64> = rows.iter().map(|r| r.value).collect();
        let expected = [2.0, 4.0, 3.0];
        assert_eq!(slower.len(), expected.len(), "{slower:?}");
        for (got, want) in slower.iter().zip(expected) {
            assert!((got - want).abs() < 0.2, "{slower:?}");
        }
        Ok(())
    }
}
