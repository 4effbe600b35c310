//! The daemon's life: [`startup`], the API socket's file ([`socket`]) and its connections
//! ([`connections`]), one handler per verb ([`handlers`]); at SIGTERM or SIGINT, the shutdown
//! that finishes what is in flight.

mod connections;
mod handlers;
mod options;
mod socket;
mod startup;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::task::{JoinHandle, JoinSet};

use super::state::DaemonState;

pub use options::{DaemonOptions, Limits, RenderAtStart, TraceOptions};

/// Longest wait for operations in flight at shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs until SIGTERM or SIGINT, then finishes the operations in flight and returns.
pub async fn run(opts: DaemonOptions) -> Result<()> {
    let startup::Started {
        state,
        watcher,
        config_rx,
    } = startup::start(&opts).await?;
    let follower = startup::spawn_config_follower(Arc::clone(&state), config_rx);
    let metrics_servers: Vec<JoinHandle<()>> = opts
        .metrics_addrs
        .iter()
        .map(|addr| startup::spawn_metrics_server(*addr, Arc::clone(&state)))
        .collect();
    let (listener, socket_file) = socket::bind(&opts.socket)?;
    let status = state.status().await;
    tracing::info!(
        socket = %opts.socket.display(),
        ready = status.ready,
        reasons = ?status.reasons,
        "daemon listening"
    );
    let mut in_flight = connections::serve_until_signal(&listener, &state, &opts.limits).await?;
    tracing::info!(
        in_flight = in_flight.len(),
        "shutting down: finishing operations in flight"
    );
    drop(listener);
    // Gone with the listener, so that a successor started meanwhile binds at once; only while
    // the path is still the socket bound here, never a successor's.
    socket_file.remove_if_ours();
    drain(&mut in_flight, &state).await;
    follower.abort();
    for server in metrics_servers {
        server.abort();
    }
    drop(watcher);
    tracing::info!("stopped");
    Ok(())
}

/// Waits up to `DRAIN_TIMEOUT` for the connections and the operations in flight, then deletes
/// the retired links still queued.
async fn drain(in_flight: &mut JoinSet<()>, state: &DaemonState) {
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while in_flight.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::error!(
            left = in_flight.len(),
            "operations still running after {DRAIN_TIMEOUT:?}: stopping anyway"
        );
        in_flight.abort_all();
    } else if !state.wait_operations(DRAIN_TIMEOUT).await {
        // Operations whose callers were answered "try again later" and that still run.
        tracing::error!("operations still running after {DRAIN_TIMEOUT:?}: stopping anyway");
    }
    let left = state.dataplane.flush_deletions().await;
    if left > 0 {
        tracing::warn!(
            left,
            "retired links not deleted yet; the next start removes them"
        );
    }
}
