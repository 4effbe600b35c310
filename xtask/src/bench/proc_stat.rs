//! How the CPUs spent their time, from `/proc/stat`: read to wait for a quiet machine, and to
//! report how much of a timed part the hypervisor took for other guests (steal). On a VM whose
//! host is contended, steal makes every call of every way slower, in bursts: the absolute
//! figures of a part with steal are inflated, and its ratios are noisier.

use anyhow::{Context, Result};

/// Steal above this share of a span's CPU time (percent) disturbs what was measured in it: the
/// quiet wait waits while a spinning CPU loses more, a phase that lost more gets a note next to
/// the results, and a tracer round's condition that lost more is measured again.
pub const DISTURBING_STEAL_PERCENT: f64 = 5.0;

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
        let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
        Self::parse(&stat)
    }

    fn parse(stat: &str) -> Result<Self> {
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("cpu "))
            .context("/proc/stat without a cpu line")?
            .split_whitespace()
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .context("/proc/stat: a cpu field is not a number")?;
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

    pub fn total(&self) -> u64 {
        self.busy + self.idle + self.steal
    }

    /// Share of the time not idle (running, or waiting for the hypervisor), in percent.
    pub fn not_idle_percent(&self) -> f64 {
        percent(self.busy + self.steal, self.total())
    }

    /// Share of the time the hypervisor took (what `top` shows as `st`), in percent.
    pub fn steal_percent(&self) -> f64 {
        percent(self.steal, self.total())
    }

    /// Share of the time the VM wanted to run that the hypervisor took, in percent.
    pub fn steal_of_running_percent(&self) -> f64 {
        percent(self.steal, self.busy + self.steal)
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "jiffies of one run are far below 2^52"
)]
fn percent(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_line_splits_into_busy_idle_and_steal() -> Result<()> {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let stat = "cpu  100 5 40 800 20 3 2 30 0 0\ncpu0 50 2 20 400 10 1 1 15 0 0\n";
        let t = CpuTimes::parse(stat)?;
        assert_eq!(
            t,
            CpuTimes {
                busy: 150,
                idle: 820,
                steal: 30
            }
        );
        assert_eq!(t.total(), 1000);
        assert!((t.steal_percent() - 3.0).abs() < 1e-9);
        assert!((t.not_idle_percent() - 18.0).abs() < 1e-9);
        assert!((t.steal_of_running_percent() - 100.0 * 30.0 / 180.0).abs() < 1e-9);
        let later = CpuTimes {
            busy: 200,
            idle: 830,
            steal: 50,
        };
        assert_eq!(
            later.since(&t),
            CpuTimes {
                busy: 50,
                idle: 10,
                steal: 20
            }
        );
        Ok(())
    }

    #[test]
    fn a_file_without_a_cpu_line_is_an_error() {
        assert!(CpuTimes::parse("intr 1 2 3\n").is_err());
        assert!(CpuTimes::parse("cpu  1 x 3\n").is_err());
    }
}
