//! Typed events decoded from the kernel's ring-buffer records.

use std::time::{Duration, SystemTime};

use provisioner_common as common;

use super::netlink_parse::{NlReply, NlRequest, parse_replies, parse_requests};
use crate::trace::cni_env::CniEnv;

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
    /// The kernel's answer to a one-message request (0: ACK, or a negative errno), when it was
    /// found as the request was sent; otherwise it comes as a [`NetlinkReply`] (errors always
    /// do; ACKs not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<i32>,
}

/// The kernel's errors answering rtnetlink requests (a bare ACK is read with its request: see
/// [`NetlinkRequest::answer`]).
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

/// The environment of a binary executed by a runtime or from a CNI plugin directory: the CNI
/// call it was given, when it was one.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExecEnv {
    pub parent_pid: u32,
    pub parent_comm: String,
    /// The process's real uid: runtimes run their plugins as root.
    pub uid: u32,
    /// `None` when the environment copied holds no `CNI_COMMAND` (or could not be read).
    pub cni: Option<CniEnv>,
    /// Bytes of the whole environment and of its end that was copied.
    pub env_len: u32,
    pub copied: u32,
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
    ExecEnv(ExecEnv),
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
            Self::ExecEnv(_) => kind::EXEC_ENV,
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
            // A plugin runs outside the namespace it is given (named by a path).
            Self::ExecEnv(_) => Vec::new(),
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
    let kind = decode_kind(bytes, header.kind)?;
    Ok(TraceEvent {
        at: clock.wall(header.ts_ns),
        task,
        kind,
    })
}

/// Decodes the kind-specific part of a record whose header names `kind`.
fn decode_kind(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    match kind {
        common::kind::NETNS_CREATED => decode_netns_created(bytes, kind),
        common::kind::NETLINK_REQUEST => decode_netlink_request(bytes, kind),
        common::kind::NETLINK_REPLY => decode_netlink_reply(bytes, kind),
        common::kind::EXTACK => decode_extack(bytes, kind),
        common::kind::DEV_UP | common::kind::DEV_GONE => decode_dev_change(bytes, kind),
        common::kind::EXEC => decode_exec(bytes, kind),
        common::kind::BIND_MOUNT => decode_bind_mount(bytes, kind),
        common::kind::EXEC_ENV => decode_exec_env(bytes, kind),
        other => Err(DecodeError::UnknownKind(other)),
    }
}

fn decode_netns_created(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::NetnsCreated = read_record(bytes, kind)?;
    Ok(EventKind::NetnsCreated(NetnsCreated {
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
    }))
}

fn decode_netlink_request(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::NetlinkMsg = read_record(bytes, kind)?;
    let (io, data) = netlink_io(&r);
    let (messages, parse_error) = match parse_requests(data) {
        Ok(m) => (m, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Ok(EventKind::NetlinkRequest(NetlinkRequest {
        io: NetlinkIo { parse_error, ..io },
        messages,
        answer: (r.answered != 0).then_some(r.answer),
    }))
}

fn decode_netlink_reply(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::NetlinkMsg = read_record(bytes, kind)?;
    let (io, data) = netlink_io(&r);
    let (replies, parse_error) = match parse_replies(data) {
        Ok(m) => (m, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Ok(EventKind::NetlinkReply(NetlinkReply {
        io: NetlinkIo { parse_error, ..io },
        replies,
    }))
}

fn decode_extack(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::Extack = read_record(bytes, kind)?;
    Ok(EventKind::Extack(Extack {
        task_netns: r.task_netns.into(),
        message: comm_string(&r.msg),
    }))
}

/// Decodes a DEV_UP or DEV_GONE record (`kind` says which).
fn decode_dev_change(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::DevEvent = read_record(bytes, kind)?;
    let change = DevChange {
        netns: r.netns.into(),
        ifindex: r.ifindex,
        ifname: comm_string(&r.ifname),
        dev_flags: r.dev_flags,
        netns_dying: r.netns_dying != 0,
        qdisc: comm_string(&r.qdisc),
    };
    Ok(if kind == common::kind::DEV_UP {
        EventKind::DevUp(change)
    } else {
        EventKind::DevGone(change)
    })
}

fn decode_exec(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::Exec = read_record(bytes, kind)?;
    Ok(EventKind::Exec(Exec {
        task_netns: r.task_netns.into(),
        filename: comm_string(&r.filename),
        parent_pid: r.parent_pid,
        parent_comm: comm_string(&r.parent_comm),
    }))
}

fn decode_bind_mount(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::BindMount = read_record(bytes, kind)?;
    Ok(EventKind::BindMount(BindMount {
        task_netns: r.task_netns.into(),
        source: comm_string(&r.source),
        target: comm_string(&r.target),
        flags: r.flags,
    }))
}

fn decode_exec_env(bytes: &[u8], kind: u32) -> Result<EventKind, DecodeError> {
    let r: common::ExecEnv = read_record(bytes, kind)?;
    let copied = (r.copied as usize).min(r.env.len());
    Ok(EventKind::ExecEnv(ExecEnv {
        parent_pid: r.parent_pid,
        parent_comm: comm_string(&r.parent_comm),
        uid: r.uid,
        cni: CniEnv::parse(&r.env[..copied], r.copied < r.env_len),
        env_len: r.env_len,
        copied: r.copied,
    }))
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
    use crate::trace::kernel::netlink_parse::RtRequest;

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

    /// A record's bytes, as the ring buffer hands them over.
    fn bytes_of<T: aya::Pod>(record: &T) -> Vec<u8> {
        // SAFETY: viewing a repr(C) POD value as bytes.
        unsafe {
            std::slice::from_raw_parts(
                std::ptr::from_ref(record).cast::<u8>(),
                std::mem::size_of::<T>(),
            )
        }
        .to_vec()
    }

    fn text<const N: usize>(s: &str) -> [u8; N] {
        let mut out = [0u8; N];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    fn header(kind: u32) -> common::EventHeader {
        common::EventHeader {
            kind,
            pid: 10,
            tid: 11,
            _pad: 0,
            ts_ns: 5,
            cgroup_id: 7,
            comm: text("ip"),
        }
    }

    fn netns(cookie: u64) -> common::NetnsId {
        common::NetnsId {
            cookie,
            inum: 4_026_532_000 + u32::try_from(cookie).unwrap_or(0),
            _pad: 0,
        }
    }

    fn decoded(bytes: &[u8]) -> EventKind {
        decode(bytes, &Clock::new()).expect("decodes").kind
    }

    /// A netlink record of `syscall` carrying `data`, of which `copied` bytes were copied.
    fn netlink(kind: u32, syscall: u32, data: &[u8], copied: u32) -> Vec<u8> {
        let mut buf = [0u8; common::NETLINK_COPY];
        buf[..data.len()].copy_from_slice(data);
        bytes_of(&common::NetlinkMsg {
            header: header(kind),
            task_netns: netns(1),
            sock_netns: netns(2),
            syscall,
            fd: 3,
            total_len: 64,
            copied,
            answer: 0,
            answered: 0,
            data: buf,
        })
    }

    /// An `nlmsghdr` of `msg_type` followed by `body`.
    fn nl_message(msg_type: u16, body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(16 + body.len()).unwrap_or(u32::MAX);
        let mut m = Vec::new();
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&msg_type.to_ne_bytes());
        m.extend_from_slice(&5u16.to_ne_bytes()); // flags: REQUEST | ACK
        m.extend_from_slice(&9u32.to_ne_bytes()); // seq
        m.extend_from_slice(&0u32.to_ne_bytes()); // pid
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn every_record_kind_decodes_with_its_namespaces() {
        let extack = bytes_of(&common::Extack {
            header: header(common::kind::EXTACK),
            task_netns: netns(3),
            msg: text("Device not found"),
        });
        let EventKind::Extack(e) = decoded(&extack) else {
            panic!("not an extack");
        };
        assert_eq!(e.message, "Device not found");
        assert_eq!(
            e.task_netns,
            NetnsRef {
                cookie: 3,
                inode: 4_026_532_003
            }
        );

        let exec = bytes_of(&common::Exec {
            header: header(common::kind::EXEC),
            task_netns: netns(4),
            parent_pid: 1,
            _pad: 0,
            parent_comm: text("containerd"),
            filename: text("/opt/cni/bin/provisioner"),
        });
        let EventKind::Exec(e) = decoded(&exec) else {
            panic!("not an exec");
        };
        assert_eq!(e.filename, "/opt/cni/bin/provisioner");
        assert_eq!((e.parent_pid, e.parent_comm.as_str()), (1, "containerd"));

        let bind = bytes_of(&common::BindMount {
            header: header(common::kind::BIND_MOUNT),
            task_netns: netns(5),
            flags: common::MS_BIND,
            source: text("/proc/10/ns/net"),
            target: text("/run/netns/cni-1"),
        });
        let EventKind::BindMount(b) = decoded(&bind) else {
            panic!("not a bind mount");
        };
        assert_eq!(
            (b.source.as_str(), b.target.as_str(), b.flags),
            ("/proc/10/ns/net", "/run/netns/cni-1", common::MS_BIND)
        );

        let mut created = raw_netns_created();
        created.truncate(std::mem::size_of::<common::NetnsCreated>());
        let cases: [(&[u8], u32, Vec<u64>); 4] = [
            (&created, common::kind::NETNS_CREATED, vec![4242]),
            (&extack, common::kind::EXTACK, vec![3]),
            (&exec, common::kind::EXEC, vec![4]),
            (&bind, common::kind::BIND_MOUNT, vec![5]),
        ];
        for (bytes, kind, cookies) in cases {
            let event = decoded(bytes);
            assert_eq!(event.kind(), kind, "{event:?}");
            assert_eq!(event.netns_cookies(), cookies, "{event:?}");
        }
    }

    /// A plugin's environment as the kernel copies it: its end, the first entry cut when the
    /// whole did not fit.
    fn exec_env(entries: &[&str], env_len: u32) -> Vec<u8> {
        let mut env = [0u8; common::ENV_COPY];
        let mut at = 0;
        for e in entries {
            env[at..at + e.len()].copy_from_slice(e.as_bytes());
            at += e.len() + 1;
        }
        let copied = u32::try_from(at).unwrap_or(0);
        bytes_of(&common::ExecEnv {
            header: header(common::kind::EXEC_ENV),
            parent_pid: 42,
            env_len: env_len.max(copied),
            copied,
            uid: 0,
            parent_comm: text("containerd"),
            env,
        })
    }

    #[test]
    fn a_plugins_environment_decodes_to_its_cni_call() {
        let entries = [
            "NT=cut",
            "CNI_COMMAND=ADD",
            "CNI_CONTAINERID=4bf9",
            "CNI_NETNS=/var/run/netns/cni-1",
            "CNI_ARGS=K8S_POD_NAME=web-0",
        ];
        let event = decoded(&exec_env(&entries, 9_000));
        assert_eq!(
            (event.kind(), event.netns_cookies()),
            (common::kind::EXEC_ENV, vec![])
        );
        let EventKind::ExecEnv(env) = event else {
            panic!("not an exec env");
        };
        assert_eq!(
            (env.parent_pid, env.parent_comm.as_str()),
            (42, "containerd")
        );
        assert_eq!(env.env_len, 9_000);
        let cni = env.cni.expect("a CNI call");
        assert_eq!(cni.command, "ADD");
        assert_eq!(cni.netns, "/var/run/netns/cni-1");
        assert_eq!(cni.args.as_deref(), Some("K8S_POD_NAME=web-0"));

        // Whole (not cut), without CNI_COMMAND: an exec, not a CNI call.
        let EventKind::ExecEnv(env) = decoded(&exec_env(&["PATH=/bin"], 0)) else {
            panic!("not an exec env");
        };
        assert_eq!(env.cni, None);
        // Cut, the CNI_COMMAND entry first: not trusted.
        let EventKind::ExecEnv(env) = decoded(&exec_env(&["CNI_COMMAND=ADD"], 100)) else {
            panic!("not an exec env");
        };
        assert_eq!(env.cni, None);
    }

    #[test]
    fn devices_coming_and_going_are_told_apart() {
        let dev = |kind, dying| {
            bytes_of(&common::DevEvent {
                header: header(kind),
                netns: netns(6),
                ifindex: 12,
                dev_flags: 0x1003,
                netns_dying: dying,
                _pad: 0,
                ifname: text("eth0"),
                qdisc: text("noqueue"),
            })
        };
        let want = |netns_dying| DevChange {
            netns: NetnsRef {
                cookie: 6,
                inode: 4_026_532_006,
            },
            ifindex: 12,
            ifname: "eth0".into(),
            dev_flags: 0x1003,
            netns_dying,
            qdisc: "noqueue".into(),
        };
        let up = decoded(&dev(common::kind::DEV_UP, 0));
        assert_eq!(up, EventKind::DevUp(want(false)));
        assert_eq!(
            (up.kind(), up.netns_cookies()),
            (common::kind::DEV_UP, vec![6])
        );
        let gone = decoded(&dev(common::kind::DEV_GONE, 1));
        assert_eq!(gone, EventKind::DevGone(want(true)));
        assert_eq!(
            (gone.kind(), gone.netns_cookies()),
            (common::kind::DEV_GONE, vec![6])
        );
    }

    #[test]
    fn netlink_records_name_syscall_both_namespaces_and_messages() {
        let getlink = nl_message(18, &[0u8; 16]);
        let copied = u32::try_from(getlink.len()).unwrap_or(0);
        for (syscall, name) in [
            (common::syscall::SENDMSG, "sendmsg"),
            (common::syscall::SENDTO, "sendto"),
            (common::syscall::RECVMSG, "recvmsg"),
            (common::syscall::RECVFROM, "recvfrom"),
            (99, "unknown"),
        ] {
            let event = decoded(&netlink(
                common::kind::NETLINK_REQUEST,
                syscall,
                &getlink,
                copied,
            ));
            assert_eq!(event.kind(), common::kind::NETLINK_REQUEST);
            assert_eq!(event.netns_cookies(), vec![1, 2]);
            let EventKind::NetlinkRequest(r) = event else {
                panic!("not a request");
            };
            assert_eq!(r.io.syscall, name);
            assert_eq!((r.io.fd, r.io.total_len, r.io.copied), (3, 64, copied));
            assert_eq!(r.io.parse_error, None);
            assert_eq!(r.messages.len(), 1, "{:?}", r.messages);
            assert_eq!(r.messages[0].body, RtRequest::Other { msg_type: 18 });
        }

        // The kernel's answer: NLMSG_ERROR with errno EEXIST and the request's header.
        let mut body = (-17i32).to_ne_bytes().to_vec();
        body.extend_from_slice(&getlink[..16]);
        let error = nl_message(common::NLMSG_ERROR, &body);
        let event = decoded(&netlink(
            common::kind::NETLINK_REPLY,
            common::syscall::RECVMSG,
            &error,
            u32::try_from(error.len()).unwrap_or(0),
        ));
        assert_eq!(
            (event.kind(), event.netns_cookies()),
            (common::kind::NETLINK_REPLY, vec![1, 2])
        );
        let EventKind::NetlinkReply(r) = event else {
            panic!("not a reply");
        };
        assert_eq!(r.io.parse_error, None);
        assert_eq!(r.replies.len(), 1, "{:?}", r.replies);
        assert_eq!(r.replies[0].error, -17);
    }

    #[test]
    fn unparseable_netlink_bytes_are_reported_not_dropped() {
        for kind in [common::kind::NETLINK_REQUEST, common::kind::NETLINK_REPLY] {
            let event = decoded(&netlink(kind, common::syscall::SENDMSG, &[1, 2, 3], 3));
            let (io, none) = match event {
                EventKind::NetlinkRequest(r) => (r.io, r.messages.is_empty()),
                EventKind::NetlinkReply(r) => (r.io, r.replies.is_empty()),
                other => panic!("{other:?}"),
            };
            assert!(none);
            let why = io.parse_error.expect("parse error kept");
            assert!(why.contains("3 bytes"), "{why}");
        }
    }

    #[test]
    fn records_longer_than_their_struct_decode() {
        // The ring buffer rounds records up to 8 bytes: trailing bytes are not an error.
        let mut raw = raw_netns_created();
        raw.extend_from_slice(&[0u8; 8]);
        let EventKind::NetnsCreated(created) = decoded(&raw) else {
            panic!("not NetnsCreated");
        };
        assert_eq!(created.netns_inode, 4_026_532_000);
    }

    #[test]
    fn clone_origin_and_errors_name_their_kind() {
        let mut raw = raw_netns_created();
        let origin_at = std::mem::offset_of!(common::NetnsCreated, origin);
        raw[origin_at..origin_at + 4].copy_from_slice(&common::origin::CLONE.to_ne_bytes());
        let EventKind::NetnsCreated(created) = decoded(&raw) else {
            panic!("not NetnsCreated");
        };
        assert_eq!(created.origin, NetnsOrigin::Clone);

        // A whole header, then too little of the record: the error names the record's kind.
        let len = std::mem::size_of::<common::EventHeader>() + 8;
        let err = decode(&raw[..len], &Clock::new()).expect_err("truncated");
        assert_eq!(
            err,
            DecodeError::Truncated {
                kind: common::kind::NETNS_CREATED,
                len
            }
        );
        assert_eq!(err.kind(), common::kind::NETNS_CREATED);
        let mut unknown = raw.clone();
        unknown[..4].copy_from_slice(&99u32.to_ne_bytes());
        let err = decode(&unknown, &Clock::new()).expect_err("unknown kind");
        assert_eq!(err.kind(), 99);
        assert_eq!(err, DecodeError::UnknownKind(99));
    }

    #[test]
    fn kernel_timestamps_become_wall_clock_time() {
        let clock = Clock::new();
        let later = clock.wall(7_000_000_000);
        assert_eq!(
            later.duration_since(clock.wall(2_000_000_000)).ok(),
            Some(Duration::from_secs(5))
        );
        // An event stamped now (monotonic) is placed now (wall), and serialised in seconds.
        let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
        let now_ns = u64::try_from(Duration::from(mono).as_nanos()).unwrap_or(u64::MAX);
        let mut raw = raw_netns_created();
        let ts_at = std::mem::offset_of!(common::EventHeader, ts_ns);
        raw[ts_at..ts_at + 8].copy_from_slice(&now_ns.to_ne_bytes());
        let event = decode(&raw, &clock).expect("decodes");
        let skew = event
            .at
            .duration_since(SystemTime::now())
            .unwrap_or_else(|e| e.duration());
        assert!(skew < Duration::from_secs(2), "{skew:?}");
        let json = serde_json::to_value(&event).expect("serialises");
        let unix = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let at = json["at"].as_f64().expect("at is seconds");
        assert!((unix - at).abs() < 2.0, "{at} vs {unix}");
    }
}
