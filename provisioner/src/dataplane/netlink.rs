//! One rtnetlink connection per namespace, built from a socket created inside that namespace.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_ECHO, NLM_F_REQUEST, NetlinkBuffer,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};
use provisioner_netlink::{Req, encode};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
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

/// Creates a (blocking, not yet registered) rtnetlink socket inside `ns`.
pub(crate) fn socket_in(ns: &NetnsFile) -> Result<Socket, DataplaneError> {
    ns.run_here(|| Socket::new(NETLINK_ROUTE))?
        .map_err(|source| DataplaneError::Socket {
            netns: ns.label().to_owned(),
            source,
        })
}

/// A typed handle on one rtnetlink socket; every error names the netns.
///
/// The kernel handles an rtnetlink request inside the `sendmsg` that carries it (a dump's next
/// part inside the `recvmsg` that drains the previous one), so its replies are queued on the
/// socket when the send returns: the calling task sends and reads them itself, with no
/// connection task, channel or wake-up in between. One exchange (send, then read every reply
/// of it) runs at a time per socket; callers sharing the host socket take turns. Each request
/// goes in a datagram of its own: a tracer of `sendmsg` (ours copies the first 256 bytes of
/// each) then sees every request whole.
#[derive(Clone, Debug)]
pub(crate) struct Conn {
    inner: Arc<Socketed>,
}

#[derive(Debug)]
struct Socketed {
    socket: AsyncFd<Socket>,
    /// Who answers: the kernel (tests put a fake one here).
    peer: SocketAddr,
    netns: Arc<str>,
    exchange: tokio::sync::Mutex<Exchange>,
    /// Time the kernel has to answer each exchange ([`request_timeout`] when connected).
    timeout: Duration,
}

/// The state of the socket between exchanges.
#[derive(Debug)]
struct Exchange {
    next_seq: u32,
    send: Vec<u8>,
    recv: Vec<u8>,
    /// An exchange was abandoned (deadline, cancelled caller) before all its replies were read:
    /// the next one drains the socket first (a dump in progress ends as it is read).
    unfinished: bool,
}

/// Size of the receive buffer: the kernel fills one read with at most 32 KiB of a dump.
const RECV_BUFFER: usize = 64 * 1024;

impl Conn {
    /// Registers `socket` with the current tokio runtime's reactor.
    pub(crate) fn from_socket(socket: Socket, netns: &str) -> Result<Self, DataplaneError> {
        let err = |source| DataplaneError::Socket {
            netns: netns.to_owned(),
            source,
        };
        tokio::runtime::Handle::try_current()
            .map_err(|e| err(io::Error::other(format!("no tokio runtime: {e}"))))?;
        socket.set_non_blocking(true).map_err(err)?;
        // Dump requests are then filtered by the kernel (addresses of one ifindex, routes of one
        // table / output interface) instead of returning every object of the netns.
        socket.set_netlink_get_strict_chk(true).map_err(err)?;
        // SAFETY: the socket owns its fd, which stays open and the same until the socket (moved
        // into the AsyncFd) is dropped with it; a runtime exists (checked above).
        let socket = unsafe { AsyncFd::register(socket) }.map_err(|e| err(e.into_parts().1))?;
        Ok(Self {
            inner: Arc::new(Socketed {
                socket,
                peer: SocketAddr::new(0, 0),
                netns: Arc::from(netns),
                exchange: tokio::sync::Mutex::new(Exchange {
                    next_seq: 1,
                    send: Vec::new(),
                    recv: Vec::with_capacity(RECV_BUFFER),
                    unfinished: false,
                }),
                timeout: request_timeout(),
            }),
        })
    }

    /// Creates the socket inside `ns` and connects it.
    pub(crate) fn open(ns: &NetnsFile) -> Result<Self, DataplaneError> {
        let socket = socket_in(ns)?;
        Self::from_socket(socket, ns.label())
    }

    pub(crate) fn netns(&self) -> &str {
        &self.inner.netns
    }

    /// This connection asking `peer` (a fake kernel) instead, with `timeout` per exchange.
    #[cfg(test)]
    fn for_tests(self, peer: SocketAddr, timeout: Duration) -> Self {
        let Ok(mut inner) = Arc::try_unwrap(self.inner) else {
            unreachable!("a fresh connection has one handle");
        };
        inner.peer = peer;
        inner.timeout = timeout;
        Self {
            inner: Arc::new(inner),
        }
    }

    fn nl_err(&self, op: &str, source: io::Error) -> DataplaneError {
        DataplaneError::Netlink {
            op: op.to_owned(),
            netns: self.netns().to_owned(),
            source,
        }
    }

    fn proto_err(&self, op: &str, detail: String) -> DataplaneError {
        DataplaneError::Protocol {
            op: op.to_owned(),
            netns: self.netns().to_owned(),
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
                netns: self.netns().to_owned(),
                after: self.inner.timeout,
            },
            ReplyError::Socket(source) => {
                let source = source.raw_os_error().map_or_else(
                    || io::Error::new(source.kind(), source.to_string()),
                    io::Error::from_raw_os_error,
                );
                self.nl_err(op, source)
            }
            ReplyError::Malformed(detail) => self.proto_err(op, detail),
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
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_ECHO | extra_flags;
        self.one(msg, flags, End::Ack, op).await.map(|r| r.messages)
    }

    /// Sends every request (one datagram each, back to back: the kernel handles them in order)
    /// before reading any reply, then returns one result per request, in order. A failed request does not stop the ones after it:
    /// callers order requests so that a later one failing because of an earlier failure is
    /// harmless, and undo what succeeded. The lot has [`request_timeout`] for its acks.
    pub(crate) async fn batch(&self, reqs: Vec<Req>) -> Vec<Result<(), DataplaneError>> {
        let mut ops = Vec::with_capacity(reqs.len());
        let mut requests = Vec::with_capacity(reqs.len());
        for Req { msg, flags, op } in reqs {
            requests.push((msg, NLM_F_REQUEST | NLM_F_ACK | flags, End::Ack));
            ops.push(op);
        }
        self.exchange(requests)
            .await
            .into_iter()
            .zip(ops)
            .map(|(res, op)| res.map(drop).map_err(|e| self.reply_err(&op, e)))
            .collect()
    }

    /// Sends a non-dump GET and returns the single answer.
    pub(crate) async fn get(
        &self,
        msg: RouteNetlinkMessage,
        op: &str,
    ) -> Result<RouteNetlinkMessage, DataplaneError> {
        let mut answer = self.one(msg, NLM_F_REQUEST, End::Answer, op).await?;
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
        for _ in 0..DUMP_ATTEMPTS {
            let dumped = self
                .one(msg.clone(), NLM_F_REQUEST | NLM_F_DUMP, End::Done, op)
                .await?;
            if !dumped.interrupted {
                return Ok(dumped.messages);
            }
            tracing::debug!(op, netns = %self.netns(), "netlink dump interrupted, retrying");
        }
        Err(DataplaneError::DumpInterrupted {
            op: op.to_owned(),
            netns: self.netns().to_owned(),
            attempts: DUMP_ATTEMPTS,
        })
    }

    async fn one(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
        end: End,
        op: &str,
    ) -> Result<Replies, DataplaneError> {
        self.exchange(vec![(msg, flags, end)])
            .await
            .pop()
            .unwrap_or(Err(ReplyError::Ended(end.what())))
            .map_err(|e| self.reply_err(op, e))
    }

    /// Sends `requests` and reads until each has what ends its replies, or the deadline passes
    /// (the ones still waiting then time out).
    async fn exchange(
        &self,
        requests: Vec<(RouteNetlinkMessage, u16, End)>,
    ) -> Vec<Result<Replies, ReplyError>> {
        let deadline = Instant::now() + self.inner.timeout;
        let count = requests.len();
        let all = |err: &ReplyError| (0..count).map(|_| Err(err.clone())).collect();
        let Ok(mut state) = tokio::time::timeout_at(deadline, self.inner.exchange.lock()).await
        else {
            return all(&ReplyError::TimedOut);
        };
        let state = &mut *state;
        if state.unfinished {
            self.drain(&mut state.recv);
        }
        state.unfinished = true;
        let mut pending = Vec::with_capacity(count);
        let mut datagrams = Vec::with_capacity(count);
        state.send.clear();
        for (msg, flags, end) in requests {
            let seq = state.next_seq;
            state.next_seq = state.next_seq.wrapping_add(1).max(1);
            datagrams.push(encode(msg, flags, seq, &mut state.send));
            pending.push(Pending::new(seq, end));
        }
        for (sent_so_far, datagram) in datagrams.into_iter().enumerate() {
            let sent = tokio::time::timeout_at(
                deadline,
                self.now_or_when_ready(Interest::WRITABLE, |s| {
                    s.send_to(&state.send[datagram.clone()], &self.inner.peer, 0)
                }),
            )
            .await;
            let failed = match sent {
                Err(_) => ReplyError::TimedOut,
                Ok(Err(e)) => ReplyError::Socket(Arc::new(e)),
                Ok(Ok(_)) => continue,
            };
            if sent_so_far == 0 {
                return all(&failed);
            }
            // The requests sent are answered below; the others never left.
            for p in &mut pending[sent_so_far..] {
                p.result = Some(Err(failed.clone()));
            }
            break;
        }
        while pending.iter().any(|p| p.result.is_none()) {
            state.recv.clear();
            let read = tokio::time::timeout_at(
                deadline,
                self.now_or_when_ready(Interest::READABLE, |s| {
                    s.recv_from(&mut state.recv, libc::MSG_TRUNC)
                }),
            )
            .await;
            let failed = match read {
                Err(_) => ReplyError::TimedOut,
                Ok(Err(e)) => ReplyError::Socket(Arc::new(e)),
                Ok(Ok((len, _))) if len > state.recv.len() => ReplyError::Malformed(format!(
                    "a reply of {len} bytes did not fit the {RECV_BUFFER}-byte buffer"
                )),
                Ok(Ok((_, from))) if from.port_number() != self.inner.peer.port_number() => {
                    continue;
                }
                Ok(Ok(_)) => match feed_datagram(&state.recv, &mut pending) {
                    Ok(()) => continue,
                    Err(detail) => ReplyError::Malformed(detail),
                },
            };
            for p in pending.iter_mut().filter(|p| p.result.is_none()) {
                p.result = Some(Err(failed.clone()));
            }
        }
        // A refusal ends a request properly; any other failure may leave replies behind.
        state.unfinished = pending
            .iter()
            .any(|p| matches!(p.result, Some(Err(ref e)) if !matches!(e, ReplyError::Nack(_))));
        pending
            .into_iter()
            .map(|p| p.result.unwrap_or(Err(ReplyError::TimedOut)))
            .collect()
    }

    /// Runs `io` at once: the kernel has usually answered by the time a reply is read, and
    /// waiting for the reactor to report readiness first would cost a trip through it (a
    /// context switch when the reactor runs on another thread). Only when the socket is not
    /// ready does it wait for readiness and try again.
    async fn now_or_when_ready<R>(
        &self,
        interest: Interest,
        mut io: impl FnMut(&Socket) -> io::Result<R>,
    ) -> io::Result<R> {
        match io(self.inner.socket.get_ref()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.inner.socket.async_io(interest, io).await
            }
            done => done,
        }
    }

    /// Reads and drops whatever an abandoned exchange left on the socket.
    fn drain(&self, buf: &mut Vec<u8>) {
        loop {
            buf.clear();
            match self.inner.socket.get_ref().recv(buf, libc::MSG_DONTWAIT) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

/// Feeds every message of one datagram to the request it answers (by sequence number);
/// messages of no waiting request (left by an abandoned exchange) are dropped.
fn feed_datagram(datagram: &[u8], pending: &mut [Pending]) -> Result<(), String> {
    let mut offset = 0;
    while offset < datagram.len() {
        let rest = &datagram[offset..];
        let len = NetlinkBuffer::new_checked(rest)
            .map_err(|e| format!("a malformed netlink header at byte {offset}: {e}"))?
            .length() as usize;
        let seq = NetlinkBuffer::new(rest).sequence_number();
        if let Some(p) = pending
            .iter_mut()
            .find(|p| p.seq == seq && p.result.is_none())
        {
            let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len])
                .map_err(|e| format!("an undecodable reply: {e}"))?;
            p.feed(message);
        }
        offset += len.max(1).next_multiple_of(4);
    }
    Ok(())
}

/// One request of an exchange: its sequence number, what ends its replies, what came so far.
#[derive(Debug)]
struct Pending {
    seq: u32,
    end: End,
    replies: Replies,
    result: Option<Result<Replies, ReplyError>>,
}

impl Pending {
    fn new(seq: u32, end: End) -> Self {
        Self {
            seq,
            end,
            replies: Replies::default(),
            result: None,
        }
    }

    /// Takes one reply: the request ends with what ends it (its ack, the dump's done, the
    /// answer) or with the kernel's refusal.
    fn feed(&mut self, reply: NetlinkMessage<RouteNetlinkMessage>) {
        if reply.header.flags & NLM_F_DUMP_INTR != 0 {
            self.replies.interrupted = true;
        }
        let end = self.end;
        let outcome = match reply.payload {
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => Some(Err(ReplyError::Nack(-code.get()))),
                None if end == End::Ack => Some(Ok(())),
                None => None,
            },
            NetlinkPayload::Done(done) if end == End::Done => Some(if done.code < 0 {
                Err(ReplyError::Nack(-done.code))
            } else {
                Ok(())
            }),
            NetlinkPayload::InnerMessage(m) => {
                self.replies.messages.push(m);
                (end == End::Answer).then_some(Ok(()))
            }
            // The kernel lost replies: a dump is retried; anything else did not end properly.
            NetlinkPayload::Overrun(_) if end == End::Done => {
                self.replies.interrupted = true;
                Some(Ok(()))
            }
            NetlinkPayload::Overrun(_) => Some(Err(ReplyError::Ended(end.what()))),
            _ => None,
        };
        if let Some(outcome) = outcome {
            let replies = std::mem::take(&mut self.replies);
            self.result = Some(outcome.map(|()| replies));
        }
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
#[derive(Debug, Clone)]
enum ReplyError {
    /// The kernel refused the request (a positive errno).
    Nack(i32),
    /// The replies ended (e.g. the kernel lost some) before what ends them.
    Ended(&'static str),
    /// Nothing ended the replies before the deadline.
    TimedOut,
    /// Sending or receiving failed.
    Socket(Arc<io::Error>),
    /// A reply could not be read.
    Malformed(String),
}

/// The replies to one request, up to what ends them.
#[derive(Debug, Default)]
struct Replies {
    messages: Vec<RouteNetlinkMessage>,
    /// The dump was interrupted (`NLM_F_DUMP_INTR`) or overran: its content is not consistent.
    interrupted: bool,
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroI32;

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

    /// What `replies` make of one request waiting for `end`; `None` while it still waits.
    fn fed(
        end: End,
        replies: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> Option<Result<Replies, ReplyError>> {
        let mut pending = Pending::new(1, end);
        for reply in replies {
            assert!(pending.result.is_none(), "a reply after the end");
            pending.feed(reply);
        }
        pending.result
    }

    fn nacked(got: Option<Result<Replies, ReplyError>>) -> Option<i32> {
        match got {
            Some(Err(ReplyError::Nack(errno))) => Some(errno),
            _ => None,
        }
    }

    #[test]
    fn an_ack_ends_the_replies_with_what_was_echoed_before_it() {
        let got = fed(End::Ack, vec![inner(), ack()]);
        assert_eq!(got.and_then(Result::ok).map(|r| r.messages.len()), Some(1));
    }

    #[test]
    fn replies_without_their_end_leave_the_request_waiting() {
        assert!(fed(End::Ack, vec![inner()]).is_none());
        assert!(fed(End::Done, vec![inner(), inner()]).is_none());
        // A stray ack does not end a dump or a GET.
        assert!(fed(End::Done, vec![ack()]).is_none());
        assert!(fed(End::Answer, vec![ack()]).is_none());
    }

    #[test]
    fn a_nack_is_the_kernels_errno() {
        assert_eq!(
            nacked(fed(End::Ack, vec![nack(libc::EEXIST)])),
            Some(libc::EEXIST)
        );
        assert_eq!(
            nacked(fed(End::Answer, vec![nack(libc::ENODEV)])),
            Some(libc::ENODEV)
        );
    }

    #[test]
    fn a_dump_needs_its_done_and_reports_interruptions() {
        let got = fed(End::Done, vec![inner(), inner(), done(0)]);
        assert_eq!(
            got.and_then(Result::ok)
                .map(|r| (r.messages.len(), r.interrupted)),
            Some((2, false))
        );

        let mut flagged = inner();
        flagged.header.flags |= NLM_F_DUMP_INTR;
        let got = fed(End::Done, vec![flagged, done(0)]);
        assert_eq!(got.and_then(Result::ok).map(|r| r.interrupted), Some(true));

        assert_eq!(
            nacked(fed(End::Done, vec![inner(), done(-libc::EINTR)])),
            Some(libc::EINTR)
        );
    }

    #[test]
    fn a_get_takes_the_first_answer() {
        let got = fed(End::Answer, vec![inner()]);
        assert_eq!(got.and_then(Result::ok).map(|r| r.messages.len()), Some(1));
    }

    fn datagram(messages: Vec<(u32, NetlinkMessage<RouteNetlinkMessage>)>) -> Vec<u8> {
        let mut out = Vec::new();
        for (seq, mut m) in messages {
            m.header.sequence_number = seq;
            m.finalize();
            let at = out.len();
            let len = m.buffer_len();
            out.resize(at + len.next_multiple_of(4), 0);
            m.serialize(&mut out[at..at + len]);
        }
        out
    }

    #[test]
    fn replies_reach_their_request_by_sequence_number_and_strays_are_dropped() {
        let mut pending = vec![Pending::new(7, End::Ack), Pending::new(8, End::Done)];
        // 5 is a request abandoned earlier: its replies are not anyone's now.
        let bytes = datagram(vec![
            (5, nack(libc::EEXIST)),
            (8, inner()),
            (7, ack()),
            (8, inner()),
            (8, done(0)),
        ]);
        feed_datagram(&bytes, &mut pending).expect("well-formed");
        assert!(matches!(pending[0].result, Some(Ok(_))), "{:?}", pending[0]);
        assert_eq!(
            pending[1]
                .result
                .as_ref()
                .map(|r| r.as_ref().map(|r| r.messages.len()).ok()),
            Some(Some(2))
        );
        let mut pending = vec![Pending::new(1, End::Ack)];
        let err = feed_datagram(&bytes[..10], &mut pending).expect_err("a cut header");
        assert!(err.contains("malformed"), "{err}");
    }

    /// A fake kernel: a `NETLINK_USERSOCK` socket that, once it has received `per_answer`
    /// requests, answers them with `answer` (their sequence numbers in, datagrams out); and a
    /// connection asking it. Every datagram it receives must hold exactly one request.
    fn with_fake_kernel(
        timeout: Duration,
        per_answer: usize,
        answer: impl Fn(&[u32]) -> Vec<Vec<u8>> + Send + 'static,
    ) -> Conn {
        let mut kernel = Socket::new(netlink_sys::protocols::NETLINK_USERSOCK).expect("socket");
        let kernel_addr = kernel.bind_auto().expect("bind");
        let mut ours = Socket::new(netlink_sys::protocols::NETLINK_USERSOCK).expect("socket");
        ours.bind_auto().expect("bind");
        std::thread::spawn(move || {
            let mut seqs = Vec::new();
            while let Ok((datagram, from)) = kernel.recv_from_full() {
                let buf = NetlinkBuffer::new_checked(&datagram[..]).expect("a request");
                assert_eq!(
                    buf.length() as usize,
                    datagram.len(),
                    "one request per datagram"
                );
                seqs.push(buf.sequence_number());
                if seqs.len() < per_answer {
                    continue;
                }
                for reply in answer(&seqs) {
                    kernel.send_to(&reply, &from, 0).expect("reply");
                }
                seqs.clear();
            }
        });
        Conn::from_socket(ours, "fake-ns")
            .expect("connect")
            .for_tests(kernel_addr, timeout)
    }

    fn link() -> RouteNetlinkMessage {
        RouteNetlinkMessage::NewLink(LinkMessage::default())
    }

    #[tokio::test]
    async fn a_request_nothing_answers_fails_in_time_naming_the_operation() {
        let conn = with_fake_kernel(Duration::from_millis(200), 1, |_| Vec::new());
        let started = Instant::now();
        let err = conn
            .ack(link(), 0, "create link veth0")
            .await
            .expect_err("nothing acknowledged it");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(err, DataplaneError::Timeout { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("create link veth0") && text.contains("fake-ns"),
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

    #[tokio::test]
    async fn a_batch_gets_one_result_per_request_in_order_whatever_order_the_replies_come_in() {
        // The second request is refused; its refusal comes first, after a stray reply of a
        // request nobody waits for.
        let conn = with_fake_kernel(Duration::from_secs(5), 2, |seqs| {
            let mut replies = vec![(seqs[0].wrapping_sub(1), nack(libc::ENOENT))];
            replies.push((seqs[1], nack(libc::EEXIST)));
            replies.push((seqs[0], ack()));
            vec![datagram(replies)]
        });
        let got = conn
            .batch(vec![
                Req::new(link(), 0, "create link a"),
                Req::new(link(), 0, "create link b"),
            ])
            .await;
        assert!(got[0].is_ok(), "{got:?}");
        let refused = got[1].as_ref().expect_err("refused");
        assert!(
            refused.to_string().contains("create link b")
                && matches!(refused, DataplaneError::Netlink { source, .. } if source.raw_os_error() == Some(libc::EEXIST)),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn replies_left_by_an_abandoned_exchange_do_not_answer_the_next_one() {
        // The first exchange gets nothing in time; its ack arrives late, just before the
        // second exchange's own refusal.
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let conn = with_fake_kernel(Duration::from_millis(300), 1, {
            let asked = Arc::clone(&asked);
            move |seqs| match asked.fetch_add(1, Ordering::SeqCst) {
                0 => Vec::new(),
                _ => vec![
                    datagram(vec![(seqs[0].wrapping_sub(1), ack())]),
                    datagram(vec![(seqs[0], nack(libc::EBUSY))]),
                ],
            }
        });
        let first = conn.ack(link(), 0, "first").await;
        assert!(
            matches!(first, Err(DataplaneError::Timeout { .. })),
            "{first:?}"
        );
        let second = conn.ack(link(), 0, "second").await.expect_err("refused");
        assert!(
            matches!(&second, DataplaneError::Netlink { source, .. } if source.raw_os_error() == Some(libc::EBUSY)),
            "{second:?}"
        );
    }

    #[test]
    fn the_request_timeout_is_at_least_a_millisecond() {
        assert_eq!(timeout_ms(Duration::ZERO), 1);
        assert_eq!(timeout_ms(Duration::from_secs(5)), 5_000);
    }
}
