//! Crash points for tests (cargo feature `fault-injection`): with
//! `PROVISIONER_FAILPOINT=<name>` in its environment the daemon kills itself with SIGKILL when it
//! reaches the point of that name, as a crash (OOM kill, node power loss for the kernel side)
//! would, so that tests can check that a restart and the runtime's retry converge. Without the
//! feature every point compiles to nothing.
//!
//! Points: `add.reserved` (addresses chosen, maybe not durable yet), `setup.<step>` after each
//! [`SetupStep`] (`setup.create-veth`, `setup.host-address`, ... `setup.sandbox-routes`),
//! `add.durable` (the allocation is on disk), `add.before-reply`, `del.teardown` (kernel objects
//! withdrawn, addresses not released yet), `del.released` (released, before the reply).

use crate::dataplane::SetupStep;

/// Environment variable naming the point to crash at.
pub const ENV: &str = "PROVISIONER_FAILPOINT";

/// Every point, for tests that go through them all.
pub const POINTS: &[&str] = &[
    "add.reserved",
    "setup.create-veth",
    "setup.host-address",
    "setup.sandbox-routes",
    "add.durable",
    "add.before-reply",
    "del.teardown",
    "del.released",
];

#[cfg(feature = "fault-injection")]
fn armed() -> Option<&'static str> {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()))
        .as_deref()
}

/// Crashes the process here if the failpoint `name` is armed.
#[cfg(feature = "fault-injection")]
pub fn hit(name: &str) {
    if armed() == Some(name) {
        tracing::error!(failpoint = name, "failpoint reached: killing the process");
        // SAFETY: kill(2) on our own pid; SIGKILL cannot be caught, nothing runs after it.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort();
    }
}

/// Crashes the process here if the failpoint `name` is armed (compiled out).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// The point after setup step `step`: `setup.<step>`.
#[cfg(feature = "fault-injection")]
pub fn hit_setup(step: SetupStep) {
    if let Some(armed) = armed().and_then(|a| a.strip_prefix("setup."))
        && armed == step.to_string()
    {
        hit(&format!("setup.{step}"));
    }
}

/// The point after setup step `step` (compiled out).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn hit_setup(_step: SetupStep) {}
