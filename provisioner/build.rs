//! Embeds the eBPF object built by `cargo xtask build-ebpf`, refusing one built from other
//! sources than the tree's (a changed record layout would decode garbage).

use std::path::{Path, PathBuf};

include!("../provisioner-common/build_support/sources_hash.rs");

/// What precedes the sources hash in the object (`provisioner_common::SOURCES_MARKER`).
const SOURCES_MARKER: &[u8] = b"provisioner-src:";

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

/// Output of `git <args>` run in `dir`, trimmed; `None` outside a checkout or without git.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// `PROVISIONER_REVISION` for `provisioner_build_info`: the variable when set (a build outside
/// the checkout), else the checkout's commit, else `unknown`.
fn emit_revision(dir: &Path) {
    println!("cargo:rerun-if-env-changed=PROVISIONER_REVISION");
    let revision = std::env::var("PROVISIONER_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| {
            let commit = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
            // Rerun when HEAD moves: a commit or checkout appends to HEAD's reflog.
            for path in ["HEAD", "logs/HEAD"] {
                if let Some(file) = git(dir, &["rev-parse", "--git-path", path]) {
                    let file = dir.join(file);
                    if file.exists() {
                        println!("cargo:rerun-if-changed={}", file.display());
                    }
                }
            }
            Some(commit)
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PROVISIONER_REVISION={revision}");
}

fn main() {
    println!("cargo:rerun-if-env-changed=PROVISIONER_EBPF_OBJECT");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    emit_revision(&manifest_dir);
    let explicit = std::env::var_os("PROVISIONER_EBPF_OBJECT").map(PathBuf::from);
    let object = explicit.clone().unwrap_or_else(|| {
        manifest_dir.join("../target/ebpf/bpfel-unknown-none/release/provisioner-ebpf")
    });
    println!("cargo:rerun-if-changed={}", object.display());
    if !object.is_file() {
        fail(&format!(
            "the eBPF object {} does not exist.\n\
             Build it first with `cargo xtask build-ebpf` (it installs rust-src and bpf-linker \
             when missing), or point PROVISIONER_EBPF_OBJECT at a built object.",
            object.display()
        ));
    }
    // An object given explicitly is taken as it is (the layout is still checked at load).
    if explicit.is_none() {
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
        let tree = format!("{tree:016x}");
        match object_sources_hash(&object) {
            Some(built) if built == tree => {}
            built => fail(&format!(
                "the eBPF object {} was built from other sources (hash {}) than the tree's \
                 provisioner-ebpf and provisioner-common (hash {tree}): rebuild it with \
                 `cargo xtask build-ebpf`.",
                object.display(),
                built
                    .as_deref()
                    .unwrap_or("none: built before sources were recorded"),
            )),
        }
    }
    let object = object.canonicalize().unwrap_or(object);
    println!(
        "cargo:rustc-env=PROVISIONER_EBPF_OBJECT={}",
        object.display()
    );
}
