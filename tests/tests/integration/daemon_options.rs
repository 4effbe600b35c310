//! Daemon behaviour docs/operating.md promises, no other test checks: the network rendered from a
//! template at start (`--template`, `--pod-cidr`, `--template-output`), `--no-trace`,
//! `--proc-sys`, SIGTERM finishing the operations in flight, and ADD and DEL of one sandbox
//! racing each other.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use provisioner::dataplane::{GRAVEYARD_GROUP, host_ifname};
use provisioner_tests::daemon_harness::{Daemon, conflist, plugin_stdin, run_plugin};
use provisioner_tests::daemon_queries::allocations;
use provisioner_tests::pod_net::{FORWARDING_SYSCTLS, node_forwarding};
use provisioner_tests::{Netns, wait_only_lo, wait_until};
use serde_json::Value;
use testkit::daemon::sandbox_request;

const PATIENCE: Duration = Duration::from_secs(10);

/// containerd's template form, with the daemon's socket filled in.
fn template(socket: &Path) -> String {
    r#"{
  "name": "tplnet",
  "cniVersion": "1.0.0",
  "plugins": [{
    "type": "provisioner",
    "socket": "@SOCKET@",
    "ipam": {
      "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
      "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}]
    }
  }]
}"#
    .replace("@SOCKET@", &socket.display().to_string())
}

#[test]
fn template_and_pod_cidrs_render_the_network_at_start() -> Result<()> {
    let node = Netns::new("node")?;
    let dir = tempfile::tempdir()?;
    let template_file = dir.path().join("cni.template");
    // The daemon's socket is only known once it runs: render with a placeholder path first,
    // then point the template at the real socket for the second start.
    std::fs::write(&template_file, template(Path::new("/nonexistent")))?;
    for (cidrs, output) in [
        ("10.250.30.0/24", None),
        (
            "10.250.31.0/24,fd00:250:31::/64",
            Some("05-rendered.conflist"),
        ),
    ] {
        let mut args = vec![
            "--template",
            template_file.to_str().unwrap_or_default(),
            "--pod-cidr",
            cidrs,
        ];
        let output_path;
        let mut daemon = Daemon::start_with(&node, None, &args)?;
        if let Some(name) = output {
            // --template-output: the rendered file goes where it says.
            daemon.stop_status()?;
            output_path = daemon.conf_dir.join(name);
            args.extend([
                "--template-output",
                output_path.to_str().unwrap_or_default(),
            ]);
            std::fs::write(&template_file, template(&daemon.socket))?;
            for leftover in std::fs::read_dir(&daemon.conf_dir)? {
                std::fs::remove_file(leftover?.path())?;
            }
            daemon.restart(&node, &args)?;
        } else {
            output_path = daemon.conf_dir.join("10-provisioner.conflist");
        }
        daemon.wait_ready(PATIENCE)?;
        let rendered: Value = serde_json::from_slice(
            &std::fs::read(&output_path)
                .with_context(|| format!("read {}", output_path.display()))?,
        )?;
        let status = daemon.status()?;
        assert_eq!(status["network"]["name"], "tplnet", "{status}");
        let ranges = status["network"]["ranges"].to_string();
        for cidr in cidrs.split(',') {
            assert!(ranges.contains(cidr), "{cidr} not served: {status}");
            assert!(rendered.to_string().contains(cidr), "{rendered}");
        }
        if output.is_some() {
            // Dual stack: an ADD through the plugin gets one address from each CIDR.
            let stdin = serde_json::to_vec(&plugin_stdin(&rendered, "1.0.0"))?;
            let pod = Netns::new("pod")?;
            let add = run_plugin("ADD", "c-tpl", Some(pod.path()), "eth0", &stdin)?;
            assert_eq!(add.code, 0, "{add:?}\n{}", daemon.log());
            let ips = add.json()["ips"].to_string();
            assert!(
                ips.contains("10.250.31.") && ips.contains("fd00:250:31::"),
                "{ips}"
            );
            assert_eq!(
                run_plugin("DEL", "c-tpl", Some(pod.path()), "eth0", &stdin)?.code,
                0
            );
        }
    }
    Ok(())
}

#[test]
fn no_trace_daemon_wires_sandboxes_and_says_tracing_is_off() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--no-trace"], |socket| {
        conflist("notrace", "1.0.0", socket, "10.250.32.0/24", None)
    })?;
    daemon.wait_ready(PATIENCE)?;
    let config = conflist("notrace", "1.0.0", &daemon.socket, "10.250.32.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let pod = Netns::new("pod")?;
    let add = run_plugin("ADD", "c-nt", Some(pod.path()), "eth0", &stdin)?;
    assert_eq!(add.code, 0, "{add:?}");
    let sandboxes = daemon.cli(&["sandboxes"])?;
    assert!(!sandboxes.status.success());
    let said = String::from_utf8_lossy(&sandboxes.stderr);
    assert!(said.contains("--no-trace"), "{said}");
    assert!(
        !daemon
            .log()
            .contains("kernel tracing of sandbox network setup started"),
        "{}",
        daemon.log()
    );
    assert_eq!(
        run_plugin("DEL", "c-nt", Some(pod.path()), "eth0", &stdin)?.code,
        0
    );
    Ok(())
}

/// A request the daemon accepted before SIGTERM is served to the end; new connections are
/// refused meanwhile (the plugin answers 11: try again); the daemon then exits cleanly and
/// what it finished is in its store at the next start.
#[test]
fn sigterm_finishes_the_operations_in_flight() -> Result<()> {
    let node = Netns::new("node")?;
    let mut daemon = Daemon::start_with_conflist(&node, &["--no-trace"], |socket| {
        conflist("drain", "1.0.0", socket, "10.250.33.0/24", None)
    })?;
    daemon.wait_ready(PATIENCE)?;
    let config = conflist("drain", "1.0.0", &daemon.socket, "10.250.33.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let pod = Netns::new("pod")?;
    let late = Netns::new("late")?;

    // Half a request: the daemon has accepted the connection and waits for the rest.
    let mut request = serde_json::to_vec(&sandbox_request("add", "c-drain", pod.path()))?;
    request.push(b'\n');
    let (first, rest) = request.split_at(request.len() / 2);
    let mut stream = UnixStream::connect(&daemon.socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(first)?;
    // Connections are accepted in order: once a later one is answered, ours was accepted.
    testkit::daemon::call(&daemon.socket, &serde_json::json!({"op": "status"}))?;

    let pid = daemon.pid().context("daemon pid")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    wait_until("the daemon to start draining", PATIENCE, || {
        Ok(daemon
            .log()
            .lines()
            .find(|l| l.contains("shutting down: finishing operations in flight"))
            .map(str::to_owned))
    })?;
    let refused = run_plugin("ADD", "c-late", Some(late.path()), "eth0", &stdin)?;
    assert_eq!(refused.error_code(), Some(11), "{refused:?}");
    assert!(late.links()?.is_empty(), "a refused ADD wired its sandbox");

    stream.write_all(rest)?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer)?;
    let answer: Value = serde_json::from_str(&answer)
        .with_context(|| format!("answer to the drained ADD: {answer:?}"))?;
    assert_eq!(answer["status"], "ok", "{answer}\n{}", daemon.log());
    assert_eq!(pod.links()?, ["eth0"], "the drained ADD wired its sandbox");
    assert!(daemon.stop_status()?.success(), "{}", daemon.log());

    daemon.restart(&node, &["--no-trace"])?;
    daemon.wait_ready(PATIENCE)?;
    let left = allocations(&daemon)?;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].container_id, "c-drain");
    assert_eq!(
        run_plugin("DEL", "c-drain", Some(pod.path()), "eth0", &stdin)?.code,
        0
    );
    Ok(())
}

/// ADD and DEL of one sandbox sent at the same time, again and again: each pair leaves the
/// sandbox either fully there (allocation, interface with that address, host veth) or fully
/// gone, never half.
#[test]
fn racing_add_and_del_of_one_sandbox_leave_it_whole_or_gone() -> Result<()> {
    const ROUNDS: usize = 20;
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--no-trace"], |socket| {
        conflist("race", "1.0.0", socket, "10.250.34.0/24", None)
    })?;
    daemon.wait_ready(PATIENCE)?;
    let config = conflist("race", "1.0.0", &daemon.socket, "10.250.34.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let pod = Netns::new("pod")?;
    let veth = host_ifname("c-race", "eth0");
    let mut outcomes = [0usize; 2];
    for round in 0..ROUNDS {
        let (add, del) = std::thread::scope(|s| {
            let add = s.spawn(|| run_plugin("ADD", "c-race", Some(pod.path()), "eth0", &stdin));
            let del = s.spawn(|| run_plugin("DEL", "c-race", Some(pod.path()), "eth0", &stdin));
            (add.join(), del.join())
        });
        let add = add.map_err(|_| anyhow::anyhow!("ADD thread panicked"))??;
        let del = del.map_err(|_| anyhow::anyhow!("DEL thread panicked"))??;
        assert_eq!(del.code, 0, "round {round}: {del:?}");
        assert_eq!(add.code, 0, "round {round}: {add:?}");
        let held = allocations(&daemon)?;
        if let Some(allocation) = held.first() {
            outcomes[0] += 1;
            let address = allocation.addresses.first().map_or("", String::as_str);
            let shown = pod.ip(&["-o", "addr", "show", "dev", "eth0"])?;
            assert!(
                !address.is_empty() && shown.contains(address),
                "round {round}: allocated {address}, eth0 has {shown}"
            );
            assert!(
                node.links()?.contains(&veth)
                    && !node.links_in_group(GRAVEYARD_GROUP)?.contains(&veth),
                "round {round}: allocated without its host veth in service"
            );
            // Start the next round from nothing.
            assert_eq!(
                run_plugin("DEL", "c-race", Some(pod.path()), "eth0", &stdin)?.code,
                0
            );
        } else {
            outcomes[1] += 1;
        }
        // (A retired veth may stay in the sandbox, renamed and down, until the reaper deletes
        // it: the interface name is free at once.)
        let links = pod.links()?;
        assert!(
            !links.iter().any(|l| l == "eth0"),
            "round {round}: eth0 left in the sandbox: {links:?}"
        );
        assert!(
            allocations(&daemon)?.is_empty(),
            "round {round}: allocation left"
        );
        // The host veth may stay retired (down, in the graveyard group) until the reaper
        // deletes it. (Read first: a link retired then is still retired, or gone, after.)
        let retired = node.links_in_group(GRAVEYARD_GROUP)?;
        assert!(
            !node.links()?.contains(&veth) || retired.contains(&veth),
            "round {round}: host veth left in service"
        );
    }
    eprintln!("ADD last / DEL last: {outcomes:?}");
    wait_only_lo(&pod, PATIENCE)?;
    wait_only_lo(&node, PATIENCE)?;
    Ok(())
}

/// The runtime's GC while an ADD of a sandbox it does not list yet is in flight: that sandbox is
/// skipped (the daemon says so), never torn down under the ADD; a GC after the ADD removes it
/// whole.
#[test]
fn gc_skips_a_sandbox_whose_add_is_in_flight() -> Result<()> {
    // Each ADD waits 500 ms with its allocation on disk before it answers (failpoint
    // add.slow), the daemon answering the GCs sent meanwhile: the first round has GCs during
    // the ADD however fast the machine (a plain ADD can be over between two GCs).
    const MAX_ROUNDS: usize = 3;
    let node = Netns::new("node")?;
    let mut daemon = Daemon::start_with_conflist(&node, &["--no-trace"], |socket| {
        conflist("gcrace", "1.0.0", socket, "10.250.35.0/24", None)
    })?;
    daemon.stop_status()?;
    daemon.restart_with_env(
        &node,
        &["--no-trace"],
        &[(provisioner::failpoint::ENV, "add.slow")],
    )?;
    daemon.wait_ready(PATIENCE)?;
    let config = conflist("gcrace", "1.0.0", &daemon.socket, "10.250.35.0/24", None);
    let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
    let gc = serde_json::json!({"op": "gc", "network": null, "valid": []});
    let pod = Netns::new("pod")?;
    let skipped = "GC: operation in flight, skipped";
    for round in 0..MAX_ROUNDS {
        let done = std::sync::atomic::AtomicBool::new(false);
        let add = std::thread::scope(|s| -> Result<_> {
            let add = s.spawn(|| {
                let add = run_plugin("ADD", "c-gc", Some(pod.path()), "eth0", &stdin);
                done.store(true, std::sync::atomic::Ordering::Release);
                add
            });
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                testkit::daemon::call(&daemon.socket, &gc)?;
            }
            add.join()
                .map_err(|_| anyhow::anyhow!("ADD thread panicked"))?
        })?;
        assert_eq!(add.code, 0, "round {round}: ADD under GC: {add:?}");
        // Whole or gone: a GC after the ADD may have removed it, but never a part of it. A GC
        // knows no netns: it retires the host end, and the sandbox end goes when the reaper
        // deletes the pair.
        let held = allocations(&daemon)?;
        if held.is_empty() {
            wait_until("the GC'd sandbox's eth0 to be deleted", PATIENCE, || {
                Ok((!pod.links()?.iter().any(|l| l == "eth0")).then_some(()))
            })
            .with_context(|| format!("round {round}: no allocation left"))?;
        } else {
            let links = pod.links()?;
            assert!(
                links.iter().any(|l| l == "eth0"),
                "round {round}: allocations {held:?}, sandbox links {links:?}"
            );
        }
        assert_eq!(
            run_plugin("DEL", "c-gc", Some(pod.path()), "eth0", &stdin)?.code,
            0
        );
        if daemon.log().contains(skipped) {
            return Ok(());
        }
    }
    anyhow::bail!(
        "no GC ran while an ADD was in flight in {MAX_ROUNDS} rounds:\n{}",
        daemon.log()
    )
}

/// `--proc-sys DIR`: the sysctls are read and written under DIR. A `DIR/net` that leads to
/// `/proc/sys/net` (a link here, a bind mount in a container: either resolves against the
/// namespace of the thread that opens a file) serves a dual-stack ADD, which turns forwarding
/// on in the node namespace; a `DIR/net` that is a plain dir fails the ADD at step sysctl,
/// naming the file under DIR, and the node's forwarding stays off.
#[test]
fn proc_sys_dir_holds_the_sysctls_the_daemon_reads_and_writes() -> Result<()> {
    let off = FORWARDING_SYSCTLS.map(|f| format!("{f}=0"));
    let on = FORWARDING_SYSCTLS.map(|f| format!("{f}=1"));
    for (i, linked) in [(34, true), (35, false)] {
        let node = Netns::new("node")?;
        assert_eq!(node_forwarding(&node)?, off, "a new namespace forwards");
        let proc_sys = tempfile::tempdir()?;
        let net = proc_sys.path().join("net");
        if linked {
            std::os::unix::fs::symlink("/proc/sys/net", &net)?;
        } else {
            std::fs::create_dir(&net)?;
        }
        let v4 = format!("10.250.{i}.0/24");
        let v6 = format!("fd00:250:{i}::/64");
        let daemon = Daemon::start_with_conflist(
            &node,
            &[
                "--no-trace",
                "--proc-sys",
                proc_sys.path().to_str().unwrap_or_default(),
            ],
            |socket| conflist("procsys", "1.0.0", socket, &v4, Some(&v6)),
        )?;
        daemon.wait_ready(PATIENCE)?;
        let config = conflist("procsys", "1.0.0", &daemon.socket, &v4, Some(&v6));
        let stdin = serde_json::to_vec(&plugin_stdin(&config, "1.0.0"))?;
        let pod = Netns::new("pod")?;
        let add = run_plugin("ADD", "c-procsys", Some(pod.path()), "eth0", &stdin)?;
        if linked {
            assert_eq!(add.code, 0, "{add:?}\n{}", daemon.log());
            assert_eq!(node_forwarding(&node)?, on);
            assert_eq!(
                run_plugin("DEL", "c-procsys", Some(pod.path()), "eth0", &stdin)?.code,
                0
            );
        } else {
            let written = net.join("ipv4/ip_forward").display().to_string();
            let msg = add.json()["msg"].as_str().unwrap_or_default().to_owned();
            assert_ne!(add.code, 0, "{add:?}");
            assert!(
                msg.contains("sysctl") && add.stdout.contains(&written),
                "{add:?}"
            );
            assert_eq!(node_forwarding(&node)?, off);
        }
    }
    Ok(())
}

/// A `--proc-sys` without a `net` dir (a mount forgotten) keeps the daemon from starting, and
/// it says which dir it lacks.
#[test]
fn a_proc_sys_without_net_keeps_the_daemon_from_starting() -> Result<()> {
    let node = Netns::new("node")?;
    let dir = tempfile::tempdir()?;
    let proc_sys = tempfile::tempdir()?;
    let proc_sys_arg = proc_sys.path().display().to_string();
    let mut daemon = testkit::daemon::Daemon::spawn(
        &provisioner_tests::provisioner_bin(),
        &node,
        dir.path(),
        &["--no-trace", "--proc-sys", &proc_sys_arg],
    )?;
    let status = wait_until("the daemon to exit", PATIENCE, || daemon.exited())?;
    assert!(!status.success(), "{status}");
    let missing = proc_sys.path().join("net").display().to_string();
    let log = daemon.log();
    assert!(log.contains(&missing), "{log}");
    Ok(())
}
