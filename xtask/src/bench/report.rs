//! The bench's table (stdout) and JSON (target/bench/latest.json): absolute numbers, ratios
//! reference / provisioner, the targets of DESIGN.md and whether they are met.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::stats::round3;

/// One condition from DESIGN.md's "Targets the design must allow".
#[derive(Clone, Copy, Debug)]
pub enum Check {
    /// reference / plugin mode at least this.
    PluginRatioAtLeast(f64),
    PluginBelow(f64),
    ApiBelow(f64),
    /// A daemon-only row's value below this.
    ValueBelow(f64),
}

/// One latency row: the three ways side by side.
pub struct LatencyRow {
    pub metric: String,
    pub reference: Option<f64>,
    pub plugin: Option<f64>,
    pub api: Option<f64>,
    pub target: &'static str,
    pub checks: Vec<Check>,
}

/// One row about the daemon alone (RSS, start to ready).
pub struct DaemonRow {
    pub metric: String,
    pub unit: &'static str,
    pub value: Option<f64>,
    pub target: &'static str,
    pub checks: Vec<Check>,
    /// Why the check is only indicative (e.g. measured with fewer sandboxes than the target).
    pub note: Option<String>,
}

fn ratio(reference: Option<f64>, ours: Option<f64>) -> Option<f64> {
    match (reference, ours) {
        (Some(r), Some(o)) if o > 0.0 => Some(r / o),
        _ => None,
    }
}

/// (label, met, measured) of each check.
fn evaluate(
    checks: &[Check],
    reference: Option<f64>,
    plugin: Option<f64>,
    api: Option<f64>,
) -> Vec<(String, Option<bool>, String)> {
    let cmp_below = |v: Option<f64>, limit: f64| (v.map(|v| v < limit), fmt(v));
    checks
        .iter()
        .map(|check| {
            let (label, (met, measured)) = match *check {
                Check::PluginRatioAtLeast(x) => {
                    let r = ratio(reference, plugin);
                    (format!("plugin >={x}x"), (r.map(|r| r >= x), fmt_ratio(r)))
                }
                Check::PluginBelow(l) => (format!("plugin <{l}"), cmp_below(plugin, l)),
                Check::ApiBelow(l) => (format!("api <{l}"), cmp_below(api, l)),
                Check::ValueBelow(l) => (format!("<{l}"), cmp_below(api, l)),
            };
            (label, met, measured)
        })
        .collect()
}

fn verdict(results: &[(String, Option<bool>, String)]) -> (&'static str, String) {
    if results.is_empty() {
        return ("", String::new());
    }
    let parts: Vec<String> = results
        .iter()
        .map(|(label, met, measured)| {
            let word = match met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "?",
            };
            format!("{label}: {word} ({measured})")
        })
        .collect();
    let all = results.iter().all(|(_, m, _)| *m == Some(true));
    let none = results.iter().all(|(_, m, _)| *m != Some(true));
    let word = if all {
        "MET"
    } else if none {
        "NOT MET"
    } else {
        "PARTLY"
    };
    (word, parts.join("; "))
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}x"))
}

/// Renders both tables for the terminal.
pub fn table(latency: &[LatencyRow], daemon: &[DaemonRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:>10} {:>10} {:>10} {:>9} {:>9}  {:<26} result",
        "latency (ms)", "reference", "plugin", "api", "ref/plug", "ref/api", "target (DESIGN.md)"
    );
    let _ = writeln!(out, "{}", "-".repeat(120));
    for row in latency {
        let results = evaluate(&row.checks, row.reference, row.plugin, row.api);
        let (word, detail) = verdict(&results);
        let _ = writeln!(
            out,
            "{:<28} {:>10} {:>10} {:>10} {:>9} {:>9}  {:<26} {}",
            row.metric,
            fmt(row.reference),
            fmt(row.plugin),
            fmt(row.api),
            fmt_ratio(ratio(row.reference, row.plugin)),
            fmt_ratio(ratio(row.reference, row.api)),
            row.target,
            if word.is_empty() {
                String::new()
            } else {
                format!("{word}: {detail}")
            }
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<40} {:>12}  {:<26} result",
        "daemon", "value", "target (DESIGN.md)"
    );
    let _ = writeln!(out, "{}", "-".repeat(120));
    for row in daemon {
        let results = evaluate(&row.checks, None, None, row.value);
        let (word, _) = verdict(&results);
        let _ = writeln!(
            out,
            "{:<40} {:>12}  {:<26} {}{}",
            row.metric,
            format!("{} {}", fmt(row.value), row.unit),
            row.target,
            word,
            row.note
                .as_ref()
                .map_or_else(String::new, |n| format!(" ({n})"))
        );
    }
    out
}

/// The same content as JSON.
pub fn json(latency: &[LatencyRow], daemon: &[DaemonRow]) -> Value {
    let opt = |v: Option<f64>| v.map(round3);
    let latency: Vec<Value> = latency
        .iter()
        .map(|row| {
            let results = evaluate(&row.checks, row.reference, row.plugin, row.api);
            let (word, detail) = verdict(&results);
            json!({
                "metric": row.metric,
                "unit": "ms",
                "reference": opt(row.reference),
                "plugin": opt(row.plugin),
                "api": opt(row.api),
                "ratio_reference_over_plugin": opt(ratio(row.reference, row.plugin)),
                "ratio_reference_over_api": opt(ratio(row.reference, row.api)),
                "target": row.target,
                "met": if word.is_empty() { Value::Null } else { Value::from(word == "MET") },
                "checks": detail,
            })
        })
        .collect();
    let daemon: Vec<Value> = daemon
        .iter()
        .map(|row| {
            let results = evaluate(&row.checks, None, None, row.value);
            let (word, detail) = verdict(&results);
            json!({
                "metric": row.metric,
                "unit": row.unit,
                "value": opt(row.value),
                "target": row.target,
                "met": if word.is_empty() { Value::Null } else { Value::from(word == "MET") },
                "checks": detail,
                "note": row.note,
            })
        })
        .collect();
    json!({ "latency": latency, "daemon": daemon })
}
