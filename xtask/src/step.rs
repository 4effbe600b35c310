//! Announcing steps and running commands with visible progress.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Prints a step header, e.g. `==> [bootstrap] bpf-linker`.
pub fn announce(area: &str, what: &str) {
    eprintln!("==> [{area}] {what}");
}

/// Prints a detail line under the current step.
pub fn detail(what: &str) {
    eprintln!("    {what}");
}

/// Runs `cmd` with inherited stdio, failing with the command line when it does not succeed.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = format!("{cmd:?}");
    let started = Instant::now();
    let status = cmd.status().with_context(|| format!("spawn {line}"))?;
    if !status.success() {
        bail!("{line} failed: {status}");
    }
    detail(&format!("done in {:.1}s", started.elapsed().as_secs_f64()));
    Ok(())
}

/// Runs `cmd` capturing stdout; `None` when it cannot run or fails.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The workspace root (the parent of the xtask crate).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), PathBuf::from)
}

/// A `cargo` command for `toolchain` with the environment of the calling cargo removed, so the
/// requested toolchain is the one that runs.
pub fn cargo(toolchain: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{toolchain}"));
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd
}
