//! The `conf_template` renderer: first line the pod CIDRs (as `--pod-cidr` takes them; when they
//! do not parse, a dual-stack default), the rest the template. What renders is checked as the
//! daemon checks it before writing the conf file.
#![no_main]

use std::path::Path;

use ipnetwork::IpNetwork;
use libfuzzer_sys::fuzz_target;
use provisioner::config::template::check_rendered;
use provisioner::config::{parse_pod_cidrs, render_template};

fn default_cidrs() -> Vec<IpNetwork> {
    ["10.244.1.0/24", "fd00:10:244:1::/64"]
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, template) = text.split_once('\n').unwrap_or(("", text));
    let cidrs = parse_pod_cidrs(first).unwrap_or_else(|_| default_cidrs());
    if let Ok(rendered) = render_template(template, &cidrs) {
        let _ = check_rendered(Path::new("10-provisioner.conflist"), &rendered);
    }
});
