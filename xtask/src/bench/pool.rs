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
use super::stats::{round_slowdowns, run_bootstrap};
use super::trace_overhead::TARGET_PERCENT;
use crate::step::detail;

/// One run's tracer section, as `cargo xtask bench` wrote it.
struct Run {
    path: PathBuf,
    binary: BinaryId,
    section: Value,
}

/// What a run's file says of the binary it measured.
#[derive(Clone, Debug, PartialEq, Eq)]
enum BinaryId {
    Known(String),
    /// Written before `binary_id` was.
    Absent,
    /// The bench could not read the binary to identify it.
    Unreadable,
}

/// How the rounds measured: runs pooled must agree on all of it.
const METHOD_KEYS: [&str; 4] = [
    "rounds",
    "adds_per_block_and_way",
    "add_blocks_per_condition",
    "api_add/by_round/trimmed_mean_trim_percent",
];

/// A tracer row, and the JSON pointers (in a run's tracer section) of its per-round figures in
/// each condition.
struct RowSpec {
    metric: &'static str,
    target: Target,
    off_pointer: &'static str,
    on_pointer: &'static str,
}

const ROWS: [RowSpec; 5] = [
    RowSpec {
        metric: "tracing: plugin ADD median, on vs off",
        target: Target::AtMost(TARGET_PERCENT),
        off_pointer: "/plugin_add/by_round/round_medians_ms/off",
        on_pointer: "/plugin_add/by_round/round_medians_ms/on",
    },
    RowSpec {
        metric: "tracing: API ADD median, on vs off",
        target: Target::AtMost(TARGET_PERCENT),
        off_pointer: "/api_add/by_round/round_medians_ms/off",
        on_pointer: "/api_add/by_round/round_medians_ms/on",
    },
    RowSpec {
        metric: "tracing: plugin ADD 10 %-trimmed mean, on vs off",
        target: Target::None,
        off_pointer: "/plugin_add/by_round/round_trimmed_means_ms/off",
        on_pointer: "/plugin_add/by_round/round_trimmed_means_ms/on",
    },
    RowSpec {
        metric: "tracing: API ADD 10 %-trimmed mean, on vs off",
        target: Target::None,
        off_pointer: "/api_add/by_round/round_trimmed_means_ms/off",
        on_pointer: "/api_add/by_round/round_trimmed_means_ms/on",
    },
    RowSpec {
        metric: "tracing: unrelated UDP sendto, CPU per call",
        target: Target::AtMost(TARGET_PERCENT),
        off_pointer: "/sendto_cpu_ns/off",
        on_pointer: "/sendto_cpu_ns/on",
    },
];

/// Every JSON pointer the pool reads in a run's tracer section.
#[cfg(test)]
pub(super) fn figure_pointers() -> impl Iterator<Item = &'static str> {
    ROWS.iter()
        .flat_map(|row| [row.off_pointer, row.on_pointer])
}

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
    for (index, path) in files.iter().enumerate() {
        if files[..index].contains(path) {
            bail!("{} is named twice: a run is pooled once", path.display());
        }
    }
    let runs = files
        .iter()
        .map(|path| load(path))
        .collect::<Result<Vec<_>>>()?;
    check_one_binary(&runs)?;
    check_one_method(&runs)?;
    for (index, run) in runs.iter().enumerate() {
        detail(&format!("run {}: {}", index + 1, run.path.display()));
    }
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
    // A whole run with --no-trace writes the section as null.
    let section = document
        .get("trace_overhead")
        .or_else(|| document.pointer("/phases/trace_overhead"))
        .filter(|section| !section.is_null())
        .cloned()
        .with_context(|| {
            format!(
                "{} holds no tracer rounds (no trace_overhead section: a run with --no-trace?)",
                path.display()
            )
        })?;
    let binary = match document
        .get("binary_id")
        .or_else(|| document.pointer("/options/binary_id"))
    {
        None => BinaryId::Absent,
        Some(Value::String(id)) => BinaryId::Known(id.clone()),
        Some(_) => BinaryId::Unreadable,
    };
    Ok(Run {
        path: path.to_owned(),
        binary,
        section,
    })
}

/// Refuses runs of different binaries; says which runs do not name theirs.
fn check_one_binary(runs: &[Run]) -> Result<()> {
    let mut ids: Vec<&str> = runs
        .iter()
        .filter_map(|r| match &r.binary {
            BinaryId::Known(id) => Some(id.as_str()),
            BinaryId::Absent | BinaryId::Unreadable => None,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > 1 {
        let list: Vec<String> = runs
            .iter()
            .map(|r| {
                let id = match &r.binary {
                    BinaryId::Known(id) => id.as_str(),
                    BinaryId::Absent | BinaryId::Unreadable => "binary unknown",
                };
                format!("{} ({id})", r.path.display())
            })
            .collect();
        bail!(
            "these runs measured different binaries and are not pooled: {}",
            list.join(", ")
        );
    }
    for run in runs {
        let why = match run.binary {
            BinaryId::Known(_) => continue,
            BinaryId::Absent => "written before binary_id was",
            BinaryId::Unreadable => "the bench could not read its binary",
        };
        detail(&format!(
            "note: {} does not name its binary ({why}): pooled as the same binary",
            run.path.display()
        ));
    }
    Ok(())
}

/// Refuses runs whose rounds measured differently (see [`METHOD_KEYS`]).
fn check_one_method(runs: &[Run]) -> Result<()> {
    for key in METHOD_KEYS {
        let pointer = format!("/{key}");
        let values: Vec<Option<&Value>> =
            runs.iter().map(|r| r.section.pointer(&pointer)).collect();
        if values.windows(2).any(|pair| pair[0] != pair[1]) {
            let list: Vec<String> = runs
                .iter()
                .zip(&values)
                .map(|(r, v)| {
                    let value = v.map_or_else(|| "absent".to_owned(), ToString::to_string);
                    format!("{} ({key} {value})", r.path.display())
                })
                .collect();
            bail!(
                "these runs measured their rounds differently and are not pooled: {}",
                list.join(", ")
            );
        }
    }
    Ok(())
}

/// Each round's slowdown in percent for `row`, from one run.
fn run_round_slowdowns(run: &Run, row: &RowSpec) -> Result<Vec<f64>> {
    let figures = |pointer: &str| -> Result<Vec<f64>> {
        run.section
            .pointer(pointer)
            .and_then(Value::as_array)
            .with_context(|| {
                format!(
                    "{}: no {pointer} in its trace_overhead section (written by an older xtask?)",
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
    let (off, on) = (figures(row.off_pointer)?, figures(row.on_pointer)?);
    if off.len() != on.len() {
        bail!(
            "{}: {} rounds off but {} on for {}",
            run.path.display(),
            off.len(),
            on.len(),
            row.metric
        );
    }
    Ok(round_slowdowns(&off, &on))
}

fn pooled_rows(runs: &[Run]) -> Result<Vec<Single>> {
    ROWS.iter()
        .map(|row| {
            let per_run = runs
                .iter()
                .map(|run| run_round_slowdowns(run, row))
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
                note: Some(format!("runs 1, 2, ...: {} %", each.join(", "))),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A tracer section whose plugin ADD rounds are `plugin` (off, on), its trimmed means 1 %
    /// above them, and every other row 4 % slower.
    fn section(plugin: (&[f64], &[f64])) -> Value {
        let rounds = |off: &[f64], on: &[f64]| json!({"off": off, "on": on});
        let trimmed: Vec<f64> = plugin.1.iter().map(|on| on * 1.01).collect();
        let flat = |n: usize, base: f64| (vec![base; n], vec![base * 1.04; n]);
        let (api_off, api_on) = flat(plugin.0.len(), 0.6);
        let (send_off, send_on) = flat(plugin.0.len(), 700.0);
        json!({
            "rounds": plugin.0.len(),
            "plugin_add": {"by_round": {
                "round_medians_ms": rounds(plugin.0, plugin.1),
                "round_trimmed_means_ms": rounds(plugin.0, &trimmed),
            }},
            "api_add": {"by_round": {
                "round_medians_ms": rounds(&api_off, &api_on),
                "round_trimmed_means_ms": rounds(&api_off, &api_on),
                "trimmed_mean_trim_percent": 10,
            }},
            "sendto_cpu_ns": rounds(&send_off, &send_on),
        })
    }

    fn write(dir: &Path, name: &str, document: &Value) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, document.to_string()).expect("write a run's JSON");
        path
    }

    fn row<'a>(rows: &'a [Single], metric: &str) -> &'a Single {
        rows.iter()
            .find(|r| r.metric.starts_with(metric))
            .unwrap_or_else(|| panic!("no row {metric}"))
    }

    #[test]
    fn a_tracer_only_run_and_a_whole_run_of_one_binary_pool_their_rounds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tracer_only = write(
            dir.path(),
            "a.json",
            &json!({"binary_id": "x", "trace_overhead": section((&[1.0, 1.0], &[1.02, 1.02]))}),
        );
        let whole = write(
            dir.path(),
            "b.json",
            &json!({
                "options": {"binary_id": "x"},
                "phases": {"trace_overhead": section((&[1.0, 1.0], &[1.04, 1.04]))},
            }),
        );
        let runs = [load(&tracer_only).expect("a"), load(&whole).expect("b")];
        check_one_binary(&runs).expect("one binary");
        check_one_method(&runs).expect("one method");
        let rows = pooled_rows(&runs).expect("rows");
        let plugin = row(&rows, "tracing: plugin ADD median");
        assert!((plugin.value - 3.0).abs() < 1e-9, "{}", plugin.value);
        let (low, high) = plugin.interval.expect("an interval");
        assert!(low < 3.0 && 3.0 < high, "({low}, {high})");
        assert_eq!(plugin.note.as_deref(), Some("runs 1, 2, ...: +2.0, +4.0 %"));
        let trimmed = row(&rows, "tracing: plugin ADD 10 %-trimmed mean");
        assert!((trimmed.value - 4.03).abs() < 0.01, "{}", trimmed.value);
        for metric in ["tracing: API ADD median", "tracing: unrelated UDP sendto"] {
            assert!((row(&rows, metric).value - 4.0).abs() < 1e-9, "{metric}");
        }
    }

    #[test]
    fn runs_of_different_binaries_or_methods_are_refused_naming_each() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rounds = section((&[1.0], &[1.0]));
        let a = write(
            dir.path(),
            "a.json",
            &json!({"binary_id": "x", "trace_overhead": rounds}),
        );
        let b = write(
            dir.path(),
            "b.json",
            &json!({"binary_id": "y", "trace_overhead": rounds}),
        );
        let runs = [load(&a).expect("a"), load(&b).expect("b")];
        let err = check_one_binary(&runs)
            .expect_err("two binaries")
            .to_string();
        assert!(
            err.contains("a.json (x)") && err.contains("b.json (y)"),
            "{err}"
        );

        let mut other_method = rounds.clone();
        other_method["rounds"] = json!(8);
        let c = write(
            dir.path(),
            "c.json",
            &json!({"trace_overhead": other_method}),
        );
        let runs = [load(&a).expect("a"), load(&c).expect("c")];
        let err = check_one_method(&runs)
            .expect_err("two methods")
            .to_string();
        assert!(
            err.contains("a.json (rounds 1)") && err.contains("c.json (rounds 8)"),
            "{err}"
        );
    }

    #[test]
    fn files_without_tracer_rounds_or_binary_are_told_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let no_trace = write(
            dir.path(),
            "no-trace.json",
            &json!({"options": {"binary_id": "x"}, "phases": {"trace_overhead": null}}),
        );
        let err = load(&no_trace).err().expect("no section").to_string();
        assert!(
            err.contains("no-trace.json") && err.contains("--no-trace"),
            "{err}"
        );

        let rounds = section((&[1.0], &[1.0]));
        let old = write(dir.path(), "old.json", &json!({"trace_overhead": rounds}));
        let unreadable = write(
            dir.path(),
            "unreadable.json",
            &json!({"binary_id": null, "trace_overhead": rounds}),
        );
        assert_eq!(load(&old).expect("old").binary, BinaryId::Absent);
        assert_eq!(
            load(&unreadable).expect("unreadable").binary,
            BinaryId::Unreadable
        );
    }
}
