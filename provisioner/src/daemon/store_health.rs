//! Whether the data dir of a store that stopped committing takes writes again: a probe file
//! next to the store, written, synced and removed. Only a probe that succeeds is worth a reopen
//! (which takes the network out of service while it runs).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Bytes the probe writes: room for a commit of the store, roughly.
const PROBE_BYTES: usize = 64 * 1024;

/// Name of the probe file next to the store file.
const PROBE_FILE: &str = "ipam.redb.probe";

/// Writes, syncs and removes a probe file in the directory of `store`.
pub async fn probe_write(store: &Path) -> std::io::Result<()> {
    let dir = store.parent().unwrap_or(Path::new(".")).to_path_buf();
    tokio::task::spawn_blocking(move || probe(&dir.join(PROBE_FILE)))
        .await
        .map_err(std::io::Error::other)?
}

fn probe(path: &PathBuf) -> std::io::Result<()> {
    let written = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| {
            file.write_all(&[0u8; PROBE_BYTES])?;
            file.sync_all()
        });
    let removed = std::fs::remove_file(path);
    written?;
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_writable_dir_passes_and_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        probe_write(&dir.path().join("ipam.redb")).await.unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_missing_dir_fails() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("gone").join("ipam.redb");
        assert!(probe_write(&store).await.is_err());
    }
}
