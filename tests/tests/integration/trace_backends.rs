//! The kernel watch's backends on this kernel: every observation gets one, the BTF tracepoints
//! leave unrelated syscalls on their fast path, a backend can be chosen instead of the probe's,
//! and the verifier of this kernel takes the programs of every backend it offers.
//! What each backend costs is measured by `cargo xtask bench` (`--trace-overhead-only`), not
//! here: tests do not assert timings.

use provisioner::trace::{
    Backend, BackendChoices, KernelTracer, Observation, ProgramCheck, check_every_backend,
};
use provisioner_tests::require_root;
use provisioner_tests::tracing::chosen_backends;

/// Held by the tests that count links: the tests of this file run in one process at once.
static COUNTING_LINKS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Tracefs tracepoints attached by this process (the syscall ones among them): each is a BPF
/// link of the perf kind (Linux 5.15 and later) or a perf event descriptor (before), while
/// BTF tracepoints are raw_tracepoint links.
fn perf_event_fds() -> anyhow::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue; // closed meanwhile
        };
        let target = target.to_string_lossy();
        if target == "anon_inode:[perf_event]" {
            n += 1;
        } else if target == "anon_inode:bpf_link" {
            let info = std::fs::read_to_string(
                std::path::Path::new("/proc/self/fdinfo").join(entry.file_name()),
            )
            .unwrap_or_default();
            if info.lines().any(|l| {
                l.split_once(':')
                    .is_some_and(|(k, v)| k == "link_type" && v.trim() == "perf")
            }) {
                n += 1;
            }
        }
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_observation_has_a_backend_and_btf_tracepoints_attach_no_syscall_tracepoint()
-> anyhow::Result<()> {
    require_root();
    let _counting = COUNTING_LINKS.lock().await;
    let before = perf_event_fds()?;
    let (tracer, _rx) = KernelTracer::start(1024, &chosen_backends()?)?;
    let attached = tracer.attached();
    for status in &attached.observations {
        assert!(status.backend.is_some(), "{}", status.line());
    }
    let on_syscalls = attached
        .observations
        .iter()
        .any(|s| s.backend == Some(Backend::SyscallTracepoints));
    if !on_syscalls {
        assert_eq!(
            perf_event_fds()?,
            before,
            "a tracefs tracepoint was attached (syscall tracepoints are)"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_chosen_instead_of_the_probes_is_attached_and_reported() -> anyhow::Result<()> {
    require_root();
    let _counting = COUNTING_LINKS.lock().await;
    let before = perf_event_fds()?;
    let choices: BackendChoices =
        "rtnetlink=syscall_tracepoints,unshare_and_mounts=syscall_tracepoints,namespace_ids=inode_generation"
            .parse()
            .map_err(anyhow::Error::msg)?;
    let (tracer, _rx) = KernelTracer::start(1024, &choices)?;
    let attached = tracer.attached();
    assert_eq!(
        attached.backend(Observation::Rtnetlink),
        Some(Backend::SyscallTracepoints)
    );
    assert_eq!(
        attached.backend(Observation::UnshareAndMounts),
        Some(Backend::SyscallTracepoints)
    );
    assert_eq!(attached.ids.backend(), Backend::InodeGeneration);
    // unshare enter and exit, mount enter; sendmsg, sendto, recvmsg, recvfrom enter and exit.
    assert_eq!(perf_event_fds()? - before, 11);
    Ok(())
}

/// Whether `check` failed only because this kernel refuses its program type altogether (our
/// build machines refuse fentry with EPERM, whatever the program).
fn type_refused(check: &ProgramCheck) -> bool {
    check.backend == Backend::Fentry
        && matches!(&check.outcome, Err(Some(err)) if err.contains("Operation not permitted"))
}

/// Programs of backends this kernel's probe does not pick are still verified here.
#[test]
fn this_kernels_verifier_takes_the_programs_of_every_backend_it_offers() -> anyhow::Result<()> {
    require_root();
    let checks = check_every_backend()?;
    let refused: Vec<&ProgramCheck> = checks
        .iter()
        .filter(|c| matches!(c.outcome, Err(Some(_))) && !type_refused(c))
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
    assert!(
        checks
            .iter()
            .any(|c| c.backend == Backend::SyscallTracepoints && c.outcome.is_ok()),
        "syscall tracepoints exist on every kernel: {checks:#?}"
    );
    Ok(())
}
