//! Plugin mode: one CNI invocation (env + stdin in, stdout + exit code out), with the real work
//! behind [`PluginBackend`] (in production a client of the daemon's socket).
//!
//! Order of checks: env (code 4) -> VERSION answered here -> config (6 / 7 / 1) -> verb allowed
//! in the config's version (1) -> verb inputs (`prevResult`, attachments: 7; netns: 3 / 4 / 5)
//! -> backend. Errors are printed as CNI error JSON on stdout, labelled with the request's
//! `cniVersion` when it is known and supported (else the newest), and exit with 1.

use std::path::Path;

use serde_json::Value;

use super::conf::{Attachment, NetConf, VALID_ATTACHMENTS_KEY, sniff_version};
use super::env::{Command, ContainerEnv, InvocationEnv, validate_netns_path};
use super::error::CniError;
use super::result::CniResult;
use super::version::{CniVersion, version_answer};

/// Exit code for every failure (the spec only asks for non-zero).
pub const EXIT_FAILURE: i32 = 1;

/// One ADD / DEL / CHECK: the validated container variables and network config.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub command: Command,
    pub env: ContainerEnv,
    pub conf: NetConf,
    /// The parsed `prevResult`. CHECK: always `Some`. ADD: `Some` when chained after another
    /// plugin. DEL: `None` when absent, or when unparseable (DEL must clean up regardless; the
    /// raw value stays in `conf.prev_result`).
    pub prev_result: Option<CniResult>,
}

/// What plugin mode needs from the daemon. Blocking is fine: the plugin process is short-lived.
pub trait PluginBackend {
    /// Attach the container; the result is printed in the request's version.
    fn add(&self, req: &Request) -> Result<CniResult, CniError>;
    /// Detach; should succeed when things are already gone.
    fn del(&self, req: &Request) -> Result<(), CniError>;
    /// Verify the attachment still matches `req.prev_result`.
    fn check(&self, req: &Request) -> Result<(), CniError>;
    /// Readiness: `Err` with code 50 / 51 (or 11 when the daemon is unreachable).
    fn status(&self, conf: &NetConf) -> Result<(), CniError>;
    /// Release everything of `conf.name` not in `valid`.
    fn gc(&self, conf: &NetConf, valid: &[Attachment]) -> Result<(), CniError>;
    /// Called for ADD and CHECK before `add` / `check`, in the plugin process (whose mount and
    /// net namespaces are the runtime's). Defaults to [`validate_netns_path`]; fakes override it.
    fn validate_netns(&self, path: &Path) -> Result<(), CniError> {
        validate_netns_path(path)
    }
}

/// A backend that accepts every request, for running [`run_plugin`] without a daemon (the fuzz
/// target, tests): ADD answers with the request's `prevResult` (an empty result without one),
/// every other verb succeeds. With `check_netns`, CNI_NETNS is checked as the trait's default
/// does ([`validate_netns_path`]); without it every path is accepted.
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptAll {
    pub check_netns: bool,
}

impl PluginBackend for AcceptAll {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        Ok(req.prev_result.clone().unwrap_or_default())
    }
    fn del(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn check(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn status(&self, _: &NetConf) -> Result<(), CniError> {
        Ok(())
    }
    fn gc(&self, _: &NetConf, _: &[Attachment]) -> Result<(), CniError> {
        Ok(())
    }
    fn validate_netns(&self, path: &Path) -> Result<(), CniError> {
        if self.check_netns {
            validate_netns_path(path)
        } else {
            Ok(())
        }
    }
}

/// What the plugin process prints and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOutput {
    pub stdout: Vec<u8>,
    pub exit_code: i32,
}

impl PluginOutput {
    fn success(body: Option<&Value>) -> Self {
        Self {
            stdout: body.map(json_line).unwrap_or_default(),
            exit_code: 0,
        }
    }

    fn failure(err: &CniError, version: CniVersion) -> Self {
        Self {
            stdout: json_line(&err.to_json(version)),
            exit_code: EXIT_FAILURE,
        }
    }
}

fn json_line(v: &Value) -> Vec<u8> {
    let mut out = v.to_string().into_bytes();
    out.push(b'\n');
    out
}

/// The most a network config on stdin may hold: runtimes pass a few KiB. A caller reads at most
/// one byte more, so that a larger stdin is refused without being held in memory.
pub const MAX_STDIN: usize = 1 << 20;

/// Runs one CNI invocation. `vars` is the process environment, `stdin` the bytes read from
/// stdin (reading them, and turning a read failure into code 5, is the caller's job).
pub fn run_plugin(
    vars: impl IntoIterator<Item = (String, String)>,
    stdin: &[u8],
    backend: &dyn PluginBackend,
) -> PluginOutput {
    if stdin.len() > MAX_STDIN {
        let err = CniError::decode(format!(
            "the network config on stdin is larger than {MAX_STDIN} bytes"
        ));
        return PluginOutput::failure(&err, CniVersion::LATEST);
    }
    let env = match InvocationEnv::from_vars(vars) {
        Ok(env) => env,
        Err(e) => {
            return PluginOutput::failure(&e, sniff_version(stdin).unwrap_or(CniVersion::LATEST));
        }
    };
    if env.command == Command::Version {
        return PluginOutput::success(Some(&version_answer()));
    }
    let conf = match NetConf::parse(stdin) {
        Ok(conf) => conf,
        Err(e) => {
            return PluginOutput::failure(&e, sniff_version(stdin).unwrap_or(CniVersion::LATEST));
        }
    };
    let version = conf.cni_version;
    match dispatch(env, conf, backend) {
        Ok(body) => PluginOutput::success(body.as_ref()),
        Err(e) => PluginOutput::failure(&e, version),
    }
}

fn dispatch(
    env: InvocationEnv,
    conf: NetConf,
    backend: &dyn PluginBackend,
) -> Result<Option<Value>, CniError> {
    let command = env.command;
    let version = conf.cni_version;
    let allowed = match command {
        Command::Check => version.supports_check(),
        Command::Status | Command::Gc => version.supports_status_and_gc(),
        Command::Add | Command::Del | Command::Version => true,
    };
    if !allowed {
        return Err(CniError::incompatible_version(format!(
            "cniVersion {version} does not support {command}"
        )));
    }
    match command {
        Command::Version => Ok(Some(version_answer())),
        Command::Status => backend.status(&conf).map(|()| None),
        Command::Gc => {
            // An absent list must not be read as "nothing is valid": that would delete everything.
            let valid = conf.valid_attachments.as_deref().ok_or_else(|| {
                CniError::invalid_config(format!(
                    "GC requires the network config field \"{VALID_ATTACHMENTS_KEY}\""
                ))
            })?;
            backend.gc(&conf, valid).map(|()| None)
        }
        Command::Add | Command::Del | Command::Check => {
            let Some(container) = env.container else {
                return Err(CniError::internal(format!(
                    "{command}: container variables were not parsed"
                )));
            };
            let prev_result = match (command, conf.prev_result.as_ref()) {
                (Command::Check, None) => {
                    return Err(CniError::invalid_config(
                        "CHECK requires the network config field \"prevResult\"",
                    ));
                }
                (Command::Del, Some(raw)) => CniResult::from_json(raw).ok(),
                (_, Some(raw)) => Some(CniResult::from_json(raw)?),
                (_, None) => None,
            };
            if command != Command::Del
                && let Some(netns) = &container.netns
            {
                backend.validate_netns(netns)?;
            }
            let req = Request {
                command,
                env: container,
                conf,
                prev_result,
            };
            match command {
                Command::Add => backend.add(&req).map(|r| Some(r.to_json(version))),
                Command::Del => backend.del(&req).map(|()| None),
                _ => backend.check(&req).map(|()| None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::path::PathBuf;

    use serde_json::json;

    use super::*;
    use crate::cni::result::tests::sample;

    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Add(Request),
        Del(Request),
        Check(Request),
        Status(String),
        Gc(String, Vec<Attachment>),
        Netns(PathBuf),
    }

    /// Records every call; answers with `fail` if set, else success (`sample()` for ADD).
    #[derive(Default)]
    struct Fake {
        calls: RefCell<Vec<Call>>,
        fail: Option<CniError>,
        netns_fail: Option<CniError>,
    }

    impl Fake {
        fn failing(e: CniError) -> Self {
            Self {
                fail: Some(e),
                ..Self::default()
            }
        }

        fn answer(&self, call: Call) -> Result<(), CniError> {
            self.calls.borrow_mut().push(call);
            self.fail.clone().map_or(Ok(()), Err)
        }

        fn calls(&self) -> Vec<Call> {
            self.calls.borrow().clone()
        }

        /// The backend calls, without the netns validation.
        fn backend_calls(&self) -> Vec<Call> {
            self.calls()
                .into_iter()
                .filter(|c| !matches!(c, Call::Netns(_)))
                .collect()
        }
    }

    impl PluginBackend for Fake {
        fn add(&self, req: &Request) -> Result<CniResult, CniError> {
            self.answer(Call::Add(req.clone())).map(|()| sample())
        }
        fn del(&self, req: &Request) -> Result<(), CniError> {
            self.answer(Call::Del(req.clone()))
        }
        fn check(&self, req: &Request) -> Result<(), CniError> {
            self.answer(Call::Check(req.clone()))
        }
        fn status(&self, conf: &NetConf) -> Result<(), CniError> {
            self.answer(Call::Status(conf.name.clone()))
        }
        fn gc(&self, conf: &NetConf, valid: &[Attachment]) -> Result<(), CniError> {
            self.answer(Call::Gc(conf.name.clone(), valid.to_vec()))
        }
        fn validate_netns(&self, path: &Path) -> Result<(), CniError> {
            self.calls.borrow_mut().push(Call::Netns(path.to_owned()));
            self.netns_fail.clone().map_or(Ok(()), Err)
        }
    }

    fn env(cmd: &str) -> Vec<(String, String)> {
        [
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "c0ffee"),
            ("CNI_NETNS", "/var/run/netns/cni-1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    fn without(mut vars: Vec<(String, String)>, key: &str) -> Vec<(String, String)> {
        vars.retain(|(k, _)| k != key);
        vars
    }

    fn conf(v: CniVersion) -> Value {
        json!({"cniVersion": v.as_str(), "name": "pod-network", "type": "provisioner",
               "ipam": {"subnet": "10.244.1.0/24"}})
    }

    fn with_prev(v: CniVersion) -> Value {
        let mut c = conf(v);
        c["prevResult"] = sample().to_json(v);
        c
    }

    fn run(vars: Vec<(String, String)>, stdin: &Value, fake: &dyn PluginBackend) -> (Value, i32) {
        let out = run_plugin(vars, stdin.to_string().as_bytes(), fake);
        (stdout_json(&out), out.exit_code)
    }

    fn stdout_json(out: &PluginOutput) -> Value {
        if out.stdout.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&out.stdout).expect("stdout is JSON")
        }
    }

    fn assert_error(out: &(Value, i32), code: u32, version: CniVersion, needle: &str) {
        let (j, exit) = out;
        assert_ne!(*exit, 0, "{j}");
        assert_eq!(j["code"], json!(code), "{j}");
        assert_eq!(j["cniVersion"], json!(version.as_str()), "{j}");
        let msg = j["msg"].as_str().expect("msg is a string");
        assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    }

    #[test]
    fn stdin_larger_than_the_bound_is_refused_undecoded() {
        let fake = Fake::default();
        let mut stdin = conf(CniVersion::LATEST).to_string().into_bytes();
        stdin.resize(MAX_STDIN + 1, b' ');
        let out = run_plugin(env("ADD"), &stdin, &fake);
        assert_error(
            &(stdout_json(&out), out.exit_code),
            CniError::DECODE_FAILURE,
            CniVersion::LATEST,
            "larger than 1048576 bytes",
        );
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
        stdin.truncate(MAX_STDIN);
        let out = run_plugin(env("ADD"), &stdin, &fake);
        assert_eq!(
            out.exit_code, 0,
            "a config padded to the bound is still read"
        );
    }

    // ---- the spec-version matrix ----

    #[test]
    fn add_prints_result_in_request_version() {
        for v in CniVersion::ALL {
            let fake = Fake::default();
            let (j, exit) = run(env("ADD"), &conf(v), &fake);
            assert_eq!(exit, 0, "{v}: {j}");
            assert_eq!(j, sample().to_json(v), "{v}");
            assert_eq!(j["cniVersion"], json!(v.as_str()));
            assert_eq!(j["ips"][0].get("version").is_some(), v < CniVersion::V1_0_0);
            let calls = fake.calls();
            assert_eq!(calls.len(), 2, "{calls:?}");
            assert_eq!(calls[0], Call::Netns("/var/run/netns/cni-1".into()));
            let Call::Add(req) = &calls[1] else {
                panic!("expected ADD, got {calls:?}")
            };
            assert_eq!(req.command, Command::Add);
            assert_eq!(req.env.container_id, "c0ffee");
            assert_eq!(req.env.ifname, "eth0");
            assert_eq!(req.env.netns, Some("/var/run/netns/cni-1".into()));
            assert_eq!(req.env.args.k8s_pod_name(), Some("web-0"));
            assert_eq!(req.conf.cni_version, v);
            assert_eq!(
                req.conf.get("ipam"),
                Some(&json!({"subnet": "10.244.1.0/24"}))
            );
            assert_eq!(req.prev_result, None);
        }
    }

    #[test]
    fn chained_add_gets_parsed_prev_result() {
        for v in CniVersion::ALL {
            let fake = Fake::default();
            let (_, exit) = run(env("ADD"), &with_prev(v), &fake);
            assert_eq!(exit, 0);
            let Some(Call::Add(req)) = fake.backend_calls().pop() else {
                panic!("no ADD")
            };
            assert_eq!(req.prev_result.map(|r| r.ips), Some(sample().ips));
        }
    }

    #[test]
    fn del_prints_nothing() {
        for v in CniVersion::ALL {
            for stdin in [conf(v), with_prev(v)] {
                let fake = Fake::default();
                let out = run_plugin(env("DEL"), stdin.to_string().as_bytes(), &fake);
                assert_eq!(
                    out,
                    PluginOutput {
                        stdout: vec![],
                        exit_code: 0
                    },
                    "{v}"
                );
                let calls = fake.calls();
                assert_eq!(calls.len(), 1, "DEL does not check the netns: {calls:?}");
                let Call::Del(req) = &calls[0] else {
                    panic!("expected DEL")
                };
                assert_eq!(req.prev_result.is_some(), stdin.get("prevResult").is_some());
            }
        }
    }

    #[test]
    fn del_without_netns_or_with_broken_prev_result_still_runs() {
        let fake = Fake::default();
        let mut vars = without(env("DEL"), "CNI_NETNS");
        vars.push(("CNI_NETNS".into(), String::new()));
        let mut stdin = conf(CniVersion::V1_0_0);
        stdin["prevResult"] = json!({"ips": [{"address": "garbage"}]});
        let (j, exit) = run(vars, &stdin, &fake);
        assert_eq!((j, exit), (Value::Null, 0));
        let calls = fake.calls();
        let [Call::Del(req)] = calls.as_slice() else {
            panic!("expected one DEL")
        };
        assert_eq!(req.env.netns, None);
        assert_eq!(req.prev_result, None);
        assert!(req.conf.prev_result.is_some(), "raw prevResult kept");
    }

    #[test]
    fn check_passes_prev_result() {
        for v in CniVersion::ALL.into_iter().filter(|v| v.supports_check()) {
            let fake = Fake::default();
            let (j, exit) = run(env("CHECK"), &with_prev(v), &fake);
            assert_eq!((j, exit), (Value::Null, 0), "{v}");
            let mut want = sample();
            if v < CniVersion::V1_1_0 {
                for i in &mut want.interfaces {
                    i.mtu = None;
                }
            }
            let calls = fake.calls();
            assert!(matches!(calls[0], Call::Netns(_)));
            let Call::Check(req) = &calls[1] else {
                panic!("expected CHECK")
            };
            assert_eq!(req.prev_result.as_ref(), Some(&want), "{v}");
        }
    }

    #[test]
    fn check_errors() {
        // Not in 0.3.1.
        let fake = Fake::default();
        let out = run(env("CHECK"), &with_prev(CniVersion::V0_3_1), &fake);
        assert_error(&out, 1, CniVersion::V0_3_1, "CHECK");
        // prevResult is mandatory, and must parse.
        let out = run(env("CHECK"), &conf(CniVersion::V1_0_0), &fake);
        assert_error(&out, 7, CniVersion::V1_0_0, "prevResult");
        let mut stdin = conf(CniVersion::V0_4_0);
        stdin["prevResult"] = json!({"ips": [{"address": "10.0.0.1"}]});
        let out = run(env("CHECK"), &stdin, &fake);
        assert_error(&out, 7, CniVersion::V0_4_0, "prevResult.ips[0].address");
        assert!(fake.calls().is_empty());
        // Backend failure passes through.
        let fake = Fake::failing(CniError::new(
            CniError::CHECK_FAILED,
            "route 0.0.0.0/0 missing",
        ));
        let out = run(env("CHECK"), &with_prev(CniVersion::V1_1_0), &fake);
        assert_error(&out, 105, CniVersion::V1_1_0, "route 0.0.0.0/0 missing");
    }

    // ---- error paths ----

    #[test]
    fn bad_env_is_code_4_naming_the_var() {
        for v in CniVersion::ALL {
            for cmd in ["ADD", "CHECK", "DEL"] {
                for var in ["CNI_CONTAINERID", "CNI_IFNAME"] {
                    let fake = Fake::default();
                    let out = run(without(env(cmd), var), &with_prev(v), &fake);
                    assert_error(&out, 4, v, var);
                    assert!(fake.calls().is_empty());
                }
            }
            let fake = Fake::default();
            let out = run(without(env("ADD"), "CNI_NETNS"), &conf(v), &fake);
            assert_error(&out, 4, v, "CNI_NETNS");
            let mut vars = env("ADD");
            vars.push(("CNI_IFNAME".into(), "a-very-long-ifname".into()));
            let out = run(vars, &conf(v), &fake);
            assert_error(&out, 4, v, "a-very-long-ifname");
            let out = run(without(env("ADD"), "CNI_COMMAND"), &conf(v), &fake);
            assert_error(&out, 4, v, "CNI_COMMAND");
            assert!(fake.calls().is_empty());
        }
        // Unknown version in stdin: errors are labelled with the newest.
        let out = run(vec![], &json!({"cniVersion": "9.0.0"}), &Fake::default());
        assert_error(&out, 4, CniVersion::LATEST, "CNI_COMMAND");
    }

    #[test]
    fn bad_json_is_code_6() {
        for cmd in ["ADD", "DEL", "CHECK", "STATUS", "GC"] {
            let fake = Fake::default();
            let out = run_plugin(env(cmd), b"{\"cniVersion\":", &fake);
            let j = stdout_json(&out);
            assert_ne!(out.exit_code, 0);
            assert_eq!(j["code"], json!(6), "{cmd}");
            assert_eq!(j["cniVersion"], json!(CniVersion::LATEST.as_str()));
            assert!(fake.calls().is_empty());
        }
    }

    #[test]
    fn missing_field_is_code_7() {
        for v in CniVersion::ALL {
            for field in ["name", "type"] {
                let mut stdin = conf(v);
                stdin.as_object_mut().expect("object").remove(field);
                let fake = Fake::default();
                let out = run(env("ADD"), &stdin, &fake);
                assert_error(&out, 7, v, field);
                assert!(fake.calls().is_empty());
            }
        }
        let out = run(
            env("ADD"),
            &json!({"name": "n", "type": "t"}),
            &Fake::default(),
        );
        assert_error(&out, 7, CniVersion::LATEST, "cniVersion");
    }

    #[test]
    fn unsupported_version_is_code_1() {
        for bad in ["0.1.0", "0.3.0", "1.2.0"] {
            let fake = Fake::default();
            let stdin = json!({"cniVersion": bad, "name": "n", "type": "t"});
            let out = run(env("ADD"), &stdin, &fake);
            assert_error(&out, 1, CniVersion::LATEST, bad);
            assert!(fake.calls().is_empty());
        }
    }

    #[test]
    fn backend_unreachable_code_11_passes_through() {
        for v in CniVersion::ALL {
            for cmd in ["ADD", "DEL", "CHECK", "STATUS", "GC"] {
                let allowed = match cmd {
                    "CHECK" => v.supports_check(),
                    "STATUS" | "GC" => v.supports_status_and_gc(),
                    _ => true,
                };
                if !allowed {
                    continue;
                }
                let e = CniError::try_again_later("provisioner daemon unreachable")
                    .with_details("connect /run/provisioner.sock: ENOENT");
                let fake = Fake::failing(e.clone());
                let mut stdin = with_prev(v);
                stdin["cni.dev/valid-attachments"] = json!([]);
                let out = run_plugin(env(cmd), stdin.to_string().as_bytes(), &fake);
                assert_eq!(out.exit_code, EXIT_FAILURE, "{v} {cmd}");
                assert_eq!(stdout_json(&out), e.to_json(v), "{v} {cmd}");
            }
        }
    }

    #[test]
    fn netns_rejection_stops_add_and_check() {
        for cmd in ["ADD", "CHECK"] {
            let fake = Fake {
                netns_fail: Some(CniError::invalid_env(
                    "invalid CNI_NETNS \"/x\": not a netns",
                )),
                ..Fake::default()
            };
            let out = run(env(cmd), &with_prev(CniVersion::V1_0_0), &fake);
            assert_error(&out, 4, CniVersion::V1_0_0, "CNI_NETNS");
            assert!(fake.backend_calls().is_empty(), "{cmd}");
        }
    }

    #[test]
    fn netns_validation_checks_the_path() {
        let mut vars = env("ADD");
        vars.push(("CNI_NETNS".into(), "/nonexistent/netns/pod".into()));
        let backend = AcceptAll { check_netns: true };
        let out = run(vars, &conf(CniVersion::V1_0_0), &backend);
        assert_error(&out, 3, CniVersion::V1_0_0, "/nonexistent/netns/pod");
    }

    // ---- VERSION, STATUS, GC ----

    #[test]
    fn version_needs_no_backend_nor_valid_stdin() {
        for stdin in [&b""[..], b"garbage", br#"{"cniVersion":"0.4.0"}"#] {
            let fake = Fake::failing(CniError::internal("must not be called"));
            let out = run_plugin(
                [("CNI_COMMAND".to_owned(), "VERSION".to_owned())],
                stdin,
                &fake,
            );
            assert_eq!(out.exit_code, 0);
            assert_eq!(stdout_json(&out), version_answer());
            assert!(fake.calls().is_empty());
        }
    }

    #[test]
    fn gc_passes_valid_attachments() {
        let fake = Fake::default();
        let mut stdin = conf(CniVersion::V1_1_0);
        stdin["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2", "ifname": "net1"}]);
        let vars = vec![("CNI_COMMAND".to_owned(), "GC".to_owned())];
        let (j, exit) = run(vars.clone(), &stdin, &fake);
        assert_eq!((j, exit), (Value::Null, 0));
        assert_eq!(
            fake.calls(),
            vec![Call::Gc(
                "pod-network".into(),
                vec![
                    Attachment {
                        container_id: "c1".into(),
                        ifname: "eth0".into()
                    },
                    Attachment {
                        container_id: "c2".into(),
                        ifname: "net1".into()
                    },
                ]
            )]
        );
        // Without the list GC refuses rather than collecting everything.
        let fake = Fake::default();
        let out = run(vars.clone(), &conf(CniVersion::V1_1_0), &fake);
        assert_error(&out, 7, CniVersion::V1_1_0, "cni.dev/valid-attachments");
        // Not before 1.1.0.
        stdin["cniVersion"] = json!("1.0.0");
        let out = run(vars, &stdin, &fake);
        assert_error(&out, 1, CniVersion::V1_0_0, "GC");
        assert!(fake.calls().is_empty());
    }

    #[test]
    fn status() {
        let vars = vec![("CNI_COMMAND".to_owned(), "STATUS".to_owned())];
        let fake = Fake::default();
        let (j, exit) = run(vars.clone(), &conf(CniVersion::V1_1_0), &fake);
        assert_eq!((j, exit), (Value::Null, 0));
        assert_eq!(fake.calls(), vec![Call::Status("pod-network".into())]);

        for code in [
            CniError::PLUGIN_NOT_AVAILABLE,
            CniError::LIMITED_CONNECTIVITY,
        ] {
            let fake = Fake::failing(CniError::new(code, "daemon not ready"));
            let out = run(vars.clone(), &conf(CniVersion::V1_1_0), &fake);
            assert_error(&out, code, CniVersion::V1_1_0, "daemon not ready");
        }
        for v in CniVersion::ALL
            .into_iter()
            .filter(|v| !v.supports_status_and_gc())
        {
            let fake = Fake::default();
            let out = run(vars.clone(), &conf(v), &fake);
            assert_error(&out, 1, v, "STATUS");
            assert!(fake.calls().is_empty());
        }
    }
}
