//! The integration tests: one binary, a module per area. They need root: each creates its own
//! network namespaces (a "node" one holding the host side, one per sandbox) and removes them,
//! and runs `target/debug/provisioner` (built with the `fault-injection` feature) as daemon and
//! CNI plugin. Tests that load the whole machine are in the `load` binary, so that none of these
//! runs beside them.

mod cli;
mod cni_plugin;
mod config;
mod config_churn;
mod config_validation;
mod containerd_chain;
mod containerd_daemon_restart;
mod containerd_loopback_only;
mod containerd_pods;
mod containerd_template;
mod crash;
mod cri_lookup;
mod daemon;
mod daemon_log;
mod daemon_options;
mod daemon_trace;
mod daemonset;
mod dataplane;
mod deploy;
mod error_codes;
mod hostile;
mod ipam;
mod malformed_input;
mod monitoring;
mod pod_identity;
mod podman;
mod release_build;
mod setup_rollback;
mod store_disk;
mod store_recovery;
mod strangers;
mod trace_backends;
mod trace_netns;
mod trace_session;
mod trace_verdicts;
mod watch_environment;
