//! The bench's table (terminal and markdown) and its JSON: absolute numbers, CPU time per call,
//! ratios provisioner / reference, the targets of issue 9 and whether they are met.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::stats::round3;

/// A target of one row.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    None,
    /// plugin / reference at most this, and (optionally) api at most this many ms.
    Ratio {
        plugin: f64,
        api_ms: Option<f64>,
    },
    /// The row's value at most this.
    AtMost(f64),
}

impl Target {
    fn describe(self) -> String {
        match self {
            Self::None => String::new(),
            Self::Ratio {
                plugin,
                api_ms: None,
            } => format!("plugin <= {plugin} x ref"),
            Self::Ratio {
                plugin,
                api_ms: Some(ms),
            } => format!("plugin <= {plugin} x ref; api <= {ms} ms"),
            Self::AtMost(v) => format!("<= {v}"),
        }
    }
}

/// One row comparing the ways.
pub struct Row {
    pub metric: String,
    pub unit: &'static str,
    pub reference: Option<f64>,
    pub plugin: Option<f64>,
    pub api: Option<f64>,
    /// CPU ms per call of (reference, plugin, api) in this row's phase.
    pub cpu: [Option<f64>; 3],
    pub target: Target,
}

/// One row about one thing (a floor, the daemon, a component).
pub struct Single {
    pub metric: String,
    pub unit: &'static str,
    pub value: f64,
    pub cpu_ms: Option<f64>,
    pub target: Target,
    /// The 90 % interval of `value` when it was estimated from rounds that disagree: the
    /// target is met only when all of it is, missed only when none of it is.
    pub interval: Option<(f64, f64)>,
    pub note: Option<String>,
}

fn ratio(reference: Option<f64>, ours: Option<f64>) -> Option<f64> {
    match (reference, ours) {
        (Some(r), Some(o)) if r > 0.0 => Some(o / r),
        _ => None,
    }
}

fn met(row: &Row) -> Option<bool> {
    match row.target {
        Target::None | Target::AtMost(_) => None,
        Target::Ratio { plugin, api_ms } => {
            let r = ratio(row.reference, row.plugin)?;
            let api_ok = match api_ms {
                Some(ms) => row.api.is_some_and(|a| a <= ms),
                None => true,
            };
            Some(r <= plugin && api_ok)
        }
    }
}

/// Whether `s` met its target; `None` without a target, or when its interval holds values on
/// both sides of it.
fn met_single(s: &Single) -> Option<bool> {
    let Target::AtMost(target) = s.target else {
        return None;
    };
    match s.interval {
        None => Some(s.value <= target),
        Some((_, high)) if high <= target => Some(true),
        Some((low, _)) if low > target => Some(false),
        Some(_) => None,
    }
}

fn word(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "",
    }
}

/// [`word`] for a single row: one whose interval straddles its target is `undecided`.
fn single_word(s: &Single) -> &'static str {
    match (met_single(s), s.target) {
        (None, Target::AtMost(_)) => "undecided",
        (met, _) => word(met),
    }
}

/// `value unit`, with the interval when there is one.
fn single_value(s: &Single) -> String {
    match s.interval {
        Some((low, high)) => format!("{:.2} [{low:.1}, {high:.1}] {}", s.value, s.unit),
        None => format!("{:.2} {}", s.value, s.unit),
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn with_cpu(v: Option<f64>, cpu: Option<f64>) -> String {
    match (v, cpu) {
        (Some(v), Some(c)) => format!("{v:.2} ({c:.2})"),
        (v, _) => num(v),
    }
}

/// The terminal table.
pub fn table(rows: &[Row], singles: &[Single]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<34} {:>16} {:>16} {:>16} {:>8} {:>8}  {:<30} result",
        "wall (CPU ms/call)", "reference", "plugin", "api", "plug/ref", "api/ref", "target"
    );
    let _ = writeln!(out, "{}", "-".repeat(150));
    for r in rows {
        let _ = writeln!(
            out,
            "{:<34} {:>16} {:>16} {:>16} {:>8} {:>8}  {:<30} {}",
            format!("{} ({})", r.metric, r.unit),
            with_cpu(r.reference, r.cpu[0]),
            with_cpu(r.plugin, r.cpu[1]),
            with_cpu(r.api, r.cpu[2]),
            num(ratio(r.reference, r.plugin)),
            num(ratio(r.reference, r.api)),
            r.target.describe(),
            word(met(r))
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<50} {:>14} {:>10}  {:<30} result (value [90 % interval])",
        "floors, daemon, components", "value", "CPU ms", "target"
    );
    let _ = writeln!(out, "{}", "-".repeat(120));
    for s in singles {
        let _ = writeln!(
            out,
            "{:<50} {:>14} {:>10}  {:<30} {}{}",
            s.metric,
            single_value(s),
            num(s.cpu_ms),
            s.target.describe(),
            single_word(s),
            s.note
                .as_ref()
                .map_or_else(String::new, |n| format!(" ({n})"))
        );
    }
    out
}

/// The same tables in markdown (for docs/benchmarks.md).
pub fn markdown(rows: &[Row], singles: &[Single]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| | reference | plugin | api | plugin / ref | api / ref | target | |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} ({}) | {} | {} | {} | {} | {} | {} | {} |",
            r.metric,
            r.unit,
            with_cpu(r.reference, r.cpu[0]),
            with_cpu(r.plugin, r.cpu[1]),
            with_cpu(r.api, r.cpu[2]),
            num(ratio(r.reference, r.plugin)),
            num(ratio(r.reference, r.api)),
            r.target.describe(),
            word(met(r))
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "| | value | CPU ms | target | |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for s in singles {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {}{} |",
            s.metric,
            single_value(s),
            num(s.cpu_ms),
            s.target.describe(),
            single_word(s),
            s.note
                .as_ref()
                .map_or_else(String::new, |n| format!(" ({n})"))
        );
    }
    out
}

/// Both tables as JSON.
pub fn json(rows: &[Row], singles: &[Single]) -> Value {
    let opt = |v: Option<f64>| v.map(round3);
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "metric": r.metric,
                "unit": r.unit,
                "reference": opt(r.reference),
                "plugin": opt(r.plugin),
                "api": opt(r.api),
                "cpu_ms_per_call": {
                    "reference": opt(r.cpu[0]),
                    "plugin": opt(r.cpu[1]),
                    "api": opt(r.cpu[2]),
                },
                "plugin_over_reference": opt(ratio(r.reference, r.plugin)),
                "api_over_reference": opt(ratio(r.reference, r.api)),
                "target": r.target.describe(),
                "met": met(r),
            })
        })
        .collect();
    let singles: Vec<Value> = singles
        .iter()
        .map(|s| {
            json!({
                "metric": s.metric,
                "unit": s.unit,
                "value": round3(s.value),
                "cpu_ms": opt(s.cpu_ms),
                "target": s.target.describe(),
                "met": met_single(s),
                "interval_90": s.interval.map(|(low, high)| [round3(low), round3(high)]),
                "note": s.note,
            })
        })
        .collect();
    json!({ "rows": rows, "singles": singles })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_targets_are_ours_over_reference() {
        let row = |plugin, api| Row {
            metric: "ADD median".into(),
            unit: "ms",
            reference: Some(10.0),
            plugin: Some(plugin),
            api: Some(api),
            cpu: [None; 3],
            target: Target::Ratio {
                plugin: 0.2,
                api_ms: Some(1.0),
            },
        };
        assert_eq!(met(&row(2.0, 0.9)), Some(true));
        assert_eq!(met(&row(2.5, 0.9)), Some(false));
        assert_eq!(met(&row(1.0, 1.5)), Some(false));
        let text = table(&[row(2.0, 0.9)], &[]);
        assert!(text.contains("0.20"), "{text}");
    }

    #[test]
    fn a_target_is_judged_on_the_whole_interval() {
        let single = |value, interval| Single {
            metric: "tracing: API ADD median, on vs off".into(),
            unit: "% slower",
            value,
            cpu_ms: None,
            target: Target::AtMost(5.0),
            interval,
            note: None,
        };
        assert_eq!(met_single(&single(3.0, None)), Some(true));
        assert_eq!(met_single(&single(6.0, None)), Some(false));
        assert_eq!(met_single(&single(3.0, Some((1.0, 4.5)))), Some(true));
        assert_eq!(met_single(&single(7.0, Some((5.5, 9.0)))), Some(false));
        let straddling = single(3.0, Some((-2.0, 12.0)));
        assert_eq!(met_single(&straddling), None);
        let text = table(&[], &[straddling]);
        assert!(text.contains("undecided"), "{text}");
        assert!(text.contains("[-2.0, 12.0]"), "{text}");
    }
}
