//! SIGTERM in the middle of a 16-way ADD burst: every ADD is answered success or "try again
//! later" (11); a successful one is wired and on disk, one answered 11 left nothing behind;
//! after the restart the audit confirms every sandbox that was answered success, and the store
//! equals the kernel. Needs root and kernel tracing.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use provisioner::cni::CniError;
use provisioner::dataplane::host_ifname;
use provisioner_tests::crash_harness::assert_store_is_node;
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::daemon_queries::{allocations, views_of};
use provisioner_tests::pod_net::wait_node_bare;
use provisioner_tests::{Netns, NetnsCookie, wait_until};
use serde_json::Value;

const CALLERS: usize = 16;
const PER_CALLER: usize = 3;
/// ADDs answered before the SIGTERM is sent.
const ANSWERED_BEFORE_SIGTERM: usize = 4;

/// One ADD's answer: pod index, plugin exit code, CNI error code, stdout.
type Answer = (usize, i32, Option<u64>, String);

fn id(i: usize) -> String {
    format!("term{i}")
}

#[test]
fn sigterm_during_an_add_burst_leaves_nothing_half_wired() -> Result<()> {
    let node = Netns::new("stnode")?;
    let mut daemon = Daemon::start_with_conflist(&node, &[], |socket| {
        conflist("termnet", "1.1.0", socket, "10.251.16.0/24", None)
    })?;
    daemon.wait_ready(Duration::from_secs(20))?;
    let config = conflist("termnet", "1.1.0", &daemon.socket, "10.251.16.0/24", None);
    let stdin = Arc::new(serde_json::to_vec(&plugin_stdin(&config, "1.1.0"))?);
    let pods: Arc<Vec<Netns>> = Arc::new(
        (0..CALLERS * PER_CALLER)
            .map(|_| Netns::new("stpod"))
            .collect::<Result<_>>()?,
    );

    let answered = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (pods, stdin, answered) =
                (Arc::clone(&pods), Arc::clone(&stdin), Arc::clone(&answered));
            std::thread::spawn(move || -> Result<Vec<Answer>> {
                let mut out = Vec::new();
                for k in 0..PER_CALLER {
                    let i = c * PER_CALLER + k;
                    let run = run_plugin("ADD", &id(i), Some(pods[i].path()), "eth0", &stdin)?;
                    answered.fetch_add(1, Ordering::SeqCst);
                    out.push((i, run.code, run.error_code(), run.stdout));
                }
                Ok(out)
            })
        })
        .collect();
    wait_until("the first ADDs answered", Duration::from_secs(30), || {
        Ok((answered.load(Ordering::SeqCst) >= ANSWERED_BEFORE_SIGTERM).then_some(()))
    })?;
    let exit = daemon.stop_status()?;
    let mut results = Vec::new();
    for caller in callers {
        match caller.join() {
            Ok(done) => results.extend(done?),
            Err(_) => bail!("a caller thread panicked"),
        }
    }
    ensure!(
        exit.success(),
        "daemon exited with {exit}:\n{}",
        daemon.log()
    );

    let mut finished = BTreeSet::new();
    let mut later = 0;
    for (i, code, cni_code, stdout) in &results {
        let pod = &pods[*i];
        let links = pod.links()?;
        if *code == 0 {
            ensure!(
                links == ["eth0"],
                "{} answered success, holds {links:?}",
                id(*i)
            );
            finished.insert(id(*i));
        } else {
            ensure!(
                *cni_code == Some(u64::from(CniError::TRY_AGAIN_LATER)),
                "{} answered neither success nor try again later: {stdout}",
                id(*i)
            );
            ensure!(
                links.is_empty(),
                "{} answered 11 but holds {links:?}",
                id(*i)
            );
            let host = host_ifname(&id(*i), "eth0");
            ensure!(
                !node.links()?.contains(&host),
                "{} answered 11 but its host veth {host} is on the node",
                id(*i)
            );
            later += 1;
        }
    }
    ensure!(
        finished.len() >= ANSWERED_BEFORE_SIGTERM && later > 0,
        "{} finished, {later} told to try again: the SIGTERM did not meet the burst",
        finished.len()
    );

    daemon.restart(&node, &[])?;
    daemon.wait_ready(Duration::from_secs(20))?;
    let held: BTreeSet<String> = allocations(&daemon)?
        .into_iter()
        .map(|a| a.container_id)
        .collect();
    ensure!(
        held == finished,
        "the store holds {held:?}, the ADDs answered success were {finished:?}"
    );
    assert_store_is_node(&node, || allocations(&daemon)).with_context(|| daemon.log())?;
    wait_confirmed(&daemon, &pods, &finished)?;

    for (i, pod) in pods.iter().enumerate() {
        let run = run_plugin("DEL", &id(i), Some(pod.path()), "eth0", &stdin)?;
        ensure!(run.code == 0, "DEL {}: {run:?}", id(i));
    }
    wait_node_bare(&node, Duration::from_secs(10))
}

/// Waits until the restarted daemon's audit confirms the sandbox of every finished ADD.
fn wait_confirmed(daemon: &Daemon, pods: &[Netns], finished: &BTreeSet<String>) -> Result<()> {
    let cookies: HashSet<u64> = (0..pods.len())
        .filter(|i| finished.contains(&id(*i)))
        .map(|i| pods[i].cookie())
        .collect::<Result<_>>()?;
    let mut last: Vec<Value> = Vec::new();
    wait_until(
        "the audit confirms every finished ADD",
        Duration::from_secs(30),
        || {
            last = views_of(daemon, &cookies)?;
            let confirmed = last
                .iter()
                .filter(|v| v["intent"]["status"] == "confirmed")
                .count();
            Ok((confirmed == cookies.len()).then_some(()))
        },
    )
    .with_context(|| format!("views: {last:#?}\nlog:\n{}", daemon.log()))
}
