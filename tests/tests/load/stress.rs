//! 16 clients run random ADD / DEL / CHECK / GC over overlapping container ids through the
//! plugin, while the daemon is killed with SIGKILL and restarted in the middle. At every sampled
//! moment no address has two owners (in the store, or routed by two host veths); at the end the
//! store and the kernel agree exactly, and DEL of every sandbox leaves the node bare.
//! `STRESS_OPS` sets the operations per client (default 120). Needs root and the binary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use provisioner_tests::Netns;
use provisioner_tests::crash_harness::{CrashDaemon, assert_converged, node_state};
use provisioner_tests::daemon_harness::run_plugin;
use provisioner_tests::pod_net::wait_node_bare;

const CLIENTS: usize = 16;
const IDS: usize = 24;

/// xorshift64*: enough randomness for picking operations, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33;
        usize::try_from(r).unwrap_or(0) % n
    }
}

/// One client: `ops` random operations; returns how many of each kind succeeded.
fn client(
    seed: u64,
    ops: usize,
    stdin: &[u8],
    gc_stdin: &serde_json::Value,
    pods: &[PathBuf],
    done: &AtomicUsize,
) -> Result<BTreeMap<&'static str, (usize, usize)>> {
    let mut rng = Rng(seed | 1);
    let mut tally: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    // The result of this client's last ADD of each id: CHECK's prevResult.
    let mut results: BTreeMap<usize, serde_json::Value> = BTreeMap::new();
    let plain: serde_json::Value = serde_json::from_slice(stdin)?;
    for _ in 0..ops {
        let id = rng.below(IDS);
        let cid = format!("s{id}");
        let (kind, run) = match rng.below(10) {
            0..=4 => {
                let run = run_plugin("ADD", &cid, Some(&pods[id]), "eth0", stdin)?;
                if run.code == 0 {
                    results.insert(id, run.json());
                }
                ("ADD", run)
            }
            5..=7 => (
                "DEL",
                run_plugin("DEL", &cid, Some(&pods[id]), "eth0", stdin)?,
            ),
            // CHECK needs a prevResult: of this client's last ADD of the id.
            8 if results.contains_key(&id) => {
                let mut check = plain.clone();
                check["prevResult"] = results.get(&id).cloned().unwrap_or_default();
                let check = serde_json::to_vec(&check)?;
                let run = run_plugin("CHECK", &cid, Some(&pods[id]), "eth0", &check)?;
                ("CHECK", run)
            }
            8 => (
                "ADD",
                run_plugin("ADD", &cid, Some(&pods[id]), "eth0", stdin)?,
            ),
            _ => {
                // The runtime's GC: a random half of the ids is still valid.
                let mut gc = gc_stdin.clone();
                gc["cni.dev/valid-attachments"] = (0..IDS)
                    .filter(|_| rng.below(2) == 0)
                    .map(
                        |i| serde_json::json!({ "containerID": format!("s{i}"), "ifname": "eth0" }),
                    )
                    .collect();
                (
                    "GC",
                    run_plugin("GC", "", None, "", &serde_json::to_vec(&gc)?)?,
                )
            }
        };
        let entry = tally.entry(kind).or_default();
        if run.code == 0 {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(tally)
}

/// No address with two owners, now: none listed twice in the store, none routed by two veths.
fn no_two_owners(daemon: &CrashDaemon, node: &Netns) -> Result<()> {
    if daemon.running()
        && let Ok(allocations) = daemon.allocations()
    {
        let mut owner = BTreeMap::new();
        for a in &allocations {
            for address in &a.addresses {
                if let Some(other) = owner.insert(address.clone(), &a.container_id) {
                    bail!(
                        "{address} held by {other} and {} in the store",
                        a.container_id
                    );
                }
            }
        }
    }
    let mut routed_by = BTreeMap::new();
    for (veth, routed) in node_state(node)?.veths {
        for ip in routed {
            if let Some(other) = routed_by.insert(ip.clone(), veth.clone()) {
                bail!("{ip} routed by two host veths: {other} and {veth}");
            }
        }
    }
    Ok(())
}

#[test]
fn random_operations_with_a_crash_in_the_middle_converge() -> Result<()> {
    let ops: usize = std::env::var("STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    eprintln!("stress seed {seed}, {CLIENTS} clients x {ops} operations");
    let node = Netns::new("stnode")?;
    let pods: Vec<Netns> = (0..IDS)
        .map(|_| Netns::new("stpod"))
        .collect::<Result<_>>()?;
    let paths: Arc<Vec<PathBuf>> = Arc::new(pods.iter().map(|p| p.path().to_owned()).collect());
    let mut daemon = CrashDaemon::new("stressnet", "10.251.12.0/24")?;
    daemon.start(&node, None)?;
    let stdin = Arc::new(daemon.stdin());
    let gc_stdin: serde_json::Value = serde_json::from_slice(&stdin)?;
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (stdin, gc_stdin, paths, done) = (
                Arc::clone(&stdin),
                gc_stdin.clone(),
                Arc::clone(&paths),
                Arc::clone(&done),
            );
            let seed = seed.wrapping_add(c as u64 * 0x9e37_79b9);
            std::thread::spawn(move || client(seed, ops, &stdin, &gc_stdin, &paths, &done))
        })
        .collect();

    let total = CLIENTS * ops;
    let mut samples = 0;
    let mut killed = false;
    while clients.iter().any(|c| !c.is_finished()) {
        no_two_owners(&daemon, &node).with_context(|| daemon.log())?;
        samples += 1;
        if !killed && done.load(Ordering::Relaxed) >= total / 2 {
            daemon.kill()?;
            daemon.start(&node, None)?;
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut tally: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for c in clients {
        let t = c.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
        for (k, (okn, failed)) in t {
            let e = tally.entry(k).or_default();
            e.0 += okn;
            e.1 += failed;
        }
    }
    eprintln!(
        "{total} operations in {:.1} s, {samples} samples, killed: {killed}; (ok, failed) per kind: {tally:?}",
        started.elapsed().as_secs_f64()
    );
    ensure!(killed, "the daemon was not killed in the middle");
    no_two_owners(&daemon, &node)?;
    let held = assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    eprintln!("{} allocations at the end, store == kernel", held.len());
    for (i, pod) in paths.iter().enumerate() {
        let run = run_plugin("DEL", &format!("s{i}"), Some(pod), "eth0", &stdin)?;
        ensure!(run.code == 0, "DEL s{i}: {run:?}");
    }
    let left = daemon.allocations()?;
    ensure!(left.is_empty(), "after DEL of every sandbox: {left:?}");
    wait_node_bare(&node, Duration::from_secs(10))
}

/// The measured case of the reliability issue: 16 callers ADD 48 sandboxes, the daemon is
/// killed with SIGKILL a third of the way in and restarted, every caller retries until its ADD
/// succeeds. Then the node holds exactly one host veth per pod, and none after DEL of all.
#[test]
fn parallel_adds_with_a_kill_leave_one_veth_per_pod() -> Result<()> {
    const PODS: usize = 48;
    let node = Netns::new("pjnode")?;
    let pods: Vec<Netns> = (0..PODS)
        .map(|_| Netns::new("pjpod"))
        .collect::<Result<_>>()?;
    let paths: Arc<Vec<PathBuf>> = Arc::new(pods.iter().map(|p| p.path().to_owned()).collect());
    let mut daemon = CrashDaemon::new("parnet", "10.251.13.0/24")?;
    daemon.start(&node, None)?;
    let stdin = Arc::new(daemon.stdin());
    let answered = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (stdin, paths, answered) = (
                Arc::clone(&stdin),
                Arc::clone(&paths),
                Arc::clone(&answered),
            );
            std::thread::spawn(move || -> Result<usize> {
                let mut retries = 0;
                for id in (c..PODS).step_by(CLIENTS) {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    loop {
                        let run =
                            run_plugin("ADD", &format!("p{id}"), Some(&paths[id]), "eth0", &stdin)?;
                        answered.fetch_add(1, Ordering::Relaxed);
                        if run.code == 0 {
                            break;
                        }
                        retries += 1;
                        ensure!(
                            Instant::now() < deadline,
                            "ADD p{id} never succeeded: {run:?}"
                        );
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                Ok(retries)
            })
        })
        .collect();
    provisioner_tests::wait_until(
        "a third of the ADDs answered",
        Duration::from_secs(60),
        || Ok((answered.load(Ordering::Relaxed) >= PODS / 3).then_some(())),
    )?;
    daemon.kill()?;
    daemon.start(&node, None)?;
    let mut retries = 0;
    for c in callers {
        retries += c.join().map_err(|_| anyhow::anyhow!("caller panicked"))??;
    }
    let held = assert_converged(&daemon, &node).with_context(|| daemon.log())?;
    let veths = node_state(&node)?.veths.len();
    eprintln!(
        "{PODS} pods, {retries} retried ADDs: {} allocations, {veths} host veths",
        held.len()
    );
    ensure!(
        held.len() == PODS && veths == PODS,
        "{} allocations, {veths} veths",
        held.len()
    );
    for (i, pod) in paths.iter().enumerate() {
        let run = run_plugin("DEL", &format!("p{i}"), Some(pod), "eth0", &stdin)?;
        ensure!(run.code == 0, "DEL p{i}: {run:?}");
    }
    ensure!(daemon.allocations()?.is_empty());
    wait_node_bare(&node, Duration::from_secs(10))
}
