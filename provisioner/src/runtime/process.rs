//! A runtime process as the node sees it: whether it is one (by its executable and its user,
//! not its name), its command line, and the configuration it reads (found through that
//! command line, as the runtime itself finds it, each file read within bounds).

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::bounded;

/// containerd's config when its command line names none.
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// CRI-O's config and drop-in dir when its command line names none.
pub const CRIO_CONFIG: &str = "/etc/crio/crio.conf";
pub const CRIO_CONFIG_DIR: &str = "/etc/crio/crio.conf.d";

/// The arguments of process `pid` (argv[0] first), or `None` when it is gone or unreadable.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// The parent of process `pid`, from `/proc/<pid>/stat`.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The comm (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The comm of process `pid`.
pub fn comm(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_owned())
}

/// Why a process named like a runtime is not taken for one: its command line, and every file
/// it names, are then left unread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Untrusted {
    /// It is gone (or its `/proc` entry cannot be read at all).
    Gone,
    /// One of its user ids (real, effective, saved, file system) is not root's.
    NotRoot(String),
    /// Its executable cannot be read (`/proc/PID/exe` needs `CAP_SYS_PTRACE` over a process
    /// that holds capabilities the daemon lacks).
    ExecutableUnreadable(String),
    /// Its executable is not the runtime's: named otherwise, or writable by others than root.
    Executable(String),
    /// It runs in a mount namespace other than the node's (a container's).
    OtherMountNamespace,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gone => f.write_str("the process is gone"),
            Self::NotRoot(uids) => write!(f, "it does not run as root (uids {uids})"),
            Self::ExecutableUnreadable(err) => write!(f, "its executable cannot be read: {err}"),
            Self::Executable(why) => write!(f, "its executable {why}"),
            Self::OtherMountNamespace => {
                f.write_str("it runs in another mount namespace than the node's")
            }
        }
    }
}

/// A runtime process whose command line, and the files it names, the daemon reads: it runs as
/// root in every user id, from an executable whose file name is the runtime's (`/proc/PID/exe`,
/// not the comm, which any process sets) and which only root can write, in the node's mount
/// namespace (that of PID 1).
#[derive(Clone, Debug)]
pub struct RuntimeProcess {
    pub pid: u32,
    /// Its arguments, argv[0] first.
    pub args: Vec<String>,
}

/// The file names a runtime's executable may have, by its comm.
fn executable_names(comm: &str) -> Option<fn(&str) -> bool> {
    Some(match comm {
        // Its comm is cut to 15 bytes: "containerd-shim" for containerd-shim-runc-v2.
        c if c.starts_with("containerd-shim") => |n: &str| n.starts_with("containerd-shim"),
        c if c.starts_with("containerd") => |n: &str| n == "containerd",
        "crio" => |n: &str| n == "crio",
        "pinns" => |n: &str| n == "pinns",
        "conmon" => |n: &str| n == "conmon",
        "podman" => |n: &str| n == "podman",
        _ => return None,
    })
}

impl RuntimeProcess {
    /// Process `pid` (named `comm`) when it is the runtime its name says; `Ok(None)` when its
    /// name is no runtime's.
    pub fn trusted(pid: u32, comm: &str) -> Result<Option<Self>, Untrusted> {
        let Some(named) = executable_names(comm) else {
            return Ok(None);
        };
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc.join("status")).map_err(|_| Untrusted::Gone)?;
        let uids = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .ok_or(Untrusted::Gone)?;
        if !uids.split_whitespace().all(|u| u == "0") {
            return Err(Untrusted::NotRoot(
                uids.split_whitespace().collect::<Vec<_>>().join(" "),
            ));
        }
        let exe = std::fs::read_link(proc.join("exe"))
            .map_err(|e| Untrusted::ExecutableUnreadable(e.to_string()))?;
        let shown = exe.to_string_lossy();
        let path = shown.strip_suffix(" (deleted)").unwrap_or(&shown);
        let name = Path::new(path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !named(&name) {
            return Err(Untrusted::Executable(format!(
                "{} is not {comm}'s",
                crate::text::escaped(path)
            )));
        }
        // The file itself, through the link (also when it was replaced since).
        let file = std::fs::metadata(proc.join("exe"))
            .map_err(|e| Untrusted::ExecutableUnreadable(e.to_string()))?;
        if file.uid() != 0 || file.mode() & 0o022 != 0 {
            return Err(Untrusted::Executable(format!(
                "{} may be written by others than root",
                crate::text::escaped(path)
            )));
        }
        let theirs = mount_namespace(&proc)
            .map_err(|e| Untrusted::ExecutableUnreadable(format!("its mount namespace: {e}")))?;
        if node_mount_namespace() != Some(theirs) {
            return Err(Untrusted::OtherMountNamespace);
        }
        // An empty command line: a zombie (or a process in the middle of an exec).
        let args = cmdline(pid)
            .filter(|a| !a.is_empty())
            .ok_or(Untrusted::Gone)?;
        Ok(Some(Self { pid, args }))
    }
}

/// The mount namespace of process `proc` (`/proc/PID`), as (device, inode).
fn mount_namespace(proc: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(proc.join("ns/mnt")).map(|m| (m.dev(), m.ino()))
}

/// The node's mount namespace: PID 1's (with `hostPID`, the node's init), or, where PID 1's
/// cannot be read (PID 1 belongs to an outer user namespace), the daemon's own, which is then
/// the node's.
fn node_mount_namespace() -> Option<(u64, u64)> {
    mount_namespace(Path::new("/proc/1"))
        .or_else(|_| mount_namespace(Path::new("/proc/self")))
        .ok()
}

/// The value of `--flag value`, `--flag=value` or, for a short flag, `-c value`, for the first
/// of `names` present.
pub fn flag<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        names.iter().find_map(|n| {
            if a == n {
                args.get(i + 1).map(String::as_str)
            } else {
                a.strip_prefix(n).and_then(|rest| rest.strip_prefix('='))
            }
        })
    })
}

/// A TOML file read within bounds ([`bounded::read_file`]), or why it was not: missing, refused
/// (not a regular file, too large) or not TOML. A runtime would then use its defaults or
/// refuse to start; either way its defaults are the best guess.
pub fn read_toml(path: &Path) -> Result<toml::Table, ConfigUnread> {
    let text = bounded::read_text(path).map_err(|e| {
        if e.is_missing() {
            ConfigUnread::Missing
        } else {
            ConfigUnread::Refused(e.to_string())
        }
    })?;
    text.parse().map_err(|e: toml::de::Error| {
        ConfigUnread::Refused(format!("is not TOML: {}", e.message()))
    })
}

/// Why a runtime's config file was not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigUnread {
    /// It does not exist: the runtime uses its defaults.
    Missing,
    /// It was refused or could not be parsed, and why.
    Refused(String),
}

impl ConfigUnread {
    /// Why, for an answer; `None` for a missing file (the usual case of a runtime with its
    /// defaults).
    pub fn refusal(&self) -> Option<&str> {
        match self {
            Self::Missing => None,
            Self::Refused(why) => Some(why),
        }
    }
}

/// The value at a dotted key path (`["plugins", "io.containerd.grpc.v1.cri", "cni"]`).
pub fn value_at<'a>(table: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let (last, head) = path.split_last()?;
    let mut at = table;
    for key in head {
        at = at.get(*key)?.as_table()?;
    }
    at.get(*last)
}

/// containerd's config file (`--config`/`-c`, else the default) and its content (empty, with
/// why, when it cannot be read).
pub fn containerd_config(args: &[String]) -> (PathBuf, Result<toml::Table, ConfigUnread>) {
    let path = PathBuf::from(flag(args, &["--config", "-c"]).unwrap_or(CONTAINERD_CONFIG));
    let table = read_toml(&path);
    (path, table)
}

/// CRI-O's configuration: its config file (`--config`/`-c`) then the files of its drop-in dir
/// (`--config-dir`/`-d`) in name order, a later file overriding an earlier one.
pub struct CrioConfig {
    pub path: PathBuf,
    files: Vec<(PathBuf, toml::Table)>,
}

impl CrioConfig {
    pub fn of(args: &[String]) -> Self {
        let path = PathBuf::from(flag(args, &["--config", "-c"]).unwrap_or(CRIO_CONFIG));
        let dir = PathBuf::from(flag(args, &["--config-dir", "-d"]).unwrap_or(CRIO_CONFIG_DIR));
        let mut drop_ins: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        drop_ins.sort();
        let files = std::iter::once(path.clone())
            .chain(drop_ins)
            .filter_map(|p| read_toml(&p).ok().map(|t| (p, t)))
            .collect();
        Self { path, files }
    }

    /// The value at `key` in the last file that sets it, and that file.
    pub fn value(&self, key: &[&str]) -> Option<(&toml::Value, &Path)> {
        self.files
            .iter()
            .rev()
            .find_map(|(p, t)| value_at(t, key).map(|v| (v, p.as_path())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(all: &[&str]) -> Vec<String> {
        all.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn flags_in_every_spelling() {
        let a = args(&["containerd", "--address", "/x.sock", "-c=/c.toml"]);
        assert_eq!(flag(&a, &["--address", "-a"]), Some("/x.sock"));
        assert_eq!(flag(&a, &["--config", "-c"]), Some("/c.toml"));
        assert_eq!(
            flag(&args(&["crio", "--listen=/l.sock"]), &["--listen"]),
            Some("/l.sock")
        );
        assert_eq!(flag(&args(&["crio", "--listen"]), &["--listen"]), None);
        assert_eq!(flag(&args(&["crio", "--listener=/l"]), &["--listen"]), None);
    }

    #[test]
    fn a_crio_drop_in_overrides_the_main_file() {
        let dir = tempfile::tempdir().expect("dir");
        let main = dir.path().join("crio.conf");
        let drop_ins = dir.path().join("crio.conf.d");
        std::fs::create_dir(&drop_ins).expect("mkdir");
        std::fs::write(
            &main,
            "[crio.api]\nlisten = \"/main.sock\"\n[crio.network]\nnetwork_dir = \"/n\"\n",
        )
        .expect("write");
        std::fs::write(
            drop_ins.join("10-a.conf"),
            "[crio.api]\nlisten = \"/a.sock\"\n",
        )
        .expect("write");
        std::fs::write(
            drop_ins.join("20-b.conf"),
            "[crio.api]\nlisten = \"/b.sock\"\n",
        )
        .expect("write");
        let config = CrioConfig::of(&args(&[
            "crio",
            "--config",
            main.to_str().expect("utf-8"),
            "-d",
            drop_ins.to_str().expect("utf-8"),
        ]));
        let (listen, from) = config.value(&["crio", "api", "listen"]).expect("listen");
        assert_eq!(listen.as_str(), Some("/b.sock"));
        assert_eq!(from, drop_ins.join("20-b.conf"));
        let (dir_value, from) = config
            .value(&["crio", "network", "network_dir"])
            .expect("dir");
        assert_eq!(dir_value.as_str(), Some("/n"));
        assert_eq!(from, main);
    }

    /// A root process from a root-owned executable named `containerd` is trusted (when this
    /// test runs as root); the same process asked about as `crio` is not.
    #[test]
    fn a_process_is_trusted_by_its_executable_and_user() {
        let dir = tempfile::tempdir().expect("dir");
        let exe = dir.path().join("containerd");
        // A shell that stays (`; :` keeps it from exec'ing its last command), with the
        // arguments a runtime's command line would hold after its script.
        std::fs::copy("/bin/sh", &exe).expect("copy sh");
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let mut child = std::process::Command::new(&exe)
            .args(["-c", "sleep 5; :", "--config", "/dev/zero"])
            .spawn()
            .expect("spawn");
        let pid = child.id();
        // Once the shell runs its script (its child, sleep, is there).
        for _ in 0..200 {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            if !children.trim().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let trusted = RuntimeProcess::trusted(pid, "containerd");
        let as_crio = RuntimeProcess::trusted(pid, "crio");
        let not_a_runtime = RuntimeProcess::trusted(pid, "unshare");
        let _ = child.kill();
        let _ = child.wait();
        if nix::unistd::geteuid().is_root() {
            let runtime = trusted.expect("trusted").expect("a runtime's name");
            assert_eq!(
                runtime.args.get(3).map(String::as_str),
                Some("--config"),
                "{:?}",
                runtime.args
            );
        } else {
            assert!(trusted.is_err(), "{trusted:?}");
        }
        assert!(
            matches!(
                as_crio,
                Err(Untrusted::Executable(_) | Untrusted::NotRoot(_))
            ),
            "{as_crio:?}"
        );
        assert!(matches!(not_a_runtime, Ok(None)), "{not_a_runtime:?}");
    }

    #[test]
    fn the_parent_of_this_process() {
        let me = std::process::id();
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id()));
        assert!(cmdline(me).is_some_and(|a| !a.is_empty()));
    }
}
