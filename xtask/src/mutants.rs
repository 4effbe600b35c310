//! `cargo xtask mutants`: mutation testing (cargo-mutants) of the modules whose unit tests run
//! without root, so a mutant that survives points at a unit test that is missing or too weak.
//! docs/testing.md says how to read the result.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::step::{announce, detail, output, run as run_command, workspace_root};

/// The modules examined when no `--file` is given.
pub const MODULES: &[&str] = &[
    "provisioner/src/cni/*.rs",
    "provisioner/src/config/*.rs",
    "provisioner/src/config/template/*.rs",
    "provisioner/src/ipam/range.rs",
    "provisioner/src/ipam/config.rs",
    "provisioner/src/ipam/store.rs",
    "provisioner/src/trace/kernel/netlink_parse.rs",
    "provisioner/src/trace/verdict.rs",
    "provisioner/src/trace/kernel/events.rs",
    "provisioner/src/trace/correlator/pods.rs",
    "provisioner/src/daemon/why.rs",
    "provisioner/src/runtime/resolver.rs",
];

/// cargo-mutants release known to work here.
const CARGO_MUTANTS_VERSION: &str = "27.1.0";

pub struct Options {
    /// Globs of files to mutate (workspace-relative); empty: [`MODULES`].
    pub files: Vec<String>,
    /// Upper bound on one mutant's build + test, in seconds.
    pub timeout: u64,
    /// Mutants built and tested at once.
    pub jobs: usize,
    /// Passed to cargo-mutants as they are.
    pub extra: Vec<String>,
}

pub fn run(opts: &Options) -> Result<()> {
    let root = workspace_root();
    install()?;
    let mold = install_mold();
    let object = crate::ebpf::object_path();
    if !object.is_file() {
        bail!(
            "{} is missing: run `cargo xtask build-ebpf` first (the library embeds it)",
            object.display()
        );
    }
    let out = root.join("target/mutants");
    let files: Vec<&str> = if opts.files.is_empty() {
        MODULES.to_vec()
    } else {
        opts.files.iter().map(String::as_str).collect()
    };
    announce(
        "mutants",
        &format!("{} (results in {})", files.join(" "), out.display()),
    );
    let mut cmd = mutants_command(&root, &object, &out, opts, mold);
    for file in &files {
        cmd.arg("--file").arg(file);
    }
    // Only the unit tests, built and run: the integration tests need root and take minutes
    // each, and building the binary's test target too would only cost time.
    cmd.arg("--cargo-arg=--lib").args(&opts.extra);
    let status = cmd.status().context("run cargo mutants")?;
    let lists = out.join("mutants.out");
    detail(&format!(
        "lists of caught, missed, timeout, unviable mutants: {}/*.txt",
        lists.display()
    ));
    // cargo-mutants' exit codes: 2 = some mutants missed, 3 = some timed out.
    match status.code() {
        Some(0) => Ok(()),
        Some(2) => bail!(
            "mutants survived: see {} (docs/testing.md says how to read it)",
            lists.join("missed.txt").display()
        ),
        Some(3) => bail!(
            "mutants timed out: see {}",
            lists.join("timeout.txt").display()
        ),
        _ => bail!(
            "cargo mutants failed ({status}): see {}",
            lists.join("debug.log").display()
        ),
    }
}

/// cargo-mutants on the provisioner package: a copy of the tree (the worktree is never
/// mutated), one mutant at a time by default, builds shared in target/mutants-build so a second
/// run does not rebuild every dependency.
///
/// Each mutant rebuilds and links the unit-test binary; without debuginfo and with mold (when
/// present) that costs about 3 s instead of 5 here (docs/testing.md).
fn mutants_command(root: &Path, object: &Path, out: &Path, opts: &Options, mold: bool) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args(["mutants", "--package", "provisioner", "--no-shuffle"])
        .arg("--timeout")
        .arg(opts.timeout.to_string())
        .arg("--jobs")
        .arg(opts.jobs.to_string())
        .arg("--output")
        .arg(out)
        // The copy has no target/: its build script finds the eBPF object through this.
        .env("PROVISIONER_EBPF_OBJECT", object)
        .env("CARGO_TARGET_DIR", root.join("target/mutants-build"))
        .env("CARGO_PROFILE_DEV_DEBUG", "0");
    if mold {
        let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
        if !flags.is_empty() {
            flags.push(' ');
        }
        flags.push_str("-C link-arg=-fuse-ld=mold");
        cmd.env("RUSTFLAGS", flags);
    }
    cmd
}

/// Installs the mold linker from Debian when it is missing; true when it can be used. Only a
/// speed-up: without it (not root, no apt) the default linker is used.
fn install_mold() -> bool {
    let present = || output(Command::new("mold").arg("--version")).is_some();
    if present() {
        return true;
    }
    announce(
        "mutants",
        "install the mold linker (links each mutant faster)",
    );
    let installed = run_command(Command::new("apt-get").args(["update", "-qq"])).and_then(|()| {
        run_command(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends", "mold"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    });
    match installed {
        Ok(()) if present() => true,
        Ok(()) => {
            detail("mold installed but does not run: using the default linker");
            false
        }
        Err(e) => {
            detail(&format!("{e:#}: using the default linker"));
            false
        }
    }
}

/// Installs cargo-mutants from crates.io when `cargo mutants` is missing.
fn install() -> Result<()> {
    if output(Command::new("cargo").args(["mutants", "--version"])).is_some() {
        return Ok(());
    }
    announce(
        "mutants",
        &format!("install cargo-mutants {CARGO_MUTANTS_VERSION}"),
    );
    run_command(Command::new("cargo").args([
        "install",
        "--locked",
        "--version",
        CARGO_MUTANTS_VERSION,
        "cargo-mutants",
    ]))
}
