//! The `CNI_*` environment: which verb, which container, which interface.
//!
//! Required variables per verb (spec 1.1.0, "Parameters"):
//!
//! | verb            | required                                   | optional             |
//! |-----------------|--------------------------------------------|----------------------|
//! | ADD, CHECK      | `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME` | `CNI_ARGS`, `CNI_PATH` |
//! | DEL             | `CNI_CONTAINERID`, `CNI_IFNAME`            | `CNI_NETNS` (may be empty), `CNI_ARGS`, `CNI_PATH` |
//! | VERSION, STATUS, GC | none besides `CNI_COMMAND`             | `CNI_PATH` (container vars are ignored) |
//!
//! The spec lists `CNI_PATH` as required for GC; provisioner never delegates to other plugins,
//! so it is accepted but never demanded. Every failure here is code 4 naming the variable.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::error::CniError;

pub const CNI_COMMAND: &str = "CNI_COMMAND";
pub const CNI_CONTAINERID: &str = "CNI_CONTAINERID";
pub const CNI_NETNS: &str = "CNI_NETNS";
pub const CNI_IFNAME: &str = "CNI_IFNAME";
pub const CNI_ARGS: &str = "CNI_ARGS";
pub const CNI_PATH: &str = "CNI_PATH";

/// The `CNI_COMMAND` verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub const ALL: [Command; 6] = [
        Self::Add,
        Self::Del,
        Self::Check,
        Self::Version,
        Self::Status,
        Self::Gc,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Status => "STATUS",
            Self::Gc => "GC",
        }
    }

    /// ADD, DEL and CHECK act on one container attachment and need the container variables.
    pub fn is_container_verb(self) -> bool {
        matches!(self, Self::Add | Self::Del | Self::Check)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Command {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| CniError::invalid_env(format!("unknown {CNI_COMMAND} \"{s}\"")))
    }
}

/// `CNI_ARGS`: `K=V;K=V`. All pairs are kept in order; the Kubernetes ones have accessors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pairs: Vec<(String, String)>,
}

impl CniArgs {
    pub const K8S_POD_NAMESPACE: &'static str = crate::pod::K8S_POD_NAMESPACE;
    pub const K8S_POD_NAME: &'static str = crate::pod::K8S_POD_NAME;
    pub const K8S_POD_INFRA_CONTAINER_ID: &'static str = crate::pod::K8S_POD_INFRA_CONTAINER_ID;
    pub const K8S_POD_UID: &'static str = crate::pod::K8S_POD_UID;

    /// Parses `K=V;K=V`. Empty segments are skipped; a segment without `=` or with an empty key
    /// is code 4. A value may itself contain `=`.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        let mut pairs = Vec::new();
        for seg in s.split(';') {
            if seg.is_empty() {
                continue;
            }
            match seg.split_once('=') {
                Some((k, v)) if !k.is_empty() => pairs.push((k.to_owned(), v.to_owned())),
                _ => {
                    return Err(CniError::invalid_env(format!(
                        "invalid {CNI_ARGS} \"{s}\": pair \"{seg}\" is not KEY=VALUE"
                    )));
                }
            }
        }
        Ok(Self { pairs })
    }

    /// The last value given for `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn k8s_pod_namespace(&self) -> Option<&str> {
        self.get(Self::K8S_POD_NAMESPACE)
    }

    pub fn k8s_pod_name(&self) -> Option<&str> {
        self.get(Self::K8S_POD_NAME)
    }

    pub fn k8s_pod_infra_container_id(&self) -> Option<&str> {
        self.get(Self::K8S_POD_INFRA_CONTAINER_ID)
    }

    pub fn k8s_pod_uid(&self) -> Option<&str> {
        self.get(Self::K8S_POD_UID)
    }

    /// The pod these arguments name (see [`crate::pod::Pod::from_pairs`]).
    pub fn pod(&self) -> Option<crate::pod::Pod> {
        crate::pod::Pod::from_pairs(self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

/// The container variables of ADD / DEL / CHECK, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEnv {
    pub container_id: String,
    /// `None` only for DEL with an empty or absent `CNI_NETNS`.
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: CniArgs,
}

/// The `CNI_*` environment of one plugin invocation, parsed and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvocationEnv {
    pub command: Command,
    /// `Some` exactly for ADD, DEL and CHECK.
    pub container: Option<ContainerEnv>,
    /// `CNI_PATH` split on `:`, empty entries dropped.
    pub path: Vec<PathBuf>,
}

impl InvocationEnv {
    /// Reads the `CNI_*` variables out of `vars` (other variables are ignored; a repeated one:
    /// the last wins) and validates them for the verb.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Self, CniError> {
        let mut command = None;
        let mut container_id = None;
        let mut netns = None;
        let mut ifname = None;
        let mut args = None;
        let mut path = None;
        for (k, v) in vars {
            let slot = match k.as_str() {
                CNI_COMMAND => &mut command,
                CNI_CONTAINERID => &mut container_id,
                CNI_NETNS => &mut netns,
                CNI_IFNAME => &mut ifname,
                CNI_ARGS => &mut args,
                CNI_PATH => &mut path,
                _ => continue,
            };
            *slot = Some(v);
        }

        let command: Command = match command.as_deref() {
            None | Some("") => {
                return Err(CniError::invalid_env(format!(
                    "required environment variable {CNI_COMMAND} missing"
                )));
            }
            Some(c) => c.parse()?,
        };
        let path = path
            .as_deref()
            .unwrap_or("")
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        if !command.is_container_verb() {
            return Ok(Self {
                command,
                container: None,
                path,
            });
        }

        let netns = netns.filter(|n| !n.is_empty());
        let mut missing = Vec::new();
        if container_id.as_deref().is_none_or(str::is_empty) {
            missing.push(CNI_CONTAINERID);
        }
        if netns.is_none() && command != Command::Del {
            missing.push(CNI_NETNS);
        }
        if ifname.as_deref().is_none_or(str::is_empty) {
            missing.push(CNI_IFNAME);
        }
        if !missing.is_empty() {
            return Err(CniError::invalid_env(format!(
                "required environment variables missing for {command}: {}",
                missing.join(", ")
            )));
        }
        let container_id = container_id.unwrap_or_default();
        let ifname = ifname.unwrap_or_default();
        validate_container_id(&container_id)?;
        validate_ifname(&ifname)?;
        let netns = netns.map(PathBuf::from);
        if let Some(n) = &netns
            && !n.is_absolute()
        {
            return Err(CniError::invalid_env(format!(
                "invalid {CNI_NETNS} \"{}\": not an absolute path",
                n.display()
            )));
        }
        let args = CniArgs::parse(args.as_deref().unwrap_or(""))?;
        Ok(Self {
            command,
            container: Some(ContainerEnv {
                container_id,
                netns,
                ifname,
                args,
            }),
            path,
        })
    }
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (see [`crate::names::container_id`]), else
/// code 4 naming `CNI_CONTAINERID`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    crate::names::container_id(id)
        .map_err(|e| CniError::invalid_env(format!("{CNI_CONTAINERID}: {e}")))
}

/// A Linux interface name (see [`crate::names::ifname`]), else code 4 naming
/// `CNI_IFNAME`.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    crate::names::ifname(name).map_err(|e| CniError::invalid_env(format!("{CNI_IFNAME}: {e}")))
}

/// Checks that `path` names a network namespace other than this process's own (the check
/// the dataplane makes too, see [`crate::nsfs`]). Missing path -> code 3 (no container,
/// nothing to clean up); not a network namespace file, or our own netns -> code 4 naming
/// `CNI_NETNS`; other I/O -> code 5.
pub fn validate_netns_path(path: &Path) -> Result<(), CniError> {
    use crate::nsfs::NetnsFileError;
    let shown = path.display();
    crate::nsfs::check_netns_path(path, "the plugin's own network namespace").map_err(|err| {
        match err {
            NetnsFileError::Bad(reason) => {
                CniError::invalid_env(format!("invalid {CNI_NETNS} \"{shown}\": {reason}"))
            }
            NetnsFileError::Io(source) if source.kind() == std::io::ErrorKind::NotFound => {
                CniError::new(
                    CniError::UNKNOWN_CONTAINER,
                    format!("{CNI_NETNS} \"{shown}\": cannot open: {source}"),
                )
            }
            NetnsFileError::Io(source) => CniError::new(
                CniError::IO_FAILURE,
                format!("{CNI_NETNS} \"{shown}\": cannot open: {source}"),
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn full(cmd: &str) -> Vec<(String, String)> {
        vars(&[
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/var/run/netns/cni-1"),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "K8S_POD_UID=u-1;IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc123",
            ),
            ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
            ("HOME", "/root"),
        ])
    }

    fn err_of(v: Vec<(String, String)>) -> CniError {
        InvocationEnv::from_vars(v).expect_err("must be rejected")
    }

    #[test]
    fn add_parses_everything() {
        let env = InvocationEnv::from_vars(full("ADD")).expect("valid env");
        assert_eq!(env.command, Command::Add);
        assert_eq!(
            env.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        let c = env.container.expect("container vars");
        assert_eq!(c.container_id, "abc123");
        assert_eq!(c.netns, Some(PathBuf::from("/var/run/netns/cni-1")));
        assert_eq!(c.ifname, "eth0");
        assert_eq!(c.args.k8s_pod_namespace(), Some("default"));
        assert_eq!(c.args.k8s_pod_name(), Some("web-0"));
        assert_eq!(c.args.k8s_pod_infra_container_id(), Some("abc123"));
        assert_eq!(c.args.k8s_pod_uid(), Some("u-1"));
        assert_eq!(c.args.get("IgnoreUnknown"), Some("1"));
    }

    #[test]
    fn every_command_parses() {
        for c in Command::ALL {
            let env = InvocationEnv::from_vars(full(c.as_str())).expect("valid env");
            assert_eq!(env.command, c);
            assert_eq!(env.container.is_some(), c.is_container_verb());
        }
    }

    #[test]
    fn missing_or_unknown_command_is_code_4() {
        let e = err_of(vars(&[("CNI_IFNAME", "eth0")]));
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("CNI_COMMAND"), "{}", e.msg);
        let e = err_of(vars(&[("CNI_COMMAND", "ATTACH")]));
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("CNI_COMMAND") && e.msg.contains("ATTACH"));
        // Case matters: the spec's verbs are upper case.
        assert_eq!(err_of(vars(&[("CNI_COMMAND", "add")])).code, 4);
    }

    #[test]
    fn required_vars_per_verb() {
        for cmd in ["ADD", "CHECK", "DEL"] {
            for var in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"] {
                let mut v = full(cmd);
                v.retain(|(k, _)| k != var);
                let r = InvocationEnv::from_vars(v);
                if cmd == "DEL" && var == "CNI_NETNS" {
                    let env = r.expect("DEL without netns is fine");
                    assert_eq!(env.container.expect("container").netns, None);
                    continue;
                }
                let e = r.expect_err("missing var");
                assert_eq!(e.code, CniError::INVALID_ENV);
                assert!(e.msg.contains(var), "{cmd}: {}", e.msg);
            }
        }
        // Empty counts as missing, except for DEL's netns.
        let mut v = full("ADD");
        v.push(("CNI_NETNS".into(), String::new()));
        assert!(err_of(v).msg.contains("CNI_NETNS"));
        let mut v = full("DEL");
        v.push(("CNI_NETNS".into(), String::new()));
        let env = InvocationEnv::from_vars(v).expect("DEL with empty netns");
        assert_eq!(env.container.expect("container").netns, None);
    }

    #[test]
    fn non_container_verbs_need_only_the_command() {
        for cmd in ["VERSION", "STATUS", "GC"] {
            let env = InvocationEnv::from_vars(vars(&[("CNI_COMMAND", cmd)])).expect("valid");
            assert!(env.container.is_none());
            assert!(env.path.is_empty());
            // Garbage container vars are ignored, not validated.
            let env = InvocationEnv::from_vars(vars(&[
                ("CNI_COMMAND", cmd),
                ("CNI_IFNAME", "not valid name"),
                ("CNI_ARGS", "garbage"),
            ]))
            .expect("ignored");
            assert!(env.container.is_none());
        }
    }

    #[test]
    fn container_id_validation() {
        for ok in ["a", "0", "abc-1.2_3", "k8s.io-0123456789abcdef"] {
            assert!(validate_container_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "_a", ".a", "a b", "a/b", "a:b", "é"] {
            let e = validate_container_id(bad).expect_err(bad);
            assert_eq!(e.code, CniError::INVALID_ENV);
            assert!(e.msg.contains("CNI_CONTAINERID") && e.msg.contains(bad));
        }
        let mut v = full("ADD");
        v.push(("CNI_CONTAINERID".into(), "-bad".into()));
        assert!(err_of(v).msg.contains("\"-bad\""));
    }

    #[test]
    fn ifname_validation() {
        for ok in ["eth0", "a", "net1", "abcdefghijklmno", "veth-._x"] {
            assert!(validate_ifname(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "abcdefghijklmnop",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "ééééééééé",
        ] {
            let e = validate_ifname(bad).expect_err(bad);
            assert_eq!(e.code, CniError::INVALID_ENV);
            assert!(e.msg.contains("CNI_IFNAME"), "{}", e.msg);
        }
        let mut v = full("CHECK");
        v.push(("CNI_IFNAME".into(), "eth:0".into()));
        assert!(err_of(v).msg.contains("\"eth:0\""));
    }

    #[test]
    fn relative_netns_is_rejected() {
        let mut v = full("ADD");
        v.push(("CNI_NETNS".into(), "netns/x".into()));
        let e = err_of(v);
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("CNI_NETNS") && e.msg.contains("netns/x"));
    }

    #[test]
    fn cni_args_parsing() {
        assert_eq!(CniArgs::parse("").expect("empty").pairs, vec![]);
        let a = CniArgs::parse("A=1;;B=x=y;A=2;").expect("valid");
        assert_eq!(a.get("A"), Some("2"));
        assert_eq!(a.get("B"), Some("x=y"));
        assert_eq!(a.get("C"), None);
        assert_eq!(a.pairs.len(), 3);
        for bad in ["A", "A=1;B", "=1"] {
            let e = CniArgs::parse(bad).expect_err(bad);
            assert_eq!(e.code, CniError::INVALID_ENV);
            assert!(e.msg.contains("CNI_ARGS"));
        }
        let mut v = full("ADD");
        v.push(("CNI_ARGS".into(), "K8S_POD_NAME".into()));
        assert!(err_of(v).msg.contains("CNI_ARGS"));
    }

    #[test]
    fn netns_path_checks() {
        let e = validate_netns_path(Path::new("/nonexistent/netns/x")).expect_err("missing");
        assert_eq!(e.code, CniError::UNKNOWN_CONTAINER);
        assert!(e.msg.contains("CNI_NETNS") && e.msg.contains("/nonexistent/netns/x"));

        let e = validate_netns_path(Path::new("/proc/self/status")).expect_err("not nsfs");
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("not a namespace file"), "{}", e.msg);

        let e = validate_netns_path(Path::new("/proc/self/ns/mnt")).expect_err("mount ns");
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("not a network namespace"), "{}", e.msg);

        let e = validate_netns_path(Path::new("/proc/self/ns/net")).expect_err("own netns");
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("own network namespace"), "{}", e.msg);
    }

    #[test]
    fn a_fifo_as_netns_is_refused_without_hanging() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("netns");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        // A plain open() waits for a writer forever: bound the wait in the test.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(validate_netns_path(&path));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("answers within 5 s")
            .expect_err("a FIFO is not a netns");
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("not a namespace file"), "{}", e.msg);
    }

    /// Positive case: the namespace of a child that unshared a user and a network namespace
    /// (allowed without root where unprivileged user namespaces are; fails, never skips,
    /// where neither is available).
    #[test]
    fn netns_path_accepts_another_netns() {
        use nix::sched::CloneFlags;
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: between fork and exec the closure only calls unshare(2), which is
        // async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .expect("a child in new user and network namespaces (needs root or user namespaces)");
        let path = PathBuf::from(format!("/proc/{}/ns/net", child.id()));
        let checked = validate_netns_path(&path);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(checked, Ok(()), "{}", path.display());
    }
}
