//! The IPAM config in the CNI host-local shape (camelCase on the wire) and its validation into
//! [`RangeSets`]. Range fields stay strings on the wire so that every error names the exact field
//! (`ranges[1][0].rangeStart`) and value.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::error::IpamError;
use super::range::{IpRange, RangeSet, RangeSets};

/// `ipam` section of a network config, host-local compatible.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamConfig {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Single-range shorthand; prepended to `ranges` as its own range set (as host-local does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Range sets; one address is allocated from each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<Vec<RangeConfig>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
}

/// One element of a range set on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeConfig {
    pub subnet: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// A route handed to the sandbox: `dst` via `gw` (the range's gateway when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConfig {
    #[serde(with = "net_str")]
    pub dst: IpNetwork,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

impl IpamConfig {
    /// Parses the JSON `ipam` object.
    pub fn from_json(json: &str) -> Result<IpamConfig, IpamError> {
        serde_json::from_str(json).map_err(|e| {
            IpamError::config(
                "ipam",
                json.chars().take(200).collect::<String>(),
                e.to_string(),
            )
        })
    }

    /// Validates the ranges: `subnet` (if any) becomes the first range set, then each `ranges`
    /// entry one more. Defaults and rules as in host-local; see [`IpRange::new`].
    pub fn validate(&self) -> Result<RangeSets, IpamError> {
        let mut sets = Vec::new();
        if let Some(subnet) = &self.subnet {
            let range = parse_range(
                "",
                subnet,
                self.range_start.as_deref(),
                self.range_end.as_deref(),
                self.gateway.as_deref(),
            )?;
            sets.push(RangeSet::new("subnet", vec![range])?);
        } else {
            for (name, v) in [
                ("rangeStart", &self.range_start),
                ("rangeEnd", &self.range_end),
                ("gateway", &self.gateway),
            ] {
                if let Some(v) = v {
                    return Err(IpamError::config(name, v.as_str(), "given without subnet"));
                }
            }
        }
        for (i, set) in self.ranges.iter().enumerate() {
            let field = format!("ranges[{i}]");
            let ranges = set
                .iter()
                .enumerate()
                .map(|(j, r)| {
                    parse_range(
                        &format!("{field}[{j}]."),
                        &r.subnet,
                        r.range_start.as_deref(),
                        r.range_end.as_deref(),
                        r.gateway.as_deref(),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            sets.push(RangeSet::new(&field, ranges)?);
        }
        RangeSets::new(sets)
    }
}

fn parse_range(
    prefix: &str,
    subnet: &str,
    start: Option<&str>,
    end: Option<&str>,
    gateway: Option<&str>,
) -> Result<IpRange, IpamError> {
    let subnet_net: IpNetwork = subnet.parse().map_err(|e: ipnetwork::IpNetworkError| {
        IpamError::config(format!("{prefix}subnet"), subnet, e.to_string())
    })?;
    let ip = |name: &str, v: Option<&str>| -> Result<Option<IpAddr>, IpamError> {
        v.map(|s| {
            s.parse::<IpAddr>()
                .map_err(|e| IpamError::config(format!("{prefix}{name}"), s, e.to_string()))
        })
        .transpose()
    };
    let start = ip("rangeStart", start)?;
    let end = ip("rangeEnd", end)?;
    let gateway = ip("gateway", gateway)?;
    // IpRange::new appends ".rangeStart" etc. to the field it is given.
    let field = if prefix.is_empty() {
        "subnet".to_string()
    } else {
        prefix.trim_end_matches('.').to_string()
    };
    IpRange::new(&field, subnet_net, start, end, gateway)
}

/// serde for `IpNetwork` as its string form (ipnetwork's own serde feature is not enabled).
mod net_str {
    use ipnetwork::IpNetwork;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(net: &IpNetwork, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(net)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IpNetwork, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e| serde::de::Error::custom(format!("invalid CIDR {s:?}: {e}")))
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a failing unwrap is a failing test")]
mod tests {
    use super::*;
    use crate::ipam::range::Family;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn subnet_shorthand() {
        let c = IpamConfig::from_json(
            r#"{"type":"host-local","subnet":"10.244.1.0/24","routes":[{"dst":"0.0.0.0/0"}]}"#,
        )
        .unwrap();
        assert_eq!(c.kind.as_deref(), Some("host-local"));
        assert_eq!(
            c.routes,
            vec![RouteConfig {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: None
            }]
        );
        let sets = c.validate().unwrap();
        assert_eq!(sets.sets().len(), 1);
        let r = &sets.sets()[0].ranges()[0];
        assert_eq!(r.start(), ip("10.244.1.1"));
        assert_eq!(r.end(), ip("10.244.1.254"));
        assert_eq!(r.gateway(), ip("10.244.1.1"));
    }

    #[test]
    fn dual_stack_ranges() {
        let c = IpamConfig::from_json(
            r#"{"ranges":[
                 [{"subnet":"10.244.1.0/24","rangeStart":"10.244.1.10","rangeEnd":"10.244.1.20"},
                  {"subnet":"10.244.2.0/24","gateway":"10.244.2.254"}],
                 [{"subnet":"fd00:244:1::/64"}]],
               "routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0","gw":"fd00:244:1::1"}],
               "dataDir":"/tmp/x"}"#,
        )
        .unwrap();
        assert_eq!(c.data_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(c.routes[1].gw, Some(ip("fd00:244:1::1")));
        let sets = c.validate().unwrap();
        assert_eq!(sets.sets().len(), 2);
        assert_eq!(sets.sets()[0].family(), Family::V4);
        assert_eq!(sets.sets()[1].family(), Family::V6);
        let r = &sets.sets()[0].ranges()[1];
        assert_eq!(r.gateway(), ip("10.244.2.254"));
        assert!(!r.contains(ip("10.244.2.254")));
        assert_eq!(sets.position(ip("10.244.1.15")), Some((0, 0)));
        assert_eq!(sets.position(ip("10.244.1.21")), None);
        assert_eq!(sets.position(ip("fd00:244:1::7")), Some((1, 0)));
    }

    #[test]
    fn subnet_and_ranges_combine() {
        let c = IpamConfig::from_json(
            r#"{"subnet":"10.1.0.0/24","ranges":[[{"subnet":"fd00::/120"}]]}"#,
        )
        .unwrap();
        assert_eq!(c.validate().unwrap().sets().len(), 2);
    }

    #[test]
    fn round_trip_camel_case() {
        let c = IpamConfig::from_json(
            r#"{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.5","dataDir":"/d"}"#,
        )
        .unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            json.contains("\"rangeStart\":\"10.1.0.5\"") && json.contains("\"dataDir\""),
            "{json}"
        );
    }

    fn err(json: &str) -> String {
        match IpamConfig::from_json(json).and_then(|c| c.validate()) {
            Ok(s) => panic!("accepted {json}: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn errors_name_field_and_value() {
        let e = err(r#"{}"#);
        assert!(e.contains("no subnet or ranges"), "{e}");
        let e = err(r#"{"subnet":"10.1.0.0/33"}"#);
        assert!(e.contains("subnet") && e.contains("10.1.0.0/33"), "{e}");
        let e = err(r#"{"subnet":"10.1.0.0/24","rangeStart":"10.2.0.1"}"#);
        assert!(
            e.contains("subnet.rangeStart") && e.contains("10.2.0.1") && e.contains("not inside"),
            "{e}"
        );
        let e = err(r#"{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.0"}"#);
        assert!(
            e.contains("subnet.rangeStart") && e.contains("network"),
            "{e}"
        );
        let e = err(r#"{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.9","rangeEnd":"10.1.0.3"}"#);
        assert!(
            e.contains("subnet.rangeEnd") && e.contains("10.1.0.3"),
            "{e}"
        );
        let e = err(r#"{"ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"10.1.0.128/25"}]]}"#);
        assert!(
            e.contains("ranges[1][0]") && e.contains("overlaps ranges[0][0]"),
            "{e}"
        );
        let e = err(r#"{"ranges":[[{"subnet":"10.1.0.0/24"},{"subnet":"fd00::/64"}]]}"#);
        assert!(
            e.contains("ranges[0][1].subnet") && e.contains("fd00::/64"),
            "{e}"
        );
        let e = err(r#"{"ranges":[[{"subnet":"10.1.0.0/24","gateway":"bogus"}]]}"#);
        assert!(
            e.contains("ranges[0][0].gateway") && e.contains("bogus"),
            "{e}"
        );
        let e = err(r#"{"ranges":[[]]}"#);
        assert!(e.contains("ranges[0]"), "{e}");
        let e = err(r#"{"rangeStart":"10.1.0.2"}"#);
        assert!(
            e.contains("rangeStart") && e.contains("without subnet"),
            "{e}"
        );
        let e = err(r#"{"subnet":"10.1.0.0/24","routes":[{"dst":"nope"}]}"#);
        assert!(
            e.contains("invalid CIDR \\\"nope\\\"") || e.contains("nope"),
            "{e}"
        );
    }
}
