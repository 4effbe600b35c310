//! A runtime process as the node sees it: its command line, and the configuration it reads
//! (found through that command line, as the runtime itself finds it).

use std::path::{Path, PathBuf};

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

/// A TOML file, or `None` when it is missing or not TOML (a runtime would then use its
/// defaults or refuse to start; either way the defaults are the best guess).
pub fn read_toml(path: &Path) -> Option<toml::Table> {
    std::fs::read_to_string(path).ok()?.parse().ok()
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

/// containerd's config file (`--config`/`-c`, else the default) and its content (empty when
/// it cannot be read).
pub fn containerd_config(args: &[String]) -> (PathBuf, toml::Table) {
    let path = PathBuf::from(flag(args, &["--config", "-c"]).unwrap_or(CONTAINERD_CONFIG));
    let table = read_toml(&path).unwrap_or_default();
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
            .filter_map(|p| read_toml(&p).map(|t| (p, t)))
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

    #[test]
    fn the_parent_of_this_process() {
        let me = std::process::id();
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id()));
        assert!(cmdline(me).is_some_and(|a| !a.is_empty()));
    }
}
