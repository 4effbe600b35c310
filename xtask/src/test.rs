//! `cargo xtask test`: everything CI runs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::step::{announce, cargo, detail, run as run_command, workspace_root};
use crate::{bootstrap, ebpf, image, matrix};

/// Every host crate of the workspace: the default members leave out `tests` (see Cargo.toml).
const WORKSPACE: [&str; 3] = ["--workspace", "--exclude", "provisioner-ebpf"];

pub fn run(cargo_test_args: &[String], lint: bool) -> Result<()> {
    bootstrap::apt_packages()?;
    ebpf::build_once_for_all()?;
    // The image tests and the DaemonSet test run the image deploy/provisioner.yaml names.
    let archive = image::build()?;
    let root = workspace_root();
    if lint {
        announce("lint", "cargo fmt --check");
        run_command(
            cargo("stable")
                .current_dir(&root)
                .args(["fmt", "--all", "--check"]),
        )?;
        announce(
            "lint",
            "cargo clippy --all-targets --workspace -- -D warnings",
        );
        run_command(
            cargo("stable")
                .current_dir(&root)
                .args(["clippy", "--all-targets"])
                .args(WORKSPACE)
                .args(["--", "-D", "warnings"]),
        )?;
        let machete = bootstrap::cargo_machete()?;
        announce("lint", "cargo machete (no unused dependency)");
        run_command(Command::new(machete).current_dir(&root))?;
    }
    build_tests_binary()?;
    // The kernel matrix's guests (Debian's older kernels under qemu) run beside the host's
    // suite: their tests mostly wait, on deadlines stretched for software emulation.
    let kernels = matrix::start(&matrix::Options::for_the_suite())?;
    announce("test", "cargo test (needs root: namespaces, netlink, eBPF)");
    let totals = run_counting(
        cargo("stable")
            .current_dir(&root)
            .args(["test", "--no-fail-fast"])
            .args(WORKSPACE)
            .args(cargo_test_args)
            .env("PROVISIONER_IMAGE", &archive),
    )?;
    println!("tests: {} passed, {} failed", totals.passed, totals.failed);
    let kernels = kernels.finish();
    if !totals.success || totals.failed > 0 {
        bail!("{} test(s) failed", totals.failed);
    }
    if totals.passed == 0 {
        bail!("no test ran");
    }
    kernels
}

/// Builds the provisioner binary the tests exec as daemon and CNI plugin (with the
/// fault-injection feature their crash tests use); its path.
pub fn build_tests_binary() -> Result<std::path::PathBuf> {
    announce(
        "build",
        "provisioner binary (the tests exec it as daemon and CNI plugin)",
    );
    let root = workspace_root();
    run_command(cargo("stable").current_dir(&root).args([
        "build",
        "-p",
        "provisioner",
        "--bins",
        "--features",
        "fault-injection",
    ]))?;
    Ok(root.join("target/debug/provisioner"))
}

#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    success: bool,
}

/// Runs cargo test, echoing its output and adding up every `test result:` line.
fn run_counting(cmd: &mut std::process::Command) -> Result<Totals> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .context("spawn cargo test")?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    let mut totals = Totals::default();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("read cargo test output")?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            totals.passed += count(rest, "passed");
            totals.failed += count(rest, "failed");
        }
    }
    totals.success = child.wait().context("wait for cargo test")?.success();
    detail(&format!(
        "{} passed, {} failed",
        totals.passed, totals.failed
    ));
    Ok(totals)
}

/// The number before `word` in `ok. 7 passed; 0 failed; ...`.
fn count(summary: &str, word: &str) -> u64 {
    summary
        .split([';', '.'])
        .filter_map(|part| part.trim().strip_suffix(word))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}
