//! The bench's tables (markdown, printed and written to target/bench/latest.md) and their JSON:
//! absolute numbers, CPU time per call, ratios provisioner / reference, the targets of
//! docs/benchmarks.md and whether they are met.

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
            } => {
                format!("plugin <= {plugin} x ref; api <= {ms} ms")
            }
            Self::AtMost(v) => format!("<= {v}"),
        }
    }
}

/// One row comparing the ways.
pub struct Row {
    pub metric: String,
    pub unit: &'static str,
    /// (reference, plugin, api).
    pub values: [Option<f64>; 3],
    /// CPU ms per call of (reference, plugin, api) in this row's phase.
    pub cpu: [Option<f64>; 3],
    pub target: Target,
}

/// One row about one thing (a floor, the daemon, the tracer).
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

impl Single {
    /// A row without CPU figure nor interval.
    pub fn plain(metric: String, unit: &'static str, value: f64, target: Target) -> Self {
        Self {
            metric,
            unit,
            value,
            cpu_ms: None,
            target,
            interval: None,
            note: None,
        }
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

fn ratio(reference: Option<f64>, ours: Option<f64>) -> Option<f64> {
    match (reference, ours) {
        (Some(r), Some(o)) if r > 0.0 => Some(o / r),
        _ => None,
    }
}

fn met(row: &Row) -> Option<bool> {
    let Target::Ratio { plugin, api_ms } = row.target else {
        return None;
    };
    let [reference, ours, api] = row.values;
    let api_ok = api_ms.is_none_or(|ms| api.is_some_and(|a| a <= ms));
    Some(ratio(reference, ours)? <= plugin && api_ok)
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

fn word(met: Option<bool>, target: Target) -> &'static str {
    match (met, target) {
        (Some(true), _) => "met",
        (Some(false), _) => "MISSED",
        (None, Target::AtMost(_)) => "undecided",
        (None, _) => "",
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

/// Both tables in markdown: wall figures with the CPU ms per call in parentheses.
pub fn markdown(rows: &[Row], singles: &[Single]) -> String {
    let mut out = String::new();
    if !rows.is_empty() {
        out.push_str("| wall (CPU ms/call) | reference | plugin | api | plugin / ref | api / ref | target | |\n");
        out.push_str("|---|---|---|---|---|---|---|---|\n");
    }
    for r in rows {
        let [reference, plugin, api] = r.values;
        let _ = writeln!(
            out,
            "| {} ({}) | {} | {} | {} | {} | {} | {} | {} |",
            r.metric,
            r.unit,
            with_cpu(reference, r.cpu[0]),
            with_cpu(plugin, r.cpu[1]),
            with_cpu(api, r.cpu[2]),
            num(ratio(reference, plugin)),
            num(ratio(reference, api)),
            r.target.describe(),
            word(met(r), Target::None)
        );
    }
    out.push_str("\n| | value [90 % interval] | CPU ms | target | |\n|---|---|---|---|---|\n");
    for s in singles {
        let value = match s.interval {
            Some((low, high)) => format!("{:.2} [{low:.1}, {high:.1}] {}", s.value, s.unit),
            None => format!("{:.2} {}", s.value, s.unit),
        };
        let note = s
            .note
            .as_ref()
            .map_or_else(String::new, |n| format!(" ({n})"));
        let _ = writeln!(
            out,
            "| {} | {value} | {} | {} | {}{note} |",
            s.metric,
            num(s.cpu_ms),
            s.target.describe(),
            word(met_single(s), s.target),
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
            let [reference, plugin, api] = r.values;
            json!({
                "metric": r.metric, "unit": r.unit,
                "reference": opt(reference), "plugin": opt(plugin), "api": opt(api),
                "cpu_ms_per_call": {
                    "reference": opt(r.cpu[0]), "plugin": opt(r.cpu[1]), "api": opt(r.cpu[2]),
                },
                "plugin_over_reference": opt(ratio(reference, plugin)),
                "api_over_reference": opt(ratio(reference, api)),
                "target": r.target.describe(),
                "met": met(r),
            })
        })
        .collect();
    let singles: Vec<Value> = singles
        .iter()
        .map(|s| {
            json!({
                "metric": s.metric, "unit": s.unit, "value": round3(s.value),
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
            values: [Some(10.0), Some(plugin), Some(api)],
            cpu: [Some(4.0), None, None],
            target: Target::Ratio {
                plugin: 0.2,
                api_ms: Some(1.0),
            },
        };
        assert_eq!(met(&row(2.0, 0.9)), Some(true));
        assert_eq!(met(&row(2.5, 0.9)), Some(false));
        assert_eq!(met(&row(1.0, 1.5)), Some(false));
        let text = markdown(&[row(2.0, 0.9)], &[]);
        assert!(
            text.contains("| 10.00 (4.00) | 2.00 | 0.90 | 0.20 | 0.09 |"),
            "{text}"
        );
        assert!(text.contains("| met |"), "{text}");
    }

    #[test]
    fn a_target_is_judged_on_the_whole_interval() {
        let single = |value, interval| Single {
            interval,
            ..Single::plain(
                "tracing: API ADD".into(),
                "% slower",
                value,
                Target::AtMost(5.0),
            )
        };
        assert_eq!(met_single(&single(3.0, None)), Some(true));
        assert_eq!(met_single(&single(6.0, None)), Some(false));
        assert_eq!(met_single(&single(3.0, Some((1.0, 4.5)))), Some(true));
        assert_eq!(met_single(&single(7.0, Some((5.5, 9.0)))), Some(false));
        let straddling = single(3.0, Some((-2.0, 12.0)));
        assert_eq!(met_single(&straddling), None);
        let text = markdown(&[], &[straddling]);
        assert!(
            text.contains("3.00 [-2.0, 12.0] % slower") && text.contains("undecided"),
            "{text}"
        );
        let value = &json(&[], &[single(3.0, Some((1.0, 4.5)))])["singles"][0];
        assert_eq!(
            (value["met"].as_bool(), value["interval_90"][1].as_f64()),
            (Some(true), Some(4.5))
        );
    }
}
