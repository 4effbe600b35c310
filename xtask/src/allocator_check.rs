//! The musl build's allocator set-up, checked on the built binary. Built without its
//! constructor, mimalloc is set up by the first allocation of every mode but the CNI plugin's
//! (provisioner/src/memory/by_role.rs). Nothing else fails when that breaks: a daemon that
//! skips the set-up still works, mapping and unmapping each page of its heap one by one, and a
//! plugin that runs it pays for it on every exec.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::step::detail;

/// What mimalloc prints on stderr, with `MIMALLOC_VERBOSE=1`, once it is set up.
const SET_UP: &str = "mimalloc: process init";
/// The daemon's purge delay (by_role.rs), as mimalloc lists its options when set up.
const PURGE_AT_ONCE: &str = "option 'purge_delay': 0";

/// Fails unless `bin --version` sets mimalloc up with the daemon's options and a plugin's
/// `VERSION` does not set it up at all.
pub fn check(bin: &Path) -> Result<()> {
    let long_lived = stderr_of(bin, &["--version"], &[], "")?;
    if !long_lived.contains(SET_UP) {
        bail!(
            "{} --version did not set mimalloc up (no \"{SET_UP}\" with MIMALLOC_VERBOSE=1): \
             the daemon would run without its arenas; see provisioner/src/memory/by_role.rs. \
             stderr:\n{long_lived}",
            bin.display()
        );
    }
    if !long_lived.contains(PURGE_AT_ONCE) {
        bail!(
            "{} --version set mimalloc up without the daemon's options (no \"{PURGE_AT_ONCE}\"); \
             stderr:\n{long_lived}",
            bin.display()
        );
    }
    let plugin = stderr_of(
        bin,
        &[],
        &[("CNI_COMMAND", "VERSION")],
        r#"{"cniVersion":"1.0.0"}"#,
    )?;
    if plugin.contains(SET_UP) {
        bail!(
            "{} in CNI plugin mode set mimalloc up, which every exec of the plugin would pay \
             for; stderr:\n{plugin}",
            bin.display()
        );
    }
    detail("allocator: mimalloc set up in the daemon's modes (purge delay 0), not in the plugin's");
    Ok(())
}

/// Runs `bin` with `MIMALLOC_VERBOSE=1` and `env`, `stdin` on its standard input; its stderr.
fn stderr_of(bin: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Result<String> {
    let mut child = Command::new(bin)
        .args(args)
        .env("MIMALLOC_VERBOSE", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {}", bin.display()))?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin.as_bytes())
            .with_context(|| format!("write the standard input of {}", bin.display()))?;
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("wait for {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} {args:?} with {env:?} failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}
