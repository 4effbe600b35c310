//! `cargo xtask bench`: provisioner side by side with the reference ptp + host-local plugins,
//! in the same run, in private namespaces that are always removed.
//!
//! Three ways of wiring a sandbox are measured on identical namespaces and subnets, each with
//! its own sandbox namespaces, interleaved in blocks (see `ways`):
//! - `reference`: /usr/lib/cni/ptp with host-local IPAM, exec'd as a runtime does;
//! - `plugin`: the provisioner binary exec'd in CNI plugin mode, talking to the daemon;
//! - `api`: one request on the daemon's socket from this process (no exec).
//!
//! Every call's latency is recorded with the CPU time it cost: the exec'd process's (wait4) and
//! the daemon's (its process CPU clock over the block, per call). Floors measured in the same
//! run (`phases`, `floor`), the daemon's memory and start-up (`daemon_phase`) and the tracer's
//! cost (`trace_overhead`) complete the report (`output`): a table on the terminal,
//! target/bench/latest.{json,md} (or `--json FILE`) and an SVG of the latency distributions.
//!
//! Plugins are spawned as a Go runtime (containerd, CRI-O) spawns them: posix_spawn, a
//! vfork-style clone, from a caller thread that entered the way's "node" namespace (no
//! `ip netns exec`, no fork of this process); the daemon runs there too and gets
//! `--host-netns`. The root namespace is never touched. Sandbox namespaces are created up
//! front and not timed.

mod cpus;
mod daemon_phase;
mod floor;
pub mod netns;
mod output;
mod phases;
mod pool;
mod proc_stat;
mod quiet;
mod report;
mod stats;
mod svg;
mod trace_overhead;
mod ways;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::release::build_dist;
use crate::step::detail;

pub use netns::{Netns, require_root};
pub use testkit::cni::{Plugin, plugin_stdin};
pub use testkit::daemon::Daemon;

/// Directory of the reference plugins (Debian containernetworking-plugins).
const REFERENCE_DIR: &str = "/usr/lib/cni";
/// Pod subnet used by every way (the same shape everywhere; each way has its own node netns).
const SUBNET: &str = "10.244.0.0/16";
/// Longest wait for the machine to be quiet before a timed part (the kernel tearing down the
/// namespaces of the part before).
const QUIET_BEFORE_PHASE: Duration = Duration::from_secs(30);

/// `cargo xtask bench` options.
pub struct Options {
    /// Sandboxes of the sequential phases (ADD of each, then DEL of each).
    pub count: usize,
    /// Concurrent callers.
    pub concurrency: usize,
    /// ADDs (then DELs) of the concurrent phase.
    pub concurrent_count: usize,
    /// Sandboxes provisioned when measuring the daemon's RSS.
    pub sandboxes: usize,
    /// Calls per way per block of a sequential phase (concurrent phases: 4 x).
    pub block: usize,
    /// Where to write every figure (default target/bench/latest.json).
    pub json: Option<PathBuf>,
    /// Run the daemon without its kernel watch (eBPF tracing), and skip the tracer's rounds.
    pub no_trace: bool,
    /// Measure this provisioner binary instead of building one (e.g. another build to compare).
    pub bin: Option<PathBuf>,
}

/// `cargo xtask bench`: every part, then the report.
pub fn run(opts: &Options) -> Result<()> {
    if opts.count == 0 || opts.concurrent_count == 0 {
        bail!("--count and --concurrent-count must be at least 1");
    }
    let bin = prepare(opts)?;
    let reference = Path::new(REFERENCE_DIR).join("ptp");
    if !reference.exists() {
        bail!(
            "{} missing: install containernetworking-plugins",
            reference.display()
        );
    }
    let total = Instant::now();
    let load_before = output::load_average();
    output::warn_if_busy(load_before);
    let tmp = tempfile::Builder::new()
        .prefix("provisioner-bench")
        .tempdir()?;
    let floors = phases::floors(opts)?;
    let node = Netns::new("nodeprov")?;
    let started = daemon_phase::start(opts, &bin, &node, tmp.path())?;
    let ways = phases::ways(opts, (&bin, &reference), &node, tmp.path(), &started)?;
    let daemon = daemon_phase::memory(opts, &bin, &node, tmp.path(), started)?;
    let overhead = if opts.no_trace {
        None
    } else {
        Some(trace_overhead::run(&bin)?)
    };
    let run = output::Run {
        opts,
        bin: &bin,
        floors,
        ways,
        daemon,
        overhead,
        load_before,
        total,
    };
    output::write(&run)
}

/// `--trace-overhead-only`: the tracer's cost alone, written to `--json` (default
/// target/bench/trace-overhead.json).
pub fn run_trace_overhead(opts: &Options) -> Result<()> {
    let bin = prepare(opts)?;
    let results = trace_overhead::run(&bin)?;
    println!("\n{}", report::markdown(&[], &results.singles()?));
    let document = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "binary": bin,
        "binary_id": pool::binary_id(&bin),
        "machine": output::machine(),
        "trace_overhead": results.json(),
    });
    let path = output::path(opts, "trace-overhead.json")?;
    std::fs::write(&path, serde_json::to_vec_pretty(&document)?)?;
    println!("written: {}", path.display());
    Ok(())
}

/// Root, the binary to measure, Ctrl-C caught, namespaces of killed runs removed.
fn prepare(opts: &Options) -> Result<PathBuf> {
    require_root("bench")?;
    let bin = match &opts.bin {
        Some(bin) => bin.clone(),
        None => build_dist()?,
    };
    catch_interrupt();
    let stale = netns::remove_stale();
    if stale > 0 {
        detail(&format!(
            "removed {stale} namespace(s) left by a killed run"
        ));
    }
    Ok(bin)
}

/// `cargo xtask bench-pool`: the tracer's rows pooled over the runs written to `files`.
pub fn run_pool(files: &[PathBuf]) -> Result<()> {
    pool::run(files)
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns Ctrl-C into an error at the next check, so every guard still cleans up.
pub fn catch_interrupt() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Creates `n` sandbox namespaces named `<prefix><i>` (not timed).
pub fn sandbox_namespaces(prefix: &str, n: usize) -> Result<Vec<Netns>> {
    let mut pods = Vec::with_capacity(n);
    for i in 0..n {
        check_interrupted()?;
        pods.push(Netns::new(&format!("{prefix}{i}"))?);
    }
    Ok(pods)
}

/// The provisioner network used by the bench's daemons.
fn provisioner_conflist(socket: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "bench-provisioner",
        "plugins": [{
            "type": "provisioner",
            "mtu": 1460,
            "socket": socket,
            "ipam": { "ranges": [[{ "subnet": SUBNET }]], "routes": [{ "dst": "0.0.0.0/0" }] }
        }]
    })
}

/// The reference network: the same shape through ptp + host-local.
fn reference_conflist(data_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "bench-reference",
        "plugins": [{
            "type": "ptp",
            "mtu": 1460,
            "ipam": {
                "type": "host-local",
                "dataDir": data_dir,
                "ranges": [[{ "subnet": SUBNET }]],
                "routes": [{ "dst": "0.0.0.0/0" }]
            }
        }]
    })
}
