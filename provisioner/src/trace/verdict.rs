//! What the correlator concludes: verdicts per namespace, intent checks, drift, and the
//! timeline entries that explain them.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use ipnetwork::IpNetwork;

use super::kernel::events::NetnsRef;
use super::sandbox_rules::SandboxReason;
use crate::pod::{Pod, PodName};

/// The outcome of one namespace's network setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A non-loopback interface up, with an address and a default route.
    Networked,
    /// Created, nothing but loopback ever configured.
    Skipped,
    /// Some steps, not all.
    Partial,
    /// The kernel rejected a step.
    Failed,
    /// Not a sandbox, destroyed before the deadline; or a sandbox destroyed before its state
    /// could be read when its history was not seen.
    Gone,
    /// Alive, but neither its history was seen nor its state could be read: no judgement.
    Unknown,
}

impl Verdict {
    pub const ALL: [Self; 6] = [
        Self::Networked,
        Self::Skipped,
        Self::Partial,
        Self::Failed,
        Self::Gone,
        Self::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Networked => "networked",
            Self::Skipped => "skipped",
            Self::Partial => "partial",
            Self::Failed => "failed",
            Self::Gone => "gone",
            Self::Unknown => "unknown",
        }
    }

    /// A verdict that raises an alarm (and may be revised when the network arrives later).
    pub fn is_alarm(self) -> bool {
        matches!(self, Self::Skipped | Self::Partial | Self::Failed)
    }
}

/// What a verdict or an intent check rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum Evidence {
    /// The kernel trace: seen being set up (or, for an alarm, traced since its creation).
    Trace,
    /// The namespace's state read from the kernel at `at` (its history was not, or not
    /// fully, seen).
    Snapshot {
        #[serde(serialize_with = "serialize_time")]
        at: SystemTime,
    },
    /// Nothing: its history was not seen and its state could not be read.
    Nothing,
}

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Trace => write!(f, "the kernel trace"),
            Self::Snapshot { at } => write!(f, "its state read at {}", format_time(*at)),
            Self::Nothing => write!(f, "nothing (history not seen, state unreadable)"),
        }
    }
}

/// The process that created a namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Creator {
    pub pid: u32,
    pub comm: String,
    pub parent_pid: u32,
    pub parent_comm: String,
    pub cgroup_id: u64,
}

impl std::fmt::Display for Creator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.comm.is_empty() {
            return write!(f, "an unknown process (created before tracing)");
        }
        write!(
            f,
            "{} (pid {}, parent {} pid {}, cgroup {})",
            self.comm, self.pid, self.parent_comm, self.parent_pid, self.cgroup_id
        )
    }
}

/// What the kernel said about a request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RequestStatus {
    /// Sent; no answer seen (yet).
    Sent,
    /// ACKed.
    Acked,
    /// Rejected with `-errno`.
    Rejected { errno: i32, extack: Option<String> },
}

/// One thing that happened to a namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    Created {
        origin: String,
    },
    Pinned {
        path: PathBuf,
    },
    Exec {
        filename: String,
    },
    Request {
        op: &'static str,
        detail: super::render::RequestDetail,
        #[serde(flatten)]
        status: RequestStatus,
    },
    /// An answer to a request that was not seen (e.g. sent before tracing started).
    UnmatchedReply {
        op: &'static str,
        errno: i32,
        extack: Option<String>,
    },
    DevUp {
        ifname: String,
        ifindex: u32,
    },
    DevGone {
        ifname: String,
        ifindex: u32,
    },
    /// The namespace's state read from the kernel (its history before was not, or not fully,
    /// seen).
    Snapshot {
        summary: String,
    },
    /// Reading the namespace's state failed.
    SnapshotFailed {
        error: String,
    },
    /// A CNI plugin was executed for this namespace (its environment named it).
    CniCall {
        command: String,
        plugin: String,
        /// The process that ran it (the runtime).
        parent: String,
        /// The plugin's real uid; only root's plugins name a pod.
        uid: u32,
        /// The pod its `CNI_ARGS` named (boxed: every step is as large as its largest kind).
        pod: Option<Box<Pod>>,
    },
    /// A verdict was given (a later one revises it).
    Verdict {
        verdict: Verdict,
    },
    Destroyed,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Created { origin } => write!(f, "netns created ({origin})"),
            Self::Pinned { path } => write!(f, "pinned at {}", path.display()),
            Self::Exec { filename } => write!(f, "exec {filename}"),
            Self::Request { op, detail, status } => {
                write!(f, "{op} {detail}")?;
                match status {
                    RequestStatus::Sent => write!(f, " (sent)"),
                    RequestStatus::Acked => write!(f, " (ack)"),
                    RequestStatus::Rejected { errno, extack } => {
                        write!(f, " REJECTED: {}", errno_text(*errno))?;
                        if let Some(msg) = extack {
                            write!(f, " ({msg})")?;
                        }
                        Ok(())
                    }
                }
            }
            Self::UnmatchedReply { op, errno, extack } => {
                write!(f, "{op} rejected: {}", errno_text(*errno))?;
                if let Some(msg) = extack {
                    write!(f, " ({msg})")?;
                }
                Ok(())
            }
            Self::DevUp { ifname, ifindex } => write!(f, "device {ifname} (#{ifindex}) up"),
            Self::DevGone { ifname, ifindex } => write!(f, "device {ifname} (#{ifindex}) gone"),
            Self::Snapshot { summary } => write!(f, "state read from the kernel: {summary}"),
            Self::SnapshotFailed { error } => write!(f, "state could not be read: {error}"),
            Self::CniCall {
                command,
                plugin,
                parent,
                uid,
                pod,
            } => {
                write!(f, "CNI {command} by {plugin} (run by {parent}) ")?;
                match pod {
                    Some(pod) if *uid == 0 => write!(f, "for pod {pod}"),
                    Some(pod) => write!(f, "for pod {pod}, not taken: run by uid {uid}, not root"),
                    None => f.write_str("naming no pod (no K8S_POD_NAME in CNI_ARGS)"),
                }
            }
            Self::Verdict { verdict } => write!(f, "verdict {}", verdict.as_str()),
            Self::Destroyed => write!(f, "netns destroyed"),
        }
    }
}

/// `-errno` as text, e.g. `ENETUNREACH (Network is unreachable)`.
pub fn errno_text(errno: i32) -> String {
    let e = nix::errno::Errno::from_raw(errno.saturating_abs());
    format!("{e:?} ({})", e.desc())
}

/// A timeline entry: when, who, what.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TimelineEntry {
    #[serde(serialize_with = "serialize_time")]
    pub at: SystemTime,
    pub pid: u32,
    pub comm: String,
    #[serde(flatten)]
    pub step: Step,
}

impl std::fmt::Display for TimelineEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}[{}] {}",
            format_time(self.at),
            self.comm,
            self.pid,
            self.step
        )
    }
}

/// Repeated skips from one creator (by comm).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SkipSummary {
    pub creator_comm: String,
    /// Pid of the latest creating process.
    pub creator_pid: u32,
    pub count: u64,
    #[serde(serialize_with = "serialize_time")]
    pub first: SystemTime,
    #[serde(serialize_with = "serialize_time")]
    pub last: SystemTime,
}

/// The verdict for one namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NetnsVerdict {
    /// The pod of the sandbox, or why it cannot be named (`None` for a namespace that is not
    /// a sandbox).
    pub pod: Option<PodName>,
    pub netns: NetnsRef,
    pub verdict: Verdict,
    /// Why the namespace counts as a sandbox (`None` for `gone` namespaces).
    pub sandbox: Option<SandboxReason>,
    pub creator: Creator,
    #[serde(serialize_with = "serialize_time")]
    pub created_at: SystemTime,
    #[serde(serialize_with = "serialize_opt_time")]
    pub destroyed_at: Option<SystemTime>,
    /// What was (not) seen, in words.
    pub reason: String,
    /// What the verdict rests on.
    pub evidence: Evidence,
    /// The alarm this verdict revises (the network arrived after the deadline).
    pub revises: Option<Verdict>,
    /// For a revised verdict: how long after the deadline the network arrived.
    pub late_ms: Option<u64>,
    /// For `skipped`: why, as far as the node can tell (the runtime's CNI conf dir and what it
    /// holds, whether a plugin ran).
    pub diagnosis: Option<String>,
    /// Shared with the correlator's own timeline of the namespace (entries are not copied).
    pub timeline: Vec<std::sync::Arc<TimelineEntry>>,
    /// For `skipped`: all skips from the same creator so far.
    pub repeat: Option<SkipSummary>,
}

/// A route the daemon means to install.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RouteIntent {
    #[serde(serialize_with = "serialize_display")]
    pub dst: IpNetwork,
    pub gateway: Option<IpAddr>,
}

/// Which sandbox interface an intent is for: the CNI container id and interface name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct IntentKey {
    pub container_id: String,
    pub ifname: String,
}

impl std::fmt::Display for IntentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "container {} ({})", self.container_id, self.ifname)
    }
}

/// Why the daemon expects what an intent says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentOrigin {
    /// An ADD is setting it up now.
    Add,
    /// An allocation found at start (the ADD was answered before): checked against the
    /// kernel's state at once.
    Audit,
}

/// What the daemon configures (or configured) in one sandbox namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Intent {
    pub key: IntentKey,
    pub origin: IntentOrigin,
    pub netns_cookie: u64,
    pub ifname: String,
    #[serde(serialize_with = "serialize_display_list")]
    pub addresses: Vec<IpNetwork>,
    pub routes: Vec<RouteIntent>,
}

/// Whether the kernel shows every step of an intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    Confirmed,
    /// An ADD's setup that the kernel did not show complete by the deadline.
    Unconfirmed,
    /// A sandbox found at start that lacks some of what its ADD configured.
    Drifted,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IntentVerdict {
    pub intent: Intent,
    pub status: IntentStatus,
    /// What the kernel does not show (empty when confirmed).
    pub missing: Vec<String>,
    pub evidence: Evidence,
}

/// A confirmed intent's interface, address or route went missing.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Drift {
    pub key: IntentKey,
    pub netns_cookie: u64,
    pub what: String,
    /// The timeline entry that removed it, when the trace saw one.
    pub by: Option<TimelineEntry>,
}

/// Everything the correlator reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "report", rename_all = "snake_case")]
#[expect(
    clippy::large_enum_variant,
    reason = "a report is handed on as it comes (a kept verdict is moved into an Arc), never held"
)]
pub enum Report {
    Verdict(NetnsVerdict),
    Intent(IntentVerdict),
    Drift(Drift),
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-12-04T05:23:18.123Z`.
pub fn format_time(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (year, month, day) = civil_date(secs / 86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        d.subsec_millis()
    )
}

/// The proleptic Gregorian (year, month, day) of a count of days since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

fn serialize_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(
        t.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64(),
    )
}

#[expect(
    clippy::ref_option,
    reason = "serde's serialize_with passes &Option<T>"
)]
fn serialize_opt_time<S: serde::Serializer>(
    t: &Option<SystemTime>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => serialize_time(t, s),
        None => s.serialize_none(),
    }
}

fn serialize_display<S: serde::Serializer, T: std::fmt::Display>(
    v: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn serialize_display_list<S: serde::Serializer, T: std::fmt::Display>(
    v: &[T],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(ToString::to_string))
}

/// Verdicts and intents as the kernel watch reports them, for the unit tests of what shows
/// them; a test changes the fields it is about.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// `verdict` on netns `cookie` (inode 7), an expected sandbox created by a process the
    /// trace did not see, at the epoch; evidence the trace, no diagnosis, no timeline.
    pub(crate) fn verdict(
        cookie: u64,
        verdict: Verdict,
        pod: Option<PodName>,
        reason: &str,
    ) -> NetnsVerdict {
        NetnsVerdict {
            pod,
            netns: NetnsRef { cookie, inode: 7 },
            verdict,
            sandbox: Some(SandboxReason::Expected),
            creator: Creator::default(),
            created_at: UNIX_EPOCH,
            destroyed_at: None,
            reason: reason.to_owned(),
            evidence: Evidence::Trace,
            revises: None,
            late_ms: None,
            diagnosis: None,
            timeline: Vec::new(),
            repeat: None,
        }
    }

    /// The intent of an ADD of `container_id` (eth0) into netns `cookie`, with `status` and
    /// what the kernel did not show (`missing`).
    pub(crate) fn intent(
        cookie: u64,
        container_id: &str,
        status: IntentStatus,
        missing: &[&str],
    ) -> IntentVerdict {
        IntentVerdict {
            intent: Intent {
                key: IntentKey {
                    container_id: container_id.to_owned(),
                    ifname: "eth0".to_owned(),
                },
                origin: IntentOrigin::Add,
                netns_cookie: cookie,
                ifname: "eth0".to_owned(),
                addresses: Vec::new(),
                routes: Vec::new(),
            },
            status,
            missing: missing.iter().map(|m| (*m).to_owned()).collect(),
            evidence: Evidence::Trace,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_skipped_partial_and_failed_are_alarms() {
        for v in Verdict::ALL {
            assert_eq!(
                v.is_alarm(),
                matches!(v, Verdict::Skipped | Verdict::Partial | Verdict::Failed),
                "{}",
                v.as_str()
            );
        }
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        let at = |ms: u64| format_time(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        // 2026-12-04T05:23:18.123Z, 2000-02-29 (a leap day of a year divisible by 400),
        // 2100-03-01 (2100 has no leap day).
        assert_eq!(at(1_796_361_798_123), "2026-12-04T05:23:18.123Z");
        assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
        assert_eq!(at(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn evidence_and_creator_read_as_operators_see_them() {
        let at = UNIX_EPOCH + Duration::from_millis(3_661_500);
        assert_eq!(Evidence::Trace.to_string(), "the kernel trace");
        assert_eq!(
            Evidence::Snapshot { at }.to_string(),
            "its state read at 1970-01-01T01:01:01.500Z"
        );
        assert_eq!(
            Evidence::Nothing.to_string(),
            "nothing (history not seen, state unreadable)"
        );
        assert_eq!(
            Creator::default().to_string(),
            "an unknown process (created before tracing)"
        );
        let creator = Creator {
            pid: 42,
            comm: "containerd".into(),
            parent_pid: 1,
            parent_comm: "systemd".into(),
            cgroup_id: 7,
        };
        assert_eq!(
            creator.to_string(),
            "containerd (pid 42, parent systemd pid 1, cgroup 7)"
        );
    }

    #[test]
    fn timeline_steps_read_as_operators_see_them() {
        use crate::trace::netlink_parse::{AddrMsg, LinkMsg, RtRequest};
        use crate::trace::render::RequestDetail;
        let names = std::collections::HashMap::from([(2, "eth0".to_owned())]);
        let detail = |body| RequestDetail::new(&body, &names).expect("a change");
        let rejected = Step::Request {
            op: "newaddr",
            detail: detail(RtRequest::NewAddr(AddrMsg {
                family: 2,
                prefix_len: 24,
                ifindex: 2,
                local: Some("10.0.0.2".parse().expect("ip")),
                address: None,
            })),
            status: RequestStatus::Rejected {
                errno: -libc::EEXIST,
                extack: Some("address exists".into()),
            },
        };
        for (step, text) in [
            (
                rejected,
                "newaddr 10.0.0.2/24 dev eth0 REJECTED: EEXIST (File exists) (address exists)",
            ),
            (
                Step::Request {
                    op: "newlink",
                    detail: detail(RtRequest::NewLink(LinkMsg {
                        ifindex: 2,
                        ..LinkMsg::default()
                    })),
                    status: RequestStatus::Acked,
                },
                "newlink eth0 (ack)",
            ),
            (
                Step::UnmatchedReply {
                    op: "newroute",
                    errno: -libc::ENETUNREACH,
                    extack: None,
                },
                "newroute rejected: ENETUNREACH (Network is unreachable)",
            ),
            (
                Step::Created {
                    origin: "unshare".into(),
                },
                "netns created (unshare)",
            ),
            (
                Step::DevUp {
                    ifname: "eth0".into(),
                    ifindex: 3,
                },
                "device eth0 (#3) up",
            ),
            (
                Step::Verdict {
                    verdict: Verdict::Skipped,
                },
                "verdict skipped",
            ),
            (Step::Destroyed, "netns destroyed"),
        ] {
            assert_eq!(step.to_string(), text);
        }
    }

    #[test]
    fn timeline_entries_and_intent_keys_read_as_operators_see_them() {
        let entry = TimelineEntry {
            at: UNIX_EPOCH + Duration::from_millis(7_384_002),
            pid: 4242,
            comm: "ptp".into(),
            step: Step::Exec {
                filename: "/usr/lib/cni/ptp".into(),
            },
        };
        assert_eq!(
            entry.to_string(),
            "1970-01-01T02:03:04.002Z ptp[4242] exec /usr/lib/cni/ptp"
        );
        let key = IntentKey {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        };
        assert_eq!(key.to_string(), "container c1 (eth0)");
    }
}
