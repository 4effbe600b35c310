//! The kernel watch reads a process's environment only where it can hold a CNI call: a
//! container's never (its entrypoint is exec'd under the runtime's shim and runc), while the
//! CNI plugins containerd itself runs for a pod are read, their call and pod with them.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use provisioner_tests::containerd::Containerd;
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::wait_views_of_containers;
use provisioner_tests::oci_image::BUSYBOX_IMAGE;
use provisioner_tests::{Netns, provisioner_bin, scaled_secs, wait_until};
use serde_json::Value;

/// A value no environment on the node holds but the container's.
const SECRET: &str = "hunter2-provisioner-test";

/// `provisioner trace --json` in the background, once it has attached, its events collected
/// as they come; stopped when dropped.
struct TraceSession {
    child: Child,
    reader: std::thread::JoinHandle<Vec<Value>>,
}

impl TraceSession {
    fn start(seconds: &str) -> Result<Self> {
        let mut child = Command::new(provisioner_bin())
            .args(["trace", "--json", "--duration", seconds])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn provisioner trace")?;
        let mut out = BufReader::new(child.stdout.take().context("trace stdout")?);
        let mut first = String::new();
        out.read_line(&mut first)?;
        let started: Value = serde_json::from_str(&first)
            .with_context(|| format!("provisioner trace began with {first:?}"))?;
        if started["report"] != "started" {
            bail!("provisioner trace began with {first}");
        }
        let reader = std::thread::spawn(move || {
            out.lines()
                .map_while(Result::ok)
                .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
                .filter(|v| v["kind"]["event"].is_string())
                .collect()
        });
        Ok(Self { child, reader })
    }

    /// Ends the session (Ctrl-C, as an operator ends it) and returns every event it printed.
    fn events(mut self) -> Result<Vec<Value>> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT)?;
        self.child.wait()?;
        let reader = std::mem::replace(&mut self.reader, std::thread::spawn(Vec::new));
        reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader of provisioner trace panicked"))
    }
}

impl Drop for TraceSession {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn a_containers_environment_is_never_read_while_containerds_plugins_are() -> Result<()> {
    let node = Netns::new("node")?;
    let daemon =
        Daemon::start_with_conflist(&node, &["--trace-deadline", &scaled_secs(2.0)], |socket| {
            conflist("envnet", "1.0.0", socket, "10.251.8.0/24", None)
        })?;
    daemon.wait_ready(Duration::from_secs(10))?;
    daemon.wait_tracing(Duration::from_secs(30))?;
    let mut containerd = Containerd::start_reading(&node, &daemon)?;

    let trace = TraceSession::start(&scaled_secs(120.0))?;
    let ready = containerd
        .run_ready_pod("env-web")
        .with_context(|| daemon.log())?;
    let container = containerd.cri().start_container(
        &ready.pod,
        "sleeper",
        BUSYBOX_IMAGE.name,
        &["/bin/sleep", "3600"],
        &[("SECRET_TOKEN", SECRET)],
    )?;
    wait_until("the container running", Duration::from_secs(20), || {
        Ok(containerd
            .cri()
            .container_running(&container)?
            .then_some(()))
    })?;
    // The pod was judged: the watch saw what it needed, and its events are in the session.
    wait_views_of_containers(
        &daemon,
        &HashSet::from([ready.pod.id.clone()]),
        true,
        Duration::from_secs(30),
    )?;
    let events = trace.events()?;

    // The container's entrypoint ran, exec'd under the shim and runc: its environment was
    // not read.
    let entrypoints: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"]["event"] == "exec" && e["kind"]["filename"] == "/bin/sleep")
        .collect();
    assert!(
        !entrypoints.is_empty(),
        "the container's exec was seen: {}",
        kinds(&events)
    );
    let environments: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"]["event"] == "exec_env")
        .collect();
    for entrypoint in &entrypoints {
        let pid = &entrypoint["task"]["pid"];
        assert!(
            !environments.iter().any(|e| &e["task"]["pid"] == pid),
            "the environment of the container's process {pid} was read: {entrypoint}"
        );
    }
    // No environment was copied from under a shim or runc at all.
    for env in &environments {
        let parent = env["kind"]["parent_comm"].as_str().unwrap_or_default();
        assert!(
            !parent.starts_with("containerd-shim") && !parent.starts_with("runc"),
            "an environment was read under {parent}: {env}"
        );
    }
    // containerd's own plugins were read: the loopback plugin's CNI call names the pod.
    let loopback_call = environments.iter().any(|e| {
        e["kind"]["parent_comm"] == "containerd"
            && e["kind"]["cni"]["command"] == "ADD"
            && e["kind"]["cni"]["args"]
                .as_str()
                .is_some_and(|a| a.contains("K8S_POD_NAME=env-web"))
    });
    assert!(
        loopback_call,
        "containerd's CNI ADD for the pod was read: {environments:#?}"
    );
    Ok(())
}

/// How many events of each kind, for a failure message.
fn kinds(events: &[Value]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for e in events {
        *counts
            .entry(e["kind"]["event"].as_str().unwrap_or("?").to_owned())
            .or_insert(0) += 1;
    }
    format!("{counts:?}")
}
