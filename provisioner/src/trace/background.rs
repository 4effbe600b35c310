//! The scheduling of the thread that runs the tracer in the daemon: behind the daemon's
//! requests, and out of their way within a tenth of a millisecond.

use std::time::{Duration, Instant};

/// Nice value of the thread.
const NICE: i32 = 10;

/// The thread's scheduler slice (`sched_attr.sched_runtime` of a fair task, Linux 6.12 and
/// later; older kernels ignore it): how long the kernel lets it run on before a task that wakes
/// on its CPU may take the CPU. The default is 1.4 ms on two CPUs, as long as one drain of the
/// tracer's ring; 0.1 ms is the shortest the kernel grants.
const SLICE_NS: u64 = 100_000;

/// `struct sched_attr` (`<linux/sched/types.h>`), its first version.
#[repr(C)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Gives the calling thread (and the threads it starts, which inherit it) nice +10 and a short
/// slice; a kernel that refuses the slice still gets the nice value.
pub(crate) fn make_this_thread_background() {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: NICE,
        sched_priority: 0,
        sched_runtime: SLICE_NS,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: `attr` is a valid sched_attr of the size it states, alive for the call; pid 0 is
    // the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if rc == 0 {
        return;
    }
    let refused = std::io::Error::last_os_error();
    // SAFETY: setpriority has no memory preconditions; who 0 is the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) };
    if rc == 0 {
        tracing::debug!(error = %refused, "kernel watch runs at nice {NICE} with the default scheduler slice");
    } else {
        tracing::debug!(error = %std::io::Error::last_os_error(), "kernel watch keeps the daemon's priority");
    }
}

/// Work the thread does before it offers its CPU to a task waiting for it.
const TURN: Duration = Duration::from_micros(200);

/// Hands the CPU over, every [`TURN`] of work, to a task that waits for it. Once the slice is
/// over, the kernel itself gives the CPU to a waiting task only at its next look (a tick, up
/// to 4 ms apart at 250 Hz), while the tracer works in bursts of about a millisecond (one
/// drain of its ring): a caller woken by its answer on the tracer's CPU waited out the burst.
pub(crate) struct CpuTurns {
    since: Instant,
}

impl CpuTurns {
    pub(crate) fn new() -> Self {
        Self {
            since: Instant::now(),
        }
    }

    /// Yields the CPU when the thread has had it for a turn (at once when no task waits).
    pub(crate) fn offer(&mut self) {
        if self.since.elapsed() >= TURN {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            self.since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field of the calling thread's scheduler statistics.
    fn own_sched_field(name: &str) -> Option<u64> {
        let text = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        let line = text
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))?;
        line.split(':').nth(1)?.trim().parse().ok()
    }

    /// Linux 6.12 and later take a fair task's `sched_runtime` as its slice.
    fn kernel_has_custom_slices() -> bool {
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut parts = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (6, 12)
    }

    #[test]
    fn the_thread_and_the_threads_it_starts_run_at_nice_10_with_a_short_slice() {
        // SAFETY: getpriority has no memory preconditions.
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let (own, child) = std::thread::spawn(move || {
            make_this_thread_background();
            let child = std::thread::spawn(move || (nice(), own_sched_field("se.slice")))
                .join()
                .expect("child thread");
            ((nice(), own_sched_field("se.slice")), child)
        })
        .join()
        .expect("thread");
        assert_eq!((own.0, child.0), (NICE, NICE));
        if kernel_has_custom_slices() {
            assert_eq!(own.1, Some(SLICE_NS));
            assert_eq!(child.1, Some(SLICE_NS));
        }
    }
}
