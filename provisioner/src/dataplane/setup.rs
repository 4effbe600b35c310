//! Setup of one sandbox, with rollback in reverse order on any failure.

use ipnetwork::IpNetwork;

use super::error::{DataplaneError, SetupStep};
use super::link::{self, Link};
use super::netlink::Conn;
use super::netns::NetnsFile;
use super::plan::{Plan, plan};
use super::route::Route;
use super::spec::{SandboxSpec, SetupOutcome};
use super::sysctl::{self, Sysctl, iface_key};
use super::{Dataplane, address, route};

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

struct Run<'a> {
    dp: &'a Dataplane,
    spec: &'a SandboxSpec,
    plan: Plan,
    fail_after: Option<SetupStep>,
    undo: Vec<Undo>,
    sandbox: Option<(NetnsFile, Conn)>,
}

type StepResult<T> = Result<T, (SetupStep, DataplaneError)>;

fn at<T>(step: SetupStep, r: Result<T, DataplaneError>) -> StepResult<T> {
    r.map_err(|e| (step, e))
}

pub(crate) async fn run(
    dp: &Dataplane,
    spec: &SandboxSpec,
    fail_after: Option<SetupStep>,
) -> Result<SetupOutcome, DataplaneError> {
    let plan = plan(spec)?;
    let mut run = Run {
        dp,
        spec,
        plan,
        fail_after,
        undo: Vec::new(),
        sandbox: None,
    };
    match run.steps().await {
        Ok(out) => Ok(out),
        Err((step, source)) => {
            let rollback_errors = run.rollback().await;
            Err(DataplaneError::Setup {
                container_id: spec.container_id.clone(),
                step,
                source: Box::new(source),
                rollback_errors,
            })
        }
    }
}

impl Run<'_> {
    fn done(&self, step: SetupStep) -> StepResult<()> {
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

    async fn steps(&mut self) -> StepResult<SetupOutcome> {
        use SetupStep as S;
        let ifname = self.spec.ifname.clone();
        let host_ifname = self.plan.host_ifname.clone();

        // Sandbox netns and its socket.
        let ns = at(S::SandboxNetns, NetnsFile::open(&self.spec.netns))?;
        let conn = at(S::SandboxNetns, Conn::open(&ns).await)?;
        self.sandbox = Some((ns, conn.clone()));
        let host = at(S::SandboxNetns, self.dp.host().await)?.clone();
        self.done(S::SandboxNetns)?;

        // Neither name may exist; nothing is created yet.
        if at(S::CheckNames, link::by_name(&conn, &ifname).await)?.is_some() {
            return Err((S::CheckNames, exists(&ifname, conn.netns())));
        }
        if at(S::CheckNames, link::by_name(&host, &host_ifname).await)?.is_some() {
            return Err((S::CheckNames, exists(&host_ifname, host.netns())));
        }
        self.done(S::CheckNames)?;

        // The veth pair, sandbox end created in the sandbox netns under its final name.
        let (host_link, sbx_link) = self.create_veth(&host, &conn).await?;
        self.done(S::CreateVeth)?;

        // Sysctls, from threads inside the right netns.
        self.sysctls(&host_ifname).await?;
        self.done(S::Sysctl)?;

        for fam in self.plan.families.clone() {
            at(
                S::HostAddress,
                address::add(
                    &host,
                    host_link.index,
                    &host_ifname,
                    fam.host_address,
                    false,
                )
                .await,
            )?;
            self.undo.push(Undo::HostAddr {
                index: host_link.index,
                name: host_ifname.clone(),
                net: fam.host_address,
            });
        }
        self.done(S::HostAddress)?;

        for fam in self.plan.families.clone() {
            at(
                S::SandboxAddress,
                address::add(&conn, sbx_link.index, &ifname, fam.pod, true).await,
            )?;
            self.undo.push(Undo::SandboxAddr {
                index: sbx_link.index,
                name: ifname.clone(),
                net: fam.pod,
            });
        }
        self.done(S::SandboxAddress)?;

        at(
            S::LinkUp,
            link::set_up(&host, host_link.index, &host_ifname).await,
        )?;
        at(
            S::LinkUp,
            link::set_up(&conn, sbx_link.index, &ifname).await,
        )?;
        match at(S::LinkUp, link::by_name(&conn, "lo").await)? {
            Some(lo) if !lo.up => at(S::LinkUp, link::set_up(&conn, lo.index, "lo").await)?,
            _ => {}
        }
        self.done(S::LinkUp)?;

        for fam in self.plan.families.clone() {
            at(
                S::HostRoute,
                route::add(&host, host_link.index, &host_ifname, &fam.host_route).await,
            )?;
            self.undo.push(Undo::HostRoute {
                index: host_link.index,
                name: host_ifname.clone(),
                route: fam.host_route,
            });
        }
        self.done(S::HostRoute)?;

        for r in self.plan.sandbox_routes.clone() {
            at(
                S::SandboxRoutes,
                route::add(&conn, sbx_link.index, &ifname, &r).await,
            )?;
            self.undo.push(Undo::SandboxRoute {
                index: sbx_link.index,
                name: ifname.clone(),
                route: r,
            });
        }
        self.done(S::SandboxRoutes)?;

        Ok(SetupOutcome {
            host_ifname,
            host_mac: host_link.mac,
            sandbox_ifname: ifname,
            sandbox_mac: sbx_link.mac,
            sandbox_ifindex: sbx_link.index,
        })
    }

    async fn create_veth(&mut self, host: &Conn, conn: &Conn) -> StepResult<(Link, Link)> {
        use SetupStep as S;
        let ifname = &self.spec.ifname;
        let host_ifname = &self.plan.host_ifname;
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
        if let Err(e) = link::create_veth(host, host_ifname, ifname, fd, self.spec.mtu).await {
            if e.errno() == Some(libc::EEXIST) {
                // Someone created one of the names meanwhile: same error as the pre-check.
                let host_exists = matches!(link::by_name(host, host_ifname).await, Ok(Some(_)));
                return Err((
                    S::CreateVeth,
                    if host_exists {
                        exists(host_ifname, host.netns())
                    } else {
                        exists(ifname, conn.netns())
                    },
                ));
            }
            return Err((S::CreateVeth, e));
        }
        let host_link = match at(S::CreateVeth, link::by_name(host, host_ifname).await)? {
            Some(l) => l,
            None => return Err((S::CreateVeth, missing_after_create(host_ifname, host))),
        };
        self.undo.push(Undo::HostLink {
            index: host_link.index,
            name: host_ifname.clone(),
        });
        let sbx_link = match at(S::CreateVeth, link::by_name(conn, ifname).await)? {
            Some(l) => l,
            None => return Err((S::CreateVeth, missing_after_create(ifname, conn))),
        };
        Ok((host_link, sbx_link))
    }

    async fn sysctls(&self, host_ifname: &str) -> StepResult<()> {
        let mut host_list = Vec::new();
        let mut sbx_list = Vec::new();
        if self.plan.families.iter().any(|f| f.pod.is_ipv4()) {
            host_list.push(Sysctl::new("net.ipv4.ip_forward", "1"));
        }
        if self.plan.uses_v6 {
            host_list.push(Sysctl::new("net.ipv6.conf.all.forwarding", "1"));
            host_list.push(Sysctl::new(iface_key(host_ifname, "accept_ra"), "0"));
            // No DAD on either end: nothing (not even the link-local address) stays tentative.
            host_list.push(Sysctl::new(iface_key(host_ifname, "accept_dad"), "0"));
            sbx_list.push(Sysctl::new(iface_key(&self.spec.ifname, "accept_dad"), "0"));
        }
        let sbx_ns = self.sandbox.as_ref().map(|(ns, _)| ns).ok_or_else(|| {
            (
                SetupStep::Sysctl,
                DataplaneError::InvalidSpec("no netns".into()),
            )
        })?;
        let (h, s) = futures::join!(
            sysctl::apply_in(self.dp.host_ns(), host_list),
            sysctl::apply_in(sbx_ns, sbx_list)
        );
        at(SetupStep::Sysctl, h.and(s))
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
