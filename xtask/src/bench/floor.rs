//! Floors measured on the same machine, in a node namespace of their own: what no plugin can
//! go below.
//!
//! - exec: spawn + exec + wait of `/bin/true`, spawned, fed and reaped exactly like a plugin;
//! - kernel: the netlink requests of one provisioner ADD (veth pair created into the sandbox
//!   netns, the host end's IPv6 off (a sysctl), links up, addresses, routes), issued back to
//!   back on blocking sockets, one namespace's socket each, no runtime, no parsing beyond the
//!   ack: the kernel's own cost for the same work. The requests are provisioner-netlink's, the
//!   very ones the daemon sends.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_ACK, NLM_F_ECHO, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use nix::sys::socket::{self, MsgFlags, SockFlag, SockProtocol, SockType, recv, send, socket};
use provisioner_netlink::route::{Route, Scope};
use provisioner_netlink::{self as req, Req};

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

    /// Sends `req` (with `extra_flags`) and waits for its ack; the echoed link, if asked for.
    fn request(&mut self, req: Req, extra_flags: u16) -> Result<Option<LinkMessage>> {
        let Req { msg, flags, op } = req;
        self.exchange(msg, NLM_F_REQUEST | NLM_F_ACK | flags | extra_flags)
            .with_context(|| op)
    }

    fn exchange(&mut self, msg: RouteNetlinkMessage, flags: u16) -> Result<Option<LinkMessage>> {
        self.seq += 1;
        let mut out = Vec::new();
        provisioner_netlink::encode(msg, flags, self.seq, &mut out);
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

/// `dst` through the link, from the pod's address `src`, via `gw` if given (as the daemon plans
/// them).
fn route(dst: IpNetwork, gw: Option<Ipv4Addr>, src: Option<Ipv4Addr>, scope: Scope) -> Route {
    Route {
        dst,
        gw: gw.map(IpAddr::V4),
        src: src.map(IpAddr::V4),
        scope,
    }
}

fn v4(ip: Ipv4Addr, prefix: u8) -> Result<IpNetwork> {
    Ok(IpNetwork::new(IpAddr::V4(ip), prefix)?)
}

/// The requests of one provisioner ADD (IPv4, mtu 1460, default route), back to back, in the
/// daemon's order on each socket.
fn add((node, pod): (&mut Socket, &mut Socket), pod_fd: i32, i: usize) -> Result<()> {
    let n = u32::try_from(i)? + 2;
    let ip = Ipv4Addr::new(10, 244, u8::try_from(n >> 8)?, u8::try_from(n & 0xff)?);
    let (host, sandbox) = veth(node, pod_fd, i)?;
    let host_name = format!("pfl{i}");
    node.request(req::link::set_up(host, &host_name), 0)?;
    let gateway = v4(GATEWAY, 32)?;
    node.request(req::address::add(host, &host_name, gateway, false), 0)?;
    let host_route = route(v4(ip, 32)?, None, None, Scope::Host);
    node.request(req::route::add(host, &host_name, &host_route), 0)?;
    pod.request(req::address::add(sandbox, "eth0", v4(ip, PREFIX)?, true), 0)?;
    pod.request(req::link::set_up(sandbox, "eth0"), 0)?;
    pod.request(req::link::set_up(1, "lo"), 0)?;
    let routes = [
        route(gateway, None, Some(ip), Scope::Link),
        route(
            v4(Ipv4Addr::new(10, 244, 0, 0), PREFIX)?,
            Some(GATEWAY),
            Some(ip),
            Scope::Universe,
        ),
        route(
            v4(Ipv4Addr::UNSPECIFIED, 0)?,
            Some(GATEWAY),
            None,
            Scope::Universe,
        ),
    ];
    for r in &routes {
        pod.request(req::route::add(sandbox, "eth0", r), 0)?;
    }
    Ok(())
}

/// The veth pair `pfl<i>` / `eth0` (in the pod, one queue each, a fixed MAC), with the host
/// end's IPv6 off: their indexes.
fn veth(node: &mut Socket, pod_fd: i32, i: usize) -> Result<(u32, u32)> {
    let name = format!("pfl{i}");
    let [hi, lo] = u16::try_from(i)?.to_be_bytes();
    let mac = [0x02, 0, 0, 0, hi, lo];
    let create = req::link::veth(&name, "eth0", pod_fd, Some(MTU), Some(mac));
    let echoed = node
        .request(create, NLM_F_ECHO)?
        .context("the kernel did not echo the new veth (needs Linux >= 6.3)")?;
    let peer = echoed.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(peer) => Some(*peer),
        _ => None,
    });
    let sandbox = peer.context("echoed veth without its peer's index")?;
    // The calling thread is in the node's namespace. A node without IPv6 has no such key, and
    // the daemon skips it there too.
    match std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1") {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("turn IPv6 off on {name}"))
        }
        _ => Ok((echoed.header.index, sandbox)),
    }
}
