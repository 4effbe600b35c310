//! The binary exec'd exactly as a runtime does (env + stdin + stdout), against a running daemon
//! whose host side is a private "node" namespace.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use provisioner::dataplane::host_ifname;
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::{Netns, wait_only_lo, wait_until};
use serde_json::Value;

/// How long a daemon may take to be ready once its config is in place.
const READY_WITHIN: Duration = Duration::from_secs(5);

const VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn stdin_for(config: &Value, version: &str) -> Vec<u8> {
    serde_json::to_vec(&plugin_stdin(config, version)).unwrap_or_default()
}

fn list(daemon: &Daemon) -> Result<Vec<Value>> {
    let out = daemon.cli(&["list", "--json"])?;
    assert!(
        out.status.success(),
        "list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice::<Vec<Value>>(&out.stdout)?)
}

#[test]
fn add_check_del_in_every_spec_version() -> Result<()> {
    let node = Netns::new("node")?;
    let socket_placeholder = Path::new("/nonexistent");
    let mut config = conflist("podnet", "1.0.0", socket_placeholder, "10.250.1.0/24", None);
    let daemon = Daemon::start(&node, None)?;
    config["plugins"][0]["socket"] = Value::from(daemon.socket.display().to_string());
    std::fs::write(
        daemon.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&config)?,
    )?;
    daemon.wait_ready(READY_WITHIN)?;

    for version in VERSIONS {
        let pod = Netns::new("pod")?;
        let id = format!("ctr-{}", version.replace('.', ""));
        let stdin = stdin_for(&config, version);
        let add = run_plugin("ADD", &id, Some(pod.path()), "eth0", &stdin)?;
        assert_eq!(add.code, 0, "ADD {version}: {add:?}\n{}", daemon.log());
        let result = add.json();
        assert_eq!(result["cniVersion"], version);
        let ips = result["ips"].as_array().cloned().unwrap_or_default();
        assert_eq!(ips.len(), 1, "{result}");
        let has_version_field = ips[0].get("version").is_some();
        assert_eq!(
            has_version_field,
            version.starts_with("0."),
            "ips[].version in {version}: {result}"
        );
        assert_eq!(ips[0]["interface"], 1);
        assert_eq!(result["interfaces"][1]["name"], "eth0");
        assert_eq!(
            result["interfaces"][1]["sandbox"],
            pod.path().display().to_string()
        );
        let address = ips[0]["address"].as_str().unwrap_or_default().to_owned();
        assert!(address.starts_with("10.250.1."), "{address}");
        let shown = pod.ip(&["-o", "addr", "show", "dev", "eth0"])?;
        assert!(shown.contains(&address), "eth0 lacks {address}: {shown}");

        if version != "0.3.1" {
            let mut check_conf = plugin_stdin(&config, version);
            check_conf["prevResult"] = result.clone();
            let check = run_plugin(
                "CHECK",
                &id,
                Some(pod.path()),
                "eth0",
                &serde_json::to_vec(&check_conf)?,
            )?;
            assert_eq!(check.code, 0, "CHECK {version}: {check:?}");
        }

        let del = run_plugin("DEL", &id, Some(pod.path()), "eth0", &stdin)?;
        assert_eq!(del.code, 0, "DEL {version}: {del:?}");
        assert!(
            del.stdout.trim().is_empty(),
            "DEL prints nothing: {:?}",
            del.stdout
        );
        assert!(
            list(&daemon)?.is_empty(),
            "allocation left after DEL in {version}"
        );
        assert!(!pod.ip(&["link"])?.contains("eth0"));
        let pod_ip = address.split('/').next().unwrap_or_default();
        assert_unrouted(&node, pod_ip)?;
    }
    // The retired host veths are deleted by the reaper shortly after.
    wait_only_lo(&node, REAPED_WITHIN)?;
    Ok(())
}

/// Bound on the background deletion of retired links (tens of ms on a quiet machine).
const REAPED_WITHIN: Duration = Duration::from_secs(10);

/// Nothing in the node routes `ip` any more.
fn assert_unrouted(node: &Netns, ip: &str) -> Result<()> {
    let routes = node.ip(&["route", "show", "table", "all"])?;
    anyhow::ensure!(
        !routes
            .lines()
            .any(|l| l.split_whitespace().next() == Some(ip)),
        "{ip} still routed in the node after DEL:\n{routes}"
    );
    Ok(())
}

fn started_daemon(node: &Netns, name: &str, v4: &str) -> Result<(Daemon, Value)> {
    let mut config = conflist(name, "1.1.0", Path::new("/nonexistent"), v4, None);
    let daemon = Daemon::start(node, None)?;
    config["plugins"][0]["socket"] = Value::from(daemon.socket.display().to_string());
    std::fs::write(
        daemon.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&config)?,
    )?;
    daemon.wait_ready(READY_WITHIN)?;
    Ok((daemon, config))
}

/// A daemon living in the node's namespace (as on a node) writes the node's sysctls without
/// entering it: the IPv4 pod's host veth has IPv6 off, and the pod is reachable from the node.
#[test]
fn a_daemon_living_in_the_node_namespace_wires_pods_too() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_in_node_with_conflist(&node, &["--no-trace"], |socket| {
        conflist("innode", "1.1.0", socket, "10.250.40.0/24", None)
    })?;
    daemon.wait_ready(READY_WITHIN)?;
    let config = conflist("innode", "1.1.0", &daemon.socket, "10.250.40.0/24", None);
    let stdin = stdin_for(&config, "1.1.0");
    let pod = Netns::new("pod")?;
    let add = run_plugin("ADD", "c-innode", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(add.code, 0, "ADD: {add:?}\n{}", daemon.log());
    let host = host_ifname("c-innode", "eth0");
    let ipv6_off = node.exec(
        "cat",
        &[&format!("/proc/sys/net/ipv6/conf/{host}/disable_ipv6")],
    )?;
    assert_eq!(ipv6_off.trim(), "1", "disable_ipv6 on {host}");
    let address = add.json()["ips"][0]["address"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let pod_ip = address.split('/').next().unwrap_or_default();
    node.ping(pod_ip)?;
    let del = run_plugin("DEL", "c-innode", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(del.code, 0, "DEL: {del:?}");
    assert_unrouted(&node, pod_ip)?;
    wait_only_lo(&node, REAPED_WITHIN)?;
    Ok(())
}

#[test]
fn del_succeeds_in_every_case_and_releases_what_remains() -> Result<()> {
    let node = Netns::new("node")?;
    let (daemon, config) = started_daemon(&node, "delnet", "10.250.2.0/24")?;
    let stdin = stdin_for(&config, "1.1.0");

    // Unknown container, with and without a netns.
    let pod = Netns::new("pod")?;
    assert_eq!(
        run_plugin("DEL", "never-added", Some(pod.path()), "eth0", &stdin)?.code,
        0
    );
    assert_eq!(
        run_plugin("DEL", "never-added", None, "eth0", &stdin)?.code,
        0
    );

    // Netns deleted before DEL: success, allocation released.
    let mut gone = Netns::new("gone")?;
    assert_eq!(
        run_plugin("ADD", "c-gone", Some(gone.path()), "eth0", &stdin)?.code,
        0
    );
    let gone_path = gone.path().to_path_buf();
    gone.delete()?;
    let del = run_plugin("DEL", "c-gone", Some(&gone_path), "eth0", &stdin)?;
    assert_eq!(del.code, 0, "{del:?}");
    // Empty CNI_NETNS (containerd's second DEL) and a second DEL: success.
    assert_eq!(run_plugin("DEL", "c-gone", None, "eth0", &stdin)?.code, 0);
    assert_eq!(
        run_plugin("DEL", "c-gone", Some(&gone_path), "eth0", &stdin)?.code,
        0
    );
    assert!(list(&daemon)?.is_empty());

    // DEL with an empty CNI_NETNS of a live sandbox releases it too.
    assert_eq!(
        run_plugin("ADD", "c-live", Some(pod.path()), "eth0", &stdin)?.code,
        0
    );
    assert_eq!(run_plugin("DEL", "c-live", None, "eth0", &stdin)?.code, 0);
    assert!(list(&daemon)?.is_empty());
    Ok(())
}

#[test]
fn check_after_route_removed_fails_naming_it() -> Result<()> {
    let node = Netns::new("node")?;
    let (_daemon, config) = started_daemon(&node, "chknet", "10.250.3.0/24")?;
    let pod = Netns::new("pod")?;
    let stdin = stdin_for(&config, "1.0.0");
    let add = run_plugin("ADD", "c-check", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(add.code, 0, "{add:?}");
    pod.ip(&["route", "del", "default"])?;
    let mut check_conf = plugin_stdin(&config, "1.0.0");
    check_conf["prevResult"] = add.json();
    let check = run_plugin(
        "CHECK",
        "c-check",
        Some(pod.path()),
        "eth0",
        &serde_json::to_vec(&check_conf)?,
    )?;
    assert_eq!(check.error_code(), Some(105), "{check:?}");
    let msg = check.json()["msg"].as_str().unwrap_or_default().to_owned();
    assert!(
        msg.contains("0.0.0.0/0") && msg.contains("c-check"),
        "CHECK must name the sandbox and the default route: {msg}"
    );
    assert_eq!(
        run_plugin("DEL", "c-check", Some(pod.path()), "eth0", &stdin)?.code,
        0
    );
    Ok(())
}

#[test]
fn gc_releases_every_attachment_not_listed() -> Result<()> {
    let node = Netns::new("node")?;
    let (daemon, config) = started_daemon(&node, "gcnet", "10.250.4.0/24")?;
    let stdin = stdin_for(&config, "1.1.0");
    let (a, b) = (Netns::new("gca")?, Netns::new("gcb")?);
    let keep = run_plugin("ADD", "keep", Some(a.path()), "eth0", &stdin)?;
    assert_eq!(keep.code, 0, "{keep:?}");
    let keep_result = keep.json();
    assert_eq!(
        run_plugin("ADD", "drop", Some(b.path()), "eth0", &stdin)?.code,
        0
    );
    let mut gc_conf = plugin_stdin(&config, "1.1.0");
    gc_conf["cni.dev/valid-attachments"] =
        serde_json::json!([{ "containerID": "keep", "ifname": "eth0" }]);
    let gc = run_plugin("GC", "", None, "", &serde_json::to_vec(&gc_conf)?)?;
    assert_eq!(gc.code, 0, "{gc:?}");
    let left = list(&daemon)?;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["container_id"], "keep");
    assert!(b.links()?.is_empty(), "GC'd sandbox still wired");
    // The kept sandbox is still wired and its host veth still there; the collected one's host
    // veth is gone (retired at once, deleted by the reaper).
    let kept_address = left[0]["addresses"][0].as_str().unwrap_or_default();
    let shown = a.ip(&["-o", "addr", "show", "dev", "eth0"])?;
    assert!(
        !kept_address.is_empty() && shown.contains(kept_address),
        "kept sandbox lost {kept_address}: {shown}"
    );
    let keep_veth = host_ifname("keep", "eth0");
    let mut links = Vec::new();
    wait_until("only the kept host veth", REAPED_WITHIN, || {
        links = node.links()?;
        Ok((links == [keep_veth.clone()]).then_some(()))
    })
    .with_context(|| format!("node links: {links:?}"))?;
    let mut check_conf = plugin_stdin(&config, "1.1.0");
    check_conf["prevResult"] = keep_result;
    let check = run_plugin(
        "CHECK",
        "keep",
        Some(a.path()),
        "eth0",
        &serde_json::to_vec(&check_conf)?,
    )?;
    assert_eq!(
        check.code, 0,
        "the kept sandbox passes CHECK after GC: {check:?}"
    );
    Ok(())
}

#[test]
fn version_status_and_error_codes() -> Result<()> {
    let node = Netns::new("node")?;
    let version = run_plugin("VERSION", "", None, "", b"{\"cniVersion\":\"1.1.0\"}")?;
    assert_eq!(version.code, 0);
    let supported = version.json()["supportedVersions"].clone();
    for v in VERSIONS {
        assert!(
            supported
                .as_array()
                .is_some_and(|a| a.contains(&Value::from(v))),
            "{supported}"
        );
    }

    // Daemon with an empty conf dir: STATUS answers 50 with the reason (once the daemon has
    // read its conf dir: before, the reason is that it has not).
    let empty = Daemon::start(&node, None)?;
    let config = conflist("stnet", "1.1.0", &empty.socket, "10.250.5.0/24", None);
    let conf_dir = empty.conf_dir.display().to_string();
    let mut status = None;
    wait_until(
        "STATUS naming the empty conf dir",
        Duration::from_secs(10),
        || {
            let answer = run_plugin("STATUS", "", None, "", &stdin_for(&config, "1.1.0"))?;
            let msg = answer.json()["msg"].as_str().unwrap_or_default().to_owned();
            let done = msg.contains("no network with type provisioner") && msg.contains(&conf_dir);
            status = Some(answer);
            Ok(done.then_some(()))
        },
    )
    .with_context(|| format!("last STATUS: {status:?}"))?;
    assert_eq!(
        status.as_ref().and_then(|s| s.error_code()),
        Some(50),
        "{status:?}"
    );
    // ADD while not ready: 11 (try again later), nothing allocated.
    let pod = Netns::new("pod")?;
    let add = run_plugin(
        "ADD",
        "c1",
        Some(pod.path()),
        "eth0",
        &stdin_for(&config, "1.1.0"),
    )?;
    assert_eq!(add.error_code(), Some(11), "{add:?}");
    assert!(pod.links()?.is_empty(), "ADD while not ready wired the pod");
    // Once its config arrives, the daemon's store shows that nothing was allocated meanwhile.
    std::fs::write(
        empty.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&config)?,
    )?;
    empty.wait_ready(READY_WITHIN)?;
    assert!(list(&empty)?.is_empty(), "ADD while not ready allocated");
    let daemon = empty;
    let stdin = stdin_for(&config, "1.1.0");
    assert_eq!(run_plugin("STATUS", "", None, "", &stdin)?.code, 0);

    // Bad environment: 4, naming the variable.
    let bad_env = run_plugin("ADD", "", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(bad_env.error_code(), Some(4), "{bad_env:?}");
    assert!(bad_env.stdout.contains("CNI_CONTAINERID"), "{bad_env:?}");
    let bad_ifname = run_plugin("ADD", "c1", Some(pod.path()), "eth0/x", &stdin)?;
    assert_eq!(bad_ifname.error_code(), Some(4), "{bad_ifname:?}");
    // Undecodable config: 6. Invalid config: 7.
    assert_eq!(
        run_plugin("ADD", "c1", Some(pod.path()), "eth0", b"{not json")?.error_code(),
        Some(6)
    );
    let no_name = br#"{"cniVersion":"1.0.0","type":"provisioner"}"#;
    assert_eq!(
        run_plugin("ADD", "c1", Some(pod.path()), "eth0", no_name)?.error_code(),
        Some(7)
    );
    // Netns that is not a network namespace.
    let not_netns = run_plugin(
        "ADD",
        "c1",
        Some(Path::new("/etc/hostname")),
        "eth0",
        &stdin,
    )?;
    assert_eq!(not_netns.error_code(), Some(4), "{not_netns:?}");
    assert!(not_netns.stdout.contains("/etc/hostname"), "{not_netns:?}");
    // A request for another subnet than the daemon serves: 103, nothing allocated.
    let other = conflist("stnet", "1.1.0", &daemon.socket, "10.250.99.0/24", None);
    let mismatch = run_plugin(
        "ADD",
        "c1",
        Some(pod.path()),
        "eth0",
        &stdin_for(&other, "1.1.0"),
    )?;
    assert_eq!(mismatch.error_code(), Some(103), "{mismatch:?}");
    assert!(list(&daemon)?.is_empty());
    // DEL with a stale config (e.g. cached before a PodCIDR change) still removes the sandbox.
    assert_eq!(
        run_plugin("ADD", "c-stale", Some(pod.path()), "eth0", &stdin)?.code,
        0
    );
    let stale_del = run_plugin(
        "DEL",
        "c-stale",
        Some(pod.path()),
        "eth0",
        &stdin_for(&other, "1.1.0"),
    )?;
    assert_eq!(stale_del.code, 0, "{stale_del:?}");
    assert!(
        list(&daemon)?.is_empty(),
        "stale-config DEL left an allocation"
    );
    // The interface already exists in the sandbox: 102, existing interface untouched.
    pod.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ])?;
    let exists = run_plugin("ADD", "c1", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(exists.error_code(), Some(102), "{exists:?}");
    assert!(
        pod.ip(&["link", "show", "eth0"])?.contains("eth0@other0"),
        "existing eth0 was touched"
    );
    assert!(list(&daemon)?.is_empty(), "failed ADD leaked an allocation");
    Ok(())
}

#[test]
fn daemon_not_running_answers_11_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = conflist(
        "downnet",
        "1.1.0",
        &dir.path().join("nobody.sock"),
        "10.250.6.0/24",
        None,
    );
    let pod = Netns::new("pod")?;
    let started = Instant::now();
    let add = run_plugin(
        "ADD",
        "c1",
        Some(pod.path()),
        "eth0",
        &stdin_for(&config, "1.1.0"),
    )?;
    assert_eq!(add.error_code(), Some(11), "{add:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert!(!pod.ip(&["link"])?.contains("eth0"));
    Ok(())
}

#[test]
fn parallel_adds_then_dels_through_the_plugin() -> Result<()> {
    const N: usize = 64;
    let node = Netns::new("node")?;
    let (daemon, config) = started_daemon(&node, "parnet", "10.251.0.0/22")?;
    let stdin = stdin_for(&config, "1.0.0");
    let pods: Vec<Netns> = (0..N).map(|_| Netns::new("par")).collect::<Result<_>>()?;
    let results: Vec<Result<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let stdin = &stdin;
                s.spawn(move || -> Result<String> {
                    let add =
                        run_plugin("ADD", &format!("par-{i}"), Some(pod.path()), "eth0", stdin)?;
                    anyhow::ensure!(add.code == 0, "ADD par-{i}: {add:?}");
                    Ok(add.json()["ips"][0]["address"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
            })
            .collect()
    });
    let mut addresses = Vec::new();
    for r in results {
        addresses.push(r?);
    }
    let mut distinct = addresses.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), N, "duplicate addresses: {addresses:?}");
    assert_eq!(list(&daemon)?.len(), N);
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let stdin = &stdin;
                s.spawn(move || {
                    run_plugin("DEL", &format!("par-{i}"), Some(pod.path()), "eth0", stdin)
                })
            })
            .collect();
        for h in handles {
            let del = h.join().map_err(|_| anyhow::anyhow!("panicked"))??;
            anyhow::ensure!(del.code == 0, "DEL: {del:?}");
        }
        Ok(())
    })?;
    assert!(list(&daemon)?.is_empty());
    // When DEL returns nothing routes the address any more...
    for address in &addresses {
        assert_unrouted(&node, address.split('/').next().unwrap_or_default())?;
    }
    // ...and the links themselves go shortly after (the reaper deletes them in batches).
    wait_only_lo(&node, REAPED_WITHIN)?;
    Ok(())
}

/// The plugin reads its config to EOF however the runtime writes it: in pieces with pauses
/// between them (a short read must not be taken for the whole config), and larger than one
/// read. Without a daemon, a fully read ADD config answers 11; a truncated one would be 6.
#[test]
fn plugin_reads_a_config_sent_in_pieces_or_larger_than_one_read() -> Result<()> {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir()?;
    let pod = Netns::new("pod")?;
    let mut config = conflist(
        "piecenet",
        "1.0.0",
        &dir.path().join("nobody.sock"),
        "10.250.7.0/24",
        None,
    );
    let small = stdin_for(&config, "1.0.0");
    // A plugin-specific key padding the config past 64 KiB.
    config["plugins"][0]["padding"] = Value::from("x".repeat(100 * 1024));
    let large = stdin_for(&config, "1.0.0");
    for (what, stdin, pieces) in [("in pieces", &small, 4), ("large", &large, 1)] {
        let mut child = Command::new(provisioner_tests::provisioner_bin())
            .env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "c1")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_NETNS", pod.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut pipe = child.stdin.take().context("stdin pipe")?;
        for chunk in stdin.chunks(stdin.len().div_ceil(pieces)) {
            pipe.write_all(chunk)?;
            pipe.flush()?;
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(pipe);
        let out = child.wait_with_output()?;
        let answer: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(answer["code"], 11, "{what}: {answer}");
    }
    Ok(())
}
