//! `cargo xtask bench`: provisioner side by side with the reference ptp + host-local plugins,
//! in the same run, in private namespaces that are always removed.
//!
//! Three ways of wiring a sandbox are measured on identical namespaces and subnets:
//! - `reference`: /usr/lib/cni/ptp with host-local IPAM, exec'd as a runtime does;
//! - `plugin`: the provisioner binary exec'd in CNI plugin mode, talking to the daemon;
//! - `api`: one request on the daemon's socket from this process (no exec).
//!
//! Each plugin child enters its "node" namespace with setns(2) between fork and exec (no
//! `ip netns exec`); the daemon runs there too and gets `--host-netns`. The root namespace is
//! never touched. Sandbox namespaces are created up front and not timed.

mod cni;
mod daemon;
pub mod netns;
mod report;
mod stats;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::step::{announce, cargo, detail, run as run_command, workspace_root};
use crate::{bootstrap, ebpf};

pub use cni::{Plugin, plugin_stdin};
pub use daemon::{Daemon, sandbox_request};
pub use netns::{Netns, require_root};

use report::{Check, DaemonRow, LatencyRow};
use stats::Summary;

/// Directory of the reference plugins (Debian containernetworking-plugins).
const REFERENCE_DIR: &str = "/usr/lib/cni";
/// Pod subnet used by every way (the same shape everywhere; each way has its own node netns).
const SUBNET: &str = "10.244.0.0/16";
/// Calls per way before measuring (first exec, page cache, daemon warm-up).
const WARMUP: usize = 3;
/// Fresh daemon starts measured for start-to-ready (the bench daemon's own start is one more).
const EXTRA_STARTS: usize = 3;

/// `cargo xtask bench` options.
pub struct Options {
    /// Sandboxes per sequential and per concurrent phase.
    pub count: usize,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Sandboxes provisioned when measuring the daemon's RSS.
    pub sandboxes: usize,
}

/// Bootstraps, builds the eBPF object and the release binary; the binary's path.
pub fn build_release() -> Result<PathBuf> {
    bootstrap::apt_packages()?;
    ebpf::build()?;
    announce("build", "provisioner (release)");
    let root = workspace_root();
    run_command(cargo("stable").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "provisioner",
    ]))?;
    let bin = root.join("target/release/provisioner");
    if !bin.exists() {
        bail!("{} missing after the build", bin.display());
    }
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verb {
    Add,
    Del,
}

impl Verb {
    fn cni(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
        }
    }

    fn api(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Del => "del",
        }
    }
}

/// One way of wiring a sandbox.
enum Way<'a> {
    Reference(Plugin<'a>),
    Plugin(Plugin<'a>),
    Api(PathBuf),
}

impl Way<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::Reference(_) => "reference",
            Self::Plugin(_) => "plugin",
            Self::Api(_) => "api",
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Self::Reference(_) => "reference ptp + host-local (exec)",
            Self::Plugin(_) => "provisioner CNI plugin mode (exec -> daemon)",
            Self::Api(_) => "provisioner daemon API (socket, no exec)",
        }
    }

    /// One call; its latency as the caller sees it. Fails unless it succeeded.
    fn call(&self, verb: Verb, id: &str, netns: &Path) -> Result<Duration> {
        match self {
            Self::Reference(plugin) | Self::Plugin(plugin) => {
                Ok(plugin.exec_ok(verb.cni(), id, netns)?.elapsed)
            }
            Self::Api(socket) => {
                let request = sandbox_request(verb.api(), id, netns);
                let started = Instant::now();
                let response = daemon::call(socket, &request)?;
                let elapsed = started.elapsed();
                daemon::ok(response).with_context(|| format!("{} {id}", verb.api()))?;
                Ok(elapsed)
            }
        }
    }

    fn node(&self) -> Option<&Netns> {
        match self {
            Self::Reference(p) | Self::Plugin(p) => Some(p.node),
            Self::Api(_) => None,
        }
    }
}

/// What one way measured.
struct WayResults {
    seq_add: Summary,
    seq_del: Summary,
    conc_add: Summary,
    conc_del: Summary,
}

fn sequential(way: &Way, verb: Verb, ids: &[String], pods: &[Netns]) -> Result<Summary> {
    let started = Instant::now();
    let mut samples = Vec::with_capacity(ids.len());
    for (id, pod) in ids.iter().zip(pods) {
        check_interrupted()?;
        samples.push(way.call(verb, id, pod.path())?);
    }
    Ok(Summary::of(&samples, started.elapsed()))
}

fn concurrent(
    way: &Way,
    verb: Verb,
    ids: &[String],
    pods: &[Netns],
    workers: usize,
) -> Result<Summary> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let samples = Mutex::new(Vec::with_capacity(ids.len()));
    let first_error = Mutex::new(None);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            scope.spawn(|| {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= ids.len()
                        || failed.load(Ordering::SeqCst)
                        || INTERRUPTED.load(Ordering::SeqCst)
                    {
                        break;
                    }
                    match way.call(verb, &ids[i], pods[i].path()) {
                        Ok(d) => mine.push(d),
                        Err(err) => {
                            failed.store(true, Ordering::SeqCst);
                            first_error
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .get_or_insert(err);
                            break;
                        }
                    }
                }
                samples
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend(mine);
            });
        }
    });
    let wall = started.elapsed();
    if let Some(err) = first_error
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        return Err(err);
    }
    check_interrupted()?;
    let samples = samples
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(Summary::of(&samples, wall))
}

/// Waits until `node` holds no link but `lo` (every veth of the last phase is gone).
fn settle(node: &Netns) -> Result<()> {
    let started = Instant::now();
    loop {
        let links = node.links()?;
        if links.is_empty() {
            if started.elapsed() > Duration::from_millis(50) {
                detail(&format!(
                    "node settled after {:.0} ms",
                    started.elapsed().as_secs_f64() * 1e3
                ));
            }
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(15) {
            bail!(
                "{} links left in node netns {} after DEL: {}",
                links.len(),
                node.name(),
                links.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn measure_way(way: &Way, pods: &[Netns], opts: &Options) -> Result<WayResults> {
    let tag = way.name();
    let n = opts.count;
    let warm: Vec<String> = (0..WARMUP.min(n)).map(|i| format!("{tag}-w{i}")).collect();
    for (id, pod) in warm.iter().zip(pods) {
        way.call(Verb::Add, id, pod.path())?;
    }
    for (id, pod) in warm.iter().zip(pods) {
        way.call(Verb::Del, id, pod.path())?;
    }
    let seq_ids: Vec<String> = (0..n).map(|i| format!("{tag}-s{i}")).collect();
    let conc_ids: Vec<String> = (0..n).map(|i| format!("{tag}-c{i}")).collect();

    announce("bench", &format!("{}: sequential ADD x{n}", way.describe()));
    let seq_add = sequential(way, Verb::Add, &seq_ids, pods)?;
    detail(&seq_add.line());
    announce("bench", &format!("{}: sequential DEL x{n}", way.describe()));
    let seq_del = sequential(way, Verb::Del, &seq_ids, pods)?;
    detail(&seq_del.line());
    if let Some(node) = way.node() {
        settle(node)?;
    }
    let workers = opts.concurrency;
    announce(
        "bench",
        &format!("{}: {workers} concurrent callers, ADD x{n}", way.describe()),
    );
    let conc_add = concurrent(way, Verb::Add, &conc_ids, pods, workers)?;
    detail(&conc_add.line());
    announce(
        "bench",
        &format!("{}: {workers} concurrent callers, DEL x{n}", way.describe()),
    );
    let conc_del = concurrent(way, Verb::Del, &conc_ids, pods, workers)?;
    detail(&conc_del.line());
    if let Some(node) = way.node() {
        settle(node)?;
    }
    Ok(WayResults {
        seq_add,
        seq_del,
        conc_add,
        conc_del,
    })
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

/// Writes `conflist` as `<dir>/net.d/10-provisioner.conflist` (the daemon's conf dir).
fn write_conf(dir: &Path, conflist: &Value) -> Result<()> {
    let conf_dir = dir.join("net.d");
    std::fs::create_dir_all(&conf_dir)?;
    std::fs::write(
        conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec_pretty(conflist)?,
    )?;
    Ok(())
}

/// Starts a daemon in `dir` (conf already there) and waits for ready; start-to-ready time.
fn start_daemon(bin: &Path, node: &Netns, dir: &Path) -> Result<(Daemon, Duration)> {
    let mut daemon = Daemon::spawn(bin, node, dir, &[])?;
    let ready = daemon.wait_ready(Duration::from_secs(10))?;
    Ok((daemon, ready))
}

/// What the daemon-only phases measured.
struct DaemonResults {
    fresh_starts_ms: Vec<f64>,
    rss_idle_kib: u64,
    rss_loaded_kib: u64,
    restart_ready_ms: f64,
    rss_after_restart_kib: u64,
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

pub fn run(opts: &Options) -> Result<()> {
    require_root("bench")?;
    if opts.count == 0 {
        bail!("--count must be at least 1");
    }
    let bin = build_release()?;
    let reference_bin = Path::new(REFERENCE_DIR).join("ptp");
    if !reference_bin.exists() {
        bail!(
            "{} missing: install containernetworking-plugins",
            reference_bin.display()
        );
    }
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
    let n_pods = opts.count.max(opts.sandboxes);
    let created = Instant::now();
    let pods = sandbox_namespaces("p", n_pods)?;
    detail(&format!(
        "node netns {} (reference) and {} (provisioner), {n_pods} sandbox netns in {:.1} s",
        node_ref.name(),
        node_prov.name(),
        created.elapsed().as_secs_f64()
    ));

    // Reference.
    let reference_conf = reference_conflist(&tmp.path().join("host-local"));
    let reference = Way::Reference(Plugin {
        bin: reference_bin,
        cni_path: REFERENCE_DIR.to_owned(),
        stdin: cni::plugin_stdin(&reference_conf)?,
        node: &node_ref,
    });
    let ref_results = measure_way(&reference, &pods, opts)?;

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
        write_conf(&dir, &provisioner_conflist(&dir.join("provisioner.sock")))?;
        let (mut daemon, ready) = start_daemon(&bin, &node_prov, &dir)?;
        fresh_starts_ms.push(ready.as_secs_f64() * 1e3);
        daemon.stop()?;
    }
    let dir = tmp.path().join("daemon");
    let socket = dir.join("provisioner.sock");
    let conflist = provisioner_conflist(&socket);
    write_conf(&dir, &conflist)?;
    let (mut daemon, ready) = start_daemon(&bin, &node_prov, &dir)?;
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

    let plugin = Way::Plugin(Plugin {
        bin: bin.clone(),
        cni_path: REFERENCE_DIR.to_owned(),
        stdin: cni::plugin_stdin(&conflist)?,
        node: &node_prov,
    });
    let plugin_results = measure_way(&plugin, &pods, opts)?;
    let api = Way::Api(socket.clone());
    let api_results = measure_way(&api, &pods, opts)?;
    settle(&node_prov)?;

    // RSS with N sandboxes, then a restart on that state.
    let n = opts.sandboxes;
    announce(
        "bench",
        &format!(
            "provisioner daemon: RSS with {n} sandboxes ({} callers through the API)",
            opts.concurrency
        ),
    );
    let ids: Vec<String> = (0..n).map(|i| format!("rss-{i}")).collect();
    let provision = concurrent(&api, Verb::Add, &ids, &pods, opts.concurrency)?;
    let rss_loaded_kib = daemon.rss_kib()?;
    detail(&format!(
        "provisioned: {}; RSS {:.1} MiB",
        provision.line(),
        mib(rss_loaded_kib)
    ));
    announce(
        "bench",
        &format!("provisioner daemon: restart with {n} allocations, start to ready"),
    );
    daemon.stop()?;
    let (mut daemon, restart_ready) = start_daemon(&bin, &node_prov, &dir)?;
    let rss_after_restart_kib = daemon.rss_kib()?;
    let listed = daemon.request(&json!({"op": "list"}))?;
    let restart_ready_ms = restart_ready.as_secs_f64() * 1e3;
    detail(&format!(
        "ready after {restart_ready_ms:.1} ms with {} allocations; RSS {:.1} MiB",
        listed.as_array().map_or(0, Vec::len),
        mib(rss_after_restart_kib)
    ));
    announce("bench", &format!("cleanup: DEL of the {n} sandboxes"));
    concurrent(&api, Verb::Del, &ids, &pods, opts.concurrency)?;
    settle(&node_prov)?;
    daemon.stop()?;
    let daemon_results = DaemonResults {
        fresh_starts_ms,
        rss_idle_kib,
        rss_loaded_kib,
        restart_ready_ms,
        rss_after_restart_kib,
        provision,
    };

    let load_after = load_average();
    warn_if_busy(load_after);
    let (latency, daemon_rows) = rows(
        opts,
        &ref_results,
        &plugin_results,
        &api_results,
        &daemon_results,
    );
    let table = report::table(&latency, &daemon_rows);
    announce(
        "bench",
        &format!("results ({:.0} s in all)", total.elapsed().as_secs_f64()),
    );
    println!();
    println!("{table}");
    let out_dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let out = out_dir.join("latest.json");
    let document = json!({
        "generated_at_unix": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "machine": {
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "cpus": cpus(),
            "load_average_1m_before": load_before,
            "load_average_1m_after": load_after,
        },
        "options": {
            "count": opts.count,
            "concurrency": opts.concurrency,
            "sandboxes": opts.sandboxes,
            "subnet": SUBNET,
            "reference": REFERENCE_DIR,
        },
        "table": report::json(&latency, &daemon_rows),
        "phases": {
            "reference": way_json(&ref_results),
            "plugin": way_json(&plugin_results),
            "api": way_json(&api_results),
            "daemon": {
                "fresh_start_to_ready_ms": daemon_results.fresh_starts_ms,
                "rss_idle_kib": daemon_results.rss_idle_kib,
                "rss_with_sandboxes_kib": daemon_results.rss_loaded_kib,
                "restart_to_ready_ms": stats::round3(daemon_results.restart_ready_ms),
                "rss_after_restart_kib": daemon_results.rss_after_restart_kib,
                "provision_sandboxes": daemon_results.provision.json(),
            }
        },
        "wall_s": stats::round3(total.elapsed().as_secs_f64()),
    });
    std::fs::write(&out, serde_json::to_vec_pretty(&document)?)?;
    println!("written to {}", out.display());
    drop(pods);
    drop(node_prov);
    drop(node_ref);
    Ok(())
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

fn way_json(r: &WayResults) -> Value {
    json!({
        "sequential_add": r.seq_add.json(),
        "sequential_del": r.seq_del.json(),
        "concurrent_add": r.conc_add.json(),
        "concurrent_del": r.conc_del.json(),
    })
}

fn rows(
    opts: &Options,
    reference: &WayResults,
    plugin: &WayResults,
    api: &WayResults,
    daemon: &DaemonResults,
) -> (Vec<LatencyRow>, Vec<DaemonRow>) {
    let row = |metric: String,
               pick: fn(&WayResults) -> f64,
               target: &'static str,
               checks: Vec<Check>| LatencyRow {
        metric,
        reference: Some(pick(reference)),
        plugin: Some(pick(plugin)),
        api: Some(pick(api)),
        target,
        checks,
    };
    let n = opts.count;
    let c = opts.concurrency;
    let latency = vec![
        row(
            format!("ADD median (seq, N={n})"),
            |r| r.seq_add.median_ms,
            "plugin >=5x; api <1 ms",
            vec![Check::PluginRatioAtLeast(5.0), Check::ApiBelow(1.0)],
        ),
        row(
            format!("ADD p99 (seq, N={n})"),
            |r| r.seq_add.p99_ms,
            "",
            vec![],
        ),
        row(
            format!("DEL median (seq, N={n})"),
            |r| r.seq_del.median_ms,
            "plugin >=5x",
            vec![Check::PluginRatioAtLeast(5.0)],
        ),
        row(
            format!("DEL p99 (seq, N={n})"),
            |r| r.seq_del.p99_ms,
            "",
            vec![],
        ),
        row(
            format!("ADD median ({c} callers)"),
            |r| r.conc_add.median_ms,
            "",
            vec![],
        ),
        row(
            format!("ADD p99 ({c} callers)"),
            |r| r.conc_add.p99_ms,
            "p99 <10 ms",
            vec![Check::PluginBelow(10.0), Check::ApiBelow(10.0)],
        ),
        row(
            format!("DEL median ({c} callers)"),
            |r| r.conc_del.median_ms,
            "",
            vec![],
        ),
        row(
            format!("DEL p99 ({c} callers)"),
            |r| r.conc_del.p99_ms,
            "",
            vec![],
        ),
    ];
    let partial = (opts.sandboxes < 1000).then(|| {
        format!(
            "measured with {} sandboxes; the target is for 1000: --sandboxes 1000",
            opts.sandboxes
        )
    });
    let daemon_rows = vec![
        DaemonRow {
            metric: "RSS, no sandbox".to_owned(),
            unit: "MiB",
            value: Some(mib(daemon.rss_idle_kib)),
            target: "",
            checks: vec![],
            note: None,
        },
        DaemonRow {
            metric: format!("RSS, {} sandboxes", opts.sandboxes),
            unit: "MiB",
            value: Some(mib(daemon.rss_loaded_kib)),
            target: "<30 MB with 1000",
            checks: vec![Check::ValueBelow(30.0)],
            note: partial.clone(),
        },
        DaemonRow {
            metric: format!("RSS after restart, {} allocations", opts.sandboxes),
            unit: "MiB",
            value: Some(mib(daemon.rss_after_restart_kib)),
            target: "",
            checks: vec![],
            note: None,
        },
        DaemonRow {
            metric: format!(
                "API ADD p99 filling to {} ({} callers)",
                opts.sandboxes, opts.concurrency
            ),
            unit: "ms",
            value: Some(daemon.provision.p99_ms),
            target: "(p99 <10 ms)",
            checks: vec![],
            note: Some(format!(
                "median {:.2} ms, {:.1} s for all",
                daemon.provision.median_ms, daemon.provision.wall_s
            )),
        },
        DaemonRow {
            metric: format!(
                "start to ready, fresh (median of {})",
                daemon.fresh_starts_ms.len()
            ),
            unit: "ms",
            value: Some(median(&daemon.fresh_starts_ms)),
            target: "<500 ms",
            checks: vec![Check::ValueBelow(500.0)],
            note: None,
        },
        DaemonRow {
            metric: format!("start to ready, {} allocations", opts.sandboxes),
            unit: "ms",
            value: Some(daemon.restart_ready_ms),
            target: "<500 ms",
            checks: vec![Check::ValueBelow(500.0)],
            note: partial,
        },
    ];
    (latency, daemon_rows)
}
