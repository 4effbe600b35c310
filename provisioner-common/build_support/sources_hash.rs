// Included by the build scripts of provisioner-ebpf and provisioner (not a module of the
// library): the hash of the sources the eBPF object is built from. The object carries the hash
// its build saw; provisioner's build refuses an object whose hash is not the tree's.

/// Crate directories (relative to the workspace root) whose sources make the eBPF object.
const EBPF_SOURCE_DIRS: &[&str] = &["provisioner-ebpf", "provisioner-common"];

/// FNV-1a (64 bits) of every `.rs` file under `<crate>/src` and every `Cargo.toml` of
/// [`EBPF_SOURCE_DIRS`], in path order, paths included; and the files it read (for
/// `cargo:rerun-if-changed`).
fn ebpf_sources_hash(
    workspace: &std::path::Path,
) -> std::io::Result<(u64, Vec<std::path::PathBuf>)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    for dir in EBPF_SOURCE_DIRS {
        let root = workspace.join(dir);
        files.push(root.join("Cargo.toml"));
        walk(&root.join("src"), &mut files)?;
    }
    files.sort();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for file in &files {
        let relative = file.strip_prefix(workspace).unwrap_or(file);
        feed(relative.to_string_lossy().as_bytes());
        feed(&[0]);
        feed(&std::fs::read(file)?);
        feed(&[0]);
    }
    Ok((hash, files))
}
