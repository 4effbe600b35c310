//! The one error type of the IPAM module. Every variant names the object it is about (field and
//! value, store path, allocation key, range) so that a CNI error message is actionable as is.

use std::path::PathBuf;

/// Everything that can go wrong in config validation, the store or the allocator.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// A config field has an invalid value. `field` is a path such as `ranges[1][0].rangeStart`.
    #[error("invalid ipam config: {field} = {value:?}: {reason}")]
    Config {
        field: String,
        value: String,
        reason: String,
    },

    /// The network name cannot key a store.
    #[error("invalid network name {name:?}: {reason}")]
    NetworkName { name: String, reason: &'static str },

    /// The data directory could not be created or resolved.
    #[error("ipam data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The store file cannot be opened: locked by another process, refused by the environment
    /// (full or read-only disk, permissions, process limits), or a new store could not be
    /// started after a damaged one was kept aside (see [`super::damage`]).
    #[error("cannot open ipam store {path}: {source}")]
    StoreOpen {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },

    /// A store operation failed after the store was opened.
    #[error("ipam store {path}: {op}: {source}")]
    Store {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: Box<redb::Error>,
    },

    /// A commit failed (full or read-only disk, I/O error): every write is refused until the
    /// store is reopened, which the daemon does once its data dir takes writes again.
    #[error("ipam store {path}: writes refused: {reason}")]
    Unwritable { path: PathBuf, reason: String },

    /// A record in the store cannot be decoded.
    #[error("ipam store {path}: corrupt record {what}: {reason}")]
    Corrupt {
        path: PathBuf,
        what: String,
        reason: String,
    },

    /// At least one range set has no free address. Nothing was reserved.
    #[error("no IP addresses available in range set {} (for {key})", .range_sets.join("; "))]
    Exhausted {
        key: String,
        range_sets: Vec<String>,
    },
}

impl IpamError {
    /// Whether this is the store file's content being damaged (corrupt pages, bad data, EIO),
    /// as opposed to the environment refusing an operation (full or read-only disk, ...).
    #[must_use]
    pub fn is_damage(&self) -> bool {
        match self {
            IpamError::Store { source, .. } | IpamError::StoreOpen { source, .. } => {
                match source.as_ref() {
                    redb::Error::Corrupted(_) => true,
                    redb::Error::Io(io) => super::damage::io_damage(io),
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// The OS error number under a store error, if it has one (ENOSPC, EROFS, ...).
    #[must_use]
    pub fn os_error(&self) -> Option<i32> {
        match self {
            IpamError::Store { source, .. } | IpamError::StoreOpen { source, .. } => {
                match source.as_ref() {
                    redb::Error::Io(io) => io.raw_os_error(),
                    _ => None,
                }
            }
            IpamError::DataDir { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    pub(crate) fn config(
        field: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        IpamError::Config {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}
