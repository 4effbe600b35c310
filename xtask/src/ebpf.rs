//! What building the eBPF crate (for bpfel-unknown-none) needs. provisioner's build script
//! builds the object itself (aya-build) with what [`prepare`] installs; [`build`] also builds
//! one into `target/ebpf/` to inspect (bpftool) or to hand over in `PROVISIONER_EBPF_OBJECT`,
//! which is how the builds of one xtask run share it ([`build_once_for_all`]).

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::bootstrap;
use crate::step::{announce, cargo, detail, run, workspace_root};

/// Where [`build`] puts the object.
pub fn object_path() -> PathBuf {
    workspace_root().join("target/ebpf/bpfel-unknown-none/release/provisioner-ebpf")
}

/// Installs what provisioner's build script needs to build the eBPF programs (the rust-src
/// component of the toolchain it uses, bpf-linker); the toolchain and bpf-linker's directory.
pub fn prepare() -> Result<(bootstrap::EbpfToolchain, PathBuf)> {
    let toolchain = bootstrap::ebpf_toolchain()?;
    bootstrap::rust_src(&toolchain)?;
    let linker_dir = bootstrap::bpf_linker(&toolchain)?;
    Ok((toolchain, linker_dir))
}

/// [`build`]s the object and has every later cargo build of this xtask run embed it.
pub fn build_once_for_all() -> Result<()> {
    if crate::step::shared_ebpf_object().is_some() {
        return Ok(());
    }
    let object = build()?;
    crate::step::embed_ebpf_object(object);
    Ok(())
}

/// [`prepare`]s and builds the eBPF object into [`object_path`]; returns its path.
pub fn build() -> Result<PathBuf> {
    let (toolchain, linker_dir) = prepare()?;
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
