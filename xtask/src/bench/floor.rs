//! Floors measured on the same machine, in a node namespace of their own: what no plugin can
//! go below.
//!
//! - exec: spawn + exec + wait of `/bin/true`, spawned, fed and reaped exactly like a plugin;
//! - kernel: the netlink requests of one provisioner ADD (veth pair created into the sandbox
//!   netns, the host end's IPv6 off (a sysctl), links up, addresses, routes), issued back to
//!   back on blocking sockets, one namespace's socket each, no runtime, no parsing beyond the
//!   ack: the kernel's own cost for the same work. xtask builds these messages itself: it
//!   cannot depend on the provisioner crate, which embeds the eBPF object that xtask builds.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags};
use netlink_packet_route::link::{LinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage};
use netlink_packet_route::route::{RouteProtocol, RouteScope, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::sys::socket::{self, MsgFlags, SockFlag, SockProtocol, SockType, recv, send, socket};

use super::machine::wait_quiet;
use super::stats::{Samples, Summary, thread_cpu};
use super::ways::{self, ADD, Way};
use super::{Netns, Options, check_interrupted, plugin, sandbox_namespaces, step};
use crate::step::detail;

/// Most sandboxes wired by the kernel floor.
const FLOOR_MAX: usize = 200;
const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
const PREFIX: u8 = 16;
const MTU: u32 = 1460;

/// What no plugin can go below, measured on this machine in this run.
pub struct Floors {
    /// Spawn + exec + wait of `/bin/true`, spawned, fed and reaped exactly like a plugin.
    pub exec: Samples,
    /// The kernel's cost of one ADD's netlink requests.
    pub kernel_add: Samples,
}

/// The floors, on a quiet node of their own.
pub fn measure(opts: &Options) -> Result<Floors> {
    let node = Netns::new("nodefloor")?;
    let n = opts.count.min(FLOOR_MAX);
    let pods = sandbox_namespaces("f", n)?;
    wait_quiet("the floors", opts.quiet_wait)?;
    let count = opts.count;
    step(format!("floor: spawn + exec of /bin/true x{count}"));
    let true_plugin = plugin(Path::new("/bin/true"), b"{}".to_vec(), &node);
    let lane = [(Way("true", Some(&true_plugin), None), &pods[..])];
    let mut exec = Samples::default();
    for _ in 0..count.div_ceil(n) {
        exec.extend(ways::interleaved(&lane, (ADD, "t"), n, 50, 1)?.remove(0));
    }
    detail(&Summary::of(&exec).line());
    step(format!(
        "floor: the kernel's cost of one ADD's netlink requests x{n}"
    ));
    let kernel_add = std::thread::scope(|s| {
        // A thread of its own enters the node, where the ADD's sysctl is written.
        let floor = s.spawn(|| node.enter_thread().and_then(|()| kernel_adds(&node, &pods)));
        floor.join().map_err(|_| anyhow!("floor thread panicked"))?
    })?;
    let line = Summary::of(&kernel_add).line();
    detail(&format!("ADD requests: {line}"));
    Ok(Floors { exec, kernel_add })
}

/// One ADD's requests for each of `pods`, timed one by one, from a thread in `node`. The veths
/// go with the pods' namespaces.
fn kernel_adds(node: &Netns, pods: &[Netns]) -> Result<Samples> {
    let mut node_socket = Socket::new()?;
    let mut adds = Samples::default();
    for (i, pod) in pods.iter().enumerate() {
        check_interrupted()?;
        let file = std::fs::File::open(pod.path())?;
        // The pod's socket is created in the pod, and this thread goes back to the node.
        pod.enter_thread()?;
        let pod_socket = Socket::new();
        node.enter_thread()?;
        let sockets = (&mut node_socket, &mut pod_socket?);
        let (cpu, started) = (thread_cpu()?, Instant::now());
        add(sockets, file.as_raw_fd(), i).with_context(|| format!("floor ADD {i}"))?;
        let wall = started.elapsed();
        adds.wall.push(wall);
        adds.process_cpu.push(thread_cpu()?.saturating_sub(cpu));
        adds.elapsed += wall;
    }
    Ok(adds)
}

/// A blocking rtnetlink socket, in the calling thread's namespace.
struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Socket {
    fn new() -> Result<Self> {
        let (family, kind) = (socket::AddressFamily::Netlink, SockType::Raw);
        let fd = socket(
            family,
            kind,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        );
        let fd = fd.context("netlink socket")?;
        Ok(Self {
            fd,
            seq: 0,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Sends one request with an ack and waits for it; the echoed link, if asked for.
    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> Result<Option<LinkMessage>> {
        self.seq += 1;
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut out = vec![0; req.buffer_len()];
        req.serialize(&mut out);
        let sent = send(self.fd.as_raw_fd(), &out, MsgFlags::empty()).context("netlink send")?;
        if sent != out.len() {
            bail!("netlink send: {sent} of {} bytes", out.len());
        }
        let mut echoed = None;
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty());
            let mut rest = &self.buf[..n.context("netlink recv")?];
            while !rest.is_empty() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest);
                let reply = reply.context("undecodable netlink reply")?;
                let len = usize::try_from(reply.header.length)?.clamp(1, rest.len());
                rest = &rest[len..];
                match reply.payload {
                    _ if reply.header.sequence_number != self.seq => {}
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(echoed),
                        Some(code) => {
                            return Err(std::io::Error::from_raw_os_error(-code.get()))
                                .context("netlink request failed");
                        }
                    },
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                        echoed = Some(l)
                    }
                    _ => {}
                }
            }
        }
    }
}

fn set_up(index: u32) -> RouteNetlinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.header.flags = LinkFlags::Up;
    msg.header.change_mask = LinkFlags::Up;
    RouteNetlinkMessage::SetLink(msg)
}

fn address(index: u32, ip: Ipv4Addr, prefix: u8, no_prefix_route: bool) -> RouteNetlinkMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = AddressFamily::Inet;
    msg.header.prefix_len = prefix;
    msg.header.index = index;
    msg.attributes.push(AddressAttribute::Local(IpAddr::V4(ip)));
    msg.attributes
        .push(AddressAttribute::Address(IpAddr::V4(ip)));
    if no_prefix_route {
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Noprefixroute));
    }
    RouteNetlinkMessage::NewAddress(msg)
}

/// A route out of `oif` to `dst`/`prefix` (a default route for prefix 0), via `gw`, from `src`.
fn route(
    oif: u32,
    (dst, prefix): (Ipv4Addr, u8),
    gw: Option<Ipv4Addr>,
    src: Option<Ipv4Addr>,
) -> RouteNetlinkMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = AddressFamily::Inet;
    msg.header.destination_prefix_length = prefix;
    msg.header.table = RouteHeader::RT_TABLE_MAIN;
    msg.header.protocol = RouteProtocol::Boot;
    msg.header.kind = RouteType::Unicast;
    // A host route on the node, a link route to the gateway, the others through it.
    msg.header.scope = match (gw, src) {
        (Some(_), _) => RouteScope::Universe,
        (None, Some(_)) => RouteScope::Link,
        (None, None) => RouteScope::Host,
    };
    let attributes = [
        (prefix > 0).then_some(RouteAttribute::Destination(RouteAddress::Inet(dst))),
        gw.map(|gw| RouteAttribute::Gateway(RouteAddress::Inet(gw))),
        src.map(|src| RouteAttribute::PrefSource(RouteAddress::Inet(src))),
        Some(RouteAttribute::Oif(oif)),
    ];
    msg.attributes.extend(attributes.into_iter().flatten());
    RouteNetlinkMessage::NewRoute(msg)
}

/// The requests of one provisioner ADD (IPv4, mtu 1460, default route), back to back.
fn add((node, pod): (&mut Socket, &mut Socket), pod_fd: i32, i: usize) -> Result<()> {
    let n = u32::try_from(i)? + 2;
    let ip = Ipv4Addr::new(10, 244, u8::try_from(n >> 8)?, u8::try_from(n & 0xff)?);
    let (host, sandbox) = veth(node, pod_fd, i)?;
    let create = NLM_F_CREATE | NLM_F_EXCL;
    node.request(set_up(host), 0)?;
    node.request(address(host, GATEWAY, 32, false), create)?;
    node.request(route(host, (ip, 32), None, None), create)?;
    pod.request(address(sandbox, ip, PREFIX, true), create)?;
    pod.request(set_up(sandbox), 0)?;
    pod.request(set_up(1), 0)?;
    let subnet = Ipv4Addr::new(10, 244, 0, 0);
    pod.request(route(sandbox, (GATEWAY, 32), None, Some(ip)), create)?;
    pod.request(
        route(sandbox, (subnet, PREFIX), Some(GATEWAY), Some(ip)),
        create,
    )?;
    pod.request(
        route(sandbox, (Ipv4Addr::UNSPECIFIED, 0), Some(GATEWAY), None),
        create,
    )?;
    Ok(())
}

/// The veth pair `pfl<i>` / `eth0` (in the pod, one queue each), with the host end's IPv6 off:
/// their indexes.
fn veth(node: &mut Socket, pod_fd: i32, i: usize) -> Result<(u32, u32)> {
    let one_queue = [LinkAttribute::NumTxQueues(1), LinkAttribute::NumRxQueues(1)];
    let mut peer = LinkMessage::default();
    let peer_attributes = [
        LinkAttribute::IfName("eth0".into()),
        LinkAttribute::NetNsFd(pod_fd),
    ];
    peer.attributes
        .extend(peer_attributes.into_iter().chain([LinkAttribute::Mtu(MTU)]));
    peer.attributes.extend(one_queue.clone());
    let mut veth = LinkMessage::default();
    veth.attributes
        .push(LinkAttribute::IfName(format!("pfl{i}")));
    veth.attributes.push(LinkAttribute::Mtu(MTU));
    veth.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Veth),
        LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
    ]));
    veth.attributes.extend(one_queue);
    let flags = NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO;
    let echoed = node
        .request(RouteNetlinkMessage::NewLink(veth), flags)?
        .context("the kernel did not echo the new veth (needs Linux >= 6.3)")?;
    let peer = echoed.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(peer) => Some(*peer),
        _ => None,
    });
    let sandbox = peer.context("echoed veth without its peer's index")?;
    // The calling thread is in the node's namespace. A node without IPv6 has no such key, and
    // the daemon skips it there too.
    match std::fs::write(format!("/proc/sys/net/ipv6/conf/pfl{i}/disable_ipv6"), "1") {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("turn IPv6 off on pfl{i}"))
        }
        _ => Ok((echoed.header.index, sandbox)),
    }
}
