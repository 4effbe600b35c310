//! Components measured alone, for `cargo xtask bench` (which builds and runs this and merges its
//! JSON into its report): the allocator (durable allocate / release, sequential and 16 threads,
//! reserve-then-durable) and the dataplane (setup, check, teardown of N sandboxes). Needs root
//! for the dataplane part; prints one JSON document on stdout.
//!
//! `components [N]`: N sandboxes / allocations per phase (default 100).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use provisioner::dataplane::{Dataplane, PodAddress, RouteSpec, SandboxSpec};
use provisioner::ipam::{AllocationKey, Allocator, IpamConfig};
use provisioner_tests::Netns;
use serde_json::{Value, json};

fn summary(mut v: Vec<Duration>) -> Value {
    v.sort();
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let at = |pct: usize| v[(v.len() * pct).div_ceil(100).max(1) - 1];
    json!({
        "n": v.len(),
        "median_ms": ms(at(50)),
        "p99_ms": ms(at(99)),
        "max_ms": ms(v[v.len() - 1]),
    })
}

fn allocator(dir: &std::path::Path) -> Result<Allocator> {
    let ranges = IpamConfig::from_json(r#"{"subnet":"10.244.0.0/16"}"#)?.validate()?;
    Ok(Allocator::open(dir, "bench", &ranges)?.0)
}

/// Durable allocate and release, one caller, with 1000 allocations held; then 16 threads.
fn ipam(n: usize) -> Result<Value> {
    let dir = tempfile::tempdir()?;
    let a = Arc::new(allocator(dir.path())?);
    for i in 0..1000 {
        a.allocate(&AllocationKey::new(format!("bg{i}"), "eth0"))?;
    }
    let (mut alloc, mut rel, mut reserve, mut durable) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let k = AllocationKey::new(format!("seq{i}"), "eth0");
        let t = Instant::now();
        a.allocate(&k)?;
        alloc.push(t.elapsed());
        let t = Instant::now();
        a.release(&k)?;
        rel.push(t.elapsed());
        let k = AllocationKey::new(format!("res{i}"), "eth0");
        let t = Instant::now();
        let r = a.reserve(&k, None)?;
        reserve.push(t.elapsed());
        r.wait_durable()?;
        durable.push(t.elapsed());
    }
    let started = Instant::now();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let a = Arc::clone(&a);
            std::thread::spawn(move || -> Result<Vec<Duration>> {
                (0..n.div_ceil(16).max(1))
                    .map(|k| {
                        let key = AllocationKey::new(format!("t{t}-k{k}"), "eth0");
                        let t0 = Instant::now();
                        a.allocate(&key)?;
                        Ok(t0.elapsed())
                    })
                    .collect()
            })
        })
        .collect();
    let mut concurrent = Vec::new();
    for t in threads {
        concurrent.extend(
            t.join()
                .map_err(|_| anyhow::anyhow!("allocating thread panicked"))??,
        );
    }
    let wall = started.elapsed();
    Ok(json!({
        "allocate": summary(alloc),
        "release": summary(rel),
        "reserve_answer": summary(reserve),
        "reserve_durable": summary(durable),
        "allocate_16_threads": summary(concurrent),
        "allocate_16_threads_wall_s": wall.as_secs_f64(),
    }))
}

/// N sequential setups (each followed by a check), then N teardowns, then the reaper's flush.
async fn dataplane(n: usize) -> Result<Value> {
    let node = Netns::new("cbnode")?;
    let dp = Dataplane::with_host_netns(node.path())?;
    let sandboxes: Vec<Netns> = (0..n).map(|_| Netns::new("cb")).collect::<Result<_>>()?;
    let specs: Vec<SandboxSpec> = sandboxes
        .iter()
        .enumerate()
        .map(|(i, sb)| SandboxSpec {
            container_id: format!("cb{i}"),
            netns: sb.path().to_owned(),
            ifname: "eth0".to_owned(),
            addresses: vec![PodAddress {
                address: format!("10.245.{}.{}/16", i / 200, i % 200 + 2)
                    .parse()
                    .expect("literal cidr"),
                gateway: "10.245.255.1".parse().expect("literal ip"),
            }],
            mtu: Some(1460),
            routes: vec![RouteSpec {
                dst: "0.0.0.0/0".parse().expect("literal cidr"),
                gw: None,
            }],
        })
        .collect();
    let (mut setups, mut checks, mut teardowns) = (Vec::new(), Vec::new(), Vec::new());
    for s in &specs {
        let t = Instant::now();
        dp.setup(s)
            .await
            .with_context(|| format!("setup {}", s.container_id))?;
        setups.push(t.elapsed());
        let t = Instant::now();
        dp.check(s)
            .await
            .map_err(|e| anyhow::anyhow!("check {}: {e}", s.container_id))?;
        checks.push(t.elapsed());
    }
    for s in &specs {
        let t = Instant::now();
        dp.teardown(&s.container_id, &s.ifname, Some(&s.netns))
            .await?;
        teardowns.push(t.elapsed());
    }
    let t = Instant::now();
    let left = dp.flush_deletions().await;
    ensure!(left == 0, "{left} retired links not deleted");
    Ok(json!({
        "setup": summary(setups),
        "check": summary(checks),
        "teardown": summary(teardowns),
        "flush_deletions_s": t.elapsed().as_secs_f64(),
    }))
}

fn main() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()
        .context("N must be a number")?
        .unwrap_or(100)
        .max(1);
    let ipam = ipam(n)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dataplane = runtime.block_on(dataplane(n))?;
    println!(
        "{}",
        json!({ "n": n, "ipam": ipam, "dataplane": dataplane })
    );
    Ok(())
}
