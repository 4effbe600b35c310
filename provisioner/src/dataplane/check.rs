//! Check of one sandbox: every expected resource, each missing or different one named (the
//! CHECK verb); and after a setup, only what its acknowledgements do not tell ([`host_routing`]).

use super::error::CheckFailure;
use super::link::{self, Link};
use super::netlink::Conn;
use super::plan::{ExpectedState, plan};
use super::spec::SandboxSpec;
use super::{Dataplane, address, route};

pub(crate) async fn run(dp: &Dataplane, spec: &SandboxSpec) -> Result<(), CheckFailure> {
    let plan = match plan(spec) {
        Ok(p) => p,
        Err(e) => {
            return Err(CheckFailure {
                problems: vec![e.to_string()],
            });
        }
    };
    // Both sides at once, each on its own socket.
    let (mut problems, host_problems) =
        futures::join!(check_sandbox(dp, spec, &plan), check_host(dp, spec, &plan));
    problems.extend(host_problems);
    failure_of(problems)
}

/// What the kernel's acknowledgements of a setup cannot tell: that the node routes each pod
/// address through host link `host_index` (a policy rule or a route of another table may send
/// it elsewhere). One FIB lookup per family on the host socket.
pub(crate) async fn host_routing(
    dp: &Dataplane,
    plan: &ExpectedState,
    host_index: u32,
) -> Result<(), CheckFailure> {
    let mut problems = Vec::new();
    match dp.host().await {
        Ok(host) => {
            check_host_routes(host, plan, host_index, &plan.host_ifname, &mut problems).await;
        }
        Err(e) => problems.push(format!("host netns unusable: {e}")),
    }
    failure_of(problems)
}

fn failure_of(problems: Vec<String>) -> Result<(), CheckFailure> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CheckFailure { problems })
    }
}

async fn check_sandbox(dp: &Dataplane, spec: &SandboxSpec, plan: &ExpectedState) -> Vec<String> {
    let mut problems = Vec::new();
    let sbx_label = spec.netns.display().to_string();
    let conn = match dp
        .open_sandbox_netns(&spec.netns)
        .await
        .and_then(|ns| Conn::open(&ns))
    {
        Ok(c) => c,
        Err(e) => {
            problems.push(format!("sandbox netns unusable: {e}"));
            return problems;
        }
    };
    let conn = &conn;
    // `lo` and the interface at once (plain requests); then its addresses and routes (dumps,
    // which take turns on one socket).
    let (l, lo) = futures::join!(
        expect_link(conn, &spec.ifname, spec.mtu, &mut problems),
        link::by_name(conn, "lo")
    );
    if let Some(l) = l {
        let want: Vec<_> = plan.families.iter().map(|f| f.pod).collect();
        check_addresses(conn, &l, &want, &mut problems).await;
        check_routes(conn, &l, &plan.sandbox_routes, &mut problems).await;
    }
    if let Ok(Some(lo)) = lo
        && !lo.up
    {
        problems.push(format!("link lo is down in netns {sbx_label}"));
    }
    problems
}

/// The host side: the veth, its gateway address(es) and one FIB lookup per host route; the
/// cost does not grow with the number of sandboxes on the node.
async fn check_host(dp: &Dataplane, spec: &SandboxSpec, plan: &ExpectedState) -> Vec<String> {
    let mut problems = Vec::new();
    let host = match dp.host().await {
        Err(e) => {
            problems.push(format!("host netns unusable: {e}"));
            return problems;
        }
        Ok(h) => h,
    };
    let Some(l) = expect_link(host, &plan.host_ifname, spec.mtu, &mut problems).await else {
        return problems;
    };
    let want: Vec<_> = plan.families.iter().map(|f| f.host_address).collect();
    let mut route_problems = Vec::new();
    futures::join!(
        check_addresses(host, &l, &want, &mut problems),
        check_host_routes(host, plan, l.index, &l.name, &mut route_problems)
    );
    problems.extend(route_problems);
    problems
}

/// One FIB lookup per family: the node must route the pod's address through `index`.
async fn check_host_routes(
    host: &Conn,
    plan: &ExpectedState,
    index: u32,
    name: &str,
    problems: &mut Vec<String>,
) {
    let found = futures::future::join_all(
        plan.families
            .iter()
            .map(|f| route::fib_match(host, f.host_route.dst)),
    )
    .await;
    for (f, found) in plan.families.iter().zip(found) {
        match found {
            Err(e) => {
                // How the kernel answers a lookup that ends in a blackhole or prohibit route.
                let hint = match e.errno() {
                    Some(libc::EINVAL) => " (a blackhole route answers so)",
                    Some(libc::EACCES) => " (a prohibit route answers so)",
                    _ => "",
                };
                problems.push(format!(
                    "route {} dev {name} not in effect: {e}{hint}",
                    f.host_route.dst
                ));
            }
            Ok(Some(r)) if r.matches(&f.host_route, index) => {}
            Ok(Some(r)) => problems.push(format!(
                "route {} dev {name} not in effect in netns {}: the node's lookup finds {r}",
                f.host_route.dst,
                host.netns()
            )),
            Ok(None) => problems.push(format!(
                "route {} dev {name} missing in netns {}",
                f.host_route.dst,
                host.netns()
            )),
        }
    }
}

async fn expect_link(
    conn: &Conn,
    name: &str,
    mtu: Option<u32>,
    problems: &mut Vec<String>,
) -> Option<Link> {
    let netns = conn.netns();
    match link::by_name(conn, name).await {
        Err(e) => {
            problems.push(e.to_string());
            None
        }
        Ok(None) => {
            problems.push(format!("link {name} missing in netns {netns}"));
            None
        }
        Ok(Some(l)) => {
            if !l.up {
                problems.push(format!("link {name} is down in netns {netns}"));
            }
            if let Some(want) = mtu
                && l.mtu != Some(want)
            {
                let have = l.mtu.map_or_else(|| "none".to_owned(), |m| m.to_string());
                problems.push(format!(
                    "link {name} has mtu {have}, want {want} in netns {netns}"
                ));
            }
            Some(l)
        }
    }
}

async fn check_addresses(
    conn: &Conn,
    l: &Link,
    want: &[ipnetwork::IpNetwork],
    problems: &mut Vec<String>,
) {
    match address::list(conn, l.index, &l.name).await {
        Err(e) => problems.push(e.to_string()),
        Ok(have) => {
            for w in want {
                if !have.iter().any(|a| a.net == *w) {
                    problems.push(format!(
                        "address {w} missing on {} in netns {}",
                        l.name,
                        conn.netns()
                    ));
                }
            }
        }
    }
}

async fn check_routes(conn: &Conn, l: &Link, want: &[route::Route], problems: &mut Vec<String>) {
    // Only the families a route is expected in.
    let v4 = want.iter().any(|r| r.dst.is_ipv4());
    let v6 = want.iter().any(|r| r.dst.is_ipv6());
    match route::list_main_via_families(conn, l.index, v4, v6).await {
        Err(e) => problems.push(e.to_string()),
        Ok(have) => {
            for w in want {
                if !have.iter().any(|r| r.matches(w, l.index)) {
                    let via = w.gw.map(|g| format!(" via {g}")).unwrap_or_default();
                    problems.push(format!(
                        "route {}{via} dev {} missing in netns {}",
                        w.dst,
                        l.name,
                        conn.netns()
                    ));
                }
            }
        }
    }
}
