// Included by provisioner's build script and by xtask (not a module of the library): where the
// bootstrap keeps the tools it builds (bpf-linker), and which toolchain builds the eBPF crate.

/// Where `cargo xtask` installs bpf-linker and other tools (`<dir>/bin`):
/// `$XDG_CACHE_HOME/provisioner-tools`, else `~/.cache/provisioner-tools`.
pub fn tools_dir() -> std::path::PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| std::path::PathBuf::from("/var/cache"));
    cache.join("provisioner-tools")
}

/// The rustup toolchain that builds the eBPF crate (`-Z build-std=core` needs an unstable
/// cargo): `nightly` when rustup has it, else `stable`, which then needs `RUSTC_BOOTSTRAP=1`
/// (the bool).
pub fn ebpf_toolchain_choice(rustup_toolchain_list: &str) -> (&'static str, bool) {
    if rustup_toolchain_list
        .lines()
        .any(|l| l.starts_with("nightly"))
    {
        ("nightly", false)
    } else {
        ("stable", true)
    }
}
