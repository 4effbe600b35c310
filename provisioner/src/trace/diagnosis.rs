//! Why a runtime left a sandbox without network, as far as the node can tell: which CNI conf dir
//! the runtime reads (from its own configuration, found through its command line), what that dir
//! holds now, and whether a plugin binary ran at all. The loopback-only failure (containerd on a
//! conf dir holding only a loopback network) becomes one line an operator can act on.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::runtime::bounded;
use crate::runtime::process::{
    self, CrioConfig, RuntimeProcess, Untrusted, flag, read_toml, value_at,
};

/// Where a runtime looks for its CNI networks and plugins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniSetup {
    /// Where this was found, in words (e.g. "containerd's config /etc/containerd/config.toml").
    pub source: String,
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
}

/// Defaults of the runtimes (and of libcni).
const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";

/// The CNI setup of runtime process `pid` (named `comm`); `fallback` when it cannot be told:
/// the process is gone (a short-lived helper), or is not trusted as the runtime its name says
/// ([`RuntimeProcess::trusted`]: then nothing it names is read, and the fallback says why).
pub fn runtime_cni_setup(pid: u32, comm: &str, fallback: &CniSetup) -> CniSetup {
    let runtime = match RuntimeProcess::trusted(pid, comm) {
        Ok(Some(runtime)) => runtime,
        Ok(None) | Err(Untrusted::Gone) => return fallback.clone(),
        Err(untrusted) => {
            let mut setup = fallback.clone();
            setup.source = format!(
                "{}; {comm}[{pid}] is not trusted as a runtime: {untrusted}",
                setup.source
            );
            return setup;
        }
    };
    let args = &runtime.args;
    let found = match comm {
        c if c.starts_with("containerd") => containerd(args),
        "crio" => crio(args),
        "podman" | "conmon" => podman(pid),
        _ => None,
    };
    found.unwrap_or_else(|| fallback.clone())
}

fn dirs(value: Option<&toml::Value>) -> Vec<PathBuf> {
    match value {
        Some(toml::Value::String(s)) => vec![PathBuf::from(s)],
        Some(toml::Value::Array(all)) => all
            .iter()
            .filter_map(toml::Value::as_str)
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// containerd: `--config` (default /etc/containerd/config.toml); the CRI plugin's `cni` section
/// (config version 2: `io.containerd.grpc.v1.cri`, version 3: `io.containerd.cri.v1.runtime`).
fn containerd(args: &[String]) -> Option<CniSetup> {
    let (config, table) = process::containerd_config(args);
    let unread = table
        .as_ref()
        .err()
        .and_then(|e| e.refusal())
        .map(str::to_owned);
    let table = table.unwrap_or_default();
    let cni = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"]
        .iter()
        .find_map(|plugin| {
            value_at(&table, &["plugins", plugin, "cni"]).and_then(toml::Value::as_table)
        });
    let conf_dir = cni
        .and_then(|c| c.get("conf_dir"))
        .and_then(toml::Value::as_str)
        .unwrap_or(DEFAULT_CONF_DIR);
    let mut bin_dirs = dirs(cni.and_then(|c| c.get("bin_dirs").or_else(|| c.get("bin_dir"))));
    if bin_dirs.is_empty() {
        bin_dirs.push(PathBuf::from(DEFAULT_BIN_DIR));
    }
    let mut source = format!("containerd's config {}", config.display());
    if let Some(why) = unread {
        source.push_str(&format!(", which {why}: containerd's defaults assumed"));
    }
    Some(CniSetup {
        source,
        conf_dir: PathBuf::from(conf_dir),
        bin_dirs,
    })
}

/// CRI-O: `--cni-config-dir`, `--cni-plugin-dir`, else `[crio.network]` of its config (and its
/// drop-in files).
fn crio(args: &[String]) -> Option<CniSetup> {
    let config = CrioConfig::of(args);
    let conf_dir = flag(args, &["--cni-config-dir"])
        .map(PathBuf::from)
        .or_else(|| {
            config
                .value(&["crio", "network", "network_dir"])
                .and_then(|(v, _)| v.as_str())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONF_DIR));
    let mut bin_dirs: Vec<PathBuf> = flag(args, &["--cni-plugin-dir"])
        .map(|d| vec![PathBuf::from(d)])
        .unwrap_or_else(|| {
            dirs(
                config
                    .value(&["crio", "network", "plugin_dirs"])
                    .map(|(v, _)| v),
            )
        });
    if bin_dirs.is_empty() {
        bin_dirs.push(PathBuf::from(DEFAULT_BIN_DIR));
    }
    Some(CniSetup {
        source: format!("CRI-O's config {}", config.path.display()),
        conf_dir,
        bin_dirs,
    })
}

/// podman: `CONTAINERS_CONF` from its environment, else /etc/containers/containers.conf.
fn podman(pid: u32) -> Option<CniSetup> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let config = environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"CONTAINERS_CONF="))
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()))
        .unwrap_or_else(|| PathBuf::from("/etc/containers/containers.conf"));
    let table = read_toml(&config).unwrap_or_default();
    let conf_dir = value_at(&table, &["network", "network_config_dir"])
        .and_then(toml::Value::as_str)
        .map_or_else(|| PathBuf::from(DEFAULT_CONF_DIR), PathBuf::from);
    let mut bin_dirs = dirs(value_at(&table, &["network", "cni_plugin_dirs"]));
    if bin_dirs.is_empty() {
        bin_dirs.push(PathBuf::from(DEFAULT_BIN_DIR));
    }
    Some(CniSetup {
        source: format!("podman's config {}", config.display()),
        conf_dir,
        bin_dirs,
    })
}

/// One network file of a conf dir, as libcni reads it.
struct NetworkFile {
    file: String,
    name: Option<String>,
    /// Plugin types in order (one for a `.conf`, the chain of a `.conflist`).
    types: Vec<String>,
    /// Why it could not be read, if it could not.
    error: Option<String>,
}

fn network_files(conf_dir: &Path) -> std::io::Result<Vec<NetworkFile>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(conf_dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "conf" || e == "conflist" || e == "json")
        })
        .collect();
    files.sort();
    Ok(files
        .iter()
        .map(|path| {
            let file = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let parsed = bounded::read_file(path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| e.to_string())
                });
            match parsed {
                Ok(json) => {
                    let types = match json["plugins"].as_array() {
                        Some(plugins) => plugins
                            .iter()
                            .filter_map(|p| p["type"].as_str().map(str::to_owned))
                            .collect(),
                        None => json["type"]
                            .as_str()
                            .map(str::to_owned)
                            .into_iter()
                            .collect(),
                    };
                    NetworkFile {
                        file,
                        name: json["name"].as_str().map(str::to_owned),
                        types,
                        error: None,
                    }
                }
                Err(err) => NetworkFile {
                    file,
                    name: None,
                    types: Vec::new(),
                    error: Some(err),
                },
            }
        })
        .collect())
}

/// What `setup.conf_dir` holds now, and what it means for the runtime, in one phrase.
pub fn conf_dir_content(setup: &CniSetup) -> String {
    let dir = setup.conf_dir.display();
    let files = match network_files(&setup.conf_dir) {
        Ok(files) => files,
        Err(err) => return format!("{dir} cannot be read ({err}): the runtime has no network"),
    };
    if files.is_empty() {
        return format!("{dir} holds no network file: the runtime has no network to call");
    }
    let loopback_only =
        |f: &NetworkFile| !f.types.is_empty() && f.types.iter().all(|t| t == "loopback");
    let describe = |f: &NetworkFile| match &f.error {
        Some(err) => format!("{} (unreadable: {err})", f.file),
        None => format!("{} (type {})", f.file, f.types.join(", ")),
    };
    if files.iter().all(loopback_only) {
        let list: Vec<String> = files.iter().map(describe).collect();
        return format!(
            "{dir} holds only {}: the runtime has no network to call",
            list.join(", ")
        );
    }
    let Some(first) = files
        .iter()
        .find(|f| f.error.is_none() && !loopback_only(f))
    else {
        let list: Vec<String> = files.iter().map(describe).collect();
        return format!("{dir} holds no usable network: {}", list.join(", "));
    };
    let missing: Vec<&String> = first
        .types
        .iter()
        .filter(|t| !setup.bin_dirs.iter().any(|d| d.join(t.as_str()).exists()))
        .collect();
    let name = first.name.as_deref().unwrap_or("?");
    let mut text = format!("{dir}: network {name} from {}", describe(first));
    if missing.is_empty() {
        let _ = write!(text, ", its plugins are in the bin dir");
    } else {
        let bins: Vec<String> = setup
            .bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let _ = write!(
            text,
            ": plugin binary {} missing from {}",
            missing
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            bins.join(", ")
        );
    }
    text
}

/// The diagnosis of a skipped sandbox created by runtime process `pid` (`comm`): its CNI setup,
/// what its conf dir holds, and whether a plugin binary (one under its bin dirs, among `execs`,
/// the binaries executed since the sandbox was created) ran.
pub fn diagnose(pid: u32, comm: &str, fallback: &CniSetup, execs: &[String]) -> String {
    let setup = runtime_cni_setup(pid, comm, fallback);
    let plugin_execs: Vec<String> = execs
        .iter()
        .filter(|e| setup.bin_dirs.iter().any(|d| Path::new(e).starts_with(d)))
        .cloned()
        .collect();
    let mut names: Vec<String> = plugin_execs
        .iter()
        .filter_map(|e| Path::new(e).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.dedup();
    let ran = match names.as_slice() {
        [] => "no CNI plugin binary was executed for it".to_owned(),
        [only] if only == "loopback" => {
            "only the loopback plugin ran for it (it brings lo up, nothing else)".to_owned()
        }
        _ => format!(
            "plugin(s) {} ran for it but configured nothing",
            names.join(", ")
        ),
    };
    format!(
        "{ran}; {comm} reads CNI networks from {} (per {}); {}",
        setup.conf_dir.display(),
        setup.source,
        conf_dir_content(&setup)
    )
}

/// [`diagnose`] on the runtime-files reader, waited for at most `deadline` (the watch's read
/// timeout): the runtime's config and conf dir are read off the caller's thread (the kernel
/// watch's), and a read that does not finish in time gives a diagnosis that says so.
pub fn diagnose_within_deadline(
    deadline: std::time::Duration,
    pid: u32,
    comm: &str,
    fallback: &CniSetup,
    execs: &[String],
) -> String {
    let (job_comm, job_fallback, job_execs) = (comm.to_owned(), fallback.clone(), execs.to_vec());
    bounded::within_deadline(deadline, move || {
        diagnose(pid, &job_comm, &job_fallback, &job_execs)
    })
    .unwrap_or_else(|unfinished| format!("{comm}'s CNI setup could not be read ({unfinished})"))
}

impl CniSetup {
    /// The setup assumed when a runtime's own cannot be found: `conf_dir`, /opt/cni/bin.
    pub fn assumed(conf_dir: &Path) -> Self {
        Self {
            source: "provisioner's configuration (the runtime's own could not be read)".to_owned(),
            conf_dir: conf_dir.to_path_buf(),
            bin_dirs: vec![PathBuf::from(DEFAULT_BIN_DIR)],
        }
    }
}

impl Default for CniSetup {
    fn default() -> Self {
        Self::assumed(Path::new(DEFAULT_CONF_DIR))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(dir: &Path, bin: &Path) -> CniSetup {
        CniSetup {
            source: "test".into(),
            conf_dir: dir.to_path_buf(),
            bin_dirs: vec![bin.to_path_buf()],
        }
    }

    #[test]
    fn the_loopback_only_failure_in_one_line() {
        let dir = tempfile::tempdir().expect("dir");
        let bin = tempfile::tempdir().expect("bin");
        let s = setup(dir.path(), bin.path());
        assert!(
            conf_dir_content(&s).contains("holds no network file"),
            "{}",
            conf_dir_content(&s)
        );
        std::fs::write(
            dir.path().join("10-loopback.conf"),
            r#"{"cniVersion":"1.0.0","name":"cni-loopback","type":"loopback"}"#,
        )
        .expect("write");
        let text = conf_dir_content(&s);
        assert!(
            text.contains(
                "holds only 10-loopback.conf (type loopback): the runtime has no network to call"
            ),
            "{text}"
        );
        std::fs::write(
            dir.path().join("20-pods.conflist"),
            r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"provisioner"},{"type":"portmap"}]}"#,
        )
        .expect("write");
        std::fs::write(bin.path().join("provisioner"), b"").expect("write");
        let text = conf_dir_content(&s);
        assert!(
            text.contains("network pods from 20-pods.conflist (type provisioner, portmap): plugin binary portmap missing"),
            "{text}"
        );
    }

    #[test]
    fn containerds_conf_dir_comes_from_its_config_on_its_command_line() {
        let dir = tempfile::tempdir().expect("dir");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            r#"version = 2
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/x/bin"
  conf_dir = "/x/net.d"
"#,
        )
        .expect("write");
        let args: Vec<String> = ["containerd", "--config", config.to_str().expect("utf-8")]
            .map(String::from)
            .to_vec();
        let found = containerd(&args).expect("setup");
        assert_eq!(found.conf_dir, PathBuf::from("/x/net.d"));
        assert_eq!(found.bin_dirs, [PathBuf::from("/x/bin")]);
        let args: Vec<String> = [format!("--config={}", config.display())].to_vec();
        assert_eq!(
            containerd(&args).expect("setup").conf_dir,
            PathBuf::from("/x/net.d")
        );
        let defaults = containerd(&[
            "containerd".to_owned(),
            "--config".to_owned(),
            "/nonexistent".to_owned(),
        ])
        .expect("setup");
        assert_eq!(defaults.conf_dir, PathBuf::from(DEFAULT_CONF_DIR));
    }
}
