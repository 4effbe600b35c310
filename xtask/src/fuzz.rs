//! `cargo xtask fuzz`: builds the fuzz targets in `fuzz/` (cargo-fuzz, libFuzzer, AddressSanitizer)
//! and runs each for a fixed time, then prints per target the executions, the corpus and the
//! crash found (libFuzzer stops a target at its first crash and writes the input to
//! `fuzz/artifacts/<target>/`).
//!
//! cargo-fuzz passes `-Z` flags to rustc, which only a nightly compiler takes; on a stable
//! toolchain `RUSTC_BOOTSTRAP=1` lets it accept them, so no nightly install is needed.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::step::{announce, detail, output, run as run_cmd, workspace_root};

/// Every target in `fuzz/Cargo.toml`, in the order they run.
pub const TARGETS: [&str; 5] = [
    "cni_conf",
    "cni_result",
    "template",
    "daemon_api",
    "netlink_event",
];

pub struct Options {
    /// Fuzzing time per target.
    pub seconds: u64,
    /// Only this target.
    pub target: Option<String>,
    /// Build without optimizations: half the build time, fewer executions a second (a short
    /// run's trade, as CI's).
    pub dev: bool,
}

impl Options {
    /// The build flags of `cargo fuzz build` and `run` (the same, or `run` builds again).
    fn build_flags(&self) -> Vec<&'static str> {
        let mut flags = vec!["--debug-assertions"];
        if self.dev {
            flags.push("--dev");
        }
        flags
    }
}

/// What one target's run showed, read from libFuzzer's output.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    /// Fuzzing time as libFuzzer reports it (`cargo fuzz run` may rebuild first).
    seconds: Option<u64>,
    execs: Option<u64>,
    corpus: Option<u64>,
    crash: Option<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    let root = workspace_root();
    let targets: Vec<&str> = match &opts.target {
        Some(t) if TARGETS.contains(&t.as_str()) => vec![t.as_str()],
        Some(t) => bail!("unknown fuzz target {t} (targets: {})", TARGETS.join(", ")),
        None => TARGETS.to_vec(),
    };
    ensure_cargo_fuzz()?;
    crate::ebpf::build_once_for_all()?;
    let profile = if opts.dev { "dev" } else { "release" };
    announce(
        "fuzz",
        &format!("build the fuzz targets ({profile}, debug assertions, AddressSanitizer)"),
    );
    run_cmd(cargo_fuzz(&root, "build").args(opts.build_flags()))?;

    let logs = root.join("target").join("fuzz");
    fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    let mut results = Vec::new();
    for target in targets {
        let log = logs.join(format!("{target}.log"));
        announce(
            "fuzz",
            &format!("{target} for {} s (log: {})", opts.seconds, log.display()),
        );
        let started = Instant::now();
        let outcome = run_target(&root, target, opts, &log)?;
        let secs = outcome.seconds.unwrap_or(started.elapsed().as_secs());
        detail(&format!(
            "{} execs, corpus {}, {}",
            show(outcome.execs),
            show(outcome.corpus),
            outcome.crash.as_deref().unwrap_or("no crash")
        ));
        results.push((target, secs, outcome));
    }

    println!(
        "{:<14} {:>8} {:>12} {:>10} {:>8}  crash",
        "target", "seconds", "execs", "execs/s", "corpus"
    );
    for (target, secs, o) in &results {
        let rate = o.execs.map(|e| (e / secs.max(&1)).to_string());
        println!(
            "{target:<14} {secs:>8} {:>12} {:>10} {:>8}  {}",
            show(o.execs),
            rate.as_deref().unwrap_or("?"),
            show(o.corpus),
            o.crash.as_deref().unwrap_or("-")
        );
    }
    let crashed: Vec<_> = results
        .iter()
        .filter(|(_, _, o)| o.crash.is_some())
        .collect();
    if !crashed.is_empty() {
        let repro: Vec<String> = crashed
            .iter()
            .map(|(t, _, o)| {
                format!(
                    "RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz {} {t} {}",
                    opts.build_flags().join(" "),
                    o.crash.as_deref().unwrap_or("")
                )
            })
            .collect();
        bail!(
            "{} target(s) crashed; reproduce with:\n  {}",
            crashed.len(),
            repro.join("\n  ")
        );
    }
    Ok(())
}

fn show(v: Option<u64>) -> String {
    v.map_or_else(|| "?".to_owned(), |v| v.to_string())
}

/// `cargo fuzz SUBCOMMAND` for `fuzz/`, with nightly flags allowed on stable.
fn cargo_fuzz(root: &Path, subcommand: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove("CARGO_TARGET_DIR")
        .args(["fuzz", subcommand, "--fuzz-dir", "fuzz"]);
    crate::step::with_shared_ebpf_object(&mut cmd);
    cmd
}

fn ensure_cargo_fuzz() -> Result<()> {
    if let Some(version) = output(Command::new("cargo").args(["fuzz", "--version"])) {
        detail(&format!("found {}", version.trim()));
        return Ok(());
    }
    announce("fuzz", "install cargo-fuzz");
    run_cmd(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

/// Runs one target for `seconds` with the committed seeds, its output to `log`.
fn run_target(root: &Path, target: &str, opts: &Options, log: &Path) -> Result<Outcome> {
    let corpus = root.join("fuzz").join("corpus").join(target);
    fs::create_dir_all(&corpus).with_context(|| format!("create {}", corpus.display()))?;
    let seeds: PathBuf = root.join("fuzz").join("seeds").join(target);
    let file = File::create(log).with_context(|| format!("create {}", log.display()))?;
    let mut cmd = cargo_fuzz(root, "run");
    cmd.args(opts.build_flags())
        .arg(target)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={}", opts.seconds))
        // One process (one core); a slow input is a finding, not a hang of the run.
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"]);
    if target == "template" {
        // gtmpl lexes in a thread of its own per parse; that thread can still be exiting when
        // LeakSanitizer looks, and its thread-local bookkeeping then shows as a 32-byte leak.
        cmd.arg("-detect_leaks=0");
    }
    cmd.stdout(Stdio::null()).stderr(file);
    let status = cmd
        .status()
        .with_context(|| format!("run cargo fuzz for {target}"))?;
    let text = fs::read_to_string(log).with_context(|| format!("read {}", log.display()))?;
    let outcome = parse_output(&text);
    if !status.success() && outcome.crash.is_none() {
        bail!(
            "cargo fuzz run {target} failed ({status}) without a crash input; see {}",
            log.display()
        );
    }
    Ok(outcome)
}

/// Reads libFuzzer's output: `Done N runs in S second(s)`, `stat::number_of_executed_units`,
/// the last `corp: N/...` status line, and `Test unit written to PATH` for a crash.
fn parse_output(text: &str) -> Outcome {
    let mut outcome = Outcome::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Done ")
            && let Some((_, secs)) = rest.split_once(" runs in ")
        {
            outcome.seconds = secs.split(' ').next().and_then(|s| s.parse().ok());
        }
        if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
            outcome.execs = n.trim().parse().ok();
        }
        if let Some(rest) = line.split(" corp: ").nth(1)
            && let Some(n) = rest.split('/').next()
        {
            outcome.corpus = n.trim().parse().ok().or(outcome.corpus);
        }
        if let Some(path) = line.split("Test unit written to ").nth(1) {
            outcome.crash = Some(path.trim().to_owned());
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_execs_corpus_and_crash() {
        let text = "#2\tINITED cov: 10 ft: 12 corp: 5/300b exec/s: 0 rss: 40Mb\n\
                    #4096\tpulse  cov: 50 ft: 80 corp: 17/1201b lim: 4096 exec/s: 2048 rss: 45Mb\n\
                    ==1==ERROR: AddressSanitizer: deadly signal\n\
                    artifact_prefix='/w/fuzz/artifacts/template/'; Test unit written to /w/fuzz/artifacts/template/crash-abc\n\
                    stat::number_of_executed_units: 5000\n";
        assert_eq!(
            parse_output(text),
            Outcome {
                seconds: None,
                execs: Some(5000),
                corpus: Some(17),
                crash: Some("/w/fuzz/artifacts/template/crash-abc".to_owned()),
            }
        );
    }

    #[test]
    fn a_clean_run_has_no_crash() {
        let text = "Done 1234 runs in 2 second(s)\nstat::number_of_executed_units: 1234\n";
        assert_eq!(
            parse_output(text),
            Outcome {
                seconds: Some(2),
                execs: Some(1234),
                corpus: None,
                crash: None,
            }
        );
    }
}
