//! A plot of latency distributions (cumulative, log-scale latency axis) as a standalone SVG.

use std::fmt::Write as _;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 40.0;
const PLOT_W: f64 = WIDTH - LEFT - 20.0;
const PLOT_H: f64 = HEIGHT - TOP - 50.0;
const BOTTOM: f64 = TOP + PLOT_H;
const RIGHT: f64 = LEFT + PLOT_W;

/// One distribution: its label, its points and look.
pub struct Series {
    pub label: String,
    /// (latency in ms, share of the calls at or below it), latency ascending.
    pub points: Vec<(f64, f64)>,
    /// An SVG color, e.g. `#d62728`.
    pub color: &'static str,
    pub dashed: bool,
}

/// The cumulative distribution of every series, latency on a log axis (ms) spanning whole
/// decades, a legend line per series.
pub fn cdf(title: &str, series: &[Series]) -> String {
    let ms = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0.log10()));
    let (lo, hi) = ms
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v.floor()), hi.max(v.ceil()))
        });
    let (lo, hi) = if hi > lo { (lo, hi) } else { (-1.0, 2.0) };
    let x = |ms: f64| LEFT + (ms.log10().max(lo) - lo) / (hi - lo) * PLOT_W;
    let y = |share: f64| TOP + (1.0 - share) * PLOT_H;
    let (title, mid) = (escape(title), LEFT + PLOT_W / 2.0);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/><text x="{mid}" y="22" text-anchor="middle" font-size="14">{title}</text>
<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="black"/><text x="{mid}" y="{}" text-anchor="middle">latency (ms, log scale)</text>
"#,
        HEIGHT - 10.0
    );
    let mut decade = lo;
    while decade <= hi {
        let (ms, digits) = (10f64.powf(decade), (-decade).max(0.0) as usize);
        let (px, label_y, label) = (x(ms), BOTTOM + 16.0, format!("{ms:.digits$}"));
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{BOTTOM}" stroke="#ddd"/><text x="{px:.1}" y="{label_y}" text-anchor="middle">{label}</text>"##
        );
        decade += 1.0;
    }
    for pct in [0, 25, 50, 75, 90, 99, 100] {
        let (py, label_x) = (y(f64::from(pct) / 100.0), LEFT - 6.0);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{RIGHT}" y2="{py:.1}" stroke="#eee"/><text x="{label_x}" y="{:.1}" text-anchor="end">{pct}%</text>"##,
            py + 4.0
        );
    }
    for (i, s) in (0u32..).zip(series) {
        let dash = ["", r#" stroke-dasharray="6 4""#][usize::from(s.dashed)];
        let (color, label) = (s.color, escape(&s.label));
        let mut points = String::new();
        for &(ms, share) in &s.points {
            let _ = write!(points, "{:.1},{:.1} ", x(ms), y(share));
        }
        let ly = TOP + 18.0 + 18.0 * f64::from(i);
        let (x1, x2, text_x, text_y) = (LEFT + 12.0, LEFT + 36.0, LEFT + 42.0, ly + 4.0);
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{points}"/>
<line x1="{x1}" y1="{ly}" x2="{x2}" y2="{ly}" stroke="{color}" stroke-width="3"{dash}/><text x="{text_x}" y="{text_y}">{label}</text>"#
        );
    }
    out + "</svg>\n"
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_one_polyline_per_series_with_every_point() {
        let a: Vec<(f64, f64)> = (1..=10)
            .map(|i| (f64::from(i), f64::from(i) / 10.0))
            .collect();
        let series = |label: &str, points, dashed| Series {
            label: label.into(),
            points,
            color: "red",
            dashed,
        };
        let svg = cdf(
            "t <1>",
            &[series("a", a, false), series("b", vec![(0.3, 1.0)], true)],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(
            svg.contains("t &lt;1&gt;")
                && svg.contains(">0.1</text>")
                && svg.contains(">10</text>")
        );
        let first = svg.split("points=\"").nth(1).unwrap_or_default();
        assert_eq!(
            first
                .split('"')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .count(),
            10
        );
    }
}
