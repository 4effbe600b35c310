//! Network config model, validation, template rendering, watching with last-good semantics.
//!
//! - [`network`]: the plugin's config model ([`NetworkConfig`]) and its validation;
//! - [`feasible`]: the rules across ranges, routes and MTU without which no ADD can succeed;
//! - [`conf_dir`]: choosing our network from a conf dir as a runtime (libcni) does;
//! - [`template`]: `render-config`, containerd-compatible `conf_template` rendering;
//! - `atomic_write`: the project's one atomic-write helper ([`write_atomically`]);
//! - [`watch`]: following a conf dir (or file) through inotify, keeping the last good config.

mod atomic_write;
pub mod conf_dir;
mod error;
pub mod feasible;
pub mod network;
pub mod template;
pub mod watch;

pub use atomic_write::write_atomically;
pub use conf_dir::{LoadedNetwork, SkipReason, SkippedFile, load_conf_dir, load_conf_file};
pub use error::ConfigError;
pub use network::{NetworkConfig, PLUGIN_TYPE};
pub use template::{RenderOutcome, parse_pod_cidrs, render_config, render_template};
pub use watch::{ConfigState, ConfigWatcher, LoadAttempt};
