//! A burst of 2000 namespace creations: every one reaches userspace, or its loss is counted.

use std::collections::HashSet;
use std::time::Duration;

use provisioner::trace::{EventKind, KernelTracer};
use provisioner_tests::tracing::{chosen_backends, own_netns_name};
use provisioner_tests::{require_root, scaled};

const PER_THREAD: usize = 1000;
const THREADS: usize = 2;
/// `provisioner_common::kind::NETNS_CREATED` (the tests crate does not depend on it).
const NETNS_CREATED_KIND: u32 = 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_2000_netns_creations_is_fully_accounted_for() -> anyhow::Result<()> {
    require_root();
    let (tracer, mut rx) = KernelTracer::start(65_536, &chosen_backends()?)?;
    let ids = tracer.attached().ids.clone();
    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let ids = ids.clone();
            std::thread::spawn(move || -> anyhow::Result<Vec<u64>> {
                let mut cookies = Vec::with_capacity(PER_THREAD);
                for _ in 0..PER_THREAD {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
                    cookies.push(
                        own_netns_name(&ids).ok_or_else(|| anyhow::anyhow!("name own netns"))?,
                    );
                }
                Ok(cookies)
            })
        })
        .collect();
    let mut wanted = HashSet::new();
    for worker in workers {
        let cookies = worker
            .join()
            .map_err(|_| anyhow::anyhow!("worker panicked"))??;
        wanted.extend(cookies);
    }
    let created_in = started.elapsed();
    assert_eq!(wanted.len(), THREADS * PER_THREAD);

    let mut seen = HashSet::new();
    let mut deadline = tokio::time::Instant::now() + scaled(Duration::from_secs(5));
    while seen.len() < wanted.len() {
        let Ok(Some(batch)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            break;
        };
        for event in batch {
            if let EventKind::NetnsCreated(c) = &event.kind
                && wanted.contains(&c.netns_cookie)
            {
                assert!(
                    seen.insert(c.netns_cookie),
                    "duplicate event for {}",
                    c.netns_cookie
                );
                deadline = tokio::time::Instant::now() + scaled(Duration::from_secs(2));
            }
        }
    }
    let loss = tracer.loss_counters();
    let lost_created: u64 = loss
        .reserve_failures
        .iter()
        .chain(&loss.decode_failures)
        .filter(|(k, _)| *k == NETNS_CREATED_KIND)
        .map(|(_, n)| n)
        .sum();
    println!(
        "created {} namespaces in {created_in:?}; events {} lost {lost_created} ({loss:?})",
        wanted.len(),
        seen.len()
    );
    assert_eq!(
        seen.len() as u64 + lost_created,
        wanted.len() as u64,
        "every creation is either reported or counted as lost"
    );
    Ok(())
}
