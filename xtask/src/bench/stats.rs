//! Latency and CPU samples of one phase, and their summary.

use std::collections::BTreeMap;
use std::time::Duration;

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
    /// The part of `daemon_cpu` each of its live threads spent, by thread name.
    pub daemon_threads: BTreeMap<String, Duration>,
    /// Wall time of this phase's blocks, added up (the other ways' blocks excluded).
    pub elapsed: Duration,
}

impl Samples {
    pub fn extend(&mut self, other: Samples) {
        self.wall.extend(other.wall);
        self.process_cpu.extend(other.process_cpu);
        self.daemon_cpu += other.daemon_cpu;
        for (name, cpu) in other.daemon_threads {
            *self.daemon_threads.entry(name).or_insert(Duration::ZERO) += cpu;
        }
        self.elapsed += other.elapsed;
    }
}

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
    /// CPU time per call: the call's process plus the daemon's share.
    pub cpu_ms: f64,
    /// The exec'd process's part of `cpu_ms`.
    pub process_cpu_ms: f64,
    /// The daemon's part of `cpu_ms` (its CPU time over the phase / calls).
    pub daemon_cpu_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Summary {
    pub fn of(samples: &Samples) -> Self {
        let mut walls: Vec<f64> = samples.wall.iter().copied().map(ms).collect();
        walls.sort_by(f64::total_cmp);
        let n = walls.len();
        #[expect(
            clippy::cast_precision_loss,
            reason = "sample counts are far below 2^52"
        )]
        let per_call = |total: f64| if n == 0 { 0.0 } else { total / n as f64 };
        let process_cpu_ms = per_call(samples.process_cpu.iter().copied().map(ms).sum());
        let daemon_cpu_ms = per_call(ms(samples.daemon_cpu));
        Self {
            n,
            median_ms: percentile(&walls, 50),
            p99_ms: percentile(&walls, 99),
            mean_ms: per_call(walls.iter().sum()),
            max_ms: walls.last().copied().unwrap_or(0.0),
            wall_s: samples.elapsed.as_secs_f64(),
            cpu_ms: process_cpu_ms + daemon_cpu_ms,
            process_cpu_ms,
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
            "mean_ms": round3(self.mean_ms),
            "max_ms": round3(self.max_ms),
            "wall_s": round3(self.wall_s),
            "cpu_ms_per_call": round3(self.cpu_ms),
            "process_cpu_ms_per_call": round3(self.process_cpu_ms),
            "daemon_cpu_ms_per_call": round3(self.daemon_cpu_ms),
        })
    }
}

/// Where the daemon's CPU per call went, thread by thread (ms per call, most first; threads
/// under 1 us per call left out). What threads that ended during the phase spent (the blocking
/// pool's) is `ended_ms`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadSplit {
    pub threads: Vec<(String, f64)>,
    pub ended_ms: f64,
}

impl ThreadSplit {
    pub fn of(samples: &Samples) -> Self {
        let n = samples.wall.len();
        if n == 0 {
            return Self::default();
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "sample counts are far below 2^52"
        )]
        let per_call = |d: Duration| ms(d) / n as f64;
        let mut threads: Vec<(String, f64)> = samples
            .daemon_threads
            .iter()
            .map(|(name, cpu)| (name.clone(), per_call(*cpu)))
            .filter(|(_, cpu)| *cpu >= 0.001)
            .collect();
        threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        let counted: Duration = samples.daemon_threads.values().sum();
        Self {
            threads,
            ended_ms: per_call(samples.daemon_cpu.saturating_sub(counted)),
        }
    }

    /// `main 0.93, ipam-commit 0.31, ...` (ms per call), or `None` when nothing was counted.
    pub fn line(&self) -> Option<String> {
        if self.threads.is_empty() {
            return None;
        }
        let mut parts: Vec<String> = self
            .threads
            .iter()
            .map(|(name, cpu)| format!("{name} {cpu:.3}"))
            .collect();
        if self.ended_ms >= 0.001 {
            parts.push(format!("ended threads {:.3}", self.ended_ms));
        }
        Some(format!("{} ms/call", parts.join(", ")))
    }

    pub fn json(&self) -> Value {
        let mut by_thread = serde_json::Map::new();
        for (name, cpu) in &self.threads {
            by_thread.insert(name.clone(), round3(*cpu).into());
        }
        json!({ "threads": by_thread, "ended_threads": round3(self.ended_ms) })
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

/// Nearest-rank percentile of sorted samples (the median of an even count is the mean of the
/// two middle samples).
pub fn percentile(sorted: &[f64], pct: usize) -> f64 {
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

/// Mean of sorted samples without the lowest and highest `trim_pct` percent of them. Unlike
/// the median, it moves smoothly when calls split between two modes of latency (an API ADD's
/// are about 0.1 ms apart): the median jumps from one mode to the other as their shares cross.
pub fn trimmed_mean(sorted: &[f64], trim_pct: usize) -> f64 {
    assert!(
        trim_pct < 50,
        "trimming {trim_pct} % from each end leaves nothing"
    );
    let cut = sorted.len() * trim_pct / 100;
    let kept = &sorted[cut..sorted.len() - cut];
    if kept.is_empty() {
        return 0.0;
    }
    #[expect(clippy::cast_precision_loss, reason = "sample counts are small")]
    let n = kept.len() as f64;
    kept.iter().sum::<f64>() / n
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Resamples drawn by [`round_bootstrap`] and [`run_bootstrap`].
const RESAMPLES: usize = 2000;

/// Indices drawn with replacement, the same at every use (xorshift64 with a fixed seed: enough
/// to draw indices, and no dependency).
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

/// The 5th and 95th percentiles of `values`.
fn interval_90(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    (percentile(&values, 5), percentile(&values, 95))
}

/// The 90 % interval (5th to 95th percentile) of `statistic` over `rounds` measurement rounds
/// resampled with replacement. Rounds, not calls, are resampled: what moves a comparison on
/// these VMs is the round (the daemon started for it, the host's load while it ran), and the
/// calls of one round move together. `statistic` gets the indices of the rounds drawn (a round
/// may come more than once). The draws are the same at every call (fixed seed).
pub fn round_bootstrap(rounds: usize, statistic: impl Fn(&[usize]) -> f64) -> (f64, f64) {
    if rounds == 0 {
        return (0.0, 0.0);
    }
    let mut draws = Draws::new();
    let mut drawn = vec![0usize; rounds];
    let values = (0..RESAMPLES)
        .map(|_| {
            for slot in &mut drawn {
                *slot = draws.below(rounds);
            }
            statistic(&drawn)
        })
        .collect();
    interval_90(values)
}

/// The median of every run's values pooled, and its 90 % interval from resampling runs, then
/// each drawn run's values (a two-level bootstrap). Whatever one run shares across its rounds
/// (the host's load in those minutes, what ran before it) widens the interval instead of
/// hiding in it, as it would if the pooled values were resampled as one sample. Resampling at
/// both levels counts the spread within runs twice: the interval errs wide (towards
/// `undecided`), and with two runs it spans little more than the two runs themselves.
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
            super::median(&drawn)
        })
        .collect();
    (super::median(&pooled), interval_90(values))
}

/// `value` against `base`, in percent (positive: slower).
pub fn percent_slower(base: f64, value: f64) -> f64 {
    if base > 0.0 {
        (value / base - 1.0) * 100.0
    } else {
        0.0
    }
}

/// Each round's `other` against its `base`, in percent (the two measured once per round, in
/// the same order).
pub fn round_slowdowns(base: &[f64], other: &[f64]) -> Vec<f64> {
    debug_assert_eq!(base.len(), other.len(), "one figure per round in each");
    base.iter()
        .zip(other)
        .map(|(&base, &other)| percent_slower(base, other))
        .collect()
}

/// How much slower `other` is than `base`, both measured once per round: the median of the
/// rounds' own slowdowns, with its 90 % interval over the rounds ([`round_bootstrap`]). Where
/// the two figures of a round are measured close together and the machine drifts between
/// rounds, the drift cancels within each round instead of widening the interval.
pub fn paired_slowdown(base: &[f64], other: &[f64]) -> (f64, (f64, f64)) {
    let paired = round_slowdowns(base, other);
    let interval = round_bootstrap(paired.len(), |drawn| {
        super::median(&drawn.iter().map(|&r| paired[r]).collect::<Vec<_>>())
    });
    (super::median(&paired), interval)
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
            ..Samples::default()
        };
        let s = Summary::of(&samples);
        assert!((s.median_ms - 50.5).abs() < 1e-9);
        assert!((s.p99_ms - 99.0).abs() < 1e-9);
        assert!((s.max_ms - 100.0).abs() < 1e-9);
        assert!((s.cpu_ms - 1.5).abs() < 1e-9);
        let one = Summary::of(&Samples {
            wall: vec![Duration::from_millis(3)],
            ..Samples::default()
        });
        assert!((one.p99_ms - 3.0).abs() < 1e-9);
    }

    #[test]
    fn the_daemon_cpu_splits_by_thread_per_call_across_blocks() {
        let block = |main: u64, commit: u64, total: u64| Samples {
            wall: vec![Duration::from_millis(1); 10],
            daemon_cpu: Duration::from_micros(total),
            daemon_threads: BTreeMap::from([
                ("main".to_owned(), Duration::from_micros(main)),
                ("ipam-commit".to_owned(), Duration::from_micros(commit)),
                ("idle".to_owned(), Duration::from_nanos(100)),
            ]),
            ..Samples::default()
        };
        let mut phase = block(9_000, 3_000, 12_500);
        phase.extend(block(11_000, 3_000, 14_500));
        let split = ThreadSplit::of(&phase);
        assert_eq!(
            split.threads,
            vec![("main".to_owned(), 1.0), ("ipam-commit".to_owned(), 0.3)]
        );
        assert!((split.ended_ms - 0.05).abs() < 1e-3, "{split:?}");
        assert_eq!(
            split.line().as_deref(),
            Some("main 1.000, ipam-commit 0.300, ended threads 0.050 ms/call")
        );
        assert_eq!(ThreadSplit::of(&Samples::default()).line(), None);
    }

    #[test]
    fn a_trimmed_mean_drops_the_tails_and_follows_a_shift_between_modes() {
        let mut calls: Vec<f64> = vec![0.55; 9];
        calls.push(50.0);
        assert!(
            (trimmed_mean(&calls, 10) - 0.55).abs() < 1e-12,
            "the outlier is cut"
        );
        // Half of the calls in each mode, then one more in the slow one: the median jumps by
        // half the gap (from between the modes to the slow one), the trimmed mean moves by a
        // fraction of that.
        let split = |slow: usize| -> Vec<f64> {
            let mut v = vec![0.55; 20 - slow];
            v.extend(vec![0.65; slow]);
            v
        };
        let (even, more_slow) = (split(10), split(11));
        assert!((percentile(&more_slow, 50) - percentile(&even, 50) - 0.05).abs() < 1e-12);
        let moved = trimmed_mean(&more_slow, 10) - trimmed_mean(&even, 10);
        assert!(moved > 0.0 && moved < 0.01, "{moved}");
        assert_eq!(trimmed_mean(&[], 10), 0.0);
    }

    #[test]
    fn the_round_bootstrap_spans_what_the_rounds_disagree_on() {
        fn mean(values: &[f64]) -> impl Fn(&[usize]) -> f64 + '_ {
            move |drawn| drawn.iter().map(|&i| values[i]).sum::<f64>() / drawn.len() as f64
        }
        let agreeing = [5.0; 16];
        assert_eq!(round_bootstrap(16, mean(&agreeing)), (5.0, 5.0));
        let spread: Vec<f64> = (0..16).map(f64::from).collect();
        let (low, high) = round_bootstrap(16, mean(&spread));
        assert!(low < 7.5 && 7.5 < high, "({low}, {high})");
        assert!(
            low > 0.0 && high < 15.0,
            "({low}, {high}): the means of 16 draws, not single rounds"
        );
        assert_eq!(
            round_bootstrap(16, mean(&spread)),
            (low, high),
            "the same draws each run"
        );
        assert_eq!(round_bootstrap(0, mean(&spread)), (0.0, 0.0));
    }

    #[test]
    fn pooled_runs_that_disagree_widen_the_interval_that_rounds_alone_would_give() {
        // Four runs whose rounds agree within each run, 2 points apart from run to run.
        let runs: Vec<Vec<f64>> = (0..4)
            .map(|run| {
                (0..16)
                    .map(|round| 1.0 + 2.0 * f64::from(run) + 0.01 * f64::from(round))
                    .collect()
            })
            .collect();
        let (median, (low, high)) = run_bootstrap(&runs);
        let pooled: Vec<f64> = runs.iter().flatten().copied().collect();
        let (round_low, round_high) = round_bootstrap(pooled.len(), |drawn| {
            super::super::median(&drawn.iter().map(|&i| pooled[i]).collect::<Vec<_>>())
        });
        assert!(
            high - low > 1.5 * (round_high - round_low),
            "runs resampled: ({low}, {high}); rounds only: ({round_low}, {round_high})"
        );
        assert!(low <= median && median <= high);
        assert_eq!(
            run_bootstrap(&[vec![2.0; 4], Vec::new(), vec![2.0; 4]]),
            (2.0, (2.0, 2.0)),
            "a run without rounds is left out"
        );
        assert_eq!(run_bootstrap(&[]), (0.0, (0.0, 0.0)));
    }

    #[test]
    fn a_paired_slowdown_is_not_widened_by_drift_between_rounds() {
        // The machine's speed doubles every other round; within a round, the second figure
        // is 3 % above the first.
        let base: Vec<f64> = (0..16)
            .map(|r| if r % 2 == 0 { 700.0 } else { 1400.0 })
            .collect();
        let other: Vec<f64> = base.iter().map(|b| b * 1.03).collect();
        let (slower, (low, high)) = paired_slowdown(&base, &other);
        assert!((slower - 3.0).abs() < 1e-9, "{slower}");
        assert!(
            (low - 3.0).abs() < 1e-9 && (high - 3.0).abs() < 1e-9,
            "{low} {high}"
        );
        // Rounds that disagree widen it: half of them 6 % slower, half not at all.
        let mixed: Vec<f64> = base
            .iter()
            .enumerate()
            .map(|(r, b)| b * if r % 4 < 2 { 1.06 } else { 1.0 })
            .collect();
        let (slower, (low, high)) = paired_slowdown(&base, &mixed);
        assert!((slower - 3.0).abs() < 1e-9, "{slower}");
        assert!(low < 1.0 && high > 5.0, "{low} {high}");
        assert_eq!(paired_slowdown(&[], &[]), (0.0, (0.0, 0.0)));
    }
}
