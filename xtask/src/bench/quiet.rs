//! Waiting for the machine to be quiet before a timed part. The kernel tears a network namespace
//! down in a worker after `ip netns del` returned: hundreds dropped at once keep a CPU and the
//! rtnl lock busy for seconds, and whatever is timed meanwhile (the next part, or the next
//! condition of the tracer's alternating rounds) pays for them. And on a VM, the host may be
//! running other guests on our CPUs (steal), which no idle figure shows until something runs.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::proc_stat::{CpuTimes, DISTURBING_STEAL_PERCENT};
use crate::step::detail;

/// Quiet: the CPUs were this idle over one window (percent, iowait counted as idle).
const IDLE_PERCENT: u32 = 90;
/// The window the idle share is measured over.
const WINDOW: Duration = Duration::from_millis(300);

/// How long one CPU spins to see whether the hypervisor takes it away (`/proc/stat` counts in
/// 10 ms ticks: 30 of them).
const STEAL_PROBE: Duration = Duration::from_millis(300);

/// Waits until the CPUs were [`IDLE_PERCENT`] idle over one [`WINDOW`] and a spinning CPU lost
/// at most [`DISTURBING_STEAL_PERCENT`] of its time to the hypervisor (steal comes in bursts of
/// seconds to minutes on a contended host, and slows whatever runs meanwhile by tens of percent), for at most `max`, before `what` is
/// timed. Says so when that took a while or did not happen (the part is timed anyway, and its
/// absolute numbers are inflated).
pub fn wait(what: &str, max: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let before = CpuTimes::now()?;
        std::thread::sleep(WINDOW);
        let window = CpuTimes::now()?.since(&before);
        let not_quiet =
            if window.total() == 0 || window.not_idle_percent() > f64::from(100 - IDLE_PERCENT) {
                Some(format!(
                    "the machine was still busy ({:.0}% of the CPUs)",
                    window.not_idle_percent()
                ))
            } else {
                let stolen = stolen_while_spinning()?;
                (stolen > DISTURBING_STEAL_PERCENT).then(|| {
                    format!("the hypervisor still took {stolen:.0}% of a spinning CPU (steal)")
                })
            };
        match not_quiet {
            None => {
                if started.elapsed() > (WINDOW + STEAL_PROBE) * 2 {
                    detail(&format!(
                        "waited {:.1} s for the machine to be quiet before {what}",
                        started.elapsed().as_secs_f64()
                    ));
                }
                return Ok(());
            }
            Some(why) if started.elapsed() >= max => {
                detail(&format!(
                    "{why} after {:.0} s; {what} is timed anyway",
                    max.as_secs_f64()
                ));
                return Ok(());
            }
            Some(_) => {}
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
    let span = CpuTimes::now()?.since(&before);
    Ok(span.steal_of_running_percent())
}
