//! One rtnetlink connection per namespace, built from a socket created inside that namespace.

use std::io;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_ECHO, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, TokioSocket};
use tokio::time::Instant;

use super::error::DataplaneError;
use super::netns::NetnsFile;

/// How often an interrupted dump (`NLM_F_DUMP_INTR`) is retried before giving up.
const DUMP_ATTEMPTS: u32 = 5;

const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 5_000;

/// Default time the kernel has to answer one request (all of a dump, with its retries).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS);

static REQUEST_TIMEOUT_MS: AtomicU64 = AtomicU64::new(DEFAULT_REQUEST_TIMEOUT_MS);

/// Sets the time the kernel has to answer each netlink request, for the whole process (the
/// daemon's `--netlink-timeout`); at least 1 ms.
pub fn set_request_timeout(timeout: Duration) {
    REQUEST_TIMEOUT_MS.store(timeout_ms(timeout), Ordering::Relaxed);
}

fn timeout_ms(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The time the kernel has to answer one request.
#[must_use]
pub fn request_timeout() -> Duration {
    Duration::from_millis(REQUEST_TIMEOUT_MS.load(Ordering::Relaxed))
}

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
    /// Time the kernel has to answer each request ([`request_timeout`] when connected).
    timeout: Duration,
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
        let (mut conn, handle, messages) = rtnetlink::from_socket(socket);
        // Acks and NLMSG_DONE reach the reply streams: a request is done when they arrive,
        // never because its stream ended (the connection may end without them).
        conn.set_forward_ack(true);
        conn.set_forward_done(true);
        drop(messages);
        runtime.spawn(conn);
        Ok(Self {
            handle,
            netns: Arc::from(netns),
            dumps: Arc::new(tokio::sync::Mutex::new(())),
            timeout: request_timeout(),
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

    #[cfg(test)]
    fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
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

    /// The error for a request whose replies did not come to a proper end.
    fn reply_err(&self, op: &str, err: ReplyError) -> DataplaneError {
        match err {
            ReplyError::Nack(errno) => self.nl_err(op, io::Error::from_raw_os_error(errno)),
            ReplyError::Ended(what) => {
                self.proto_err(op, format!("the kernel's reply ended without {what}"))
            }
            ReplyError::TimedOut => DataplaneError::Timeout {
                op: op.to_owned(),
                netns: self.netns.to_string(),
                after: self.timeout,
            },
        }
    }

    /// Sends `req` (flags already set) and returns its reply stream.
    fn send(
        &self,
        req: NetlinkMessage<RouteNetlinkMessage>,
        op: &str,
    ) -> Result<
        impl Stream<Item = NetlinkMessage<RouteNetlinkMessage>> + Unpin + use<>,
        DataplaneError,
    > {
        let mut handle = self.handle.clone();
        handle
            .request(req)
            .map_err(|e| self.nl_err(op, io::Error::other(e.to_string())))
    }

    /// Sends one request with `NLM_F_REQUEST | NLM_F_ACK | extra_flags` and waits for the ack.
    pub(crate) async fn ack(
        &self,
        msg: RouteNetlinkMessage,
        extra_flags: u16,
        op: &str,
    ) -> Result<(), DataplaneError> {
        let mut results = self.batch(vec![Req::new(msg, extra_flags, op)]).await;
        results
            .pop()
            .unwrap_or_else(|| Err(self.proto_err(op, "no result for the request".to_owned())))
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
        let deadline = Instant::now() + self.timeout;
        let replies = self.send(req, op)?;
        collect(replies, End::Ack, deadline)
            .await
            .map(|r| r.messages)
            .map_err(|e| self.reply_err(op, e))
    }

    /// Sends every request before awaiting any ack (one round trip for the lot; the kernel
    /// handles them in order), then returns one result per request, in order. A failed request
    /// does not stop the ones after it: callers order requests so that a later one failing
    /// because of an earlier failure is harmless, and undo what succeeded. Each request has
    /// [`request_timeout`] from the moment it was sent for its ack.
    pub(crate) async fn batch(&self, reqs: Vec<Req>) -> Vec<Result<(), DataplaneError>> {
        let deadline = Instant::now() + self.timeout;
        let mut pending = Vec::with_capacity(reqs.len());
        for Req { msg, flags, op } in reqs {
            let mut req = NetlinkMessage::from(msg);
            req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
            pending.push((self.send(req, &op), op));
        }
        let mut out = Vec::with_capacity(pending.len());
        for (sent, op) in pending {
            let res = match sent {
                Err(e) => Err(e),
                Ok(replies) => collect(replies, End::Ack, deadline)
                    .await
                    .map(|_| ())
                    .map_err(|e| self.reply_err(&op, e)),
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
        let deadline = Instant::now() + self.timeout;
        let replies = self.send(req, op)?;
        let mut answer = collect(replies, End::Answer, deadline)
            .await
            .map_err(|e| self.reply_err(op, e))?;
        answer
            .messages
            .pop()
            .ok_or_else(|| self.proto_err(op, "no answer from the kernel".to_owned()))
    }

    /// Dumps (`NLM_F_DUMP`), retrying when the kernel flags the dump as interrupted.
    pub(crate) async fn dump(
        &self,
        msg: RouteNetlinkMessage,
        op: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, DataplaneError> {
        let deadline = Instant::now() + self.timeout;
        let _one_dump_at_a_time = tokio::time::timeout_at(deadline, self.dumps.lock())
            .await
            .map_err(|_| self.reply_err(op, ReplyError::TimedOut))?;
        for _ in 0..DUMP_ATTEMPTS {
            let mut req = NetlinkMessage::from(msg.clone());
            req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
            let replies = self.send(req, op)?;
            let dumped = collect(replies, End::Done, deadline)
                .await
                .map_err(|e| self.reply_err(op, e))?;
            if !dumped.interrupted {
                return Ok(dumped.messages);
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

/// What ends the replies to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The acknowledgement (`NLMSG_ERROR` with code 0) of an `NLM_F_ACK` request.
    Ack,
    /// `NLMSG_DONE` of a dump.
    Done,
    /// The one answer of a plain GET.
    Answer,
}

impl End {
    fn what(self) -> &'static str {
        match self {
            End::Ack => "an acknowledgement",
            End::Done => "the end of the dump",
            End::Answer => "an answer",
        }
    }
}

/// Why the replies to a request did not come to a proper end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReplyError {
    /// The kernel refused the request (a positive errno).
    Nack(i32),
    /// The reply stream ended (connection closed) before what ends it.
    Ended(&'static str),
    /// Nothing ended the replies before the deadline.
    TimedOut,
}

/// The replies to one request, up to what ends them.
#[derive(Debug, Default)]
struct Replies {
    messages: Vec<RouteNetlinkMessage>,
    /// The dump was interrupted (`NLM_F_DUMP_INTR`) or overran: its content is not consistent.
    interrupted: bool,
}

/// Reads `replies` until `end` arrives, the kernel refuses the request, the stream ends (an
/// error: a request is never taken as done without its end) or `deadline` passes.
async fn collect<S>(mut replies: S, end: End, deadline: Instant) -> Result<Replies, ReplyError>
where
    S: Stream<Item = NetlinkMessage<RouteNetlinkMessage>> + Unpin,
{
    let mut out = Replies::default();
    loop {
        let next = tokio::time::timeout_at(deadline, replies.next())
            .await
            .map_err(|_| ReplyError::TimedOut)?;
        let Some(reply) = next else {
            return Err(ReplyError::Ended(end.what()));
        };
        if reply.header.flags & NLM_F_DUMP_INTR != 0 {
            out.interrupted = true;
        }
        match reply.payload {
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => return Err(ReplyError::Nack(-code.get())),
                None if end == End::Ack => return Ok(out),
                None => {}
            },
            NetlinkPayload::Done(done) if end == End::Done => {
                if done.code < 0 {
                    return Err(ReplyError::Nack(-done.code));
                }
                return Ok(out);
            }
            NetlinkPayload::InnerMessage(m) => {
                out.messages.push(m);
                if end == End::Answer {
                    return Ok(out);
                }
            }
            // The kernel lost replies: a dump is retried; anything else did not end properly.
            NetlinkPayload::Overrun(_) if end == End::Done => {
                out.interrupted = true;
                return Ok(out);
            }
            NetlinkPayload::Overrun(_) => return Err(ReplyError::Ended(end.what())),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroI32;

    use futures::stream;
    use netlink_packet_core::{DoneMessage, ErrorMessage, NetlinkHeader};
    use netlink_packet_route::link::LinkMessage;

    use super::*;

    fn inner() -> NetlinkMessage<RouteNetlinkMessage> {
        NetlinkMessage::from(RouteNetlinkMessage::NewLink(LinkMessage::default()))
    }

    fn ack() -> NetlinkMessage<RouteNetlinkMessage> {
        NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::Error(ErrorMessage::default()),
        )
    }

    fn nack(errno: i32) -> NetlinkMessage<RouteNetlinkMessage> {
        let mut e = ErrorMessage::default();
        e.code = NonZeroI32::new(-errno);
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::Error(e))
    }

    fn done(code: i32) -> NetlinkMessage<RouteNetlinkMessage> {
        let mut d = DoneMessage::default();
        d.code = code;
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::Done(d))
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn an_ack_ends_the_replies_with_what_was_echoed_before_it() {
        let replies = stream::iter(vec![inner(), ack()]);
        let got = collect(replies, End::Ack, soon()).await;
        assert_eq!(got.map(|r| r.messages.len()), Ok(1));
    }

    #[tokio::test]
    async fn replies_that_end_without_an_ack_are_an_error() {
        let replies = stream::iter(vec![inner()]);
        let got = collect(replies, End::Ack, soon()).await;
        assert_eq!(got.err(), Some(ReplyError::Ended("an acknowledgement")));
        let got = collect(stream::iter(Vec::new()), End::Ack, soon()).await;
        assert_eq!(got.err(), Some(ReplyError::Ended("an acknowledgement")));
    }

    #[tokio::test]
    async fn a_nack_is_the_kernels_errno() {
        let replies = stream::iter(vec![nack(libc::EEXIST)]);
        let got = collect(replies, End::Ack, soon()).await;
        assert_eq!(got.err(), Some(ReplyError::Nack(libc::EEXIST)));
    }

    #[tokio::test]
    async fn no_reply_within_the_deadline_times_out() {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(50);
        let got = collect(stream::pending(), End::Ack, deadline).await;
        assert_eq!(got.err(), Some(ReplyError::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(2));
        // Replies that come but never the ack time out too.
        let replies = stream::iter(vec![inner()]).chain(stream::pending());
        let got = collect(
            replies,
            End::Ack,
            Instant::now() + Duration::from_millis(50),
        )
        .await;
        assert_eq!(got.err(), Some(ReplyError::TimedOut));
    }

    #[tokio::test]
    async fn a_dump_needs_its_done_and_reports_interruptions() {
        let replies = stream::iter(vec![inner(), inner(), done(0)]);
        let got = collect(replies, End::Done, soon()).await;
        assert_eq!(
            got.map(|r| (r.messages.len(), r.interrupted)),
            Ok((2, false))
        );

        let mut flagged = inner();
        flagged.header.flags |= NLM_F_DUMP_INTR;
        let replies = stream::iter(vec![flagged, done(0)]);
        let got = collect(replies, End::Done, soon()).await;
        assert_eq!(got.map(|r| r.interrupted), Ok(true));

        let truncated = stream::iter(vec![inner(), inner()]);
        let got = collect(truncated, End::Done, soon()).await;
        assert_eq!(got.err(), Some(ReplyError::Ended("the end of the dump")));

        let failed = stream::iter(vec![inner(), done(-libc::EINTR)]);
        let got = collect(failed, End::Done, soon()).await;
        assert_eq!(got.err(), Some(ReplyError::Nack(libc::EINTR)));
    }

    #[tokio::test]
    async fn a_get_takes_the_first_answer() {
        let got = collect(stream::iter(vec![inner()]), End::Answer, soon()).await;
        assert_eq!(got.map(|r| r.messages.len()), Ok(1));
        let got = collect(stream::iter(Vec::new()), End::Answer, soon()).await;
        assert_eq!(got.err(), Some(ReplyError::Ended("an answer")));
    }

    /// A netlink socket nothing answers on (no kernel side for `NETLINK_USERSOCK`).
    fn deaf_conn(timeout: Duration) -> Conn {
        let socket = Socket::new(netlink_sys::protocols::NETLINK_USERSOCK).expect("socket");
        Conn::from_socket(socket, "deaf-ns")
            .expect("connect")
            .with_timeout(timeout)
    }

    #[tokio::test]
    async fn a_request_nothing_answers_fails_in_time_naming_the_operation() {
        let conn = deaf_conn(Duration::from_millis(200));
        let started = Instant::now();
        let msg = RouteNetlinkMessage::NewLink(LinkMessage::default());
        let err = conn
            .ack(msg, 0, "create link veth0")
            .await
            .expect_err("nothing acknowledged it");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let text = err.to_string();
        assert!(
            text.contains("create link veth0") && text.contains("deaf-ns"),
            "{text}"
        );
        // Before, a reply stream that ended without an ack counted as success.
        assert!(
            text.contains("without an acknowledgement") || text.contains("no answer"),
            "{text}"
        );
        let dumped = conn
            .dump(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                "list links",
            )
            .await
            .expect_err("no dump came");
        assert!(dumped.to_string().contains("list links"), "{dumped}");
    }

    #[test]
    fn the_request_timeout_is_at_least_a_millisecond() {
        assert_eq!(timeout_ms(Duration::ZERO), 1);
        assert_eq!(timeout_ms(Duration::from_secs(5)), 5_000);
    }
}
