//! The eBPF programs' own run time over a window, from the kernel's per-program statistics
//! (`BPF_ENABLE_STATS`, held only for the window: no sysctl is written). On this shared machine
//! one thread's CPU time per sendto swings by tens of percent from one measurement to the next,
//! far more than the tracer adds; the programs' run time per call is exact.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

/// Run time and runs of one program.
#[derive(Clone, Copy, Default)]
struct Counters {
    run_time: Duration,
    runs: u64,
}

/// Statistics switched on, and the counters of every loaded program when the window opened.
pub struct Window {
    _stats: OwnedFd,
    start: HashMap<u32, (String, Counters)>,
}

/// What the programs did during a window, per program (by name).
#[derive(Clone, Default)]
pub struct Spent {
    per_program: Vec<(String, Counters)>,
}

fn snapshot() -> Result<HashMap<u32, (String, Counters)>> {
    let mut out = HashMap::new();
    for info in aya::programs::loaded_programs() {
        let info = info.context("read a loaded eBPF program's info")?;
        let name = info.name_as_str().unwrap_or("?").to_owned();
        let counters = Counters {
            run_time: info.run_time(),
            runs: info.run_count(),
        };
        out.insert(info.id(), (name, counters));
    }
    Ok(out)
}

impl Window {
    /// Switches run-time statistics on (for as long as the window lives) and reads the
    /// counters.
    pub fn open() -> Result<Self> {
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .context("BPF_ENABLE_STATS (run time statistics of eBPF programs)")?;
        Ok(Self {
            _stats: stats,
            start: snapshot()?,
        })
    }

    /// What every program that ran since `open` spent; statistics go off.
    pub fn close(self) -> Result<Spent> {
        let end = snapshot()?;
        let mut per_program: Vec<(String, Counters)> = end
            .into_iter()
            .filter_map(|(id, (name, now))| {
                let before = self.start.get(&id).map(|(_, c)| *c).unwrap_or_default();
                let spent = Counters {
                    run_time: now.run_time.saturating_sub(before.run_time),
                    runs: now.runs.saturating_sub(before.runs),
                };
                (spent.runs > 0).then_some((name, spent))
            })
            .collect();
        per_program.sort_by_key(|(_, c)| std::cmp::Reverse(c.run_time));
        Ok(Spent { per_program })
    }
}

impl Spent {
    pub fn add(&mut self, other: &Spent) {
        for (name, c) in &other.per_program {
            match self.per_program.iter_mut().find(|(n, _)| n == name) {
                Some((_, mine)) => {
                    mine.run_time += c.run_time;
                    mine.runs += c.runs;
                }
                None => self.per_program.push((name.clone(), *c)),
            }
        }
        self.per_program
            .sort_by_key(|(_, c)| std::cmp::Reverse(c.run_time));
    }

    /// Nanoseconds of eBPF run time per call, over `calls` calls.
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    pub fn ns_per_call(&self, calls: u64) -> f64 {
        let total: Duration = self.per_program.iter().map(|(_, c)| c.run_time).sum();
        if calls == 0 {
            return 0.0;
        }
        total.as_nanos() as f64 / calls as f64
    }

    /// `name runs/call ns/call, ...`, the costliest first.
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    pub fn describe(&self, calls: u64) -> String {
        if self.per_program.is_empty() {
            return "no program ran".to_owned();
        }
        let calls = calls.max(1) as f64;
        self.per_program
            .iter()
            .map(|(name, c)| {
                format!(
                    "{name} {:.2} runs/call {:.0} ns/call",
                    c.runs as f64 / calls,
                    c.run_time.as_nanos() as f64 / calls
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn json(&self, calls: u64) -> Value {
        json!({
            "calls": calls,
            "ns_per_call": self.ns_per_call(calls),
            "programs": self.per_program.iter().map(|(name, c)| json!({
                "name": name,
                "runs": c.runs,
                "run_time_ns": u64::try_from(c.run_time.as_nanos()).unwrap_or(u64::MAX),
            })).collect::<Vec<_>>(),
        })
    }
}
