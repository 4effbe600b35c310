//! What a run reports: the tables (printed, and written to target/bench/latest.md) with the
//! CPU time per call, the ratios provisioner / reference and the targets of
//! docs/benchmarks.md; the JSON document with every figure (raw latencies included); the plot.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use super::daemon_phase::{DaemonResults, mib};
use super::floor::Floors;
use super::machine::{self, DISTURBING_STEAL_PERCENT};
use super::stats::{self, Percentiles, Samples, Summary, round3};
use super::trace_overhead::Results as Overhead;
use super::ways::{ADD, DEL, PHASES, Ways};
use super::{Options, REFERENCE_DIR, SUBNET, pool, step, svg};
use crate::step::{detail, workspace_root};

/// One row comparing the ways: (reference, plugin, api) and their CPU ms per call. Its
/// target: plugin / reference at most `ratio`, and the API's figure at most `api_ms`.
pub struct Row {
    pub metric: String,
    pub unit: &'static str,
    pub values: [f64; 3],
    pub cpu: [f64; 3],
    pub target: Option<(f64, Option<f64>)>,
}

impl Row {
    fn target(&self) -> String {
        match self.target {
            Some((ratio, None)) => format!("plugin <= {ratio} x ref"),
            Some((ratio, Some(ms))) => format!("plugin <= {ratio} x ref; api <= {ms} ms"),
            None => String::new(),
        }
    }

    fn met(&self) -> Option<bool> {
        let (target, api_ms) = self.target?;
        let [reference, plugin, api] = self.values;
        Some(ratio(reference, plugin)? <= target && api_ms.is_none_or(|ms| api <= ms))
    }
}

/// One row about one thing (a floor, the daemon, the tracer), its target at most `target`.
#[derive(Default)]
pub struct Single {
    pub metric: String,
    pub unit: &'static str,
    pub value: f64,
    pub cpu_ms: Option<f64>,
    pub target: Option<f64>,
    /// The 90 % interval of `value` when it was estimated from rounds that disagree: the
    /// target is met only when all of it is, missed only when none of it is.
    pub interval: Option<(f64, f64)>,
    pub note: Option<String>,
}

impl Single {
    pub fn new(metric: String, unit: &'static str, value: f64) -> Self {
        Self {
            metric,
            unit,
            value,
            ..Self::default()
        }
    }

    pub fn at_most(mut self, target: f64) -> Self {
        self.target = Some(target);
        self
    }

    pub fn note(mut self, note: String) -> Self {
        self.note = Some(note);
        self
    }

    /// Whether it met its target; `None` without a target, or when its interval holds values
    /// on both sides of it.
    fn met(&self) -> Option<bool> {
        let (low, high) = self.interval.unwrap_or((self.value, self.value));
        let target = self.target?;
        (high <= target || low > target).then_some(high <= target)
    }
}

fn ratio(reference: f64, ours: f64) -> Option<f64> {
    (reference > 0.0).then(|| ours / reference)
}

fn word(met: Option<bool>, target: bool) -> &'static str {
    match (met, target) {
        (Some(true), _) => "met",
        (Some(false), _) => "MISSED",
        (None, true) => "undecided",
        (None, false) => "",
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// Both tables in markdown: wall figures with the CPU ms per call in parentheses.
pub fn markdown(rows: &[Row], singles: &[Single]) -> String {
    let mut out = String::new();
    if !rows.is_empty() {
        out.push_str("| wall (CPU ms/call) | reference | plugin | api | plugin / ref | api / ref ");
        out.push_str("| target | |\n|---|---|---|---|---|---|---|---|\n");
    }
    for r in rows {
        let _ = write!(out, "| {} ({}) |", r.metric, r.unit);
        for (v, c) in r.values.iter().zip(r.cpu) {
            let _ = write!(out, " {v:.2} ({c:.2}) |");
        }
        let [reference, plugin, api] = r.values;
        let ratios = [ratio(reference, plugin), ratio(reference, api)].map(num);
        let (target, met) = (r.target(), word(r.met(), false));
        let _ = writeln!(out, " {} | {} | {target} | {met} |", ratios[0], ratios[1]);
    }
    out.push_str("\n| | value [90 % interval] | CPU ms | target | |\n|---|---|---|---|---|\n");
    for s in singles {
        let interval = s.interval.map(|(lo, hi)| format!(" [{lo:.1}, {hi:.1}]"));
        let value = format!("{:.2}{} {}", s.value, interval.unwrap_or_default(), s.unit);
        let note = s.note.as_ref().map(|n| format!(" ({n})"));
        let target = s.target.map(|t| format!("<= {t}")).unwrap_or_default();
        let (cpu, met) = (num(s.cpu_ms), word(s.met(), s.target.is_some()));
        let cells = format!("{} | {value} | {cpu} | {target}", s.metric);
        let _ = writeln!(out, "| {cells} | {met}{} |", note.unwrap_or_default());
    }
    out
}

/// Everything one run measured.
pub struct Run<'a> {
    pub opts: &'a Options,
    pub bin: &'a Path,
    pub floors: Floors,
    pub ways: Ways,
    pub daemon: DaemonResults,
    pub overhead: Option<Overhead>,
    /// When the run started, and the load average then.
    pub started: (Instant, Option<f64>),
}

const NAMES: [&str; 3] = ["reference", "plugin", "api"];

/// Prints the tables and writes the JSON, the markdown and the plot.
pub fn write(run: &Run) -> Result<()> {
    let load_after = machine::load_average();
    machine::warn_if_busy(load_after);
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
    let table = markdown(&rows, &singles);
    let seconds = run.started.0.elapsed().as_secs_f64();
    step(format!("results ({seconds:.0} s in all)"));
    println!("\n{table}");
    let json_path = path(run.opts, "latest.json")?;
    let document = document(run, &table, load_after);
    std::fs::write(&json_path, serde_json::to_vec_pretty(&document)?)?;
    let (md, plot) = (
        json_path.with_extension("md"),
        json_path.with_extension("svg"),
    );
    std::fs::write(&md, table)?;
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
    // Phase 4: the sequential ADDs and DELs together.
    let of = |phase: usize, way: usize| match phase {
        4 => {
            let mut both = ways.phases[0][way].clone();
            both.extend(ways.phases[1][way].clone());
            Summary::of(&both)
        }
        _ => Summary::of(&ways.phases[phase][way]),
    };
    let (n, c, m) = (opts.count, opts.concurrency, opts.concurrent_count);
    let (api, fifth, none) = (Some((0.2, Some(1.0))), Some((0.2, None)), None);
    let (median, p99, wall) = (0, 1, 2);
    let plan = [
        (0, median, api),
        (0, p99, fifth),
        (1, median, api),
        (1, p99, none),
        (4, wall, Some((0.1, None))),
        (2, wall, fifth),
        (2, p99, fifth),
        (2, median, none),
    ];
    let row = |(phase, stat, target): (usize, usize, Option<(f64, Option<f64>)>)| {
        let name = ["median", "p99", "wall"][stat];
        let metric = match phase {
            0 | 1 => format!("{} {name}, N={n} sequential", [ADD, DEL][phase]),
            4 => format!("{n} ADD + DEL, total wall"),
            _ => format!("{c} callers x {m} ADDs, {name}"),
        };
        let summaries = [0, 1, 2].map(|way| of(phase, way));
        let values = summaries.map(|s| [s.median_ms, s.p99_ms, s.wall_s][stat]);
        let (unit, cpu) = (["ms", "ms", "s"][stat], summaries.map(|s| s.cpu_ms));
        Row {
            metric,
            unit,
            values,
            cpu,
            target,
        }
    };
    plan.into_iter().map(row).collect()
}

/// The floors' and the daemon's rows.
fn singles(opts: &Options, floors: &Floors, d: &DaemonResults) -> Vec<Single> {
    let floor = |metric: &str, s: &Samples| {
        let s = Summary::of(s);
        let metric = format!("floor: {metric} (median; p99 {:.2} ms)", s.p99_ms);
        Single {
            cpu_ms: Some(s.cpu_ms),
            ..Single::new(metric, "ms", s.median_ms)
        }
    };
    let n = opts.sandboxes;
    let for_1000 = format!("measured with {n} sandboxes; the target is for 1000");
    let note = |s: Single| {
        if n < 1000 {
            s.note(for_1000.clone())
        } else {
            s
        }
    };
    let rss = |metric: String, kib| note(Single::new(metric, "MiB", mib(kib)).at_most(30.0));
    let ready = |metric: String, ms| Single::new(metric, "ms", ms).at_most(500.0);
    let fresh = format!("start to ready, fresh (median of {})", d.fresh_starts.len());
    let restart = format!("daemon RSS 2 s after a restart with {n} allocations");
    vec![
        floor("spawn + exec of /bin/true", &floors.exec),
        floor("kernel, one ADD's netlink requests", &floors.kernel_add),
        Single::new("daemon RSS, no sandbox".into(), "MiB", mib(d.rss_idle_kib)),
        rss(format!("daemon RSS, {n} sandboxes"), d.rss_loaded_kib),
        rss(restart, d.rss_after_restart_kib),
        ready(fresh, stats::median_ms(&d.fresh_starts)),
        note(ready(
            format!("start to ready, {n} allocations"),
            ms(&d.restart_ready),
        )),
    ]
}

/// Every figure of the run.
fn document(run: &Run, table: &str, load_after: Option<f64>) -> Value {
    let (opts, ways, daemon, floors) = (run.opts, &run.ways, &run.daemon, &run.floors);
    let mut phases = json!({
        "floor_exec_true": Summary::of(&floors.exec).json(),
        "floor_kernel_add": Summary::of(&floors.kernel_add).json(),
        "daemon": {
            "fresh_start_to_ready_ms": daemon.fresh_starts.iter().map(ms).collect::<Vec<_>>(),
            "rss_idle_kib": daemon.rss_idle_kib,
            "rss_with_sandboxes_kib": daemon.rss_loaded_kib,
            "restart_to_ready_ms": ms(&daemon.restart_ready),
            "rss_after_restart_settled_kib": daemon.rss_after_restart_kib,
            "provision_sandboxes": daemon.provision.as_ref().map(Summary::json),
        },
        "trace_overhead": run.overhead.as_ref().map(Overhead::json),
    });
    let mut machine = machine::describe();
    for (i, &phase) in PHASES.iter().enumerate() {
        for (name, s) in NAMES.iter().zip(&ways.phases[i]) {
            let figures =
                json!({"summary": Summary::of(s).json(), "latencies_ms": stats::raw_ms(s)});
            phases[phase][*name] = figures;
        }
        machine["steal_percent"][phase] = json!(round3(ways.steal[i]));
    }
    machine["load_average_1m_before"] = json!(run.started.1);
    machine["load_average_1m_after"] = json!(load_after);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    json!({
        "generated_at_unix": now.map_or(0, |d| d.as_secs()),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "machine": machine,
        "options": {
            "count": opts.count, "concurrency": opts.concurrency,
            "concurrent_count": opts.concurrent_count, "sandboxes": opts.sandboxes,
            "block": opts.block, "rounds": opts.rounds, "daemon_kernel_watch": !opts.no_trace,
            "subnet": SUBNET, "reference": REFERENCE_DIR,
            "binary": run.bin, "binary_id": pool::binary_id(run.bin),
        },
        "table_md": table,
        "phases": phases,
        "wall_s": round3(run.started.0.elapsed().as_secs_f64()),
    })
}

fn ms(d: &Duration) -> f64 {
    round3(d.as_secs_f64() * 1e3)
}

/// The ADD latency distributions of the reference and the plugin mode (the two CNI paths),
/// sequential and with concurrent callers.
fn plot(run: &Run) -> String {
    let (n, c) = (run.opts.count, run.opts.concurrency);
    let mut all = Vec::new();
    for (phase, what) in [
        (0, format!("sequential (N={n})")),
        (2, format!("{c} callers")),
    ] {
        let ways = NAMES.iter().zip(["#d62728", "#1f77b4"]);
        for ((name, color), s) in ways.zip(&run.ways.phases[phase]) {
            let (label, points) = (
                format!("{name}, ADD {what}"),
                Percentiles::of(&s.wall).cdf_ms(),
            );
            all.push(svg::Series {
                label,
                points,
                color,
                dashed: phase > 0,
            });
        }
    }
    svg::cdf(
        "CNI ADD latency: reference ptp + host-local vs provisioner plugin mode",
        &all,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_targets_are_ours_over_reference() {
        let row = |plugin, api| Row {
            metric: "ADD median".into(),
            unit: "ms",
            values: [10.0, plugin, api],
            cpu: [4.0, 0.5, 0.4],
            target: Some((0.2, Some(1.0))),
        };
        assert_eq!(row(2.0, 0.9).met(), Some(true));
        assert_eq!(row(2.5, 0.9).met(), Some(false));
        assert_eq!(row(1.0, 1.5).met(), Some(false));
        let text = markdown(&[row(2.0, 0.9)], &[]);
        let cells = "| 10.00 (4.00) | 2.00 (0.50) | 0.90 (0.40) | 0.20 | 0.09 |";
        assert!(text.contains(cells) && text.contains("| met |"), "{text}");
    }

    #[test]
    fn a_target_is_judged_on_the_whole_interval() {
        let single = |value, interval| Single {
            interval,
            ..Single::new("tracing".into(), "% slower", value).at_most(5.0)
        };
        assert_eq!(single(3.0, None).met(), Some(true));
        assert_eq!(single(6.0, None).met(), Some(false));
        assert_eq!(single(3.0, Some((1.0, 4.5))).met(), Some(true));
        assert_eq!(single(7.0, Some((5.5, 9.0))).met(), Some(false));
        assert_eq!(Single::new("no target".into(), "ms", 3.0).met(), None);
        let straddling = single(3.0, Some((-2.0, 12.0)));
        assert_eq!(straddling.met(), None);
        let text = markdown(&[], &[straddling]);
        assert!(text.contains("3.00 [-2.0, 12.0] % slower") && text.contains("undecided"));
    }
}
