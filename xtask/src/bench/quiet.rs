//! Waiting for the machine to be quiet before a timed part. The kernel tears a network namespace
//! down in a worker after `ip netns del` returned: hundreds dropped at once keep a CPU and the
//! rtnl lock busy for seconds, and whatever is timed meanwhile (the next part, or the next
//! condition of the tracer's alternating rounds) pays for them.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::proc_stat::CpuTimes;
use crate::step::detail;

/// Quiet: the CPUs were this idle over one window (percent, iowait counted as idle).
const IDLE_PERCENT: u32 = 90;
/// The window the idle share is measured over.
const WINDOW: Duration = Duration::from_millis(300);

/// Waits until the CPUs were [`IDLE_PERCENT`] idle over one [`WINDOW`], for at most `max`,
/// before `what` is timed. Says so when that took a while or did not happen (other load on the
/// machine: the part is timed anyway, and its absolute numbers are inflated).
pub fn wait(what: &str, max: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let before = CpuTimes::now()?;
        std::thread::sleep(WINDOW);
        let window = CpuTimes::now()?.since(&before);
        if window.total() > 0 && window.not_idle_percent() <= f64::from(100 - IDLE_PERCENT) {
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
                "the machine was still busy ({:.0}% of the CPUs) after {:.0} s; {what} is timed anyway",
                window.not_idle_percent(),
                max.as_secs_f64()
            ));
            return Ok(());
        }
    }
}
