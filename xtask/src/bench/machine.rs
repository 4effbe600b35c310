//! The machine the bench runs on: how its CPUs spent their time (`/proc/stat`), waiting for it
//! to be quiet before a timed part, its load, and what it is.
//!
//! The kernel tears a network namespace down in a worker after `ip netns del` returned:
//! hundreds dropped at once keep a CPU and the rtnl lock busy for seconds, and whatever is
//! timed meanwhile pays for them. And on a VM whose host is contended, the hypervisor runs
//! other guests on our CPUs (steal), in bursts of seconds to minutes that slow every call of
//! every way: the absolute figures of a part with steal are inflated, its ratios noisier.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::step::detail;

/// Steal above this share of a span's CPU time (percent) disturbs what was measured in it: the
/// quiet wait waits while a spinning CPU loses more, a phase that lost more gets a note next to
/// the results, and a tracer round's ADD block that lost more is measured again.
pub const DISTURBING_STEAL_PERCENT: f64 = 5.0;
/// Quiet: the CPUs were this idle over one [`WINDOW`] (percent, iowait counted as idle).
const IDLE_PERCENT: f64 = 90.0;
const WINDOW: Duration = Duration::from_millis(300);
/// How long one CPU spins to see whether the hypervisor takes it away (`/proc/stat` counts in
/// 10 ms ticks: 30 of them).
const STEAL_PROBE: Duration = Duration::from_millis(300);

/// Jiffies of all CPUs together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Running anything: user, nice, system, irq, softirq.
    pub busy: u64,
    /// Idle, iowait included.
    pub idle: u64,
    /// Wanted to run, and the hypervisor ran something else.
    pub steal: u64,
}

impl CpuTimes {
    /// The counters since boot.
    pub fn now() -> Result<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").context("read /proc/stat")?)
    }

    fn parse(stat: &str) -> Result<Self> {
        let line = stat.lines().next().and_then(|l| l.strip_prefix("cpu "));
        let line = line.context("/proc/stat without a cpu line")?;
        let fields: Result<Vec<u64>, _> = line.split_whitespace().take(8).map(str::parse).collect();
        let fields = fields.context("/proc/stat: a cpu field is not a number")?;
        let field = |i: usize| fields.get(i).copied().unwrap_or(0);
        Ok(Self {
            busy: field(0) + field(1) + field(2) + field(5) + field(6),
            idle: field(3) + field(4),
            steal: field(7),
        })
    }

    /// What the CPUs did between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(earlier.busy),
            idle: self.idle.saturating_sub(earlier.idle),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }

    /// Share of the time not idle (running, or waiting for the hypervisor), in percent.
    pub fn not_idle_percent(&self) -> f64 {
        percent(self.busy + self.steal, self.busy + self.idle + self.steal)
    }

    /// Share of the time the hypervisor took (what `top` shows as `st`), in percent.
    pub fn steal_percent(&self) -> f64 {
        percent(self.steal, self.busy + self.idle + self.steal)
    }

    /// Share of the time the VM wanted to run that the hypervisor took, in percent.
    fn steal_of_running_percent(&self) -> f64 {
        percent(self.steal, self.busy + self.steal)
    }
}

fn percent(part: u64, total: u64) -> f64 {
    part as f64 * 100.0 / total.max(1) as f64
}

/// Waits until the CPUs were [`IDLE_PERCENT`] idle over one [`WINDOW`] and a spinning CPU lost
/// at most [`DISTURBING_STEAL_PERCENT`] of its time to the hypervisor, for at most `max`,
/// before `what` is timed. Says so when that took a while or did not happen (the part is
/// timed anyway, and its absolute numbers are inflated).
pub fn wait_quiet(what: &str, max: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let before = CpuTimes::now()?;
        std::thread::sleep(WINDOW);
        let window = CpuTimes::now()?.since(&before);
        let busy = window.not_idle_percent();
        let why = if busy > 100.0 - IDLE_PERCENT || window == CpuTimes::default() {
            format!("the machine was still busy ({busy:.0}% of the CPUs)")
        } else {
            let stolen = stolen_while_spinning()?;
            if stolen <= DISTURBING_STEAL_PERCENT {
                if started.elapsed() > (WINDOW + STEAL_PROBE) * 2 {
                    let waited = started.elapsed().as_secs_f64();
                    let line = format!("waited {waited:.1} s for a quiet machine");
                    detail(&format!("{line} before {what}"));
                }
                return Ok(());
            }
            format!("the hypervisor still took {stolen:.0}% of a spinning CPU (steal)")
        };
        if started.elapsed() >= max {
            let max = max.as_secs_f64();
            detail(&format!("{why} after {max:.0} s; timing {what} anyway"));
            return Ok(());
        }
    }
}

/// Spins this thread for [`STEAL_PROBE`] on an otherwise idle machine; returns the share of
/// that time the hypervisor took, in percent.
fn stolen_while_spinning() -> Result<f64> {
    let before = CpuTimes::now()?;
    let until = Instant::now() + STEAL_PROBE;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    Ok(CpuTimes::now()?.since(&before).steal_of_running_percent())
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    loadavg.split_whitespace().next()?.parse().ok()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

pub fn warn_if_busy(load: Option<f64>) {
    if let Some(load) = load
        && load > cpus() as f64 * 0.75
    {
        detail(&format!(
            "note: the machine is busy (load average {load:.1} on {} CPUs): absolute numbers \
             are inflated, compare the ratios",
            cpus()
        ));
    }
}

/// The kernel, the CPU model and count.
pub fn describe() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name"));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({
        "kernel": kernel.trim(),
        "cpu": model.map(|l| l.trim_start_matches([' ', '\t', ':'])),
        "cpus": cpus(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_line_splits_into_busy_idle_and_steal() -> Result<()> {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let stat = "cpu  100 5 40 800 20 3 2 30 0 0\ncpu0 50 2 20 400 10 1 1 15 0 0\n";
        let t = CpuTimes::parse(stat)?;
        assert_eq!((t.busy, t.idle, t.steal), (150, 820, 30));
        assert!((t.steal_percent() - 3.0).abs() < 1e-9);
        assert!((t.not_idle_percent() - 18.0).abs() < 1e-9);
        assert!((t.steal_of_running_percent() - 100.0 * 30.0 / 180.0).abs() < 1e-9);
        let later = CpuTimes { busy: 200, ..t }.since(&t);
        assert_eq!((later.busy, later.idle, later.steal), (50, 0, 0));
        assert!(CpuTimes::parse("intr 1 2 3\n").is_err());
        assert!(CpuTimes::parse("cpu  1 x 3\n").is_err());
        Ok(())
    }
}
