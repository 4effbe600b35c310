//! A release binary carries no fault injection: checked on the built binary itself, whichever
//! way it was built (tests/tests/integration/release_build.rs checks cargo's feature resolution).

use std::path::Path;

use anyhow::{Context, Result, bail};

/// What only the failpoint code holds: its log message when a point is reached.
const FAILPOINT_TEXT: &[u8] = b"failpoint reached: killing the process";

/// Fails when `bin` holds the failpoint code (built with provisioner's `fault-injection`).
pub fn check(bin: &Path) -> Result<()> {
    let bytes = std::fs::read(bin).with_context(|| format!("read {}", bin.display()))?;
    if bytes
        .windows(FAILPOINT_TEXT.len())
        .any(|w| w == FAILPOINT_TEXT)
    {
        bail!(
            "{} was built with fault injection (provisioner's `fault-injection` feature): a \
             release binary must not kill itself on PROVISIONER_FAILPOINT",
            bin.display()
        );
    }
    Ok(())
}
