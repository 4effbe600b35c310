//! The musl build's allocator set-up, checked on the built binary. Built without its
//! constructor, mimalloc is set up by the first allocation of every mode but the CNI plugin's
//! (provisioner/src/memory/by_role.rs). Nothing else fails when that breaks: a daemon that
//! skips the set-up still works, mapping and unmapping each page of its heap one by one, and a
//! plugin that runs it pays for it on every exec.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use testkit::cni::{self, run_with_stdin};

use crate::step::detail;

/// What mimalloc prints on stderr, with `MIMALLOC_VERBOSE=1`, once it is set up.
const SET_UP: &str = "mimalloc: process init";
/// The daemon's purge delay (by_role.rs, `PURGE_DELAY_MS`), as mimalloc lists its options
/// when set up.
const DAEMON_PURGE_DELAY: &str = "option 'purge_delay': 200";

/// Fails unless `bin --version` sets mimalloc up with the daemon's options and a plugin's
/// `VERSION` does not set it up at all.
pub fn check(bin: &Path) -> Result<()> {
    let mut version = Command::new(bin);
    version.arg("--version");
    let long_lived =
        stderr_of(version, "").with_context(|| format!("{} --version", bin.display()))?;
    if !long_lived.contains(SET_UP) {
        bail!(
            "{} --version did not set mimalloc up (no \"{SET_UP}\" with MIMALLOC_VERBOSE=1): \
             the daemon would run without its arenas; see provisioner/src/memory/by_role.rs. \
             stderr:\n{long_lived}",
            bin.display()
        );
    }
    if !long_lived.contains(DAEMON_PURGE_DELAY) {
        bail!(
            "{} --version set mimalloc up without the daemon's options (no \"{DAEMON_PURGE_DELAY}\"); \
             stderr:\n{long_lived}",
            bin.display()
        );
    }
    let plugin = stderr_of(
        cni::command(bin, "VERSION", "", None, "", ""),
        r#"{"cniVersion":"1.0.0"}"#,
    )
    .with_context(|| format!("{} in CNI plugin mode, VERSION", bin.display()))?;
    if plugin.contains(SET_UP) {
        bail!(
            "{} in CNI plugin mode set mimalloc up, which every exec of the plugin would pay \
             for; stderr:\n{plugin}",
            bin.display()
        );
    }
    detail(
        "allocator: mimalloc set up in the daemon's modes (purge delay 200 ms), not in the plugin's",
    );
    Ok(())
}

/// Runs `cmd` with `MIMALLOC_VERBOSE=1`, `stdin` on its standard input; its stderr.
fn stderr_of(mut cmd: Command, stdin: &str) -> Result<String> {
    cmd.env("MIMALLOC_VERBOSE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let run = run_with_stdin(cmd, stdin.as_bytes())?;
    if run.code != 0 {
        bail!("exit code {}: {}", run.code, run.stderr);
    }
    Ok(run.stderr)
}
