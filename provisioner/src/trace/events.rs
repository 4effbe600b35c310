//! Typed events decoded from the kernel's ring-buffer records.

use std::time::{Duration, SystemTime};

use provisioner_common as common;

use super::netlink_parse::{NlReply, NlRequest, parse_replies, parse_requests};

/// The task that caused an event.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TaskInfo {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub cgroup_id: u64,
}

/// How a network namespace came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetnsOrigin {
    Unshare,
    Clone,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NetnsCreated {
    pub netns_cookie: u64,
    pub netns_inode: u32,
    pub origin: NetnsOrigin,
    pub flags: u64,
    /// The process that owns the new namespace (the child for clone, the caller for unshare).
    pub owner_pid: u32,
    pub parent_pid: u32,
    pub parent_comm: String,
}

/// A network namespace as the kernel names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct NetnsRef {
    pub cookie: u64,
    pub inode: u32,
}

impl From<common::NetnsId> for NetnsRef {
    fn from(id: common::NetnsId) -> Self {
        Self {
            cookie: id.cookie,
            inode: id.inum,
        }
    }
}

/// Bytes written to (request) or read from (reply) a NETLINK_ROUTE socket.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NetlinkIo {
    /// The calling task's namespace.
    pub task_netns: NetnsRef,
    /// The socket's namespace: the one a request changes.
    pub sock_netns: NetnsRef,
    pub syscall: &'static str,
    pub fd: u32,
    pub total_len: u32,
    pub copied: u32,
    /// Why the copied bytes could not be parsed, if they could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_error: Option<String>,
}

/// An rtnetlink request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NetlinkRequest {
    #[serde(flatten)]
    pub io: NetlinkIo,
    pub messages: Vec<NlRequest>,
}

/// The kernel's answers (ACK or errno) to rtnetlink requests.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NetlinkReply {
    #[serde(flatten)]
    pub io: NetlinkIo,
    pub replies: Vec<NlReply>,
}

/// The kernel's own rejection (or warning) message.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Extack {
    pub task_netns: NetnsRef,
    pub message: String,
}

/// A device came up (root qdisc attached) or went away (root qdisc destroyed).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DevChange {
    pub netns: NetnsRef,
    pub ifindex: u32,
    pub ifname: String,
    pub dev_flags: u32,
    /// The device's namespace is being destroyed.
    pub netns_dying: bool,
    pub qdisc: String,
}

/// A binary was executed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Exec {
    pub task_netns: NetnsRef,
    pub filename: String,
    pub parent_pid: u32,
    pub parent_comm: String,
}

/// A bind mount was requested (namespace pinning).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BindMount {
    pub task_netns: NetnsRef,
    pub source: String,
    pub target: String,
    pub flags: u64,
}

/// One kernel event with its time and task.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TraceEvent {
    #[serde(with = "wall_time")]
    pub at: SystemTime,
    pub task: TaskInfo,
    pub kind: EventKind,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    NetnsCreated(NetnsCreated),
    NetlinkRequest(NetlinkRequest),
    NetlinkReply(NetlinkReply),
    Extack(Extack),
    DevUp(DevChange),
    DevGone(DevChange),
    Exec(Exec),
    BindMount(BindMount),
}

impl EventKind {
    /// The record kind (`provisioner_common::kind`).
    pub fn kind(&self) -> u32 {
        use common::kind;
        match self {
            Self::NetnsCreated(_) => kind::NETNS_CREATED,
            Self::NetlinkRequest(_) => kind::NETLINK_REQUEST,
            Self::NetlinkReply(_) => kind::NETLINK_REPLY,
            Self::Extack(_) => kind::EXTACK,
            Self::DevUp(_) => kind::DEV_UP,
            Self::DevGone(_) => kind::DEV_GONE,
            Self::Exec(_) => kind::EXEC,
            Self::BindMount(_) => kind::BIND_MOUNT,
        }
    }

    /// Every namespace this event names (for filtering).
    pub fn netns_cookies(&self) -> Vec<u64> {
        match self {
            Self::NetnsCreated(c) => vec![c.netns_cookie],
            Self::NetlinkRequest(NetlinkRequest { io, .. })
            | Self::NetlinkReply(NetlinkReply { io, .. }) => {
                vec![io.task_netns.cookie, io.sock_netns.cookie]
            }
            Self::Extack(e) => vec![e.task_netns.cookie],
            Self::DevUp(d) | Self::DevGone(d) => vec![d.netns.cookie],
            Self::Exec(e) => vec![e.task_netns.cookie],
            Self::BindMount(b) => vec![b.task_netns.cookie],
        }
    }
}

/// Why a record could not be decoded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {len} bytes is too short for kind {kind}")]
    Truncated { kind: u32, len: usize },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
}

impl DecodeError {
    pub fn kind(&self) -> u32 {
        match self {
            Self::Truncated { kind, .. } | Self::UnknownKind(kind) => *kind,
        }
    }
}

/// Converts kernel monotonic timestamps to wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    boot_wall: SystemTime,
}

impl Clock {
    pub fn new() -> Self {
        let now_wall = SystemTime::now();
        let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(Duration::from)
            .unwrap_or_default();
        Self {
            boot_wall: now_wall.checked_sub(mono).unwrap_or(now_wall),
        }
    }

    pub fn wall(&self, ktime_ns: u64) -> SystemTime {
        self.boot_wall + Duration::from_nanos(ktime_ns)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

fn read_record<T: aya::Pod>(bytes: &[u8], kind: u32) -> Result<T, DecodeError> {
    if bytes.len() < std::mem::size_of::<T>() {
        return Err(DecodeError::Truncated {
            kind,
            len: bytes.len(),
        });
    }
    // SAFETY: length checked; `T: Pod` (every bit pattern is a valid T); read_unaligned copes
    // with the ring buffer's 8-byte alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

pub fn comm_string(raw: &[u8]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8], clock: &Clock) -> Result<TraceEvent, DecodeError> {
    let header: common::EventHeader = read_record(bytes, 0)?;
    let task = TaskInfo {
        pid: header.pid,
        tid: header.tid,
        comm: comm_string(&header.comm),
        cgroup_id: header.cgroup_id,
    };
    let kind = match header.kind {
        common::kind::NETNS_CREATED => {
            let r: common::NetnsCreated = read_record(bytes, header.kind)?;
            EventKind::NetnsCreated(NetnsCreated {
                netns_cookie: r.netns_cookie,
                netns_inode: r.netns_inum,
                origin: if r.origin == common::origin::UNSHARE {
                    NetnsOrigin::Unshare
                } else {
                    NetnsOrigin::Clone
                },
                flags: r.flags,
                owner_pid: r.owner_pid,
                parent_pid: r.parent_pid,
                parent_comm: comm_string(&r.parent_comm),
            })
        }
        common::kind::NETLINK_REQUEST => {
            let r: common::NetlinkMsg = read_record(bytes, header.kind)?;
            let (io, data) = netlink_io(&r);
            let (messages, parse_error) = match parse_requests(data) {
                Ok(m) => (m, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            EventKind::NetlinkRequest(NetlinkRequest {
                io: NetlinkIo { parse_error, ..io },
                messages,
            })
        }
        common::kind::NETLINK_REPLY => {
            let r: common::NetlinkMsg = read_record(bytes, header.kind)?;
            let (io, data) = netlink_io(&r);
            let (replies, parse_error) = match parse_replies(data) {
                Ok(m) => (m, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            EventKind::NetlinkReply(NetlinkReply {
                io: NetlinkIo { parse_error, ..io },
                replies,
            })
        }
        common::kind::EXTACK => {
            let r: common::Extack = read_record(bytes, header.kind)?;
            EventKind::Extack(Extack {
                task_netns: r.task_netns.into(),
                message: comm_string(&r.msg),
            })
        }
        common::kind::DEV_UP | common::kind::DEV_GONE => {
            let r: common::DevEvent = read_record(bytes, header.kind)?;
            let change = DevChange {
                netns: r.netns.into(),
                ifindex: r.ifindex,
                ifname: comm_string(&r.ifname),
                dev_flags: r.dev_flags,
                netns_dying: r.netns_dying != 0,
                qdisc: comm_string(&r.qdisc),
            };
            if header.kind == common::kind::DEV_UP {
                EventKind::DevUp(change)
            } else {
                EventKind::DevGone(change)
            }
        }
        common::kind::EXEC => {
            let r: common::Exec = read_record(bytes, header.kind)?;
            EventKind::Exec(Exec {
                task_netns: r.task_netns.into(),
                filename: comm_string(&r.filename),
                parent_pid: r.parent_pid,
                parent_comm: comm_string(&r.parent_comm),
            })
        }
        common::kind::BIND_MOUNT => {
            let r: common::BindMount = read_record(bytes, header.kind)?;
            EventKind::BindMount(BindMount {
                task_netns: r.task_netns.into(),
                source: comm_string(&r.source),
                target: comm_string(&r.target),
                flags: r.flags,
            })
        }
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok(TraceEvent {
        at: clock.wall(header.ts_ns),
        task,
        kind,
    })
}

fn netlink_io(r: &common::NetlinkMsg) -> (NetlinkIo, &[u8]) {
    let copied = (r.copied as usize).min(r.data.len());
    let syscall = match r.syscall {
        common::syscall::SENDMSG => "sendmsg",
        common::syscall::SENDTO => "sendto",
        common::syscall::RECVMSG => "recvmsg",
        common::syscall::RECVFROM => "recvfrom",
        _ => "unknown",
    };
    (
        NetlinkIo {
            task_netns: r.task_netns.into(),
            sock_netns: r.sock_netns.into(),
            syscall,
            fd: r.fd,
            total_len: r.total_len,
            copied: r.copied,
            parse_error: None,
        },
        &r.data[..copied],
    )
}

mod wall_time {
    use std::time::{SystemTime, UNIX_EPOCH};

    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        s.serialize_f64(d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_netns_created() -> Vec<u8> {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"runc");
        let record = common::NetnsCreated {
            header: common::EventHeader {
                kind: common::kind::NETNS_CREATED,
                pid: 10,
                tid: 11,
                _pad: 0,
                ts_ns: 5,
                cgroup_id: 7,
                comm,
            },
            netns_cookie: 4242,
            netns_inum: 4026532000,
            origin: common::origin::UNSHARE,
            flags: common::CLONE_NEWNET,
            owner_pid: 10,
            parent_pid: 1,
            parent_comm: [0; 16],
        };
        // SAFETY: viewing a repr(C) POD value as bytes.
        unsafe {
            std::slice::from_raw_parts(
                (&raw const record).cast::<u8>(),
                std::mem::size_of_val(&record),
            )
        }
        .to_vec()
    }

    #[test]
    fn decodes_netns_created() {
        let event = decode(&raw_netns_created(), &Clock::new()).expect("decodes");
        assert_eq!(event.task.comm, "runc");
        assert_eq!(event.task.pid, 10);
        let EventKind::NetnsCreated(created) = event.kind else {
            panic!("not NetnsCreated");
        };
        assert_eq!(created.netns_cookie, 4242);
        assert_eq!(created.origin, NetnsOrigin::Unshare);
    }

    #[test]
    fn truncated_record_is_an_error_not_a_panic() {
        let raw = raw_netns_created();
        let err = decode(&raw[..30], &Clock::new()).expect_err("truncated");
        assert!(matches!(err, DecodeError::Truncated { .. }));
    }
}
