//! Builds the eBPF programs (provisioner-ebpf, for bpfel-unknown-none) with aya-build and
//! embeds the object, so that `cargo build` alone builds everything. An object given in
//! `PROVISIONER_EBPF_OBJECT` is embedded instead, as it is (its layout is still checked at
//! load). Either way an object built from other sources than the tree's is refused: a changed
//! record layout would decode garbage.

use std::path::{Path, PathBuf};
use std::process::Command;

use provisioner_common::SOURCES_MARKER;

include!("../provisioner-common/build_support/sources_hash.rs");
include!("../provisioner-common/build_support/ebpf_toolchain.rs");

const EBPF_PACKAGE: &str = "provisioner-ebpf";

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}

/// The sources hash the object was built with, if it carries one.
fn object_sources_hash(object: &Path) -> Option<String> {
    let bytes = std::fs::read(object).ok()?;
    let at = bytes
        .windows(SOURCES_MARKER.len())
        .position(|w| w == SOURCES_MARKER)?;
    let hex = bytes.get(at + SOURCES_MARKER.len()..at + SOURCES_MARKER.len() + 16)?;
    Some(String::from_utf8_lossy(hex).into_owned())
}

/// Builds the eBPF crate into `OUT_DIR` with the toolchain `cargo xtask` bootstraps (nightly,
/// else stable with `RUSTC_BOOTSTRAP=1`) and the bpf-linker it installs; the object's path.
fn build_object(workspace: &Path) -> PathBuf {
    let list = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    let (toolchain, needs_bootstrap_env) = ebpf_toolchain_choice(&list);
    let linker_dir = tools_dir().join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![linker_dir];
    paths.extend(std::env::split_paths(&path));
    // SAFETY: a build script is single-threaded here; the variables are read by aya-build's
    // child cargo (bpf-linker from PATH, `-Z build-std` allowed on stable).
    unsafe {
        std::env::set_var(
            "PATH",
            std::env::join_paths(paths).unwrap_or_else(|_| path.clone()),
        );
        if needs_bootstrap_env {
            std::env::set_var("RUSTC_BOOTSTRAP", "1");
        }
    }
    let root_dir = workspace.join(EBPF_PACKAGE);
    let package = aya_build::Package {
        name: EBPF_PACKAGE,
        root_dir: root_dir
            .to_str()
            .unwrap_or_else(|| fail(&format!("{} is not UTF-8", root_dir.display()))),
        ..Default::default()
    };
    if let Err(err) = aya_build::build_ebpf([package], aya_build::Toolchain::Custom(toolchain)) {
        fail(&format!(
            "building the eBPF programs ({EBPF_PACKAGE}, toolchain {toolchain}) failed: \
             {err:#}.\nRun `cargo xtask build-ebpf` once: it installs what the build needs \
             (the rust-src component, bpf-linker), or point PROVISIONER_EBPF_OBJECT at a built \
             object."
        ));
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    out_dir.join(EBPF_PACKAGE)
}

fn main() {
    println!("cargo:rerun-if-env-changed=PROVISIONER_EBPF_OBJECT");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace = manifest_dir.join("..");
    let (tree, files) = ebpf_sources_hash(&workspace).unwrap_or_else(|err| {
        fail(&format!(
            "hashing the eBPF sources under {}: {err}",
            workspace.display()
        ))
    });
    for file in files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let object = match std::env::var_os("PROVISIONER_EBPF_OBJECT") {
        Some(explicit) => PathBuf::from(explicit),
        None => build_object(&workspace),
    };
    println!("cargo:rerun-if-changed={}", object.display());
    if !object.is_file() {
        fail(&format!(
            "the eBPF object {} does not exist",
            object.display()
        ));
    }
    let tree = format!("{tree:016x}");
    match object_sources_hash(&object) {
        Some(built) if built == tree => {}
        built => fail(&format!(
            "the eBPF object {} was built from other sources (hash {}) than the tree's \
             provisioner-ebpf and provisioner-common (hash {tree}): rebuild it, or unset \
             PROVISIONER_EBPF_OBJECT to build it from the tree.",
            object.display(),
            built.as_deref().unwrap_or("none"),
        )),
    }
    let object = object.canonicalize().unwrap_or(object);
    println!(
        "cargo:rustc-env=PROVISIONER_EBPF_OBJECT={}",
        object.display()
    );
}
