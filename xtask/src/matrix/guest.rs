//! What runs on each kernel of the matrix (in its VM, or on the host): the kernel watch's
//! backends as the product reports them, then the kernel-level tests, each result written as
//! one line the harness checks (a guest's exit code does not come back through vng).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};

/// What the lines of a run start with.
pub const LINE: &str = "PROVISIONER-MATRIX";
/// The file in a run's directory that holds its lines.
pub const RESULTS: &str = "results.txt";

/// One module of a test binary and the tests of it to run.
#[derive(Clone, Debug)]
pub struct TestModule {
    /// The module, e.g. `trace_verdicts`.
    pub module: String,
    /// The test binary that holds it.
    pub executable: PathBuf,
    /// The tests' names within the module.
    pub names: Vec<String>,
}

impl TestModule {
    /// `module=/path/to/exe:name1,name2` (how a plan file names it).
    pub fn to_arg(&self) -> String {
        format!(
            "{}={}:{}",
            self.module,
            self.executable.display(),
            self.names.join(",")
        )
    }

    pub fn from_arg(arg: &str) -> Result<Self> {
        let (module, rest) = arg.split_once('=').context("MODULE=EXE:NAMES")?;
        let (exe, names) = rest.rsplit_once(':').context("MODULE=EXE:NAMES")?;
        Ok(Self {
            module: module.to_owned(),
            executable: PathBuf::from(exe),
            names: names.split(',').map(str::to_owned).collect(),
        })
    }

    /// A test's full name in its binary (`module::name`).
    fn path(&self, name: &str) -> String {
        format!("{}::{name}", self.module)
    }
}

/// A run's options: where its lines and logs go, the tests, and the environment the tests get
/// (a time scale under emulation, backends to force).
#[derive(Clone, Debug)]
pub struct Plan {
    pub out: PathBuf,
    pub provisioner: PathBuf,
    pub tests: Vec<TestModule>,
    pub env: Vec<(String, String)>,
}

impl Plan {
    /// The plan as a file's lines (a guest reads it: the kernel's command line, which carries
    /// the guest's command, is too short for the list of tests).
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "out {}\nprovisioner {}\n",
            self.out.display(),
            self.provisioner.display()
        );
        for (key, value) in &self.env {
            text.push_str(&format!("env {key}={value}\n"));
        }
        for test in &self.tests {
            text.push_str(&format!("test {}\n", test.to_arg()));
        }
        text
    }

    pub fn from_text(text: &str) -> Result<Self> {
        let mut plan = Plan {
            out: PathBuf::new(),
            provisioner: PathBuf::new(),
            tests: Vec::new(),
            env: Vec::new(),
        };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (key, value) = line.split_once(' ').context("a plan line is KEY VALUE")?;
            match key {
                "out" => plan.out = PathBuf::from(value),
                "provisioner" => plan.provisioner = PathBuf::from(value),
                "env" => {
                    let (k, v) = value.split_once('=').context("env KEY=VALUE")?;
                    plan.env.push((k.to_owned(), v.to_owned()));
                }
                "test" => plan.tests.push(TestModule::from_arg(value)?),
                other => anyhow::bail!("unknown plan line {other}"),
            }
        }
        Ok(plan)
    }
}

/// Runs `plan` here: prints (and appends to `plan.out/results.txt`) one line per backend and
/// per test, and an end line; true when every test passed.
pub fn run(plan: &Plan) -> Result<bool> {
    std::fs::create_dir_all(&plan.out)?;
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    let mut lines = Lines::open(&plan.out.join(RESULTS))?;
    lines.say(&format!("{LINE}-BEGIN kernel={kernel}"))?;
    for (observation, backend) in backends(plan)? {
        lines.say(&format!(
            "{LINE}-BACKEND kernel={kernel} observation={observation} backend={backend}"
        ))?;
    }
    let (mut passed, mut failed) = (0, 0);
    for module in &plan.tests {
        let (secs, log, outcomes) = run_module(plan, module)?;
        for name in &module.names {
            let path = module.path(name);
            let result = outcomes
                .iter()
                .find(|(n, _)| *n == path)
                .map_or("missing", |(_, r)| r.as_str());
            if result == "ok" {
                passed += 1;
            } else {
                failed += 1;
            }
            lines.say(&format!(
                "{LINE} kernel={kernel} test={path} result={result}"
            ))?;
        }
        lines.say(&format!(
            "{LINE}-MODULE kernel={kernel} module={} secs={secs:.1} log={}",
            module.module,
            log.display()
        ))?;
    }
    lines.say(&format!(
        "{LINE}-END kernel={kernel} passed={passed} failed={failed}"
    ))?;
    Ok(failed == 0)
}

/// What running one module's tests gave: its time, its log, each test's outcome.
type Outcome = Result<(f64, PathBuf, Vec<(String, String)>)>;

/// Runs the tests of `module`, its output into `<out>/<module>.log`. One module at a time: in
/// a guest of one vCPU, the kernel watch of a test's daemon (a background thread, nice +10)
/// starved for minutes beside a second module's work.
fn run_module(plan: &Plan, module: &TestModule) -> Outcome {
    let started = Instant::now();
    let log = plan.out.join(format!("{}.log", module.module));
    let output = Command::new(&module.executable)
        .args(module.names.iter().map(|n| module.path(n)))
        .args(["--exact", "--test-threads", "2"])
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", module.executable.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(&log, &text)?;
    Ok((started.elapsed().as_secs_f64(), log, outcomes(&text)))
}

/// Each observation and its backend, as `provisioner trace` reports them when it starts (the
/// backends `plan.env` forces included).
fn backends(plan: &Plan) -> Result<Vec<(String, String)>> {
    let mut cmd = Command::new(&plan.provisioner);
    cmd.args(["trace", "--duration", "0.2", "--verdicts-only", "--json"]);
    if let Some((_, forced)) = plan
        .env
        .iter()
        .find(|(k, _)| k == testkit::daemon::TRACE_BACKENDS_ENV)
    {
        for choice in forced.split(',') {
            cmd.arg("--backend").arg(choice.trim());
        }
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .context("provisioner trace")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let started = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["report"] == "started");
    let Some(started) = started else {
        return Ok(vec![(
            "kernel_watch".into(),
            format!(
                "unavailable:{}",
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .replace(' ', "_")
            ),
        )]);
    };
    Ok(started["observations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["observation"].as_str().unwrap_or("?").to_owned(),
                o["backend"].as_str().unwrap_or("unavailable").to_owned(),
            )
        })
        .collect())
}

/// `(test name, ok | FAILED | ignored)` of each `test NAME ... RESULT` line of libtest.
fn outcomes(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("test ")?;
            let (name, result) = rest.split_once(" ... ")?;
            let result = result.split_whitespace().next()?;
            Some((name.trim().to_owned(), result.to_lowercase()))
        })
        .collect()
}

/// Lines printed and appended to the results file at once.
struct Lines(std::fs::File);

impl Lines {
    fn open(path: &Path) -> Result<Self> {
        Ok(Self(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("open {}", path.display()))?,
        ))
    }

    fn say(&mut self, line: &str) -> Result<()> {
        println!("{line}");
        writeln!(self.0, "{line}")?;
        self.0.sync_data()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_lines_give_each_tests_outcome() {
        let text = "running 2 tests\ntest a ... ok\ntest b::c ... FAILED\ntest slow has been running for over 60 seconds\ntest d ... ignored, needs x\n";
        assert_eq!(
            outcomes(text),
            vec![
                ("a".into(), "ok".into()),
                ("b::c".into(), "failed".into()),
                ("d".into(), "ignored,".into()),
            ]
        );
    }

    #[test]
    fn a_plan_round_trips_through_its_file() -> Result<()> {
        let plan = Plan {
            out: PathBuf::from("/w/target/kernel-matrix/5.10"),
            provisioner: PathBuf::from("/w/target/debug/provisioner"),
            tests: vec![TestModule {
                module: "trace_verdicts".into(),
                executable: PathBuf::from("/w/target/debug/deps/integration-1234"),
                names: vec!["a".into(), "b".into()],
            }],
            env: vec![("K".into(), "v=1,w".into())],
        };
        let back = Plan::from_text(&plan.to_text())?;
        assert_eq!(back.out, plan.out);
        assert_eq!(back.provisioner, plan.provisioner);
        assert_eq!(back.env, plan.env);
        assert_eq!(back.tests[0].module, "trace_verdicts");
        assert_eq!(back.tests[0].executable, plan.tests[0].executable);
        assert_eq!(back.tests[0].names, plan.tests[0].names);
        Ok(())
    }
}
