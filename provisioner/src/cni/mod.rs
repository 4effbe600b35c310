//! The CNI protocol: versions, env + stdin parsing, result and error shapes, codes.
//!
//! Pure logic: no netlink, no daemon. [`plugin::run_plugin`] is the plugin-mode driver; the
//! daemon plugs in behind [`plugin::PluginBackend`].

pub mod conf;
pub mod env;
pub mod error;
pub mod plugin;
pub mod result;
pub mod version;

pub use conf::{Attachment, NetConf};
pub use env::{CniArgs, Command, ContainerEnv, InvocationEnv, validate_netns_path};
pub use error::CniError;
pub use plugin::{AcceptAll, MAX_STDIN, PluginBackend, PluginOutput, Request, run_plugin};
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::{CniVersion, version_answer};
