//! The matrix's report: one row per kernel (and host run) from the lines its run wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::guest::{LINE, RESULTS};
use super::kernels::GuestKernel;

/// What one run reported.
#[derive(Debug)]
pub struct Row {
    pub label: String,
    /// The production kernels it stands in for.
    pub stands_in_for: String,
    /// The Debian package booted (`None` for the host).
    pub package: Option<String>,
    /// Observation → backend.
    pub backends: BTreeMap<String, String>,
    /// Test → result (`ok`, `failed`, `missing`).
    pub tests: BTreeMap<String, String>,
    /// Whether the run wrote its end line.
    pub ended: bool,
    pub dir: PathBuf,
}

impl Row {
    /// The row of the run whose lines are in `dir/results.txt`.
    pub fn read(label: String, kernel: Option<&GuestKernel>, dir: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(dir.join(RESULTS)).unwrap_or_default();
        let mut row = Self {
            label,
            stands_in_for: kernel.map_or_else(String::new, |k| k.series.stands_in_for.to_owned()),
            package: kernel.map(|k| format!("{} {}", k.package, k.version)),
            backends: BTreeMap::new(),
            tests: BTreeMap::new(),
            ended: false,
            dir: dir.to_path_buf(),
        };
        for line in text.lines() {
            let fields = fields(line);
            if line.starts_with(&format!("{LINE}-BACKEND ")) {
                if let (Some(o), Some(b)) = (fields.get("observation"), fields.get("backend")) {
                    row.backends.insert((*o).to_owned(), (*b).to_owned());
                }
            } else if line.starts_with(&format!("{LINE} ")) {
                if let (Some(t), Some(r)) = (fields.get("test"), fields.get("result")) {
                    row.tests.insert((*t).to_owned(), (*r).to_owned());
                }
            } else if line.starts_with(&format!("{LINE}-END ")) {
                row.ended = true;
            }
        }
        Ok(row)
    }

    fn passed(&self) -> usize {
        self.tests.values().filter(|r| *r == "ok").count()
    }

    fn failed(&self) -> Vec<&str> {
        self.tests
            .iter()
            .filter(|(_, r)| *r != "ok")
            .map(|(t, _)| t.as_str())
            .collect()
    }
}

/// `key=value` fields of a line.
fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .collect()
}

/// The observations as the product names them, in the order of its status.
const OBSERVATIONS: [&str; 7] = [
    "clones",
    "unshare_and_mounts",
    "rtnetlink",
    "error_messages",
    "devices",
    "execs",
    "namespace_ids",
];

/// The report as a Markdown table (docs/install.md's kernel table): each kernel, what it
/// stands in for, the tests passed, and each observation's backend.
pub fn markdown(rows: &[Row]) -> String {
    let mut text = String::from("| kernel | stands in for | kernel-level tests |");
    for o in OBSERVATIONS {
        text.push_str(&format!(" {o} |"));
    }
    text.push_str("\n|---|---|---|");
    text.push_str(&"---|".repeat(OBSERVATIONS.len()));
    text.push('\n');
    for row in rows {
        let label = match &row.package {
            Some(p) => format!("{} ({p})", row.label),
            None => row.label.clone(),
        };
        let tests = if row.ended {
            format!("{} of {} passed", row.passed(), row.tests.len())
        } else {
            format!("did not finish ({} passed)", row.passed())
        };
        text.push_str(&format!("| {label} | {} | {tests} |", row.stands_in_for));
        for o in OBSERVATIONS {
            let backend = row.backends.get(o).map_or("-", String::as_str);
            text.push_str(&format!(" {backend} |"));
        }
        text.push('\n');
    }
    text
}

/// Fails naming every test that did not pass on some kernel, and where its log is.
pub fn failures(rows: &[Row], out: &Path) -> Result<()> {
    let mut problems = Vec::new();
    for row in rows {
        if !row.ended {
            problems.push(format!(
                "{}: the run did not finish (see {})",
                row.label,
                row.dir.display()
            ));
        }
        for test in row.failed() {
            let target = test.split("::").next().unwrap_or(test);
            let log = row.dir.join(format!("{target}.log"));
            let excerpt = std::fs::read_to_string(&log)
                .ok()
                .and_then(|text| failure_excerpt(&text, test))
                .unwrap_or_default();
            problems.push(format!(
                "{}: {test} {} (log: {}){excerpt}",
                row.label,
                row.tests[test],
                log.display()
            ));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "the kernel matrix failed ({} problems; report {}):\n{}",
        problems.len(),
        out.join("report.md").display(),
        problems.join("\n")
    )
}

/// Lines of a failed test's own section in a libtest log (its captured output and panic
/// message, not the backtrace), indented, at most [`EXCERPT_LINES`] of them: what a CI log
/// shows of the failure.
fn failure_excerpt(log: &str, test: &str) -> Option<String> {
    let header = format!("---- {test} stdout ----");
    let start = log.find(&header)? + header.len();
    let section: Vec<&str> = log[start..]
        .lines()
        .take_while(|l| {
            !l.starts_with("---- ") && *l != "failures:" && !l.starts_with("stack backtrace:")
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    let skipped = section.len().saturating_sub(EXCERPT_LINES);
    let mut text = String::new();
    if skipped > 0 {
        text.push_str(&format!("\n    ({skipped} earlier lines in the log)"));
    }
    for line in &section[skipped..] {
        text.push_str("\n    ");
        text.push_str(line);
    }
    Some(text)
}

const EXCERPT_LINES: usize = 40;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_read_from_its_lines_and_a_missing_end_is_a_failure() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join(RESULTS),
            format!(
                "{LINE}-BEGIN kernel=5.10\n{LINE}-BACKEND kernel=5.10 observation=rtnetlink backend=syscall_tracepoints\n{LINE} kernel=5.10 test=t::a result=ok\n{LINE} kernel=5.10 test=t::b result=failed\n"
            ),
        )?;
        std::fs::write(
            dir.path().join("t.log"),
            "running 2 tests\ntest t::a ... ok\ntest t::b ... FAILED\n\nfailures:\n\n---- t::b stdout ----\n\nthread 't::b' panicked at x.rs:1:1:\nassertion `left == right` failed: Partial\nstack backtrace:\n   0: std::panicking::begin_panic\n\nfailures:\n    t::b\n",
        )?;
        let row = Row::read("5.10".into(), None, dir.path())?;
        assert_eq!(row.backends["rtnetlink"], "syscall_tracepoints");
        assert_eq!(row.passed(), 1);
        assert_eq!(row.failed(), vec!["t::b"]);
        assert!(!row.ended);
        let err = failures(&[row], dir.path()).expect_err("a failure and no end");
        assert!(err.to_string().contains("did not finish"), "{err}");
        assert!(err.to_string().contains("t::b failed"), "{err}");
        assert!(
            err.to_string()
                .contains("\n    assertion `left == right` failed: Partial"),
            "the failure's own lines: {err}"
        );
        assert!(!err.to_string().contains("running 2 tests"), "{err}");
        assert!(
            !err.to_string().contains("begin_panic"),
            "no backtrace: {err}"
        );
        Ok(())
    }

    #[test]
    fn the_table_has_a_column_per_observation() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join(RESULTS),
            format!(
                "{LINE}-BACKEND kernel=k observation=rtnetlink backend=btf_tracepoint\n{LINE} kernel=k test=t::a result=ok\n{LINE}-END kernel=k passed=1 failed=0\n"
            ),
        )?;
        let row = Row::read("6.18".into(), None, dir.path())?;
        let table = markdown(&[row]);
        assert!(
            table.starts_with("| kernel | stands in for | kernel-level tests | clones |"),
            "{table}"
        );
        assert!(
            table.contains("| 6.18 |  | 1 of 1 passed | - | - | btf_tracepoint | - | - | - | - |"),
            "{table}"
        );
        Ok(())
    }
}
