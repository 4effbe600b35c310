//! `cargo xtask bench`: provisioner side by side with the reference ptp + host-local plugins,
//! in the same run, in private namespaces that are always removed.
//!
//! Three ways of wiring a sandbox are measured on identical namespaces and subnets, each with
//! its own sandbox namespaces, interleaved in blocks (`ways`):
//! - `reference`: /usr/lib/cni/ptp with host-local IPAM, exec'd as a runtime does;
//! - `plugin`: the provisioner binary exec'd in CNI plugin mode, talking to the daemon;
//! - `api`: one request on the daemon's socket from this process (no exec).
//!
//! Every call's latency is recorded with the CPU time it cost: the exec'd process's (wait4) and
//! the daemon's (its process CPU clock over the block, per call). The floors (`floor`), the
//! daemon's memory and start-up (`daemon_phase`) and the tracer's cost (`trace_overhead`)
//! complete the report (`report`): a table on the terminal, target/bench/latest.{json,md} (or
//! `--json FILE`) and an SVG of the latency distributions. Before each timed part the bench
//! waits for a quiet machine, and reports the hypervisor's steal over it (`machine`).

mod daemon_phase;
mod floor;
mod machine;
pub mod netns;
mod pool;
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
use crate::step::{announce, detail};

pub use netns::{Netns, require_root};
pub use testkit::cni::{Plugin, plugin_stdin};
pub use testkit::daemon::Daemon;

/// Directory of the reference plugins (Debian containernetworking-plugins).
const REFERENCE_DIR: &str = "/usr/lib/cni";
/// Pod subnet used by every way (the same shape everywhere; each way has its own node netns).
const SUBNET: &str = "10.244.0.0/16";

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
    /// Rounds of the tracer's cost (each a daemon measured with its kernel watch on and off).
    pub rounds: usize,
    /// Longest wait for a quiet machine before a timed part (a third of it in the tracer's
    /// rounds); the part is timed anyway after it, with a note.
    pub quiet_wait: Duration,
    /// Where to write every figure (default target/bench/latest.json).
    pub json: Option<PathBuf>,
    /// Run the daemon without its kernel watch (eBPF tracing), and skip the tracer's rounds.
    pub no_trace: bool,
    /// Measure this provisioner binary instead of building one (e.g. another build to compare).
    pub bin: Option<PathBuf>,
}

/// `cargo xtask bench`: every part, then the report.
pub fn run(opts: &Options) -> Result<()> {
    if opts.count == 0 || opts.concurrent_count == 0 || opts.rounds == 0 {
        bail!("--count, --concurrent-count and --rounds must be at least 1");
    }
    let reference = Path::new(REFERENCE_DIR).join("ptp");
    if !reference.exists() {
        bail!("{REFERENCE_DIR}/ptp missing: install containernetworking-plugins");
    }
    let bin = prepare(opts)?;
    let (total, load_before) = (Instant::now(), machine::load_average());
    machine::warn_if_busy(load_before);
    let tmp = tempfile::tempdir()?;
    let floors = floor::measure(opts)?;
    let node = Netns::new("nodeprov")?;
    let started = daemon_phase::start(opts, &bin, &node, tmp.path())?;
    let ways = ways::measure(opts, (&bin, &reference), &node, tmp.path(), &started)?;
    let daemon = daemon_phase::memory(opts, &bin, &node, tmp.path(), started)?;
    let overhead = (!opts.no_trace)
        .then(|| trace_overhead::run(opts, &bin))
        .transpose()?;
    let run = report::Run {
        opts,
        bin: &bin,
        floors,
        ways,
        daemon,
        overhead,
        started: (total, load_before),
    };
    report::write(&run)
}

/// `--trace-overhead-only`: the tracer's cost alone, written to `--json` (default
/// target/bench/trace-overhead.json).
pub fn run_trace_overhead(opts: &Options) -> Result<()> {
    let bin = prepare(opts)?;
    let results = trace_overhead::run(opts, &bin)?;
    println!("\n{}", report::markdown(&[], &results.singles()?));
    let document = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "binary": bin,
        "binary_id": pool::binary_id(&bin),
        "machine": machine::describe(),
        "trace_overhead": results.json(),
    });
    let path = report::path(opts, "trace-overhead.json")?;
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
        detail(&format!("removed {stale} namespace(s) of a killed run"));
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
    let handler = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, handler) };
}

pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Announces a part of the bench.
fn step(what: String) {
    announce("bench", &what);
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

/// `bin` exec'd as a CNI plugin from `node`, fed `stdin`.
fn plugin<'a>(bin: &Path, stdin: Vec<u8>, node: &'a Netns) -> Plugin<'a> {
    let (bin, cni_path) = (bin.to_path_buf(), REFERENCE_DIR.to_owned());
    Plugin {
        bin,
        cni_path,
        stdin,
        node,
    }
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
