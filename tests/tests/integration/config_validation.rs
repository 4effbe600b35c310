//! A daemon whose network config cannot serve any ADD reports not ready, with the field and
//! the reason, in `provisioner status`: it never says ready and then fails every ADD after
//! allocating.

use anyhow::{Result, bail};
use provisioner_tests::Netns;
use provisioner_tests::daemon_harness::{Daemon, conflist};
use serde_json::{Value, json};

/// A valid dual-stack conflist for `socket`, changed by `edit`.
fn config(socket: &std::path::Path, edit: impl FnOnce(&mut Value)) -> Value {
    let mut config = conflist(
        "badnet",
        "1.1.0",
        socket,
        "10.78.0.0/24",
        Some("fd00:78::/64"),
    );
    edit(&mut config["plugins"][0]);
    config
}

#[test]
fn configs_on_which_every_add_fails_are_reported_not_ready_with_their_reason() -> Result<()> {
    let node = Netns::new("cvnode")?;
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str, &str); 4] = [
        (
            "IPv6 with MTU 1000",
            |p| p["mtu"] = json!(1000),
            "plugins[0].mtu",
            "below 1280",
        ),
        (
            "two IPv4 range sets",
            |p| p["ipam"]["ranges"][1] = json!([{ "subnet": "10.79.0.0/24" }]),
            "plugins[0].ipam.ranges[1]",
            "a second IPv4 range set",
        ),
        (
            "::/0 without an IPv6 range",
            |p| {
                if let Some(ranges) = p["ipam"]["ranges"].as_array_mut() {
                    ranges.truncate(1);
                }
            },
            "plugins[0].ipam.routes[1].dst",
            "no IPv6 range",
        ),
        (
            "a gateway another range hands out",
            |p| {
                p["ipam"]["ranges"][0] = json!([
                    { "subnet": "10.78.0.0/24", "rangeStart": "10.78.0.10",
                      "rangeEnd": "10.78.0.100", "gateway": "10.78.0.200" },
                    { "subnet": "10.78.0.0/24", "rangeStart": "10.78.0.150",
                      "rangeEnd": "10.78.0.250" }
                ]);
            },
            "plugins[0].ipam.ranges[0][0].gateway",
            "which would hand it out",
        ),
    ];
    for (what, edit, field, reason) in cases {
        let daemon = Daemon::start_with_conflist(&node, &[], |socket| config(socket, edit))?;
        let status = daemon.status()?;
        let reasons = status["reasons"].to_string();
        if status["ready"] != false || !reasons.contains(field) || !reasons.contains(reason) {
            bail!(
                "{what}: want not ready because of {field}: {reason}; got {status}\n{}",
                daemon.log()
            );
        }
        // The human status says it too.
        let out = daemon.cli(&["status"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(field) && text.contains(reason),
            "{what}: provisioner status says:\n{text}"
        );
    }
    // The same config without the fault is ready (the cases above fail for their reason).
    let daemon = Daemon::start_with_conflist(&node, &[], |socket| config(socket, |_| {}))?;
    daemon.wait_ready(std::time::Duration::from_secs(10))?;
    Ok(())
}
