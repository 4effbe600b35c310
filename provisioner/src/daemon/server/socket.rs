//! The API socket's file: bound root-only in a directory no one else may write to, and removed
//! at shutdown only while it is still the one bound here.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tokio::net::UnixListener;

/// The socket file this daemon bound, told apart from one bound later at the same path (by a
/// successor started while this one drains) by its device and inode.
pub(super) struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    pub(super) fn remove_if_ours(&self) {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => {
                if let Err(err) = std::fs::remove_file(&self.path) {
                    tracing::warn!(socket = %self.path.display(), error = %err, "remove the API socket");
                }
            }
            Ok(_) => tracing::info!(
                socket = %self.path.display(),
                "the API socket's path now belongs to another daemon: left in place"
            ),
            Err(_) => {}
        }
    }
}

/// Binds the socket root-only (0600, in a directory only its owner may enter), replacing a
/// stale socket file.
pub(super) fn bind(path: &Path) -> Result<(UnixListener, SocketFile)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        private_dir(dir)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("another daemon is listening on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("remove stale {}", path.display()))?;
    }
    // No umask change (other threads run): the directory keeps everyone else out until the
    // socket's own mode is set.
    let listener = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("inspect the bound socket {}", path.display()))?;
    let file = SocketFile {
        path: path.to_path_buf(),
        dev: std::os::unix::fs::MetadataExt::dev(&meta),
        ino: std::os::unix::fs::MetadataExt::ino(&meta),
    };
    Ok((listener, file))
}

/// Creates `dir` 0700, or checks an existing one: a directory owned by the daemon's user
/// that no one else may write to (else another user could replace the socket).
fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("create socket directory {}", dir.display()))?;
            // The mode given to mkdir is cut by the umask; make it exactly 0700.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("chmod 0700 {}", dir.display()))
        }
        Err(err) => Err(err).with_context(|| format!("inspect socket directory {}", dir.display())),
        Ok(meta) => {
            let me = nix::unistd::geteuid().as_raw();
            let refuse = |why: String| {
                anyhow::anyhow!(
                    "socket directory {} {why}: refusing to put the API socket there (it must \
                     be a directory owned by uid {me} that no one else may write to)",
                    dir.display()
                )
            };
            if !meta.is_dir() {
                return Err(refuse("is not a directory".to_owned()));
            }
            if meta.uid() != me {
                return Err(refuse(format!("is owned by uid {}", meta.uid())));
            }
            if meta.mode() & 0o022 != 0 {
                return Err(refuse(format!(
                    "is group- or world-writable (mode {:04o})",
                    meta.mode() & 0o7777
                )));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn a_missing_socket_directory_is_created_0700() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("run").join("provisioner");
        private_dir(&dir).expect("created");
        let meta = std::fs::metadata(&dir).expect("exists");
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o7777, 0o700);
        // And accepted as it is on the next start.
        private_dir(&dir).expect("accepted");
    }

    #[test]
    fn a_socket_directory_others_may_write_to_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        for mode in [0o777, 0o1777, 0o770, 0o722] {
            std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(mode))
                .expect("chmod");
            let e = private_dir(root.path()).expect_err("writable by others");
            let msg = e.to_string();
            assert!(msg.contains("group- or world-writable"), "{mode:o}: {msg}");
            assert!(msg.contains(&root.path().display().to_string()), "{msg}");
        }
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        private_dir(root.path()).expect("0755 owned by us is fine");
    }

    #[test]
    fn a_socket_directory_of_another_user_or_a_file_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let file = root.path().join("file");
        std::fs::write(&file, b"").expect("write");
        let e = private_dir(&file).expect_err("a file");
        assert!(e.to_string().contains("is not a directory"), "{e}");
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(4242)), None).expect("chown");
        let e = private_dir(&theirs).expect_err("owned by another user");
        assert!(e.to_string().contains("is owned by uid 4242"), "{e}");
    }
}
