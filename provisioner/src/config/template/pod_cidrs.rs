//! The node's pod CIDRs: a `--pod-cidr` value parsed and checked, and the default routes
//! (`.Routes`) containerd derives from them.

use std::str::FromStr;

use ipnetwork::IpNetwork;

use crate::config::ConfigError;

/// IPv4 default route, as containerd renders it into `.Routes`.
pub const ZERO_CIDR_V4: &str = "0.0.0.0/0";
/// IPv6 default route, as containerd renders it into `.Routes`.
pub const ZERO_CIDR_V6: &str = "::/0";

/// Parses a `--pod-cidr` value: CIDRs separated by commas (spaces around them allowed, as
/// containerd trims them). Each must have a prefix length and no host bits set.
///
/// # Errors
/// [`ConfigError::PodCidr`] naming the first bad CIDR.
pub fn parse_pod_cidrs(value: &str) -> Result<Vec<IpNetwork>, ConfigError> {
    let cidrs = value
        .split(',')
        .map(|s| parse_pod_cidr(s.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    validate_pod_cidrs(&cidrs)?;
    Ok(cidrs)
}

fn parse_pod_cidr(s: &str) -> Result<IpNetwork, ConfigError> {
    let bad = |reason: &str| ConfigError::PodCidr {
        value: s.to_owned(),
        reason: reason.to_owned(),
    };
    if s.is_empty() {
        return Err(bad("empty"));
    }
    if !s.contains('/') {
        return Err(bad("no prefix length (expected e.g. 10.244.1.0/24)"));
    }
    let net = IpNetwork::from_str(s).map_err(|e| bad(&format!("not a CIDR: {e}")))?;
    Ok(net)
}

/// Checks pod CIDRs already parsed: at least one, none with host bits set, no duplicates.
///
/// # Errors
/// [`ConfigError::PodCidr`] naming the bad CIDR.
pub fn validate_pod_cidrs(cidrs: &[IpNetwork]) -> Result<(), ConfigError> {
    if cidrs.is_empty() {
        return Err(ConfigError::PodCidr {
            value: String::new(),
            reason: "at least one pod CIDR is needed".to_owned(),
        });
    }
    for (i, net) in cidrs.iter().enumerate() {
        if net.ip() != net.network() {
            return Err(ConfigError::PodCidr {
                value: net.to_string(),
                reason: format!(
                    "host bits set (the network is {}/{})",
                    net.network(),
                    net.prefix()
                ),
            });
        }
        if cidrs[..i].contains(net) {
            return Err(ConfigError::PodCidr {
                value: net.to_string(),
                reason: "given twice".to_owned(),
            });
        }
    }
    Ok(())
}

/// The routes containerd passes as `.Routes`: one default route per address family present.
#[must_use]
pub fn routes_for(cidrs: &[IpNetwork]) -> Vec<String> {
    let mut routes = Vec::new();
    if cidrs.iter().any(IpNetwork::is_ipv4) {
        routes.push(ZERO_CIDR_V4.to_owned());
    }
    if cidrs.iter().any(IpNetwork::is_ipv6) {
        routes.push(ZERO_CIDR_V6.to_owned());
    }
    routes
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::super::render_template;
    use super::super::tests::GCE_TEMPLATE;
    use super::parse_pod_cidrs;

    #[test]
    fn bad_pod_cidrs_are_named() {
        for (input, want) in [
            ("10.244.1.0/33", "pod CIDR \"10.244.1.0/33\": not a CIDR"),
            ("10.244.1.0/24,bogus/8", "pod CIDR \"bogus/8\": not a CIDR"),
            ("10.244.1.0", "pod CIDR \"10.244.1.0\": no prefix length"),
            ("10.244.1.0/24,", "pod CIDR \"\": empty"),
            (
                "10.244.1.5/24",
                "pod CIDR \"10.244.1.5/24\": host bits set (the network is 10.244.1.0/24)",
            ),
            (
                "10.244.1.0/24, 10.244.1.0/24",
                "pod CIDR \"10.244.1.0/24\": given twice",
            ),
        ] {
            let e = parse_pod_cidrs(input).unwrap_err().to_string();
            assert!(e.starts_with(want), "{input}: {e}");
        }
        assert!(render_template(GCE_TEMPLATE, &[]).is_err());
    }
}
