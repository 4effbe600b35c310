//! Embeds the eBPF object built by `cargo xtask build-ebpf`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=PROVISIONER_EBPF_OBJECT");
    let object = std::env::var_os("PROVISIONER_EBPF_OBJECT").map_or_else(
        || {
            let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
            PathBuf::from(manifest_dir)
                .join("../target/ebpf/bpfel-unknown-none/release/provisioner-ebpf")
        },
        PathBuf::from,
    );
    println!("cargo:rerun-if-changed={}", object.display());
    if !object.is_file() {
        eprintln!(
            "error: the eBPF object {} does not exist.\n\
             Build it first with `cargo xtask build-ebpf` (it installs rust-src and bpf-linker \
             when missing), or point PROVISIONER_EBPF_OBJECT at a built object.",
            object.display()
        );
        std::process::exit(1);
    }
    let object = object.canonicalize().unwrap_or(object);
    println!(
        "cargo:rustc-env=PROVISIONER_EBPF_OBJECT={}",
        object.display()
    );
}
