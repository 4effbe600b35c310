//! The rtnetlink requests that wire and unwire a sandbox (veth pair, links up and down, addresses,
//! routes), built with rtnetlink's message builders, and their encoding as the kernel receives
//! them. The provisioner's dataplane sends them on its own pipelined socket; the bench's kernel
//! floor (xtask) sends the very same ones on a blocking socket. A crate of its own because xtask
//! cannot depend on the provisioner crate, whose build needs the eBPF toolchain xtask installs.
//!
//! Requests that read (link gets, dumps, FIB lookups) stay in the dataplane, next to the code
//! that parses their answers.

use std::ops::Range;

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;

pub mod address;
pub mod link;
pub mod route;

/// One request: the message, the header flags it needs beyond `NLM_F_REQUEST | NLM_F_ACK`, and
/// the operation, as errors name it.
#[derive(Debug)]
pub struct Req {
    pub msg: RouteNetlinkMessage,
    pub flags: u16,
    pub op: String,
}

impl Req {
    #[must_use]
    pub fn new(msg: RouteNetlinkMessage, flags: u16, op: impl Into<String>) -> Self {
        Self {
            msg,
            flags,
            op: op.into(),
        }
    }

    /// Appends the request as the kernel receives it (acked, sequence number `seq`) to `out`;
    /// returns where it lies in `out`.
    pub fn encode(self, seq: u32, out: &mut Vec<u8>) -> Range<usize> {
        encode(self.msg, NLM_F_REQUEST | NLM_F_ACK | self.flags, seq, out)
    }
}

/// Appends `msg` as the kernel receives it, with header `flags` and sequence number `seq`, to
/// `out`; returns where it lies in `out`.
pub fn encode(msg: RouteNetlinkMessage, flags: u16, seq: u32, out: &mut Vec<u8>) -> Range<usize> {
    let mut req = NetlinkMessage::from(msg);
    req.header.flags = flags;
    req.header.sequence_number = seq;
    req.finalize();
    let at = out.len();
    let len = req.buffer_len();
    out.resize(at + len, 0);
    req.serialize(&mut out[at..]);
    at..at + len
}

/// The bytes the kernel receives for `msg` with header `flags` and sequence number 1, in hex:
/// what byte-for-byte tests of requests compare.
#[must_use]
pub fn wire_hex(msg: RouteNetlinkMessage, flags: u16) -> String {
    let mut out = Vec::new();
    encode(msg, flags, 1, &mut out);
    out.iter().map(|b| format!("{b:02x}")).collect()
}

/// What is sent for `req` (with sequence number 1), in hex.
#[cfg(test)]
fn req_hex(req: Req) -> String {
    let mut out = Vec::new();
    req.encode(1, &mut out);
    out.iter().map(|b| format!("{b:02x}")).collect()
}
