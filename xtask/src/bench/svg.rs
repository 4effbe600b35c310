//! A plot of latency distributions (cumulative, log-scale latency axis) as a standalone SVG.

use std::fmt::Write as _;
use std::time::Duration;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
/// One distribution: its label, samples and look.
pub struct Series<'a> {
    pub label: String,
    pub samples: &'a [Duration],
    /// An SVG color, e.g. `#d62728`.
    pub color: &'static str,
    pub dashed: bool,
}

/// The cumulative distribution of every series, latency on a log axis (ms).
pub fn cdf(title: &str, series: &[Series]) -> String {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|s| s.samples.iter().map(|d| d.as_secs_f64() * 1e3))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil()),
        )
    } else {
        (0.1, 100.0)
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |ms: f64| LEFT + (ms.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()) * plot_w;
    let y = |frac: f64| TOP + (1.0 - frac) * plot_h;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    // Axes, decade ticks and grid.
    let mut decade = lo;
    while decade <= hi * 1.000_001 {
        let px = x(decade);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 16.0,
            format_ms(decade)
        );
        decade *= 10.0;
    }
    for pct in [0, 25, 50, 75, 90, 99, 100] {
        let py = y(f64::from(pct) / 100.0);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{pct}%</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/><text x="{}" y="{}" text-anchor="middle">latency (ms, log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0
    );
    for (i, s) in series.iter().enumerate() {
        draw(&mut out, i, s, &x, &y);
    }
    out.push_str("</svg>\n");
    out
}

/// One series' polyline and its legend line, the `i`th.
fn draw(out: &mut String, i: usize, s: &Series, x: &dyn Fn(f64) -> f64, y: &dyn Fn(f64) -> f64) {
    let color = s.color;
    let dash = if s.dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    };
    let mut ms: Vec<f64> = s.samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    #[expect(clippy::cast_precision_loss, reason = "sample counts are small")]
    let n = ms.len() as f64;
    let mut points = String::new();
    for (k, v) in ms.iter().enumerate() {
        #[expect(clippy::cast_precision_loss, reason = "sample counts are small")]
        let frac = (k + 1) as f64 / n;
        let _ = write!(points, "{:.1},{:.1} ", x(*v), y(frac));
    }
    let _ = writeln!(
        out,
        r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{points}"/>"#
    );
    let ly = TOP + 18.0 + 18.0 * f64::from(u32::try_from(i).unwrap_or(0));
    let _ = writeln!(
        out,
        r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
        LEFT + 12.0,
        LEFT + 36.0,
        LEFT + 42.0,
        ly + 4.0,
        escape(&s.label)
    );
}

fn format_ms(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
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
    fn draws_one_polyline_per_series_with_every_sample() {
        let a: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        let b = vec![Duration::from_micros(300); 3];
        let svg = cdf(
            "t <1>",
            &[
                Series {
                    label: "a".into(),
                    samples: &a,
                    color: "red",
                    dashed: false,
                },
                Series {
                    label: "b".into(),
                    samples: &b,
                    color: "blue",
                    dashed: true,
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;1&gt;"));
        let first = svg.split("<polyline").nth(1).unwrap_or_default();
        let points = first.split("points=\"").nth(1).unwrap_or_default();
        assert_eq!(
            points
                .split('"')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .count(),
            10
        );
    }
}
