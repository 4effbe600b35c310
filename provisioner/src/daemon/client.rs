//! A blocking client of the daemon socket (the CNI plugin mode and the CLI use it).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::api::{Request, Response};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens (no socket, refused): the daemon is not running.
    #[error("daemon unreachable at {socket}: {source}")]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to the daemon at {socket}: {source}")]
    Io {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("daemon at {socket} answered something undecodable: {reason}")]
    Protocol { socket: PathBuf, reason: String },
}

/// Sends one request and waits up to `timeout` for the answer.
pub fn call(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, ClientError> {
    let io = |source| ClientError::Io {
        socket: socket.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|source| ClientError::Unreachable {
        socket: socket.to_path_buf(),
        source,
    })?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = serde_json::to_vec(request).map_err(|e| ClientError::Protocol {
        socket: socket.to_path_buf(),
        reason: e.to_string(),
    })?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer).map_err(io)?;
    if answer.is_empty() {
        return Err(ClientError::Protocol {
            socket: socket.to_path_buf(),
            reason: "connection closed without an answer".into(),
        });
    }
    serde_json::from_str(&answer).map_err(|e| ClientError::Protocol {
        socket: socket.to_path_buf(),
        reason: e.to_string(),
    })
}
