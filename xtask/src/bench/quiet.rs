//! Waiting for the machine to be quiet before a timed part. The kernel tears a network namespace
//! down in a worker after `ip netns del` returned: hundreds dropped at once keep a CPU and the
//! rtnl lock busy for seconds, and whatever is timed meanwhile (the next part, or the next
//! condition of the tracer's alternating rounds) pays for them.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::step::detail;

/// Quiet: the CPUs were this idle over one window (percent, iowait counted as idle).
const IDLE_PERCENT: u64 = 90;
/// The window the idle share is measured over.
const WINDOW: Duration = Duration::from_millis(300);

/// Busy and total jiffies of all CPUs so far (`/proc/stat`).
fn cpu_jiffies() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
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
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

/// Waits until the CPUs were [`IDLE_PERCENT`] idle over one [`WINDOW`], for at most `max`,
/// before `what` is timed. Says so when that took a while or did not happen (other load on the
/// machine: the part is timed anyway, and its absolute numbers are inflated).
pub fn wait(what: &str, max: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let (busy_before, total_before) = cpu_jiffies()?;
        std::thread::sleep(WINDOW);
        let (busy, total) = cpu_jiffies()?;
        let (busy, total) = (busy - busy_before, total - total_before);
        if total > 0 && busy * 100 <= total * (100 - IDLE_PERCENT) {
            if started.elapsed() > WINDOW * 2 {
                detail(&format!(
                    "waited {:.1} s for the machine to be quiet before {what}",
                    started.elapsed().as_secs_f64()
                ));
            }
            return Ok(());
        }
        if started.elapsed() >= max {
            detail(&format!(
                "the machine was still busy ({}% of the CPUs) after {:.0} s; {what} is timed anyway",
                busy * 100 / total.max(1),
                max.as_secs_f64()
            ));
            return Ok(());
        }
    }
}
