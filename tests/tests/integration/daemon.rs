//! The daemon: readiness that tells the truth while its config changes, ADDs during config
//! rewrites, reconciliation with the kernel at start, graceful stop.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use provisioner::dataplane::host_ifname;
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::{Netns, wait_until};
use serde_json::Value;

/// How long the daemon may take to act on a change of its conf dir.
const STATUS_WITHIN: Duration = Duration::from_secs(5);

fn status(daemon: &Daemon) -> Result<Value> {
    let out = daemon.cli(&["status", "--json"])?;
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn network_name(s: &Value) -> Option<&str> {
    s["network"]["name"].as_str()
}

#[test]
fn readiness_follows_every_way_of_writing_the_config() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start(&node, None)?;
    let s = status(&daemon)?;
    assert_eq!(s["ready"], false, "{s}");
    assert!(!s["reasons"].as_array().is_none_or(Vec::is_empty), "{s}");

    let file = daemon.conf_dir.join("10-provisioner.conflist");
    let good = |name: &str| conflist(name, "1.0.0", &daemon.socket, "10.252.1.0/24", None);

    // mv into the dir (containerd missed this).
    let staged = daemon
        .conf_dir
        .parent()
        .unwrap_or(Path::new("/tmp"))
        .join("staged.conflist");
    std::fs::write(&staged, serde_json::to_vec(&good("net-mv"))?)?;
    std::fs::rename(&staged, &file)?;
    daemon.wait_for_status("ready with net-mv", STATUS_WITHIN, |s| {
        s["ready"] == true && network_name(s) == Some("net-mv")
    })?;

    // Broken JSON over the good file: the good config stays in force, the error is reported.
    std::fs::write(&file, b"{\"cniVersion\": \"1.0.0\", \"name\": ")?;
    let s = daemon.wait_for_status("load error reported", STATUS_WITHIN, |s| {
        s["last_load"]["ok"] == false
    })?;
    assert_eq!(s["ready"], true, "{s}");
    assert_eq!(network_name(&s), Some("net-mv"), "{s}");

    // In-place truncate then write in two steps: never a partial config.
    let text = serde_json::to_vec(&good("net-inplace"))?;
    let written_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    std::fs::write(&file, &text[..text.len() / 2])?;
    // The watcher has read the half-written file once it reports a load attempt made after it
    // was written.
    let s = daemon.wait_for_status(
        "a load attempt of the half-written file",
        STATUS_WITHIN,
        |s| s["last_load"]["at"].as_f64().unwrap_or_default() >= written_at,
    )?;
    assert_eq!(s["last_load"]["ok"], false, "{s}");
    assert_eq!(
        network_name(&s),
        Some("net-mv"),
        "half-written file must not load: {s}"
    );
    std::fs::write(&file, &text)?;
    daemon.wait_for_status("net-inplace", STATUS_WITHIN, |s| {
        network_name(s) == Some("net-inplace") && s["ready"] == true
    })?;

    // temp + rename, and cp.
    let tmp = daemon.conf_dir.join(".tmp-new");
    std::fs::write(&tmp, serde_json::to_vec(&good("net-rename"))?)?;
    std::fs::rename(&tmp, &file)?;
    daemon.wait_for_status("net-rename", STATUS_WITHIN, |s| {
        network_name(s) == Some("net-rename")
    })?;
    std::fs::write(&staged, serde_json::to_vec(&good("net-cp"))?)?;
    std::fs::copy(&staged, &file)?;
    daemon.wait_for_status("net-cp", STATUS_WITHIN, |s| {
        network_name(s) == Some("net-cp")
    })?;

    // Removed: not ready, with a reason.
    std::fs::remove_file(&file)?;
    let s = daemon.wait_for_status("not ready", STATUS_WITHIN, |s| s["ready"] == false)?;
    assert!(!s["reasons"].as_array().is_none_or(Vec::is_empty), "{s}");
    Ok(())
}

#[test]
fn adds_during_config_rewrites_never_see_a_partial_config() -> Result<()> {
    let node = Netns::new("node")?;
    let config = conflist(
        "racenet",
        "1.0.0",
        Path::new("/nonexistent"),
        "10.252.2.0/24",
        None,
    );
    let daemon = Daemon::start(&node, None)?;
    let mut config = config;
    config["plugins"][0]["socket"] = Value::from(daemon.socket.display().to_string());
    let file = daemon.conf_dir.join("10-provisioner.conflist");
    let text = serde_json::to_vec_pretty(&config)?;
    std::fs::write(&file, &text)?;
    daemon.wait_for_status("ready", STATUS_WITHIN, |s| s["ready"] == true)?;
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let pods: Vec<Netns> = (0..20).map(|_| Netns::new("race")).collect::<Result<_>>()?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| -> Result<()> {
        let writer = s.spawn(|| -> Result<()> {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // truncate, pause, write: the daemon must keep the last good config meanwhile.
                std::fs::write(&file, &text[..text.len() / 3])?;
                std::thread::sleep(Duration::from_millis(5));
                std::fs::write(&file, &text)?;
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        });
        for (i, pod) in pods.iter().enumerate() {
            let add = run_plugin(
                "ADD",
                &format!("race-{i}"),
                Some(pod.path()),
                "eth0",
                &stdin,
            )?;
            assert_eq!(add.code, 0, "ADD race-{i} during rewrites: {add:?}");
            let address = add.json()["ips"][0]["address"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(address.starts_with("10.252.2."), "{address}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer panicked"))??;
        Ok(())
    })?;
    for (i, pod) in pods.iter().enumerate() {
        assert_eq!(
            run_plugin(
                "DEL",
                &format!("race-{i}"),
                Some(pod.path()),
                "eth0",
                &stdin
            )?
            .code,
            0
        );
    }
    Ok(())
}

#[test]
fn restart_reconciles_store_and_kernel() -> Result<()> {
    let node = Netns::new("node")?;
    let mut daemon = Daemon::start(&node, None)?;
    let mut config = conflist(
        "recnet",
        "1.0.0",
        Path::new("/nonexistent"),
        "10.252.3.0/24",
        None,
    );
    config["plugins"][0]["socket"] = Value::from(daemon.socket.display().to_string());
    std::fs::write(
        daemon.conf_dir.join("10-provisioner.conflist"),
        serde_json::to_vec(&config)?,
    )?;
    daemon.wait_for_status("ready", STATUS_WITHIN, |s| s["ready"] == true)?;
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let keep = Netns::new("keep")?;
    let mut lost = Netns::new("lost")?;
    assert_eq!(
        run_plugin("ADD", "keep", Some(keep.path()), "eth0", &stdin)?.code,
        0
    );
    assert_eq!(
        run_plugin("ADD", "lost", Some(lost.path()), "eth0", &stdin)?.code,
        0
    );
    assert!(daemon.stop_status()?.success(), "daemon exit on SIGTERM");
    assert!(!daemon.socket.exists(), "socket removed on stop");

    // While it is down: one sandbox disappears, and a host veth is left without allocation.
    // The kernel destroys a namespace (and with it the veth's peer, so the host end too) after
    // the last reference goes, asynchronously: wait for it, or the restarted daemon could
    // still find the lost sandbox's link and take it for a live one.
    let lost_veth = host_ifname("lost", "eth0");
    assert!(
        node.links()?.contains(&lost_veth),
        "{lost_veth} not in the node"
    );
    lost.delete()?;
    wait_until(
        &format!("{lost_veth} gone with its namespace"),
        Duration::from_secs(10),
        || Ok((!node.links()?.contains(&lost_veth)).then_some(())),
    )?;
    node.ip(&[
        "link",
        "add",
        "pvn00000000dead",
        "type",
        "veth",
        "peer",
        "name",
        "strayp",
    ])?;

    let restarted = Daemon::start_on_state_of(&node, &daemon)?;
    restarted.wait_for_status("ready", STATUS_WITHIN, |s| s["ready"] == true)?;
    let out = restarted.cli(&["list", "--json"])?;
    let left: Vec<Value> = serde_json::from_slice(&out.stdout)?;
    assert_eq!(left.len(), 1, "{left:?}\n{}", restarted.log());
    assert_eq!(left[0]["container_id"], "keep");
    // Reconciliation removed the stray link, and with it its peer; nothing else but the kept
    // sandbox's host veth is left (retired links are reaped in the background).
    let keep_veth = host_ifname("keep", "eth0");
    let mut links = Vec::new();
    wait_until(
        "only the kept sandbox's veth in the node",
        Duration::from_secs(10),
        || {
            links = node.links()?;
            Ok((links == [keep_veth.clone()]).then_some(()))
        },
    )
    .with_context(|| format!("links left in the node: {links:?}\n{}", restarted.log()))?;
    config["plugins"][0]["socket"] = Value::from(restarted.socket.display().to_string());
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    assert_eq!(
        run_plugin("DEL", "keep", Some(keep.path()), "eth0", &stdin)?.code,
        0
    );
    Ok(())
}

/// A successor started while the daemon drains (a DaemonSet rolling update with surge, an
/// operator's restart) binds the same socket path: the stopping daemon must not remove it.
#[test]
fn a_stopping_daemon_leaves_a_successors_socket_in_place() -> Result<()> {
    let node = Netns::new("node")?;
    let mut daemon = Daemon::start(&node, None)?;
    std::fs::remove_file(&daemon.socket)?;
    let successor = std::os::unix::net::UnixListener::bind(&daemon.socket)
        .with_context(|| format!("bind {}", daemon.socket.display()))?;
    assert!(daemon.stop_status()?.success(), "daemon exit on SIGTERM");
    ensure!(
        daemon.socket.exists(),
        "the successor's socket {} was removed by the stopping daemon\n{}",
        daemon.socket.display(),
        daemon.log()
    );
    std::os::unix::net::UnixStream::connect(&daemon.socket)
        .with_context(|| format!("connect to the successor at {}", daemon.socket.display()))?;
    successor
        .accept()
        .context("the successor accepts the connection")?;
    Ok(())
}
