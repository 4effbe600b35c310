//! The accept loop and one connection's life: at most `max_connections` served at once (more
//! are answered "try again later" and closed), the peer checked to be root or the daemon's
//! user, one request line read within its time, its answer written within the reply timeout.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::cni::CniError;

use super::handlers::handle;
use super::options::Limits;
use crate::daemon::api::{Request, Response};
use crate::daemon::state::DaemonState;

/// Largest request line accepted.
const MAX_REQUEST: usize = 1 << 20;
/// A client must send its request line within this time.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. EMFILE), instead of spinning on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts connections, each served as a task of its own, until SIGTERM or SIGINT; returns the
/// connections still being served.
pub(super) async fn serve_until_signal(
    listener: &UnixListener,
    state: &Arc<DaemonState>,
    limits: &Limits,
) -> Result<JoinSet<()>> {
    let mut in_flight = JoinSet::new();
    let limits = Arc::new(limits.clone());
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("install SIGTERM handler")?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match Arc::clone(&connections).try_acquire_owned() {
                    Ok(permit) => {
                        let state = Arc::clone(state);
                        let limits = Arc::clone(&limits);
                        in_flight.spawn(async move {
                            serve(&state, &limits, stream).await;
                            drop(permit);
                        });
                    }
                    Err(_) => refuse_busy(&stream, limits.max_connections),
                },
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = sigterm.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(in_flight)
}

/// Answers a connection beyond the limit "try again later" without waiting (a fresh socket's
/// buffer takes the short line) and closes it.
fn refuse_busy(stream: &UnixStream, max: usize) {
    let response: Response = CniError::try_again_later(format!(
        "provisioner daemon busy: {max} connections open already"
    ))
    .into();
    if let Err(err) = stream.try_write(&encode(&response)) {
        tracing::debug!(error = %err, "could not tell a refused connection why");
    }
    tracing::warn!(max, "connection refused: too many connections");
}

/// One connection: its request answered, or why it is not.
async fn serve(state: &Arc<DaemonState>, limits: &Limits, stream: UnixStream) {
    let allowed = stream.peer_cred().map(|cred| {
        let uid = cred.uid();
        (uid == 0 || uid == nix::unistd::geteuid().as_raw(), uid)
    });
    let (read, mut write) = stream.into_split();
    let response = match allowed {
        Ok((true, _)) => read_and_handle(state, limits, read).await,
        Ok((false, uid)) => CniError::new(
            CniError::INTERNAL,
            format!("uid {uid} may not use the provisioner daemon (root only)"),
        )
        .into(),
        Err(err) => CniError::new(CniError::IO_FAILURE, format!("peer credentials: {err}")).into(),
    };
    let bytes = encode(&response);
    match tokio::time::timeout(limits.reply_timeout, write.write_all(&bytes)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::debug!(error = %err, "client went away before the answer"),
        Err(_) => tracing::warn!(
            timeout = ?limits.reply_timeout,
            "client did not take its answer in time: connection closed"
        ),
    }
}

/// Reads the request line (at most [`MAX_REQUEST`] bytes, within [`REQUEST_READ_TIMEOUT`]) and
/// handles it.
async fn read_and_handle(
    state: &Arc<DaemonState>,
    limits: &Limits,
    read: tokio::net::unix::OwnedReadHalf,
) -> Response {
    let mut line = Vec::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST as u64));
    let read = tokio::time::timeout(REQUEST_READ_TIMEOUT, reader.read_until(b'\n', &mut line));
    match read.await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no request line within 10 s",
        ))
    }) {
        Ok(_) => match serde_json::from_slice::<Request>(&line) {
            Ok(request) => handle(state, limits, request).await,
            Err(err) => CniError::decode(format!("undecodable request: {err}")).into(),
        },
        Err(err) => CniError::new(CniError::IO_FAILURE, format!("read request: {err}")).into(),
    }
}

/// One JSON line.
fn encode(response: &Response) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(response).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    bytes
}
