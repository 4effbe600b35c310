//! The eBPF pipeline end to end: a netns created by unshare or clone(CLONE_NEWNET) is reported
//! exactly once (no duplicate before the event of a namespace created after it), with the
//! cookie that SO_NETNS_COOKIE reads inside it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use provisioner::trace::{EventBatch, EventKind, KernelTracer, NetnsIds, NetnsOrigin, TraceEvent};
use provisioner_tests::tracing::{chosen_backends, own_netns_name};
use provisioner_tests::{require_root, scaled};
use tokio::sync::mpsc::Receiver;

/// A namespace created by a fresh thread that unshares; its cookie as `ids` names it.
fn unshared_netns_cookie(ids: &NetnsIds) -> anyhow::Result<(u64, i32)> {
    let ids = ids.clone();
    std::thread::spawn(move || -> anyhow::Result<(u64, i32)> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
        let name = own_netns_name(&ids).ok_or_else(|| anyhow::anyhow!("name own netns"))?;
        Ok((name, nix::unistd::gettid().as_raw()))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("unshare thread panicked"))?
}

/// Every NetnsCreated event for `cookie` up to the one of a marker namespace created after it.
/// The events share one ring buffer, read in the order they were reserved, so a duplicate
/// report of `cookie` (made when it was created) cannot arrive after the marker's.
async fn events_for(
    rx: &mut Receiver<EventBatch>,
    ids: &NetnsIds,
    cookie: u64,
    limit: Duration,
) -> anyhow::Result<Vec<TraceEvent>> {
    let (marker, _) = unshared_netns_cookie(ids)?;
    let mut found = Vec::new();
    let deadline = tokio::time::Instant::now() + scaled(limit);
    loop {
        let batch = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(batch)) => batch,
            Ok(None) => anyhow::bail!("the tracer's event stream ended"),
            Err(_) => anyhow::bail!(
                "no event for the marker namespace within {limit:?}; for {cookie}: {found:?}"
            ),
        };
        for event in batch {
            let EventKind::NetnsCreated(created) = &event.kind else {
                continue;
            };
            if created.netns_cookie == marker {
                return Ok(found);
            }
            if created.netns_cookie == cookie {
                found.push(event);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unshare_reports_one_event_with_the_right_cookie() -> anyhow::Result<()> {
    require_root();
    let (tracer, mut rx) = KernelTracer::start(4096, &chosen_backends()?)?;
    let ids = tracer.attached().ids.clone();
    let (cookie, tid) = unshared_netns_cookie(&ids)?;

    let events = events_for(&mut rx, &ids, cookie, Duration::from_secs(10)).await?;
    assert_eq!(events.len(), 1, "events for cookie {cookie}: {events:?}");
    let event = &events[0];
    let EventKind::NetnsCreated(created) = &event.kind else {
        panic!("not NetnsCreated: {event:?}");
    };
    assert_eq!(created.origin, NetnsOrigin::Unshare);
    assert_eq!(event.task.pid, std::process::id());
    assert_eq!(event.task.tid, u32::try_from(tid)?);
    assert!(created.netns_inode > 0);
    assert_eq!(tracer.loss_counters().total(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_with_newnet_reports_the_child_namespace() -> anyhow::Result<()> {
    require_root();
    let (tracer, mut rx) = KernelTracer::start(4096, &chosen_backends()?)?;
    let ids = tracer.attached().ids.clone();
    let (read_end, write_end): (OwnedFd, OwnedFd) = nix::unistd::pipe()?;
    let mut stack = vec![0u8; 256 * 1024];
    let write_fd = write_end.as_raw_fd();
    let child_ids = ids.clone();
    let child = Box::new(move || -> isize {
        let cookie = own_netns_name(&child_ids).unwrap_or(0);
        // SAFETY: write_fd stays open in the child until it exits.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(write_fd) };
        isize::from(nix::unistd::write(fd, &cookie.to_ne_bytes()).is_err())
    });
    // SAFETY: the child only names its namespace (no allocation) and writes to a pipe before
    // exiting.
    let pid = unsafe {
        nix::sched::clone(
            child,
            &mut stack,
            nix::sched::CloneFlags::CLONE_NEWNET,
            Some(libc::SIGCHLD),
        )
    }?;
    drop(write_end);
    nix::sys::wait::waitpid(pid, None)?;
    let mut buf = [0u8; 8];
    nix::unistd::read(&read_end, &mut buf)?;
    let cookie = u64::from_ne_bytes(buf);
    assert_ne!(cookie, 0, "child could not read its netns cookie");

    let events = events_for(&mut rx, &ids, cookie, Duration::from_secs(10)).await?;
    assert_eq!(events.len(), 1, "events for cookie {cookie}: {events:?}");
    let EventKind::NetnsCreated(created) = &events[0].kind else {
        panic!("not NetnsCreated: {:?}", events[0]);
    };
    assert_eq!(created.origin, NetnsOrigin::Clone);
    assert_eq!(created.owner_pid, u32::try_from(pid.as_raw())?);
    assert_eq!(events[0].task.pid, std::process::id());
    Ok(())
}
