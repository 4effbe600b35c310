//! What the daemon's log tells an operator about sandboxes left without network: one WARN line
//! per skipped sandbox naming its namespace, creator and evidence, and repeated skips from one
//! creator summarised (logged at the 1st, 2nd, 4th, 8th... with the count so far), in plain
//! text when the log is not a terminal.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result};
use provisioner_tests::daemon_harness::{Daemon, conflist};
use provisioner_tests::daemon_queries::{verdict_and_intent, wait_views_of};
use provisioner_tests::{Netns, RuntimeNetns, wait_until};

const PATIENCE: Duration = Duration::from_secs(30);

/// `key=value` of a log line (the value up to the next space).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split(' ').next()
}

#[test]
fn skipped_sandboxes_are_warned_about_and_repeats_summarised() -> Result<()> {
    const SKIPPED: usize = 5;
    let node = Netns::new("node")?;
    let daemon = Daemon::start_with_conflist(&node, &["--trace-deadline", "1"], |socket| {
        conflist("lognet", "1.0.0", socket, "10.250.40.0/24", None)
    })?;
    daemon.wait_tracing(PATIENCE)?;
    // A runtime (its comm is containerd) creates sandboxes and never calls a plugin.
    let sandboxes: Vec<RuntimeNetns> = (0..SKIPPED)
        .map(|_| RuntimeNetns::new("cni-log"))
        .collect::<Result<_>>()?;
    let cookies: HashSet<u64> = sandboxes
        .iter()
        .map(RuntimeNetns::cookie)
        .collect::<Result<_>>()?;
    let views = wait_views_of(&daemon, &cookies, false, PATIENCE)?;
    for view in &views {
        assert_eq!(verdict_and_intent(view), "skipped+none", "{view:#}");
    }

    // The warnings: every SKIPPED line is a WARN naming a namespace, the creator and the
    // evidence. Other runtimes on this machine may add skips from containerd meanwhile, so the
    // counts are checked for their shape: powers of two, increasing, and fewer lines than skips.
    let mut ours = Vec::new();
    let log = wait_until("a WARN line for one of our sandboxes", PATIENCE, || {
        let log = daemon.log();
        ours = log
            .lines()
            .filter(|l| l.contains("VERDICT SKIPPED"))
            .filter(|l| {
                field(l, "netns_cookie")
                    .and_then(|c| c.parse::<u64>().ok())
                    .is_some_and(|c| cookies.contains(&c))
            })
            .map(str::to_owned)
            .collect();
        Ok((!ours.is_empty()).then_some(log))
    })
    .with_context(|| {
        let log = daemon.log();
        let skipped: Vec<&str> = log.lines().filter(|l| l.contains("SKIPPED")).collect();
        format!(
            "our cookies {cookies:?}; SKIPPED lines:\n{}",
            skipped.join("\n")
        )
    })?;
    // Read from a file (as from journald), the log is plain text: no colour escape codes.
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a log written to a file:\n{log}"
    );
    for line in &ours {
        assert!(line.contains(" WARN "), "not a warning: {line}");
        assert!(line.contains("containerd"), "creator not named: {line}");
        for key in ["netns_inode", "evidence", "skips_from_creator"] {
            assert!(field(line, key).is_some(), "{key} missing: {line}");
        }
    }
    let counts: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("VERDICT SKIPPED") && l.contains("containerd"))
        .filter_map(|l| field(l, "skips_from_creator")?.parse().ok())
        .collect();
    assert!(
        counts.iter().all(|c| c.is_power_of_two()),
        "only the 1st, 2nd, 4th... skip is logged: {counts:?}"
    );
    assert!(
        counts.windows(2).all(|w| w[0] < w[1]),
        "the count grows: {counts:?}"
    );
    let skips = counts.last().copied().unwrap_or_default();
    assert!(
        skips >= 4 && counts.len() < usize::try_from(skips)? + 1,
        "{SKIPPED} skips summarised in fewer lines: {counts:?}\n{log}"
    );
    Ok(())
}
