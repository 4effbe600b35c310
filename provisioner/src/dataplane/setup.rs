//! Setup of one sandbox, with rollback in reverse order on any failure.

use std::sync::atomic::Ordering;

use ipnetwork::IpNetwork;

use provisioner_netlink::{self as req, Req};

use super::error::{CheckFailure, DataplaneError, SetupStep};
use super::link::{self, Link};
use super::naming::{graveyard_ifname, host_ifname};
use super::netlink::Conn;
use super::netns::NetnsFile;
use super::plan::{ExpectedState, check_link, plan};
use super::route::Route;
use super::spec::{LinkSpec, SandboxSpec, SetupOutcome};
use super::sysctl::{Sysctl, iface_key};
use super::{Dataplane, address, check, route};

/// Something setup created, to be undone on failure.
#[derive(Debug)]
enum Undo {
    HostLink {
        index: u32,
        name: String,
    },
    HostAddr {
        index: u32,
        name: String,
        net: IpNetwork,
    },
    SandboxAddr {
        index: u32,
        name: String,
        net: IpNetwork,
    },
    HostRoute {
        index: u32,
        name: String,
        route: Route,
    },
    SandboxRoute {
        index: u32,
        name: String,
        route: Route,
    },
}

struct Run {
    dp: Dataplane,
    link: LinkSpec,
    host_ifname: String,
    fail_after: Option<SetupStep>,
    undo: Vec<Undo>,
    sandbox: Option<(NetnsFile, Conn)>,
}

/// The veth pair, made, and the connections to both of its namespaces.
struct Veth {
    host: Conn,
    sandbox: Conn,
    host_link: Link,
    sandbox_link: Link,
}

/// A setup whose veth pair is made and whose addresses are not given yet: ADD starts it while
/// it reserves the addresses ([`Dataplane::start_setup`]), then [`Self::finish`]es it with them
/// or, when none could be reserved, [`Self::abandon`]s it.
pub struct StartedSetup {
    run: Run,
    veth: Veth,
}

type StepResult<T> = Result<T, (SetupStep, DataplaneError)>;

/// `LOOPBACK_IFINDEX`: `lo` has index 1 in every netns.
const LOOPBACK_IFINDEX: u32 = 1;

/// One request of a pipelined batch, with its step and what undoes it.
struct BatchedRequest {
    step: SetupStep,
    req: Req,
    undo: Option<Undo>,
}

impl BatchedRequest {
    fn new(step: SetupStep, req: Req, undo: Option<Undo>) -> Self {
        Self { step, req, undo }
    }
}

/// The step that an armed `setup.<step>.fail` failpoint makes fail, if any.
fn injected_failure() -> Option<SetupStep> {
    if !crate::failpoint::any_armed("setup.") {
        return None;
    }
    SetupStep::ALL
        .into_iter()
        .find(|step| crate::failpoint::fails(&format!("setup.{step}.fail")))
}

fn step_pos(step: SetupStep) -> usize {
    SetupStep::ALL
        .iter()
        .position(|s| *s == step)
        .unwrap_or(usize::MAX)
}

/// The requests that give the pair `plan`'s addresses and routes, in two pipelined batches, one
/// per socket, run at once: each batch is sent in one go and the kernel applies it in order
/// (the host end: up, address, route; the sandbox end: address, links up, routes).
fn wiring_ops(
    plan: &ExpectedState,
    veth: &Veth,
    ifname: &str,
    host_ifname: &str,
) -> (Vec<BatchedRequest>, Vec<BatchedRequest>) {
    use SetupStep as S;
    let (host_link, sbx_link) = (&veth.host_link, &veth.sandbox_link);
    let mut host_ops: Vec<BatchedRequest> = Vec::new();
    let mut sbx_ops: Vec<BatchedRequest> = Vec::new();
    // The host end comes up before it gets its address: an address added to a down link
    // has its local route made again when the link comes up, and every host veth carries
    // the same gateway address, so each time is a walk of the node's aliases of it, one
    // per sandbox.
    host_ops.push(BatchedRequest::new(
        S::LinkUp,
        req::link::set_up(host_link.index, host_ifname),
        None,
    ));
    for fam in &plan.families {
        host_ops.push(BatchedRequest::new(
            S::HostAddress,
            req::address::add(host_link.index, host_ifname, fam.host_address, false),
            Some(Undo::HostAddr {
                index: host_link.index,
                name: host_ifname.to_owned(),
                net: fam.host_address,
            }),
        ));
        sbx_ops.push(BatchedRequest::new(
            S::SandboxAddress,
            req::address::add(sbx_link.index, ifname, fam.pod, true),
            Some(Undo::SandboxAddr {
                index: sbx_link.index,
                name: ifname.to_owned(),
                net: fam.pod,
            }),
        ));
    }
    sbx_ops.push(BatchedRequest::new(
        S::LinkUp,
        req::link::set_up(sbx_link.index, ifname),
        None,
    ));
    // `lo` is ifindex 1 in every netns; setting it up when it is up changes nothing.
    sbx_ops.push(BatchedRequest::new(
        S::LinkUp,
        req::link::set_up(LOOPBACK_IFINDEX, "lo"),
        None,
    ));
    for fam in &plan.families {
        host_ops.push(BatchedRequest::new(
            S::HostRoute,
            req::route::add(host_link.index, host_ifname, &fam.host_route),
            Some(Undo::HostRoute {
                index: host_link.index,
                name: host_ifname.to_owned(),
                route: fam.host_route.clone(),
            }),
        ));
    }
    for r in &plan.sandbox_routes {
        sbx_ops.push(BatchedRequest::new(
            S::SandboxRoutes,
            req::route::add(sbx_link.index, ifname, r),
            Some(Undo::SandboxRoute {
                index: sbx_link.index,
                name: ifname.to_owned(),
                route: r.clone(),
            }),
        ));
    }
    (host_ops, sbx_ops)
}

/// Sends `ops` as one batch; for each, the undo to record (when it succeeded) or its error.
async fn run_ops(
    conn: &Conn,
    ops: Vec<BatchedRequest>,
) -> Vec<(Option<Undo>, Option<(SetupStep, DataplaneError)>)> {
    let mut meta = Vec::with_capacity(ops.len());
    let mut reqs = Vec::with_capacity(ops.len());
    for op in ops {
        meta.push((op.step, op.undo));
        reqs.push(op.req);
    }
    let results = conn.batch(reqs).await;
    meta.into_iter()
        .zip(results)
        .map(|((step, undo), res)| match res {
            Ok(()) => (undo, None),
            Err(e) => (None, Some((step, e))),
        })
        .collect()
}

fn at<T>(step: SetupStep, r: Result<T, DataplaneError>) -> StepResult<T> {
    r.map_err(|e| (step, e))
}

pub(crate) async fn run(
    dp: &Dataplane,
    spec: &SandboxSpec,
) -> Result<SetupOutcome, DataplaneError> {
    execute(dp, spec, false).await.map(|(out, _)| out)
}

/// Setup, then what its acknowledgements cannot tell: that the node routes each pod address
/// through the new host veth ([`check::host_routing`]). Every request of the setup was
/// acknowledged by the kernel one by one, so nothing it created is read back. A failed check
/// rolls nothing back: the caller decides.
pub(crate) async fn run_and_check(
    dp: &Dataplane,
    spec: &SandboxSpec,
) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
    execute(dp, spec, true).await
}

async fn execute(
    dp: &Dataplane,
    spec: &SandboxSpec,
    verify: bool,
) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
    let plan = plan(spec)?;
    let mut run = Run::new(dp, LinkSpec::of(spec));
    let done = match run.veth_steps().await {
        Ok(veth) => run.address_steps(&plan, &veth).await,
        Err(failed) => Err(failed),
    };
    run.conclude(done, &plan, verify).await
}

/// The first steps of the setup of `link`: its namespace opened, its veth pair made. On
/// failure what was made is rolled back.
pub(crate) async fn start(dp: &Dataplane, link: LinkSpec) -> Result<StartedSetup, DataplaneError> {
    check_link(&link.container_id, &link.ifname, link.mtu)?;
    let mut run = Run::new(dp, link);
    match run.veth_steps().await {
        Ok(veth) => Ok(StartedSetup { run, veth }),
        Err((step, source)) => Err(run.failed(step, source).await),
    }
}

impl StartedSetup {
    /// The cookie of the sandbox's namespace (when the kernel gives it without entering it).
    pub fn sandbox_netns_cookie(&self) -> Option<u64> {
        self.run
            .sandbox
            .as_ref()
            .and_then(|(ns, _)| ns.cookie_without_entering())
    }

    /// The rest of the setup of `spec` (the sandbox's addresses, links up, routes) and the
    /// check of `run_and_check`. `spec` must be of the started sandbox; on failure
    /// everything, the veth pair included, is rolled back.
    pub async fn finish(
        mut self,
        spec: &SandboxSpec,
    ) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
        let plan = if LinkSpec::of(spec) == self.run.link {
            plan(spec)
        } else {
            Err(DataplaneError::InvalidSpec(format!(
                "setup of container {} finished with the spec of container {} ifname {}",
                self.run.link.container_id, spec.container_id, spec.ifname
            )))
        };
        let plan = match plan {
            Ok(plan) => plan,
            Err(invalid) => {
                for e in self.run.rollback().await {
                    tracing::warn!(container_id = %self.run.link.container_id, error = %e,
                        "rollback of a started setup whose spec was refused");
                }
                return Err(invalid);
            }
        };
        let done = self.run.address_steps(&plan, &self.veth).await;
        self.run.conclude(done, &plan, true).await
    }

    /// Undoes the started setup (deletes its veth pair); the errors met, if any.
    pub async fn abandon(mut self) -> Vec<DataplaneError> {
        self.run.rollback().await
    }
}

impl Run {
    fn new(dp: &Dataplane, link: LinkSpec) -> Self {
        Self {
            dp: dp.clone(),
            host_ifname: host_ifname(&link.container_id, &link.ifname),
            link,
            fail_after: injected_failure(),
            undo: Vec::new(),
            sandbox: None,
        }
    }

    /// The outcome of a setup that got this far: checked (when `verify`), or rolled back.
    async fn conclude(
        &mut self,
        done: StepResult<SetupOutcome>,
        plan: &ExpectedState,
        verify: bool,
    ) -> Result<(SetupOutcome, Result<(), CheckFailure>), DataplaneError> {
        match done {
            Ok(out) => {
                let verified = if verify {
                    check::host_routing(&self.dp, plan, out.host_ifindex).await
                } else {
                    Ok(())
                };
                Ok((out, verified))
            }
            Err((step, source)) => Err(self.failed(step, source).await),
        }
    }

    /// Rolls back and names the step that failed.
    async fn failed(&mut self, step: SetupStep, source: DataplaneError) -> DataplaneError {
        let rollback_errors = self.rollback().await;
        DataplaneError::Setup {
            container_id: self.link.container_id.clone(),
            step,
            source: Box::new(source),
            rollback_errors,
        }
    }

    fn done(&self, step: SetupStep) -> StepResult<()> {
        if crate::failpoint::any_armed("setup.") {
            crate::failpoint::hit(&format!("setup.{step}"));
        }
        if self.fail_after == Some(step) {
            return Err((step, DataplaneError::Injected(step)));
        }
        Ok(())
    }

    fn sandbox_conn(&self, step: SetupStep) -> StepResult<&Conn> {
        self.sandbox.as_ref().map(|(_, c)| c).ok_or_else(|| {
            (
                step,
                DataplaneError::InvalidSpec("sandbox netns not open".to_owned()),
            )
        })
    }

    /// The steps that need no address: the sandbox's namespace, the veth pair.
    async fn veth_steps(&mut self) -> StepResult<Veth> {
        use SetupStep as S;
        // Sandbox netns and its socket (made on this thread, see `NetnsFile::run_here`); the
        // host socket is shared and made once.
        let ns = at(
            S::SandboxNetns,
            self.dp.open_sandbox_netns(&self.link.netns).await,
        )?;
        let conn = at(S::SandboxNetns, Conn::open(&ns))?;
        let host = at(S::SandboxNetns, self.dp.host().await)?.clone();
        self.sandbox = Some((ns, conn.clone()));
        self.done(S::SandboxNetns)?;

        // Neither name may exist: the kernel checks both atomically when it creates the pair
        // (`NLM_F_EXCL`, EEXIST, nothing created), reported as a check-names failure.
        self.done(S::CheckNames)?;

        // The veth pair, sandbox end created in the sandbox netns under its final name.
        let (host_link, sandbox_link) = self.create_veth(&host, &conn).await?;
        self.done(S::CreateVeth)?;
        Ok(Veth {
            host,
            sandbox: conn,
            host_link,
            sandbox_link,
        })
    }

    /// The steps that give the pair the sandbox's addresses and routes.
    async fn address_steps(
        &mut self,
        plan: &ExpectedState,
        veth: &Veth,
    ) -> StepResult<SetupOutcome> {
        use SetupStep as S;
        let ifname = self.link.ifname.clone();
        let host_ifname = self.host_ifname.clone();
        let (host, conn) = (&veth.host, &veth.sandbox);
        let (host_link, sbx_link) = (&veth.host_link, &veth.sandbox_link);

        // Sysctls, written inside the right netns (the node's from this thread, a sandbox's
        // from a pooled worker); only what is not known set.
        self.sysctls(plan, &host_ifname).await?;
        self.done(S::Sysctl)?;

        let (mut host_ops, mut sbx_ops) = wiring_ops(plan, veth, &ifname, &host_ifname);
        // Fault injection: stop right after the requested step.
        if let Some(stop) = self.fail_after {
            let pos = step_pos(stop);
            host_ops.retain(|o| step_pos(o.step) <= pos);
            sbx_ops.retain(|o| step_pos(o.step) <= pos);
        }
        let (host_res, sbx_res) = futures::join!(run_ops(host, host_ops), run_ops(conn, sbx_ops));
        let mut first_err: Option<(SetupStep, DataplaneError)> = None;
        for (undo, err) in host_res.into_iter().chain(sbx_res) {
            if let Some(u) = undo {
                self.undo.push(u);
            }
            if let Some((step, e)) = err
                && first_err
                    .as_ref()
                    .is_none_or(|(s, _)| step_pos(step) < step_pos(*s))
            {
                first_err = Some((step, e));
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for step in [
            S::HostAddress,
            S::SandboxAddress,
            S::LinkUp,
            S::HostRoute,
            S::SandboxRoutes,
        ] {
            self.done(step)?;
        }

        Ok(SetupOutcome {
            host_ifname,
            host_ifindex: host_link.index,
            host_mac: host_link.mac.clone(),
            sandbox_ifname: ifname,
            sandbox_mac: sbx_link.mac.clone(),
            sandbox_ifindex: sbx_link.index,
        })
    }

    async fn create_veth(&mut self, host: &Conn, conn: &Conn) -> StepResult<(Link, Link)> {
        use SetupStep as S;
        let ifname = &self.link.ifname;
        let host_ifname = &self.host_ifname;
        let fd = self
            .sandbox
            .as_ref()
            .map(|(ns, _)| ns.raw_fd())
            .ok_or_else(|| {
                (
                    S::CreateVeth,
                    DataplaneError::InvalidSpec("no netns".into()),
                )
            })?;
        // The sandbox end's MAC is chosen here, so that with the kernel's echo of the host end
        // (which names the peer's index) nothing needs looking up after the creation.
        let sbx_mac = link::random_mac();
        let mtu = self.link.mtu;
        let create = || link::create_veth(host, host_ifname, ifname, fd, mtu, sbx_mac);
        let echoed = match create().await {
            Ok(echoed) => echoed,
            Err(e) if e.errno() == Some(libc::EEXIST) => {
                // One of the names exists (nothing was created). The host name may be held by
                // this sandbox's retired veth (a DEL moments ago): moved out of the way, or
                // deleted by the reaper meanwhile, the name is ours again, and one more try
                // tells. A host link of that name in service, or a clash that stays, is named
                // in the error.
                match link::by_name(host, host_ifname).await {
                    Ok(Some(old)) if old.retired => rename_retired(host, &old)
                        .await
                        .map_err(|e| (S::CheckNames, e))?,
                    Ok(Some(_)) => return Err((S::CheckNames, exists(host_ifname, host.netns()))),
                    Ok(None) | Err(_) => {}
                }
                match create().await {
                    Ok(echoed) => echoed,
                    Err(e) if e.errno() == Some(libc::EEXIST) => {
                        let host_exists =
                            matches!(link::by_name(host, host_ifname).await, Ok(Some(_)));
                        return Err((
                            S::CheckNames,
                            if host_exists {
                                exists(host_ifname, host.netns())
                            } else {
                                exists(ifname, conn.netns())
                            },
                        ));
                    }
                    Err(e) => return Err((S::CreateVeth, e)),
                }
            }
            Err(e) => return Err((S::CreateVeth, e)),
        };
        if let (Some(host_link), Some(mac)) = (echoed, sbx_mac)
            && let Some(peer) = host_link.peer_index
        {
            self.undo.push(Undo::HostLink {
                index: host_link.index,
                name: host_ifname.clone(),
            });
            let sbx_link = Link {
                index: peer,
                name: ifname.clone(),
                mac: link::format_mac(&mac),
                mtu: self.link.mtu,
                up: false,
                peer_index: Some(host_link.index),
                // Not needed by setup (only index and MAC are), so not looked up.
                peer_netnsid: None,
                retired: false,
            };
            return Ok((host_link, sbx_link));
        }
        let (host_link, sbx_link) = futures::join!(
            link::by_name(host, host_ifname),
            link::by_name(conn, ifname)
        );
        let host_link = match at(S::CreateVeth, host_link)? {
            Some(l) => l,
            None => return Err((S::CreateVeth, missing_after_create(host_ifname, host))),
        };
        self.undo.push(Undo::HostLink {
            index: host_link.index,
            name: host_ifname.clone(),
        });
        let sbx_link = match at(S::CreateVeth, sbx_link)? {
            Some(l) => l,
            None => return Err((S::CreateVeth, missing_after_create(ifname, conn))),
        };
        Ok((host_link, sbx_link))
    }

    async fn sysctls(&self, plan: &ExpectedState, host_ifname: &str) -> StepResult<()> {
        let mut host_list = Vec::new();
        let mut sbx_list = Vec::new();
        let v4 = plan.families.iter().any(|f| f.pod.is_ipv4());
        let need_v4 = v4 && !self.dp.forwarding_flag(false).load(Ordering::Acquire);
        let need_v6 = plan.uses_v6 && !self.dp.forwarding_flag(true).load(Ordering::Acquire);
        if need_v4 {
            host_list.push(Sysctl::new("net.ipv4.ip_forward", "1"));
        }
        if !plan.uses_v6 {
            self.host_ipv6_off(host_ifname);
        } else {
            if need_v6 {
                host_list.push(Sysctl::new("net.ipv6.conf.all.forwarding", "1"));
            }
            host_list.push(Sysctl::new(iface_key(host_ifname, "accept_ra"), "0"));
            // No DAD on either end: nothing (not even the link-local address) stays tentative.
            host_list.push(Sysctl::new(iface_key(host_ifname, "accept_dad"), "0"));
            sbx_list.push(Sysctl::new(iface_key(&self.link.ifname, "accept_dad"), "0"));
        }
        let sbx_ns = self.sandbox.as_ref().map(|(ns, _)| ns).ok_or_else(|| {
            (
                SetupStep::Sysctl,
                DataplaneError::InvalidSpec("no netns".into()),
            )
        })?;
        at(SetupStep::Sysctl, self.dp.apply_host_sysctls(&host_list))?;
        at(
            SetupStep::Sysctl,
            self.dp.apply_sandbox_sysctls(sbx_ns, sbx_list).await,
        )?;
        // Forwarding stays on: later setups skip it (the daemon owns the node's forwarding).
        if need_v4 {
            self.dp
                .forwarding_flag(false)
                .store(true, Ordering::Release);
        }
        if need_v6 {
            self.dp.forwarding_flag(true).store(true, Ordering::Release);
        }
        Ok(())
    }

    /// An IPv4-only pod's host veth takes no part in IPv6. Off before the link comes up, the
    /// node gives it no link-local address nor multicast route (one per host veth otherwise:
    /// the node's IPv6 packets and link changes walk them all), and drops the pod's own IPv6
    /// traffic (DAD, router solicitations, MLD) as it arrives instead of routing each packet
    /// among those routes. What it saves is the node's work, not the pod's network: a node
    /// that refuses the write (a read-only /proc/sys) is told once, and the ADD goes on.
    fn host_ipv6_off(&self, host_ifname: &str) {
        let off = [Sysctl::per_link(
            iface_key(host_ifname, "disable_ipv6"),
            "1",
        )];
        if let Err(e) = self.dp.apply_host_sysctls(&off)
            && !self
                .dp
                .inner
                .host_ipv6_off_failed
                .swap(true, Ordering::Relaxed)
        {
            tracing::warn!(error = %e, "cannot turn IPv6 off on host veths of IPv4 pods: they keep it, and the node goes on processing their pods' IPv6 traffic (told once)");
        }
    }

    /// Undoes everything in reverse; returns the errors met (and goes on after each).
    async fn rollback(&mut self) -> Vec<DataplaneError> {
        let mut errors = Vec::new();
        let host = match self.dp.host().await {
            Ok(h) => Some(h.clone()),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        let sbx = self.sandbox_conn(SetupStep::SandboxNetns).ok().cloned();
        while let Some(u) = self.undo.pop() {
            let res = match (&u, &host, &sbx) {
                (Undo::HostLink { index, name }, Some(h), _) => link::delete(h, *index, name).await,
                (Undo::HostAddr { index, name, net }, Some(h), _) => {
                    address::del(h, *index, name, *net).await
                }
                (
                    Undo::HostRoute {
                        index,
                        name,
                        route: r,
                    },
                    Some(h),
                    _,
                ) => route::del(h, *index, name, r).await,
                (Undo::SandboxAddr { index, name, net }, _, Some(s)) => {
                    address::del(s, *index, name, *net).await
                }
                (
                    Undo::SandboxRoute {
                        index,
                        name,
                        route: r,
                    },
                    _,
                    Some(s),
                ) => route::del(s, *index, name, r).await,
                _ => Ok(()),
            };
            if let Err(e) = res {
                tracing::warn!(error = %e, "setup rollback step failed");
                errors.push(e);
            }
        }
        errors
    }
}

fn exists(ifname: &str, netns: &str) -> DataplaneError {
    DataplaneError::InterfaceExists {
        ifname: ifname.to_owned(),
        netns: netns.to_owned(),
    }
}

fn missing_after_create(name: &str, conn: &Conn) -> DataplaneError {
    DataplaneError::Protocol {
        op: format!("look up link {name} after creating it"),
        netns: conn.netns().to_owned(),
        detail: "link not found".to_owned(),
    }
}

/// Renames the retired host link `old` to its graveyard name, freeing its name; a link the
/// reaper deleted meanwhile is fine.
async fn rename_retired(host: &Conn, old: &Link) -> Result<(), DataplaneError> {
    let Req { msg, flags, op } =
        req::link::rename(old.index, &old.name, &graveyard_ifname(old.index));
    match host.ack(msg, flags, &op).await {
        Err(e) if e.errno() != Some(libc::ENODEV) => Err(e),
        _ => Ok(()),
    }
}
