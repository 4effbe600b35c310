//! Check of one sandbox: every expected resource, each missing or different one named.

use super::error::CheckFailure;
use super::link::{self, Link};
use super::netlink::Conn;
use super::plan::{ExpectedState, plan};
use super::spec::SandboxSpec;
use super::{Dataplane, address, route};

pub(crate) async fn run(dp: &Dataplane, spec: &SandboxSpec) -> Result<(), CheckFailure> {
    run_with(dp, spec, None).await
}

/// Like [`run`], reusing `sandbox` (a connection in `spec.netns`) when the caller has one.
pub(crate) async fn run_with(
    dp: &Dataplane,
    spec: &SandboxSpec,
    sandbox: Option<&Conn>,
) -> Result<(), CheckFailure> {
    let plan = match plan(spec) {
        Ok(p) => p,
        Err(e) => {
            return Err(CheckFailure {
                problems: vec![e.to_string()],
            });
        }
    };
    // Both sides at once, each on its own socket.
    let (mut problems, host_problems) = futures::join!(
        check_sandbox(dp, spec, &plan, sandbox),
        check_host(dp, spec, &plan)
    );
    problems.extend(host_problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CheckFailure { problems })
    }
}

async fn check_sandbox(
    dp: &Dataplane,
    spec: &SandboxSpec,
    plan: &ExpectedState,
    sandbox: Option<&Conn>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let sbx_label = spec.netns.display().to_string();
    let opened;
    let conn = match sandbox {
        Some(c) => c,
        None => {
            let sbx = match dp.open_sandbox_netns(&spec.netns) {
                Ok(ns) => Conn::open(&ns),
                Err(e) => Err(e),
            };
            match sbx {
                Err(e) => {
                    problems.push(format!("sandbox netns unusable: {e}"));
                    return problems;
                }
                Ok(c) => {
                    opened = c;
                    &opened
                }
            }
        }
    };
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
    let lookups = futures::future::join_all(
        plan.families
            .iter()
            .map(|f| route::fib_match(host, f.host_route.dst)),
    );
    let (_, found) = futures::join!(check_addresses(host, &l, &want, &mut problems), lookups);
    for (f, found) in plan.families.iter().zip(found) {
        match found {
            Err(e) => problems.push(e.to_string()),
            Ok(r)
                if r.as_ref()
                    .is_some_and(|r| r.matches(&f.host_route, l.index)) => {}
            Ok(_) => problems.push(format!(
                "route {} dev {} missing in netns {}",
                f.host_route.dst,
                l.name,
                host.netns()
            )),
        }
    }
    problems
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
