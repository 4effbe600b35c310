//! How long this machine takes to wake an idle CPU, and how often it stalls one for
//! milliseconds: a floor for the p99 rows, measured with no provisioner code involved.
//!
//! A thread on the first CPU wakes a thread on the last one through a socket, after a pause
//! long enough for that CPU to go idle, and reads back how long the wake took. On a virtual
//! machine an idle CPU can be gone for milliseconds (the host runs something else on it; the
//! guest sees no sample, no interrupt, nothing from that CPU meanwhile). Every ADD hands work
//! from one process or thread to another several times (runtime, plugin, daemon, committer),
//! so such a stall during a phase's 100 ADDs is enough to decide their p99.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde_json::{Value, json};

use super::cpus;
use super::stats::percentile;

/// Pause before each wake: the woken CPU has nothing else to do and goes idle.
const IDLE_BEFORE_WAKE: Duration = Duration::from_millis(1);
/// A wake slower than this is a stall of the machine (the median is tens of microseconds).
const STALL: Duration = Duration::from_millis(2);

/// The wake latencies of one measurement.
pub struct Wakes {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

/// Wakes a thread on the last CPU `count` times from one on the first.
pub fn measure(count: usize) -> Result<Wakes> {
    let cpus = cpus::allowed()?;
    let (waker_cpu, woken_cpu) = (cpus[0], cpus[cpus.len() - 1]);
    let (mut waker, mut woken) = UnixStream::pair().context("socketpair for the wake probe")?;
    let base = Instant::now();
    std::thread::scope(|scope| {
        let echo = scope.spawn(move || -> Result<()> {
            cpus::pin_this_thread(woken_cpu)?;
            let mut sent = [0u8; 8];
            // The waker closing its end ends the loop.
            while woken.read_exact(&mut sent).is_ok() {
                let latency = base
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(u64::from_le_bytes(sent)));
                let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
                woken.write_all(&nanos.to_le_bytes())?;
            }
            Ok(())
        });
        // The waker is a thread of its own too: pinning is inherited by whatever this thread
        // spawns afterwards.
        let waking = scope.spawn(move || -> Result<Wakes> {
            cpus::pin_this_thread(waker_cpu)?;
            let started = Instant::now();
            let mut latencies = Vec::with_capacity(count);
            let mut answer = [0u8; 8];
            for _ in 0..count {
                std::thread::sleep(IDLE_BEFORE_WAKE);
                let now = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
                waker.write_all(&now.to_le_bytes())?;
                waker.read_exact(&mut answer)?;
                latencies.push(Duration::from_nanos(u64::from_le_bytes(answer)));
            }
            Ok(Wakes {
                latencies,
                elapsed: started.elapsed(),
            })
        });
        let measured = waking
            .join()
            .map_err(|_| anyhow!("the wake probe's waking thread panicked"))?;
        echo.join()
            .map_err(|_| anyhow!("the wake probe's woken thread panicked"))??;
        measured
    })
}

impl Wakes {
    fn stalls(&self) -> Vec<Duration> {
        self.latencies
            .iter()
            .copied()
            .filter(|&l| l > STALL)
            .collect()
    }

    fn ms(&self, pct: usize) -> f64 {
        let mut sorted: Vec<f64> = self
            .latencies
            .iter()
            .map(|l| l.as_secs_f64() * 1e3)
            .collect();
        sorted.sort_by(f64::total_cmp);
        percentile(&sorted, pct)
    }

    fn max_ms(&self) -> f64 {
        self.latencies
            .iter()
            .max()
            .map_or(0.0, |l| l.as_secs_f64() * 1e3)
    }

    /// Stalls per second of the measurement.
    pub fn stalls_per_second(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            f64::from(u32::try_from(self.stalls().len()).unwrap_or(u32::MAX)) / seconds
        } else {
            0.0
        }
    }

    /// One line for the bench's progress and the report.
    pub fn line(&self) -> String {
        format!(
            "{} wakes: median {:.3} ms, p99 {:.3} ms, max {:.2} ms; {} over {} ms ({:.2} per s)",
            self.latencies.len(),
            self.ms(50),
            self.ms(99),
            self.max_ms(),
            self.stalls().len(),
            STALL.as_millis(),
            self.stalls_per_second(),
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "wakes": self.latencies.len(),
            "idle_before_wake_ms": IDLE_BEFORE_WAKE.as_secs_f64() * 1e3,
            "median_ms": self.ms(50),
            "p99_ms": self.ms(99),
            "max_ms": self.max_ms(),
            "stall_over_ms": STALL.as_secs_f64() * 1e3,
            "stalls_ms": self.stalls().iter().map(|l| l.as_secs_f64() * 1e3).collect::<Vec<_>>(),
            "stalls_per_second": self.stalls_per_second(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wake_is_measured_and_stalls_are_the_slow_ones() {
        let cpus_before = cpus::allowed().expect("affinity");
        let wakes = measure(20).expect("wake probe");
        assert_eq!(wakes.latencies.len(), 20);
        // What the bench spawns next (plugins, daemons) inherits this thread's affinity.
        assert_eq!(cpus::allowed().expect("affinity"), cpus_before);
        assert!(wakes.latencies.iter().all(|l| *l < Duration::from_secs(5)));
        let stalled = Wakes {
            latencies: vec![
                Duration::from_micros(40),
                Duration::from_millis(5),
                Duration::from_micros(60),
            ],
            elapsed: Duration::from_secs(2),
        };
        assert_eq!(stalled.stalls(), vec![Duration::from_millis(5)]);
        assert!((stalled.stalls_per_second() - 0.5).abs() < 1e-9);
        assert!((stalled.max_ms() - 5.0).abs() < 1e-9);
    }
}
