//! A store file that cannot be used: telling damage (the file's content or medium) from an
//! environment that refuses an operation (a full or read-only disk, permissions, process
//! limits, another daemon holding the lock), and keeping a damaged file aside (renamed, never
//! deleted) so that a new store can be started and rebuilt from the kernel.

use std::path::Path;

use redb::Database;

use super::error::IpamError;
use super::store::STORE_FILE;

/// Why `Database::create` failed: redb's error, or a panic of redb's own consistency checks
/// (debug builds assert on some damage instead of returning it).
pub(crate) enum CreateFailure {
    Redb(redb::DatabaseError),
    Panic(String),
}

impl std::fmt::Display for CreateFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateFailure::Redb(e) => write!(f, "{e}"),
            CreateFailure::Panic(msg) => write!(f, "redb failed reading the file: {msg}"),
        }
    }
}

impl CreateFailure {
    /// Whether the file itself is unusable (not a redb file, damaged, another format), as
    /// opposed to held by another process or refused by the environment (full or read-only
    /// disk, permissions, descriptors), where the file may be perfectly good.
    pub(crate) fn unusable_file(&self) -> bool {
        use redb::DatabaseError as D;
        match self {
            CreateFailure::Panic(_) => true,
            CreateFailure::Redb(D::UpgradeRequired(_)) => true,
            CreateFailure::Redb(D::Storage(e)) => storage_damage(e),
            CreateFailure::Redb(_) => false,
        }
    }

    pub(crate) fn into_error(self, path: &Path) -> IpamError {
        let source = match self {
            CreateFailure::Redb(e) => e.into(),
            CreateFailure::Panic(msg) => redb::Error::Corrupted(msg),
        };
        IpamError::StoreOpen {
            path: path.to_path_buf(),
            source: Box::new(source),
        }
    }
}

/// Whether a storage error says the file's content is damaged rather than that the
/// environment refused an operation.
fn storage_damage(e: &redb::StorageError) -> bool {
    match e {
        redb::StorageError::Corrupted(_) => true,
        redb::StorageError::Io(io) => io_damage(io),
        _ => false,
    }
}

/// An I/O error that comes from the file's content or medium (bad data, short file, EIO), not
/// from a full, read-only or forbidden filesystem or a process limit.
pub(crate) fn io_damage(io: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    if let Some(errno) = io.raw_os_error() {
        return errno == libc::EIO;
    }
    matches!(
        io.kind(),
        K::InvalidData | K::UnexpectedEof | K::InvalidInput
    )
}

/// `Database::create`, with a panic inside redb turned into an error.
pub(crate) fn create(path: &Path) -> Result<Database, CreateFailure> {
    match std::panic::catch_unwind(|| Database::create(path)) {
        Ok(created) => created.map_err(CreateFailure::Redb),
        Err(panic) => Err(CreateFailure::Panic(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panic".to_owned()),
        )),
    }
}

/// A store file moved aside.
pub(crate) struct KeptAside {
    /// For the open report: what was wrong, where the file is now.
    pub reason: String,
}

/// Renames the unusable store file `path` to `<file>.broken-<UTC time>` in `dir` (never
/// deletes it) and syncs the directory, so that a new store can be created in its place. The
/// file is kept as redb left it: an open that began a repair (after a crash) has set the
/// repair flag in its header.
pub(crate) fn keep_aside(dir: &Path, path: &Path, why: &str) -> Result<KeptAside, IpamError> {
    let err = |source| IpamError::DataDir {
        path: dir.to_path_buf(),
        source,
    };
    let stamp = utc_stamp(std::time::SystemTime::now());
    let mut aside = dir.join(format!("{STORE_FILE}.broken-{stamp}"));
    let mut n = 1;
    while aside.exists() {
        aside = dir.join(format!("{STORE_FILE}.broken-{stamp}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &aside).map_err(err)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(KeptAside {
        reason: format!(
            "store file {} could not be opened ({why}); kept aside as {}",
            path.display(),
            aside.display()
        ),
    })
}

/// `YYYYMMDDTHHMMSSZ` (RFC 3339 basic format, UTC) of `t`.
fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::ipam::{AllocationKey, Allocator, IpamConfig, RangeSets};

    fn ranges() -> RangeSets {
        IpamConfig::from_json(r#"{"subnet":"10.244.1.0/28"}"#)
            .unwrap()
            .validate()
            .unwrap()
    }

    /// A store holding three allocations (.2 .3 .4); its file's bytes.
    fn populated(dir: &Path) -> Vec<u8> {
        let (a, _) = Allocator::open(dir, "net", &ranges()).unwrap();
        for i in 0..3 {
            a.allocate(&AllocationKey::new(format!("c{i}"), "eth0"))
                .unwrap();
        }
        drop(a);
        std::fs::read(dir.join(STORE_FILE)).unwrap()
    }

    /// The files kept aside in `dir`, with their bytes.
    fn kept(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{STORE_FILE}.broken-"))
            })
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// Opens the damaged store: a fresh store, reported lost, the damaged file kept aside
    /// byte for byte.
    fn assert_recovered(dir: &Path, damaged: &[u8]) {
        let (a, report) = Allocator::open(dir, "net", &ranges()).unwrap();
        let lost = report.lost.expect("reported as lost");
        assert!(lost.contains("kept aside as"), "{lost}");
        let kept = kept(dir);
        assert_eq!(
            kept.len(),
            1,
            "{:?}",
            kept.iter().map(|k| &k.0).collect::<Vec<_>>()
        );
        assert!(lost.contains(&kept[0].0), "{lost}");
        assert_eq!(kept[0].1, damaged, "the damaged file is kept as it was");
        assert_eq!(a.count().unwrap(), 0);
        let next = a.allocate(&AllocationKey::new("c9", "eth0")).unwrap();
        assert_eq!(next.ips[0].address.ip().to_string(), "10.244.1.2");
        drop(a);
        // The new store is durable and opens cleanly: nothing more is kept aside.
        let (a, report) = Allocator::open(dir, "net", &ranges()).unwrap();
        assert!(report.lost.is_none(), "{:?}", report.lost);
        assert_eq!(a.count().unwrap(), 1);
        assert_eq!(self::kept(dir).len(), 1);
    }

    #[test]
    fn a_garbage_store_file_is_kept_aside_and_a_new_store_started() {
        let dir = tempfile::tempdir().unwrap();
        populated(dir.path());
        let garbage: Vec<u8> = (0..65_536u32).map(|i| (i * 7 + 13) as u8).collect();
        std::fs::write(dir.path().join(STORE_FILE), &garbage).unwrap();
        assert_recovered(dir.path(), &garbage);
    }

    #[test]
    fn a_truncated_store_file_is_kept_aside_and_a_new_store_started() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = populated(dir.path());
        let truncated = &bytes[..bytes.len() / 3];
        std::fs::write(dir.path().join(STORE_FILE), truncated).unwrap();
        assert_recovered(dir.path(), truncated);
    }

    #[test]
    fn a_file_held_by_another_process_is_not_damage() {
        let held = CreateFailure::Redb(redb::DatabaseError::DatabaseAlreadyOpen);
        assert!(!held.unusable_file());
        for errno in [libc::ENOSPC, libc::EROFS, libc::EACCES, libc::EMFILE] {
            let refused = CreateFailure::Redb(redb::DatabaseError::Storage(
                redb::StorageError::Io(std::io::Error::from_raw_os_error(errno)),
            ));
            assert!(!refused.unusable_file(), "errno {errno}");
        }
        let eio = CreateFailure::Redb(redb::DatabaseError::Storage(redb::StorageError::Io(
            std::io::Error::from_raw_os_error(libc::EIO),
        )));
        assert!(eio.unusable_file());
    }

    #[test]
    fn a_held_store_file_is_refused_not_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        populated(dir.path());
        let path = dir.path().join(STORE_FILE);
        // Another process's lock: redb's own open of the same file from outside the registry.
        let _other = Database::create(&path).unwrap();
        let err = Allocator::open(dir.path(), "net", &ranges())
            .err()
            .expect("refused while held");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert!(kept(dir.path()).is_empty());
    }

    #[test]
    fn the_stamp_is_utc_basic_rfc3339() {
        let at = |s| utc_stamp(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(1_796_357_700), "20261204T041500Z");
        assert_eq!(at(951_782_400), "20000229T000000Z");
        assert_eq!(at(0), "19700101T000000Z");
    }
}
