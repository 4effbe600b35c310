//! Mounting bpffs and tracefs when a fresh machine lacks them.

use std::path::Path;

use nix::mount::{MsFlags, mount};

use crate::trace::TraceError;

const TRACEFS: &str = "/sys/kernel/tracing";
const BPFFS: &str = "/sys/fs/bpf";

/// Mounts tracefs (needed to attach tracepoints) and bpffs when they are not mounted yet.
pub fn ensure_mounted() -> Result<(), TraceError> {
    if !Path::new(TRACEFS).join("events").exists() {
        tracing::info!(target = TRACEFS, "mounting tracefs");
        mount(
            Some("tracefs"),
            TRACEFS,
            Some("tracefs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| TraceError::Mount {
            fs: "tracefs",
            target: TRACEFS.into(),
            source,
        })?;
    }
    if !is_bpffs(Path::new(BPFFS)) {
        tracing::info!(target = BPFFS, "mounting bpffs");
        mount(
            Some("bpf"),
            BPFFS,
            Some("bpf"),
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| TraceError::Mount {
            fs: "bpf",
            target: BPFFS.into(),
            source,
        })?;
    }
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Whether tracefs has the tracepoint `category/name` (mounted by [`ensure_mounted`]).
pub fn has_tracepoint(category: &str, name: &str) -> bool {
    Path::new(TRACEFS)
        .join("events")
        .join(category)
        .join(name)
        .exists()
}
