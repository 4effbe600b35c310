//! CNI plugin mode: the binary runs as a plugin whenever CNI_COMMAND is set, and forwards each
//! verb to the daemon over its socket.
//!
//! A runtime execs this once per ADD and DEL, so the path from `main` to the socket is kept as
//! short as a C program's: no async runtime, no logging setup, no argument parsing; read stdin
//! (one read, and one to see EOF), connect, one write, one read, print. The release build is
//! static and non-PIE (`cargo xtask build-release`): no dynamic loader, no relocations.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use provisioner::cni::{
    Attachment, CniError, CniResult, MAX_STDIN, NetConf, PluginBackend, Request, run_plugin,
};
use provisioner::daemon::api::{self, AttachmentRef, NetworkClaim, Response, SandboxRequest};
use provisioner::daemon::client::{self, ClientError};

/// How long a verb may take in the daemon before the plugin gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Room for a network config in one read (std reads at most 8 KiB a call at first, more after).
const STDIN_CAPACITY: usize = 64 * 1024;

struct DaemonBackend;

fn socket_of(conf: &NetConf) -> PathBuf {
    conf.get("socket")
        .and_then(|v| v.as_str())
        .map_or_else(|| PathBuf::from(api::DEFAULT_SOCKET), PathBuf::from)
}

fn claim_of(conf: &NetConf) -> Option<NetworkClaim> {
    conf.get("ipam").map(|ipam| NetworkClaim {
        name: conf.name.clone(),
        ipam: ipam.clone(),
    })
}

fn call(socket: &Path, request: &api::Request) -> Result<serde_json::Value, CniError> {
    match client::call(socket, request, CALL_TIMEOUT) {
        Ok(Response::Ok { result }) => Ok(result),
        Ok(Response::Error { code, msg, details }) => {
            Err(CniError::new(code, msg).with_details(details))
        }
        Err(err @ ClientError::Unreachable { .. }) => Err(CniError::try_again_later(format!(
            "{err} (is `provisioner daemon` running?)"
        ))),
        Err(err) if daemon_went_away(&err) => Err(CniError::try_again_later(format!(
            "{err} (the daemon stopped while serving this request: try again once it is back)"
        ))),
        Err(err) => Err(CniError::new(CniError::IO_FAILURE, err.to_string())),
    }
}

/// Did the daemon die (crash, kill, restart) with this request in flight? That is as
/// transient as a daemon not running yet: the runtime should retry.
fn daemon_went_away(err: &ClientError) -> bool {
    use std::io::ErrorKind;
    match err {
        // Closed with our request unread (reset), or while we were still writing it.
        ClientError::Io { source, .. } => matches!(
            source.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof
        ),
        // Closed after reading our request, before answering. The client has no variant of
        // its own for this; its reason text is the only mark.
        ClientError::Protocol { reason, .. } => reason == "connection closed without an answer",
        ClientError::Unreachable { .. } => false,
    }
}

fn sandbox_request(req: &Request) -> SandboxRequest {
    SandboxRequest {
        container_id: req.env.container_id.clone(),
        ifname: req.env.ifname.clone(),
        netns: req.env.netns.clone(),
        network: claim_of(&req.conf),
        prev_result: req.conf.prev_result.clone(),
        pod: req.env.args.pod(),
    }
}

impl PluginBackend for DaemonBackend {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let result = call(
            &socket_of(&req.conf),
            &api::Request::Add(sandbox_request(req)),
        )?;
        CniResult::from_json(&result)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        call(
            &socket_of(&req.conf),
            &api::Request::Del(sandbox_request(req)),
        )
        .map(|_| ())
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        call(
            &socket_of(&req.conf),
            &api::Request::Check(sandbox_request(req)),
        )
        .map(|_| ())
    }

    fn status(&self, conf: &NetConf) -> Result<(), CniError> {
        let status: api::Status =
            serde_json::from_value(call(&socket_of(conf), &api::Request::Status)?)
                .map_err(|e| CniError::internal(format!("undecodable status: {e}")))?;
        if status.ready {
            Ok(())
        } else {
            Err(CniError::new(
                CniError::PLUGIN_NOT_AVAILABLE,
                format!("provisioner not ready: {}", status.reasons.join("; ")),
            ))
        }
    }

    fn gc(&self, conf: &NetConf, valid: &[Attachment]) -> Result<(), CniError> {
        let request = api::Request::Gc {
            network: claim_of(conf),
            valid: valid
                .iter()
                .map(|a| AttachmentRef {
                    container_id: a.container_id.clone(),
                    ifname: a.ifname.clone(),
                })
                .collect(),
        };
        call(&socket_of(conf), &request).map(|_| ())
    }
}

pub fn main() -> ExitCode {
    let mut stdin = Vec::with_capacity(STDIN_CAPACITY);
    // An unreadable stdin is reported by run_plugin as an undecodable config, a larger one than
    // MAX_STDIN as too large (one byte more is enough to tell).
    let limit = u64::try_from(MAX_STDIN).map_or(u64::MAX, |max| max + 1);
    let _ = std::io::stdin().lock().take(limit).read_to_end(&mut stdin);
    let output = run_plugin(std::env::vars(), &stdin, &DaemonBackend);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&output.stdout);
    let _ = stdout.flush();
    ExitCode::from(u8::try_from(output.exit_code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    use super::*;

    /// A daemon that accepts one request and dies: reading it first (clean close) or not
    /// (reset). Both are "try again later", as a daemon that is not running.
    #[test]
    fn daemon_dying_mid_request_is_try_again_later() {
        for read_first in [true, false] {
            let dir = tempfile::tempdir().expect("tempdir");
            let socket = dir.path().join("d.sock");
            let listener = UnixListener::bind(&socket).expect("bind");
            let server = std::thread::spawn(move || {
                let (stream, _) = listener.accept().expect("accept");
                if read_first {
                    let mut line = String::new();
                    BufReader::new(&stream).read_line(&mut line).expect("read");
                } else {
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            let err = call(&socket, &api::Request::Status).expect_err("no answer");
            server.join().expect("server thread");
            assert_eq!(
                err.code,
                CniError::TRY_AGAIN_LATER,
                "read_first={read_first}: {}",
                err.msg
            );
            assert!(err.msg.contains("try again"), "{}", err.msg);
        }
    }

    #[test]
    fn no_daemon_is_try_again_later() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err =
            call(&dir.path().join("none.sock"), &api::Request::Status).expect_err("no daemon");
        assert_eq!(err.code, CniError::TRY_AGAIN_LATER, "{}", err.msg);
    }
}
