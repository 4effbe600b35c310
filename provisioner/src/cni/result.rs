//! The result of ADD (and the `prevResult` of CHECK / DEL), independent of spec version, and its
//! JSON in each supported version.
//!
//! Shapes: 0.3.1 and 0.4.0 put `"version": "4"|"6"` in each `ips` entry; 1.0.0 and 1.1.0 do not.
//! Interface `mtu` exists from 1.1.0 on and is only written there. Empty `interfaces`, `ips` and
//! `routes` are omitted; `dns` is always written (`{}` when empty), as libcni does.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{Map, Value, json};

use super::conf::type_name;
use super::error::CniError;
use super::version::CniVersion;

/// One interface the plugin created or moved.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    /// The netns path for sandbox interfaces; `None` for host-side interfaces.
    pub sandbox: Option<String>,
    /// Written only for 1.1.0 results.
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
}

/// DNS information; all fields optional.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
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

impl CniResult {
    /// The result in `version`'s shape, with `cniVersion` set to it.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        if !self.interfaces.is_empty() {
            let list = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut o = Map::new();
                    o.insert("name".into(), json!(i.name));
                    if let Some(mac) = &i.mac {
                        o.insert("mac".into(), json!(mac));
                    }
                    if let Some(mtu) = i.mtu
                        && version >= CniVersion::V1_1_0
                    {
                        o.insert("mtu".into(), json!(mtu));
                    }
                    if let Some(sandbox) = i.sandbox.as_ref().filter(|s| !s.is_empty()) {
                        o.insert("sandbox".into(), json!(sandbox));
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(list));
        }
        if !self.ips.is_empty() {
            let list = self
                .ips
                .iter()
                .map(|ip| {
                    let mut o = Map::new();
                    if version.ips_have_version_field() {
                        let fam = if ip.address.is_ipv4() { "4" } else { "6" };
                        o.insert("version".into(), json!(fam));
                    }
                    if let Some(idx) = ip.interface {
                        o.insert("interface".into(), json!(idx));
                    }
                    o.insert("address".into(), json!(ip.address.to_string()));
                    if let Some(gw) = ip.gateway {
                        o.insert("gateway".into(), json!(gw.to_string()));
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("ips".into(), Value::Array(list));
        }
        if !self.routes.is_empty() {
            let list = self
                .routes
                .iter()
                .map(|r| {
                    let mut o = Map::new();
                    o.insert("dst".into(), json!(r.dst.to_string()));
                    if let Some(gw) = r.gw {
                        o.insert("gw".into(), json!(gw.to_string()));
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("routes".into(), Value::Array(list));
        }
        let mut dns = Map::new();
        if !self.dns.nameservers.is_empty() {
            dns.insert("nameservers".into(), json!(self.dns.nameservers));
        }
        if let Some(d) = &self.dns.domain {
            dns.insert("domain".into(), json!(d));
        }
        if !self.dns.search.is_empty() {
            dns.insert("search".into(), json!(self.dns.search));
        }
        if !self.dns.options.is_empty() {
            dns.insert("options".into(), json!(self.dns.options));
        }
        out.insert("dns".into(), Value::Object(dns));
        Value::Object(out)
    }

    /// Parses a result (typically a `prevResult`) in any supported version's shape. Its own
    /// `cniVersion` may be absent; if present it must be supported (else code 1). Malformed ->
    /// code 7 naming the path (e.g. `prevResult.ips[0].address`). An `ips[].version` that
    /// disagrees with the address family, or an `interface` index out of range, is malformed.
    pub fn from_json(v: &Value) -> Result<Self, CniError> {
        let p = Path("prevResult".into());
        let obj = as_object(v, &p)?;
        if let Some(ver) = obj.get("cniVersion").filter(|v| !v.is_null()) {
            CniVersion::parse(as_str(ver, &p.key("cniVersion"))?)?;
        }
        let mut res = CniResult::default();
        for (i, item) in list(obj, "interfaces", &p)?.iter().enumerate() {
            let p = p.index("interfaces", i);
            let o = as_object(item, &p)?;
            res.interfaces.push(Interface {
                name: req_str(o, "name", &p)?.to_owned(),
                mac: opt_str(o, "mac", &p)?.map(str::to_owned),
                sandbox: opt_str(o, "sandbox", &p)?
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
                mtu: match o.get("mtu").filter(|v| !v.is_null()) {
                    None => None,
                    Some(m) => Some(
                        m.as_u64()
                            .and_then(|m| u32::try_from(m).ok())
                            .ok_or_else(|| bad(&p.key("mtu"), "must be a non-negative integer"))?,
                    ),
                },
            });
        }
        for (i, item) in list(obj, "ips", &p)?.iter().enumerate() {
            let p = p.index("ips", i);
            let o = as_object(item, &p)?;
            let address = parse_cidr(req_str(o, "address", &p)?, &p.key("address"))?;
            if let Some(fam) = opt_str(o, "version", &p)? {
                let want = if address.is_ipv4() { "4" } else { "6" };
                if fam != want {
                    return Err(bad(
                        &p.key("version"),
                        &format!("is \"{fam}\" but address {address} is IPv{want}"),
                    ));
                }
            }
            let gateway = opt_str(o, "gateway", &p)?
                .map(|g| parse_ip(g, &p.key("gateway")))
                .transpose()?;
            let interface = match o.get("interface").filter(|v| !v.is_null()) {
                None => None,
                Some(n) => {
                    let idx = n
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| n < res.interfaces.len())
                        .ok_or_else(|| {
                            bad(
                                &p.key("interface"),
                                &format!(
                                    "{n} is not an index into the {} interfaces",
                                    res.interfaces.len()
                                ),
                            )
                        })?;
                    Some(idx)
                }
            };
            res.ips.push(IpConfig {
                address,
                gateway,
                interface,
            });
        }
        for (i, item) in list(obj, "routes", &p)?.iter().enumerate() {
            let p = p.index("routes", i);
            let o = as_object(item, &p)?;
            res.routes.push(Route {
                dst: parse_cidr(req_str(o, "dst", &p)?, &p.key("dst"))?,
                gw: opt_str(o, "gw", &p)?
                    .map(|g| parse_ip(g, &p.key("gw")))
                    .transpose()?,
            });
        }
        if let Some(dns) = obj.get("dns").filter(|v| !v.is_null()) {
            let p = p.key("dns");
            let o = as_object(dns, &p)?;
            res.dns = Dns {
                nameservers: str_list(o, "nameservers", &p)?,
                domain: opt_str(o, "domain", &p)?.map(str::to_owned),
                search: str_list(o, "search", &p)?,
                options: str_list(o, "options", &p)?,
            };
        }
        Ok(res)
    }
}

/// A JSON path for error messages.
struct Path(String);

impl Path {
    fn key(&self, k: &str) -> Path {
        Path(format!("{}.{k}", self.0))
    }

    fn index(&self, k: &str, i: usize) -> Path {
        Path(format!("{}.{k}[{i}]", self.0))
    }
}

fn bad(p: &Path, what: &str) -> CniError {
    CniError::invalid_config(format!("invalid {}: {what}", p.0))
}

fn as_object<'a>(v: &'a Value, p: &Path) -> Result<&'a Map<String, Value>, CniError> {
    v.as_object()
        .ok_or_else(|| bad(p, &format!("must be an object, got {}", type_name(v))))
}

fn as_str<'a>(v: &'a Value, p: &Path) -> Result<&'a str, CniError> {
    v.as_str()
        .ok_or_else(|| bad(p, &format!("must be a string, got {}", type_name(v))))
}

fn req_str<'a>(o: &'a Map<String, Value>, k: &str, p: &Path) -> Result<&'a str, CniError> {
    match o.get(k) {
        None | Some(Value::Null) => Err(bad(&p.key(k), "is missing")),
        Some(v) => as_str(v, &p.key(k)),
    }
}

fn opt_str<'a>(o: &'a Map<String, Value>, k: &str, p: &Path) -> Result<Option<&'a str>, CniError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => as_str(v, &p.key(k)).map(Some),
    }
}

fn list<'a>(o: &'a Map<String, Value>, k: &str, p: &Path) -> Result<&'a [Value], CniError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(bad(
            &p.key(k),
            &format!("must be a list, got {}", type_name(v)),
        )),
    }
}

fn str_list(o: &Map<String, Value>, k: &str, p: &Path) -> Result<Vec<String>, CniError> {
    list(o, k, p)?
        .iter()
        .enumerate()
        .map(|(i, v)| as_str(v, &p.index(k, i)).map(str::to_owned))
        .collect()
}

fn parse_cidr(s: &str, p: &Path) -> Result<IpNetwork, CniError> {
    // ipnetwork accepts a bare address as a host prefix; CNI requires explicit CIDR notation.
    if !s.contains('/') {
        return Err(bad(p, &format!("\"{s}\" is not in CIDR notation")));
    }
    s.parse()
        .map_err(|e| bad(p, &format!("\"{s}\" is not a CIDR: {e}")))
}

fn parse_ip(s: &str, p: &Path) -> Result<IpAddr, CniError> {
    s.parse()
        .map_err(|e| bad(p, &format!("\"{s}\" is not an IP address: {e}")))
}

#[cfg(test)]
pub(crate) mod tests {
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
