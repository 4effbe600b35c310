//! A release binary has no fault-injection code, whichever way it is built: the `tests` crate
//! enables provisioner's `fault-injection` feature, and cargo unifies features across the
//! packages it builds, so `tests` must not be among the packages a plain build selects.
//! `cargo tree -e features` runs cargo's own feature resolution without building anything.

use std::path::Path;
use std::process::Command;

const FEATURE: &str = "feature \"fault-injection\"";

/// The `cargo tree -e features` lines of a build selecting `packages` (none: the default
/// members, as `cargo build --release` at the root selects them).
fn feature_tree(packages: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["tree", "-e", "features", "--prefix", "none", "--locked"]);
    for package in packages {
        cmd.args(["-p", package]);
    }
    let out = cmd.output().expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {packages:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_plain_release_build_has_no_failpoints() {
    for packages in [&[][..], &["provisioner"]] {
        let tree = feature_tree(packages);
        assert!(
            tree.lines().any(|l| l.starts_with("provisioner v")),
            "cargo tree {packages:?} does not build provisioner:\n{tree}"
        );
        let with_failpoints: Vec<&str> = tree.lines().filter(|l| l.contains(FEATURE)).collect();
        assert!(
            with_failpoints.is_empty(),
            "a build of {packages:?} enables fault-injection: {with_failpoints:?}"
        );
    }
    // The check above can fail: the test crate's own build does enable the feature.
    let tests = feature_tree(&["provisioner-tests"]);
    assert!(
        tests.lines().any(|l| l.contains(FEATURE)),
        "the tests crate no longer enables fault-injection?\n{tests}"
    );
}
