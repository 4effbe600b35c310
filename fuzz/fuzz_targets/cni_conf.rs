//! CNI config parsing: a conf dir's file (`.conflist` and `.conf`) as the daemon loads it, and
//! a whole plugin invocation (`CNI_*` environment + stdin) through `run_plugin` with a backend
//! that accepts everything, so every parser and check before the daemon is reached runs.
//!
//! Input: `KEY=VALUE` lines, an empty line, then stdin. Without an empty line the whole input
//! is stdin of an ADD.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use provisioner::cni::{AcceptAll, run_plugin};
use provisioner::config::network::{FileKind, parse_network};
use serde_json::Value;

fn split(data: &[u8]) -> (Vec<(String, String)>, &[u8]) {
    let Some(at) = data.windows(2).position(|w| w == b"\n\n") else {
        let env = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "fuzz"),
            ("CNI_NETNS", "/run/netns/fuzz"),
            ("CNI_IFNAME", "eth0"),
        ];
        return (
            env.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            data,
        );
    };
    let env = String::from_utf8_lossy(&data[..at])
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    (env, &data[at + 2..])
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_network(Path::new("10-fuzz.conflist"), FileKind::ConfList, data);
    let _ = parse_network(Path::new("10-fuzz.conf"), FileKind::Conf, data);

    let (env, stdin) = split(data);
    // Every CNI_NETNS is accepted, so that an ADD or CHECK reaches the backend and its answer is
    // printed.
    let out = run_plugin(env, stdin, &AcceptAll { check_netns: false });
    assert!(
        out.exit_code == 0 || out.exit_code == 1,
        "exit code {}",
        out.exit_code
    );
    if out.exit_code != 0 || !out.stdout.is_empty() {
        let printed: Value = serde_json::from_slice(&out.stdout).expect("the plugin prints JSON");
        if out.exit_code != 0 {
            assert!(printed["code"].is_u64(), "an error has a code: {printed}");
        }
    }
});
