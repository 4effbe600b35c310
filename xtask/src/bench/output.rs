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
    let (median, p99, wall): (Pick, Pick, Pick) = (|s| s.median_ms, |s| s.p99_ms, |s| s.wall_s);
    let ratio = |plugin| Target::Ratio {
        plugin,
        api_ms: None,
    };
    let with_api = Target::Ratio {
        plugin: 0.2,
        api_ms: Some(1.0),
    };
    let (n, c, m) = (opts.count, opts.concurrency, opts.concurrent_count);
    let rows: [(String, &str, &[Summary], Pick, Target); 8] = [
        (
            format!("ADD median, N={n} sequential"),
            "ms",
            &sa,
            median,
            with_api,
        ),
        (format!("ADD p99, N={n}"), "ms", &sa, p99, ratio(0.2)),
        (
            format!("DEL median, N={n} sequential"),
            "ms",
            &sd,
            median,
            with_api,
        ),
        (format!("DEL p99, N={n}"), "ms", &sd, p99, Target::None),
        (
            format!("{n} ADD + DEL, total"),
            "s",
            &total,
            wall,
            ratio(0.1),
        ),
        (
            format!("{c} callers, {m} ADDs, wall"),
            "s",
            &ca,
            wall,
            ratio(0.2),
        ),
        (format!("{c} callers, ADD p99"), "ms", &ca, p99, ratio(0.2)),
        (
            format!("{c} callers, ADD median"),
            "ms",
            &ca,
            median,
            Target::None,
        ),
    ];
    rows.into_iter()
        .map(|(metric, unit, s, pick, target)| Row {
            metric,
            unit,
            values: [0, 1, 2].map(|i| s.get(i).map(pick)),
            cpu: [0, 1, 2].map(|i| s.get(i).map(|x| x.cpu_ms)),
            target,
        })
        .collect()
}

type Pick = fn(&Summary) -> f64;

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
    let (n, p) = (opts.sandboxes, &daemon.provision);
    let starts = daemon.fresh_starts_ms.len();
    let mut out = vec![
        floor("spawn + exec of /bin/true", &floors.exec),
        floor("kernel, one ADD's netlink requests", &floors.kernel_add),
        floor("kernel, one DEL's netlink requests", &floors.kernel_del),
    ];
    let at_most = Target::AtMost;
    for (metric, unit, value, target, partial) in [
        (
            "daemon RSS, no sandbox".into(),
            "MiB",
            mib(daemon.rss_idle_kib),
            Target::None,
            false,
        ),
        (
            format!("daemon RSS, {n} sandboxes"),
            "MiB",
            mib(daemon.rss_loaded_kib),
            at_most(30.0),
            true,
        ),
        (
            format!("daemon RSS 2 s after a restart with {n} allocations"),
            "MiB",
            mib(daemon.rss_after_restart_kib),
            at_most(30.0),
            true,
        ),
        (
            format!("start to ready, fresh (median of {starts})"),
            "ms",
            median(&daemon.fresh_starts_ms),
            at_most(500.0),
            false,
        ),
        (
            format!("start to ready, {n} allocations"),
            "ms",
            daemon.restart_ready_ms,
            at_most(500.0),
            true,
        ),
    ] {
        let single = Single::plain(metric, unit, value, target);
        out.push(if partial && n < 1000 {
            single.with_note(format!(
                "measured with {n} sandboxes; the target is for 1000"
            ))
        } else {
            single
        });
    }
    let metric = format!("API ADD p99 filling to {n} ({} callers)", opts.concurrency);
    let note = format!("median {:.2} ms, {:.1} s for all", p.median_ms, p.wall_s);
    out.push(Single::plain(metric, "ms", p.p99_ms, Target::None).with_note(note));
    out
}

/// Every figure of the run.
fn document(run: &Run, rows: &[Row], singles: &[Single], load_after: Option<f64>) -> Value {
    let (opts, ways, daemon, floors) = (run.opts, &run.ways, &run.daemon, &run.floors);
    let phase = |v: &[Samples]| -> Value {
        let by_way = NAMES.iter().zip(v).map(|(name, s)| {
            let figures =
                json!({"summary": Summary::of(s).json(), "latencies_ms": stats::raw_ms(s)});
            ((*name).to_owned(), figures)
        });
        by_way.collect::<serde_json::Map<_, _>>().into()
    };
    let steal: serde_json::Map<String, Value> = PHASES
        .iter()
        .map(|p| (*p).to_owned())
        .zip(ways.steal.map(|s| json!(stats::round3(s))))
        .collect();
    let mut machine = machine();
    machine["load_average_1m_before"] = json!(run.load_before);
    machine["load_average_1m_after"] = json!(load_after);
    machine["steal_percent"] = steal.into();
    json!({
        "generated_at_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": machine,
        "options": {
            "count": opts.count, "concurrency": opts.concurrency, "concurrent_count": opts.concurrent_count,
            "sandboxes": opts.sandboxes, "block": opts.block, "daemon_kernel_watch": !opts.no_trace,
            "subnet": SUBNET, "reference": REFERENCE_DIR, "binary": run.bin, "binary_id": pool::binary_id(run.bin),
        },
        "table": report::json(rows, singles),
        "phases": {
            "sequential_add": phase(&ways.seq_add),
            "sequential_del": phase(&ways.seq_del),
            "concurrent_add": phase(&ways.conc_add),
            "concurrent_del": phase(&ways.conc_del),
            "floor_exec_true": Summary::of(&floors.exec).json(),
            "floor_kernel_add": Summary::of(&floors.kernel_add).json(),
            "floor_kernel_del": Summary::of(&floors.kernel_del).json(),
            "daemon": {
                "fresh_start_to_ready_ms": daemon.fresh_starts_ms,
                "rss_idle_kib": daemon.rss_idle_kib,
                "rss_with_sandboxes_kib": daemon.rss_loaded_kib,
                "restart_to_ready_ms": stats::round3(daemon.restart_ready_ms),
                "rss_after_restart_settled_kib": daemon.rss_after_restart_kib,
                "provision_sandboxes": daemon.provision.json(),
            },
            "trace_overhead": run.overhead.as_ref().map(Overhead::json),
        },
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
