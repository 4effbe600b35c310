//! Loading our network from a CNI conf dir the way a runtime (libcni) does.
//!
//! libcni lists the files of the dir whose extension is `.conf`, `.conflist` or `.json`
//! (directories excluded), sorts them lexically (byte order), and reads them in that order;
//! `.conflist` files are plugin lists, the others single plugin configs. The first network whose
//! plugin list has `"type": "provisioner"` is ours. Every file before it is reported as
//! [`SkippedFile`] with the reason, because a runtime configured with `max_conf_num = 1`
//! (containerd's default) uses the *first* loadable network as the pod network, and a
//! loopback-only network there is exactly the motivating failure: NetworkReady=true and no
//! plugin ever called. [`LoadedNetwork::runtime_default`] names such a file.
//!
//! Files that do not parse are skipped here (as kubelet and CRI-O do; containerd instead fails
//! the whole load); the watcher decides what an unparseable file means (see `watch`).

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::ConfigError;
use super::network::{FileKind, NetworkConfig, parse_network};

/// A file looked at before our network was found, and why it is not ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFile {
    pub file: PathBuf,
    pub reason: SkipReason,
}

/// Why a config file is not our network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// It could not be read.
    Unreadable(String),
    /// It is not JSON (possibly half-written).
    InvalidJson(String),
    /// It is JSON but a runtime would not load it as a network.
    NotANetwork(String),
    /// A network of only `loopback` plugins.
    LoopbackOnly,
    /// A network with other plugin types.
    OtherTypes(Vec<String>),
}

impl SkipReason {
    /// Whether the file's content could not be judged (unreadable or not JSON): it may be a
    /// config being written right now.
    #[must_use]
    pub fn is_unsettled(&self) -> bool {
        matches!(self, Self::Unreadable(_) | Self::InvalidJson(_))
    }

    /// Whether a runtime would load this file as a network (and, with `max_conf_num = 1`,
    /// use it instead of any network after it).
    #[must_use]
    pub fn is_loadable_network(&self) -> bool {
        matches!(self, Self::LoopbackOnly | Self::OtherTypes(_))
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable(e) => write!(f, "unreadable: {e}"),
            Self::InvalidJson(e) => write!(f, "invalid JSON: {e}"),
            Self::NotANetwork(e) => write!(f, "not a network: {e}"),
            Self::LoopbackOnly => f.write_str("loopback only"),
            Self::OtherTypes(t) => write!(f, "plugin types: {}", t.join(", ")),
        }
    }
}

impl fmt::Display for SkippedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.file.file_name().map_or_else(
            || self.file.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        write!(f, "{name} ({})", self.reason)
    }
}

/// Our network as loaded from a conf dir (or a single file).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedNetwork {
    /// Our plugin's validated config.
    pub config: NetworkConfig,
    /// The file it came from.
    pub file: PathBuf,
    /// Our plugin's index in `plugins` (`None` for a single `.conf`/`.json`).
    pub plugin_index: Option<usize>,
    /// The types of all plugins of the network, in order (the chain a runtime runs).
    pub plugin_types: Vec<String>,
    /// Files lexically before ours, in order, and why each is not ours.
    pub skipped: Vec<SkippedFile>,
}

impl LoadedNetwork {
    /// The first file before ours that a runtime would load as a network: a runtime that uses
    /// only the first network (containerd's `max_conf_num = 1`) would use it and never call us.
    #[must_use]
    pub fn runtime_default(&self) -> Option<&SkippedFile> {
        self.skipped.iter().find(|s| s.reason.is_loadable_network())
    }

    /// Whether our network was chosen over files whose content could not be judged.
    #[must_use]
    pub fn first_unsettled(&self) -> Option<&SkippedFile> {
        self.skipped.iter().find(|s| s.reason.is_unsettled())
    }
}

/// The files a runtime would consider in `dir`, in the order it reads them.
///
/// # Errors
/// [`ConfigError::ReadDir`] if the dir cannot be listed.
pub fn conf_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let read_dir = |source| ConfigError::ReadDir {
        dir: dir.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_dir)? {
        let entry = entry.map_err(read_dir)?;
        let path = entry.path();
        if FileKind::of(&path).is_none() {
            continue;
        }
        // Follow symlinks (libcni stats the link, reads the target): skip what is a directory.
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        files.push(path);
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Loads our network from `dir` as a runtime would choose it.
///
/// # Errors
/// [`ConfigError::ReadDir`] if the dir cannot be listed, [`ConfigError::Invalid`] if the first
/// network with a `provisioner` plugin fails validation, [`ConfigError::NoNetwork`] (listing
/// every file and why it was skipped) if there is none.
pub fn load_conf_dir(dir: &Path) -> Result<LoadedNetwork, ConfigError> {
    let mut skipped = Vec::new();
    for file in conf_files(dir)? {
        match examine(&file)? {
            Examined::Gone => {}
            Examined::Skipped(reason) => skipped.push(SkippedFile { file, reason }),
            Examined::Ours(mut loaded) => {
                loaded.skipped = skipped;
                return Ok(*loaded);
            }
        }
    }
    Err(ConfigError::NoNetwork {
        dir: dir.to_owned(),
        found: skipped,
    })
}

/// Loads our network from one config file (for a daemon pointed at a single file).
///
/// # Errors
/// [`ConfigError::Read`] if it cannot be read (`NotFound` if it does not exist),
/// [`ConfigError::NotANetwork`] if its extension is not one a runtime loads,
/// [`ConfigError::Invalid`] if our network fails validation, [`ConfigError::NoNetwork`] if the
/// file is not our network (the skip reason says what it is).
pub fn load_conf_file(file: &Path) -> Result<LoadedNetwork, ConfigError> {
    if FileKind::of(file).is_none() {
        return Err(ConfigError::NotANetwork {
            path: file.to_owned(),
            reason: "the extension must be .conf, .conflist or .json".to_owned(),
        });
    }
    match examine(file)? {
        Examined::Ours(loaded) => Ok(*loaded),
        Examined::Gone => Err(ConfigError::Read {
            path: file.to_owned(),
            source: io::Error::from(io::ErrorKind::NotFound),
        }),
        Examined::Skipped(reason) => Err(ConfigError::NoNetwork {
            dir: file.to_owned(),
            found: vec![SkippedFile {
                file: file.to_owned(),
                reason,
            }],
        }),
    }
}

enum Examined {
    /// Removed between listing and reading: as if it had not been listed.
    Gone,
    Skipped(SkipReason),
    Ours(Box<LoadedNetwork>),
}

fn examine(file: &Path) -> Result<Examined, ConfigError> {
    let Some(kind) = FileKind::of(file) else {
        return Ok(Examined::Gone);
    };
    let bytes = match fs::read(file) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Examined::Gone),
        Err(e) => return Ok(Examined::Skipped(SkipReason::Unreadable(e.to_string()))),
    };
    match parse_network(file, kind, &bytes) {
        Ok(net) => match net.ours {
            Some((plugin_index, config)) => Ok(Examined::Ours(Box::new(LoadedNetwork {
                config,
                file: file.to_owned(),
                plugin_index,
                plugin_types: net.plugin_types,
                skipped: Vec::new(),
            }))),
            None if net.is_loopback_only() => Ok(Examined::Skipped(SkipReason::LoopbackOnly)),
            None => Ok(Examined::Skipped(SkipReason::OtherTypes(net.plugin_types))),
        },
        Err(ConfigError::Json { source, .. }) => Ok(Examined::Skipped(SkipReason::InvalidJson(
            source.to_string(),
        ))),
        Err(ConfigError::NotANetwork { reason, .. }) => {
            Ok(Examined::Skipped(SkipReason::NotANetwork(reason)))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::*;

    const OURS: &str = r#"{"cniVersion":"1.0.0","name":"pod","plugins":[
        {"type":"provisioner","mtu":1460,"ipam":{"type":"host-local","subnet":"10.244.1.0/24"}},
        {"type":"portmap","capabilities":{"portMappings":true}}]}"#;
    const LOOPBACK: &str = r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, content) in files {
            fs::write(d.path().join(name), content).unwrap();
        }
        d
    }

    #[test]
    fn picks_first_lexical_network_with_our_plugin() {
        let d = dir_with(&[
            ("20-pod.conflist", OURS),
            (
                "10-bridge.conflist",
                r#"{"name":"b","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
            ),
            ("05-broken.json", "{\"name\":"),
            ("30-pod.conflist", OURS),
            ("README.md", "not a config"),
            ("00-lo.conf", LOOPBACK),
        ]);
        fs::create_dir(d.path().join("01-dir.conf")).unwrap();
        let l = load_conf_dir(d.path()).unwrap();
        assert_eq!(l.file, d.path().join("20-pod.conflist"));
        assert_eq!(l.plugin_index, Some(0));
        assert_eq!(l.plugin_types, ["provisioner", "portmap"]);
        let skipped: Vec<String> = l.skipped.iter().map(ToString::to_string).collect();
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert_eq!(skipped[0], "00-lo.conf (loopback only)");
        assert!(
            skipped[1].starts_with("05-broken.json (invalid JSON: "),
            "{skipped:?}"
        );
        assert_eq!(
            skipped[2],
            "10-bridge.conflist (plugin types: bridge, portmap)"
        );
        assert_eq!(
            l.runtime_default().unwrap().file,
            d.path().join("00-lo.conf")
        );
        assert_eq!(
            l.first_unsettled().unwrap().file,
            d.path().join("05-broken.json")
        );
    }

    #[test]
    fn no_network_lists_what_was_found() {
        let d = dir_with(&[("99-loopback.conf", LOOPBACK)]);
        let e = load_conf_dir(d.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "no network with type provisioner in {}: 99-loopback.conf (loopback only)",
                d.path().display()
            )
        );
        let d = dir_with(&[]);
        let e = load_conf_dir(d.path()).unwrap_err().to_string();
        assert!(e.ends_with(": no .conf, .conflist or .json files"), "{e}");
    }

    #[test]
    fn invalid_ours_is_an_error_not_a_skip() {
        let d = dir_with(&[
            ("10-pod.conflist", &OURS.replace("1460", "9")),
            ("20-pod.conflist", OURS),
        ]);
        let e = load_conf_dir(d.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: plugins[0].mtu: must be between 68 and 65535, got 9",
                d.path().join("10-pod.conflist").display()
            )
        );
    }

    #[test]
    fn missing_dir_is_a_read_dir_error() {
        let d = tempfile::tempdir().unwrap();
        let e = load_conf_dir(&d.path().join("nope")).unwrap_err();
        assert!(matches!(e, ConfigError::ReadDir { .. }));
    }

    #[test]
    fn single_file() {
        let d = dir_with(&[("10-pod.conflist", OURS), ("99-loopback.conf", LOOPBACK)]);
        let l = load_conf_file(&d.path().join("10-pod.conflist")).unwrap();
        assert_eq!(l.config.name, "pod");
        let e = load_conf_file(&d.path().join("99-loopback.conf")).unwrap_err();
        assert!(
            e.to_string().ends_with("99-loopback.conf (loopback only)"),
            "{e}"
        );
        let e = load_conf_file(&d.path().join("nope.conf")).unwrap_err();
        assert!(
            matches!(e, ConfigError::Read { ref source, .. } if source.kind() == io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn runtime_default_is_a_loadable_network_not_a_broken_file() {
        // What a max_conf_num = 1 runtime would use instead of ours: never a file it could
        // not load itself.
        let d = dir_with(&[
            ("00-broken.conf", "{\"name\":"),
            (
                "01-list.conf",
                r#"{"name":"x","plugins":[{"type":"bridge"}]}"#,
            ),
            ("10-pod.conflist", OURS),
        ]);
        let l = load_conf_dir(d.path()).unwrap();
        assert_eq!(l.skipped.len(), 2, "{:?}", l.skipped);
        assert_eq!(l.runtime_default(), None);
        let d = dir_with(&[
            ("00-broken.conf", "{\"name\":"),
            ("05-lo.conf", LOOPBACK),
            ("10-pod.conflist", OURS),
        ]);
        let l = load_conf_dir(d.path()).unwrap();
        assert_eq!(
            l.runtime_default().unwrap().file,
            d.path().join("05-lo.conf")
        );
    }

    #[test]
    fn an_unreadable_file_is_skipped_with_its_error_not_ignored() {
        // A symlink loop cannot be read (ELOOP, not "gone"): the choice of ours is unsettled.
        let d = dir_with(&[("10-pod.conflist", OURS)]);
        let looped = d.path().join("05-loop.conf");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        let l = load_conf_dir(d.path()).unwrap();
        assert_eq!(l.file, d.path().join("10-pod.conflist"));
        let unsettled = l.first_unsettled().unwrap();
        assert_eq!(unsettled.file, looped);
        assert!(
            unsettled
                .to_string()
                .starts_with("05-loop.conf (unreadable: "),
            "{unsettled}"
        );
    }
}
