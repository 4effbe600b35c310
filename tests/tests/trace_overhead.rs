//! Measures what the tracer adds to unrelated sendmsg-heavy work: UDP datagrams on `lo` inside a test
//! namespace, with and without the programs attached (alternating rounds, best of each).
//! Time is the sending thread's CPU time (user + kernel, BPF included), so other load on the
//! machine does not count.

use std::net::UdpSocket;
use std::time::Duration;

use provisioner::trace::KernelTracer;
use provisioner_tests::{Netns, in_netns, require_root};

const SENDS: usize = 100_000;
const ROUNDS: usize = 6;

fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

fn blast(ns: &Netns) -> anyhow::Result<Duration> {
    in_netns(ns.path(), || -> anyhow::Result<Duration> {
        let rx = UdpSocket::bind("127.0.0.1:0")?;
        let tx = UdpSocket::bind("127.0.0.1:0")?;
        let to = rx.local_addr()?;
        let payload = [0u8; 64];
        let start = thread_cpu();
        for _ in 0..SENDS {
            tx.send_to(&payload, to)?;
        }
        Ok(thread_cpu().saturating_sub(start))
    })?
}

/// A measurement, not a check (tests do not assert timings): run it on a quiet machine with
/// `cargo test --release -p provisioner-tests --test trace_overhead -- --ignored --nocapture`.
#[ignore = "measurement: run explicitly on a quiet machine"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracer_adds_little_to_unrelated_sendmsg_work() -> anyhow::Result<()> {
    require_root();
    let ns = Netns::new("trovh")?;
    blast(&ns)?; // warm up
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        off.push(blast(&ns)?);
        let (tracer, rx) = KernelTracer::start(1024)?;
        on.push(blast(&ns)?);
        drop(rx);
        drop(tracer);
    }
    let best = |v: &[Duration]| v.iter().min().copied().unwrap_or_default();
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let ratio = best(&on).as_secs_f64() / best(&off).as_secs_f64();
    println!(
        "{SENDS} UDP sendto: best off {:?} on {:?} (+{:.1}%); median off {:?} on {:?}; per call +{:.0} ns",
        best(&off),
        best(&on),
        (ratio - 1.0) * 100.0,
        median(&mut off.clone()),
        median(&mut on.clone()),
        (best(&on).as_secs_f64() - best(&off).as_secs_f64()) / SENDS as f64 * 1e9
    );
    Ok(())
}
