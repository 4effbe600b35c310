//! Building the eBPF crate for bpfel-unknown-none.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::bootstrap;
use crate::step::{announce, cargo, detail, run, workspace_root};

/// Where the eBPF object lands; provisioner's build.rs reads it from here.
pub fn object_path() -> PathBuf {
    workspace_root().join("target/ebpf/bpfel-unknown-none/release/provisioner-ebpf")
}

/// Bootstraps the toolchain pieces and builds the eBPF object; returns its path.
pub fn build() -> Result<PathBuf> {
    let toolchain = bootstrap::ebpf_toolchain()?;
    bootstrap::rust_src(&toolchain)?;
    let linker_dir = bootstrap::bpf_linker(&toolchain)?;
    announce(
        "build",
        "eBPF programs (provisioner-ebpf, bpfel-unknown-none)",
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![linker_dir];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = cargo(&toolchain.name);
    cmd.current_dir(workspace_root())
        .args(["build", "--release", "-p", "provisioner-ebpf"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .env("CARGO_TARGET_DIR", workspace_root().join("target/ebpf"))
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf")
        .env("PATH", std::env::join_paths(paths).context("PATH")?);
    if toolchain.needs_bootstrap_env {
        cmd.env("RUSTC_BOOTSTRAP", "1");
    }
    run(&mut cmd)?;
    let object = object_path();
    detail(&format!("object: {}", object.display()));
    Ok(object)
}
