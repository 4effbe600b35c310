//! The tracer's rows from the per-round figures of one or more runs (their JSON tracer
//! sections), and `cargo xtask bench-pool FILE...`, which pools several runs' files.
//!
//! One run's interval comes from resampling its rounds. Whole runs of one binary disagree by
//! more than that: what a run shares across its rounds (the host's load in those minutes,
//! what ran before it) does not cancel within the run. Pooling the rounds of several runs and
//! resampling runs before rounds (`stats::run_bootstrap`) gives an interval that covers it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::report::{self, Single};
use super::stats::{median, round_slowdowns, run_bootstrap};
use super::trace_overhead::{OLDER_BACKENDS_TARGET_PERCENT, TARGET_PERCENT};
use crate::step::detail;

/// A tracer row: its metric, the unit of its figures, the JSON pointer (in a run's tracer
/// section) of the object holding its per-round figures `off` and `on`, and its target.
const ROWS: [(&str, &str, &str, f64); 4] = [
    (
        "tracing: plugin ADD median, on vs off",
        "ms",
        "/plugin_add/round_medians_ms",
        TARGET_PERCENT,
    ),
    (
        "tracing: API ADD median, on vs off",
        "ms",
        "/api_add/round_medians_ms",
        TARGET_PERCENT,
    ),
    (
        "tracing: unrelated UDP sendto, CPU per call",
        "ns",
        "/sendto_cpu_ns",
        TARGET_PERCENT,
    ),
    (
        "tracing on older kernels' backends (syscall tracepoints): unrelated UDP sendto, CPU per call",
        "ns",
        "/sendto_cpu_ns_older_kernels_backends",
        OLDER_BACKENDS_TARGET_PERCENT,
    ),
];

/// How the rounds measured: runs pooled must agree on all of it.
const METHOD_KEYS: [&str; 4] = [
    "/rounds",
    "/adds_per_block_and_way",
    "/add_blocks_per_condition",
    "/sends_per_measurement",
];

/// Identifies the binary a run measured (FNV-1a of its bytes), so that only runs of one
/// binary are pooled.
pub fn binary_id(bin: &Path) -> Option<String> {
    let bytes = std::fs::read(bin).ok()?;
    let hash = provisioner_common::fnv1a(provisioner_common::FNV_OFFSET, &bytes);
    Some(format!("fnv1a64:{hash:016x}"))
}

/// A run's file: its name, the binary it measured (when it says), its tracer section.
type Run = (String, Option<Value>, Value);

/// Prints the tracer's rows pooled over the runs written to `files`: refuses runs of different
/// binaries, measured differently, or holding the same rounds.
pub fn run(files: &[PathBuf]) -> Result<()> {
    let runs: Vec<Run> = files.iter().map(|p| load(p)).collect::<Result<_>>()?;
    let binary = |(_, binary, _): &Run| binary.clone();
    agree(&runs, "measured different binaries", binary)?;
    for key in METHOD_KEYS {
        let method = |(_, _, section): &Run| section.pointer(key).cloned();
        agree(&runs, "measured their rounds differently", method)?;
    }
    for (index, (name, _, section)) in runs.iter().enumerate() {
        if let Some((twin, _, _)) = runs[..index].iter().find(|(_, _, s)| s == section) {
            bail!("{name} holds the same rounds as {twin}: a run is pooled once");
        }
        detail(&format!("run {}: {name}", index + 1));
    }
    let sections: Vec<(String, Value)> = runs.into_iter().map(|(n, _, s)| (n, s)).collect();
    println!("\n{}", report::markdown(&[], &rows(&sections)?));
    Ok(())
}

fn load(path: &Path) -> Result<Run> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {name}"))?;
    let document: Value = serde_json::from_str(&text).with_context(|| format!("parsing {name}"))?;
    // A whole run writes it under `phases` (null with --no-trace), a tracer-only run at the top.
    let section = document
        .get("trace_overhead")
        .or_else(|| document.pointer("/phases/trace_overhead"));
    let section = section.filter(|section| !section.is_null()).cloned();
    let section = section
        .with_context(|| format!("{name} holds no tracer rounds (a run with --no-trace?)"))?;
    let binary = document
        .get("binary_id")
        .or_else(|| document.pointer("/options/binary_id"));
    Ok((name, binary.cloned(), section))
}

/// Refuses runs that differ in what `key` reads, naming each run's.
fn agree(runs: &[Run], what: &str, key: impl Fn(&Run) -> Option<Value>) -> Result<()> {
    let values: Vec<Option<Value>> = runs.iter().map(&key).collect();
    if values.windows(2).all(|pair| pair[0] == pair[1]) {
        return Ok(());
    }
    let each = runs.iter().zip(&values).map(|((name, _, _), v)| {
        format!(
            "{name} ({})",
            v.as_ref().map_or("absent".into(), Value::to_string)
        )
    });
    bail!(
        "these runs {what} and are not pooled: {}",
        each.collect::<Vec<_>>().join(", ")
    )
}

/// The per-round figures at `pointer` of one section.
fn figures(name: &str, section: &Value, pointer: &str) -> Result<Vec<f64>> {
    let values = section.pointer(pointer).and_then(Value::as_array);
    let values = values.with_context(|| format!("{name}: no {pointer} in its tracer section"))?;
    let number = |v: &Value| {
        v.as_f64()
            .with_context(|| format!("{name}: {pointer} holds {v}"))
    };
    values.iter().map(number).collect()
}

/// The tracer's rows over the runs' tracer sections (named): each the median of every round's
/// slowdown, with its 90 % interval ([`run_bootstrap`]).
pub fn rows(sections: &[(String, Value)]) -> Result<Vec<Single>> {
    ROWS.iter()
        .map(|&(metric, unit, pointer, target)| row(sections, metric, unit, pointer, target))
        .collect()
}

fn row(
    sections: &[(String, Value)],
    metric: &str,
    unit: &str,
    pointer: &str,
    target: f64,
) -> Result<Single> {
    let (mut per_run, mut off_all, mut on_all) = (Vec::new(), Vec::new(), Vec::new());
    for (name, section) in sections {
        let off = figures(name, section, &format!("{pointer}/off"))?;
        let on = figures(name, section, &format!("{pointer}/on"))?;
        if off.len() != on.len() {
            bail!(
                "{name}: {} rounds off but {} on for {metric}",
                off.len(),
                on.len()
            );
        }
        per_run.push(round_slowdowns(&off, &on));
        off_all.extend(off);
        on_all.extend(on);
    }
    let rounds: usize = per_run.iter().map(Vec::len).sum();
    let (value, interval) = run_bootstrap(&per_run);
    let (off, on) = (median(&off_all), median(&on_all));
    let mut note = format!("round medians off {off:.3}, on {on:.3} {unit}");
    if sections.len() > 1 {
        let each: Vec<String> = per_run
            .iter()
            .map(|r| format!("{:+.1}", median(r)))
            .collect();
        note.push_str(&format!("; runs 1, 2, ...: {} %", each.join(", ")));
    }
    let metric = format!("{metric} ({} run(s), {rounds} rounds)", sections.len());
    let single = Single::new(metric, "% slower", value).at_most(target);
    let interval = Some(interval);
    Ok(Single {
        interval,
        ..single.note(note)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A tracer section whose plugin ADD rounds are (`off`, `on`), every other row 4 % slower.
    fn section(off: &[f64], on: &[f64]) -> Value {
        let flat =
            |base: f64| json!({"off": vec![base; off.len()], "on": vec![base * 1.04; off.len()]});
        json!({
            "rounds": off.len(),
            "plugin_add": {"round_medians_ms": {"off": off, "on": on}},
            "api_add": {"round_medians_ms": flat(0.6)},
            "sendto_cpu_ns": flat(700.0),
            "sendto_cpu_ns_older_kernels_backends": flat(700.0),
        })
    }

    fn write(dir: &Path, name: &str, document: &Value) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, document.to_string()).expect("write a run's JSON");
        path
    }

    #[test]
    fn a_tracer_only_run_and_a_whole_run_of_one_binary_pool_their_rounds() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let a = json!({"binary_id": "x", "trace_overhead": section(&[1.0, 1.0], &[1.02, 1.02])});
        let b = json!({
            "options": {"binary_id": "x"},
            "phases": {"trace_overhead": section(&[1.0, 1.0], &[1.04, 1.04])},
        });
        let paths = [("a.json", a), ("b.json", b)].map(|(n, d)| write(dir.path(), n, &d));
        run(&paths)?;
        let load_section = |p: &PathBuf| load(p).map(|(n, _, s)| (n, s));
        let rows = rows(&paths.iter().map(load_section).collect::<Result<Vec<_>>>()?)?;
        let (low, high) = rows[0].interval.context("an interval")?;
        assert!((rows[0].value - 3.0).abs() < 1e-9, "{}", rows[0].value);
        assert!(low < 3.0 && 3.0 < high, "{low} {high}");
        let note = rows[0].note.as_deref().unwrap_or_default();
        assert!(note.ends_with("runs 1, 2, ...: +2.0, +4.0 %"), "{note}");
        assert!(rows[1..].iter().all(|r| (r.value - 4.0).abs() < 1e-9));
        Ok(())
    }

    #[test]
    fn runs_of_different_binaries_or_methods_or_without_rounds_are_refused() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let (rounds, mut other) = (section(&[1.0], &[1.0]), section(&[1.0], &[1.0]));
        other["rounds"] = json!(8);
        let of = |binary: &str, s: &Value| json!({"binary_id": binary, "trace_overhead": s});
        let a = write(dir.path(), "a.json", &of("x", &rounds));
        let none = json!({"phases": {"trace_overhead": null}});
        let cases = [
            ("b.json", of("y", &rounds), "a.json (\"x\"), "),
            ("c.json", of("x", &other), "differently"),
            ("c.json", of("x", &other), "c.json (8)"),
            ("d.json", none, "(a run with --no-trace?)"),
            ("copy.json", of("x", &rounds), "the same rounds"),
            ("a.json", of("x", &rounds), "a.json holds the same"),
        ];
        for (name, document, expected) in cases {
            let other = write(dir.path(), name, &document);
            let err = run(&[a.clone(), other]).expect_err(name).to_string();
            assert!(err.contains(expected), "{name}: {err}");
        }
        Ok(())
    }
}
