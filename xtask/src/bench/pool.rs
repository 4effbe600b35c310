//! `cargo xtask bench-pool FILE...`: the tracer's rows over several runs of the bench.
//!
//! One run's interval comes from resampling its rounds. Whole runs of one binary disagree by
//! more than that (docs/benchmarks.md, stop 35): what a run shares across its rounds (the
//! host's load in those minutes, what ran before it) does not cancel within the run. Pooling
//! the rounds of several runs, and resampling runs before rounds ([`run_bootstrap`]), gives a
//! figure whose interval covers that too.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::report::{self, Single, Target};
use super::stats::{percent_slower, run_bootstrap};
use super::trace_overhead::TARGET_PERCENT;
use crate::step::detail;

/// One run's tracer section, as `cargo xtask bench` wrote it.
struct Run {
    path: PathBuf,
    binary_id: Option<String>,
    section: Value,
}

/// A tracer row, and where a run's section holds its per-round figures in each condition.
struct RowSpec {
    metric: &'static str,
    target: Target,
    off: &'static str,
    on: &'static str,
}

const ROWS: [RowSpec; 5] = [
    RowSpec {
        metric: "tracing: plugin ADD median, on vs off",
        target: Target::AtMost(TARGET_PERCENT),
        off: "/plugin_add/by_round/round_medians_ms/off",
        on: "/plugin_add/by_round/round_medians_ms/on",
    },
    RowSpec {
        metric: "tracing: API ADD median, on vs off",
        target: Target::AtMost(TARGET_PERCENT),
        off: "/api_add/by_round/round_medians_ms/off",
        on: "/api_add/by_round/round_medians_ms/on",
    },
    RowSpec {
        metric: "tracing: plugin ADD trimmed mean, on vs off",
        target: Target::None,
        off: "/plugin_add/by_round/round_trimmed_means_ms/off",
        on: "/plugin_add/by_round/round_trimmed_means_ms/on",
    },
    RowSpec {
        metric: "tracing: API ADD trimmed mean, on vs off",
        target: Target::None,
        off: "/api_add/by_round/round_trimmed_means_ms/off",
        on: "/api_add/by_round/round_trimmed_means_ms/on",
    },
    RowSpec {
        metric: "tracing: unrelated UDP sendto, CPU per call",
        target: Target::AtMost(TARGET_PERCENT),
        off: "/sendto_cpu_ns/off",
        on: "/sendto_cpu_ns/on",
    },
];

/// Identifies the binary a run measured (FNV-1a of its bytes), so that only runs of one
/// binary are pooled.
pub fn binary_id(bin: &Path) -> Option<String> {
    let bytes = std::fs::read(bin).ok()?;
    let hash = provisioner_common::fnv1a(provisioner_common::FNV_OFFSET, &bytes);
    Some(format!("fnv1a64:{hash:016x}"))
}

/// Prints the tracer's rows pooled over the runs written to `files`.
pub fn run(files: &[PathBuf]) -> Result<()> {
    if files.len() < 2 {
        bail!(
            "pooling needs the JSON files of at least two bench runs, got {}",
            files.len()
        );
    }
    let runs = files
        .iter()
        .map(|path| load(path))
        .collect::<Result<Vec<_>>>()?;
    check_one_binary(&runs)?;
    let singles = pooled_rows(&runs)?;
    println!();
    println!("{}", report::table(&[], &singles));
    Ok(())
}

fn load(path: &Path) -> Result<Run> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading bench results {}", path.display()))?;
    let document: Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing bench results {}", path.display()))?;
    let section = document
        .get("trace_overhead")
        .or_else(|| document.pointer("/phases/trace_overhead"))
        .cloned()
        .with_context(|| {
            format!(
                "{} holds no tracer rounds (no trace_overhead section: a run with --no-trace?)",
                path.display()
            )
        })?;
    let binary_id = document
        .get("binary_id")
        .or_else(|| document.pointer("/options/binary_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(Run {
        path: path.to_owned(),
        binary_id,
        section,
    })
}

/// Refuses runs of different binaries; says which runs do not name theirs.
fn check_one_binary(runs: &[Run]) -> Result<()> {
    let mut ids: Vec<&str> = runs.iter().filter_map(|r| r.binary_id.as_deref()).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > 1 {
        let list: Vec<String> = runs
            .iter()
            .map(|r| {
                format!(
                    "{} ({})",
                    r.path.display(),
                    r.binary_id.as_deref().unwrap_or("binary unknown")
                )
            })
            .collect();
        bail!(
            "these runs measured different binaries and are not pooled: {}",
            list.join(", ")
        );
    }
    for run in runs.iter().filter(|r| r.binary_id.is_none()) {
        detail(&format!(
            "note: {} does not name its binary (written before binary_id was): pooled as the \
             same binary",
            run.path.display()
        ));
    }
    Ok(())
}

/// Each round's slowdown in percent for `row`, from one run.
fn round_slowdowns(run: &Run, row: &RowSpec) -> Result<Vec<f64>> {
    let figures = |pointer: &str| -> Result<Vec<f64>> {
        run.section
            .pointer(pointer)
            .and_then(Value::as_array)
            .with_context(|| {
                format!(
                    "{}: no {pointer} in its trace_overhead section (written before per-round \
                     figures were)",
                    run.path.display()
                )
            })?
            .iter()
            .map(|v| {
                v.as_f64()
                    .with_context(|| format!("{}: {pointer} holds {v}", run.path.display()))
            })
            .collect()
    };
    let (off, on) = (figures(row.off)?, figures(row.on)?);
    if off.len() != on.len() {
        bail!(
            "{}: {} rounds off but {} on for {}",
            run.path.display(),
            off.len(),
            on.len(),
            row.metric
        );
    }
    Ok(off
        .iter()
        .zip(&on)
        .map(|(&off, &on)| percent_slower(off, on))
        .collect())
}

fn pooled_rows(runs: &[Run]) -> Result<Vec<Single>> {
    ROWS.iter()
        .map(|row| {
            let per_run = runs
                .iter()
                .map(|run| round_slowdowns(run, row))
                .collect::<Result<Vec<_>>>()?;
            let rounds: usize = per_run.iter().map(Vec::len).sum();
            let (value, interval) = run_bootstrap(&per_run);
            let each: Vec<String> = per_run
                .iter()
                .map(|r| format!("{:+.1}", super::median(r)))
                .collect();
            Ok(Single {
                metric: format!("{} ({} runs, {rounds} rounds)", row.metric, runs.len()),
                unit: "% slower",
                value,
                cpu_ms: None,
                target: row.target,
                interval: Some(interval),
                note: Some(format!("each run: {} %", each.join(", "))),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run_file(dir: &Path, name: &str, id: &str, plugin: (&[f64], &[f64])) -> PathBuf {
        let rounds = |off: &[f64], on: &[f64]| json!({"off": off, "on": on});
        let by_round = |off: &[f64], on: &[f64]| json!({"round_medians_ms": rounds(off, on), "round_trimmed_means_ms": rounds(off, on)});
        let document = json!({
            "binary_id": id,
            "trace_overhead": {
                "plugin_add": {"by_round": by_round(plugin.0, plugin.1)},
                "api_add": {"by_round": by_round(&[1.0, 1.0], &[1.0, 1.0])},
                "sendto_cpu_ns": rounds(&[700.0, 700.0], &[728.0, 728.0]),
            }
        });
        let path = dir.join(name);
        std::fs::write(&path, document.to_string()).expect("write a run's JSON");
        path
    }

    #[test]
    fn runs_of_one_binary_pool_their_rounds_and_each_run_is_shown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = run_file(dir.path(), "a.json", "x", (&[1.0, 1.0], &[1.02, 1.02]));
        let b = run_file(dir.path(), "b.json", "x", (&[1.0, 1.0], &[1.04, 1.04]));
        let runs = [load(&a).expect("load a"), load(&b).expect("load b")];
        check_one_binary(&runs).expect("one binary");
        let rows = pooled_rows(&runs).expect("rows");
        let plugin = &rows[0];
        assert!(
            (plugin.value - 3.0).abs() < 1e-9,
            "pooled median {}",
            plugin.value
        );
        let (low, high) = plugin.interval.expect("an interval");
        assert!(low >= 2.0 - 1e-9 && high <= 4.0 + 1e-9 && low < high);
        assert_eq!(plugin.note.as_deref(), Some("each run: +2.0, +4.0 %"));
        let sendto = &rows[4];
        assert!((sendto.value - 4.0).abs() < 1e-9);
    }

    #[test]
    fn runs_of_different_binaries_are_refused_naming_both() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = run_file(dir.path(), "a.json", "x", (&[1.0], &[1.0]));
        let b = run_file(dir.path(), "b.json", "y", (&[1.0], &[1.0]));
        let runs = [load(&a).expect("load a"), load(&b).expect("load b")];
        let err = check_one_binary(&runs)
            .expect_err("two binaries")
            .to_string();
        assert!(
            err.contains("a.json (x)") && err.contains("b.json (y)"),
            "{err}"
        );
    }

    #[test]
    fn a_file_without_tracer_rounds_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("full.json");
        std::fs::write(&path, json!({"phases": {}}).to_string()).expect("write");
        let err = load(&path).err().expect("no section").to_string();
        assert!(
            err.contains("full.json") && err.contains("trace_overhead"),
            "{err}"
        );
    }
}
