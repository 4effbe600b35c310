//! The bench's and the demo's network namespaces: testkit's, named `pxt<pid>-<what>` so a later
//! run can remove what a killed run left behind.

use std::path::Path;

use anyhow::{Result, bail};

/// Prefix of every namespace xtask creates.
const PREFIX: &str = "pxt";

/// A namespace `/run/netns/pxt<pid>-<what>` with `lo` up; deleted on drop.
pub struct Netns(testkit::Netns);

impl Netns {
    pub fn new(what: &str) -> Result<Self> {
        testkit::Netns::create(format!("{PREFIX}{}-{what}", std::process::id())).map(Self)
    }

    /// (An inherent method, for `Netns::name` as a function.)
    pub fn name(&self) -> &str {
        self.0.name()
    }
}

impl std::ops::Deref for Netns {
    type Target = testkit::Netns;

    fn deref(&self) -> &testkit::Netns {
        &self.0
    }
}

/// Deletes namespaces left by earlier xtask runs whose process no longer exists.
pub fn remove_stale() -> usize {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = testkit::run("ip", &["netns", "del", &name]);
            removed += 1;
        }
    }
    removed
}

/// Fails early with a clear message unless running as root.
pub fn require_root(what: &str) -> Result<()> {
    if !testkit::is_root() {
        bail!("`cargo xtask {what}` needs root (network namespaces, netlink): run it as root");
    }
    Ok(())
}
