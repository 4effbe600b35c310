//! The binary to install, measure and demonstrate, and the soak's: provisioner for musl,
//! built after the bootstrap and the eBPF toolchain, and checked (no failpoints).

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::step::{announce, cargo, detail, run as run_command, workspace_root};
use crate::{bootstrap, ebpf, failpoint_check};

/// The target triple of the binary to install (given explicitly so that RUSTFLAGS only reach
/// the target's crates, not build scripts and proc-macros). musl: a static musl binary starts
/// in a fraction of a glibc one's time (glibc probes the CPU caches with CPUID at every start,
/// which traps to the hypervisor in a VM: docs/benchmarks.md), and the CNI plugin mode is
/// exec'd once per ADD and DEL.
pub const RELEASE_TARGET: &str = "x86_64-unknown-linux-musl";
/// Non-PIE: no relocations to apply at exec (musl links statically by default).
const RELEASE_RUSTFLAGS: &str = "-C relocation-model=static";

/// Bootstraps, builds the eBPF object and the binary to install and measure (profile `dist`:
/// LTO, one codegen unit, static non-PIE, for musl); the binary's path.
pub fn build_dist() -> Result<PathBuf> {
    build_provisioner(
        "dist",
        "provisioner (profile dist: LTO, one codegen unit, static non-PIE, musl)",
        Some(RELEASE_RUSTFLAGS),
    )
}

/// Bootstraps and builds a plain release binary for musl (the soak's: quicker to build than
/// [`build_dist`], which the image ships and the bench and the demo run); the binary's path.
pub fn build_release() -> Result<PathBuf> {
    build_provisioner("release", "provisioner (release, musl)", None)
}

fn build_provisioner(profile: &str, what: &str, rustflags: Option<&str>) -> Result<PathBuf> {
    bootstrap::apt_packages()?;
    bootstrap::release_target(RELEASE_TARGET)?;
    ebpf::build_once_for_all()?;
    announce("build", what);
    let root = workspace_root();
    let mut build = cargo("stable");
    build
        .current_dir(&root)
        .args(["build", "--profile", profile, "-p", "provisioner", "--bin"])
        .arg("provisioner")
        .args(["--target", RELEASE_TARGET]);
    if let Some(flags) = rustflags {
        build.env("RUSTFLAGS", flags);
    }
    run_command(&mut build)?;
    let bin = root
        .join("target")
        .join(RELEASE_TARGET)
        .join(profile)
        .join("provisioner");
    if !bin.exists() {
        bail!("{} missing after the build", bin.display());
    }
    detail(&format!("binary: {}", bin.display()));
    failpoint_check::check(&bin)?;
    Ok(bin)
}
