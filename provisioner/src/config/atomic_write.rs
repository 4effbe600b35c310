//! Replacing a file atomically: readers see its old content or its new one, never a part.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The directory `path` is in (where its temporary file goes, and what is synced after the
/// rename): `.` for a bare file name.
fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Replaces `path` with `bytes` atomically, as a file of `mode`: a temp file in the same dir is
/// written with that mode (set before the rename, whatever the umask), fsynced and renamed over
/// `path`, then the dir is fsynced. Readers see the old content or the new, never a part nor a
/// file without its mode; on error the temp file is removed and `path` is untouched.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name", path.display()),
        )
    })?;
    let dir = directory_of(path);
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{}.{}.{n}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_file_goes_in_the_directory_of_the_output() {
        assert_eq!(
            directory_of(Path::new("/etc/cni/net.d/10-pod.conflist")),
            Path::new("/etc/cni/net.d")
        );
        assert_eq!(directory_of(Path::new("10-pod.conflist")), Path::new("."));
    }

    #[test]
    fn write_atomically_replaces_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.conf");
        write_atomically(&p, b"one", 0o644).unwrap();
        write_atomically(&p, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
        let e =
            write_atomically(&d.path().join("missing").join("a.conf"), b"x", 0o644).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
