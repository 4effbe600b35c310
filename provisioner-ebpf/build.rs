//! Records the hash of the sources this object is built from (provisioner's build compares it
//! with the tree's and refuses a stale object).

use std::path::PathBuf;

include!("../provisioner-common/build_support/sources_hash.rs");

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace = manifest_dir.parent().map(PathBuf::from).unwrap_or_default();
    match ebpf_sources_hash(&workspace) {
        Ok((hash, files)) => {
            for file in files {
                println!("cargo:rerun-if-changed={}", file.display());
            }
            println!("cargo:rustc-env=PROVISIONER_EBPF_SOURCES={hash:016x}");
        }
        Err(err) => {
            eprintln!(
                "error: hashing the eBPF sources under {}: {err}",
                workspace.display()
            );
            std::process::exit(1);
        }
    }
}
