//! The daemon's wire protocol: a request line as the server decodes it, then what the server
//! parses out of it before touching the node (the claimed network's IPAM ranges, a CHECK's
//! `prevResult`, the container id and ifname); and a response line as the client decodes it.
//! Whatever decodes must encode and decode back to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use provisioner::cni::CniResult;
use provisioner::cni::env::{validate_container_id, validate_ifname};
use provisioner::daemon::api::{NetworkClaim, Request, Response};
use provisioner::ipam::IpamConfig;
use provisioner::sandbox::Network;
use serde_json::Value;

fn claim(claim: &NetworkClaim) {
    let Ok(ipam) = serde_json::from_value::<IpamConfig>(claim.ipam.clone()) else {
        return;
    };
    if let Ok(network) = Network::new(&claim.name, None, ipam) {
        assert_eq!(
            network.mismatch(&network),
            None,
            "a network differs from itself"
        );
    }
}

/// The message with its free-form JSON values blanked: serde_json's float parsing is not
/// guaranteed to round-trip bit for bit, and those values are compared where they are parsed.
fn skeleton(request: &Request) -> Request {
    let mut r = request.clone();
    match &mut r {
        Request::Add(s) | Request::Del(s) | Request::Check(s) => {
            s.prev_result = s.prev_result.as_ref().map(|_| Value::Null);
            if let Some(n) = &mut s.network {
                n.ipam = Value::Null;
            }
        }
        Request::Gc {
            network: Some(n), ..
        } => n.ipam = Value::Null,
        _ => {}
    }
    r
}

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<Request>(data) {
        let line = serde_json::to_vec(&request).expect("a request encodes");
        let back: Request = serde_json::from_slice(&line).expect("an encoded request decodes");
        assert_eq!(skeleton(&back), skeleton(&request));
        match &request {
            Request::Add(s) | Request::Del(s) | Request::Check(s) => {
                let _ = validate_container_id(&s.container_id);
                let _ = validate_ifname(&s.ifname);
                if let Some(prev) = &s.prev_result {
                    let _ = CniResult::from_json(prev);
                }
                if let Some(n) = &s.network {
                    claim(n);
                }
            }
            Request::Gc { network, .. } => {
                if let Some(n) = network {
                    claim(n);
                }
            }
            Request::Status
            | Request::List
            | Request::Sandboxes { .. }
            | Request::Why { .. }
            | Request::KernelWatch { .. } => {}
        }
    }
    if let Ok(response) = serde_json::from_slice::<Response>(data) {
        let line = serde_json::to_vec(&response).expect("a response encodes");
        let back: Result<Response, _> = serde_json::from_slice(&line);
        assert!(
            back.is_ok(),
            "an encoded response decodes: {}",
            String::from_utf8_lossy(&line)
        );
    }
});
