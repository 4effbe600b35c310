//! The allocator's API: one address per range set for each key, durable before it returns.
//!
//! Per range `(set i, range j)` the store keeps a cursor: the last address ever handed out by
//! walking the range upwards. Addresses above the cursor have never been handed out under the
//! current range config. Per set it keeps a FIFO of released addresses (those at or below a
//! cursor) keyed by a release sequence number. `allocate` takes the next address above the cursor
//! and only when every range of the set is walked to its end the oldest released address, so a
//! freed address is reused as late as possible (like host-local's round robin), in O(log n).
//!
//! Complexity: every step is a B-tree point lookup/insert/remove or the first entry of a key
//! range, O(log n) in the number of allocations n. The only loop is the cursor skipping addresses
//! that are still reserved from before a range config change; the cursor is persisted past them,
//! so each such address is skipped once (amortised O(log n)); and a pick passes over the
//! addresses held by DELs in flight (see [`super::withdrawal`]), a few at a time. Nothing scans
//! all entries except `open` (which builds the report) and `list`.
//!
//! Writes go through one committer thread per allocator (`commit`): `allocate` and `release`
//! queue an operation and block until the committer answers, and it answers only once the
//! operation is durable. Reads (`get`, `list`, `count`) are redb read transactions: snapshots of
//! the last commit that never wait for the committer.
//!
//! - `open`: what opening finds in the store (meta, survey), the [`OpenReport`]
//! - `commit`: the committer thread, a batch of operations per transaction
//! - `plan`: each operation as a read-only plan and the apply that writes it
//! - `reservations`: an allocation answered before it is durable
//!
//! # Reserving before durability
//!
//! [`Allocator::reserve`] is `allocate` in two stages, so that a caller can do its kernel work
//! while the fsync runs: the committer answers with the picked addresses as soon as its batch is
//! applied (every later operation sees them: they are in the transaction being committed), then
//! commits and reports durability through [`Reservation::durable`]. The caller must not answer
//! its own client before `durable` says so. If the commit fails, the reservation is not on disk
//! and the caller must undo what it did with the addresses. After any failed commit the
//! allocator refuses every later write until it is reopened (redb itself does the same after a
//! failed commit; [`Allocator::unwritable`] says why): after a failed reservation the addresses
//! are free in the store while the caller's kernel objects may still route them, so handing
//! them out again would give them two owners; a reopen rebuilds the owners from the kernel. A crash between the two stages leaves
//! nothing on disk:
//! after a restart the address is free, and the runtime's retry (DEL, or the next ADD of the key)
//! must remove the kernel objects the crashed ADD created.

mod commit;
mod open;
mod plan;
mod reservations;

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use redb::{ReadableTable, ReadableTableMetadata};

use super::allocation::{Allocation, AllocationKey};
use super::damage::keep_aside;
use super::error::IpamError;
use super::range::{IpRange, RangeSets, to_u128};
use super::store::{Store, addr_key, decode};
use super::withdrawal::HeldAddresses;
use crate::pod::Pod;
use commit::{Answer, Reply, Request};
use open::check_store;
pub use open::{OpenReport, STORE_FORMAT, Unreadable};
pub use reservations::Reservation;

/// Most operations applied in one transaction. Bounds the latency a batch adds to its first
/// caller; 16 concurrent callers fit in one batch.
pub const MAX_BATCH: usize = 128;

/// Durable, thread-safe allocator of one network. Cheap to share behind an `Arc`.
///
/// Dropping it lets the committer finish every queued operation, then joins it.
pub struct Allocator {
    core: Arc<Core>,
    queue: Option<mpsc::Sender<Request>>,
    committer: Option<JoinHandle<()>>,
}

/// The store and the ranges; shared by the callers (reads) and the committer (writes).
struct Core {
    store: Store,
    network: String,
    ranges: RangeSets,
    /// Set when a commit with reservations failed (see the module doc): every later write is
    /// refused with this reason.
    broken: Mutex<Option<String>>,
    /// Released addresses no allocation may pick yet (see [`super::withdrawal`]).
    held: HeldAddresses,
    /// Test hook: the next commit with reservations fails.
    #[cfg(test)]
    fail_next_staged_commit: std::sync::atomic::AtomicBool,
}

/// A write operation queued for the committer.
#[derive(Debug, Clone)]
pub(crate) enum StoreWrite {
    /// Allocate for the key, or answer its allocation; a pod given is recorded with it (an
    /// existing allocation naming another pod, or none, is rewritten to name this one).
    Allocate(AllocationKey, Option<Pod>),
    Release(AllocationKey),
    /// A release whose addresses stay held (see [`super::withdrawal`]).
    ReleaseHolding(AllocationKey),
}

/// The answer to a [`StoreWrite`].
#[derive(Debug)]
pub(crate) enum Done {
    Allocated(Allocation),
    Released(Option<Allocation>),
}

type Outcome = Result<Done, IpamError>;

/// Whether `allocation` already records what an ADD naming `pod` would: an ADD that names no
/// pod leaves the recorded one.
fn names_pod(allocation: &Allocation, pod: Option<&Pod>) -> bool {
    pod.is_none() || allocation.pod.as_ref() == pod
}

impl Allocator {
    /// Opens (or creates) the store of `network` under `data_dir` and checks its allocations
    /// against `ranges`. Starts the allocator's committer thread.
    pub fn open(
        data_dir: &Path,
        network: &str,
        ranges: &RangeSets,
    ) -> Result<(Allocator, OpenReport), IpamError> {
        let store = Store::open(data_dir, network)?;
        let (store, report) = match check_store(&store, network, ranges) {
            Ok(report) => (store, report),
            // Opened, but its content is damaged where the check reads it: kept aside and
            // started afresh, as when it cannot be opened at all.
            Err(err) if err.is_damage() => {
                let path = store.path().to_path_buf();
                let dir = path.parent().unwrap_or(data_dir).to_path_buf();
                drop(store);
                let aside = keep_aside(&dir, &path, &err.to_string())?;
                let store = Store::open(data_dir, network)?.with_lost(aside.reason);
                let report = check_store(&store, network, ranges)?;
                (store, report)
            }
            Err(err) => return Err(err),
        };
        let core = Arc::new(Core {
            store,
            network: network.to_string(),
            ranges: ranges.clone(),
            broken: Mutex::new(None),
            held: HeldAddresses::default(),
            #[cfg(test)]
            fail_next_staged_commit: std::sync::atomic::AtomicBool::new(false),
        });
        let (queue, rx) = mpsc::channel();
        let committer = {
            let core = Arc::clone(&core);
            std::thread::Builder::new()
                .name("ipam-commit".into())
                .spawn(move || core.commit_loop(&rx))
                .map_err(|e| core_error(&report.path, "start committer", e))?
        };
        Ok((
            Allocator {
                core,
                queue: Some(queue),
                committer: Some(committer),
            },
            report,
        ))
    }

    pub fn network(&self) -> &str {
        &self.core.network
    }
    pub fn ranges(&self) -> &RangeSets {
        &self.core.ranges
    }
    pub fn path(&self) -> &Path {
        self.core.store.path()
    }

    /// Reserves one address per range set for `key`, durably, or returns the existing allocation
    /// of `key`. On exhaustion nothing is reserved and the error names the exhausted set(s).
    pub fn allocate(&self, key: &AllocationKey) -> Result<Allocation, IpamError> {
        self.allocate_for(key, None)
    }

    /// [`Self::allocate`], recording `pod` with the allocation (see [`StoreWrite::Allocate`]).
    pub fn allocate_for(
        &self,
        key: &AllocationKey,
        pod: Option<&Pod>,
    ) -> Result<Allocation, IpamError> {
        // A retried ADD is answered from a snapshot without queueing behind writers.
        if let Some(existing) = self.get(key)?
            && names_pod(&existing, pod)
        {
            return Ok(existing);
        }
        match self.submit(StoreWrite::Allocate(key.clone(), pod.cloned()))? {
            Done::Allocated(a) => Ok(a),
            Done::Released(_) => Err(self.core.stopped("answered allocate with a release")),
        }
    }

    /// Like [`Self::allocate`], but answers as soon as the addresses are chosen, before they are
    /// on disk: the caller can wire them while the commit runs, and must then await
    /// [`Reservation::durable`] before it reports success (see the module doc). An existing
    /// allocation comes back at once, already durable.
    pub fn reserve(
        &self,
        key: &AllocationKey,
        pod: Option<&Pod>,
    ) -> Result<Reservation, IpamError> {
        let store = self.core.store.path().to_path_buf();
        if let Some(existing) = self.get(key)?
            && names_pod(&existing, pod)
        {
            return Ok(Reservation::durable_already(existing, false, &store));
        }
        let (applied, answer) = mpsc::sync_channel(1);
        let (durable_tx, durable) = oneshot::channel();
        self.enqueue(Request {
            op: StoreWrite::Allocate(key.clone(), pod.cloned()),
            reply: Reply::Staged {
                applied: Answer::Blocked(applied),
                durable: durable_tx,
            },
        })?;
        let applied = answer.recv().map_err(|_| {
            self.core
                .stopped("committer thread stopped before answering")
        })?;
        Reservation::staged(applied, durable, store)
    }

    /// [`Self::reserve`] for async callers: queued to the committer at once; the future awaits
    /// its answer with no thread blocked (no hop through a blocking pool). The committer finds an
    /// existing allocation itself, and answers it as not new.
    pub fn reserve_queued(
        &self,
        key: &AllocationKey,
        pod: Option<&Pod>,
    ) -> impl Future<Output = Result<Reservation, IpamError>> + Send + 'static {
        let store = self.core.store.path().to_path_buf();
        let (applied, answer) = oneshot::channel();
        let (durable_tx, durable) = oneshot::channel();
        let queued = self.enqueue(Request {
            op: StoreWrite::Allocate(key.clone(), pod.cloned()),
            reply: Reply::Staged {
                applied: Answer::Awaited(applied),
                durable: durable_tx,
            },
        });
        async move {
            queued?;
            let applied = answer
                .await
                .map_err(|_| stopped_error(&store, "committer thread stopped before answering"))?;
            Reservation::staged(applied, durable, store)
        }
    }

    /// [`Self::release`] for async callers, queued like [`Self::reserve_queued`] (an unknown key
    /// costs the committer a read, no write), the released addresses held back from every
    /// allocation until [`Self::end_hold`] (from the moment the release is applied, before it
    /// is durable): for a DEL whose teardown runs meanwhile. See [`super::withdrawal`].
    pub fn release_holding(
        &self,
        key: &AllocationKey,
    ) -> impl Future<Output = Result<Option<Allocation>, IpamError>> + Send + 'static {
        let store = self.core.store.path().to_path_buf();
        let (reply, answer) = oneshot::channel();
        let queued = self.enqueue(Request {
            op: StoreWrite::ReleaseHolding(key.clone()),
            reply: Reply::Durable(Answer::Awaited(reply)),
        });
        async move {
            queued?;
            let outcome = answer
                .await
                .map_err(|_| stopped_error(&store, "committer thread stopped before answering"))?;
            match outcome? {
                Done::Released(released) => Ok(released),
                Done::Allocated(_) => {
                    Err(stopped_error(&store, "answered release with an allocate"))
                }
            }
        }
    }

    /// Releases the allocation of `key` durably. Unknown keys are `Ok(None)`.
    pub fn release(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        // DEL is often repeated; an unknown key needs no write transaction.
        if self.get(key)?.is_none() {
            return Ok(None);
        }
        match self.submit(StoreWrite::Release(key.clone()))? {
            Done::Released(a) => Ok(a),
            Done::Allocated(_) => Err(self.core.stopped("answered release with an allocate")),
        }
    }

    /// Queues `op` for the committer and waits for its durable answer.
    fn submit(&self, op: StoreWrite) -> Outcome {
        let (reply, answer) = mpsc::sync_channel(1);
        self.enqueue(Request {
            op,
            reply: Reply::Durable(Answer::Blocked(reply)),
        })?;
        answer.recv().map_err(|_| {
            self.core
                .stopped("committer thread stopped before answering")
        })?
    }

    fn enqueue(&self, request: Request) -> Result<(), IpamError> {
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| self.core.stopped("allocator is shutting down"))?;
        queue
            .send(request)
            .map_err(|_| self.core.stopped("committer thread has stopped"))
    }

    /// Runs `ops` as the committer would run one batch of them (test hook).
    #[cfg(test)]
    pub(crate) fn run_batch(&self, ops: &[StoreWrite]) -> Vec<Outcome> {
        self.core.run(ops)
    }

    /// The allocation of `key`, if any (read-only snapshot, no lock on writers).
    pub fn get(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        let s = &self.core.store;
        let txn = s.begin_read()?;
        let table = s.read_alloc(&txn)?;
        let k = (key.container_id.as_str(), key.ifname.as_str());
        match table.get(k).map_err(s.err("read allocation"))? {
            Some(v) => decode(key.clone(), v.value())
                .map(Some)
                .map_err(|r| s.corrupt(key.to_string(), r)),
            None => Ok(None),
        }
    }

    /// Every readable allocation, ordered by key. O(n); for reconciliation and inspection. A
    /// record that cannot be decoded is skipped and logged (its addresses stay reserved, and
    /// nothing releases it by accident); [`Self::list_all`] names them.
    pub fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        let (readable, unreadable) = self.list_all()?;
        for (key, reason) in &unreadable {
            tracing::warn!(network = %self.core.network, %key, %reason, store = %self.path().display(),
                "unreadable allocation record skipped; its addresses stay reserved (release it by key)");
        }
        Ok(readable)
    }

    /// Every allocation, and apart every record that cannot be decoded with the reason.
    pub fn list_all(&self) -> Result<(Vec<Allocation>, Vec<Unreadable>), IpamError> {
        let s = &self.core.store;
        let txn = s.begin_read()?;
        let table = s.read_alloc(&txn)?;
        let mut out = Vec::new();
        let mut unreadable = Vec::new();
        for entry in table.iter().map_err(s.err("scan allocations"))? {
            let (k, v) = entry.map_err(s.err("scan allocations"))?;
            let (cid, ifname) = k.value();
            let key = AllocationKey::new(cid, ifname);
            match decode(key.clone(), v.value()) {
                Ok(allocation) => out.push(allocation),
                Err(reason) => unreadable.push((key, reason)),
            }
        }
        Ok((out, unreadable))
    }

    pub(super) fn store(&self) -> &Store {
        &self.core.store
    }

    pub(super) fn held(&self) -> &HeldAddresses {
        &self.core.held
    }

    /// Why writes are refused (a commit failed: full or read-only disk, I/O error), naming the
    /// store file and the OS error; `None` while the store commits. Only a new allocator on the
    /// file (a reopen) writes again.
    pub fn unwritable(&self) -> Option<String> {
        self.core.broken()
    }

    /// Number of allocations.
    pub fn count(&self) -> Result<u64, IpamError> {
        let s = &self.core.store;
        let txn = s.begin_read()?;
        s.read_alloc(&txn)?
            .len()
            .map_err(s.err("count allocations"))
    }
}

impl Allocator {
    /// How many addresses of `range` are held (allocated, adopted, or reserved from an earlier
    /// range config). O(k log n) for k held in the range.
    pub fn held_in(&self, range: &IpRange) -> Result<u64, IpamError> {
        let s = &self.core.store;
        let txn = s.begin_read()?;
        let family = addr_key(range.start()).0;
        let (start, end) = range.bounds();
        let gateway = to_u128(range.gateway());
        let mut held = 0;
        for entry in s
            .read_addr(&txn)?
            .range((family, start)..=(family, end))
            .map_err(s.err("count addresses"))?
        {
            let (addr, _) = entry.map_err(s.err("count addresses"))?;
            if addr.value().1 != gateway {
                held += 1;
            }
        }
        Ok(held)
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        // Closing the queue lets the committer run and answer everything already queued; it
        // returns once the queue is empty and closed.
        drop(self.queue.take());
        if let Some(committer) = self.committer.take()
            && committer.join().is_err()
        {
            tracing::error!(network = %self.core.network, "ipam committer thread panicked");
        }
    }
}

fn broken_error(path: &Path, reason: &str) -> IpamError {
    IpamError::Unwritable {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    }
}

fn stopped_error(path: &Path, why: &'static str) -> IpamError {
    core_error(path, "group commit", std::io::Error::other(why))
}

fn core_error(path: &Path, op: &'static str, e: std::io::Error) -> IpamError {
    IpamError::Store {
        path: path.to_path_buf(),
        op,
        source: Box::new(redb::Error::Io(e)),
    }
}

impl Core {
    /// The error a caller gets when the committer cannot answer.
    fn stopped(&self, why: &'static str) -> IpamError {
        stopped_error(self.store.path(), why)
    }

    fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
pub(super) mod tests {
    use super::*;
    use crate::ipam::IpamConfig;

    /// The allocator of network "net" over `json`'s ranges, its store in `dir`.
    pub(in crate::ipam) fn open(dir: &Path, json: &str) -> Allocator {
        let ranges = IpamConfig::from_json(json).unwrap().validate().unwrap();
        Allocator::open(dir, "net", &ranges).unwrap().0
    }

    /// The key of sandbox `c<i>`'s eth0.
    pub(in crate::ipam) fn key(i: usize) -> AllocationKey {
        AllocationKey::new(format!("c{i}"), "eth0")
    }

    /// The address of an allocation outcome.
    pub(super) fn ip(o: &Outcome) -> String {
        match o {
            Ok(Done::Allocated(a)) => a.ips[0].address.ip().to_string(),
            other => panic!("not an allocation: {other:?}"),
        }
    }

    pub(super) const V4_28: &str = r#"{"subnet":"10.244.1.0/28"}"#; // .2 ..= .14: 13 addresses

    #[test]
    fn held_in_counts_each_range_apart() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(
            dir.path(),
            r#"{"ranges":[[{"subnet":"10.244.1.0/28"},{"subnet":"10.244.2.0/30"}],[{"subnet":"fd00::/120"}]]}"#,
        );
        let count = |a: &Allocator| -> Vec<u64> {
            a.ranges()
                .sets()
                .iter()
                .flat_map(|set| set.ranges())
                .map(|r| a.held_in(r).unwrap())
                .collect()
        };
        assert_eq!(count(&a), vec![0, 0, 0]);
        for i in 0..14 {
            a.allocate(&key(i)).unwrap();
        }
        // 13 in the /28 (gateway .1 excluded), the 14th in the /30; each takes one v6 address.
        assert_eq!(count(&a), vec![13, 1, 14]);
        a.release(&key(0)).unwrap();
        assert_eq!(count(&a), vec![12, 1, 13]);
    }

    #[test]
    fn list_skips_an_undecodable_record_names_it_and_keeps_its_address() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        a.allocate(&key(1)).unwrap(); // .2
        {
            let s = &a.core.store;
            let txn = s.begin_write().unwrap();
            {
                let mut t = s.tables(&txn).unwrap();
                t.alloc
                    .insert(("bad", "eth0"), b"{\"ips\":[{".as_slice())
                    .unwrap();
                t.addr
                    .insert(addr_key("10.244.1.3".parse().unwrap()), ("bad", "eth0"))
                    .unwrap();
                t.cursor
                    .insert((0, 0), to_u128("10.244.1.2".parse().unwrap()))
                    .unwrap();
            }
            s.commit(txn).unwrap();
        }
        let listed = a.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key, key(1));
        let (_, unreadable) = a.list_all().unwrap();
        assert_eq!(unreadable.len(), 1);
        assert_eq!(unreadable[0].0, AllocationKey::new("bad", "eth0"));
        // Its address stays reserved.
        assert_eq!(
            ip(&a.run_batch(&[StoreWrite::Allocate(key(2), None)])[0]),
            "10.244.1.4"
        );
    }

    #[test]
    fn concurrent_callers_share_commits_and_drop_drains() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(open(dir.path(), r#"{"subnet":"10.244.0.0/22"}"#));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let a = Arc::clone(&a);
                std::thread::spawn(move || {
                    for k in 0..20 {
                        let key = AllocationKey::new(format!("t{t}"), format!("k{k}"));
                        let first = a.allocate(&key).unwrap();
                        assert_eq!(a.allocate(&key).unwrap(), first);
                        if k % 3 == 0 {
                            assert_eq!(a.release(&key).unwrap(), Some(first));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let a = Arc::into_inner(a).unwrap();
        let held = a.list().unwrap();
        assert_eq!(held.len(), 8 * 13);
        let distinct: std::collections::HashSet<_> =
            held.iter().map(|al| al.ips[0].address.ip()).collect();
        assert_eq!(distinct.len(), held.len());
        drop(a); // joins the committer
        let a = open(dir.path(), r#"{"subnet":"10.244.0.0/22"}"#);
        assert_eq!(a.count().unwrap(), 8 * 13);
    }
}
