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
//! so each such address is skipped once (amortised O(log n)). Nothing scans all entries except
//! `open` (which builds the report) and `list`.
//!
//! Each operation is one redb write transaction committed with `Durability::Immediate`; redb
//! serialises writers only for the duration of that transaction. The candidate addresses are
//! chosen before anything is written, so an exhausted set leaves no partial state (and a later
//! group commit can run several operations in one transaction).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;
use redb::{ReadableTable, ReadableTableMetadata};

use super::allocation::{AllocatedIp, Allocation, AllocationKey};
use super::error::IpamError;
use super::range::{RangeSet, RangeSets, from_u128, to_u128};
use super::store::{Store, Tables, addr_from_key, addr_key, decode, encode};

const META_RANGES: &str = "ranges";
const META_SEQ: &str = "seq";

/// Durable, thread-safe allocator of one network. Cheap to share behind an `Arc`.
pub struct Allocator {
    store: Store,
    network: String,
    ranges: RangeSets,
}

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

fn idx(i: usize) -> u32 {
    // Range sets and ranges come from a config file; more than 4 billion is not a config.
    u32::try_from(i).unwrap_or(u32::MAX)
}

impl Allocator {
    /// Opens (or creates) the store of `network` under `data_dir` and checks its allocations
    /// against `ranges`.
    pub fn open(
        data_dir: &Path,
        network: &str,
        ranges: &RangeSets,
    ) -> Result<(Allocator, OpenReport), IpamError> {
        let store = Store::open(data_dir, network)?;
        let mut report = OpenReport {
            path: store.path().to_path_buf(),
            ..OpenReport::default()
        };
        let fingerprint = ranges.fingerprint();
        let txn = store.begin_write()?;
        {
            let t = store.tables(&txn)?;
            report.ranges_changed = match t.meta.get(META_RANGES).map_err(store.err("read meta"))? {
                Some(v) => v.value() != fingerprint.as_bytes(),
                None => true,
            };
        }
        if report.ranges_changed {
            // Cursors and free lists are indexed by (set, range) position; start them afresh.
            // Reservations live in `addr`, which the cursors consult, so nothing is lost.
            store.reset_cursors(&txn)?;
        }
        {
            let mut t = store.tables(&txn)?;
            if report.ranges_changed {
                t.meta
                    .insert(META_RANGES, fingerprint.as_bytes())
                    .map_err(store.err("write meta"))?;
            }
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
        }
        store.commit(txn)?;
        for a in &report.out_of_range {
            tracing::warn!(network, key = %a.key, ips = ?a.ips, "allocation outside the configured ranges; kept reserved");
        }
        for (key, reason) in &report.unreadable {
            tracing::warn!(network, %key, %reason, "unreadable allocation record; its addresses stay reserved");
        }
        Ok((
            Allocator {
                store,
                network: network.to_string(),
                ranges: ranges.clone(),
            },
            report,
        ))
    }

    pub fn network(&self) -> &str {
        &self.network
    }
    pub fn ranges(&self) -> &RangeSets {
        &self.ranges
    }
    pub fn path(&self) -> &Path {
        self.store.path()
    }

    /// Reserves one address per range set for `key`, durably, or returns the existing allocation
    /// of `key`. On exhaustion nothing is reserved and the error names the exhausted set(s).
    pub fn allocate(&self, key: &AllocationKey) -> Result<Allocation, IpamError> {
        // A retried ADD is answered from a snapshot without queueing behind writers.
        if let Some(existing) = self.get(key)? {
            return Ok(existing);
        }
        let s = &self.store;
        let txn = s.begin_write()?;
        let mut t = s.tables(&txn)?;
        let k = (key.container_id.as_str(), key.ifname.as_str());
        if let Some(v) = t.alloc.get(k).map_err(s.err("read allocation"))? {
            return decode(key.clone(), v.value()).map_err(|r| s.corrupt(key.to_string(), r));
        }

        let mut picks = Vec::with_capacity(self.ranges.sets().len());
        let mut fixes = Vec::new();
        let mut exhausted = Vec::new();
        for (i, set) in self.ranges.sets().iter().enumerate() {
            match self.pick(&t, i, set, &mut fixes)? {
                Some(p) => picks.push(p),
                None => exhausted.push(set.to_string()),
            }
        }
        self.apply_fixes(&mut t, &fixes)?;
        if !exhausted.is_empty() {
            drop(t);
            if fixes.is_empty() {
                drop(txn); // abort: nothing to keep
            } else {
                s.commit(txn)?;
            }
            return Err(IpamError::Exhausted {
                key: key.to_string(),
                range_sets: exhausted,
            });
        }

        let mut ips = Vec::with_capacity(picks.len());
        for p in picks {
            let (i, j) = (idx(p.set), idx(p.range));
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
            let r = self
                .ranges
                .sets()
                .get(p.set)
                .and_then(|set| set.ranges().get(p.range))
                .ok_or_else(|| s.corrupt(format!("range {i}/{j}"), "picked from unknown range"))?;
            let address = IpNetwork::new(p.ip, r.subnet().prefix())
                .map_err(|e| s.corrupt(p.ip.to_string(), e.to_string()))?;
            ips.push(AllocatedIp {
                address,
                gateway: r.gateway(),
            });
        }
        t.alloc
            .insert(k, encode(&ips).as_slice())
            .map_err(s.err("write allocation"))?;
        drop(t);
        s.commit(txn)?;
        Ok(Allocation {
            key: key.clone(),
            ips,
        })
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
                let free = t
                    .addr
                    .get((family.code(), c))
                    .map_err(s.err("read address"))?
                    .is_none();
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

    /// Releases the allocation of `key` durably. Unknown keys are `Ok(None)`.
    pub fn release(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        // DEL is often repeated; an unknown key needs no write transaction.
        if self.get(key)?.is_none() {
            return Ok(None);
        }
        let s = &self.store;
        let txn = s.begin_write()?;
        let mut t = s.tables(&txn)?;
        let k = (key.container_id.as_str(), key.ifname.as_str());
        let Some(bytes) = t
            .alloc
            .remove(k)
            .map_err(s.err("remove allocation"))?
            .map(|g| g.value().to_vec())
        else {
            return Ok(None);
        };
        let alloc = decode(key.clone(), &bytes).map_err(|r| s.corrupt(key.to_string(), r))?;
        let mut seq = match t.meta.get(META_SEQ).map_err(s.err("read meta"))? {
            Some(v) => u64::from_le_bytes(
                v.value()
                    .try_into()
                    .map_err(|_| s.corrupt("meta seq", "not 8 bytes"))?,
            ),
            None => 0,
        };
        for ip in &alloc.ips {
            let ip = ip.address.ip();
            let a = addr_key(ip);
            let owned = match t.addr.get(a).map_err(s.err("read address"))? {
                Some(g) => g.value() == k,
                None => false,
            };
            if !owned {
                tracing::warn!(network = %self.network, %key, %ip, "address not reserved for this key; left alone");
                continue;
            }
            t.addr.remove(a).map_err(s.err("remove address"))?;
            // Addresses the cursor has passed go to the back of the free list; those above it
            // (possible after a config change) will be found by the cursor again.
            if let Some((i, j)) = self.ranges.position(ip) {
                let passed = t
                    .cursor
                    .get((idx(i), idx(j)))
                    .map_err(s.err("read cursor"))?
                    .is_some_and(|g| to_u128(ip) <= g.value());
                if passed {
                    seq += 1;
                    t.free
                        .insert((idx(i), seq), a)
                        .map_err(s.err("write free list"))?;
                }
            }
        }
        t.meta
            .insert(META_SEQ, seq.to_le_bytes().as_slice())
            .map_err(s.err("write meta"))?;
        drop(t);
        s.commit(txn)?;
        Ok(Some(alloc))
    }

    /// The allocation of `key`, if any (read-only snapshot, no lock on writers).
    pub fn get(&self, key: &AllocationKey) -> Result<Option<Allocation>, IpamError> {
        let s = &self.store;
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

    /// Every allocation, ordered by key. O(n); for reconciliation and inspection.
    pub fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        let s = &self.store;
        let txn = s.begin_read()?;
        let table = s.read_alloc(&txn)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(s.err("scan allocations"))? {
            let (k, v) = entry.map_err(s.err("scan allocations"))?;
            let (cid, ifname) = k.value();
            let key = AllocationKey::new(cid, ifname);
            out.push(decode(key.clone(), v.value()).map_err(|r| s.corrupt(key.to_string(), r))?);
        }
        Ok(out)
    }

    /// Number of allocations.
    pub fn count(&self) -> Result<u64, IpamError> {
        let s = &self.store;
        let txn = s.begin_read()?;
        s.read_alloc(&txn)?
            .len()
            .map_err(s.err("count allocations"))
    }
}
