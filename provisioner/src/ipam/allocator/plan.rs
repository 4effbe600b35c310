//! Each write operation as a read-only plan (choose every address, decode records, detect
//! exhaustion) and an apply that only writes what the plan chose; a plan that fails writes
//! nothing but harmless fixes, so it fails its own operation alone.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use redb::ReadableTable;

use super::{Core, Done, Outcome, StoreWrite, names_pod};
use crate::ipam::allocation::{AllocatedIp, Allocation, AllocationKey};
use crate::ipam::error::IpamError;
use crate::ipam::range::{RangeSet, from_u128, to_u128};
use crate::ipam::store::{AddrT, Tables, addr_from_key, addr_key, decode, encode};
use crate::pod::Pod;

const META_SEQ: &str = "seq";

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
pub(super) enum Wrote {
    Nothing,
    /// A new allocation.
    Created,
    /// Anything else: an existing record, a release, store fixes.
    Updated,
}

impl Wrote {
    pub(super) fn any(self) -> bool {
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

fn idx(i: usize) -> u32 {
    // Range sets and ranges come from a config file; more than 4 billion is not a config.
    u32::try_from(i).unwrap_or(u32::MAX)
}

impl Core {
    /// Applies `ops` in order in one write transaction, not committed; per operation its
    /// outcome and whether it wrote anything. `Err` means a write failed and the transaction is
    /// unusable.
    pub(super) fn apply(
        &self,
        ops: &[StoreWrite],
    ) -> Result<(redb::WriteTransaction, Vec<Outcome>, Vec<Wrote>), IpamError> {
        let s = &self.store;
        let txn = s.begin_write()?;
        let mut outcomes = Vec::with_capacity(ops.len());
        let mut writes = Vec::with_capacity(ops.len());
        {
            let mut t = s.tables(&txn)?;
            for op in ops {
                let (outcome, wrote) = match op {
                    StoreWrite::Allocate(key, pod) => match self.plan_allocate(&t, key) {
                        Ok(plan) => self.apply_allocate(&mut t, key, pod.as_ref(), plan)?,
                        Err(e) => (Err(e), Wrote::Nothing),
                    },
                    StoreWrite::Release(key) | StoreWrite::ReleaseHolding(key) => {
                        let holding = matches!(op, StoreWrite::ReleaseHolding(_));
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
mod tests {
    use super::super::tests::{V4_28, ip, key, open};
    use crate::ipam::allocator::{Done, StoreWrite};
    use crate::ipam::error::IpamError;

    #[test]
    fn release_then_allocate_in_a_batch_does_not_reuse_the_released_address() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(dir.path(), r#"{"subnet":"10.244.1.0/24"}"#);
        for i in 0..3 {
            a.allocate(&key(i)).unwrap(); // .2 .3 .4
        }
        let out = a.run_batch(&[
            StoreWrite::Release(key(0)),
            StoreWrite::Allocate(key(9), None),
            StoreWrite::Allocate(key(0), None),
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
            StoreWrite::Release(key(9)), // .11
            StoreWrite::Allocate(key(20), None),
            StoreWrite::Allocate(key(21), None),
            StoreWrite::Allocate(key(22), None),
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
}
