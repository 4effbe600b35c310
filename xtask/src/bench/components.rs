//! Components measured alone: the allocator and the dataplane, through the library (the
//! `components` bench target of provisioner-tests, built with the same profile and flags as the
//! binary, since xtask cannot depend on the provisioner crate: that needs the eBPF object xtask
//! builds).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::report::{Single, Target};
use crate::step::{announce, cargo, detail, workspace_root};

/// Sandboxes / allocations per phase.
const N: usize = 100;

/// The components are measured in a glibc build (static, non-PIE): the test crate's
/// dependencies are not built for musl. So they run on glibc's allocator, not the daemon's.
const COMPONENTS_TARGET: &str = "x86_64-unknown-linux-gnu";
const COMPONENTS_RUSTFLAGS: &str = "-C target-feature=+crt-static -C relocation-model=static";

/// Builds the components bench; the path of its executable.
pub fn build() -> Result<PathBuf> {
    announce(
        "build",
        "components bench (provisioner-tests, profile dist)",
    );
    let out = cargo("stable")
        .current_dir(workspace_root())
        .args(["build", "--profile", "dist", "-p", "provisioner-tests"])
        .args(["--bench", "components", "--target", COMPONENTS_TARGET])
        .args(["--message-format", "json-render-diagnostics"])
        .env("RUSTFLAGS", COMPONENTS_RUSTFLAGS)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run cargo build for the components bench")?;
    if !out.status.success() {
        bail!("building the components bench failed");
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["target"]["name"] == "components")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo did not report the components bench executable")
}

/// What the components measured (the bench target's JSON).
pub struct Results(Value);

/// Runs the components bench.
pub fn run(binary: &Path) -> Result<Results> {
    announce(
        "bench",
        &format!("components alone: allocator and dataplane, N={N}"),
    );
    let out = Command::new(binary)
        .arg(N.to_string())
        .output()
        .with_context(|| format!("run {}", binary.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let value: Value =
        serde_json::from_slice(&out.stdout).context("undecodable components output")?;
    detail(&value.to_string());
    Ok(Results(value))
}

impl Results {
    pub fn json(&self) -> Value {
        self.0.clone()
    }

    /// One row per measured operation (median, with the p99 in the name).
    pub fn singles(&self) -> Vec<Single> {
        let mut out = Vec::new();
        for (part, ops) in [
            (
                "ipam",
                &[
                    "allocate",
                    "release",
                    "reserve_answer",
                    "reserve_durable",
                    "allocate_16_threads",
                ][..],
            ),
            ("dataplane", &["setup", "check", "teardown"][..]),
        ] {
            for op in ops {
                let s = &self.0[part][op];
                let Some(median) = s["median_ms"].as_f64() else {
                    continue;
                };
                out.push(Single {
                    metric: format!(
                        "component: {part} {op} (median; p99 {:.2} ms)",
                        s["p99_ms"].as_f64().unwrap_or(0.0)
                    ),
                    unit: "ms",
                    value: median,
                    cpu_ms: None,
                    target: Target::None,
                    interval: None,
                    note: None,
                });
            }
        }
        out
    }
}
