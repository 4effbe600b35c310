//! `cargo xtask test`: everything CI runs.

use anyhow::Result;

use crate::step::{announce, cargo, run as run_command, workspace_root};
use crate::{bootstrap, ebpf};

pub fn run(cargo_test_args: &[String], lint: bool) -> Result<()> {
    bootstrap::apt_packages()?;
    ebpf::build()?;
    let root = workspace_root();
    if lint {
        announce("lint", "cargo fmt --check");
        run_command(
            cargo("stable")
                .current_dir(&root)
                .args(["fmt", "--all", "--check"]),
        )?;
        announce("lint", "cargo clippy --all-targets -- -D warnings");
        run_command(cargo("stable").current_dir(&root).args([
            "clippy",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    announce(
        "build",
        "provisioner binary (the tests exec it as daemon and CNI plugin)",
    );
    run_command(
        cargo("stable")
            .current_dir(&root)
            .args(["build", "-p", "provisioner", "--bins"]),
    )?;
    announce("test", "cargo test (needs root: namespaces, netlink, eBPF)");
    run_command(
        cargo("stable")
            .current_dir(&root)
            .args(["test", "--no-fail-fast"])
            .args(cargo_test_args),
    )
}
