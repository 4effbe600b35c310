//! What opening a store finds: its meta (range fingerprint, boot id, format) checked and
//! stamped, and its allocations surveyed into an [`OpenReport`].

use std::path::PathBuf;

use redb::ReadableTable;

use crate::ipam::allocation::{Allocation, AllocationKey};
use crate::ipam::error::IpamError;
use crate::ipam::range::RangeSets;
use crate::ipam::store::{Store, Tables, decode};

const META_RANGES: &str = "ranges";
/// The kernel's boot id when the store was last opened.
const META_BOOT: &str = "boot";
/// The store's format, a decimal number. A store without it is format 1 (records without a
/// pod); format 2 records may name the pod.
const META_FORMAT: &str = "format";
/// The format this allocator writes.
pub const STORE_FORMAT: u32 = 2;

/// A record that cannot be decoded: its key and why.
pub type Unreadable = (AllocationKey, String);

/// What [`Allocator::open`] found in the store.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    /// The store file.
    pub path: PathBuf,
    /// Number of allocations restored.
    pub allocations: usize,
    /// The range config differs from the one the store was last opened with.
    pub ranges_changed: bool,
    /// Allocations holding an address outside every current range (or equal to a gateway).
    /// They stay reserved and can be released by key; they are never reused or dropped silently.
    pub out_of_range: Vec<Allocation>,
    /// Allocations without an address for some current range set (e.g. a v6 set was added).
    /// `allocate` returns them as they are; release and allocate again to complete them.
    pub incomplete: Vec<Allocation>,
    /// Records that cannot be decoded, with the reason. Their addresses stay reserved.
    pub unreadable: Vec<(AllocationKey, String)>,
    /// Why the store file was created empty although one existed before (deleted or
    /// truncated): its allocations must be rebuilt from the kernel.
    pub lost: Option<String>,
    /// The node has not rebooted since the store was last opened (same kernel boot id), so a
    /// sandbox of the store whose veth is gone did not vanish with a reboot.
    pub same_boot: bool,
    /// The format the store was in when it was opened in an older one and migrated to
    /// [`STORE_FORMAT`]; its allocations name no pod until their next ADD.
    pub migrated_from: Option<u32>,
}

/// The kernel's boot id (changes with every boot), if readable.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Records the range fingerprint (resetting cursors when it changed) and builds the report.
pub(super) fn check_store(
    store: &Store,
    network: &str,
    ranges: &RangeSets,
) -> Result<OpenReport, IpamError> {
    let mut report = OpenReport {
        path: store.path().to_path_buf(),
        lost: store.lost().map(str::to_owned),
        ..OpenReport::default()
    };
    let fingerprint = ranges.fingerprint();
    let boot = boot_id();
    let txn = store.begin_write()?;
    let stamp_format = read_meta(
        store,
        &store.tables(&txn)?,
        &fingerprint,
        boot.as_deref(),
        &mut report,
    )?;
    if report.ranges_changed {
        // Cursors and free lists are indexed by (set, range) position; start them afresh.
        // Reservations live in `addr`, which the cursors consult, so nothing is lost.
        store.reset_cursors(&txn)?;
    }
    {
        let mut t = store.tables(&txn)?;
        write_meta(
            store,
            &mut t,
            report.ranges_changed.then_some(fingerprint.as_str()),
            boot.as_deref(),
            stamp_format,
        )?;
        survey_allocations(store, &t, ranges, &mut report)?;
    }
    store.commit(txn)?;
    log_open_report(store, network, &report);
    Ok(report)
}

/// Fills the report from the store's meta table (ranges changed, same boot, migrated from);
/// true when the store's format must be stamped. A format newer than this binary's is refused.
fn read_meta(
    store: &Store,
    t: &Tables<'_>,
    fingerprint: &str,
    boot: Option<&str>,
    report: &mut OpenReport,
) -> Result<bool, IpamError> {
    let previous_ranges = t.meta.get(META_RANGES).map_err(store.err("read meta"))?;
    // A store never opened before has no ranges recorded: it is new, not of an old format.
    let fresh = previous_ranges.is_none();
    report.ranges_changed = match previous_ranges {
        Some(v) => v.value() != fingerprint.as_bytes(),
        None => true,
    };
    // Without a boot id to compare, assume no reboot (the cautious answer).
    report.same_boot = match (t.meta.get(META_BOOT).map_err(store.err("read meta"))?, boot) {
        (Some(v), Some(now)) => v.value() == now.as_bytes(),
        _ => true,
    };
    let format = match t.meta.get(META_FORMAT).map_err(store.err("read meta"))? {
        None => 1,
        Some(v) => std::str::from_utf8(v.value())
            .ok()
            .and_then(|f| f.parse::<u32>().ok())
            .ok_or_else(|| store.corrupt("meta format", "not a decimal number"))?,
    };
    if format > STORE_FORMAT {
        return Err(store.corrupt(
            "meta format",
            format!(
                "store format {format} is newer than this binary's ({STORE_FORMAT}): \
                 refusing to open it (a newer provisioner wrote it)"
            ),
        ));
    }
    let stamp_format = format < STORE_FORMAT;
    if stamp_format && !fresh {
        report.migrated_from = Some(format);
    }
    Ok(stamp_format)
}

/// Records the new range fingerprint (when given), the boot id and the current format.
fn write_meta(
    store: &Store,
    t: &mut Tables<'_>,
    fingerprint: Option<&str>,
    boot: Option<&str>,
    stamp_format: bool,
) -> Result<(), IpamError> {
    if let Some(fingerprint) = fingerprint {
        t.meta
            .insert(META_RANGES, fingerprint.as_bytes())
            .map_err(store.err("write meta"))?;
    }
    if let Some(boot) = boot {
        t.meta
            .insert(META_BOOT, boot.as_bytes())
            .map_err(store.err("write meta"))?;
    }
    if stamp_format {
        // Format 1 records read as format 2 records naming no pod: the format is all
        // that changes.
        t.meta
            .insert(META_FORMAT, STORE_FORMAT.to_string().as_bytes())
            .map_err(store.err("write meta"))?;
    }
    Ok(())
}

/// Counts the allocations and reports those outside every range, incomplete or unreadable.
fn survey_allocations(
    store: &Store,
    t: &Tables<'_>,
    ranges: &RangeSets,
    report: &mut OpenReport,
) -> Result<(), IpamError> {
    for entry in t.alloc.iter().map_err(store.err("scan allocations"))? {
        let (k, v) = entry.map_err(store.err("scan allocations"))?;
        let (cid, ifname) = k.value();
        let key = AllocationKey::new(cid, ifname);
        match decode(key.clone(), v.value()) {
            Ok(a) => {
                report.allocations += 1;
                let mut covered = vec![false; ranges.sets().len()];
                let mut outside = false;
                for ip in &a.ips {
                    match ranges.position(ip.address.ip()) {
                        Some((i, _)) => covered[i] = true,
                        None => outside = true,
                    }
                }
                if outside {
                    report.out_of_range.push(a);
                } else if covered.contains(&false) {
                    report.incomplete.push(a);
                }
            }
            Err(reason) => report.unreadable.push((key, reason)),
        }
    }
    Ok(())
}

/// Logs a migration, the allocations outside the ranges and the unreadable records.
fn log_open_report(store: &Store, network: &str, report: &OpenReport) {
    if let Some(from) = report.migrated_from {
        tracing::info!(network, store = %store.path().display(), from, to = STORE_FORMAT,
            allocations = report.allocations,
            "ipam store migrated: its allocations name no pod until their next ADD");
    }
    for a in &report.out_of_range {
        tracing::warn!(network, key = %a.key, ips = ?a.ips, "allocation outside the configured ranges; kept reserved");
    }
    for (key, reason) in &report.unreadable {
        tracing::warn!(network, %key, %reason, "unreadable allocation record; its addresses stay reserved");
    }
}
