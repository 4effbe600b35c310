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
//! run (`floor`), the daemon's memory and start-up, and the components measured alone
//! (`components`) complete the report: a table on the terminal, target/bench/latest.{json,md}
//! (or `--json FILE`) and an SVG of the latency distributions.
//!
//! Plugins are spawned as a Go runtime (containerd, CRI-O) spawns them: posix_spawn, a
//! vfork-style clone, from a caller thread that entered the way's "node" namespace (no
//! `ip netns exec`, no fork of this process); the daemon runs there too and gets
//! `--host-netns`. The root namespace is never touched. Sandbox namespaces are created up
//! front and not timed.
//!
//! One module per part; a new measurement is a new module under `bench/` with a call in `run`.

mod bpf_run_time;
mod components;
mod cpu_wakes;
mod cpus;
mod floor;
pub mod netns;
mod null_probe;
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

use crate::step::{announce, cargo, detail, run as run_command, workspace_root};
use crate::{allocator_check, bootstrap, ebpf};

pub use netns::{Netns, require_root};
pub use testkit::cni::{Plugin, plugin_stdin};
pub use testkit::daemon::Daemon;
use testkit::daemon::write_conflist;

use proc_stat::{CpuTimes, DISTURBING_STEAL_PERCENT};
use report::{Row, Single, Target};
use stats::{Samples, Summary, ThreadSplit};
use ways::{Lane, Verb, Way};

/// Directory of the reference plugins (Debian containernetworking-plugins).
const REFERENCE_DIR: &str = "/usr/lib/cni";
/// Pod subnet used by every way (the same shape everywhere; each way has its own node netns).
const SUBNET: &str = "10.244.0.0/16";
/// Calls per way before measuring (first exec, page cache, daemon warm-up).
const WARMUP: usize = 3;
/// Fresh daemon starts measured for start-to-ready (the bench daemon's own start is one more).
const EXTRA_STARTS: usize = 3;
/// Most sandboxes wired by the kernel floor.
const FLOOR_MAX: usize = 200;
/// Wakes of an idle CPU measured for the machine's stall rate (about 1.1 ms each).
const CPU_WAKES: usize = 3000;

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
    /// Skip the components measured alone (allocator, dataplane).
    pub no_components: bool,
    /// Run the daemon without its kernel watch (eBPF tracing), to see what tracing costs.
    pub no_trace: bool,
    /// Measure this provisioner binary instead of building one (e.g. another build to compare).
    pub bin: Option<PathBuf>,
}

/// `--trace-overhead-only`: the tracer's cost alone, written to `--json` (default
/// target/bench/trace-overhead.json).
pub fn run_trace_overhead(opts: &Options) -> Result<()> {
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
    let results = trace_overhead::run(&bin)?;
    println!();
    println!("{}", report::table(&[], &results.singles()));
    let out_dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let path = opts
        .json
        .clone()
        .unwrap_or_else(|| out_dir.join("trace-overhead.json"));
    let document = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "binary": bin,
        "binary_id": pool::binary_id(&bin),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "load_average_1m": load_average(),
        "trace_overhead": results.json(),
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&document)?)?;
    println!("written: {}", path.display());
    Ok(())
}

/// `cargo xtask bench-pool`: the tracer's rows pooled over the runs written to `files`.
pub fn run_pool(files: &[PathBuf]) -> Result<()> {
    pool::run(files)
}

/// The target triple of the binary to install (given explicitly so that RUSTFLAGS only reach
/// the target's crates, not build scripts and proc-macros). musl: a static musl binary starts
/// in a fraction of a glibc one's time (glibc probes the CPU caches with CPUID at every start,
/// which traps to the hypervisor in a VM: docs/benchmarks.md), and the CNI plugin mode is
/// exec'd once per ADD and DEL. The daemon gets mimalloc there (provisioner/src/memory).
pub const RELEASE_TARGET: &str = "x86_64-unknown-linux-musl";
/// Non-PIE: no relocations to apply at exec (musl links statically by default).
const RELEASE_RUSTFLAGS: &str = "-C relocation-model=static";

/// Bootstraps, builds the eBPF object and the binary to install and measure (profile `dist`:
/// LTO, one codegen unit, static non-PIE, for musl); the binary's path. A cold build takes
/// about 20 minutes on 2 cores.
pub fn build_dist() -> Result<PathBuf> {
    build_provisioner(
        "dist",
        "provisioner (profile dist: LTO, one codegen unit, static non-PIE, musl)",
        Some(RELEASE_RUSTFLAGS),
    )
}

/// Bootstraps, builds the eBPF object and a plain release binary for musl (the demo's: quicker
/// to build than [`build_dist`], which the bench measures); the binary's path.
pub fn build_release() -> Result<PathBuf> {
    build_provisioner("release", "provisioner (release, musl)", None)
}

fn build_provisioner(profile: &str, what: &str, rustflags: Option<&str>) -> Result<PathBuf> {
    bootstrap::apt_packages()?;
    bootstrap::release_target(RELEASE_TARGET)?;
    ebpf::build()?;
    announce("build", what);
    let root = workspace_root();
    let mut build = cargo("stable");
    build
        .current_dir(&root)
        .args(["build", "--profile", profile, "-p", "provisioner", "--bin"])
        .arg("provisioner")
        .args(["--target", RELEASE_TARGET]);
    if let Some(flags) = rustflags {
        build.env("RUSTFLAGS", flags);
    }
    run_command(&mut build)?;
    let bin = root
        .join("target")
        .join(RELEASE_TARGET)
        .join(profile)
        .join("provisioner");
    if !bin.exists() {
        bail!("{} missing after the build", bin.display());
    }
    detail(&format!("binary: {}", bin.display()));
    allocator_check::check(&bin)?;
    Ok(bin)
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

/// The provisioner network used by the bench's daemon.
fn provisioner_conflist(socket: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "bench-provisioner",
        "plugins": [{
            "type": "provisioner",
            "mtu": 1460,
            "socket": socket,
            "ipam": {
                "ranges": [[{ "subnet": SUBNET }]],
                "routes": [{ "dst": "0.0.0.0/0" }]
            }
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

/// `n` sandbox namespaces per prefix (none for an empty prefix), created once `daemon`'s kernel
/// watch is attached (when it runs one), not timed.
fn sandboxes_seen_created(
    daemon: &Daemon,
    opts: &Options,
    first: &str,
    second: &str,
    n: usize,
) -> Result<(Vec<Netns>, Vec<Netns>)> {
    if !opts.no_trace {
        trace_overhead::wait_attached(daemon)?;
    }
    let created = Instant::now();
    let first = sandbox_namespaces(first, n)?;
    let second = if second.is_empty() {
        Vec::new()
    } else {
        sandbox_namespaces(second, n)?
    };
    detail(&format!(
        "{} sandbox netns in {:.1} s",
        first.len() + second.len(),
        created.elapsed().as_secs_f64()
    ));
    Ok((first, second))
}

/// Starts a daemon in `dir` (conf already there) and waits for ready; start-to-ready time.
fn start_daemon(
    bin: &Path,
    node: &Netns,
    dir: &Path,
    opts: &Options,
) -> Result<(Daemon, Duration)> {
    start_daemon_with(bin, node, dir, opts, &[])
}

fn start_daemon_with(
    bin: &Path,
    node: &Netns,
    dir: &Path,
    opts: &Options,
    args: &[&str],
) -> Result<(Daemon, Duration)> {
    let mut extra = args.to_vec();
    if opts.no_trace {
        extra.push("--no-trace");
    }
    let mut daemon = Daemon::spawn(bin, node, dir, &extra)?;
    let ready = daemon.wait_ready(Duration::from_secs(10))?;
    Ok((daemon, ready))
}

/// Longest wait for the machine to be quiet before a timed part (the kernel tearing down the
/// namespaces of the part before).
const QUIET_BEFORE_PHASE: Duration = Duration::from_secs(30);

/// The RSS phase's daemon judges its sandboxes this soon after their ADD...
const RSS_TRACE_DEADLINE: Duration = Duration::from_secs(1);
/// ...and the RSS is read this long after that (the verdicts come at the driver's next tick).
const VERDICT_SETTLE: Duration = Duration::from_secs(2);

/// How many of the daemon's sandbox views hold a verdict, in words (asked after the RSS is
/// read: the answer is large).
fn verdicts_given(daemon: &mut Daemon) -> Result<String> {
    let answer = daemon.request(&json!({"op": "sandboxes"}))?;
    let views = answer["sandboxes"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let judged = views.iter().filter(|v| !v["verdict"].is_null()).count();
    Ok(format!("{judged} of {} sandbox views judged", views.len()))
}

/// What the daemon-only phases measured.
struct DaemonResults {
    fresh_starts_ms: Vec<f64>,
    rss_idle_kib: u64,
    rss_loaded_kib: u64,
    restart_ready_ms: f64,
    /// At ready, while the kernel watch may still be loading.
    rss_after_restart_kib: u64,
    /// 2 s later.
    rss_after_restart_settled_kib: u64,
    provision: Summary,
}

#[expect(clippy::cast_precision_loss, reason = "KiB values are far below 2^52")]
fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

/// Everything one run measured, by phase.
struct Measured {
    /// Per lane (reference, plugin, api).
    seq_add: Vec<Samples>,
    seq_del: Vec<Samples>,
    conc_add: Vec<Samples>,
    conc_del: Vec<Samples>,
    exec_floor: Samples,
    kernel_add: Samples,
    kernel_del: Samples,
    cpu_wakes: cpu_wakes::Wakes,
    steal: PhaseSteal,
}

/// The hypervisor's steal over each timed phase, percent of the CPU time (`top`'s `st`).
#[derive(Debug, Clone, Copy)]
struct PhaseSteal {
    seq_add: f64,
    seq_del: f64,
    conc_add: f64,
    conc_del: f64,
}

impl PhaseSteal {
    fn most(&self) -> f64 {
        [self.seq_add, self.seq_del, self.conc_add, self.conc_del]
            .into_iter()
            .fold(0.0, f64::max)
    }

    fn json(&self) -> Value {
        json!({
            "sequential_add": stats::round3(self.seq_add),
            "sequential_del": stats::round3(self.seq_del),
            "concurrent_add": stats::round3(self.conc_add),
            "concurrent_del": stats::round3(self.conc_del),
        })
    }
}

/// Warms every lane up (first exec, page cache, the daemon's first sandbox) with ids of its
/// own, in the pods after those the phases use.
fn warm_up(lanes: &[Lane], n: usize) -> Result<()> {
    for lane in lanes {
        let pods = &lane.pods[n..];
        let ids = ways::ids(lane, "w", WARMUP.min(pods.len()));
        for verb in [Verb::Add, Verb::Del] {
            ways::interleaved(
                std::slice::from_ref(lane),
                verb,
                std::slice::from_ref(&ids),
                WARMUP,
                1,
            )?;
        }
    }
    Ok(())
}

/// Runs one interleaved phase of every lane and prints a line per lane; returns the samples
/// per lane and the hypervisor's steal over the phase (percent of the CPU time).
fn phase(
    lanes: &[Lane],
    verb: Verb,
    tag: &str,
    n: usize,
    block: usize,
    workers: usize,
) -> Result<(Vec<Samples>, f64)> {
    let what = if workers > 1 {
        format!("{workers} concurrent callers")
    } else {
        "sequential".to_owned()
    };
    announce(
        "bench",
        &format!(
            "{what}: {verb:?} x{n} per way, interleaved in blocks of {block} ({})",
            lanes
                .iter()
                .map(|l| l.way.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let ids: Vec<Vec<String>> = lanes.iter().map(|l| ways::ids(l, tag, n)).collect();
    let before = CpuTimes::now()?;
    let out = ways::interleaved(lanes, verb, &ids, block, workers)?;
    let cpu = CpuTimes::now()?.since(&before);
    for (lane, samples) in lanes.iter().zip(&out) {
        detail(&format!(
            "{:<9} {}",
            lane.way.name(),
            Summary::of(samples).line()
        ));
        if let Some(split) = ThreadSplit::of(samples).line() {
            detail(&format!("{:<9} daemon CPU by thread: {split}", ""));
        }
    }
    detail(&format!(
        "CPUs: {:.0}% busy, hypervisor steal {:.1}%",
        cpu.not_idle_percent() - cpu.steal_percent(),
        cpu.steal_percent()
    ));
    Ok((out, cpu.steal_percent()))
}

#[expect(
    clippy::too_many_lines,
    reason = "the run, phase by phase, reads top to bottom"
)]
pub fn run(opts: &Options) -> Result<()> {
    require_root("bench")?;
    if opts.count == 0 || opts.concurrent_count == 0 {
        bail!("--count and --concurrent-count must be at least 1");
    }
    let bin = match &opts.bin {
        Some(bin) => bin.clone(),
        None => build_dist()?,
    };
    let reference_bin = Path::new(REFERENCE_DIR).join("ptp");
    if !reference_bin.exists() {
        bail!(
            "{} missing: install containernetworking-plugins",
            reference_bin.display()
        );
    }
    let components = if opts.no_components {
        None
    } else {
        Some(components::build()?)
    };
    catch_interrupt();
    let total = Instant::now();
    let load_before = load_average();
    warn_if_busy(load_before);

    announce("bench", "private namespaces (not timed)");
    let stale = netns::remove_stale();
    if stale > 0 {
        detail(&format!(
            "removed {stale} namespace(s) left by a killed run"
        ));
    }
    let tmp = tempfile::Builder::new()
        .prefix("provisioner-bench")
        .tempdir()?;
    let node_ref = Netns::new("noderef")?;
    let node_prov = Netns::new("nodeprov")?;
    let node_floor = Netns::new("nodefloor")?;
    let per_way = opts.count.max(opts.concurrent_count) + WARMUP;
    let created = Instant::now();
    let pods_ref = sandbox_namespaces("r", per_way)?;
    let floor_n = opts.count.min(FLOOR_MAX);
    let pods_floor = sandbox_namespaces("f", floor_n)?;
    detail(&format!(
        "{} sandbox netns in {:.1} s",
        per_way + floor_n,
        created.elapsed().as_secs_f64()
    ));

    // Floors first, on a quiet node.
    quiet::wait("the floors", QUIET_BEFORE_PHASE)?;
    announce(
        "bench",
        &format!("floor: spawn + exec of /bin/true x{}", opts.count),
    );
    let true_plugin = Plugin {
        bin: PathBuf::from("/bin/true"),
        cni_path: REFERENCE_DIR.to_owned(),
        stdin: b"{}".to_vec(),
        node: &node_floor,
    };
    let true_lane = Lane {
        way: Way::Reference(true_plugin),
        pods: &pods_floor,
    };
    let true_ids = vec![ways::ids(&true_lane, "t", opts.count.min(pods_floor.len()))];
    let mut exec_floor = Samples::default();
    for _ in 0..opts.count.div_ceil(pods_floor.len().max(1)) {
        exec_floor.extend(
            ways::interleaved(
                std::slice::from_ref(&true_lane),
                Verb::Add,
                &true_ids,
                50,
                1,
            )?
            .remove(0),
        );
    }
    detail(&Summary::of(&exec_floor).line());
    announce(
        "bench",
        &format!("floor: the kernel's cost of one ADD's and one DEL's netlink requests x{floor_n}"),
    );
    let (kernel_add, kernel_del) = floor::kernel(&node_floor, &pods_floor)?;
    detail(&format!(
        "ADD requests: {}",
        Summary::of(&kernel_add).line()
    ));
    detail(&format!(
        "DEL requests: {}",
        Summary::of(&kernel_del).line()
    ));
    drop(pods_floor);

    // provisioner: start-to-ready of fresh daemons first.
    announce(
        "bench",
        &format!(
            "provisioner daemon: start to ready, {} fresh starts",
            EXTRA_STARTS + 1
        ),
    );
    let mut fresh_starts_ms = Vec::new();
    for i in 0..EXTRA_STARTS {
        let dir = tmp.path().join(format!("start{i}"));
        write_conflist(&dir, &provisioner_conflist(&dir.join("provisioner.sock")))?;
        let (mut daemon, ready) = start_daemon(&bin, &node_prov, &dir, opts)?;
        fresh_starts_ms.push(ready.as_secs_f64() * 1e3);
        daemon.stop()?;
    }
    let dir = tmp.path().join("daemon");
    let conflist = provisioner_conflist(&dir.join("provisioner.sock"));
    write_conflist(&dir, &conflist)?;
    let (mut daemon, ready) = start_daemon(&bin, &node_prov, &dir, opts)?;
    fresh_starts_ms.push(ready.as_secs_f64() * 1e3);
    let rss_idle_kib = daemon.rss_kib()?;
    detail(&format!(
        "ready after {} ms; RSS {:.1} MiB with no sandbox",
        fresh_starts_ms
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        mib(rss_idle_kib)
    ));
    // A runtime creates a sandbox's netns just before its ADD, with the kernel watch running:
    // so do these (a netns created before tracing costs a read of its state at its first ADD).
    let (pods_plugin, pods_api) = sandboxes_seen_created(&daemon, opts, "p", "a", per_way)?;

    let measured = {
        let lanes = [
            Lane {
                way: Way::Reference(Plugin {
                    bin: reference_bin,
                    cni_path: REFERENCE_DIR.to_owned(),
                    stdin: plugin_stdin(&reference_conflist(&tmp.path().join("host-local")))?,
                    node: &node_ref,
                }),
                pods: &pods_ref,
            },
            Lane {
                way: Way::Plugin(
                    Plugin {
                        bin: bin.clone(),
                        cni_path: REFERENCE_DIR.to_owned(),
                        stdin: plugin_stdin(&conflist)?,
                        node: &node_prov,
                    },
                    &daemon,
                ),
                pods: &pods_plugin,
            },
            Lane {
                way: Way::Api(&daemon),
                pods: &pods_api,
            },
        ];
        let n = opts.count;
        let m = opts.concurrent_count;
        let c = opts.concurrency;
        warm_up(&lanes, per_way - WARMUP)?;
        quiet::wait("the sequential phases", QUIET_BEFORE_PHASE)?;
        announce(
            "bench",
            &format!("floor: wakes of an idle CPU x{CPU_WAKES}, just before the sequential phases"),
        );
        let cpu_wakes = cpu_wakes::measure(CPU_WAKES)?;
        detail(&cpu_wakes.line());
        let (seq_add, steal_seq_add) = phase(&lanes, Verb::Add, "s", n, opts.block, 1)?;
        let (seq_del, steal_seq_del) = phase(&lanes, Verb::Del, "s", n, opts.block, 1)?;
        ways::settle(&node_ref)?;
        ways::settle(&node_prov)?;
        quiet::wait("the concurrent phases", QUIET_BEFORE_PHASE)?;
        let (conc_add, steal_conc_add) = phase(&lanes, Verb::Add, "c", m, 4 * opts.block, c)?;
        let (conc_del, steal_conc_del) = phase(&lanes, Verb::Del, "c", m, 4 * opts.block, c)?;
        ways::settle(&node_ref)?;
        ways::settle(&node_prov)?;
        Measured {
            seq_add,
            seq_del,
            conc_add,
            conc_del,
            exec_floor,
            kernel_add,
            kernel_del,
            cpu_wakes,
            steal: PhaseSteal {
                seq_add: steal_seq_add,
                seq_del: steal_seq_del,
                conc_add: steal_conc_add,
                conc_del: steal_conc_del,
            },
        }
    };
    drop(pods_ref);
    drop(pods_plugin);

    // RSS with N sandboxes, then a restart on that state, by a daemon started once the other
    // ways' namespaces are gone: the kernel watch keeps state per namespace of the node, and a
    // node with N sandboxes does not hold the bench's thousands of other namespaces.
    daemon.stop()?;
    ways::settle(&node_prov)?;
    let dir = tmp.path().join("rss");
    let conflist = provisioner_conflist(&dir.join("provisioner.sock"));
    write_conflist(&dir, &conflist)?;
    // The sandboxes are judged (their verdicts kept, with timelines) before the RSS is read:
    // a short trace deadline, then a wait past it.
    let (mut daemon, _) = start_daemon_with(
        &bin,
        &node_prov,
        &dir,
        opts,
        &[
            "--trace-deadline",
            &RSS_TRACE_DEADLINE.as_secs().to_string(),
        ],
    )?;
    let n = opts.sandboxes;
    drop(pods_api);
    let (pods_api, _) = sandboxes_seen_created(&daemon, opts, "s", "", n)?;
    quiet::wait("the RSS phase", QUIET_BEFORE_PHASE)?;
    announce(
        "bench",
        &format!(
            "provisioner daemon (fresh): RSS with {n} sandboxes ({} callers through the API)",
            opts.concurrency
        ),
    );
    let api_lane = [Lane {
        way: Way::Api(&daemon),
        pods: &pods_api,
    }];
    let rss_ids = vec![ways::ids(&api_lane[0], "rss", n)];
    let provision =
        ways::interleaved(&api_lane, Verb::Add, &rss_ids, n, opts.concurrency)?.remove(0);
    if !opts.no_trace {
        std::thread::sleep(RSS_TRACE_DEADLINE + VERDICT_SETTLE);
    }
    let rss_loaded_kib = daemon.rss_kib()?;
    detail(&format!(
        "provisioned: {}; RSS {:.1} MiB{}",
        Summary::of(&provision).line(),
        mib(rss_loaded_kib),
        if opts.no_trace {
            String::new()
        } else {
            format!(", {}", verdicts_given(&mut daemon)?)
        }
    ));
    announce(
        "bench",
        &format!("provisioner daemon: restart with {n} allocations, start to ready"),
    );
    daemon.stop()?;
    let (mut daemon, restart_ready) = start_daemon(&bin, &node_prov, &dir, opts)?;
    let rss_after_restart_kib = daemon.rss_kib()?;
    let listed = daemon.request(&json!({"op": "list"}))?;
    let restart_ready_ms = restart_ready.as_secs_f64() * 1e3;
    // The kernel watch loads in the background after ready: RSS once it settled too.
    std::thread::sleep(Duration::from_secs(2));
    let rss_after_restart_settled_kib = daemon.rss_kib()?;
    detail(&format!(
        "ready after {restart_ready_ms:.1} ms with {} allocations; RSS {:.1} MiB at ready, {:.1} MiB 2 s later",
        listed.as_array().map_or(0, Vec::len),
        mib(rss_after_restart_kib),
        mib(rss_after_restart_settled_kib)
    ));
    announce("bench", &format!("cleanup: DEL of the {n} sandboxes"));
    let api_lane = [Lane {
        way: Way::Api(&daemon),
        pods: &pods_api,
    }];
    ways::interleaved(&api_lane, Verb::Del, &rss_ids, n, opts.concurrency)?;
    ways::settle(&node_prov)?;
    daemon.stop()?;
    drop(pods_api);
    let daemon_results = DaemonResults {
        fresh_starts_ms,
        rss_idle_kib,
        rss_loaded_kib,
        restart_ready_ms,
        rss_after_restart_kib,
        rss_after_restart_settled_kib,
        provision: Summary::of(&provision),
    };

    let component_results = match &components {
        Some(binary) => Some(components::run(binary)?),
        None => None,
    };
    let overhead = if opts.no_trace {
        None
    } else {
        Some(trace_overhead::run(&bin)?)
    };

    let load_after = load_average();
    warn_if_busy(load_after);
    warn_if_stolen(&measured.steal);
    let (rows, mut singles) = rows(opts, &measured, &daemon_results, component_results.as_ref());
    if let Some(overhead) = &overhead {
        singles.extend(overhead.singles());
    }
    let table = report::table(&rows, &singles);
    announce(
        "bench",
        &format!("results ({:.0} s in all)", total.elapsed().as_secs_f64()),
    );
    println!();
    println!("{table}");
    let out_dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let machine = json!({
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpu": cpu_model(),
        "cpus": cpus(),
        "load_average_1m_before": load_before,
        "load_average_1m_after": load_after,
        "steal_percent": measured.steal.json(),
    });
    let names = ["reference", "plugin", "api"];
    let phases = |v: &[Samples]| -> Value {
        names
            .iter()
            .zip(v)
            .map(|(name, s)| {
                (
                    (*name).to_owned(),
                    json!({
                        "summary": Summary::of(s).json(),
                        "daemon_cpu_ms_per_call_by_thread": ThreadSplit::of(s).json(),
                        "latencies_ms": stats::raw_ms(s),
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let document = json!({
        "generated_at_unix": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": machine,
        "options": {
            "count": opts.count,
            "concurrency": opts.concurrency,
            "concurrent_count": opts.concurrent_count,
            "sandboxes": opts.sandboxes,
            "block": opts.block,
            "daemon_kernel_watch": !opts.no_trace,
            "subnet": SUBNET,
            "reference": REFERENCE_DIR,
            "binary": bin,
            "binary_id": pool::binary_id(&bin),
        },
        "table": report::json(&rows, &singles),
        "phases": {
            "sequential_add": phases(&measured.seq_add),
            "sequential_del": phases(&measured.seq_del),
            "concurrent_add": phases(&measured.conc_add),
            "concurrent_del": phases(&measured.conc_del),
            "floor_exec_true": Summary::of(&measured.exec_floor).json(),
            "floor_kernel_add": Summary::of(&measured.kernel_add).json(),
            "floor_kernel_del": Summary::of(&measured.kernel_del).json(),
            "floor_cpu_wakes": measured.cpu_wakes.json(),
            "daemon": {
                "fresh_start_to_ready_ms": daemon_results.fresh_starts_ms,
                "rss_idle_kib": daemon_results.rss_idle_kib,
                "rss_with_sandboxes_kib": daemon_results.rss_loaded_kib,
                "restart_to_ready_ms": stats::round3(daemon_results.restart_ready_ms),
                "rss_after_restart_at_ready_kib": daemon_results.rss_after_restart_kib,
                "rss_after_restart_settled_kib": daemon_results.rss_after_restart_settled_kib,
                "provision_sandboxes": daemon_results.provision.json(),
            },
            "components": component_results.as_ref().map(components::Results::json),
            "trace_overhead": overhead.as_ref().map(trace_overhead::Results::json),
        },
        "wall_s": stats::round3(total.elapsed().as_secs_f64()),
    });
    let json_path = opts
        .json
        .clone()
        .unwrap_or_else(|| out_dir.join("latest.json"));
    std::fs::write(&json_path, serde_json::to_vec_pretty(&document)?)?;
    let md = out_dir.join("latest.md");
    std::fs::write(&md, report::markdown(&rows, &singles))?;
    let plot = out_dir.join("latency.svg");
    // Reference and plugin mode: the two CNI paths.
    let mut all = Vec::new();
    for (v, what, dashed) in [
        (
            &measured.seq_add,
            format!("ADD sequential (N={})", opts.count),
            false,
        ),
        (
            &measured.conc_add,
            format!("ADD, {} callers", opts.concurrency),
            true,
        ),
    ] {
        for ((name, color), s) in names.iter().zip(["#d62728", "#1f77b4"]).zip(v.iter()) {
            all.push(svg::Series {
                label: format!("{name}, {what}"),
                samples: &s.wall,
                color,
                dashed,
            });
        }
    }
    std::fs::write(
        &plot,
        svg::cdf(
            "CNI ADD latency: reference ptp + host-local vs provisioner plugin mode",
            &all,
        ),
    )?;
    println!(
        "written: {}, {}, {}",
        json_path.display(),
        md.display(),
        plot.display()
    );
    drop(node_prov);
    drop(node_ref);
    drop(node_floor);
    Ok(())
}

/// The table's rows.
fn rows(
    opts: &Options,
    m: &Measured,
    daemon: &DaemonResults,
    components: Option<&components::Results>,
) -> (Vec<Row>, Vec<Single>) {
    let sum = |v: &[Samples]| -> Vec<Summary> { v.iter().map(Summary::of).collect() };
    let (sa, sd, ca) = (sum(&m.seq_add), sum(&m.seq_del), sum(&m.conc_add));
    let row = |metric: String, unit, s: &[Summary], pick: fn(&Summary) -> f64, target| Row {
        metric,
        unit,
        reference: s.first().map(pick),
        plugin: s.get(1).map(pick),
        api: s.get(2).map(pick),
        cpu: [
            s.first().map(|x| x.cpu_ms),
            s.get(1).map(|x| x.cpu_ms),
            s.get(2).map(|x| x.cpu_ms),
        ],
        target,
    };
    let n = opts.count;
    let c = opts.concurrency;
    let cm = opts.concurrent_count;
    let total: Vec<Summary> = sa
        .iter()
        .zip(&sd)
        .map(|(a, d)| Summary {
            wall_s: a.wall_s + d.wall_s,
            cpu_ms: f64::midpoint(a.cpu_ms, d.cpu_ms),
            ..*a
        })
        .collect();
    let rows = vec![
        row(
            format!("ADD median, N={n} sequential"),
            "ms",
            &sa,
            |s| s.median_ms,
            Target::Ratio {
                plugin: 0.2,
                api_ms: Some(1.0),
            },
        ),
        row(
            format!("ADD p99, N={n}"),
            "ms",
            &sa,
            |s| s.p99_ms,
            Target::Ratio {
                plugin: 0.2,
                api_ms: None,
            },
        ),
        row(
            format!("DEL median, N={n} sequential"),
            "ms",
            &sd,
            |s| s.median_ms,
            Target::Ratio {
                plugin: 0.2,
                api_ms: Some(1.0),
            },
        ),
        row(
            format!("DEL p99, N={n}"),
            "ms",
            &sd,
            |s| s.p99_ms,
            Target::None,
        ),
        row(
            format!("{n} ADD + DEL, total"),
            "s",
            &total,
            |s| s.wall_s,
            Target::Ratio {
                plugin: 0.1,
                api_ms: None,
            },
        ),
        row(
            format!("{c} callers, {cm} ADDs, wall"),
            "s",
            &ca,
            |s| s.wall_s,
            Target::Ratio {
                plugin: 0.2,
                api_ms: None,
            },
        ),
        row(
            format!("{c} callers, ADD p99"),
            "ms",
            &ca,
            |s| s.p99_ms,
            Target::Ratio {
                plugin: 0.2,
                api_ms: None,
            },
        ),
        row(
            format!("{c} callers, ADD median"),
            "ms",
            &ca,
            |s| s.median_ms,
            Target::None,
        ),
    ];
    let floor = |metric: &str, s: &Samples| {
        let s = Summary::of(s);
        Single {
            metric: format!("floor: {metric} (median; p99 {:.2} ms)", s.p99_ms),
            unit: "ms",
            value: s.median_ms,
            cpu_ms: Some(s.cpu_ms),
            target: Target::None,
            interval: None,
            note: None,
        }
    };
    let partial = (opts.sandboxes < 1000).then(|| {
        format!(
            "measured with {} sandboxes; the target is for 1000: --sandboxes 1000",
            opts.sandboxes
        )
    });
    let single = |metric: String, unit, value, target, note| Single {
        metric,
        unit,
        value,
        cpu_ms: None,
        target,
        interval: None,
        note,
    };
    let mut singles = vec![
        floor("spawn + exec of /bin/true", &m.exec_floor),
        floor("kernel, one ADD's netlink requests", &m.kernel_add),
        floor("kernel, one DEL's netlink requests", &m.kernel_del),
        single(
            format!("machine: idle-CPU wakes over 2 ms ({})", m.cpu_wakes.line()),
            "per s",
            m.cpu_wakes.stalls_per_second(),
            Target::None,
            Some(
                "no provisioner code involved: a stall during the 100 sequential ADDs is enough to move their p99"
                    .to_owned(),
            ),
        ),
        single(
            "daemon RSS, no sandbox".to_owned(),
            "MiB",
            mib(daemon.rss_idle_kib),
            Target::None,
            None,
        ),
        single(
            format!("daemon RSS, {} sandboxes", opts.sandboxes),
            "MiB",
            mib(daemon.rss_loaded_kib),
            Target::AtMost(30.0),
            partial.clone(),
        ),
        single(
            format!(
                "daemon RSS after restart, {} allocations, at ready",
                opts.sandboxes
            ),
            "MiB",
            mib(daemon.rss_after_restart_kib),
            Target::None,
            Some("the kernel watch may still be loading".to_owned()),
        ),
        single(
            format!(
                "daemon RSS after restart, {} allocations, 2 s later",
                opts.sandboxes
            ),
            "MiB",
            mib(daemon.rss_after_restart_settled_kib),
            Target::AtMost(30.0),
            partial.clone(),
        ),
        single(
            format!(
                "start to ready, fresh (median of {})",
                daemon.fresh_starts_ms.len()
            ),
            "ms",
            median(&daemon.fresh_starts_ms),
            Target::AtMost(500.0),
            None,
        ),
        single(
            format!("start to ready, {} allocations", opts.sandboxes),
            "ms",
            daemon.restart_ready_ms,
            Target::AtMost(500.0),
            partial,
        ),
        single(
            format!(
                "API ADD p99 filling to {} ({} callers)",
                opts.sandboxes, opts.concurrency
            ),
            "ms",
            daemon.provision.p99_ms,
            Target::None,
            Some(format!(
                "median {:.2} ms, {:.1} s for all",
                daemon.provision.median_ms, daemon.provision.wall_s
            )),
        ),
    ];
    if let Some(components) = components {
        singles.extend(components.singles());
    }
    (rows, singles)
}

/// The CPU model, from /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// The 1-minute load average.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn warn_if_stolen(steal: &PhaseSteal) {
    if steal.most() > DISTURBING_STEAL_PERCENT {
        detail(&format!(
            "note: the hypervisor took up to {:.0}% of the CPU time of a timed phase (steal): \
             every way ran slower, in bursts; absolute numbers are inflated and tails noisier, \
             compare the ratios",
            steal.most()
        ));
    }
}

#[expect(clippy::cast_precision_loss, reason = "CPU counts are small")]
fn warn_if_busy(load: Option<f64>) {
    if let Some(load) = load
        && load > cpus() as f64 * 0.75
    {
        detail(&format!(
            "note: the machine is busy (load average {load:.1} on {} CPUs): absolute numbers \
             are inflated, compare the ratios",
            cpus()
        ));
    }
}
