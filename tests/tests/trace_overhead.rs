//! The tracer leaves unrelated syscalls on their fast path: where the kernel has the
//! `cap_capable` tracepoint, unshare and mount are seen there and no syscall tracepoint is
//! attached (a single one puts every syscall of the node on the tracepoint slow path).
//! What tracing costs is measured by `cargo xtask bench` (`--trace-overhead-only` for that part
//! alone), not here: tests do not assert timings.

use std::path::Path;

use provisioner::trace::{KernelTracer, NamespaceHooks, load_syscall_fallback};
use provisioner_tests::require_root;

const CAP_CAPABLE_EVENT: &str = "/sys/kernel/tracing/events/capability/cap_capable";

/// Descriptors of this process that are perf events (how tracepoints are attached).
fn perf_event_fds() -> anyhow::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue; // closed meanwhile
        };
        if target.to_string_lossy() == "anon_inode:[perf_event]" {
            n += 1;
        }
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_syscall_tracepoint_is_attached_where_cap_capable_exists() -> anyhow::Result<()> {
    require_root();
    let before = perf_event_fds()?;
    let (tracer, _rx) = KernelTracer::start(1024)?;
    if !Path::new(CAP_CAPABLE_EVENT).exists() {
        assert_eq!(tracer.namespace_hooks(), NamespaceHooks::SyscallTracepoints);
        eprintln!("this kernel has no cap_capable tracepoint: the syscall fallback is in use");
        return Ok(());
    }
    assert_eq!(tracer.namespace_hooks(), NamespaceHooks::CapCapable);
    assert_eq!(
        perf_event_fds()?,
        before,
        "a tracepoint was attached through a perf event (syscall tracepoints are)"
    );
    Ok(())
}

/// The fallback programs are loaded only on kernels without `cap_capable` (before 6.14), where
/// no test of this suite runs: the verifier of this kernel checks them here.
#[test]
fn the_syscall_fallback_programs_pass_the_verifier() {
    require_root();
    if let Err(err) = load_syscall_fallback() {
        panic!("{err}");
    }
}
