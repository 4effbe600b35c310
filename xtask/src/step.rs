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

/// The eBPF object every build that [`cargo`] starts embeds (see [`embed_ebpf_object`]).
static EBPF_OBJECT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Makes every later [`cargo`] build embed `object` (`PROVISIONER_EBPF_OBJECT`), so that the
/// builds of one xtask run (lint, tests, image, demo) share one eBPF build instead of each
/// profile's build script building its own.
pub fn embed_ebpf_object(object: std::path::PathBuf) {
    let _ = EBPF_OBJECT.set(object);
}

/// The object [`embed_ebpf_object`] named, if any.
pub fn shared_ebpf_object() -> Option<&'static std::path::Path> {
    EBPF_OBJECT.get().map(std::path::PathBuf::as_path)
}

/// Has the cargo `cmd` embed the shared eBPF object, when [`embed_ebpf_object`] named one.
pub fn with_shared_ebpf_object(cmd: &mut Command) {
    if let Some(object) = EBPF_OBJECT.get() {
        cmd.env("PROVISIONER_EBPF_OBJECT", object);
    }
}

/// A `cargo` command for `toolchain` with the environment of the calling cargo removed, so the
/// requested toolchain is the one that runs.
pub fn cargo(toolchain: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{toolchain}"));
    with_shared_ebpf_object(&mut cmd);
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
