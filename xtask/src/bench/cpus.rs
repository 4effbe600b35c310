//! Keeping a thread on one of the CPUs this process may run on.

use anyhow::{Result, anyhow};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// The last CPU in this process's affinity mask.
pub fn last() -> Result<usize> {
    let mask = sched_getaffinity(Pid::from_raw(0))?;
    (0..CpuSet::count())
        .rfind(|&cpu| mask.is_set(cpu).unwrap_or(false))
        .ok_or_else(|| anyhow!("no CPU in this process's affinity mask"))
}

/// Keeps the calling thread on `cpu` from now on.
pub fn pin_this_thread(cpu: usize) -> Result<()> {
    let mut only = CpuSet::new();
    only.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &only)?;
    Ok(())
}
