//! Skipped sandboxes of another runtime beside the test suite, as a node has them: a real
//! containerd whose conf dir holds only a loopback network creates a pod sandbox every
//! `--every` seconds (each fails with "failed to find network info", its netns pinned under
//! /run/netns and gone within ~30 ms), and one with an empty conf dir keeps `--pinned` NOTREADY
//! sandboxes with their netns for the whole run. Every kernel watch of the tests sees them;
//! a test that reads the watch must hold to what it created (docs/testing.md).
//!
//!     stray_sandboxes [--every S] [--pinned N] [--seconds S]
//!
//! Runs until SIGTERM or SIGINT (or `--seconds`), then removes its sandboxes, pins and
//! containerds. Its pods are `stray/stray-<n>`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use provisioner_tests::Netns;
use provisioner_tests::containerd::{CniSetup, Containerd};
use provisioner_tests::cri::Cri;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

struct Options {
    every: Duration,
    pinned: usize,
    seconds: Option<Duration>,
}

fn options() -> Result<Options> {
    let mut opts = Options {
        every: Duration::from_secs(2),
        pinned: 2,
        seconds: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--every" => opts.every = Duration::from_secs_f64(value.parse()?),
            "--pinned" => opts.pinned = value.parse()?,
            "--seconds" => opts.seconds = Some(Duration::from_secs_f64(value.parse()?)),
            other => bail!("unknown option {other} (--every S, --pinned N, --seconds S)"),
        }
    }
    Ok(opts)
}

/// RunPodSandbox `stray/<name>`, which fails for want of a network.
fn stray_pod(containerd: &mut Containerd, name: &str) -> Result<()> {
    let config =
        Cri::kubelet_pod_config("stray", name, &format!("uid-{name}"), &containerd.log_dir);
    match containerd.cri().run_pod(&config) {
        Ok(pod) => bail!(
            "RunPodSandbox {name} succeeded ({}) without a network",
            pod.id
        ),
        Err(_) => Ok(()),
    }
}

fn main() -> Result<()> {
    let opts = options()?;
    let handler = nix::sys::signal::SigHandler::Handler(stop);
    for signal in [nix::sys::signal::SIGTERM, nix::sys::signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { nix::sys::signal::signal(signal, handler) }.context("install a signal handler")?;
    }
    let node = Netns::new("stray")?;
    let loopback_dir = tempfile::tempdir()?;
    std::fs::write(
        loopback_dir.path().join("10-loopback.conf"),
        r#"{"cniVersion": "0.4.0", "name": "lo", "type": "loopback"}"#,
    )?;
    let empty_dir = tempfile::tempdir()?;
    let mut loopback_only = Containerd::start(&node, &CniSetup::reading(loopback_dir.path()))?;
    let mut empty = Containerd::start(&node, &CniSetup::reading(empty_dir.path()))?;
    for i in 0..opts.pinned {
        stray_pod(&mut empty, &format!("stray-pinned-{i}"))?;
    }
    eprintln!(
        "stray sandboxes: containerd pids {:?} (loopback only, one pod every {:?}) and {:?} ({} pinned)",
        loopback_only.pid(),
        opts.every,
        empty.pid(),
        opts.pinned
    );
    let started = Instant::now();
    let mut made = 0usize;
    while !STOP.load(Ordering::Relaxed) && opts.seconds.is_none_or(|s| started.elapsed() < s) {
        stray_pod(&mut loopback_only, &format!("stray-{made}"))?;
        made += 1;
        let next = Instant::now() + opts.every;
        while Instant::now() < next && !STOP.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    eprintln!("stray sandboxes: {made} made; cleaning up");
    loopback_only.shutdown()?;
    empty.shutdown()
}
