//! The one error type of the `config` module. Every variant names the file (or directory, or
//! pod CIDR) it is about, and validation errors name the field as it is written in the file
//! (`plugins[0].mtu`), so a message can be acted on without reading code.

use std::fmt;
use std::io;
use std::path::PathBuf;

use super::conf_dir::SkippedFile;

/// Errors from parsing, validating, loading, rendering and writing network configs.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },

    /// A file is not JSON (or is half-written: a strict prefix of a JSON object never parses).
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },

    /// A file is JSON but not a CNI network config a runtime would load
    /// (no `type`, no `plugins`, an empty plugin list, ...).
    #[error("{}: not a CNI network config: {reason}", path.display())]
    NotANetwork { path: PathBuf, reason: String },

    /// Our network config has a field with a bad value.
    #[error("{}: {field}: {reason}", path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        reason: String,
    },

    /// A conf dir could not be listed.
    #[error("{}: cannot read directory: {source}", dir.display())]
    ReadDir { dir: PathBuf, source: io::Error },

    /// No network in the conf dir has a plugin of type `provisioner`; `found` says what was there.
    #[error("no network with type provisioner in {}: {}", dir.display(), FoundList(found))]
    NoNetwork {
        dir: PathBuf,
        found: Vec<SkippedFile>,
    },

    /// A pod CIDR given to `render-config` is not a valid network address with a prefix.
    #[error("pod CIDR {value:?}: {reason}")]
    PodCidr { value: String, reason: String },

    /// The template does not parse or does not execute.
    #[error("template {}: {reason}", path.as_ref().map_or_else(|| "<text>".to_owned(), |p| p.display().to_string()))]
    Template {
        path: Option<PathBuf>,
        reason: String,
    },

    /// The rendered config was rejected before anything was written to `output`.
    #[error("not writing {}: rendered config is invalid: {source}", output.display())]
    Rendered {
        output: PathBuf,
        source: Box<ConfigError>,
    },

    /// inotify could not be set up for a watched dir.
    #[error("{}: cannot watch: {source}", path.display())]
    Watch { path: PathBuf, source: io::Error },

    /// Writing a file failed (the previous content, if any, is untouched).
    #[error("{}: cannot write: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

impl ConfigError {
    /// The file this error is about, if it is about one file.
    #[must_use]
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            Self::Read { path, .. }
            | Self::Json { path, .. }
            | Self::NotANetwork { path, .. }
            | Self::Invalid { path, .. }
            | Self::Write { path, .. }
            | Self::Watch { path, .. } => Some(path),
            Self::Template { path, .. } => path.as_deref(),
            Self::Rendered { output, .. } => Some(output),
            Self::ReadDir { .. } | Self::NoNetwork { .. } | Self::PodCidr { .. } => None,
        }
    }

    pub(crate) fn invalid(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            path: path.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

struct FoundList<'a>(&'a [SkippedFile]);

impl fmt::Display for FoundList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no .conf, .conflist or .json files");
        }
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::conf_dir::SkipReason;

    #[test]
    fn no_network_lists_every_file_it_skipped() {
        let dir = PathBuf::from("/etc/cni/net.d");
        let empty = ConfigError::NoNetwork {
            dir: dir.clone(),
            found: vec![],
        };
        assert_eq!(
            empty.to_string(),
            "no network with type provisioner in /etc/cni/net.d: no .conf, .conflist or .json files"
        );
        let found = vec![
            SkippedFile {
                file: dir.join("05-lo.conflist"),
                reason: SkipReason::LoopbackOnly,
            },
            SkippedFile {
                file: dir.join("10-other.conflist"),
                reason: SkipReason::OtherTypes(vec!["bridge".to_owned()]),
            },
        ];
        let text = ConfigError::NoNetwork { dir, found }.to_string();
        let listed = text
            .split_once(": ")
            .map(|(_, list)| list)
            .unwrap_or_default();
        let parts: Vec<&str> = listed.split(", ").collect();
        assert_eq!(parts.len(), 2, "{text}");
        assert!(parts[0].starts_with("05-lo.conflist ("), "{text}");
        assert!(parts[1].starts_with("10-other.conflist ("), "{text}");
    }
}
