//! One rtnetlink connection per namespace, built from a socket created inside that namespace.

use std::io;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::Arc;

use futures::StreamExt;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_ECHO, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, TokioSocket};

use super::error::DataplaneError;
use super::netns::NetnsFile;

/// How often an interrupted dump (`NLM_F_DUMP_INTR`) is retried before giving up.
const DUMP_ATTEMPTS: u32 = 5;

/// Creates a (blocking, not yet registered) rtnetlink socket inside `ns` from a worker thread.
pub(crate) async fn socket_in(ns: &NetnsFile) -> Result<Socket, DataplaneError> {
    let label = ns.label().to_owned();
    ns.run(move || Socket::new(NETLINK_ROUTE))
        .await?
        .map_err(|source| DataplaneError::Socket {
            netns: label,
            source,
        })
}

/// Same as [`socket_in`] for sync callers.
pub(crate) fn socket_in_blocking(ns: &NetnsFile) -> Result<Socket, DataplaneError> {
    ns.run_blocking(|| Socket::new(NETLINK_ROUTE))?
        .map_err(|source| DataplaneError::Socket {
            netns: ns.label().to_owned(),
            source,
        })
}

/// One request of a [`Conn::batch`]: the message, extra header flags and the operation named in
/// errors.
#[derive(Debug)]
pub(crate) struct Req {
    pub msg: RouteNetlinkMessage,
    pub flags: u16,
    pub op: String,
}

impl Req {
    pub(crate) fn new(msg: RouteNetlinkMessage, flags: u16, op: impl Into<String>) -> Self {
        Self {
            msg,
            flags,
            op: op.into(),
        }
    }
}

/// A typed handle on one rtnetlink connection; every error names the netns.
#[derive(Clone, Debug)]
pub(crate) struct Conn {
    handle: rtnetlink::Handle,
    netns: Arc<str>,
    /// The kernel runs one dump at a time per netlink socket (EBUSY otherwise); concurrent
    /// operations sharing the host socket take turns.
    dumps: Arc<tokio::sync::Mutex<()>>,
}

impl Conn {
    /// Registers `socket` with the current tokio runtime and spawns its connection task.
    /// The task ends when the last clone of the returned `Conn` is dropped.
    pub(crate) fn from_socket(socket: Socket, netns: &str) -> Result<Self, DataplaneError> {
        let err = |source| DataplaneError::Socket {
            netns: netns.to_owned(),
            source,
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| err(io::Error::other(format!("no tokio runtime: {e}"))))?;
        socket.set_non_blocking(true).map_err(err)?;
        // Dump requests are then filtered by the kernel (addresses of one ifindex, routes of one
        // table / output interface) instead of returning every object of the netns.
        socket.set_netlink_get_strict_chk(true).map_err(err)?;
        // SAFETY: the fd comes from `into_raw_fd` of an open netlink socket we own; ownership
        // moves to the TokioSocket. Its `from_raw_fd` registers with the reactor of the current
        // runtime, which exists (checked above), and sets non-blocking mode (already set).
        let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
        let (conn, handle, messages) = rtnetlink::from_socket(socket);
        drop(messages);
        runtime.spawn(conn);
        Ok(Self {
            handle,
            netns: Arc::from(netns),
            dumps: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// Creates the socket inside `ns` and connects it.
    pub(crate) async fn open(ns: &NetnsFile) -> Result<Self, DataplaneError> {
        let socket = socket_in(ns).await?;
        Self::from_socket(socket, ns.label())
    }

    pub(crate) fn netns(&self) -> &str {
        &self.netns
    }

    fn nl_err(&self, op: &str, source: io::Error) -> DataplaneError {
        DataplaneError::Netlink {
            op: op.to_owned(),
            netns: self.netns.to_string(),
            source,
        }
    }

    fn proto_err(&self, op: &str, detail: String) -> DataplaneError {
        DataplaneError::Protocol {
            op: op.to_owned(),
            netns: self.netns.to_string(),
            detail,
        }
    }

    /// Sends one request with `NLM_F_REQUEST | NLM_F_ACK | extra_flags` and waits for the ack.
    pub(crate) async fn ack(
        &self,
        msg: RouteNetlinkMessage,
        extra_flags: u16,
        op: &str,
    ) -> Result<(), DataplaneError> {
        let mut results = self.batch(vec![Req::new(msg, extra_flags, op)]).await;
        results.pop().unwrap_or(Ok(()))
    }

    /// Sends one request with `NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO | extra_flags`, waits for
    /// the ack and returns what the kernel echoed before it (e.g. the link it created, Linux
    /// >= 6.3; empty on older kernels).
    pub(crate) async fn ack_echo(
        &self,
        msg: RouteNetlinkMessage,
        extra_flags: u16,
        op: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, DataplaneError> {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO | extra_flags;
        let mut handle = self.handle.clone();
        let mut replies = handle
            .request(req)
            .map_err(|e| self.nl_err(op, io::Error::other(e.to_string())))?;
        let mut echoed = Vec::new();
        while let Some(reply) = replies.next().await {
            match reply.payload {
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        return Err(self.nl_err(op, io::Error::from_raw_os_error(-code.get())));
                    }
                }
                NetlinkPayload::InnerMessage(m) => echoed.push(m),
                _ => {}
            }
        }
        Ok(echoed)
    }

    /// Sends every request before awaiting any ack (one round trip for the lot; the kernel
    /// handles them in order), then returns one result per request, in order. A failed request
    /// does not stop the ones after it: callers order requests so that a later one failing
    /// because of an earlier failure is harmless, and undo what succeeded.
    pub(crate) async fn batch(&self, reqs: Vec<Req>) -> Vec<Result<(), DataplaneError>> {
        let mut handle = self.handle.clone();
        let mut pending = Vec::with_capacity(reqs.len());
        for Req { msg, flags, op } in reqs {
            let mut req = NetlinkMessage::from(msg);
            req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
            let sent = handle
                .request(req)
                .map_err(|e| self.nl_err(&op, io::Error::other(e.to_string())));
            pending.push((sent, op));
        }
        let mut out = Vec::with_capacity(pending.len());
        for (sent, op) in pending {
            let res = match sent {
                Err(e) => Err(e),
                Ok(mut replies) => {
                    let mut res = Ok(());
                    while let Some(reply) = replies.next().await {
                        if let NetlinkPayload::Error(e) = reply.payload
                            && let Some(code) = e.code
                        {
                            res = Err(self.nl_err(&op, io::Error::from_raw_os_error(-code.get())));
                        }
                    }
                    res
                }
            };
            out.push(res);
        }
        out
    }

    /// Sends a non-dump GET and returns the single answer.
    pub(crate) async fn get(
        &self,
        msg: RouteNetlinkMessage,
        op: &str,
    ) -> Result<RouteNetlinkMessage, DataplaneError> {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST;
        let mut handle = self.handle.clone();
        let mut replies = handle
            .request(req)
            .map_err(|e| self.nl_err(op, io::Error::other(e.to_string())))?;
        let mut answer = None;
        while let Some(reply) = replies.next().await {
            match reply.payload {
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        return Err(self.nl_err(op, io::Error::from_raw_os_error(-code.get())));
                    }
                }
                NetlinkPayload::InnerMessage(m) => answer = Some(m),
                _ => {}
            }
        }
        answer.ok_or_else(|| self.proto_err(op, "no answer from the kernel".to_owned()))
    }

    /// Dumps (`NLM_F_DUMP`), retrying when the kernel flags the dump as interrupted.
    pub(crate) async fn dump(
        &self,
        msg: RouteNetlinkMessage,
        op: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, DataplaneError> {
        let _one_dump_at_a_time = self.dumps.lock().await;
        for _ in 0..DUMP_ATTEMPTS {
            let mut req = NetlinkMessage::from(msg.clone());
            req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
            let mut handle = self.handle.clone();
            let mut replies = handle
                .request(req)
                .map_err(|e| self.nl_err(op, io::Error::other(e.to_string())))?;
            let mut out = Vec::new();
            let mut interrupted = false;
            while let Some(reply) = replies.next().await {
                if reply.header.flags & NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                match reply.payload {
                    NetlinkPayload::Error(e) => {
                        if let Some(code) = e.code {
                            return Err(self.nl_err(op, io::Error::from_raw_os_error(-code.get())));
                        }
                    }
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    NetlinkPayload::Overrun(_) => interrupted = true,
                    _ => {}
                }
            }
            if !interrupted {
                return Ok(out);
            }
            tracing::debug!(op, netns = %self.netns, "netlink dump interrupted, retrying");
        }
        Err(DataplaneError::DumpInterrupted {
            op: op.to_owned(),
            netns: self.netns.to_string(),
            attempts: DUMP_ATTEMPTS,
        })
    }
}
