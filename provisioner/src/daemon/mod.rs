//! API server on a unix socket, per-sandbox serialisation, readiness, reconciliation.
//!
//! One request per connection, one JSON document per line each way ([`api`]). The daemon holds
//! the network in force (from the config watcher) as an immutable snapshot: a request takes the
//! snapshot current when it starts, so a config change never affects an operation in flight.

pub mod api;
pub mod client;
mod errors;
pub mod kernel_watch;
mod reconcile;
pub mod sandbox_filter;
mod server;
mod state;
mod store_health;
mod watch_log;
pub mod why;

pub use server::{DaemonOptions, Limits, RenderAtStart, TraceOptions, run};
