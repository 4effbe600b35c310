//! Malformed input through the plugin binary, as a runtime (or anyone who can run it) passes it:
//! each case answers its CNI code and a message naming what is wrong, promptly, and never reaches
//! the daemon (the socket named in the config does not exist: a case that got that far would
//! answer 11, "try again later"). Bad ranges are refused by the daemon (hostile.rs).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use provisioner_tests::provisioner_bin;
use serde_json::{Value, json};
use testkit::cni::run_with_stdin;

const ADD: &str = "ADD";

/// One invocation: the CNI variables (`None`: unset), stdin, and what must come back.
struct Case {
    what: &'static str,
    vars: Vec<(&'static str, Option<String>)>,
    stdin: Vec<u8>,
    code: u64,
    says: &'static str,
}

fn config(dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "malformed",
        "type": "provisioner",
        "socket": dir.join("nobody-listens.sock"),
        "ipam": {"ranges": [[{"subnet": "10.251.0.0/24"}]]}
    })
}

/// The variables of a well-formed ADD into `netns`, with `changes` applied.
fn vars(
    netns: &Path,
    changes: &[(&'static str, Option<&str>)],
) -> Vec<(&'static str, Option<String>)> {
    let mut vars = vec![
        ("CNI_COMMAND", Some(ADD.to_owned())),
        ("CNI_CONTAINERID", Some("malformed-0".to_owned())),
        ("CNI_NETNS", Some(netns.display().to_string())),
        ("CNI_IFNAME", Some("eth0".to_owned())),
        ("CNI_PATH", Some("/opt/cni/bin".to_owned())),
    ];
    for (name, value) in changes {
        if let Some(var) = vars.iter_mut().find(|(n, _)| n == name) {
            var.1 = value.map(str::to_owned);
        }
    }
    vars
}

fn run(case: &Case) -> Result<(Value, Duration)> {
    let mut cmd = std::process::Command::new(provisioner_bin());
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (name, value) in &case.vars {
        if let Some(value) = value {
            cmd.env(name, value);
        }
    }
    let started = Instant::now();
    let run = run_with_stdin(cmd, &case.stdin)?;
    let answer: Value = serde_json::from_str(&run.stdout)
        .with_context(|| format!("{}: stdout is not JSON: {:?}", case.what, run.stdout))?;
    assert_eq!(run.code, 1, "{}: exit code; {answer}", case.what);
    Ok((answer, started.elapsed()))
}

#[test]
fn malformed_input_answers_its_code_and_says_what_is_wrong() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let regular = dir.path().join("regular-file");
    std::fs::write(&regular, b"not a namespace")?;
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    let missing = dir.path().join("missing");
    // The node's (and the plugin's own) network namespace: the test runs in it.
    let own = PathBuf::from("/proc/self/ns/net");
    // Any well-formed sandbox netns path would do for the cases that fail before it is used.
    let netns = regular.clone();
    let good = serde_json::to_vec(&config(dir.path()))?;
    let with = |change: &dyn Fn(&mut Value)| -> Result<Vec<u8>> {
        let mut c = config(dir.path());
        change(&mut c);
        Ok(serde_json::to_vec(&c)?)
    };
    let mut oversized = good.clone();
    oversized.resize(2 << 20, b' ');

    let cases = [
        Case {
            what: "invalid JSON",
            vars: vars(&netns, &[]),
            stdin: br#"{"cniVersion": "1.0.0", "name": "#.to_vec(),
            code: 6,
            says: "",
        },
        Case {
            what: "a name that is not a string",
            vars: vars(&netns, &[]),
            stdin: with(&|c| c["name"] = json!(42))?,
            code: 7,
            says: "\"name\" must be a string",
        },
        Case {
            what: "unknown cniVersion",
            vars: vars(&netns, &[]),
            stdin: with(&|c| c["cniVersion"] = json!("9.9.9"))?,
            code: 1,
            says: "9.9.9",
        },
        Case {
            what: "stdin over the bound",
            vars: vars(&netns, &[]),
            stdin: oversized,
            code: 6,
            says: "larger than 1048576 bytes",
        },
        Case {
            what: "no CNI_CONTAINERID",
            vars: vars(&netns, &[("CNI_CONTAINERID", None)]),
            stdin: good.clone(),
            code: 4,
            says: "CNI_CONTAINERID",
        },
        Case {
            what: "no CNI_IFNAME",
            vars: vars(&netns, &[("CNI_IFNAME", None)]),
            stdin: good.clone(),
            code: 4,
            says: "CNI_IFNAME",
        },
        Case {
            what: "no CNI_NETNS for ADD",
            vars: vars(&netns, &[("CNI_NETNS", None)]),
            stdin: good.clone(),
            code: 4,
            says: "CNI_NETNS",
        },
        Case {
            what: "unknown CNI_COMMAND",
            vars: vars(&netns, &[("CNI_COMMAND", Some("EXPLODE"))]),
            stdin: good.clone(),
            code: 4,
            says: "EXPLODE",
        },
        Case {
            what: "a control character in the container id",
            vars: vars(&netns, &[("CNI_CONTAINERID", Some("bad\u{1}id"))]),
            stdin: good.clone(),
            code: 4,
            says: "CNI_CONTAINERID",
        },
        Case {
            what: "a control character in the ifname",
            vars: vars(&netns, &[("CNI_IFNAME", Some("eth\u{1}"))]),
            stdin: good.clone(),
            code: 4,
            says: "CNI_IFNAME",
        },
        Case {
            what: "an ifname over 15 bytes",
            vars: vars(&netns, &[("CNI_IFNAME", Some("eth0123456789abc"))]),
            stdin: good.clone(),
            code: 4,
            says: "CNI_IFNAME",
        },
        Case {
            what: "netns: a regular file",
            vars: vars(&regular, &[]),
            stdin: good.clone(),
            code: 4,
            says: "regular-file",
        },
        Case {
            what: "netns: a FIFO (must not hang)",
            vars: vars(&fifo, &[]),
            stdin: good.clone(),
            code: 4,
            says: "fifo",
        },
        Case {
            what: "netns: missing",
            vars: vars(&missing, &[]),
            stdin: good.clone(),
            code: 3,
            says: "missing\": cannot open: No such file",
        },
        Case {
            what: "netns: the plugin's own (the node's)",
            vars: vars(&own, &[]),
            stdin: good.clone(),
            code: 4,
            says: "own network namespace",
        },
    ];
    let mut wrong = Vec::new();
    for case in &cases {
        let (answer, took) = run(case)?;
        let msg = answer["msg"].as_str().unwrap_or_default();
        if answer["code"] != case.code || !msg.contains(case.says) || msg.is_empty() {
            wrong.push(format!(
                "{}: want code {} saying {:?}, got {answer}",
                case.what, case.code, case.says
            ));
        }
        if took > Duration::from_secs(10) {
            wrong.push(format!("{}: answered after {took:?}", case.what));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}
