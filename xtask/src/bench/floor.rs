//! Floors measured on the same machine: what no plugin can go below.
//!
//! - exec: spawn + exec of `/bin/true` from the node namespace, fed and reaped exactly like a
//!   plugin;
//! - kernel: the netlink requests of one provisioner ADD (veth pair, the host end's IPv6 off
//!   (a sysctl), links up, addresses, routes) and of one DEL (routes and addresses withdrawn,
//!   links down, the sandbox end renamed, the host end moved to a link group), issued back to
//!   back on blocking sockets, one namespace's socket each, no runtime, no parsing beyond the
//!   ack: the kernel's own cost for the same work.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::netns::Netns;
use super::stats::Samples;

/// Link group of the floor's retired links (deleted at once at the end, untimed).
const FLOOR_GROUP: u32 = 0x7078_666c;

/// A blocking rtnetlink socket created inside a namespace.
struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Socket {
    fn in_netns(ns: &Netns) -> Result<Self> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
        // A thread of its own enters the namespace, so this thread's namespace never changes.
        let fd = std::thread::scope(|s| {
            s.spawn(|| -> Result<OwnedFd> {
                ns.enter_thread()?;
                let (family, kind) = (AddressFamily::Netlink, SockType::Raw);
                socket(
                    family,
                    kind,
                    SockFlag::SOCK_CLOEXEC,
                    SockProtocol::NetlinkRoute,
                )
                .with_context(|| format!("netlink socket in {}", ns.name()))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("netns thread panicked"))?
        })?;
        let buf = vec![0; 64 * 1024];
        Ok(Self { fd, seq: 0, buf })
    }

    /// Sends one request with an ack and waits for it; the echoed message, if asked for.
    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> Result<Option<LinkMessage>> {
        use nix::sys::socket::{MsgFlags, recv, send};
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
            let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())
                .context("netlink recv")?;
            let mut offset = 0;
            while offset < n {
                let reply =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[offset..n])
                        .context("undecodable netlink reply")?;
                let len = usize::try_from(reply.header.length)?;
                if len == 0 {
                    break;
                }
                offset += len;
                if reply.header.sequence_number != self.seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(echoed),
                            Some(code) => Err(anyhow::anyhow!(
                                "netlink request failed: {}",
                                std::io::Error::from_raw_os_error(-code.get())
                            )),
                        };
                    }
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                        echoed = Some(l);
                    }
                    _ => {}
                }
            }
        }
    }
}

fn link(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg
}

fn set_up(index: u32, up: bool) -> RouteNetlinkMessage {
    let mut msg = link(index);
    if up {
        msg.header.flags = LinkFlags::Up;
    }
    msg.header.change_mask = LinkFlags::Up;
    RouteNetlinkMessage::SetLink(msg)
}

fn rename(index: u32, name: String) -> RouteNetlinkMessage {
    let mut msg = link(index);
    msg.attributes.push(LinkAttribute::IfName(name));
    RouteNetlinkMessage::SetLink(msg)
}

/// Down and into the floor's link group, in one request (a retired host end).
fn retire(index: u32) -> RouteNetlinkMessage {
    let mut msg = link(index);
    msg.header.change_mask = LinkFlags::Up;
    msg.attributes.push(LinkAttribute::Group(FLOOR_GROUP));
    RouteNetlinkMessage::SetLink(msg)
}

fn address(index: u32, ip: Ipv4Addr, prefix: u8, no_prefix_route: bool) -> AddressMessage {
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
    msg
}

fn route(
    oif: u32,
    dst: Ipv4Addr,
    prefix: u8,
    gw: Option<Ipv4Addr>,
    src: Option<Ipv4Addr>,
    scope: RouteScope,
) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = AddressFamily::Inet;
    msg.header.destination_prefix_length = prefix;
    msg.header.table = RouteHeader::RT_TABLE_MAIN;
    msg.header.protocol = RouteProtocol::Boot;
    msg.header.kind = RouteType::Unicast;
    msg.header.scope = scope;
    if prefix > 0 {
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(dst)));
    }
    if let Some(gw) = gw {
        msg.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(gw)));
    }
    if let Some(src) = src {
        msg.attributes
            .push(RouteAttribute::PrefSource(RouteAddress::Inet(src)));
    }
    msg.attributes.push(RouteAttribute::Oif(oif));
    msg
}

/// What one sandbox got: enough to tear it down.
struct Wired {
    host: u32,
    sandbox: u32,
    pod: Ipv4Addr,
}

const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
const PREFIX: u8 = 16;

/// The requests of one provisioner ADD (IPv4, mtu 1460, default route), back to back.
fn add(node: &mut Socket, pod: &mut Socket, pod_fd: i32, i: usize) -> Result<Wired> {
    let n = u32::try_from(i)? + 2;
    let ip = Ipv4Addr::new(10, 244, u8::try_from(n >> 8)?, u8::try_from(n & 0xff)?);
    let (host, sandbox) = veth(node, pod_fd, i)?;
    address_and_route(node, pod, (host, sandbox), ip)?;
    Ok(Wired {
        host,
        sandbox,
        pod: ip,
    })
}

/// The veth pair `pfl<i>` / `eth0` (in the pod), with the host end's IPv6 off: their indexes.
fn veth(node: &mut Socket, pod_fd: i32, i: usize) -> Result<(u32, u32)> {
    let one_queue = [LinkAttribute::NumTxQueues(1), LinkAttribute::NumRxQueues(1)];
    let mut peer = LinkMessage::default();
    peer.attributes.push(LinkAttribute::IfName("eth0".into()));
    peer.attributes.push(LinkAttribute::NetNsFd(pod_fd));
    peer.attributes.push(LinkAttribute::Mtu(1460));
    peer.attributes.extend(one_queue.clone());
    let mut veth = LinkMessage::default();
    veth.attributes
        .push(LinkAttribute::IfName(format!("pfl{i}")));
    veth.attributes.push(LinkAttribute::Mtu(1460));
    veth.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Veth),
        LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
    ]));
    veth.attributes.extend(one_queue);
    let echoed = node
        .request(
            RouteNetlinkMessage::NewLink(veth),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO,
        )?
        .context("the kernel did not echo the new veth (needs Linux >= 6.3)")?;
    let host = echoed.header.index;
    let sandbox = echoed
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Link(peer) => Some(*peer),
            _ => None,
        })
        .context("echoed veth without its peer's index")?;
    // The calling thread is in the node's namespace (see `kernel`). A node without IPv6 has no
    // such key, and the daemon skips it there too.
    match std::fs::write(format!("/proc/sys/net/ipv6/conf/pfl{i}/disable_ipv6"), "1") {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("turn IPv6 off on pfl{i}"));
        }
        _ => {}
    }
    Ok((host, sandbox))
}

/// The host end's gateway address and host route, the pod's address and routes, links up.
fn address_and_route(
    node: &mut Socket,
    pod: &mut Socket,
    (host, sandbox): (u32, u32),
    ip: Ipv4Addr,
) -> Result<()> {
    let create = NLM_F_CREATE | NLM_F_EXCL;
    node.request(set_up(host, true), 0)?;
    node.request(
        RouteNetlinkMessage::NewAddress(address(host, GATEWAY, 32, false)),
        create,
    )?;
    node.request(
        RouteNetlinkMessage::NewRoute(route(host, ip, 32, None, None, RouteScope::Host)),
        create,
    )?;
    pod.request(
        RouteNetlinkMessage::NewAddress(address(sandbox, ip, PREFIX, true)),
        create,
    )?;
    pod.request(set_up(sandbox, true), 0)?;
    pod.request(set_up(1, true), 0)?;
    for r in [
        route(sandbox, GATEWAY, 32, None, Some(ip), RouteScope::Link),
        route(
            sandbox,
            Ipv4Addr::new(10, 244, 0, 0),
            PREFIX,
            Some(GATEWAY),
            Some(ip),
            RouteScope::Universe,
        ),
        route(
            sandbox,
            Ipv4Addr::UNSPECIFIED,
            0,
            Some(GATEWAY),
            None,
            RouteScope::Universe,
        ),
    ] {
        pod.request(RouteNetlinkMessage::NewRoute(r), create)?;
    }
    Ok(())
}

/// The requests of one provisioner DEL, back to back (the veth is deleted later, untimed).
fn del(node: &mut Socket, pod: &mut Socket, w: &Wired) -> Result<()> {
    node.request(
        RouteNetlinkMessage::DelRoute(route(w.host, w.pod, 32, None, None, RouteScope::Host)),
        0,
    )?;
    node.request(
        RouteNetlinkMessage::DelAddress(address(w.host, GATEWAY, 32, false)),
        0,
    )?;
    node.request(retire(w.host), 0)?;
    pod.request(
        RouteNetlinkMessage::DelAddress(address(w.sandbox, w.pod, PREFIX, false)),
        0,
    )?;
    pod.request(set_up(w.sandbox, false), 0)?;
    pod.request(rename(w.sandbox, format!("pvf{}", w.sandbox)), 0)?;
    Ok(())
}

/// ADD then DEL requests for each of `pods`, in `node`; (ADD samples, DEL samples). Runs on a
/// thread of its own inside `node`, where the ADD's sysctl is written.
pub fn kernel(node: &Netns, pods: &[Netns]) -> Result<(Samples, Samples)> {
    std::thread::scope(|s| {
        s.spawn(|| {
            node.enter_thread()?;
            kernel_here(node, pods)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("floor thread panicked"))?
    })
}

fn kernel_here(node: &Netns, pods: &[Netns]) -> Result<(Samples, Samples)> {
    let thread_cpu = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).map(Duration::from)
    };
    let timed = |samples: &mut Samples, work: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        let (cpu, started) = (thread_cpu()?, Instant::now());
        work()?;
        let wall = started.elapsed();
        samples.wall.push(wall);
        samples.process_cpu.push(thread_cpu()?.saturating_sub(cpu));
        samples.elapsed += wall;
        Ok(())
    };
    let mut node_socket = Socket::in_netns(node)?;
    let (mut adds, mut dels) = (Samples::default(), Samples::default());
    let (mut wired, mut sockets) = (Vec::new(), Vec::new());
    for (i, pod) in pods.iter().enumerate() {
        super::check_interrupted()?;
        let file = std::fs::File::open(pod.path())?;
        let mut pod_socket = Socket::in_netns(pod)?;
        timed(&mut adds, &mut || {
            let w = add(&mut node_socket, &mut pod_socket, file.as_raw_fd(), i);
            wired.push(w.with_context(|| format!("floor ADD {i}"))?);
            Ok(())
        })?;
        sockets.push(pod_socket);
    }
    for (i, (w, pod)) in wired.iter().zip(&mut sockets).enumerate() {
        let mut work = || del(&mut node_socket, pod, w).with_context(|| format!("floor DEL {i}"));
        timed(&mut dels, &mut work)?;
    }
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::Group(FLOOR_GROUP));
    node_socket
        .request(RouteNetlinkMessage::DelLink(msg), 0)
        .context("delete the floor's veths")?;
    Ok((adds, dels))
}
