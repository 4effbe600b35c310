//! Latency and CPU samples of one phase, their summary, and the slowdowns (with a 90 %
//! interval) that the tracer's rows and `bench-pool` report.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// What the calls of one phase of one way measured.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Latency of each call as its caller saw it.
    pub wall: Vec<Duration>,
    /// CPU time of each call's own process (the exec'd plugin and its children; zero for calls
    /// that exec nothing).
    pub process_cpu: Vec<Duration>,
    /// CPU time the daemon spent during this phase's blocks.
    pub daemon_cpu: Duration,
    /// Wall time of this phase's blocks, added up (the other ways' blocks excluded).
    pub elapsed: Duration,
}

impl Samples {
    pub fn extend(&mut self, other: Samples) {
        self.wall.extend(other.wall);
        self.process_cpu.extend(other.process_cpu);
        self.daemon_cpu += other.daemon_cpu;
        self.elapsed += other.elapsed;
    }
}

/// Percentiles of durations: 3 significant digits (0.1 %), up to an hour.
pub struct Percentiles(Histogram<u64>);

impl Percentiles {
    pub fn of(values: &[Duration]) -> Self {
        let mut histogram = Histogram::new_with_max(3_600_000_000_000, 3)
            .unwrap_or_else(|_| unreachable!("3 significant digits up to an hour are valid"));
        for value in values {
            histogram.saturating_record(u64::try_from(value.as_nanos()).unwrap_or(u64::MAX));
        }
        Self(histogram)
    }

    /// The `pct` percentile (nearest rank) in ms; 0 without values.
    #[expect(
        clippy::cast_precision_loss,
        reason = "nanoseconds of a call fit in 2^52"
    )]
    pub fn ms(&self, pct: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_percentile(pct) as f64 / 1e6
    }

    pub fn max_ms(&self) -> f64 {
        self.ms(100.0)
    }
}

/// Median, p99 and CPU per call of one phase, in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Wall time of the whole phase, seconds.
    pub wall_s: f64,
    /// CPU time per call: the call's process plus the daemon's share.
    pub cpu_ms: f64,
    /// The daemon's part of `cpu_ms` (its CPU time over the phase / calls).
    pub daemon_cpu_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Summary {
    pub fn of(samples: &Samples) -> Self {
        let n = samples.wall.len();
        #[expect(
            clippy::cast_precision_loss,
            reason = "sample counts are far below 2^52"
        )]
        let per_call = |total: f64| if n == 0 { 0.0 } else { total / n as f64 };
        let process_cpu_ms = per_call(samples.process_cpu.iter().copied().map(ms).sum());
        let daemon_cpu_ms = per_call(ms(samples.daemon_cpu));
        let walls = Percentiles::of(&samples.wall);
        Self {
            n,
            median_ms: walls.ms(50.0),
            p99_ms: walls.ms(99.0),
            max_ms: walls.max_ms(),
            wall_s: samples.elapsed.as_secs_f64(),
            cpu_ms: process_cpu_ms + daemon_cpu_ms,
            daemon_cpu_ms,
        }
    }

    pub fn line(&self) -> String {
        format!(
            "n={} median {:.2} ms, p99 {:.2} ms, max {:.2} ms, CPU {:.2} ms/call ({:.1} s wall)",
            self.n, self.median_ms, self.p99_ms, self.max_ms, self.cpu_ms, self.wall_s
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "n": self.n,
            "median_ms": round3(self.median_ms),
            "p99_ms": round3(self.p99_ms),
            "max_ms": round3(self.max_ms),
            "wall_s": round3(self.wall_s),
            "cpu_ms_per_call": round3(self.cpu_ms),
            "daemon_cpu_ms_per_call": round3(self.daemon_cpu_ms),
        })
    }
}

/// Every latency of `samples` in ms (3 decimals), in call order: the raw distribution.
pub fn raw_ms(samples: &Samples) -> Value {
    samples
        .wall
        .iter()
        .map(|d| round3(ms(*d)))
        .collect::<Vec<_>>()
        .into()
}

/// The median of `values` (the mean of the two middle ones for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Resamples drawn by the bootstraps.
const RESAMPLES: usize = 2000;

/// Indices drawn with replacement, the same at every use (xorshift64 with a fixed seed).
struct Draws(u64);

impl Draws {
    fn new() -> Self {
        Self(0x9E37_79B9_7F4A_7C15)
    }

    /// An index below `n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        #[expect(clippy::cast_possible_truncation, reason = "the modulus is a usize")]
        let index = (self.0 % n as u64) as usize;
        index
    }
}

/// The 5th and 95th percentiles (nearest rank) of `values`.
fn interval_90(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |pct: usize| values[(values.len() * pct).div_ceil(100).max(1) - 1];
    (at(5), at(95))
}

/// The median of every run's values pooled, and its 90 % interval from resampling runs, then
/// each drawn run's values (a two-level bootstrap). What one run shares across its rounds (the
/// host's load in those minutes) widens the interval instead of hiding in it. With one run
/// this resamples its rounds. Resampling at both levels counts the spread within runs twice:
/// the interval errs wide (towards `undecided`).
pub fn run_bootstrap(runs: &[Vec<f64>]) -> (f64, (f64, f64)) {
    let runs: Vec<&Vec<f64>> = runs.iter().filter(|run| !run.is_empty()).collect();
    let pooled: Vec<f64> = runs.iter().copied().flatten().copied().collect();
    if pooled.is_empty() {
        return (0.0, (0.0, 0.0));
    }
    let mut draws = Draws::new();
    let mut drawn = Vec::with_capacity(pooled.len());
    let values = (0..RESAMPLES)
        .map(|_| {
            drawn.clear();
            for _ in 0..runs.len() {
                let run = runs[draws.below(runs.len())];
                for _ in 0..run.len() {
                    drawn.push(run[draws.below(run.len())]);
                }
            }
            median(&drawn)
        })
        .collect();
    (median(&pooled), interval_90(values))
}

/// `value` against `base`, in percent (positive: slower).
pub fn percent_slower(base: f64, value: f64) -> f64 {
    if base > 0.0 {
        (value / base - 1.0) * 100.0
    } else {
        0.0
    }
}

/// Each round's `other` against its `base`, in percent: a drift of the machine between rounds
/// cancels within each round instead of widening the interval of their median.
pub fn round_slowdowns(base: &[f64], other: &[f64]) -> Vec<f64> {
    base.iter()
        .zip(other)
        .map(|(&b, &o)| percent_slower(b, o))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_cpu_per_call() {
        let samples = Samples {
            wall: (1..=100).map(Duration::from_millis).collect(),
            process_cpu: vec![Duration::from_millis(1); 100],
            daemon_cpu: Duration::from_millis(50),
            elapsed: Duration::from_secs(1),
        };
        let s = Summary::of(&samples);
        let close = |a: f64, b: f64| (a - b).abs() <= b * 1e-3;
        assert!(close(s.median_ms, 50.0), "{s:?}");
        assert!(close(s.p99_ms, 99.0), "{s:?}");
        assert!(close(s.max_ms, 100.0), "{s:?}");
        assert!((s.cpu_ms - 1.5).abs() < 1e-9);
        assert_eq!(Summary::of(&Samples::default()).p99_ms, 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    }

    #[test]
    fn pooled_runs_that_disagree_widen_the_interval_of_one_run() {
        // Four runs whose rounds agree within each run, 2 points apart from run to run.
        let runs: Vec<Vec<f64>> = (0..4)
            .map(|run| {
                (0..16)
                    .map(|r| 1.0 + 2.0 * f64::from(run) + 0.01 * f64::from(r))
                    .collect()
            })
            .collect();
        let (mid, (low, high)) = run_bootstrap(&runs);
        let pooled: Vec<f64> = runs.iter().flatten().copied().collect();
        let (_, (one_low, one_high)) = run_bootstrap(&[pooled]);
        assert!(
            high - low > 1.5 * (one_high - one_low),
            "({low}, {high}) ({one_low}, {one_high})"
        );
        assert!(low <= mid && mid <= high);
        assert_eq!(
            run_bootstrap(&[vec![2.0; 4], Vec::new(), vec![2.0; 4]]),
            (2.0, (2.0, 2.0))
        );
        assert_eq!(run_bootstrap(&[]), (0.0, (0.0, 0.0)));
    }

    #[test]
    fn round_slowdowns_are_not_widened_by_drift_between_rounds() {
        // The machine's speed doubles every other round; within a round, 3 % slower.
        let base: Vec<f64> = (0..16)
            .map(|r| if r % 2 == 0 { 700.0 } else { 1400.0 })
            .collect();
        let other: Vec<f64> = base.iter().map(|b| b * 1.03).collect();
        let (slower, (low, high)) = run_bootstrap(&[round_slowdowns(&base, &other)]);
        for v in [slower, low, high] {
            assert!((v - 3.0).abs() < 1e-9, "{slower} ({low}, {high})");
        }
        // Rounds that disagree widen it: half of them 6 % slower, half not at all.
        let mixed: Vec<f64> = base
            .iter()
            .enumerate()
            .map(|(r, b)| b * if r % 4 < 2 { 1.06 } else { 1.0 })
            .collect();
        let (slower, (low, high)) = run_bootstrap(&[round_slowdowns(&base, &mixed)]);
        assert!(
            (slower - 3.0).abs() < 1e-9 && low < 1.0 && high > 5.0,
            "{slower} {low} {high}"
        );
    }
}
