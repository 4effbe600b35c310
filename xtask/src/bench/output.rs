//! What a whole run reports: the table's rows, the JSON document with every figure (raw
//! latencies included), the markdown table and the plot, and notes on a busy machine.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use serde_json::{Value, json};

use super::daemon_phase::{DaemonResults, mib};
use super::phases::{Floors, Ways};
use super::proc_stat::DISTURBING_STEAL_PERCENT;
use super::report::{self, Row, Single, Target};
use super::stats::{self, Samples, Summary, median};
use super::trace_overhead::Results as Overhead;
use super::{Options, REFERENCE_DIR, SUBNET, pool, svg};
use crate::step::{announce, detail, workspace_root};

/// Everything one run measured.
pub struct Run<'a> {
    pub opts: &'a Options,
    pub bin: &'a Path,
    pub floors: Floors,
    pub ways: Ways,
    pub daemon: DaemonResults,
    pub overhead: Option<Overhead>,
    pub load_before: Option<f64>,
    pub total: Instant,
}

const NAMES: [&str; 3] = ["reference", "plugin", "api"];
const PHASES: [&str; 4] = [
    "sequential_add",
    "sequential_del",
    "concurrent_add",
    "concurrent_del",
];

/// Prints the tables and writes the JSON, the markdown and the plot.
pub fn write(run: &Run) -> Result<()> {
    let load_after = load_average();
    warn_if_busy(load_after);
    let steal = run.ways.steal.iter().copied().fold(0.0, f64::max);
    if steal > DISTURBING_STEAL_PERCENT {
        detail(&format!(
            "note: the hypervisor took up to {steal:.0}% of the CPU time of a timed phase \
             (steal): absolute numbers are inflated and tails noisier, compare the ratios"
        ));
    }
    let rows = rows(run.opts, &run.ways);
    let mut singles = singles(run.opts, &run.floors, &run.daemon);
    if let Some(overhead) = &run.overhead {
        singles.extend(overhead.singles()?);
    }
    let table = report::markdown(&rows, &singles);
    announce(
        "bench",
        &format!(
            "results ({:.0} s in all)",
            run.total.elapsed().as_secs_f64()
        ),
    );
    println!("\n{table}");
    let json_path = path(run.opts, "latest.json")?;
    let document = document(run, &rows, &singles, load_after);
    std::fs::write(&json_path, serde_json::to_vec_pretty(&document)?)?;
    let md = json_path.with_extension("md");
    std::fs::write(&md, table)?;
    let plot = json_path.with_extension("svg");
    std::fs::write(&plot, self::plot(run))?;
    println!(
        "written: {}, {}, {}",
        json_path.display(),
        md.display(),
        plot.display()
    );
    Ok(())
}

/// `--json`, or `file` in target/bench.
pub fn path(opts: &Options, file: &str) -> Result<PathBuf> {
    let out_dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    Ok(opts.json.clone().unwrap_or_else(|| out_dir.join(file)))
}

/// The rows comparing the ways; the targets are docs/benchmarks.md's.
fn rows(opts: &Options, ways: &Ways) -> Vec<Row> {
    let sum = |v: &[Samples]| -> Vec<Summary> { v.iter().map(Summary::of).collect() };
    let (sa, sd, ca) = (sum(&ways.seq_add), sum(&ways.seq_del), sum(&ways.conc_add));
    let total: Vec<Summary> = sa
        .iter()
        .zip(&sd)
        .map(|(a, d)| Summary {
            wall_s: a.wall_s + d.wall_s,
            cpu_ms: f64::midpoint(a.cpu_ms, d.cpu_ms),
            ..*a
        })
        .collect();
    let row = |metric: String, unit, s: &[Summary], pick: fn(&Summary) -> f64, target| Row {
        metric,
        unit,
        values: [0, 1, 2].map(|i| s.get(i).map(pick)),
        cpu: [0, 1, 2].map(|i| s.get(i).map(|x| x.cpu_ms)),
        target,
    };
    let ratio = |plugin| Target::Ratio {
        plugin,
        api_ms: None,
    };
    let with_api = Target::Ratio {
        plugin: 0.2,
        api_ms: Some(1.0),
    };
    let (n, c, m) = (opts.count, opts.concurrency, opts.concurrent_count);
    vec![
        row(
            format!("ADD median, N={n} sequential"),
            "ms",
            &sa,
            |s| s.median_ms,
            with_api,
        ),
        row(
            format!("ADD p99, N={n}"),
            "ms",
            &sa,
            |s| s.p99_ms,
            ratio(0.2),
        ),
        row(
            format!("DEL median, N={n} sequential"),
            "ms",
            &sd,
            |s| s.median_ms,
            with_api,
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
            ratio(0.1),
        ),
        row(
            format!("{c} callers, {m} ADDs, wall"),
            "s",
            &ca,
            |s| s.wall_s,
            ratio(0.2),
        ),
        row(
            format!("{c} callers, ADD p99"),
            "ms",
            &ca,
            |s| s.p99_ms,
            ratio(0.2),
        ),
        row(
            format!("{c} callers, ADD median"),
            "ms",
            &ca,
            |s| s.median_ms,
            Target::None,
        ),
    ]
}

/// The floors' and the daemon's rows.
fn singles(opts: &Options, floors: &Floors, daemon: &DaemonResults) -> Vec<Single> {
    let floor = |metric: &str, s: &Samples| {
        let s = Summary::of(s);
        let metric = format!("floor: {metric} (median; p99 {:.2} ms)", s.p99_ms);
        Single {
            cpu_ms: Some(s.cpu_ms),
            ..Single::plain(metric, "ms", s.median_ms, Target::None)
        }
    };
    let n = opts.sandboxes;
    let partial = |s: Single| {
        if n < 1000 {
            s.with_note(format!(
                "measured with {n} sandboxes; the target is for 1000"
            ))
        } else {
            s
        }
    };
    let p = &daemon.provision;
    vec![
        floor("spawn + exec of /bin/true", &floors.exec),
        floor("kernel, one ADD's netlink requests", &floors.kernel_add),
        floor("kernel, one DEL's netlink requests", &floors.kernel_del),
        Single::plain(
            "daemon RSS, no sandbox".into(),
            "MiB",
            mib(daemon.rss_idle_kib),
            Target::None,
        ),
        partial(Single::plain(
            format!("daemon RSS, {n} sandboxes"),
            "MiB",
            mib(daemon.rss_loaded_kib),
            Target::AtMost(30.0),
        )),
        partial(Single::plain(
            format!("daemon RSS 2 s after a restart with {n} allocations"),
            "MiB",
            mib(daemon.rss_after_restart_kib),
            Target::AtMost(30.0),
        )),
        Single::plain(
            format!(
                "start to ready, fresh (median of {})",
                daemon.fresh_starts_ms.len()
            ),
            "ms",
            median(&daemon.fresh_starts_ms),
            Target::AtMost(500.0),
        ),
        partial(Single::plain(
            format!("start to ready, {n} allocations"),
            "ms",
            daemon.restart_ready_ms,
            Target::AtMost(500.0),
        )),
        Single::plain(
            format!("API ADD p99 filling to {n} ({} callers)", opts.concurrency),
            "ms",
            p.p99_ms,
            Target::None,
        )
        .with_note(format!(
            "median {:.2} ms, {:.1} s for all",
            p.median_ms, p.wall_s
        )),
    ]
}

/// Every figure of the run.
fn document(run: &Run, rows: &[Row], singles: &[Single], load_after: Option<f64>) -> Value {
    let (opts, ways, daemon) = (run.opts, &run.ways, &run.daemon);
    let phase = |v: &[Samples]| -> Value {
        NAMES
            .iter()
            .zip(v)
            .map(|(name, s)| {
                (
                    (*name).to_owned(),
                    json!({"summary": Summary::of(s).json(), "latencies_ms": stats::raw_ms(s)}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let mut phases: serde_json::Map<String, Value> = PHASES
        .iter()
        .zip([&ways.seq_add, &ways.seq_del, &ways.conc_add, &ways.conc_del])
        .map(|(name, v)| ((*name).to_owned(), phase(v)))
        .collect();
    phases.insert(
        "floor_exec_true".into(),
        Summary::of(&run.floors.exec).json(),
    );
    phases.insert(
        "floor_kernel_add".into(),
        Summary::of(&run.floors.kernel_add).json(),
    );
    phases.insert(
        "floor_kernel_del".into(),
        Summary::of(&run.floors.kernel_del).json(),
    );
    phases.insert(
        "daemon".into(),
        json!({
            "fresh_start_to_ready_ms": daemon.fresh_starts_ms,
            "rss_idle_kib": daemon.rss_idle_kib,
            "rss_with_sandboxes_kib": daemon.rss_loaded_kib,
            "restart_to_ready_ms": stats::round3(daemon.restart_ready_ms),
            "rss_after_restart_settled_kib": daemon.rss_after_restart_kib,
            "provision_sandboxes": daemon.provision.json(),
        }),
    );
    phases.insert(
        "trace_overhead".into(),
        run.overhead.as_ref().map_or(Value::Null, Overhead::json),
    );
    let mut machine = machine();
    machine["load_average_1m_before"] = json!(run.load_before);
    machine["load_average_1m_after"] = json!(load_after);
    machine["steal_percent"] = PHASES
        .iter()
        .zip(ways.steal)
        .map(|(p, s)| ((*p).to_owned(), json!(stats::round3(s))))
        .collect();
    json!({
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
            "binary": run.bin,
            "binary_id": pool::binary_id(run.bin),
        },
        "table": report::json(rows, singles),
        "phases": phases,
        "wall_s": stats::round3(run.total.elapsed().as_secs_f64()),
    })
}

/// The ADD latency distributions of the reference and the plugin mode (the two CNI paths),
/// sequential and with concurrent callers.
fn plot(run: &Run) -> String {
    let mut all = Vec::new();
    let sequential = format!("ADD sequential (N={})", run.opts.count);
    let concurrent = format!("ADD, {} callers", run.opts.concurrency);
    for (v, what, dashed) in [
        (&run.ways.seq_add, sequential, false),
        (&run.ways.conc_add, concurrent, true),
    ] {
        for ((name, color), s) in NAMES.iter().zip(["#d62728", "#1f77b4"]).zip(v.iter()) {
            all.push(svg::Series {
                label: format!("{name}, {what}"),
                samples: &s.wall,
                color,
                dashed,
            });
        }
    }
    svg::cdf(
        "CNI ADD latency: reference ptp + host-local vs provisioner plugin mode",
        &all,
    )
}

/// The kernel, the CPU model and count.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    json!({
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpu": cpu,
        "cpus": cpus(),
    })
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[expect(clippy::cast_precision_loss, reason = "CPU counts are small")]
pub fn warn_if_busy(load: Option<f64>) {
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
