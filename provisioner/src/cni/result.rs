//! The result of ADD (and the `prevResult` of CHECK / DEL), independent of spec version, and its
//! JSON in each supported version.
//!
//! Shapes: 0.3.1 and 0.4.0 put `"version": "4"|"6"` in each `ips` entry; 1.0.0 and 1.1.0 do not.
//! Interface `mtu` exists from 1.1.0 on and is only written there. Empty `interfaces`, `ips` and
//! `routes` are omitted; `dns` is always written (`{}` when empty), as libcni does. Keys this
//! model does not know are ignored when read; `null` reads as absent.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::error::CniError;
use super::version::CniVersion;
use crate::json_path;

/// One interface the plugin created or moved.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The netns path for sandbox interfaces; `None` for host-side interfaces (an empty
    /// `sandbox` reads as `None`).
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "is_none_or_empty"
    )]
    pub sandbox: Option<String>,
    /// Written only for 1.1.0 results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

/// One address assigned to an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with the prefix of its subnet, host bits kept (e.g. `10.244.1.2/24`).
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
    /// Index into [`CniResult::interfaces`].
    pub interface: Option<usize>,
}

/// One route the plugin ensures inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    #[serde(serialize_with = "as_text", deserialize_with = "cidr")]
    pub dst: IpNetwork,
    #[serde(
        default,
        deserialize_with = "ip_address",
        skip_serializing_if = "Option::is_none"
    )]
    pub gw: Option<IpAddr>,
}

/// DNS information; all fields optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Dns {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub search: Vec<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub options: Vec<String>,
}

/// The version-independent result model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// A result document as written, in any supported version's shape.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cni_version: Option<String>,
    #[serde(
        default,
        deserialize_with = "json_path::objects",
        skip_serializing_if = "Vec::is_empty"
    )]
    interfaces: Vec<Interface>,
    #[serde(
        default,
        deserialize_with = "json_path::objects",
        skip_serializing_if = "Vec::is_empty"
    )]
    ips: Vec<IpEntry>,
    #[serde(
        default,
        deserialize_with = "json_path::objects",
        skip_serializing_if = "Vec::is_empty"
    )]
    routes: Vec<Route>,
    #[serde(default, deserialize_with = "json_path::object_or_default")]
    dns: Dns,
}

/// An `ips` entry as written: [`IpConfig`], and before 1.0.0 the address family in `version`.
#[derive(Serialize, Deserialize)]
struct IpEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
    #[serde(serialize_with = "as_text", deserialize_with = "cidr")]
    address: IpNetwork,
    #[serde(
        default,
        deserialize_with = "ip_address",
        skip_serializing_if = "Option::is_none"
    )]
    gateway: Option<IpAddr>,
}

/// Where a `prevResult` error is: results are read as a request's `prevResult`.
const ROOT: &str = "prevResult";

impl IpEntry {
    fn written(ip: &IpConfig, version: CniVersion) -> Self {
        Self {
            version: version
                .ips_have_version_field()
                .then(|| family(&ip.address).to_owned()),
            interface: ip.interface,
            address: ip.address,
            gateway: ip.gateway,
        }
    }

    /// The entry at `ips[at]` of a result with `interfaces` interfaces: its `version` must
    /// name its address's family, its `interface` one of the interfaces.
    fn read(self, at: usize, interfaces: usize) -> Result<IpConfig, CniError> {
        let path = |key: &str| format!("{ROOT}.ips[{at}].{key}");
        if let Some(written) = &self.version {
            let want = family(&self.address);
            if written != want {
                return Err(bad(
                    &path("version"),
                    &format!("is \"{written}\" but address {} is IPv{want}", self.address),
                ));
            }
        }
        if let Some(index) = self.interface
            && index >= interfaces
        {
            return Err(bad(
                &path("interface"),
                &format!("{index} is not an index into the {interfaces} interfaces"),
            ));
        }
        Ok(IpConfig {
            address: self.address,
            gateway: self.gateway,
            interface: self.interface,
        })
    }
}

impl CniResult {
    /// The result in `version`'s shape, with `cniVersion` set to it.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let document = ResultDocument {
            cni_version: Some(version.as_str().to_owned()),
            interfaces: self
                .interfaces
                .iter()
                .map(|i| Interface {
                    mtu: i.mtu.filter(|_| version >= CniVersion::V1_1_0),
                    ..i.clone()
                })
                .collect(),
            ips: self
                .ips
                .iter()
                .map(|ip| IpEntry::written(ip, version))
                .collect(),
            routes: self.routes.clone(),
            dns: self.dns.clone(),
        };
        // Strings, numbers, lists and objects with string keys: nothing serde_json refuses.
        serde_json::to_value(document).expect("a CNI result is always JSON")
    }

    /// Parses a result (typically a `prevResult`) in any supported version's shape. Its own
    /// `cniVersion` may be absent; if present it must be supported (else code 1). Malformed ->
    /// code 7 naming the path (e.g. `prevResult.ips[0].address`). An `ips[].version` that
    /// disagrees with the address family, or an `interface` index out of range, is malformed.
    pub fn from_json(v: &Value) -> Result<Self, CniError> {
        let document: ResultDocument =
            json_path::from_object(v).map_err(|e| bad(&e.path_under(ROOT), &e.reason))?;
        if let Some(version) = &document.cni_version {
            CniVersion::parse(version)?;
        }
        let interfaces = document.interfaces.len();
        let ips = document
            .ips
            .into_iter()
            .enumerate()
            .map(|(at, entry)| entry.read(at, interfaces))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            interfaces: document.interfaces,
            ips,
            routes: document.routes,
            dns: document.dns,
        })
    }
}

fn bad(path: &str, what: &str) -> CniError {
    CniError::invalid_config(format!("invalid {path}: {what}"))
}

/// `"4"` or `"6"`, as 0.3.1 and 0.4.0 write an address's family.
fn family(address: &IpNetwork) -> &'static str {
    if address.is_ipv4() { "4" } else { "6" }
}

fn is_none_or_empty(s: &Option<String>) -> bool {
    s.as_deref().is_none_or(str::is_empty)
}

fn as_text<S: serde::Serializer>(value: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// A list that may be written as `null`: then empty.
fn null_as_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn empty_as_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.filter(|s| !s.is_empty()))
}

/// An address with its prefix. ipnetwork takes a bare address as a host prefix; CNI requires
/// explicit CIDR notation.
fn cidr<'de, D: Deserializer<'de>>(d: D) -> Result<IpNetwork, D::Error> {
    use serde::de::Error;
    let s = String::deserialize(d)?;
    if !s.contains('/') {
        return Err(D::Error::custom(format!("\"{s}\" is not in CIDR notation")));
    }
    s.parse()
        .map_err(|e| D::Error::custom(format!("\"{s}\" is not a CIDR: {e}")))
}

/// An optional IP address, named in the error when it is not one.
fn ip_address<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    use serde::de::Error;
    Option::<String>::deserialize(d)?
        .map(|s| {
            s.parse()
                .map_err(|e| D::Error::custom(format!("\"{s}\" is not an IP address: {e}")))
        })
        .transpose()
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// The ptp-like result from the reference notes, plus an IPv6 address.
    pub(crate) fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "vethf19fdcb7".into(),
                    mac: Some("aa:bb:cc:dd:ee:01".into()),
                    sandbox: None,
                    mtu: Some(1460),
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("aa:bb:cc:dd:ee:02".into()),
                    sandbox: Some("/var/run/netns/pb0".into()),
                    mtu: Some(1460),
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.244.1.2/24".parse().expect("cidr"),
                    gateway: Some("10.244.1.1".parse().expect("ip")),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::2/64".parse().expect("cidr"),
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().expect("cidr"),
                gw: None,
            }],
            dns: Dns::default(),
        }
    }

    #[test]
    fn shape_per_version() {
        for v in CniVersion::ALL {
            let j = sample().to_json(v);
            assert_eq!(j["cniVersion"], json!(v.as_str()));
            assert_eq!(j["ips"][0]["address"], json!("10.244.1.2/24"));
            assert_eq!(j["ips"][0]["gateway"], json!("10.244.1.1"));
            assert_eq!(j["ips"][0]["interface"], json!(1));
            assert!(j["ips"][1].get("gateway").is_none());
            assert_eq!(j["routes"], json!([{"dst":"0.0.0.0/0"}]));
            assert_eq!(j["dns"], json!({}));
            assert!(j["interfaces"][0].get("sandbox").is_none());
            assert_eq!(j["interfaces"][1]["sandbox"], json!("/var/run/netns/pb0"));
            if v < CniVersion::V1_0_0 {
                assert_eq!(j["ips"][0]["version"], json!("4"));
                assert_eq!(j["ips"][1]["version"], json!("6"));
            } else {
                assert!(j["ips"][0].get("version").is_none());
                assert!(j["ips"][1].get("version").is_none());
            }
            assert_eq!(
                j["interfaces"][1].get("mtu").is_some(),
                v == CniVersion::V1_1_0
            );
        }
    }

    #[test]
    fn matches_reference_ptp_0_4_0() {
        let mut r = sample();
        r.ips.truncate(1);
        for i in &mut r.interfaces {
            i.mtu = None;
        }
        assert_eq!(
            r.to_json(CniVersion::V0_4_0),
            json!({"cniVersion":"0.4.0",
                "interfaces":[{"name":"vethf19fdcb7","mac":"aa:bb:cc:dd:ee:01"},
                              {"name":"eth0","mac":"aa:bb:cc:dd:ee:02","sandbox":"/var/run/netns/pb0"}],
                "ips":[{"version":"4","interface":1,"address":"10.244.1.2/24","gateway":"10.244.1.1"}],
                "routes":[{"dst":"0.0.0.0/0"}],"dns":{}})
        );
    }

    #[test]
    fn empty_lists_are_omitted_dns_kept() {
        let mut r = CniResult::default();
        assert_eq!(
            r.to_json(CniVersion::V1_0_0),
            json!({"cniVersion":"1.0.0","dns":{}})
        );
        r.dns = Dns {
            nameservers: vec!["10.96.0.10".into()],
            domain: Some("cluster.local".into()),
            search: vec!["svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        let j = r.to_json(CniVersion::V1_1_0);
        assert_eq!(
            j["dns"],
            json!({"nameservers":["10.96.0.10"],"domain":"cluster.local",
                   "search":["svc.cluster.local"],"options":["ndots:5"]})
        );
        assert_eq!(CniResult::from_json(&j).expect("roundtrip"), r);
    }

    #[test]
    fn roundtrip_every_version() {
        for v in CniVersion::ALL {
            let mut want = sample();
            if v < CniVersion::V1_1_0 {
                for i in &mut want.interfaces {
                    i.mtu = None;
                }
            }
            let back = CniResult::from_json(&sample().to_json(v)).expect("parses");
            assert_eq!(back, want, "{v}");
        }
    }

    #[test]
    fn parses_spec_example_without_cni_version() {
        let j = json!({
            "ips": [{"version": "4", "address": "10.0.0.5/32", "interface": 2}],
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {"name": "veth3243", "mac": "55:44:33:22:11:11"},
                {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"}
            ],
            "dns": {"nameservers": ["10.1.0.1"]}
        });
        let r = CniResult::from_json(&j).expect("spec example");
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.ips[0].interface, Some(2));
        assert_eq!(r.dns.nameservers, vec!["10.1.0.1".to_owned()]);
    }

    #[test]
    fn unknown_keys_and_nulls_are_accepted() {
        let j = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": "", "socketPath": "/x", "mtu": null}],
            "ips": [{"address": "10.0.0.5/24", "gateway": null, "interface": 0, "note": 1}],
            "routes": null,
            "dns": null,
            "vendor.example/extra": {"any": ["thing"]}
        });
        let r = CniResult::from_json(&j).expect("a result with keys of other plugins");
        assert_eq!(r.interfaces[0].sandbox, None);
        assert_eq!(r.ips[0].interface, Some(0));
        assert!(r.routes.is_empty());
    }

    #[test]
    fn errors_say_where_and_what() {
        for (v, msg) in [
            (
                json!({"ips":[{"address":"10.0.0.5/24","gateway":"x"}]}),
                "invalid prevResult.ips[0].gateway: \"x\" is not an IP address: invalid IP address syntax",
            ),
            (
                json!({"ips":[{}]}),
                "invalid prevResult.ips[0].address: is required",
            ),
            (
                json!({"ips":[["10.0.0.5/24"]]}),
                "invalid prevResult.ips[0]: invalid type: sequence, expected an object",
            ),
            (
                json!({"interfaces":[{"name":"eth0","mtu":-1}]}),
                "invalid prevResult.interfaces[0].mtu: invalid value: integer `-1`, expected u32",
            ),
        ] {
            let e = CniResult::from_json(&v).expect_err("malformed");
            assert_eq!(e.msg, msg, "{v}");
        }
    }

    #[test]
    fn malformed_prev_results() {
        let cases = [
            (json!([]), "prevResult"),
            (
                json!({"ips":[{"address":"10.0.0.5"}]}),
                "prevResult.ips[0].address",
            ),
            (
                json!({"ips":[{"address":"nope/24"}]}),
                "prevResult.ips[0].address",
            ),
            (json!({"ips":[{}]}), "prevResult.ips[0].address"),
            (
                json!({"ips":[{"version":"6","address":"10.0.0.5/24"}]}),
                "prevResult.ips[0].version",
            ),
            (
                json!({"ips":[{"address":"10.0.0.5/24","gateway":"x"}]}),
                "prevResult.ips[0].gateway",
            ),
            (
                json!({"ips":[{"address":"10.0.0.5/24","interface":0}]}),
                "prevResult.ips[0].interface",
            ),
            (
                json!({"interfaces":[{"mac":"x"}]}),
                "prevResult.interfaces[0].name",
            ),
            (json!({"interfaces":{}}), "prevResult.interfaces"),
            (
                json!({"routes":[{"dst":"0.0.0.0/0","gw":"nope"}]}),
                "prevResult.routes[0].gw",
            ),
            (
                json!({"dns":{"nameservers":[1]}}),
                "prevResult.dns.nameservers[0]",
            ),
        ];
        for (v, path) in cases {
            let e = CniResult::from_json(&v).expect_err("malformed");
            assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{v}");
            assert!(e.msg.contains(path), "{v}: {}", e.msg);
        }
        let e = CniResult::from_json(&json!({"cniVersion":"0.2.0"})).expect_err("old");
        assert_eq!(e.code, CniError::INCOMPATIBLE_VERSION);
    }
}
