//! Installing what a fresh machine lacks: apt packages, the rust-src component, the release
//! build's target, bpf-linker, cargo-machete.
//! Every step is announced and skipped when its result is already present.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::step::{announce, cargo, detail, output, run};

/// The rules provisioner's build script follows too (one copy, included by both).
mod shared {
    include!("../../provisioner-common/build_support/ebpf_toolchain.rs");
}

/// bpf-linker release known to build here (see docs/contributing.md, "bpf-linker").
const BPF_LINKER_VERSION: &str = "0.13.0";

/// cargo-machete release the lint step runs (unused dependencies).
const CARGO_MACHETE_VERSION: &str = "0.9.2";

/// The toolchain that builds the eBPF crate and how to invoke it.
pub struct EbpfToolchain {
    /// rustup toolchain name, e.g. `nightly` or `stable`.
    pub name: String,
    /// True when `-Z` flags need `RUSTC_BOOTSTRAP=1` (a stable toolchain).
    pub needs_bootstrap_env: bool,
}

/// Debian packages the builds and the eBPF work need, with a file that tells whether each is
/// installed. The programs the tests run are [`testkit::tools::ALL`], each with its package.
const BUILD_PACKAGES: &[(&str, &str)] = &[
    // musl-gcc, the C compiler of the musl release build (release::RELEASE_TARGET), for a
    // dependency that compiles C there.
    ("musl-tools", "/usr/bin/musl-gcc"),
    // bpftool, to inspect the eBPF object (`cargo xtask build-ebpf` writes it to target/ebpf).
    ("bpftool", "/usr/sbin/bpftool"),
    // Probed by its doc dir: the dynamic `busybox` package also provides /bin/busybox, which
    // cannot run alone in the tests' images.
    ("busybox-static", "/usr/share/doc/busybox-static"),
];

/// Every package the builds and the tests need, with a file that tells whether it is installed.
fn test_packages() -> Vec<(&'static str, &'static str)> {
    let tools = testkit::tools::ALL.iter().map(|t| (t.package, t.path));
    BUILD_PACKAGES.iter().copied().chain(tools).collect()
}

/// Installs the Debian packages the tests need (root only).
pub fn apt_packages() -> Result<()> {
    apt_install("Debian packages for the tests", &test_packages())
}

/// Installs those of `packages` (name, a file the package installs) that are missing, as
/// `what` (root only).
pub fn apt_install(what: &str, packages: &[(&str, &str)]) -> Result<()> {
    announce("bootstrap", what);
    let mut missing: Vec<&str> = packages
        .iter()
        .filter(|(_, probe)| !Path::new(probe).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        detail("all present, skipping");
        return Ok(());
    }
    if !nix_is_root() {
        bail!(
            "missing packages {}: install them as root (apt-get install {})",
            missing.join(", "),
            missing.join(" ")
        );
    }
    detail(&format!("installing {}", missing.join(" ")));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn nix_is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}

/// Picks nightly when rustup has it, else stable with `RUSTC_BOOTSTRAP=1`.
pub fn ebpf_toolchain() -> Result<EbpfToolchain> {
    announce("bootstrap", "toolchain for the eBPF crate");
    let list = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("`rustup toolchain list` failed: rustup is required")?;
    let (name, needs_bootstrap_env) = shared::ebpf_toolchain_choice(&list);
    let toolchain = EbpfToolchain {
        name: name.into(),
        needs_bootstrap_env,
    };
    detail(&format!(
        "using {}{}",
        toolchain.name,
        if toolchain.needs_bootstrap_env {
            " with RUSTC_BOOTSTRAP=1"
        } else {
            ""
        }
    ));
    Ok(toolchain)
}

/// Adds the rust-src component (needed by `-Z build-std=core`) when missing.
pub fn rust_src(toolchain: &EbpfToolchain) -> Result<()> {
    announce(
        "bootstrap",
        &format!("rust-src component for {}", toolchain.name),
    );
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &toolchain.name,
    ]))
    .unwrap_or_default();
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        detail("present, skipping");
        return Ok(());
    }
    run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        &toolchain.name,
    ]))
}

/// Adds the standard library for `target` (the release build's) to the stable toolchain when
/// missing.
pub fn release_target(target: &str) -> Result<()> {
    announce("bootstrap", &format!("Rust standard library for {target}"));
    let installed = output(Command::new("rustup").args([
        "target",
        "list",
        "--installed",
        "--toolchain",
        "stable",
    ]))
    .unwrap_or_default();
    if installed.lines().any(|l| l.trim() == target) {
        detail("present, skipping");
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", target, "--toolchain", "stable"]))
}

/// Where provisioner keeps the tools it builds for itself.
pub fn tools_dir() -> PathBuf {
    shared::tools_dir()
}

/// Makes sure `cargo-machete` is installed; returns its path.
pub fn cargo_machete() -> Result<PathBuf> {
    announce(
        "bootstrap",
        &format!("cargo-machete {CARGO_MACHETE_VERSION}"),
    );
    let root = tools_dir();
    let bin = root.join("bin").join("cargo-machete");
    if bin.exists() {
        detail(&format!("present in {}, skipping", bin.display()));
        return Ok(bin);
    }
    // A debug build: it reads a few manifests, and builds in half the time of a release one.
    detail("building it (debug); this takes about half a minute");
    run(cargo("stable")
        .args([
            "install",
            "--debug",
            &format!("cargo-machete@{CARGO_MACHETE_VERSION}"),
            "--locked",
        ])
        .arg("--root")
        .arg(&root))?;
    Ok(bin)
}

/// Makes sure a working `bpf-linker` exists; returns the directory to put first on PATH.
///
/// A plain `cargo install bpf-linker` fails on these machines (it finds Debian's LLVM 14 and its
/// default feature wants another LLVM), so it is linked against the toolchain's own libLLVM.
pub fn bpf_linker(toolchain: &EbpfToolchain) -> Result<PathBuf> {
    announce("bootstrap", &format!("bpf-linker {BPF_LINKER_VERSION}"));
    let root = tools_dir();
    let bin = root.join("bin");
    if bin.join("bpf-linker").exists() {
        detail(&format!("present in {}, skipping", bin.display()));
        return Ok(bin);
    }
    if let Some(path) = output(Command::new("sh").args(["-c", "command -v bpf-linker"])) {
        let path = PathBuf::from(path.trim());
        detail(&format!("found {} on PATH, skipping", path.display()));
        return Ok(path.parent().map_or(bin, Path::to_path_buf));
    }
    let sysroot = output(
        Command::new("rustc")
            .arg(format!("+{}", toolchain.name))
            .args(["--print", "sysroot"]),
    )
    .context("rustc --print sysroot")?;
    let libdir = PathBuf::from(sysroot.trim()).join("lib");
    let libllvm = std::fs::read_dir(&libdir)
        .with_context(|| format!("read {}", libdir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with("libLLVM.so."))
        .with_context(|| {
            format!(
                "no libLLVM.so.* in {}: cannot link bpf-linker",
                libdir.display()
            )
        })?;
    let major = libllvm
        .trim_start_matches("libLLVM.so.")
        .split('.')
        .next()
        .unwrap_or_default()
        .to_string();
    detail(&format!(
        "building against {libllvm} (LLVM {major}); this takes about 75 s"
    ));
    let prefix = root.join("llvm");
    std::fs::create_dir_all(prefix.join("lib"))?;
    std::fs::create_dir_all(prefix.join("bin"))?;
    std::fs::copy(libdir.join(&libllvm), prefix.join("lib").join(&libllvm))
        .with_context(|| format!("copy {libllvm} into {}", prefix.display()))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&libllvm, &link)?;
    // bpf-linker's build probes llvm-config; a failing one makes it use LLVM_PREFIX alone.
    let fake_config = prefix.join("bin/llvm-config");
    std::fs::write(&fake_config, "#!/bin/sh\nexit 1\n")?;
    std::fs::set_permissions(
        &fake_config,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    run(cargo(&toolchain.name)
        .args(["install", &format!("bpf-linker@{BPF_LINKER_VERSION}")])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .arg("--root")
        .arg(&root)
        .env("LLVM_PREFIX", &prefix))?;
    Ok(bin)
}
