//! A short soak: 2,000 ADD+DEL cycles from 16 callers against the daemon with tracing on.
//! Every ADD and DEL succeeds, and the end (resident memory, fds, threads, store file size,
//! node links) stays within bounds of the start. `cargo xtask soak` runs
//! the long one against the release build. Needs root.

use anyhow::{Result, ensure};
use provisioner_tests::provisioner_bin;
use testkit::soak::{self, Bounds, Sample};

#[test]
fn two_thousand_add_del_cycles_leave_the_daemon_where_it_started() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut rows = vec![Sample::header()];
    let samples = soak::run(
        &provisioner_bin(),
        dir.path(),
        &soak::Options {
            cycles: 2_000,
            callers: 16,
            every: 500,
        },
        |s| rows.push(s.row()),
    )?;
    let table = rows.join("\n");
    eprintln!("{table}");
    ensure!(samples.len() == 5, "{table}");
    // Timings are measured by `cargo xtask soak`, not asserted here: latency and CPU per
    // cycle are in the table; what a leak leaves behind is bounded.
    let bounds = Bounds {
        add_p50_growth: None,
        cpu_per_cycle_growth: None,
        ..Bounds::default()
    };
    let violations = soak::violations(&samples, &bounds);
    ensure!(violations.is_empty(), "{violations:#?}\n{table}");
    Ok(())
}
