//! Latency and CPU samples of one phase and their summary, with every percentile of a
//! duration from an hdrhistogram; and the slowdowns, with a 90 % interval, that the tracer's
//! rows and `bench-pool` report (signed percentages, a few dozen of them: sorted instead).

use std::time::Duration;

use hdrhistogram::Histogram;
use hdrhistogram::iterators::IterationValue;
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

/// Durations recorded with 3 significant digits (0.1 %), up to an hour.
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

    /// The `pct` percentile in ms; 0 without values.
    pub fn ms(&self, pct: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_percentile(pct) as f64 / 1e6
    }

    /// Each recorded value in ms with the share of the values at or below it (0 to 1).
    pub fn cdf_ms(&self) -> Vec<(f64, f64)> {
        let point = |v: IterationValue<u64>| (v.value_iterated_to() as f64 / 1e6, v.quantile());
        self.0.iter_recorded().map(point).collect()
    }
}

/// The calling thread's CPU time.
pub fn thread_cpu() -> anyhow::Result<Duration> {
    let clock = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID);
    Ok(Duration::from(clock?))
}

/// The median of `values` in ms.
pub fn median_ms(values: &[Duration]) -> f64 {
    Percentiles::of(values).ms(50.0)
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

impl Summary {
    pub fn of(samples: &Samples) -> Self {
        let n = samples.wall.len();
        let per_call = |total: Duration| total.as_secs_f64() * 1e3 / n.max(1) as f64;
        let daemon_cpu_ms = per_call(samples.daemon_cpu);
        let walls = Percentiles::of(&samples.wall);
        Self {
            n,
            median_ms: walls.ms(50.0),
            p99_ms: walls.ms(99.0),
            max_ms: walls.ms(100.0),
            wall_s: samples.elapsed.as_secs_f64(),
            cpu_ms: per_call(samples.process_cpu.iter().sum()) + daemon_cpu_ms,
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
    let ms = samples.wall.iter().map(|d| round3(d.as_secs_f64() * 1e3));
    ms.collect::<Vec<_>>().into()
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
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

/// Resamples drawn by the bootstrap.
const RESAMPLES: usize = 2000;

/// Indices drawn with replacement, the same at every use (xorshift64 with a fixed seed).
struct Draws(u64);

impl Draws {
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

/// The median of every run's values pooled, and its 90 % interval (5th and 95th percentiles,
/// nearest rank) from resampling runs, then each drawn run's values (a two-level bootstrap).
/// What one run shares across its rounds (the host's load in those minutes) widens the
/// interval instead of hiding in it. With one run this resamples its rounds. Resampling at
/// both levels counts the spread within runs twice: the interval errs wide (towards
/// `undecided`).
pub fn run_bootstrap(runs: &[Vec<f64>]) -> (f64, (f64, f64)) {
    let runs: Vec<&Vec<f64>> = runs.iter().filter(|run| !run.is_empty()).collect();
    let pooled: Vec<f64> = runs.iter().copied().flatten().copied().collect();
    if pooled.is_empty() {
        return (0.0, (0.0, 0.0));
    }
    let mut draws = Draws(0x9E37_79B9_7F4A_7C15);
    let mut drawn = Vec::with_capacity(pooled.len());
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            drawn.clear();
            for _ in 0..runs.len() {
                let run = runs[draws.below(runs.len())];
                drawn.extend((0..run.len()).map(|_| run[draws.below(run.len())]));
            }
            median(&drawn)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    let at = |pct: usize| medians[(RESAMPLES * pct).div_ceil(100) - 1];
    (median(&pooled), (at(5), at(95)))
}

/// Each round's `other` against its `base`, in percent (positive: slower): a drift of the
/// machine between rounds cancels within each round instead of widening the interval.
pub fn round_slowdowns(base: &[f64], other: &[f64]) -> Vec<f64> {
    let slower = |(&b, &o): (&f64, &f64)| if b > 0.0 { (o / b - 1.0) * 100.0 } else { 0.0 };
    base.iter().zip(other).map(slower).collect()
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
        assert!(close(s.median_ms, 50.0) && close(s.p99_ms, 99.0), "{s:?}");
        assert!(close(s.max_ms, 100.0) && close(s.cpu_ms, 1.5), "{s:?}");
        assert_eq!(Summary::of(&Samples::default()).p99_ms, 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
        let cdf = Percentiles::of(&samples.wall).cdf_ms();
        assert_eq!(cdf.len(), 100);
        assert!(close(cdf[49].0, 50.0) && close(cdf[49].1, 0.5), "{cdf:?}");
    }

    #[test]
    fn pooled_runs_that_disagree_widen_the_interval_of_one_run() {
        // Four runs whose rounds agree within each run, 2 points apart from run to run.
        let run = |run: u32| {
            (0..16)
                .map(|r| f64::from(2 * run) + 0.01 * f64::from(r))
                .collect()
        };
        let runs: Vec<Vec<f64>> = (0..4).map(run).collect();
        let (mid, (low, high)) = run_bootstrap(&runs);
        let (_, (one_low, one_high)) = run_bootstrap(&[runs.concat()]);
        assert!(
            high - low > 1.5 * (one_high - one_low),
            "{low} {high} {one_low} {one_high}"
        );
        assert!(low <= mid && mid <= high);
        let with_empty = [vec![2.0; 4], Vec::new(), vec![2.0; 4]];
        assert_eq!(run_bootstrap(&with_empty), (2.0, (2.0, 2.0)));
        assert_eq!(run_bootstrap(&[]), (0.0, (0.0, 0.0)));
    }

    #[test]
    fn round_slowdowns_are_not_widened_by_drift_between_rounds() {
        // The machine's speed doubles every other round; within a round, 3 % slower.
        let base: Vec<f64> = (0..16).map(|r| [700.0, 1400.0][r % 2]).collect();
        let other: Vec<f64> = base.iter().map(|b| b * 1.03).collect();
        let (slower, (low, high)) = run_bootstrap(&[round_slowdowns(&base, &other)]);
        for v in [slower, low, high] {
            assert!((v - 3.0).abs() < 1e-9, "{slower} ({low}, {high})");
        }
        // Rounds that disagree widen it: half of them 6 % slower, half not at all.
        let mixed: Vec<f64> = (0..16).map(|r| base[r] * [1.06, 1.0][r / 2 % 2]).collect();
        let (slower, (low, high)) = run_bootstrap(&[round_slowdowns(&base, &mixed)]);
        assert!((slower - 3.0).abs() < 1e-9, "{slower}");
        assert!(low < 1.0 && high > 5.0, "{low} {high}");
    }
}
