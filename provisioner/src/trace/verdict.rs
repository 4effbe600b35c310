//! What the correlator concludes: verdicts per namespace, intent checks, drift, and the
//! timeline entries that explain them.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use ipnetwork::IpNetwork;

use super::events::NetnsRef;
use super::sandbox_rules::SandboxReason;

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
    /// Not a sandbox, destroyed before the deadline.
    Gone,
}

impl Verdict {
    pub const ALL: [Self; 5] = [
        Self::Networked,
        Self::Skipped,
        Self::Partial,
        Self::Failed,
        Self::Gone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Networked => "networked",
            Self::Skipped => "skipped",
            Self::Partial => "partial",
            Self::Failed => "failed",
            Self::Gone => "gone",
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
        detail: String,
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
    pub timeline: Vec<TimelineEntry>,
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

/// What the daemon intends to configure in one sandbox namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Intent {
    pub netns_cookie: u64,
    pub ifname: String,
    #[serde(serialize_with = "serialize_display_list")]
    pub addresses: Vec<IpNetwork>,
    pub routes: Vec<RouteIntent>,
}

/// Handle of a registered intent.
pub type IntentId = u64;

/// Whether the kernel timeline shows every step of an intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    Confirmed,
    Unconfirmed,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IntentVerdict {
    pub id: IntentId,
    pub intent: Intent,
    pub status: IntentStatus,
    /// Steps not seen in the kernel timeline (empty when confirmed).
    pub missing: Vec<String>,
}

/// A confirmed intent's interface, address or route was removed later.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Drift {
    pub id: IntentId,
    pub netns_cookie: u64,
    pub what: String,
    pub by: TimelineEntry,
}

/// Everything the correlator reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "report", rename_all = "snake_case")]
pub enum Report {
    Verdict(NetnsVerdict),
    Intent(IntentVerdict),
    Drift(Drift),
}

pub fn format_time(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        d.subsec_millis()
    )
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
