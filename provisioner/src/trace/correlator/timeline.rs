//! The timeline of one network namespace: what happened to it, in time order, bounded.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::trace::kernel::events::{NetnsRef, TraceEvent};
use crate::trace::verdict::{Creator, RequestStatus, Step, TimelineEntry, Verdict};

use super::effects::Effect;
use super::pods::PodState;
use super::state::Progress;

/// Entries kept per namespace; older ones are folded into its [`Progress`] so that a flood of
/// requests costs bounded memory and loses no fact.
pub(super) const MAX_ENTRIES: usize = 256;
/// A sandbox whose setup keeps going is judged at the latest this many deadlines after its
/// creation or ADD.
pub(super) const SETUP_DEADLINES: u32 = 3;
/// Entries a timeline has room for from the start: a sandbox's setup takes about a dozen (the
/// vector is not grown four times at every ADD; [`Ns::at_rest`] gives back what stays unused).
const FIRST_ENTRIES: usize = 16;
/// Namespace files remembered per namespace to read its state from.
const MAX_HANDLES: usize = 8;
/// Pins kept per namespace: a runtime pins a sandbox once; a user looping on (even refused)
/// bind mounts must not grow the daemon.
const MAX_PINS: usize = 8;
/// Processes whose execs were added to a timeline.
const MAX_ATTRIBUTED_PIDS: usize = 64;

/// One timeline entry with what it does.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Unique within its namespace (replies find their request by it).
    pub id: u64,
    /// Shared with the verdicts that quote it.
    pub public: Arc<TimelineEntry>,
    pub effect: Option<Effect>,
    /// An extack seen while the kernel processed this request.
    pub extack: Option<String>,
}

/// Reading a namespace's state: asked for, and the last answer.
#[derive(Clone, Debug, Default)]
pub(super) struct SnapshotState {
    /// A read is under way (asked for at that time).
    pub pending_since: Option<SystemTime>,
    /// Start of the last read that answered (success or failure).
    pub answered_at: Option<SystemTime>,
    /// Why the last read failed.
    pub error: Option<String>,
}

/// What the correlator knows of one network namespace.
pub(super) struct Ns {
    pub netns: NetnsRef,
    /// Creation time when seen, else when it became known.
    pub created_at: SystemTime,
    /// Its deadline runs from here: creation, or the latest ADD naming it.
    pub deadline_from: SystemTime,
    /// The latest configuration request sent into it before its verdict: its setup is at work
    /// until then (see [`Ns::due`]).
    pub setup_seen_at: Option<SystemTime>,
    pub creator: Creator,
    /// Its creation was seen: the timeline is its whole history.
    pub origin_known: bool,
    pub pins: Vec<PathBuf>,
    /// Namespace files that may be it (pins, an ADD's netns path, `/proc/<pid>/ns/net`).
    pub handles: Vec<PathBuf>,
    /// Named by an ADD, `--netns`, or found pinned as a sandbox.
    pub expected: bool,
    pub entries: Vec<Entry>,
    /// What the entries folded away added up to, once some were (boxed: most timelines never
    /// hold enough entries to fold any).
    base: Option<Box<Progress>>,
    /// The whole timeline folded, kept up to date while entries arrive in time order (the
    /// common case); recomputed after one arrives late or a request turns out rejected. Shared
    /// with the callers of [`Ns::progress`] rather than copied for each.
    folded: Option<Arc<Progress>>,
    /// The latest entry time.
    latest: Option<SystemTime>,
    /// Number of entries folded away.
    pub folded_away: usize,
    next_id: u64,
    ifnames: HashMap<u32, String>,
    pub destroyed_at: Option<SystemTime>,
    /// The last verdict given.
    pub verdict: Option<Verdict>,
    pub snapshot: SnapshotState,
    /// When to read the state of a sandbox judged an alarm again (its network may come late
    /// by a path the trace does not see).
    pub recheck: Option<(SystemTime, std::time::Duration)>,
    pub attributed_pids: HashSet<u32>,
    pub pod: PodState,
}

impl Ns {
    pub(super) fn new(netns: NetnsRef, at: SystemTime) -> Self {
        Self {
            netns,
            created_at: at,
            deadline_from: at,
            setup_seen_at: None,
            creator: Creator::default(),
            origin_known: false,
            pins: Vec::new(),
            handles: Vec::new(),
            expected: false,
            entries: Vec::with_capacity(FIRST_ENTRIES),
            base: None,
            folded: Some(Arc::default()),
            latest: None,
            folded_away: 0,
            next_id: 0,
            ifnames: HashMap::new(),
            destroyed_at: None,
            verdict: None,
            snapshot: SnapshotState::default(),
            recheck: None,
            attributed_pids: HashSet::new(),
            pod: PodState::default(),
        }
    }

    /// When its verdict is due: `deadline` after its setup went quiet. The deadline runs from
    /// creation or the latest ADD, and again from each configuration request sent into it (a
    /// setup under way on a loaded node is not judged half done), but a setup that never ends
    /// is judged [`SETUP_DEADLINES`] deadlines after creation or the ADD at the latest.
    pub(super) fn due(&self, deadline: Duration) -> SystemTime {
        let latest_restart = self.deadline_from + deadline * (SETUP_DEADLINES - 1);
        let quiet_from = self.setup_seen_at.map_or(self.deadline_from, |at| {
            at.clamp(self.deadline_from, latest_restart)
        });
        quiet_from + deadline
    }

    /// Notes a configuration request sent into it at `at` (its setup is at work).
    pub(super) fn setup_at_work(&mut self, at: SystemTime) {
        if self.verdict.is_none() {
            self.setup_seen_at = self.setup_seen_at.max(Some(at));
        }
    }

    /// Remembers a namespace file that may be this namespace.
    /// Records that the namespace is pinned at `path`; false when it already was, or when it
    /// holds [`MAX_PINS`] pins (the path is still tried as a handle).
    pub(super) fn add_pin(&mut self, path: PathBuf) -> bool {
        let new = !self.pins.contains(&path) && self.pins.len() < MAX_PINS;
        if new {
            self.pins.push(path.clone());
        }
        self.add_handle(path);
        new
    }

    pub(super) fn add_handle(&mut self, path: PathBuf) {
        if !self.handles.contains(&path) {
            if self.handles.len() >= MAX_HANDLES {
                self.handles.remove(0);
            }
            self.handles.push(path);
        }
    }

    /// Whether the execs of `pid` were already added; marks them added.
    pub(super) fn attribute(&mut self, pid: u32) -> bool {
        if self.attributed_pids.contains(&pid) || self.attributed_pids.len() >= MAX_ATTRIBUTED_PIDS
        {
            return false;
        }
        self.attributed_pids.insert(pid)
    }

    /// Appends a step caused by `event`; returns its id.
    pub(super) fn push(&mut self, event: &TraceEvent, step: Step, effect: Option<Effect>) -> u64 {
        self.push_at(
            TimelineEntry {
                at: event.at,
                pid: event.task.pid,
                comm: event.task.comm.clone(),
                step,
            },
            effect,
        )
    }

    /// Appends an entry; returns its id.
    pub(super) fn push_at(
        &mut self,
        public: impl Into<Arc<TimelineEntry>>,
        effect: Option<Effect>,
    ) -> u64 {
        let public = public.into();
        let id = self.next_id;
        self.next_id += 1;
        let entry = Entry {
            id,
            public,
            effect,
            extack: None,
        };
        let in_order = self.latest.is_none_or(|latest| entry.public.at >= latest);
        self.latest = Some(
            self.latest
                .map_or(entry.public.at, |l| l.max(entry.public.at)),
        );
        match &mut self.folded {
            Some(folded) if in_order => Arc::make_mut(folded).step(&entry, &self.ifnames),
            _ => self.folded = None,
        }
        self.entries.push(entry);
        if self.entries.len() > MAX_ENTRIES {
            self.compact();
        }
        id
    }

    fn entry_mut(&mut self, id: u64) -> Option<&mut Entry> {
        self.entries.iter_mut().rev().find(|e| e.id == id)
    }

    /// The extack seen while the kernel processed request `id` (before its answer).
    pub(super) fn set_extack(&mut self, id: u64, extack: Option<String>) {
        if let Some(entry) = self.entry_mut(id) {
            entry.extack = extack;
        }
    }

    /// The kernel's answer to request `id` (`errno` 0: acked); false when it is not kept.
    pub(super) fn answer(&mut self, id: u64, errno: i32, extack: Option<String>) -> bool {
        let Some(entry) = self.entry_mut(id) else {
            return false;
        };
        let Step::Request { status, .. } = &mut Arc::make_mut(&mut entry.public).step else {
            return false;
        };
        *status = if errno == 0 {
            RequestStatus::Acked
        } else {
            RequestStatus::Rejected {
                errno,
                extack: extack.or_else(|| entry.extack.clone()),
            }
        };
        if errno != 0 {
            // A rejected request changed nothing: fold again without its effect.
            self.folded = None;
        }
        true
    }

    /// Entries in time order (they arrive in processing order: a state read is dated when it
    /// started, and events from the ring buffer may arrive after it).
    fn sorted(&self) -> Vec<&Entry> {
        let mut sorted: Vec<&Entry> = self.entries.iter().collect();
        sorted.sort_by_key(|e| e.public.at);
        sorted
    }

    /// The whole timeline folded.
    pub(super) fn progress(&mut self) -> Arc<Progress> {
        if let Some(folded) = &self.folded {
            return Arc::clone(folded);
        }
        let base = self.base.as_deref().cloned().unwrap_or_default();
        let folded = Arc::new(base.fold(self.sorted(), &self.ifnames));
        self.folded = Some(Arc::clone(&folded));
        folded
    }

    /// Interface names known by index.
    pub(super) fn ifnames(&self) -> &HashMap<u32, String> {
        &self.ifnames
    }

    /// A name learned for an interface (a device event, a state read) changes how earlier
    /// steps that named it by index only read: those are folded again.
    pub(super) fn name_interface(&mut self, ifindex: u32, name: &str) {
        if self
            .ifnames
            .get(&ifindex)
            .is_some_and(|known| known == name)
        {
            return;
        }
        self.ifnames.insert(ifindex, name.to_owned());
        if self
            .folded
            .as_ref()
            .is_some_and(|folded| folded.named_by_index.contains(&ifindex))
        {
            self.folded = None;
        }
    }

    /// The timeline in time order, for a verdict.
    pub(super) fn timeline(&self) -> Vec<Arc<TimelineEntry>> {
        self.sorted()
            .into_iter()
            .map(|e| Arc::clone(&e.public))
            .collect()
    }

    /// After a verdict a namespace is usually at rest for good (a sandbox lives on, networked):
    /// its entries' spare capacity (a third of a doubling vector, 200 bytes an entry) is given
    /// back rather than kept for every live sandbox.
    pub(super) fn at_rest(&mut self) {
        self.entries.shrink_to_fit();
        self.handles.shrink_to_fit();
    }

    pub(super) fn last_entry(&self) -> Option<&TimelineEntry> {
        self.entries.iter().map(|e| &*e.public).max_by_key(|e| e.at)
    }

    /// Folds the older half of the entries into the base.
    fn compact(&mut self) {
        self.entries.sort_by_key(|e| e.public.at);
        let keep = self.entries.split_off(self.entries.len() / 2);
        let old = std::mem::replace(&mut self.entries, keep);
        self.folded_away += old.len();
        let base = self.base.take().map(|b| *b).unwrap_or_default();
        self.base = Some(Box::new(base.fold(&old, &self.ifnames)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::kernel::events::DevChange;
    use crate::trace::kernel::events::{EventKind, TaskInfo};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn pins_are_kept_once_and_bounded() {
        let mut ns = Ns::new(NetnsRef::default(), UNIX_EPOCH);
        let pin = PathBuf::from("/run/netns/cni-a");
        assert!(ns.add_pin(pin.clone()));
        assert!(!ns.add_pin(pin), "the same pin twice");
        for i in 0..10_000 {
            ns.add_pin(PathBuf::from(format!("/run/netns/cni-{i}")));
        }
        assert_eq!(ns.pins.len(), MAX_PINS);
        assert!(ns.handles.len() <= MAX_HANDLES);
    }

    fn dev_up(ms: u64, ifindex: u32) -> TraceEvent {
        TraceEvent {
            at: UNIX_EPOCH + Duration::from_millis(ms),
            task: TaskInfo {
                pid: 1,
                tid: 1,
                comm: "ip".into(),
                cgroup_id: 0,
            },
            kind: EventKind::DevUp(DevChange {
                netns: NetnsRef::default(),
                ifindex,
                ifname: format!("d{ifindex}"),
                dev_flags: 1,
                netns_dying: false,
                qdisc: "noqueue".into(),
            }),
        }
    }

    fn link_up_detail(ifindex: u32) -> crate::trace::render::RequestDetail {
        let up =
            crate::trace::netlink_parse::RtRequest::SetLink(crate::trace::netlink_parse::LinkMsg {
                ifindex: i32::try_from(ifindex).expect("small"),
                flags: 1,
                ..Default::default()
            });
        crate::trace::render::RequestDetail::new(&up, &HashMap::new()).expect("a change")
    }

    #[test]
    fn a_flood_is_folded_without_losing_facts() {
        let mut ns = Ns::new(NetnsRef::default(), UNIX_EPOCH);
        for i in 0..(3 * MAX_ENTRIES as u64) {
            let ifindex = u32::try_from(i).expect("small") + 2;
            let event = dev_up(i, ifindex);
            ns.push(
                &event,
                Step::DevUp {
                    ifname: format!("d{ifindex}"),
                    ifindex,
                },
                Some(Effect::DevUp {
                    ifindex,
                    ifname: format!("d{ifindex}"),
                }),
            );
        }
        assert!(ns.entries.len() <= MAX_ENTRIES);
        assert_eq!(ns.folded_away + ns.entries.len(), 3 * MAX_ENTRIES);
        assert_eq!(ns.progress().now.up.iter().count(), 3 * MAX_ENTRIES);
    }

    /// The fold kept up to date as entries arrive equals a fold from scratch, whatever the
    /// order they arrive in and whether a request is rejected afterwards.
    #[test]
    fn the_incremental_fold_equals_a_fold_from_scratch() {
        let mut ns = Ns::new(NetnsRef::default(), UNIX_EPOCH);
        let times = [1, 2, 9, 3, 10, 11, 4, 12];
        let mut ids = Vec::new();
        for (n, ms) in times.into_iter().enumerate() {
            let ifindex = u32::try_from(n).expect("small") + 2;
            let event = dev_up(ms, ifindex);
            ids.push(ns.push(
                &event,
                Step::Request {
                    op: "newlink",
                    detail: link_up_detail(ifindex),
                    status: RequestStatus::Sent,
                },
                Some(Effect::LinkUp {
                    ifindex,
                    ifname: None,
                }),
            ));
            if n == 4 {
                ns.name_interface(ifindex, "late-name");
            }
            if n == 5 {
                assert!(ns.answer(ids[1], -17, Some("exists".into())));
            }
            let kept = ns.progress();
            ns.folded = None;
            let fresh = ns.progress();
            assert_eq!(kept.now, fresh.now, "after entry {n}");
            assert_eq!(kept.rejected, fresh.rejected, "after entry {n}");
        }
        assert!(
            !ns.progress().now.up.contains("#3"),
            "the rejected link up changed nothing"
        );
    }

    /// Naming an interface that no folded step named by index only changes nothing folded: the
    /// fold is kept (a device coming up names one at every ADD).
    #[test]
    fn a_name_only_refolds_the_steps_that_used_its_index() {
        let mut ns = Ns::new(NetnsRef::default(), UNIX_EPOCH);
        ns.push(
            &dev_up(1, 2),
            Step::Destroyed,
            Some(Effect::LinkUp {
                ifindex: 2,
                ifname: None,
            }),
        );
        assert!(ns.progress().now.up.contains("#2"));
        ns.name_interface(3, "eth0");
        assert!(ns.folded.is_some(), "index 3 was named by no step");
        ns.name_interface(2, "eth1");
        assert!(ns.folded.is_none());
        assert!(ns.progress().now.up.contains("eth1"));
    }

    #[test]
    fn entries_are_folded_in_time_order() {
        let mut ns = Ns::new(NetnsRef::default(), UNIX_EPOCH);
        for ms in [5, 1, 3] {
            ns.push(&dev_up(ms, 2), Step::Destroyed, None);
        }
        let at: Vec<u64> = ns
            .timeline()
            .iter()
            .map(|e| {
                u64::try_from(
                    e.at.duration_since(UNIX_EPOCH)
                        .expect("after epoch")
                        .as_millis(),
                )
                .expect("small")
            })
            .collect();
        assert_eq!(at, [1, 3, 5]);
    }
}
