//! A soak of the daemon: ADD+DEL cycles from concurrent callers (each in a sandbox namespace
//! of its own, a new container id per cycle), with kernel tracing on, and after every window
//! of cycles what a leak would show: resident memory, open fds, threads, the store file's
//! size, the node's link count, and the window's ADD latency. Shared by `cargo xtask soak`
//! and the soak test.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::Netns;
use crate::daemon::{Daemon, call, ok, sandbox_request, write_conflist};

/// The soak's pod CIDR.
const SUBNET: &str = "10.252.64.0/22";

#[derive(Debug, Clone)]
pub struct Options {
    /// ADD+DEL cycles in all.
    pub cycles: usize,
    /// Concurrent callers.
    pub callers: usize,
    /// Cycles per window (one sample each).
    pub every: usize,
}

/// The daemon and the node after `cycles` cycles.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub cycles: usize,
    pub rss_kib: u64,
    pub fds: usize,
    pub threads: u64,
    pub store_bytes: u64,
    /// Links in the node namespace besides `lo`.
    pub links: usize,
    /// The window's ADD latency (zero for the sample before the first cycle).
    pub add_p50: Duration,
    pub add_p99: Duration,
    /// The daemon's CPU time (all threads) per cycle in the window: unlike latency, hardly
    /// moved by other processes competing for the CPUs.
    pub cpu_per_cycle: Duration,
}

impl Sample {
    /// A header line for [`Self::row`].
    #[must_use]
    pub fn header() -> String {
        format!(
            "{:>8} {:>9} {:>5} {:>7} {:>11} {:>6} {:>9} {:>9} {:>10}",
            "cycles",
            "rss_kib",
            "fds",
            "threads",
            "store_bytes",
            "links",
            "add_p50",
            "add_p99",
            "cpu/cycle"
        )
    }

    /// One table row.
    #[must_use]
    pub fn row(&self) -> String {
        format!(
            "{:>8} {:>9} {:>5} {:>7} {:>11} {:>6} {:>7.1}ms {:>7.1}ms {:>8.2}ms",
            self.cycles,
            self.rss_kib,
            self.fds,
            self.threads,
            self.store_bytes,
            self.links,
            self.add_p50.as_secs_f64() * 1e3,
            self.add_p99.as_secs_f64() * 1e3,
            self.cpu_per_cycle.as_secs_f64() * 1e3
        )
    }
}

/// Runs the soak with the daemon `bin` (its files under `dir`); `on_sample` sees each sample
/// as it is taken (the first before any cycle). Every ADD and DEL must succeed.
pub fn run(
    bin: &Path,
    dir: &Path,
    opts: &Options,
    mut on_sample: impl FnMut(&Sample),
) -> Result<Vec<Sample>> {
    if opts.callers == 0 || opts.every == 0 {
        bail!("soak: callers and every must be at least 1");
    }
    let node = Netns::new("soaknode")?;
    let pods: Vec<Netns> = (0..opts.callers)
        .map(|_| Netns::new("soakpod"))
        .collect::<Result<_>>()?;
    let socket = dir.join("provisioner.sock");
    write_conflist(
        dir,
        &json!({
            "cniVersion": "1.1.0",
            "name": "soak",
            "plugins": [{
                "type": "provisioner",
                "socket": socket,
                "ipam": { "ranges": [[{ "subnet": SUBNET }]], "routes": [{ "dst": "0.0.0.0/0" }] }
            }]
        }),
    )?;
    let mut daemon = Daemon::spawn(bin, &node, dir, &[])?;
    daemon.wait_ready(Duration::from_secs(30))?;
    // The start of the soak has the kernel watch's programs and maps loaded: their fds and
    // memory are not growth, and every cycle is traced.
    daemon.wait_tracing(Duration::from_secs(60))?;
    let mut samples = Vec::new();
    let mut cpu = daemon.cpu_time()?;
    let first = sample(&daemon, &node, 0, &mut Vec::new(), Duration::ZERO)?;
    on_sample(&first);
    samples.push(first);
    let mut done = 0;
    while done < opts.cycles {
        let end = (done + opts.every).min(opts.cycles);
        let mut latencies = window(&daemon, &pods, done, end)
            .with_context(|| format!("cycles {done}..{end}; log:\n{}", daemon.log_tail()))?;
        let cycles = u32::try_from(end - done).unwrap_or(u32::MAX);
        let cpu_now = daemon.cpu_time()?;
        let per_cycle = cpu_now.saturating_sub(cpu) / cycles;
        cpu = cpu_now;
        done = end;
        let s = sample(&daemon, &node, done, &mut latencies, per_cycle)?;
        on_sample(&s);
        samples.push(s);
    }
    if let (Some(start), Some(end)) = (samples.get(1).map(|s| s.threads), samples.last_mut()) {
        end.threads = threads_settled(&daemon, start)?;
    }
    daemon.stop()?;
    Ok(samples)
}

/// The daemon's thread count once it is back to `start`, or as it is after [`THREADS_SETTLE`]:
/// the threads its blocking pool started for a burst leave when idle for tokio's keep-alive
/// (10 s), a leaked thread never does.
fn threads_settled(daemon: &Daemon, start: u64) -> Result<u64> {
    let deadline = Instant::now() + THREADS_SETTLE;
    loop {
        let threads = threads_of(daemon)?;
        if threads <= start || Instant::now() >= deadline {
            return Ok(threads);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Longer than tokio's blocking-pool keep-alive.
const THREADS_SETTLE: Duration = Duration::from_secs(15);

fn threads_of(daemon: &Daemon) -> Result<u64> {
    let pid = daemon.pid().context("the daemon is not running")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no Threads in /proc/<pid>/status")
}

/// Cycles `from..to`, taken in turn by one thread per pod; the ADD latencies.
fn window(daemon: &Daemon, pods: &[Netns], from: usize, to: usize) -> Result<Vec<Duration>> {
    let next = AtomicUsize::new(from);
    let latencies = Mutex::new(Vec::with_capacity(to - from));
    std::thread::scope(|scope| {
        let callers: Vec<_> = pods
            .iter()
            .map(|pod| {
                let (next, latencies) = (&next, &latencies);
                scope.spawn(move || -> Result<()> {
                    loop {
                        let cycle = next.fetch_add(1, Ordering::SeqCst);
                        if cycle >= to {
                            return Ok(());
                        }
                        let id = format!("soak{cycle}");
                        let started = Instant::now();
                        ok(call(
                            &daemon.socket,
                            &sandbox_request("add", &id, pod.path()),
                        )?)
                        .with_context(|| format!("ADD {id}"))?;
                        let took = started.elapsed();
                        latencies
                            .lock()
                            .map_err(|_| anyhow::anyhow!("a caller panicked"))?
                            .push(took);
                        ok(call(
                            &daemon.socket,
                            &sandbox_request("del", &id, pod.path()),
                        )?)
                        .with_context(|| format!("DEL {id}"))?;
                    }
                })
            })
            .collect();
        for caller in callers {
            caller
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a caller thread panicked")))?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    latencies
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a caller panicked"))
}

/// The sample after `cycles` cycles. The node's retired links are deleted in the background:
/// its link count is read once no link is left (waited for a little), or as it is then.
fn sample(
    daemon: &Daemon,
    node: &Netns,
    cycles: usize,
    latencies: &mut [Duration],
    cpu_per_cycle: Duration,
) -> Result<Sample> {
    let pid = daemon.pid().context("the daemon is not running")?;
    let settle = Instant::now() + Duration::from_secs(5);
    let mut links = node.links()?.len();
    while links > 0 && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(50));
        links = node.links()?.len();
    }
    let threads = threads_of(daemon)?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let store_bytes = std::fs::metadata(daemon.data_dir.join("ipam.redb"))
        .map(|m| m.len())
        .unwrap_or_default();
    latencies.sort_unstable();
    Ok(Sample {
        cycles,
        rss_kib: daemon.rss_kib()?,
        fds,
        threads,
        store_bytes,
        links,
        add_p50: percentile(latencies, 50),
        add_p99: percentile(latencies, 99),
        cpu_per_cycle,
    })
}

/// How far the end of a soak may be from its start. The start is the sample after the first
/// window (allocator arenas, caches and pools warmed up by then), the end the last sample.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Resident memory may grow by this fraction of the start, or by `rss_slack_kib`,
    /// whichever is more.
    pub rss_growth: f64,
    pub rss_slack_kib: u64,
    pub fds: usize,
    pub threads: u64,
    /// The store file may grow by this many bytes.
    pub store_bytes: u64,
    /// The last window's median ADD latency may exceed the first's by this fraction (`None`:
    /// reported, not bounded: on a machine others load, wall time says little).
    pub add_p50_growth: Option<f64>,
    /// The last window's daemon CPU time per cycle may exceed the first's by this fraction
    /// (`None`: reported, not bounded).
    pub cpu_per_cycle_growth: Option<f64>,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            rss_growth: 0.10,
            rss_slack_kib: 8 * 1024,
            fds: 8,
            threads: 4,
            store_bytes: 1 << 20,
            add_p50_growth: Some(0.10),
            cpu_per_cycle_growth: Some(0.10),
        }
    }
}

/// What exceeds `bounds` between the start and the end of `samples` (at least two windows),
/// one line each; empty when the soak held.
#[must_use]
pub fn violations(samples: &[Sample], bounds: &Bounds) -> Vec<String> {
    let (Some(start), Some(end)) = (samples.get(1), samples.last()) else {
        return vec!["fewer than one window of cycles".to_owned()];
    };
    let mut out = Vec::new();
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "KiB of a process: far below 2^52, non-negative"
    )]
    let rss_allowed = start.rss_kib
        + ((start.rss_kib as f64 * bounds.rss_growth) as u64).max(bounds.rss_slack_kib);
    if end.rss_kib > rss_allowed {
        out.push(format!(
            "resident memory {} KiB -> {} KiB (allowed {rss_allowed})",
            start.rss_kib, end.rss_kib
        ));
    }
    if end.fds > start.fds + bounds.fds {
        out.push(format!("open fds {} -> {}", start.fds, end.fds));
    }
    if end.threads > start.threads + bounds.threads {
        out.push(format!("threads {} -> {}", start.threads, end.threads));
    }
    if end.store_bytes > start.store_bytes + bounds.store_bytes {
        out.push(format!(
            "store file {} -> {} bytes",
            start.store_bytes, end.store_bytes
        ));
    }
    if end.links != samples[0].links {
        out.push(format!(
            "node links {} before the soak, {} after",
            samples[0].links, end.links
        ));
    }
    if let Some(growth) = bounds.add_p50_growth {
        let allowed = start.add_p50.mul_f64(1.0 + growth);
        if end.add_p50 > allowed {
            out.push(format!(
                "median ADD latency {:?} in the first window, {:?} in the last (allowed {allowed:?})",
                start.add_p50, end.add_p50
            ));
        }
    }
    if let Some(growth) = bounds.cpu_per_cycle_growth {
        let allowed = start.cpu_per_cycle.mul_f64(1.0 + growth);
        if end.cpu_per_cycle > allowed {
            out.push(format!(
                "daemon CPU per cycle {:?} in the first window, {:?} in the last (allowed {allowed:?})",
                start.cpu_per_cycle, end.cpu_per_cycle
            ));
        }
    }
    out
}

/// The `p`th percentile of sorted `values` (nearest rank); zero when empty.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        let values: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&values, 50), ms(50));
        assert_eq!(percentile(&values, 99), ms(99));
        assert_eq!(percentile(&[ms(7)], 99), ms(7));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
