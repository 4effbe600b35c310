//! `trace::session::run`: JSON lines for events and a verdict line for a skipped sandbox.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use provisioner::trace::SandboxRules;
use provisioner::trace::session::{SessionOptions, run};
use std::os::unix::fs::MetadataExt;

use provisioner_tests::{
    require_root, runtime_runs_plugin, scaled, scaled_secs, stand_in_runtime, unique_name,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_prints_events_and_a_skipped_verdict_as_json_lines() -> anyhow::Result<()> {
    require_root();
    let runtime = stand_in_runtime().to_path_buf();
    let name = unique_name("trses");
    let path = PathBuf::from(format!("/run/netns/{name}"));
    let (rt, n) = (runtime.clone(), name.clone());
    let started = Arc::new(AtomicBool::new(false));
    let go = Arc::clone(&started);
    let actor = std::thread::spawn(move || {
        while !go.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let added = Command::new(&rt).args(["netns", "add", &n]).status()?;
        // The runtime runs a plugin for the pod, and wires nothing.
        runtime_runs_plugin(
            "loopback",
            None,
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c0ffee00"),
                ("CNI_NETNS", &format!("/var/run/netns/{n}")),
                ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"),
            ],
        )?;
        anyhow::Ok(added)
    });
    let opts = SessionOptions {
        json: true,
        // A session runs for its duration (it has no other end but Ctrl-C): the bound on the
        // 1 s deadline's verdict, with room for a loaded machine.
        duration: Some(scaled(Duration::from_secs(6))),
        deadline: scaled(Duration::from_secs(1)),
        rules: SandboxRules {
            pin_prefixes: vec!["trses".into()],
            ..SandboxRules::default()
        },
        comm: Some("containerd".into()),
        ..SessionOptions::default()
    };
    let mut out = Signalling {
        bytes: Vec::new(),
        started,
    };
    let summary = run(opts, &mut out).await;
    out.started.store(true, Ordering::Release);
    let out = out.bytes;
    let status = actor
        .join()
        .map_err(|_| anyhow::anyhow!("actor panicked"))??;
    let _ = Command::new("ip").args(["netns", "del", &name]).status();
    let summary = summary?;
    assert!(status.success());
    let text = String::from_utf8(out)?;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let verdict = lines
        .iter()
        .find(|l| {
            l["report"] == "verdict"
                && l["timeline"].as_array().is_some_and(|t| {
                    t.iter()
                        .any(|e| e["path"] == path.to_string_lossy().as_ref())
                })
        })
        .ok_or_else(|| anyhow::anyhow!("no verdict for {}:\n{text}", path.display()))?;
    assert_eq!(verdict["verdict"], "skipped", "{verdict}");
    assert_eq!(verdict["creator"]["comm"], "containerd");
    assert_eq!(verdict["pod"]["status"], "known", "{verdict}");
    assert_eq!(verdict["pod"]["pod"]["namespace"], "default", "{verdict}");
    assert_eq!(verdict["pod"]["pod"]["name"], "web-0", "{verdict}");
    assert_eq!(verdict["pod"]["pod"]["sandbox_id"], "c0ffee00", "{verdict}");
    assert!(
        lines.iter().any(|l| l["kind"]["event"] == "netns_created"),
        "events are printed:\n{text}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["task"]["comm"].is_null() || l["task"]["comm"] == "containerd"),
        "the comm filter applies"
    );
    assert_eq!(lines[0]["report"], "started");
    assert!(lines.last().is_some_and(|l| l["report"] == "summary"));
    // Other tests' stand-in runtimes may be skipped meanwhile: the summary counts what the
    // session printed, and the namespace of this test has exactly one verdict.
    let printed_skips = lines
        .iter()
        .filter(|l| l["report"] == "verdict" && l["verdict"] == "skipped")
        .count() as u64;
    assert_eq!(summary.verdicts.get("skipped"), Some(&printed_skips));
    let ours = lines
        .iter()
        .filter(|l| {
            l["report"] == "verdict"
                && l["timeline"].as_array().is_some_and(|t| {
                    t.iter()
                        .any(|e| e["path"] == path.to_string_lossy().as_ref())
                })
        })
        .count();
    assert_eq!(ours, 1, "one verdict for {}:\n{text}", path.display());
    Ok(())
}

/// Collects output and raises a flag at the first line (the session's "started" line).
struct Signalling {
    bytes: Vec<u8>,
    started: Arc<AtomicBool>,
}

impl Write for Signalling {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.started.store(true, Ordering::Release);
        Ok(())
    }
}

/// Runs `provisioner trace <args>` to its end; its stdout.
fn trace_cli(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(provisioner_tests::provisioner_bin())
        .arg("trace")
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "provisioner trace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn trace_started_on_a_node_with_wired_sandboxes_reports_them_networked_from_their_state()
-> anyhow::Result<()> {
    use provisioner_tests::reference::Ptp;
    use provisioner_tests::{Netns, RuntimeNetns};
    let node = Netns::new("trnode")?;
    let data = tempfile::tempdir()?;
    let ptp = Ptp {
        node: &node,
        subnet: "10.244.11.0/24".into(),
        data_dir: data.path().to_path_buf(),
    };
    let wired: Vec<RuntimeNetns> = (0..3)
        .map(|_| RuntimeNetns::new("trsw"))
        .collect::<anyhow::Result<_>>()?;
    for sb in &wired {
        ptp.run("ADD", sb.name(), &sb.path())?;
    }
    // A separate process names namespaces its own way on a kernel without cookies: its
    // verdicts are matched by inode (unique while the test holds the pins).
    let inodes: Vec<u64> = wired
        .iter()
        .map(|sb| std::fs::metadata(sb.path()).map(|m| m.ino()))
        .collect::<std::io::Result<_>>()?;
    let (duration, deadline) = (scaled_secs(3.0), scaled_secs(1.0));

    let human = trace_cli(&[
        "--verdicts-only",
        "--duration",
        &duration,
        "--deadline",
        &deadline,
        "--pin-prefix",
        "trsw",
    ])?;
    assert!(human.starts_with("tracing started"), "{human}");
    for inode in &inodes {
        let line = human
            .lines()
            .find(|l| l.contains(" VERDICT ") && l.contains(&format!(" inode={inode} ")))
            .ok_or_else(|| anyhow::anyhow!("no verdict for inode {inode}:\n{human}"))?;
        assert!(line.contains("VERDICT NETWORKED"), "{line}");
        assert!(line.contains("found set up at"), "{line}");
    }
    for inode in &inodes {
        assert!(
            !human
                .lines()
                .any(|l| l.contains("VERDICT SKIPPED") && l.contains(&format!(" inode={inode} "))),
            "{human}"
        );
    }
    assert!(
        !human.lines().any(|l| l.contains("rtnl-request")),
        "--verdicts-only prints no events:\n{human}"
    );

    let one = wired[0].path();
    let json = trace_cli(&[
        "--json",
        "--duration",
        &duration,
        "--deadline",
        &deadline,
        "--pin-prefix",
        "trsw",
        "--netns",
        one.to_str().unwrap_or_default(),
    ])?;
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let verdicts: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["report"] == "verdict").collect();
    assert_eq!(
        verdicts.len(),
        1,
        "--netns shows only that namespace:\n{json}"
    );
    assert_eq!(verdicts[0]["netns"]["inode"], inodes[0]);
    assert_eq!(verdicts[0]["verdict"], "networked");
    assert_eq!(verdicts[0]["evidence"]["by"], "snapshot");
    for sb in &wired {
        ptp.run("DEL", sb.name(), &sb.path())?;
    }
    Ok(())
}
