//! The durable store: one redb file `<data_dir>/ipam.redb` shared by every network using that
//! data dir, with five tables per network (names prefixed `ipam/<network>/`):
//!
//! | table    | key                         | value                     |
//! |----------|-----------------------------|---------------------------|
//! | `alloc`  | (container_id, ifname)      | JSON record of the ips    |
//! | `addr`   | (family 4/6, ip as u128)    | (container_id, ifname)    |
//! | `cursor` | (set index, range index)    | last address consumed     |
//! | `free`   | (set index, release seq)    | (family, ip) released     |
//! | `meta`   | name                        | bytes (`ranges`, `seq`, `boot`, `format`) |
//!
//! The `alloc` record names the pod of the allocation's latest ADD, when one was named. `meta`'s
//! `format` is the store's format: 2 since records name pods; a store without it is format 1
//! (records without a pod), stamped 2 when an allocator opens it: its records read as naming no
//! pod until their next ADD. A store of a newer format is refused.
//!
//! Every table is a B-tree, so each access is O(log n). A process keeps one `Database` per file
//! (redb locks the file), shared by all allocators of that data dir through a small registry.
//!
//! The data dir is kept 0700 and the file 0600. Once the file exists a marker file
//! ([`STORE_MARKER`]) is written next to it: a store file found missing or empty later was lost,
//! and the open report says so (the daemon then rebuilds the owners from the kernel).

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ipnetwork::IpNetwork;
use redb::{
    Database, Durability, ReadOnlyTable, ReadTransaction, ReadableDatabase, Table, TableDefinition,
    WriteTransaction,
};
use serde::{Deserialize, Serialize};

use super::allocation::{AllocatedIp, Allocation, AllocationKey};
use super::damage::{create, keep_aside};
use super::error::IpamError;
use super::range::{Family, from_u128, to_u128};
use crate::pod::Pod;

/// File name of the store inside the data dir.
pub const STORE_FILE: &str = "ipam.redb";

/// Written into the data dir once the store file exists: a missing or empty store file next to
/// it was lost (deleted, truncated), not never created.
pub const STORE_MARKER: &str = "ipam.redb.created";

pub(crate) type KeyT = (&'static str, &'static str);
pub(crate) type AddrT = (u8, u128);

pub(crate) struct Tables<'t> {
    pub alloc: Table<'t, KeyT, &'static [u8]>,
    pub addr: Table<'t, AddrT, KeyT>,
    pub cursor: Table<'t, (u32, u32), u128>,
    pub free: Table<'t, (u32, u64), AddrT>,
    pub meta: Table<'t, &'static str, &'static [u8]>,
}

struct Names {
    alloc: String,
    addr: String,
    cursor: String,
    free: String,
    meta: String,
}

pub(crate) struct Store {
    db: Arc<Database>,
    path: PathBuf,
    names: Names,
    /// Why the store file was created empty although one existed before (see [`STORE_MARKER`]).
    lost: Option<String>,
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<Database>>> {
    static STORES: OnceLock<Mutex<HashMap<PathBuf, Weak<Database>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

fn check_network(network: &str) -> Result<(), IpamError> {
    let bad = |reason| {
        Err(IpamError::NetworkName {
            name: network.to_string(),
            reason,
        })
    };
    if network.is_empty() {
        return bad("empty");
    }
    if network.len() > 200 {
        return bad("longer than 200 bytes");
    }
    if network.chars().any(|c| c.is_control() || c == '/') {
        return bad("contains '/' or a control character");
    }
    Ok(())
}

impl Store {
    /// Opens (creating if missing) the store of `network` under `data_dir`. The data dir is
    /// made 0700 and the store file 0600, also when they already exist.
    pub fn open(data_dir: &Path, network: &str) -> Result<Store, IpamError> {
        check_network(network)?;
        let dir_err = |source| IpamError::DataDir {
            path: data_dir.to_path_buf(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(data_dir)
            .map_err(dir_err)?;
        let dir = data_dir.canonicalize().map_err(dir_err)?;
        set_mode(&dir, 0o700).map_err(dir_err)?;
        let path = dir.join(STORE_FILE);
        let mut lost = None;
        let db = {
            // Poisoning only means another thread panicked while opening; the map is still valid.
            let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
            match reg.get(&path).and_then(Weak::upgrade) {
                Some(db) => db,
                None => {
                    lost = lost_store(&dir, &path);
                    let db = match create(&path) {
                        Ok(db) => db,
                        Err(failure) if failure.unusable_file() => {
                            let aside = keep_aside(&dir, &path, &failure.to_string())?;
                            lost = Some(aside.reason);
                            create(&path).map_err(|f| f.into_error(&path))?
                        }
                        Err(failure) => return Err(failure.into_error(&path)),
                    };
                    let db = Arc::new(db);
                    make_private(&dir, &path)?;
                    reg.retain(|_, w| w.strong_count() > 0);
                    reg.insert(path.clone(), Arc::downgrade(&db));
                    db
                }
            }
        };
        let p = format!("ipam/{network}/");
        Ok(Store {
            db,
            path,
            names: Names {
                alloc: format!("{p}alloc"),
                addr: format!("{p}addr"),
                cursor: format!("{p}cursor"),
                free: format!("{p}free"),
                meta: format!("{p}meta"),
            },
            lost,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same store, reported as lost for `reason` (its predecessor was kept aside).
    pub fn with_lost(mut self, reason: String) -> Self {
        self.lost = Some(reason);
        self
    }

    /// Why the store file was created empty although one existed before, if it was.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// Maps any redb error to [`IpamError::Store`] naming the file and the operation.
    pub fn err<E: Into<redb::Error>>(&self, op: &'static str) -> impl FnOnce(E) -> IpamError + '_ {
        move |e| IpamError::Store {
            path: self.path.clone(),
            op,
            source: Box::new(e.into()),
        }
    }

    pub fn corrupt(&self, what: impl Into<String>, reason: impl Into<String>) -> IpamError {
        IpamError::Corrupt {
            path: self.path.clone(),
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// A write transaction whose commit returns only once it is on disk (fsync).
    pub fn begin_write(&self) -> Result<WriteTransaction, IpamError> {
        let mut txn = self.db.begin_write().map_err(self.err("begin write"))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| self.corrupt("durability", e.to_string()))?;
        Ok(txn)
    }

    pub fn tables<'t>(&self, txn: &'t WriteTransaction) -> Result<Tables<'t>, IpamError> {
        let n = &self.names;
        Ok(Tables {
            alloc: txn
                .open_table(TableDefinition::new(&n.alloc))
                .map_err(self.err("open table"))?,
            addr: txn
                .open_table(TableDefinition::new(&n.addr))
                .map_err(self.err("open table"))?,
            cursor: txn
                .open_table(TableDefinition::new(&n.cursor))
                .map_err(self.err("open table"))?,
            free: txn
                .open_table(TableDefinition::new(&n.free))
                .map_err(self.err("open table"))?,
            meta: txn
                .open_table(TableDefinition::new(&n.meta))
                .map_err(self.err("open table"))?,
        })
    }

    /// Drops the cursor and free-list tables (used when the range config changed).
    pub fn reset_cursors(&self, txn: &WriteTransaction) -> Result<(), IpamError> {
        let n = &self.names;
        let c: TableDefinition<(u32, u32), u128> = TableDefinition::new(&n.cursor);
        let f: TableDefinition<(u32, u64), AddrT> = TableDefinition::new(&n.free);
        txn.delete_table(c).map_err(self.err("reset cursors"))?;
        txn.delete_table(f).map_err(self.err("reset free list"))?;
        Ok(())
    }

    pub fn commit(&self, txn: WriteTransaction) -> Result<(), IpamError> {
        txn.commit().map_err(self.err("commit"))
    }

    pub fn begin_read(&self) -> Result<ReadTransaction, IpamError> {
        self.db.begin_read().map_err(self.err("begin read"))
    }

    pub fn read_alloc(
        &self,
        txn: &ReadTransaction,
    ) -> Result<ReadOnlyTable<KeyT, &'static [u8]>, IpamError> {
        txn.open_table(TableDefinition::new(&self.names.alloc))
            .map_err(self.err("open table"))
    }

    pub fn read_addr(
        &self,
        txn: &ReadTransaction,
    ) -> Result<ReadOnlyTable<AddrT, KeyT>, IpamError> {
        txn.open_table(TableDefinition::new(&self.names.addr))
            .map_err(self.err("open table"))
    }
}

/// Whether the store file at `path` is missing or empty while the marker in `dir` says it had
/// been created: the reason, for the open report.
fn lost_store(dir: &Path, path: &Path) -> Option<String> {
    let marker = dir.join(STORE_MARKER);
    let len = match std::fs::metadata(path) {
        Ok(meta) => Some(meta.len()),
        Err(_) => None,
    };
    if len.is_some_and(|n| n > 0) || !marker.exists() {
        return None;
    }
    Some(format!(
        "store file {} is {} although {} shows it was created before",
        path.display(),
        if len.is_some() { "empty" } else { "missing" },
        marker.display()
    ))
}

/// Sets the permission bits of `path` to `mode` unless they are already (a read-only data dir
/// that is already private is no error here: the store's own open says what fails).
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    if std::fs::metadata(path)?.permissions().mode() & 0o7777 == mode {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Store file 0600; the marker written (and synced with its directory) once the file exists.
fn make_private(dir: &Path, path: &Path) -> Result<(), IpamError> {
    let err = |source| IpamError::DataDir {
        path: dir.to_path_buf(),
        source,
    };
    set_mode(path, 0o600).map_err(err)?;
    let marker = dir.join(STORE_MARKER);
    if !marker.exists() {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&marker)
            .map_err(err)?;
        file.sync_all().map_err(err)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
    }
    Ok(())
}

pub(crate) fn addr_key(ip: IpAddr) -> AddrT {
    (Family::of(ip).code(), to_u128(ip))
}

pub(crate) fn addr_from_key(key: AddrT) -> Option<IpAddr> {
    from_u128(Family::from_code(key.0)?, key.1)
}

/// The allocation record (the `alloc` table's value). Format 1 had `ips` only; a format-1
/// record decodes with no pod.
#[derive(Serialize, Deserialize)]
struct Record {
    ips: Vec<RecordIp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod: Option<Pod>,
}

#[derive(Serialize, Deserialize)]
struct RecordIp {
    address: String,
    gateway: String,
}

pub(crate) fn encode(ips: &[AllocatedIp], pod: Option<&Pod>) -> Vec<u8> {
    let rec = Record {
        pod: pod.cloned(),
        ips: ips
            .iter()
            .map(|ip| RecordIp {
                address: ip.address.to_string(),
                gateway: ip.gateway.to_string(),
            })
            .collect(),
    };
    // Serialising plain strings and options of them into a Vec cannot fail.
    serde_json::to_vec(&rec).unwrap_or_default()
}

pub(crate) fn decode(key: AllocationKey, bytes: &[u8]) -> Result<Allocation, String> {
    let rec: Record = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let ips = rec
        .ips
        .into_iter()
        .map(|r| {
            Ok(AllocatedIp {
                address: r
                    .address
                    .parse::<IpNetwork>()
                    .map_err(|e| format!("address {:?}: {e}", r.address))?,
                gateway: r
                    .gateway
                    .parse::<IpAddr>()
                    .map_err(|e| format!("gateway {:?}: {e}", r.gateway))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Allocation {
        key,
        ips,
        pod: rec.pod,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::ipam::allocator::tests::{key, open};

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("metadata").mode() & 0o7777
    }

    #[test]
    fn network_names_are_checked_before_the_store_is_touched() {
        let refused = |name: &str| match check_network(name) {
            Err(IpamError::NetworkName { reason, .. }) => reason,
            other => panic!("{name:?}: {other:?}"),
        };
        assert_eq!(refused(""), "empty");
        assert!(check_network(&"n".repeat(200)).is_ok(), "200 bytes");
        assert_eq!(refused(&"n".repeat(201)), "longer than 200 bytes");
        for name in ["pods/a", "pods\n", "a\u{7}b"] {
            assert_eq!(refused(name), "contains '/' or a control character");
        }
        assert!(check_network("pod-network").is_ok());
        let dir = tempfile::tempdir().expect("dir");
        let data = dir.path().join("data");
        assert!(Store::open(&data, "a/b").is_err());
        assert!(!data.exists(), "nothing created for a refused name");
    }

    #[test]
    fn the_stores_of_one_file_share_its_database_which_is_forgotten_once_unused() {
        let dirs: Vec<tempfile::TempDir> =
            (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
        let path = |i: usize| {
            dirs[i]
                .path()
                .canonicalize()
                .expect("canonical")
                .join(STORE_FILE)
        };
        // redb opens a file once per process: a second network on it shares the database.
        let a = Store::open(dirs[0].path(), "a").expect("first network");
        // Opening another file forgets the unused databases, not this one.
        let other = Store::open(dirs[1].path(), "a").expect("another file");
        let b = Store::open(dirs[0].path(), "b").expect("second network of the first file");
        assert!(Arc::ptr_eq(&a.db, &b.db));
        assert!(!Arc::ptr_eq(&a.db, &other.db));
        drop((a, b, other));
        let _next = Store::open(dirs[2].path(), "a").expect("a third file");
        let registry = registry().lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            !registry.contains_key(&path(0)),
            "an unused database is forgotten"
        );
        assert!(registry.contains_key(&path(2)));
    }

    #[test]
    fn the_data_dir_and_the_store_file_are_made_private_and_marked() {
        let dir = tempfile::tempdir().expect("dir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("data dir");
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let store = Store::open(&data, "pods").expect("open");
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(store.path()), 0o600);
        assert!(data.join(STORE_MARKER).is_file(), "the marker");
        assert_eq!(mode(&data.join(STORE_MARKER)), 0o600);
    }

    /// A mode already right is not set again: on a read-only file system that would fail.
    #[test]
    fn a_mode_already_right_is_left_alone() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let mut inotify = inotify::Inotify::init().expect("inotify");
        inotify
            .watches()
            .add(dir.path(), inotify::WatchMask::ATTRIB)
            .expect("watch");
        let mut buffer = [0u8; 1024];
        let attribs =
            |inotify: &mut inotify::Inotify, buffer: &mut [u8]| match inotify.read_events(buffer) {
                Ok(events) => events.count(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
                Err(e) => panic!("read inotify: {e}"),
            };
        set_mode(dir.path(), 0o700).expect("set_mode");
        assert_eq!(
            attribs(&mut inotify, &mut buffer),
            0,
            "chmod'ed though 0700"
        );
        set_mode(dir.path(), 0o750).expect("set_mode");
        assert_eq!(mode(dir.path()), 0o750);
        assert_eq!(attribs(&mut inotify, &mut buffer), 1, "not chmod'ed");
    }

    #[test]
    fn a_store_file_gone_or_emptied_once_marked_is_reported_lost() {
        let dir = tempfile::tempdir().expect("dir");
        let lost = || -> Option<String> {
            let store = Store::open(dir.path(), "pods").expect("open");
            store.lost().map(str::to_owned)
        };
        assert_eq!(lost(), None, "a new store");
        let file = dir.path().canonicalize().expect("dir").join(STORE_FILE);
        assert_eq!(lost(), None, "reopened");
        std::fs::remove_file(&file).expect("delete the store file");
        let missing = lost().expect("a deleted store file is lost");
        assert!(missing.contains(" is missing although "), "{missing}");
        assert!(missing.contains(STORE_MARKER), "{missing}");
        std::fs::File::create(&file).expect("empty the store file");
        let empty = lost().expect("an emptied store file is lost");
        assert!(empty.contains(" is empty although "), "{empty}");
        // Without the marker, a missing file was never created: nothing lost.
        let fresh = tempfile::tempdir().expect("dir");
        std::fs::write(fresh.path().join(STORE_FILE), b"").expect("an empty file");
        assert_eq!(
            Store::open(fresh.path(), "pods").expect("open").lost(),
            None
        );
    }

    /// Cursors and free lists are kept per (set, range) position: a changed range config
    /// starts them afresh, and allocation begins again at the first free address.
    #[test]
    fn a_changed_range_config_starts_allocation_afresh() {
        let dir = tempfile::tempdir().expect("dir");
        let first = open(dir.path(), r#"{"subnet":"10.244.1.0/28"}"#);
        for i in 1..=3 {
            first.allocate(&key(i)).expect("allocate");
        }
        first.release(&key(2)).expect("release .3");
        drop(first);
        let second = open(dir.path(), r#"{"subnet":"10.244.1.0/27"}"#);
        let next = second.allocate(&key(4)).expect("allocate");
        assert_eq!(next.ips[0].address.ip().to_string(), "10.244.1.3");
    }
}
