//! Crash points for tests (cargo feature `fault-injection`): with
//! `PROVISIONER_FAILPOINT=<name>[,<name>...]` in its environment the daemon kills itself with SIGKILL when it
//! reaches the point of that name, as a crash (OOM kill, node power loss for the kernel side)
//! would, so that tests can check that a restart and the runtime's retry converge. Without the
//! feature every point compiles to nothing.
//!
//! Points: `add.reserved` (addresses chosen, maybe not durable yet), `setup.<step>` after each
//! setup step (`setup.create-veth`, `setup.host-address`, ... `setup.sandbox-routes`),
//! `add.durable` (the allocation is on disk), `add.before-reply`, `del.release-durable` (the
//! DEL's release is on disk, its teardown may still run), `del.teardown` (kernel objects
//! withdrawn, the release on disk, its addresses still held), `del.released` (before the reply).
//! `setup.<step>.fail` is no crash either: that step of a setup returns an injected error right
//! after it succeeded, so that the rollback of everything before it can be checked.
//! `commit.slow` is no crash: it delays the durable commit of reservations by [`PAUSE`], so
//! that a crash in setup comes before the allocation is on disk. Nor is `add.slow`: an ADD
//! whose allocation is on disk waits [`PAUSE`] before it answers (the daemon serving other
//! requests meanwhile), so that a GC certainly meets it in flight. Nor is `teardown.slow`: a
//! DEL's teardown begins [`PAUSE`] late, so that `del.release-durable` comes before it.

/// Environment variable naming the point to crash at.
pub const ENV: &str = "PROVISIONER_FAILPOINT";

/// The armed points: those named (comma separated) in [`ENV`], then those of [`arm`].
#[cfg(feature = "fault-injection")]
fn armed() -> &'static std::sync::RwLock<Vec<String>> {
    static ARMED: std::sync::OnceLock<std::sync::RwLock<Vec<String>>> = std::sync::OnceLock::new();
    ARMED.get_or_init(|| {
        std::sync::RwLock::new(
            std::env::var(ENV)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    })
}

#[cfg(feature = "fault-injection")]
fn armed_where(test: impl Fn(&str) -> bool) -> bool {
    let armed = armed()
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    armed.iter().any(|p| test(p))
}

#[cfg(feature = "fault-injection")]
fn is_armed(name: &str) -> bool {
    armed_where(|p| p == name)
}

/// Arms the point `name` in this process (an in-process test; a daemon is armed by [`ENV`]).
/// Points are process-wide: a test that arms one runs alone in its test binary.
#[cfg(feature = "fault-injection")]
pub fn arm(name: &str) {
    let mut armed = armed()
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    armed.push(name.to_owned());
}

/// Disarms the point `name` armed by [`arm`] or [`ENV`].
#[cfg(feature = "fault-injection")]
pub fn disarm(name: &str) {
    let mut armed = armed()
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    armed.retain(|p| p != name);
}

/// Whether any point whose name starts with `prefix` is armed (a caller skips naming its
/// points, e.g. formatting `setup.<step>`, when none is).
#[cfg(feature = "fault-injection")]
pub fn any_armed(prefix: &str) -> bool {
    armed_where(|p| p.starts_with(prefix))
}

/// Whether any point whose name starts with `prefix` is armed (compiled out: never).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn any_armed(_prefix: &str) -> bool {
    false
}

/// Crashes the process here if the failpoint `name` is armed.
#[cfg(feature = "fault-injection")]
pub fn hit(name: &str) {
    if is_armed(name) {
        // xtask/src/failpoint_check.rs looks for this text in release binaries.
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

/// Whether the point `name` is armed to fail (e.g. `commit.fail`: every durable commit fails,
/// as on a broken disk).
#[cfg(feature = "fault-injection")]
pub fn fails(name: &str) -> bool {
    is_armed(name)
}

/// Whether the point `name` is armed to fail (compiled out: never).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn fails(_name: &str) -> bool {
    false
}

/// Stalls the calling thread for [`PAUSE`] if the point `name` is armed (e.g. `commit.slow`:
/// the durable commit of a reservation comes after the kernel setup, deterministically).
#[cfg(feature = "fault-injection")]
pub fn pause(name: &str) {
    if is_armed(name) {
        std::thread::sleep(PAUSE);
    }
}

/// Stalls here if the point `name` is armed (compiled out).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn pause(_name: &str) {}

/// Waits [`PAUSE`] (without holding the thread) if the point `name` is armed.
#[cfg(feature = "fault-injection")]
pub async fn pause_task(name: &str) {
    if is_armed(name) {
        tokio::time::sleep(PAUSE).await;
    }
}

/// Waits here if the point `name` is armed (compiled out).
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub async fn pause_task(_name: &str) {}

/// How long [`pause`] stalls.
pub const PAUSE: std::time::Duration = std::time::Duration::from_millis(500);
