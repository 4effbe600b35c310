//! Latency samples and their summary.

use std::time::Duration;

use serde_json::{Value, json};

/// Median, p99 and friends of one phase, in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
    /// Wall time of the whole phase, seconds.
    pub wall_s: f64,
}

impl Summary {
    pub fn of(samples: &[Duration], wall: Duration) -> Self {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let n = ms.len();
        #[expect(
            clippy::cast_precision_loss,
            reason = "sample counts are far below 2^52"
        )]
        let mean_ms = if n == 0 {
            0.0
        } else {
            ms.iter().sum::<f64>() / n as f64
        };
        Self {
            n,
            median_ms: percentile(&ms, 50),
            p99_ms: percentile(&ms, 99),
            mean_ms,
            max_ms: ms.last().copied().unwrap_or(0.0),
            wall_s: wall.as_secs_f64(),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "n={} median {:.2} ms, p99 {:.2} ms, max {:.2} ms ({:.1} s wall)",
            self.n, self.median_ms, self.p99_ms, self.max_ms, self.wall_s
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "n": self.n,
            "median_ms": round3(self.median_ms),
            "p99_ms": round3(self.p99_ms),
            "mean_ms": round3(self.mean_ms),
            "max_ms": round3(self.max_ms),
            "wall_s": round3(self.wall_s),
        })
    }
}

/// Nearest-rank percentile of sorted samples (the median of an even count is the mean of the
/// two middle samples).
fn percentile(sorted: &[f64], pct: usize) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return 0.0;
    }
    if pct == 50 {
        return if n % 2 == 1 {
            sorted[n / 2]
        } else {
            f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
        };
    }
    let rank = (n * pct).div_ceil(100).max(1);
    sorted[rank - 1]
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(&samples, Duration::from_secs(1));
        assert!((s.median_ms - 50.5).abs() < 1e-9);
        assert!((s.p99_ms - 99.0).abs() < 1e-9);
        assert!((s.max_ms - 100.0).abs() < 1e-9);
        let one = Summary::of(&[Duration::from_millis(3)], Duration::ZERO);
        assert!((one.p99_ms - 3.0).abs() < 1e-9);
    }
}
