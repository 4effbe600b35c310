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
    Attachment, CniError, CniResult, NetConf, PluginBackend, Request, run_plugin,
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
        Err(err) => Err(CniError::new(CniError::IO_FAILURE, err.to_string())),
    }
}

fn sandbox_request(req: &Request) -> SandboxRequest {
    SandboxRequest {
        container_id: req.env.container_id.clone(),
        ifname: req.env.ifname.clone(),
        netns: req.env.netns.clone(),
        network: claim_of(&req.conf),
        prev_result: req.conf.prev_result.clone(),
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
    // An unreadable stdin is reported by run_plugin as an undecodable config.
    let _ = std::io::stdin().lock().read_to_end(&mut stdin);
    let output = run_plugin(std::env::vars(), &stdin, &DaemonBackend);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&output.stdout);
    let _ = stdout.flush();
    ExitCode::from(u8::try_from(output.exit_code).unwrap_or(1))
}
