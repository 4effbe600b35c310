//! Where a runtime serves CRI: found from the process that created a namespace, through its
//! command line and configuration, as the runtime itself finds it.

use std::fmt;
use std::path::{Path, PathBuf};

use super::process::{self, CrioConfig, RuntimeProcess, Untrusted, flag, value_at};

/// containerd's and CRI-O's sockets when their command line and config name none.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
pub const CRIO_SOCKET: &str = "/var/run/crio/crio.sock";

/// A CRI socket and the runtime serving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriEndpoint {
    /// The runtime's name as it reports itself ("containerd", "cri-o"); `None` when not known
    /// yet (a socket given on the command line).
    pub runtime: Option<String>,
    pub socket: PathBuf,
}

impl CriEndpoint {
    /// The name used in answers: the runtime's, else "the CRI runtime".
    pub fn runtime_name(&self) -> &str {
        self.runtime.as_deref().unwrap_or("the CRI runtime")
    }
}

/// `containerd's CRI socket /run/containerd/containerd.sock`.
impl fmt::Display for CriEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.runtime {
            Some(runtime) => write!(f, "{runtime}'s CRI socket {}", self.socket.display()),
            None => write!(f, "CRI socket {}", self.socket.display()),
        }
    }
}

fn containerd_at(socket: impl Into<PathBuf>) -> CriEndpoint {
    CriEndpoint {
        runtime: Some("containerd".to_owned()),
        socket: socket_path(&socket.into()),
    }
}

fn crio_at(socket: impl Into<PathBuf>) -> CriEndpoint {
    CriEndpoint {
        runtime: Some("cri-o".to_owned()),
        socket: socket_path(&socket.into()),
    }
}

/// The CRI endpoint of the runtime that process `pid` (named `comm`) belongs to; `Ok(None)`
/// when it is not a CRI runtime's. A runtime's command line and config are read only when the
/// process is trusted as the runtime its name says ([`RuntimeProcess::trusted`]), else the
/// answer is why not; a runtime process that is gone is assumed to use its runtime's default
/// socket.
pub fn endpoint_of(pid: u32, comm: &str) -> Result<Option<CriEndpoint>, Untrusted> {
    // Its comm is cut to 15 bytes: "containerd-shim" for containerd-shim-runc-v2.
    let runtime = match comm {
        _ if !is_cri_runtime_comm(comm) => return Ok(None),
        // CRI-O's helpers: their own command line is not read, only that of the CRI-O that
        // started them.
        "pinns" | "conmon" => return Ok(crio_helper(pid, comm)),
        _ => RuntimeProcess::trusted(pid, comm),
    };
    let args = match runtime {
        Ok(runtime) => runtime.map(|r| r.args),
        Err(Untrusted::Gone) => None,
        Err(untrusted) => return Err(untrusted),
    };
    Ok(Some(match comm {
        c if c.starts_with("containerd-shim") => {
            args.map_or_else(|| containerd_at(CONTAINERD_SOCKET), |a| containerd_shim(&a))
        }
        c if c.starts_with("containerd") => {
            args.map_or_else(|| containerd_at(CONTAINERD_SOCKET), |a| containerd(&a))
        }
        _ => args.map_or_else(|| crio_at(CRIO_SOCKET), |a| crio(&a)),
    }))
}

/// The endpoint of a CRI-O helper (`pinns`, `conmon`): its parent CRI-O's, when that parent is
/// trusted; else CRI-O's default for pinns (CRI-O's alone), none for conmon (podman's too).
fn crio_helper(pid: u32, comm: &str) -> Option<CriEndpoint> {
    let parent = process::parent(pid)
        .filter(|p| process::comm(*p).is_some_and(|c| c == "crio"))
        .and_then(|p| RuntimeProcess::trusted(p, "crio").ok().flatten());
    match (parent, comm) {
        (Some(crio_process), _) => Some(crio(&crio_process.args)),
        (None, "pinns") => Some(crio_at(CRIO_SOCKET)),
        (None, _) => None,
    }
}

/// Whether a process named `comm` may be a CRI runtime's, whose command line [`endpoint_of`]
/// then reads: containerd (and its shims), CRI-O and its helpers.
pub fn is_cri_runtime_comm(comm: &str) -> bool {
    comm.starts_with("containerd") || matches!(comm, "crio" | "pinns" | "conmon")
}

/// The CRI runtime a process named `comm` belongs to, when only its name can tell.
pub fn runtime_of_comm(comm: &str) -> Option<&'static str> {
    match comm {
        c if c.starts_with("containerd") => Some("containerd"),
        "crio" | "pinns" => Some("cri-o"),
        _ => None,
    }
}

/// The default sockets of the CRI runtimes that exist on this node (containerd's first).
pub fn default_endpoints() -> Vec<CriEndpoint> {
    [containerd_at(CONTAINERD_SOCKET), crio_at(CRIO_SOCKET)]
        .into_iter()
        .filter(|e| e.socket.exists())
        .collect()
}

/// containerd: `--address`/`-a`, else `[grpc] address` of its config, else the default.
fn containerd(args: &[String]) -> CriEndpoint {
    if let Some(address) = flag(args, &["--address", "-a", "-address"]) {
        return containerd_at(address);
    }
    let (_, table) = process::containerd_config(args);
    let table = table.unwrap_or_default();
    let address = value_at(&table, &["grpc", "address"])
        .and_then(toml::Value::as_str)
        .filter(|a| !a.is_empty())
        .unwrap_or(CONTAINERD_SOCKET);
    containerd_at(address)
}

/// A containerd shim is started with its containerd's address (`-address`).
fn containerd_shim(args: &[String]) -> CriEndpoint {
    containerd_at(flag(args, &["-address", "--address"]).unwrap_or(CONTAINERD_SOCKET))
}

/// CRI-O: `--listen`, else `[crio.api] listen` of its config and drop-ins, else the default.
fn crio(args: &[String]) -> CriEndpoint {
    if let Some(listen) = flag(args, &["--listen"]) {
        return crio_at(listen);
    }
    let config = CrioConfig::of(args);
    let listen = config
        .value(&["crio", "api", "listen"])
        .and_then(|(v, _)| v.as_str())
        .filter(|l| !l.is_empty())
        .unwrap_or(CRIO_SOCKET);
    crio_at(listen)
}

/// A socket path as given, without a `unix://` scheme (containerd and CRI-O accept both).
pub fn socket_path(given: &Path) -> PathBuf {
    given
        .to_str()
        .and_then(|s| s.strip_prefix("unix://"))
        .map_or_else(|| given.to_path_buf(), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(all: &[&str]) -> Vec<String> {
        all.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn containerds_socket_from_its_flag_its_config_or_the_default() {
        let dir = tempfile::tempdir().expect("dir");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "version = 2\n[grpc]\n  address = \"/x/containerd.sock\"\n",
        )
        .expect("write");
        let config = config.to_str().expect("utf-8");
        assert_eq!(
            containerd(&args(&["containerd", "--config", config])).socket,
            PathBuf::from("/x/containerd.sock")
        );
        let flagged = containerd(&args(&["containerd", "-c", config, "-a", "/y.sock"]));
        assert_eq!(flagged.socket, PathBuf::from("/y.sock"));
        assert_eq!(
            flagged.to_string(),
            "containerd's CRI socket /y.sock",
            "how answers name it"
        );
        assert_eq!(
            containerd(&args(&["containerd", "--address=/z.sock"])).socket,
            PathBuf::from("/z.sock")
        );
        assert_eq!(
            containerd(&args(&["containerd", "--config", "/nonexistent.toml"])).socket,
            PathBuf::from(CONTAINERD_SOCKET)
        );
        let shim = containerd_shim(&args(&[
            "/usr/bin/containerd-shim-runc-v2",
            "-namespace",
            "k8s.io",
            "-id",
            "4bf9",
            "-address",
            "/run/k3s/containerd/containerd.sock",
        ]));
        assert_eq!(
            shim.socket,
            PathBuf::from("/run/k3s/containerd/containerd.sock")
        );
    }

    #[test]
    fn crios_socket_from_its_flag_its_config_or_the_default() {
        let dir = tempfile::tempdir().expect("dir");
        let config = dir.path().join("crio.conf");
        std::fs::write(&config, "[crio.api]\nlisten = \"/x/crio.sock\"\n").expect("write");
        let empty_drop_ins = dir.path().join("none.d");
        let base = [
            "crio",
            "--config",
            config.to_str().expect("utf-8"),
            "--config-dir",
            empty_drop_ins.to_str().expect("utf-8"),
        ];
        let found = crio(&args(&base));
        assert_eq!(found.socket, PathBuf::from("/x/crio.sock"));
        assert_eq!(found.runtime.as_deref(), Some("cri-o"));
        let mut flagged = base.to_vec();
        flagged.push("--listen=/y/crio.sock");
        assert_eq!(crio(&args(&flagged)).socket, PathBuf::from("/y/crio.sock"));
        assert_eq!(
            crio(&args(&[
                "crio",
                "-c",
                "/nonexistent",
                "-d",
                "/nonexistent.d"
            ]))
            .socket,
            PathBuf::from(CRIO_SOCKET)
        );
    }

    #[test]
    fn only_runtimes_have_a_cri_endpoint() {
        let me = std::process::id();
        assert_eq!(endpoint_of(me, "unshare"), Ok(None));
        assert_eq!(endpoint_of(me, "podman"), Ok(None));
        // A conmon whose parent is not CRI-O (this test's parent is not) is podman's.
        assert_eq!(endpoint_of(me, "conmon"), Ok(None));
        // A gone containerd: its default socket.
        assert_eq!(
            endpoint_of(u32::MAX, "containerd"),
            Ok(Some(containerd_at(CONTAINERD_SOCKET)))
        );
        assert_eq!(
            endpoint_of(u32::MAX, "pinns"),
            Ok(Some(crio_at(CRIO_SOCKET)))
        );
    }

    #[test]
    fn a_process_named_like_a_runtime_is_not_one() {
        // This test runs as root from an executable that is not containerd.
        let me = std::process::id();
        match endpoint_of(me, "containerd") {
            Err(Untrusted::Executable(why)) => {
                assert!(why.ends_with("is not containerd's"), "{why}")
            }
            Err(Untrusted::NotRoot(_)) => {}
            other => panic!("taken for containerd: {other:?}"),
        }
    }

    #[test]
    fn a_unix_scheme_is_dropped() {
        assert_eq!(
            socket_path(Path::new("unix:///run/crio/crio.sock")),
            PathBuf::from("/run/crio/crio.sock")
        );
        assert_eq!(socket_path(Path::new("/a.sock")), PathBuf::from("/a.sock"));
    }
}
