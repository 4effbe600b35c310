//! The allocator: one address per range set for each key, durable before it returns.
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
//! # Group commit
//!
//! Writes go through one committer thread per allocator. `allocate` and `release` queue an
//! operation and block until the committer answers. The committer takes everything queued (up to
//! [`MAX_BATCH`]), applies the operations in queue order inside one redb write transaction,
//! commits it once with `Durability::Immediate` (one fsync) and only then answers every caller,
//! so an answer is always durable. While a batch is being fsynced the next one queues up, so under
//! load n concurrent callers cost about one fsync each round instead of n serialised ones; a lone
//! caller pays one transaction of its own.
//!
//! Each operation is split into a read-only *plan* (choose every address, decode records, detect
//! exhaustion) and an *apply* that only writes what the plan chose. A plan that fails (exhaustion,
//! a corrupt record) writes nothing but harmless fixes, so it fails that operation alone and the
//! rest of the batch commits. Operations later in a batch read the writes of earlier ones, so a
//! batch behaves exactly like its operations run one after another: two operations on one key see
//! each other, and an address released in the batch goes to the back of the free list like any
//! other (the cursor is preferred, then the oldest release). If a write or the commit itself
//! fails, the transaction is dropped (nothing of it is durable) and its operations are run again
//! one transaction each, so each caller gets its own answer.
//!
//! Reads (`get`, `list`, `count`) are redb read transactions: snapshots of the last commit that
//! never wait for the committer.
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

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use ipnetwork::IpNetwork;
use redb::{ReadableTable, ReadableTableMetadata};

use super::allocation::{AllocatedIp, Allocation, AllocationKey};
use super::damage::keep_aside;
use super::error::IpamError;
use super::range::{IpRange, RangeSet, RangeSets, from_u128, to_u128};
use super::store::{AddrT, Store, Tables, addr_from_key, addr_key, decode, encode};
use super::withdrawal::HeldAddresses;
use crate::pod::Pod;

const META_RANGES: &str = "ranges";
const META_SEQ: &str = "seq";
/// The kernel's boot id when the store was last opened.
const META_BOOT: &str = "boot";
/// The store's format, a decimal number. A store without it is format 1 (records without a
/// pod); format 2 records may name the pod.
const META_FORMAT: &str = "format";
/// The format this allocator writes.
pub const STORE_FORMAT: u32 = 2;

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
pub(crate) enum Op {
    /// Allocate for the key, or answer its allocation; a pod given is recorded with it (an
    /// existing allocation naming another pod, or none, is rewritten to name this one).
    Allocate(AllocationKey, Option<Pod>),
    Release(AllocationKey),
    /// A release whose addresses stay held (see [`super::withdrawal`]).
    ReleaseHolding(AllocationKey),
}

/// The answer to an [`Op`].
#[derive(Debug)]
pub(crate) enum Done {
    Allocated(Allocation),
    Released(Option<Allocation>),
}

type Outcome = Result<Done, IpamError>;

struct Request {
    op: Op,
    reply: Reply,
}

/// How the committer answers one request.
enum Reply {
    /// Once, after the commit (`allocate`, `release`).
    Durable(Answer<Outcome>),
    /// The outcome as soon as the batch is applied, then whether its commit made it durable
    /// (`reserve`).
    Staged {
        /// The outcome, and whether this operation wrote it (a new allocation).
        applied: Answer<(Outcome, bool)>,
        durable: oneshot::Sender<Result<(), IpamError>>,
    },
}

/// Where an answer goes: to a thread blocked on it, or to a task awaiting it (no thread in
/// between: the `*_queued` calls).
enum Answer<T> {
    Blocked(mpsc::SyncSender<T>),
    Awaited(oneshot::Sender<T>),
}

impl<T> Answer<T> {
    /// Sends `value`; a caller that went away (a cancelled task) needs no answer.
    fn send(self, value: T) {
        match self {
            Answer::Blocked(tx) => {
                let _ = tx.send(value);
            }
            Answer::Awaited(tx) => {
                let _ = tx.send(value);
            }
        }
    }
}

impl Reply {
    /// Answers with `reason` (the allocator refuses writes).
    fn refuse(self, path: &Path, reason: &str) {
        match self {
            Reply::Durable(reply) => reply.send(Err(broken_error(path, reason))),
            Reply::Staged { applied, .. } => applied.send((Err(broken_error(path, reason)), false)),
        }
    }
}

/// An allocation answered before it is durable (see [`Allocator::reserve`]).
#[derive(Debug)]
pub struct Reservation {
    allocation: Allocation,
    new: bool,
    durable: oneshot::Receiver<Result<(), IpamError>>,
    store: PathBuf,
}

impl Reservation {
    /// A reservation that is already durable (an existing allocation; fakes in tests).
    pub fn durable_already(allocation: Allocation, new: bool, store: &Path) -> Self {
        let (tx, durable) = oneshot::channel();
        // The receiver is in hand: this cannot fail.
        let _ = tx.send(Ok(()));
        Self {
            allocation,
            new,
            durable,
            store: store.to_path_buf(),
        }
    }

    /// A reservation whose durability is reported later through the returned sender (fakes of
    /// the store in tests).
    pub fn pending(
        allocation: Allocation,
        new: bool,
        store: &Path,
    ) -> (Self, oneshot::Sender<Result<(), IpamError>>) {
        let (tx, durable) = oneshot::channel();
        (
            Self {
                allocation,
                new,
                durable,
                store: store.to_path_buf(),
            },
            tx,
        )
    }

    /// The reservation the committer's staged answer (outcome, written by this call) makes.
    fn staged(
        (outcome, new): (Outcome, bool),
        durable: oneshot::Receiver<Result<(), IpamError>>,
        store: PathBuf,
    ) -> Result<Self, IpamError> {
        match outcome? {
            // An existing allocation may come from an earlier operation of the same batch:
            // waiting for the batch's commit covers that case too.
            Done::Allocated(allocation) => Ok(Self {
                allocation,
                new,
                durable,
                store,
            }),
            Done::Released(_) => Err(stopped_error(&store, "answered reserve with a release")),
        }
    }

    /// The addresses, usable at once (nothing else is handed them).
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// Whether this call created the allocation (`false`: the key already had it).
    pub fn is_new(&self) -> bool {
        self.new
    }

    /// Waits until the allocation is on disk. An error means it never will be: undo what was
    /// done with the addresses.
    pub async fn durable(self) -> Result<Allocation, IpamError> {
        let store = self.store;
        let answer = self
            .durable
            .await
            .map_err(|_| stopped_error(&store, "committer stopped before committing"))?;
        answer.map(|()| self.allocation)
    }

    /// [`Self::durable`] for synchronous callers (not from inside an async runtime).
    pub fn wait_durable(self) -> Result<Allocation, IpamError> {
        let store = self.store;
        let answer = self
            .durable
            .blocking_recv()
            .map_err(|_| stopped_error(&store, "committer stopped before committing"))?;
        answer.map(|()| self.allocation)
    }
}

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

/// Where a picked address comes from; applied to the store only once every set has one.
enum Source {
    Cursor { range: usize },
    Free { seq: u64 },
}

struct Pick {
    set: usize,
    range: usize,
    ip: IpAddr,
    source: Source,
}

/// Harmless store fixes found while picking (kept even if the allocation fails).
enum Fix {
    /// Cursor advanced past addresses still reserved from an earlier config.
    Cursor {
        set: usize,
        range: usize,
        last: u128,
    },
    /// A free-list entry that is no longer free or no longer in range.
    DropFree { set: usize, seq: u64 },
}

/// What an allocate will write, decided from reads only.
enum AllocPlan {
    Existing(Allocation),
    Exhausted {
        fixes: Vec<Fix>,
        error: IpamError,
    },
    New {
        fixes: Vec<Fix>,
        picks: Vec<Pick>,
        ips: Vec<AllocatedIp>,
    },
}

/// What a release will write, decided from reads only.
struct ReleasePlan {
    alloc: Allocation,
    /// Addresses reserved for this key, to unreserve.
    owned: Vec<AddrT>,
    /// Free-list entries to append: ((set, seq), address).
    freed: Vec<((u32, u64), AddrT)>,
    /// The release sequence number after this release.
    seq: u64,
}

/// What an operation wrote in its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wrote {
    Nothing,
    /// A new allocation.
    Created,
    /// Anything else: an existing record, a release, store fixes.
    Updated,
}

impl Wrote {
    fn any(self) -> bool {
        self != Wrote::Nothing
    }
}

impl From<bool> for Wrote {
    fn from(wrote: bool) -> Self {
        if wrote {
            Wrote::Updated
        } else {
            Wrote::Nothing
        }
    }
}

/// Whether `allocation` already records what an ADD naming `pod` would: an ADD that names no
/// pod leaves the recorded one.
fn names_pod(allocation: &Allocation, pod: Option<&Pod>) -> bool {
    pod.is_none() || allocation.pod.as_ref() == pod
}

fn idx(i: usize) -> u32 {
    // Range sets and ranges come from a config file; more than 4 billion is not a config.
    u32::try_from(i).unwrap_or(u32::MAX)
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

    /// [`Self::allocate`], recording `pod` with the allocation (see [`Op::Allocate`]).
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
        match self.submit(Op::Allocate(key.clone(), pod.cloned()))? {
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
            op: Op::Allocate(key.clone(), pod.cloned()),
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
            op: Op::Allocate(key.clone(), pod.cloned()),
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
            op: Op::ReleaseHolding(key.clone()),
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
        match self.submit(Op::Release(key.clone()))? {
            Done::Released(a) => Ok(a),
            Done::Allocated(_) => Err(self.core.stopped("answered release with an allocate")),
        }
    }

    /// Queues `op` for the committer and waits for its durable answer.
    fn submit(&self, op: Op) -> Outcome {
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
    pub(crate) fn run_batch(&self, ops: &[Op]) -> Vec<Outcome> {
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

/// The kernel's boot id (changes with every boot), if readable.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Records the range fingerprint (resetting cursors when it changed) and builds the report.
fn check_store(store: &Store, network: &str, ranges: &RangeSets) -> Result<OpenReport, IpamError> {
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

    /// After a failed commit (redb refuses every later write until the file is reopened):
    /// refuses writes from now on; the reason, which names the store and the OS error.
    fn mark_broken(&self, e: &IpamError) -> String {
        let reason = format!(
            "a commit failed ({e}); every write is refused until the daemon can reopen the store"
        );
        let mut broken = self.broken.lock().unwrap_or_else(PoisonError::into_inner);
        if broken.is_none() {
            tracing::error!(network = %self.network, store = %self.store.path().display(), error = %e,
                "ipam commit failed: refusing writes until the store is reopened");
            *broken = Some(reason.clone());
        }
        reason
    }

    /// The committer: one batch of queued operations per transaction until the queue is closed
    /// and empty.
    fn commit_loop(&self, queue: &mpsc::Receiver<Request>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Ok(first) = queue.recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            if let Some(reason) = self.broken() {
                for request in batch.drain(..) {
                    request.reply.refuse(self.store.path(), &reason);
                }
            } else if batch.iter().all(|r| matches!(r.reply, Reply::Durable(_))) {
                let (ops, replies): (Vec<Op>, Vec<_>) =
                    batch.drain(..).map(|r| (r.op, r.reply)).unzip();
                for (reply, outcome) in replies.into_iter().zip(self.run(&ops)) {
                    if let Reply::Durable(reply) = reply {
                        reply.send(outcome);
                    }
                }
            } else {
                self.run_staged(std::mem::take(&mut batch));
            }
        }
    }

    /// A batch with reservations: applied, reservations answered, then committed. If applying
    /// fails nothing was answered and every request runs alone; if the commit fails, the
    /// reservations learn it, the allocator refuses every later write, and so do the other
    /// requests of the batch.
    fn run_staged(&self, batch: Vec<Request>) {
        let ops: Vec<Op> = batch.iter().map(|r| r.op.clone()).collect();
        let (txn, outcomes, wrote) = match self.apply(&ops) {
            Ok(applied) => applied,
            Err(e) => {
                tracing::warn!(network = %self.network, error = %e, ops = ops.len(),
                    "ipam batch failed; running its operations one by one");
                for request in batch {
                    self.run_staged_alone(request);
                }
                return;
            }
        };
        let mut waiting = Vec::new();
        let mut retry = Vec::new();
        let dirty = wrote.iter().any(|w| w.any());
        for ((request, outcome), wrote) in batch.into_iter().zip(outcomes).zip(wrote) {
            match request.reply {
                Reply::Staged { applied, durable } => {
                    let new = wrote == Wrote::Created && matches!(outcome, Ok(Done::Allocated(_)));
                    applied.send((outcome, new));
                    waiting.push(durable);
                }
                Reply::Durable(reply) => retry.push((request.op, reply, outcome)),
            }
        }
        let committed = if dirty {
            self.commit_staged(txn)
        } else {
            Ok(())
        };
        match committed {
            Ok(()) => {
                for durable in waiting {
                    let _ = durable.send(Ok(()));
                }
                for (_, reply, outcome) in retry {
                    reply.send(outcome);
                }
            }
            Err(e) => {
                // The operations of this commit fail with it; later ones are refused.
                let reason = self.mark_broken(&e);
                let failed = || {
                    core_error(
                        self.store.path(),
                        "commit",
                        std::io::Error::other(reason.clone()),
                    )
                };
                for durable in waiting {
                    let _ = durable.send(Err(failed()));
                }
                for (_, reply, _) in retry {
                    reply.send(Err(failed()));
                }
            }
        }
    }

    fn commit_staged(&self, txn: redb::WriteTransaction) -> Result<(), IpamError> {
        #[cfg(test)]
        if self
            .fail_next_staged_commit
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            drop(txn);
            return Err(self.stopped("injected commit failure"));
        }
        crate::failpoint::pause("commit.slow");
        if crate::failpoint::fails("commit.fail") {
            drop(txn);
            return Err(self.stopped("the durable commit failed (failpoint commit.fail)"));
        }
        self.store.commit(txn)
    }

    /// One request in a transaction of its own, answered in its own stages.
    fn run_staged_alone(&self, request: Request) {
        match request.reply {
            Reply::Durable(reply) => {
                let outcome = self.run(std::slice::from_ref(&request.op)).pop();
                reply.send(
                    outcome.unwrap_or_else(|| Err(self.stopped("no outcome for an operation"))),
                );
            }
            staged @ Reply::Staged { .. } => self.run_staged(vec![Request {
                op: request.op,
                reply: staged,
            }]),
        }
    }

    /// Runs `ops` in one transaction, or one transaction each if that fails. One outcome per op.
    fn run(&self, ops: &[Op]) -> Vec<Outcome> {
        match self.run_in_one(ops) {
            Ok(outcomes) => outcomes,
            Err(e) if ops.len() == 1 => vec![Err(e)],
            Err(e) => {
                tracing::warn!(network = %self.network, error = %e, ops = ops.len(),
                    "ipam group commit failed; retrying its operations one by one");
                ops.iter()
                    .map(|op| match self.run_in_one(std::slice::from_ref(op)) {
                        Ok(outcomes) => outcomes
                            .into_iter()
                            .next()
                            .unwrap_or_else(|| Err(self.stopped("no outcome for an operation"))),
                        Err(e) => Err(e),
                    })
                    .collect()
            }
        }
    }

    /// Applies `ops` in order in one write transaction and commits it durably if anything was
    /// written. `Err` means the transaction as a whole failed and none of it is durable.
    fn run_in_one(&self, ops: &[Op]) -> Result<Vec<Outcome>, IpamError> {
        if let Some(reason) = self.broken() {
            return Err(broken_error(self.store.path(), &reason));
        }
        let (txn, outcomes, wrote) = self.apply(ops)?;
        if wrote.iter().any(|w| w.any()) {
            self.store.commit(txn).inspect_err(|e| {
                self.mark_broken(e);
            })?;
        }
        // Else dropping `txn` aborts it: every answer came from already committed data.
        Ok(outcomes)
    }

    /// Applies `ops` in order in one write transaction, not committed; per operation its
    /// outcome and whether it wrote anything. `Err` means a write failed and the transaction is
    /// unusable.
    fn apply(
        &self,
        ops: &[Op],
    ) -> Result<(redb::WriteTransaction, Vec<Outcome>, Vec<Wrote>), IpamError> {
        let s = &self.store;
        let txn = s.begin_write()?;
        let mut outcomes = Vec::with_capacity(ops.len());
        let mut writes = Vec::with_capacity(ops.len());
        {
            let mut t = s.tables(&txn)?;
            for op in ops {
                let (outcome, wrote) = match op {
                    Op::Allocate(key, pod) => match self.plan_allocate(&t, key) {
                        Ok(plan) => self.apply_allocate(&mut t, key, pod.as_ref(), plan)?,
                        Err(e) => (Err(e), Wrote::Nothing),
                    },
                    Op::Release(key) | Op::ReleaseHolding(key) => {
                        let holding = matches!(op, Op::ReleaseHolding(_));
                        match self.plan_release(&t, key, holding) {
                            Ok(Some(plan)) => {
                                if holding {
                                    self.held.hold(key, &plan.owned);
                                }
                                let (outcome, wrote) = self.apply_release(&mut t, key, plan)?;
                                (outcome, Wrote::from(wrote))
                            }
                            Ok(None) => (Ok(Done::Released(None)), Wrote::Nothing),
                            Err(e) => (Err(e), Wrote::Nothing),
                        }
                    }
                };
                writes.push(wrote);
                outcomes.push(outcome);
            }
        }
        Ok((txn, outcomes, writes))
    }

    /// Decides what allocating `key` writes, reading only.
    fn plan_allocate(&self, t: &Tables<'_>, key: &AllocationKey) -> Result<AllocPlan, IpamError> {
        let s = &self.store;
        let k = (key.container_id.as_str(), key.ifname.as_str());
        if let Some(v) = t.alloc.get(k).map_err(s.err("read allocation"))? {
            return decode(key.clone(), v.value())
                .map(AllocPlan::Existing)
                .map_err(|r| s.corrupt(key.to_string(), r));
        }
        let mut picks = Vec::with_capacity(self.ranges.sets().len());
        let mut fixes = Vec::new();
        let mut exhausted = Vec::new();
        for (i, set) in self.ranges.sets().iter().enumerate() {
            match self.pick(t, i, set, &mut fixes)? {
                Some(p) => picks.push(p),
                None => exhausted.push(set.to_string()),
            }
        }
        if !exhausted.is_empty() {
            return Ok(AllocPlan::Exhausted {
                fixes,
                error: IpamError::Exhausted {
                    key: key.to_string(),
                    range_sets: exhausted,
                },
            });
        }
        let mut ips = Vec::with_capacity(picks.len());
        for p in &picks {
            let r = self
                .ranges
                .sets()
                .get(p.set)
                .and_then(|set| set.ranges().get(p.range))
                .ok_or_else(|| {
                    s.corrupt(
                        format!("range {}/{}", p.set, p.range),
                        "picked from unknown range",
                    )
                })?;
            let address = IpNetwork::new(p.ip, r.subnet().prefix())
                .map_err(|e| s.corrupt(p.ip.to_string(), e.to_string()))?;
            ips.push(AllocatedIp {
                address,
                gateway: r.gateway(),
            });
        }
        Ok(AllocPlan::New { fixes, picks, ips })
    }

    /// Writes an allocate plan. `Err` only for a failed write (the transaction is then unusable);
    /// the operation's own outcome is the first element, what was written the second.
    fn apply_allocate(
        &self,
        t: &mut Tables<'_>,
        key: &AllocationKey,
        pod: Option<&Pod>,
        plan: AllocPlan,
    ) -> Result<(Outcome, Wrote), IpamError> {
        let s = &self.store;
        match plan {
            AllocPlan::Existing(mut a) => {
                if names_pod(&a, pod) {
                    return Ok((Ok(Done::Allocated(a)), Wrote::Nothing));
                }
                a.pod = pod.cloned();
                let k = (key.container_id.as_str(), key.ifname.as_str());
                t.alloc
                    .insert(k, encode(&a.ips, a.pod.as_ref()).as_slice())
                    .map_err(s.err("write allocation"))?;
                Ok((Ok(Done::Allocated(a)), Wrote::Updated))
            }
            AllocPlan::Exhausted { fixes, error } => {
                self.apply_fixes(t, &fixes)?;
                Ok((Err(error), Wrote::from(!fixes.is_empty())))
            }
            AllocPlan::New { fixes, picks, ips } => {
                self.apply_fixes(t, &fixes)?;
                let k = (key.container_id.as_str(), key.ifname.as_str());
                for p in &picks {
                    let i = idx(p.set);
                    match p.source {
                        Source::Cursor { range } => {
                            t.cursor
                                .insert((i, idx(range)), to_u128(p.ip))
                                .map_err(s.err("write cursor"))?;
                        }
                        Source::Free { seq } => {
                            t.free.remove((i, seq)).map_err(s.err("write free list"))?;
                        }
                    }
                    t.addr
                        .insert(addr_key(p.ip), k)
                        .map_err(s.err("write address"))?;
                }
                t.alloc
                    .insert(k, encode(&ips, pod).as_slice())
                    .map_err(s.err("write allocation"))?;
                Ok((
                    Ok(Done::Allocated(Allocation {
                        key: key.clone(),
                        ips,
                        pod: pod.cloned(),
                    })),
                    Wrote::Created,
                ))
            }
        }
    }

    /// Chooses an address for set `i` without writing anything.
    fn pick(
        &self,
        t: &Tables<'_>,
        i: usize,
        set: &RangeSet,
        fixes: &mut Vec<Fix>,
    ) -> Result<Option<Pick>, IpamError> {
        let s = &self.store;
        let family = set.family();
        for (j, r) in set.ranges().iter().enumerate() {
            let last = t
                .cursor
                .get((idx(i), idx(j)))
                .map_err(s.err("read cursor"))?
                .map(|g| g.value());
            let (start, end) = r.bounds();
            let mut next = match last {
                Some(l) => l.checked_add(1).and_then(|n| r.next_at_or_after(n)),
                None => r.next_at_or_after(start),
            };
            let mut skipped = None;
            while let Some(c) = next {
                // A held address is in the free list (see `plan_release`): passing it loses
                // nothing.
                let free = t
                    .addr
                    .get((family.code(), c))
                    .map_err(s.err("read address"))?
                    .is_none()
                    && !self.held.is_held((family.code(), c));
                if let (true, Some(ip)) = (free, from_u128(family, c)) {
                    if let Some(last) = skipped {
                        fixes.push(Fix::Cursor {
                            set: i,
                            range: j,
                            last,
                        });
                    }
                    return Ok(Some(Pick {
                        set: i,
                        range: j,
                        ip,
                        source: Source::Cursor { range: j },
                    }));
                }
                skipped = Some(c);
                next = c.checked_add(1).and_then(|n| r.next_at_or_after(n));
            }
            if let Some(last) = skipped {
                fixes.push(Fix::Cursor {
                    set: i,
                    range: j,
                    last: last.max(end),
                });
            }
        }
        let lo = (idx(i), 0u64);
        let hi = (idx(i), u64::MAX);
        for entry in t.free.range(lo..=hi).map_err(s.err("read free list"))? {
            let (k, v) = entry.map_err(s.err("read free list"))?;
            let seq = k.value().1;
            let a = v.value();
            let candidate = addr_from_key(a).and_then(|ip| set.position(ip).map(|j| (ip, j)));
            let reserved = t.addr.get(a).map_err(s.err("read address"))?.is_some();
            match candidate {
                // Free, but not to be handed out yet: stays in the list.
                Some(_) if !reserved && self.held.is_held(a) => {}
                Some((ip, j)) if !reserved => {
                    return Ok(Some(Pick {
                        set: i,
                        range: j,
                        ip,
                        source: Source::Free { seq },
                    }));
                }
                _ => fixes.push(Fix::DropFree { set: i, seq }),
            }
        }
        Ok(None)
    }

    fn apply_fixes(&self, t: &mut Tables<'_>, fixes: &[Fix]) -> Result<(), IpamError> {
        let s = &self.store;
        for f in fixes {
            match *f {
                Fix::Cursor { set, range, last } => {
                    t.cursor
                        .insert((idx(set), idx(range)), last)
                        .map_err(s.err("write cursor"))?;
                }
                Fix::DropFree { set, seq } => {
                    t.free
                        .remove((idx(set), seq))
                        .map_err(s.err("write free list"))?;
                }
            }
        }
        Ok(())
    }

    /// Decides what releasing `key` writes, reading only. `None` for an unknown key.
    /// With `holding`, every address goes to the free list: a held one may be passed by a
    /// cursor meanwhile.
    fn plan_release(
        &self,
        t: &Tables<'_>,
        key: &AllocationKey,
        holding: bool,
    ) -> Result<Option<ReleasePlan>, IpamError> {
        let s = &self.store;
        let k = (key.container_id.as_str(), key.ifname.as_str());
        let alloc = match t.alloc.get(k).map_err(s.err("read allocation"))? {
            Some(v) => decode(key.clone(), v.value()).map_err(|r| s.corrupt(key.to_string(), r))?,
            None => return Ok(None),
        };
        let mut seq = match t.meta.get(META_SEQ).map_err(s.err("read meta"))? {
            Some(v) => u64::from_le_bytes(
                v.value()
                    .try_into()
                    .map_err(|_| s.corrupt("meta seq", "not 8 bytes"))?,
            ),
            None => 0,
        };
        let mut owned = Vec::with_capacity(alloc.ips.len());
        let mut freed = Vec::new();
        for ip in &alloc.ips {
            let ip = ip.address.ip();
            let a = addr_key(ip);
            let mine = match t.addr.get(a).map_err(s.err("read address"))? {
                Some(g) => g.value() == k,
                None => false,
            };
            if owned.contains(&a) {
                continue; // listed twice in the record
            }
            if !mine {
                tracing::warn!(network = %self.network, %key, %ip, "address not reserved for this key; left alone");
                continue;
            }
            owned.push(a);
            // Addresses the cursor has passed go to the back of the free list; those above it
            // (possible after a config change) will be found by the cursor again.
            if let Some((i, j)) = self.ranges.position(ip) {
                let passed = t
                    .cursor
                    .get((idx(i), idx(j)))
                    .map_err(s.err("read cursor"))?
                    .is_some_and(|g| to_u128(ip) <= g.value());
                if passed || holding {
                    seq += 1;
                    freed.push(((idx(i), seq), a));
                }
            }
        }
        Ok(Some(ReleasePlan {
            alloc,
            owned,
            freed,
            seq,
        }))
    }

    /// Writes a release plan; `Err` only for a failed write (see [`Core::apply_allocate`]).
    fn apply_release(
        &self,
        t: &mut Tables<'_>,
        key: &AllocationKey,
        plan: ReleasePlan,
    ) -> Result<(Outcome, bool), IpamError> {
        let s = &self.store;
        let k = (key.container_id.as_str(), key.ifname.as_str());
        t.alloc.remove(k).map_err(s.err("remove allocation"))?;
        for a in &plan.owned {
            t.addr.remove(*a).map_err(s.err("remove address"))?;
        }
        for (entry, a) in &plan.freed {
            t.free
                .insert(*entry, *a)
                .map_err(s.err("write free list"))?;
        }
        t.meta
            .insert(META_SEQ, plan.seq.to_le_bytes().as_slice())
            .map_err(s.err("write meta"))?;
        Ok((Ok(Done::Released(Some(plan.alloc))), true))
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

    fn ip(o: &Outcome) -> String {
        match o {
            Ok(Done::Allocated(a)) => a.ips[0].address.ip().to_string(),
            other => panic!("not an allocation: {other:?}"),
        }
    }

    const V4_28: &str = r#"{"subnet":"10.244.1.0/28"}"#; // .2 ..= .14: 13 addresses

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
    fn same_key_twice_in_a_batch_is_one_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let out = a.run_batch(&[
            Op::Allocate(key(1), None),
            Op::Allocate(key(1), None),
            Op::Allocate(key(2), None),
        ]);
        assert_eq!(ip(&out[0]), "10.244.1.2");
        assert_eq!(ip(&out[1]), "10.244.1.2");
        assert_eq!(ip(&out[2]), "10.244.1.3");
        assert_eq!(a.count().unwrap(), 2);
    }

    #[test]
    fn allocate_release_allocate_one_key_in_a_batch_is_serial() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let out = a.run_batch(&[
            Op::Release(key(1)),
            Op::Allocate(key(1), None),
            Op::Release(key(1)),
            Op::Allocate(key(1), None),
            Op::Release(key(2)),
        ]);
        assert!(matches!(out[0], Ok(Done::Released(None))), "{:?}", out[0]);
        assert_eq!(ip(&out[1]), "10.244.1.2");
        match &out[2] {
            Ok(Done::Released(Some(r))) => {
                assert_eq!(r.ips[0].address.ip().to_string(), "10.244.1.2")
            }
            other => panic!("{other:?}"),
        }
        // The released .2 went to the free list; the cursor still has fresh addresses.
        assert_eq!(ip(&out[3]), "10.244.1.3");
        assert!(matches!(out[4], Ok(Done::Released(None))));
        assert_eq!(
            a.get(&key(1)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.3"
        );
        assert_eq!(a.count().unwrap(), 1);
    }

    #[test]
    fn release_then_allocate_in_a_batch_does_not_reuse_the_released_address() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), r#"{"subnet":"10.244.1.0/24"}"#);
        for i in 0..3 {
            a.allocate(&key(i)).unwrap(); // .2 .3 .4
        }
        let out = a.run_batch(&[
            Op::Release(key(0)),
            Op::Allocate(key(9), None),
            Op::Allocate(key(0), None),
        ]);
        assert!(matches!(out[0], Ok(Done::Released(Some(_)))));
        assert_eq!(ip(&out[1]), "10.244.1.5");
        assert_eq!(
            ip(&out[2]),
            "10.244.1.6",
            "not its own just-released address either"
        );
    }

    #[test]
    fn reuse_in_a_batch_takes_the_oldest_release_first() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        for i in 0..13 {
            a.allocate(&key(i)).unwrap(); // .2 ..= .14, full
        }
        a.release(&key(4)).unwrap().unwrap(); // .6, released first
        let out = a.run_batch(&[
            Op::Release(key(9)), // .11
            Op::Allocate(key(20), None),
            Op::Allocate(key(21), None),
            Op::Allocate(key(22), None),
        ]);
        assert_eq!(ip(&out[1]), "10.244.1.6");
        assert_eq!(ip(&out[2]), "10.244.1.11");
        assert!(
            matches!(out[3], Err(IpamError::Exhausted { .. })),
            "{:?}",
            out[3]
        );
        assert_eq!(a.count().unwrap(), 13);
    }

    #[test]
    fn exhaustion_of_one_op_leaves_the_others_committed() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        for i in 0..12 {
            a.allocate(&key(i)).unwrap();
        }
        let out = a.run_batch(&[
            Op::Allocate(key(20), None),
            Op::Allocate(key(21), None),
            Op::Release(key(3)),
            Op::Allocate(key(21), None),
            Op::Allocate(key(22), None),
        ]);
        assert_eq!(ip(&out[0]), "10.244.1.14");
        assert!(
            matches!(out[1], Err(IpamError::Exhausted { .. })),
            "{:?}",
            out[1]
        );
        assert!(matches!(out[2], Ok(Done::Released(Some(_)))));
        assert_eq!(
            ip(&out[3]),
            "10.244.1.5",
            "the address released earlier in the batch"
        );
        assert!(
            matches!(out[4], Err(IpamError::Exhausted { .. })),
            "{:?}",
            out[4]
        );
        drop(a);
        // Durable: a fresh allocator on the same file sees the batch.
        let a = open(dir.path(), V4_28);
        assert_eq!(a.count().unwrap(), 13);
        assert_eq!(
            a.get(&key(20)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.14"
        );
        assert_eq!(
            a.get(&key(21)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.5"
        );
        assert!(a.get(&key(3)).unwrap().is_none());
        assert!(a.get(&key(22)).unwrap().is_none());
    }

    #[test]
    fn a_corrupt_record_fails_only_its_own_op() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        {
            let s = &a.core.store;
            let txn = s.begin_write().unwrap();
            {
                let mut t = s.tables(&txn).unwrap();
                t.alloc
                    .insert(("bad", "eth0"), b"not json".as_slice())
                    .unwrap();
            }
            s.commit(txn).unwrap();
        }
        let bad = AllocationKey::new("bad", "eth0");
        let out = a.run_batch(&[
            Op::Release(bad.clone()),
            Op::Allocate(key(1), None),
            Op::Allocate(bad, None),
        ]);
        assert!(
            matches!(out[0], Err(IpamError::Corrupt { .. })),
            "{:?}",
            out[0]
        );
        assert_eq!(ip(&out[1]), "10.244.1.2");
        assert!(
            matches!(out[2], Err(IpamError::Corrupt { .. })),
            "{:?}",
            out[2]
        );
        assert_eq!(
            a.get(&key(1)).unwrap().unwrap().ips[0]
                .address
                .ip()
                .to_string(),
            "10.244.1.2"
        );
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
            ip(&a.run_batch(&[Op::Allocate(key(2), None)])[0]),
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

    #[test]
    fn reserve_answers_before_durable_and_nothing_else_gets_the_address() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let r1 = a.reserve(&key(1), None).unwrap();
        assert!(r1.is_new());
        let first = r1.allocation().clone();
        // Before anyone awaited durability, the next callers get other addresses.
        let second = a.allocate(&key(2)).unwrap();
        let r3 = a.reserve(&key(3), None).unwrap();
        let ips: std::collections::HashSet<_> = [&first, &second, r3.allocation()]
            .iter()
            .map(|al| al.ips[0].address.ip())
            .collect();
        assert_eq!(ips.len(), 3);
        assert_eq!(r1.wait_durable().unwrap(), first);
        r3.wait_durable().unwrap();
        // Durable: a fresh allocator on the same file has them.
        drop(a);
        let a = open(dir.path(), V4_28);
        assert_eq!(a.get(&key(1)).unwrap(), Some(first));
        assert_eq!(a.count().unwrap(), 3);
    }

    #[tokio::test]
    async fn queued_reserve_and_release_answer_like_the_blocking_ones() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let held = a.allocate(&key(1)).unwrap();
        // Queued before anything is awaited: both are answered, with different addresses.
        let (r2, r3) = tokio::join!(
            a.reserve_queued(&key(2), None),
            a.reserve_queued(&key(3), None)
        );
        let (r2, r3) = (r2.unwrap(), r3.unwrap());
        assert!(r2.is_new() && r3.is_new());
        assert_ne!(r2.allocation().ips, r3.allocation().ips);
        assert_ne!(r2.allocation().ips, held.ips);
        let second = r2.durable().await.unwrap();
        r3.durable().await.unwrap();
        // An existing key comes back as it is, not new.
        let again = a.reserve_queued(&key(1), None).await.unwrap();
        assert!(!again.is_new());
        assert_eq!(again.durable().await.unwrap(), held);
        // Release: the allocation released; an unknown key is nothing, and writes nothing.
        assert_eq!(a.release_holding(&key(2)).await.unwrap(), Some(second));
        assert_eq!(a.release_holding(&key(9)).await.unwrap(), None);
        a.end_hold(&key(2));
        assert_eq!(a.get(&key(2)).unwrap(), None);
        drop(a);
        let a = open(dir.path(), V4_28);
        assert_eq!(a.count().unwrap(), 2, "key 1 and key 3, durable");
        assert_eq!(a.get(&key(1)).unwrap(), Some(held));
    }

    #[test]
    fn reserve_of_an_existing_key_is_not_new_and_already_durable() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        let held = a.allocate(&key(1)).unwrap();
        let again = a.reserve(&key(1), None).unwrap();
        assert!(!again.is_new());
        assert_eq!(again.allocation(), &held);
        assert_eq!(again.wait_durable().unwrap(), held);
        assert_eq!(a.count().unwrap(), 1);
    }

    #[test]
    fn reserve_on_exhaustion_fails_and_reserves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        for i in 0..13 {
            a.allocate(&key(i)).unwrap();
        }
        assert!(matches!(
            a.reserve(&key(99), None),
            Err(IpamError::Exhausted { .. })
        ));
        assert_eq!(a.count().unwrap(), 13);
    }

    #[tokio::test]
    async fn reserve_durability_can_be_awaited() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(open(dir.path(), V4_28));
        let reserved = {
            let a = Arc::clone(&a);
            tokio::task::spawn_blocking(move || a.reserve(&key(1), None))
                .await
                .unwrap()
                .unwrap()
        };
        let want = reserved.allocation().clone();
        assert_eq!(reserved.durable().await.unwrap(), want);
        assert_eq!(a.get(&key(1)).unwrap(), Some(want));
    }

    #[test]
    fn a_failed_commit_fails_the_reservation_and_refuses_later_writes() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), V4_28);
        a.allocate(&key(0)).unwrap();
        a.core
            .fail_next_staged_commit
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let r = a.reserve(&key(1), None).unwrap();
        let err = r.wait_durable().unwrap_err();
        assert!(err.to_string().contains("injected commit failure"), "{err}");
        // Not on disk, and no later write may hand its address out again.
        assert!(a.get(&key(1)).unwrap().is_none());
        let why = a.unwritable().expect("unwritable after a failed commit");
        assert!(why.contains("injected commit failure"), "{why}");
        assert!(why.contains(&a.path().display().to_string()), "{why}");
        let refused = a.allocate(&key(2)).unwrap_err();
        assert!(
            refused.to_string().contains("reopen the store"),
            "{refused}"
        );
        assert!(a.release(&key(0)).is_err());
        // Reads still work; a reopened allocator works again.
        assert_eq!(a.count().unwrap(), 1);
        drop(a);
        let a = open(dir.path(), V4_28);
        assert!(a.unwritable().is_none());
        a.allocate(&key(2)).unwrap();
    }
}
