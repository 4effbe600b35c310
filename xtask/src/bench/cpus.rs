//! The CPUs this process may run on, and keeping a thread on one of them.

use anyhow::{Result, anyhow};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// The CPUs in this process's affinity mask, lowest first.
pub fn allowed() -> Result<Vec<usize>> {
    let mask = sched_getaffinity(Pid::from_raw(0))?;
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&cpu| mask.is_set(cpu).unwrap_or(false))
        .collect();
    if cpus.is_empty() {
        return Err(anyhow!("no CPU in this process's affinity mask"));
    }
    Ok(cpus)
}

/// The last CPU this process may run on.
pub fn last() -> Result<usize> {
    allowed()?
        .last()
        .copied()
        .ok_or_else(|| anyhow!("no CPU in this process's affinity mask"))
}

/// Keeps the calling thread on `cpu` from now on.
pub fn pin_this_thread(cpu: usize) -> Result<()> {
    let mut only = CpuSet::new();
    only.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &only)?;
    Ok(())
}
