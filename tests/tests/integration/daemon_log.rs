//! What the daemon's log tells an operator about sandboxes left without network: one WARN line
//! per skipped sandbox naming its namespace, creator and evidence, and repeated skips from one
//! creator summarised (logged at the 1st, 2nd, 4th, 8th... with the count so far), in plain
//! text when the log is not a terminal.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result};
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::{
    cookie_of, log_field, log_lines_about, verdict_and_intent, wait_views_where,
};
use provisioner_tests::{Netns, OwnRuntime, RuntimeNetns, wait_until};

const PATIENCE: Duration = Duration::from_secs(30);

/// The kernel watch sees the whole node, where other runtimes may leave skipped sandboxes too
/// (a real containerd's, a stray `cni-*` pin another tool left): the test's sandboxes have a
/// creator of their own (a runtime's name no other process has), its views are found by inode
/// and creator, and only the log lines about them (by the daemon's cookies) are read.
#[test]
fn skipped_sandboxes_are_warned_about_and_repeats_summarised() -> Result<()> {
    const SKIPPED: usize = 5;
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--trace-deadline", "1"], |socket| {
        conflist("lognet", "1.0.0", socket, "10.250.40.0/24", None)
    })?;
    daemon.wait_tracing(PATIENCE)?;
    // A runtime creates sandboxes and never calls a plugin.
    let runtime = OwnRuntime::new()?;
    let comm = runtime.comm();
    let sandboxes: Vec<RuntimeNetns> = (0..SKIPPED)
        .map(|_| RuntimeNetns::created_by(&runtime, "cni-log"))
        .collect::<Result<_>>()?;
    let views = wait_views_where(&daemon, SKIPPED, PATIENCE, |v| {
        sandboxes.iter().any(|s| s.is_view_of(v))
    })?;
    for view in &views {
        assert_eq!(verdict_and_intent(view), "skipped+none", "{view:#}");
    }
    let cookies: HashSet<u64> = views.iter().filter_map(cookie_of).collect();
    assert_eq!(cookies.len(), SKIPPED, "{views:#?}");

    // Only the 1st, 2nd and 4th of the five skips are logged.
    let ours = |log: &str| -> Vec<String> {
        log_lines_about(log, &cookies)
            .filter(|l| l.contains("VERDICT SKIPPED"))
            .map(str::to_owned)
            .collect()
    };
    let log = wait_until("the WARN line of our 4th skip", PATIENCE, || {
        let log = daemon.log();
        Ok((ours(&log).len() >= 3).then_some(log))
    })
    .with_context(|| {
        let log = daemon.log();
        let skipped: Vec<&str> = log.lines().filter(|l| l.contains("SKIPPED")).collect();
        format!(
            "our sandboxes {cookies:?}; SKIPPED lines:\n{}",
            skipped.join("\n")
        )
    })?;
    // Read from a file (as from journald), the log is plain text: no colour escape codes.
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a log written to a file:\n{log}"
    );
    let lines = ours(&log);
    for line in &lines {
        assert!(line.contains(" WARN "), "not a warning: {line}");
        assert!(
            log_field(line, "creator") == Some(comm),
            "creator not named: {line}"
        );
        for key in ["netns_inode", "evidence", "skips_from_creator"] {
            assert!(log_field(line, key).is_some(), "{key} missing: {line}");
        }
    }
    let counts: Vec<u64> = lines
        .iter()
        .filter_map(|l| log_field(l, "skips_from_creator")?.parse().ok())
        .collect();
    assert_eq!(
        counts,
        [1, 2, 4],
        "{SKIPPED} skips from one creator, logged at the 1st, 2nd and 4th:\n{}",
        lines.join("\n")
    );
    Ok(())
}
