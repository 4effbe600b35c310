//! Dataplane integration tests (root): every test builds its own "node" netns (host side) and
//! sandbox netns; nothing touches the root namespace.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use provisioner::dataplane::{
    Dataplane, DataplaneError, GRAVEYARD_GROUP, GRAVEYARD_IFNAME_PREFIX, HOST_IFNAME_PREFIX,
    LinkSpec, PodAddress, RouteSpec, SandboxSpec, SetupStep, graveyard_ifname, host_ifname,
};
use provisioner_tests::dataplane_fixture::{
    assert_node_clean, assert_sandbox_clean, ip, links, net, node, spec, veths,
};
use provisioner_tests::{Netns, wait_until};

/// Waits for the background reaper (bounded) and checks it deleted everything queued.
async fn settle(dp: &Dataplane) -> Result<()> {
    let left = tokio::time::timeout(std::time::Duration::from_secs(10), dp.flush_deletions())
        .await
        .context("flush_deletions did not finish within 10 s")?;
    ensure!(left == 0, "{left} retired link(s) not deleted");
    Ok(())
}

/// Nothing routes `pod_ip` through a veth of ours in the node (`ip route get`).
fn assert_not_routed(node: &Netns, pod_ip: &str) -> Result<()> {
    let got = node
        .ip(&["route", "get", pod_ip])
        .unwrap_or_else(|e| format!("unreachable ({e})"));
    ensure!(
        !got.contains(HOST_IFNAME_PREFIX) && !got.contains(GRAVEYARD_IFNAME_PREFIX),
        "{pod_ip} still routed through our veth: {got}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sandbox_setup_check_ping_teardown() -> Result<()> {
    let (node, dp) = node()?;
    let sandbox = Netns::new("pod")?;
    let s = spec("one", &sandbox, &[("10.244.1.2/24", "10.244.1.1")]);
    let out = dp.setup(&s).await?;
    assert_eq!(out.host_ifname, host_ifname("one", "eth0"));
    assert_eq!(out.sandbox_ifname, "eth0");
    assert_eq!(out.sandbox_mac.len(), 17);
    dp.check(&s).await?;

    let addr = sandbox.ip(&["-4", "addr", "show", "eth0"])?;
    ensure!(
        addr.contains("10.244.1.2/24") && addr.contains("mtu 1460"),
        "{addr}"
    );
    let routes = sandbox.ip(&["-4", "route", "show"])?;
    ensure!(
        routes.contains("default via 10.244.1.1 dev eth0"),
        "{routes}"
    );
    ensure!(
        routes.contains("10.244.1.0/24 via 10.244.1.1 dev eth0"),
        "{routes}"
    );
    ensure!(routes.contains("10.244.1.1 dev eth0"), "{routes}");
    let host_routes = node.ip(&["-4", "route", "show"])?;
    ensure!(
        host_routes.contains(&format!("10.244.1.2 dev {} scope host", out.host_ifname)),
        "{host_routes}"
    );
    let fwd = node.exec("cat", &["/proc/sys/net/ipv4/ip_forward"])?;
    ensure!(fwd.trim() == "1", "ip_forward in node is {fwd}");

    node.ping("10.244.1.2")?;
    sandbox.ping("10.244.1.1")?;

    let t = dp.teardown("one", "eth0", Some(sandbox.path())).await?;
    ensure!(t.host_link_deleted && t.sandbox_cleaned, "{t:?}");
    assert_not_routed(&node, "10.244.1.2")?;
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&sandbox)?;
    Ok(())
}

/// ADD makes the veth pair while it reserves the addresses: a started setup holds the pair and
/// no address; finished, the sandbox is wired as by `setup`; abandoned, or finished with the
/// spec of another sandbox, nothing of it is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_setup_is_finished_into_a_wired_sandbox_or_leaves_nothing() -> Result<()> {
    let (node, dp) = node()?;
    let sandbox = Netns::new("pod")?;
    let s = spec("started", &sandbox, &[("10.244.7.2/24", "10.244.7.1")]);
    let host = host_ifname("started", "eth0");
    let started = dp.start_setup(LinkSpec::of(&s)).await?;
    ensure!(veths(&node)? == [host.clone()], "node: {:?}", veths(&node)?);
    let addr = sandbox.ip(&["addr", "show", "eth0"])?;
    ensure!(
        addr.contains("mtu 1460") && !addr.contains("inet"),
        "started: {addr}"
    );
    let (out, verified) = started.finish(&s).await?;
    verified?;
    ensure!(out.host_ifname == host, "{out:?}");
    dp.check(&s).await?;
    node.ping("10.244.7.2")?;
    dp.teardown("started", "eth0", Some(sandbox.path())).await?;

    let other = Netns::new("pod")?;
    let a = spec("abandoned", &other, &[("10.244.7.3/24", "10.244.7.1")]);
    let started = dp.start_setup(LinkSpec::of(&a)).await?;
    ensure!(links(&other)? == ["lo", "eth0"], "{:?}", links(&other)?);
    let errors = started.abandon().await;
    ensure!(errors.is_empty(), "{errors:?}");
    assert_sandbox_clean(&other)?;
    ensure!(
        !veths(&node)?.contains(&host_ifname("abandoned", "eth0")),
        "{:?}",
        veths(&node)?
    );

    let started = dp.start_setup(LinkSpec::of(&a)).await?;
    let refused = started.finish(&s).await;
    ensure!(
        matches!(refused, Err(DataplaneError::InvalidSpec(_))),
        "finished with another sandbox's spec: {refused:?}"
    );
    assert_sandbox_clean(&other)?;
    settle(&dp).await?;
    assert_node_clean(&node)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_sandboxes() -> Result<()> {
    const N: usize = 100;
    let (node, dp) = node()?;
    let mut sandboxes = Vec::new();
    for _ in 0..N {
        sandboxes.push(Netns::new("p")?);
    }
    let specs: Vec<_> = sandboxes
        .iter()
        .enumerate()
        .map(|(i, sb)| {
            spec(
                &format!("c{i}"),
                sb,
                &[(&format!("10.244.2.{}/24", i + 2), "10.244.2.1")],
            )
        })
        .collect();

    let t0 = Instant::now();
    for s in &specs {
        dp.setup(s).await.with_context(|| s.container_id.clone())?;
    }
    let setup_time = t0.elapsed();
    for s in &specs {
        dp.check(s).await?;
    }
    ensure!(veths(&node)?.len() == N, "expected {N} veths");
    for (i, sb) in sandboxes.iter().enumerate().step_by(9) {
        node.ping(&format!("10.244.2.{}", i + 2))?;
        sb.ping("10.244.2.1")?;
    }
    let t1 = Instant::now();
    for s in &specs {
        dp.teardown(&s.container_id, &s.ifname, Some(&s.netns))
            .await?;
    }
    let teardown_time = t1.elapsed();
    eprintln!(
        "{N} sandboxes: setup {setup_time:?} ({:?} each), teardown {teardown_time:?} ({:?} each)",
        setup_time / 100,
        teardown_time / 100
    );
    settle(&dp).await?;
    assert_node_clean(&node)?;
    for sb in &sandboxes {
        assert_sandbox_clean(sb)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_setups_share_the_host_socket() -> Result<()> {
    let (node, dp) = node()?;
    let mut sandboxes = Vec::new();
    for _ in 0..16 {
        sandboxes.push(Netns::new("cc")?);
    }
    let mut tasks = Vec::new();
    for (i, sb) in sandboxes.iter().enumerate() {
        let s = spec(
            &format!("cc{i}"),
            sb,
            &[(&format!("10.244.6.{}/24", i + 2), "10.244.6.1")],
        );
        let dp = dp.clone();
        tasks.push(tokio::spawn(async move { dp.setup(&s).await.map(|_| s) }));
    }
    let mut specs = Vec::new();
    for t in tasks {
        specs.push(t.await??);
    }
    for s in &specs {
        dp.check(s).await?;
    }
    node.ping("10.244.6.17")?;
    for s in &specs {
        dp.teardown(&s.container_id, "eth0", Some(&s.netns)).await?;
    }
    settle(&dp).await?;
    assert_node_clean(&node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack() -> Result<()> {
    let (node, dp) = node()?;
    let sandbox = Netns::new("ds")?;
    let mut s = spec(
        "ds",
        &sandbox,
        &[
            ("10.244.3.2/24", "10.244.3.1"),
            ("fd00:3::2/64", "fd00:3::1"),
        ],
    );
    s.routes.push(RouteSpec::new(net("::/0"), None));
    dp.setup(&s).await?;
    dp.check(&s).await?;
    // The configured addresses are usable at once (NODAD); kernel link-locals may take a moment
    // on a loaded machine, but none may stay tentative.
    for ns in [&node, &sandbox] {
        let a = ns.ip(&["-6", "addr", "show"])?;
        for configured in ["fd00:3::2/64", "fd00:3::1/128"] {
            if let Some(line) = a.lines().find(|l| l.contains(configured)) {
                ensure!(
                    !line.contains("tentative"),
                    "{configured} tentative in {}: {a}",
                    ns.name()
                );
            }
        }
        let started = Instant::now();
        loop {
            let a = ns.ip(&["-6", "addr", "show"])?;
            if !a.contains("tentative") {
                break;
            }
            ensure!(
                started.elapsed() < std::time::Duration::from_secs(3),
                "tentative address left in {}: {a}",
                ns.name()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let a = sandbox.ip(&["-6", "addr", "show", "eth0"])?;
    ensure!(a.contains("fd00:3::2/64"), "{a}");
    let r = sandbox.ip(&["-6", "route", "show"])?;
    ensure!(r.contains("default via fd00:3::1 dev eth0"), "{r}");
    let ra = node.exec(
        "cat",
        &[&format!(
            "/proc/sys/net/ipv6/conf/{}/accept_ra",
            host_ifname("ds", "eth0")
        )],
    )?;
    ensure!(ra.trim() == "0", "accept_ra {ra}");
    node.ping("10.244.3.2")?;
    sandbox.ping("10.244.3.1")?;
    node.ping("fd00:3::2")?;
    sandbox.ping("fd00:3::1")?;
    dp.teardown("ds", "eth0", Some(sandbox.path())).await?;
    assert_not_routed(&node, "10.244.3.2")?;
    assert_not_routed(&node, "fd00:3::2")?;
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&sandbox)
}

/// An IPv4-only pod's host veth takes no part in IPv6 (off on it): no link-local address, no
/// route through it in the node, not even the multicast one every IPv6 link gets (nothing for
/// the kernel to set up at ADD, to look through for each IPv6 packet, nor to walk at every
/// DEL). The pod's own interface keeps its link-local address; a link too small for IPv6 (mtu
/// under 1280, no IPv6 keys at all) works as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_only_host_veth_gets_no_ipv6_link_local() -> Result<()> {
    let (node, dp) = node()?;
    let sandbox = Netns::new("v4only")?;
    let small = Netns::new("v4small")?;
    let s = spec("v4only", &sandbox, &[("10.244.4.2/24", "10.244.4.1")]);
    let mut s_small = spec("v4small", &small, &[("10.244.4.3/24", "10.244.4.1")]);
    s_small.mtu = Some(1000);
    let out = dp.setup(&s).await?;
    dp.setup(&s_small).await?;
    dp.check(&s).await?;
    dp.check(&s_small).await?;

    let host = out.host_ifname.as_str();
    let disabled = node.exec(
        "cat",
        &[&format!("/proc/sys/net/ipv6/conf/{host}/disable_ipv6")],
    )?;
    ensure!(disabled.trim() == "1", "disable_ipv6 on {host}: {disabled}");
    // Both ends come up together: once the pod's end has its link-local address, the kernel
    // has configured IPv6 on the pair, and would have given the host end one too.
    let pod_ll = wait_until(
        "the pod's IPv6 link-local address",
        std::time::Duration::from_secs(10),
        || {
            let a = sandbox.ip(&["-6", "addr", "show", "eth0"])?;
            Ok(a.contains("inet6 fe80::").then_some(a))
        },
    )?;
    ensure!(pod_ll.contains("scope link"), "{pod_ll}");
    let host_v6 = node.ip(&["-6", "addr", "show", "dev", host])?;
    ensure!(
        host_v6.trim().is_empty(),
        "IPv6 address on {host}: {host_v6}"
    );
    let node_v6 = node.ip(&["-6", "route", "show", "table", "all"])?;
    let through_host: Vec<&str> = node_v6
        .lines()
        .filter(|l| l.contains(HOST_IFNAME_PREFIX))
        .collect();
    ensure!(
        through_host.is_empty(),
        "IPv6 routes through our veths: {through_host:?}"
    );

    let small_link = small.ip(&["link", "show", "eth0"])?;
    ensure!(small_link.contains("mtu 1000"), "{small_link}");
    node.ping("10.244.4.2")?;
    node.ping("10.244.4.3")?;
    small.ping("10.244.4.1")?;

    dp.teardown("v4only", "eth0", Some(sandbox.path())).await?;
    dp.teardown("v4small", "eth0", Some(small.path())).await?;
    assert_not_routed(&node, "10.244.4.2")?;
    assert_not_routed(&node, "10.244.4.3")?;
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&sandbox)?;
    assert_sandbox_clean(&small)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_is_idempotent_and_survives_a_deleted_netns() -> Result<()> {
    let (node, dp) = node()?;
    // Never set up at all.
    let never = Netns::new("nv")?;
    dp.teardown("never", "eth0", Some(never.path())).await?;
    dp.teardown("never", "eth0", None).await?;

    // Twice.
    let sb = Netns::new("tw")?;
    let s = spec("twice", &sb, &[("10.244.4.2/24", "10.244.4.1")]);
    dp.setup(&s).await?;
    let first = dp.teardown("twice", "eth0", Some(sb.path())).await?;
    ensure!(first.host_link_deleted, "{first:?}");
    let second = dp.teardown("twice", "eth0", Some(sb.path())).await?;
    ensure!(!second.host_link_deleted, "{second:?}");
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&sb)?;

    // After the sandbox netns was deleted.
    let mut gone = Netns::new("gn")?;
    let s = spec("gone", &gone, &[("10.244.4.3/24", "10.244.4.1")]);
    dp.setup(&s).await?;
    let path = gone.path().to_owned();
    gone.delete()?;
    let t = dp.teardown("gone", "eth0", Some(&path)).await?;
    ensure!(t.sandbox_netns_gone, "{t:?}");
    dp.teardown("gone", "eth0", Some(&path)).await?;
    settle(&dp).await?;
    // The kernel deletes the pair with the netns, possibly a little later.
    for _ in 0..100 {
        if veths(&node)?.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_node_clean(&node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_fails_when_ifname_exists() -> Result<()> {
    let (node, dp) = node()?;
    let sb = Netns::new("ex")?;
    // (no dummy module on these kernels: a veth pair inside the sandbox stands in)
    sb.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ])?;
    sb.ip(&["addr", "add", "10.99.0.5/24", "dev", "eth0"])?;
    let before = sb.ip(&["-o", "link", "show", "eth0"])?;
    let s = spec("exists", &sb, &[("10.244.5.2/24", "10.244.5.1")]);
    let err = dp.setup(&s).await.expect_err("setup must fail");
    let msg = err.to_string();
    ensure!(
        msg.contains("eth0") && msg.contains("already exists"),
        "{msg}"
    );
    let after = sb.ip(&["-o", "link", "show", "eth0"])?;
    let index = |s: &str| s.split(':').next().map(str::to_owned);
    ensure!(
        index(&before) == index(&after),
        "eth0 changed: {before} -> {after}"
    );
    ensure!(
        sb.ip(&["-4", "addr", "show", "eth0"])?
            .contains("10.99.0.5/24"),
        "address of the existing eth0 is gone"
    );
    let mut l = links(&sb)?;
    l.sort();
    ensure!(
        l == ["eth0", "lo", "other0"],
        "sandbox links changed: {l:?}"
    );
    assert_node_clean(&node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_the_missing_default_route() -> Result<()> {
    let (_node, dp) = node()?;
    let sb = Netns::new("ck")?;
    let s = spec("check", &sb, &[("10.244.8.2/24", "10.244.8.1")]);
    dp.setup(&s).await?;
    dp.check(&s).await?;
    sb.ip(&["route", "del", "default"])?;
    let failure = dp.check(&s).await.expect_err("check must fail");
    ensure!(failure.problems.len() == 1, "{failure}");
    let p = &failure.problems[0];
    ensure!(
        p.contains("route 0.0.0.0/0 via 10.244.8.1")
            && p.contains("missing")
            && p.contains(sb.name()),
        "{p}"
    );
    dp.teardown("check", "eth0", Some(sb.path())).await?;
    Ok(())
}

/// ADD's check after setup: what the kernel acknowledged is not read back, but a node whose
/// policy routing sends the pod's address elsewhere is caught and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_and_check_names_node_routing_that_bypasses_the_veth() -> Result<()> {
    let (node, dp) = node()?;
    let healthy = Netns::new("rt")?;
    let s = spec("routed", &healthy, &[("10.244.10.2/24", "10.244.10.1")]);
    let (_, verified) = dp.setup_and_check(&s).await?;
    ensure!(
        verified.is_ok(),
        "a healthy setup failed its check: {verified:?}"
    );

    node.ip(&[
        "rule",
        "add",
        "to",
        "10.244.9.0/24",
        "lookup",
        "77",
        "pref",
        "100",
    ])?;
    node.ip(&["route", "add", "10.244.9.0/24", "dev", "lo", "table", "77"])?;
    let diverted = Netns::new("rt")?;
    let d = spec("diverted", &diverted, &[("10.244.9.2/24", "10.244.9.1")]);
    let (out, verified) = dp.setup_and_check(&d).await?;
    let failure = verified.expect_err("the node does not route 10.244.9.2 through the veth");
    ensure!(failure.problems.len() == 1, "{failure}");
    let p = &failure.problems[0];
    ensure!(
        p.contains("10.244.9.2/32")
            && p.contains(&out.host_ifname)
            && p.contains("unicast 10.244.9.0/24 oif 1 table 77")
            && p.contains(node.name()),
        "{p}"
    );
    node.ip(&[
        "route",
        "replace",
        "blackhole",
        "10.244.9.0/24",
        "table",
        "77",
    ])?;
    let failure = dp.check(&d).await.expect_err("blackholed");
    ensure!(
        failure
            .problems
            .iter()
            .any(|p| p.contains("10.244.9.2/32") && p.contains("blackhole")),
        "{failure}"
    );

    for (id, sandbox) in [("routed", &healthy), ("diverted", &diverted)] {
        dp.teardown(id, "eth0", Some(sandbox.path())).await?;
    }
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&healthy)?;
    assert_sandbox_clean(&diverted)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_operation_object_and_netns() -> Result<()> {
    let (_node, dp) = node()?;
    let s = SandboxSpec::new("nons", "/run/netns/does-not-exist-dataplane", "eth0")
        .with_addresses([PodAddress::new(net("10.244.9.2/24"), ip("10.244.9.1"))]);
    let err = dp.setup(&s).await.expect_err("missing netns");
    ensure!(err.setup_step() == Some(SetupStep::SandboxNetns), "{err}");
    let text = err.to_string();
    for part in [
        "setup of nons",             // the operation and its sandbox
        "sandbox-netns",             // the step
        "open netns",                // what failed
        "does-not-exist-dataplane",  // on which object
        "No such file or directory", // why
    ] {
        ensure!(text.contains(part), "{part:?} missing in: {text}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_then_immediate_re_add_of_the_same_key() -> Result<()> {
    let (node, dp) = node()?;
    let sb = Netns::new("ra")?;
    let s = spec("readd", &sb, &[("10.244.10.2/24", "10.244.10.1")]);
    // Enough rounds for the reaper (deleting the previous pair) to race the teardown.
    for round in 0..20 {
        let out = dp
            .setup(&s)
            .await
            .with_context(|| format!("setup {round}"))?;
        dp.check(&s)
            .await
            .with_context(|| format!("check {round}"))?;
        node.ping("10.244.10.2")
            .with_context(|| format!("round {round}"))?;
        let t = dp.teardown("readd", "eth0", Some(sb.path())).await?;
        ensure!(t.host_link_deleted && t.sandbox_cleaned, "{t:?}");
        // The sandbox's name is free at once. The host end keeps its name, retired, until the
        // reaper deletes it or the next setup renames it out of its way.
        ensure!(
            !links(&sb)?.contains(&"eth0".to_owned()),
            "eth0 still taken"
        );
        let retired = node.links_in_group(GRAVEYARD_GROUP)?;
        ensure!(
            !links(&node)?.contains(&out.host_ifname) || retired.contains(&out.host_ifname),
            "host veth {} left in service after its teardown",
            out.host_ifname
        );
    }
    // Same key, same address, while retired links may still exist: routed to the new veth only.
    let out = dp.setup(&s).await?;
    let got = node.ip(&["route", "get", "10.244.10.2"])?;
    ensure!(got.contains(&out.host_ifname), "{got}");
    node.ping("10.244.10.2")?;
    dp.teardown("readd", "eth0", Some(sb.path())).await?;
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&sb)
}

/// A host link of the sandbox's name that is retired (down, in the graveyard group; no reaper
/// queued for it here, so it stays) is renamed out of the way by setup; one in service is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_renames_a_retired_host_end_out_of_its_way_but_not_one_in_service() -> Result<()> {
    let (node, dp) = node()?;
    // The reaper's start-up sweep of the group is over: the link retired below stays.
    settle(&dp).await?;
    let sb = Netns::new("rr")?;
    let s = spec("retired", &sb, &[("10.244.14.2/24", "10.244.14.1")]);
    let host = host_ifname("retired", "eth0");
    let group = GRAVEYARD_GROUP.to_string();
    node.ip(&[
        "link", "add", &host, "type", "veth", "peer", "name", "oldpeer0",
    ])?;

    // In service (not in the graveyard group): named in the error, left alone.
    let err = dp
        .setup(&s)
        .await
        .expect_err("a host link in service blocks setup");
    ensure!(
        err.to_string().contains(&host) && err.to_string().contains("already exists"),
        "{err}"
    );
    ensure!(
        links(&node)?.contains(&host),
        "the link in service was touched"
    );

    // Retired: moved out of the way, and the new pair routes the pod.
    node.ip(&["link", "set", &host, "down", "group", &group])?;
    let old_index = node.ip(&["-o", "link", "show", &host])?;
    let old_index = old_index
        .split(':')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let out = dp.setup(&s).await?;
    ensure!(out.host_ifname == host, "{out:?}");
    let retired = node.links_in_group(GRAVEYARD_GROUP)?;
    let moved = graveyard_ifname(old_index.parse()?);
    ensure!(
        retired == [moved.clone()],
        "the old link is not {moved} in the graveyard group: {retired:?}"
    );
    let got = node.ip(&["route", "get", "10.244.14.2"])?;
    ensure!(got.contains(&host), "{got}");
    node.ping("10.244.14.2")?;
    // The reaper's group deletion takes the renamed link along with the one retired now.
    dp.teardown("retired", "eth0", Some(sb.path())).await?;
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&sb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_withdraws_routing_before_the_link_is_deleted() -> Result<()> {
    let (node, dp) = node()?;
    let mut sandboxes = Vec::new();
    let mut specs = Vec::new();
    for i in 0..5 {
        let sb = Netns::new("wd")?;
        specs.push(spec(
            &format!("wd{i}"),
            &sb,
            &[
                (&format!("10.244.11.{}/24", i + 2), "10.244.11.1"),
                (&format!("fd00:11::{}/64", i + 2), "fd00:11::1"),
            ],
        ));
        sandboxes.push(sb);
    }
    for s in &specs {
        dp.setup(s).await?;
    }
    // Tear all down back to back: the reaper is busy with the first while the others return.
    for s in &specs {
        dp.teardown(&s.container_id, "eth0", Some(&s.netns)).await?;
    }
    for i in 0..5 {
        assert_not_routed(&node, &format!("10.244.11.{}", i + 2))?;
        assert_not_routed(&node, &format!("fd00:11::{}", i + 2))?;
    }
    // Whatever is still there is retired: down, in the graveyard group, without address.
    // (One read of the links and one of the addresses: the reaper deletes retired links
    // meanwhile.)
    let all_links = node.ip(&["-o", "link", "show"])?;
    let all_addrs = node.ip(&["-o", "addr", "show"])?;
    let in_graveyard = format!(" group {GRAVEYARD_GROUP} ");
    for name in veths(&node)? {
        let on = |line: &&str| {
            line.split_whitespace()
                .nth(1)
                .is_some_and(|n| n.trim_end_matches(':').split('@').next() == Some(name.as_str()))
        };
        let a: Vec<&str> = all_addrs.lines().filter(on).collect();
        ensure!(
            !a.iter().any(|l| l.contains("inet")),
            "{name} keeps addresses: {a:?}"
        );
        let l: Vec<&str> = all_links.lines().filter(on).collect();
        ensure!(!l.iter().any(|l| l.contains(",UP")), "{name} is up: {l:?}");
        ensure!(
            l.iter().all(|l| l.contains(&in_graveyard)),
            "{name} not in the graveyard group: {l:?}"
        );
    }
    for sb in &sandboxes {
        let r = sb.ip(&["route", "show"])?;
        ensure!(r.trim().is_empty(), "routes left in sandbox: {r}");
        ensure!(
            !links(sb)?.contains(&"eth0".to_owned()),
            "eth0 still in sandbox"
        );
    }
    // The reaper removes every link, in bounded time.
    settle(&dp).await?;
    assert_node_clean(&node)?;
    for sb in &sandboxes {
        assert_sandbox_clean(sb)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_setups_and_teardowns_leave_nothing_after_flush() -> Result<()> {
    let (node, dp) = node()?;
    let sb = Netns::new("hf")?;
    for i in 0..100 {
        let s = spec(
            &format!("hf{i}"),
            &sb,
            &[(&format!("10.244.12.{}/24", i + 2), "10.244.12.1")],
        );
        dp.setup(&s).await.with_context(|| format!("setup {i}"))?;
        dp.teardown(&s.container_id, "eth0", Some(sb.path()))
            .await
            .with_context(|| format!("teardown {i}"))?;
    }
    settle(&dp).await?;
    assert_node_clean(&node)?;
    assert_sandbox_clean(&sb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_host_link_retires_leftovers_and_graveyard_links() -> Result<()> {
    let (node, dp) = node()?;
    let sb = Netns::new("lf")?;
    let s = spec("leftover", &sb, &[("10.244.13.2/24", "10.244.13.1")]);
    let out = dp.setup(&s).await?;
    dp.delete_host_link(&out.host_ifname).await?;
    assert_not_routed(&node, "10.244.13.2")?;
    // A graveyard link is accepted too (reconciliation after a crash: one left behind by a
    // killed process), and its peer goes with it.
    let graveyard = graveyard_ifname(0xbeef);
    node.ip(&[
        "link", "add", &graveyard, "type", "veth", "peer", "name", "gyleft0",
    ])?;
    dp.delete_host_link(&graveyard).await?;
    settle(&dp).await?;
    assert_node_clean(&node)?;
    let left = links(&node)?;
    ensure!(left == ["lo"], "links left in the node: {left:?}");
    assert_sandbox_clean(&sb)
}
