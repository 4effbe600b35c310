//! The network configuration a runtime streams on stdin: the well-known envelope keys, typed,
//! plus the whole object for plugin-specific keys.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::CniError;
use super::version::CniVersion;

/// GC's list key (spec 1.1.0).
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The same list under the name libcni also injects (containernetworking/cni#1101).
pub const ATTACHMENTS_KEY_ALIAS: &str = "cni.dev/attachments";

/// One still-valid attachment in a GC request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The stdin network configuration of one plugin invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    pub cni_version: CniVersion,
    pub name: String,
    /// `"type"`: the plugin executable's name.
    pub plugin_type: String,
    pub prev_result: Option<Value>,
    pub runtime_config: Option<Value>,
    /// GC's `cni.dev/valid-attachments` (or its alias `cni.dev/attachments`); `None` if absent.
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The whole object, for plugin-specific keys.
    pub raw: Value,
}

impl NetConf {
    /// Parses and validates the envelope.
    ///
    /// Not JSON -> code 6; not an object, missing or mistyped `cniVersion` / `name` / `type`,
    /// mistyped `prevResult` / `runtimeConfig` / attachments -> code 7 naming the field;
    /// an unsupported `cniVersion` -> code 1 naming it.
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        let raw: Value = serde_json::from_slice(bytes)
            .map_err(|e| CniError::decode(format!("network config is not valid JSON: {e}")))?;
        let Value::Object(obj) = &raw else {
            return Err(CniError::invalid_config(
                "network config must be a JSON object",
            ));
        };
        let cni_version = CniVersion::parse(required_str(obj, "cniVersion")?)?;
        let name = required_str(obj, "name")?.to_owned();
        validate_network_name(&name)?;
        let plugin_type = required_str(obj, "type")?.to_owned();
        let prev_result = optional_object(obj, "prevResult")?;
        let runtime_config = optional_object(obj, "runtimeConfig")?;
        let valid_attachments = match optional_value(obj, VALID_ATTACHMENTS_KEY)
            .map(|v| (VALID_ATTACHMENTS_KEY, v))
            .or_else(|| {
                optional_value(obj, ATTACHMENTS_KEY_ALIAS).map(|v| (ATTACHMENTS_KEY_ALIAS, v))
            }) {
            None => None,
            Some((key, v)) => Some(Vec::<Attachment>::deserialize(v).map_err(|e| {
                CniError::invalid_config(format!(
                    "field \"{key}\" must be a list of {{\"containerID\", \"ifname\"}}: {e}"
                ))
            })?),
        };
        Ok(Self {
            cni_version,
            name,
            plugin_type,
            prev_result,
            runtime_config,
            valid_attachments,
            raw,
        })
    }

    /// A plugin-specific key of the config.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.raw.get(key)
    }
}

/// Best effort: the request's `cniVersion` if `bytes` is JSON naming a supported one. Used to
/// label errors that happen before (or while) the config is parsed.
pub fn sniff_version(bytes: &[u8]) -> Option<CniVersion> {
    #[derive(Deserialize)]
    struct OnlyVersion<'a> {
        #[serde(rename = "cniVersion", borrow)]
        cni_version: &'a str,
    }
    let v: OnlyVersion<'_> = serde_json::from_slice(bytes).ok()?;
    CniVersion::parse(v.cni_version).ok()
}

/// Network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (the spec also forbids characters disallowed
/// in file paths, which this implies). Else code 7.
fn validate_network_name(name: &str) -> Result<(), CniError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CniError::invalid_config(format!(
            "invalid network config field \"name\": \"{name}\" must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
        )))
    }
}

fn required_str<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a str, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Err(CniError::invalid_config(format!(
            "network config is missing required field \"{key}\""
        ))),
        Some(Value::String(s)) if s.is_empty() => Err(CniError::invalid_config(format!(
            "network config field \"{key}\" must not be empty"
        ))),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(CniError::invalid_config(format!(
            "network config field \"{key}\" must be a string, got {}",
            type_name(other)
        ))),
    }
}

fn optional_value<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn optional_object(obj: &Map<String, Value>, key: &str) -> Result<Option<Value>, CniError> {
    match optional_value(obj, key) {
        None => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v.clone())),
        Some(other) => Err(CniError::invalid_config(format!(
            "network config field \"{key}\" must be an object, got {}",
            type_name(other)
        ))),
    }
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: &Value) -> Result<NetConf, CniError> {
        NetConf::parse(v.to_string().as_bytes())
    }

    #[test]
    fn parses_envelope_and_keeps_plugin_keys() {
        for ver in CniVersion::ALL {
            let c = parse(&json!({
                "cniVersion": ver.as_str(), "name": "pod-network", "type": "provisioner",
                "mtu": 1460, "ipam": {"subnet": "10.244.1.0/24"},
                "runtimeConfig": {"portMappings": []},
                "prevResult": {"ips": []}
            }))
            .expect("valid config");
            assert_eq!(c.cni_version, ver);
            assert_eq!(c.name, "pod-network");
            assert_eq!(c.plugin_type, "provisioner");
            assert_eq!(c.get("mtu"), Some(&json!(1460)));
            assert_eq!(c.runtime_config, Some(json!({"portMappings": []})));
            assert_eq!(c.prev_result, Some(json!({"ips": []})));
            assert_eq!(c.valid_attachments, None);
        }
    }

    #[test]
    fn null_optionals_are_absent() {
        let c = parse(&json!({"cniVersion":"1.0.0","name":"n","type":"t",
            "prevResult": null, "runtimeConfig": null}))
        .expect("valid");
        assert_eq!(c.prev_result, None);
        assert_eq!(c.runtime_config, None);
    }

    #[test]
    fn undecodable_is_code_6() {
        for bad in [&b"{"[..], b"", b"not json", b"{\"a\":1}}"] {
            let e = NetConf::parse(bad).expect_err("not json");
            assert_eq!(e.code, CniError::DECODE_FAILURE);
        }
    }

    #[test]
    fn structurally_invalid_is_code_7_naming_the_field() {
        let cases = [
            (json!([1]), "object"),
            (json!({"name":"n","type":"t"}), "cniVersion"),
            (json!({"cniVersion":"1.0.0","type":"t"}), "name"),
            (json!({"cniVersion":"1.0.0","name":"n"}), "type"),
            (json!({"cniVersion":1,"name":"n","type":"t"}), "cniVersion"),
            (json!({"cniVersion":"1.0.0","name":7,"type":"t"}), "name"),
            (json!({"cniVersion":"1.0.0","name":"n","type":""}), "type"),
            (json!({"cniVersion":"1.0.0","name":"-n","type":"t"}), "name"),
            (
                json!({"cniVersion":"1.0.0","name":"a/b","type":"t"}),
                "name",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","prevResult":[]}),
                "prevResult",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","runtimeConfig":"x"}),
                "runtimeConfig",
            ),
            (
                json!({"cniVersion":"1.1.0","name":"n","type":"t",
                "cni.dev/valid-attachments":[{"containerID":"a"}]}),
                "cni.dev/valid-attachments",
            ),
        ];
        for (v, field) in cases {
            let e = parse(&v).expect_err("invalid");
            assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{v}");
            assert!(e.msg.contains(field), "{v}: {}", e.msg);
        }
    }

    #[test]
    fn unsupported_version_is_code_1() {
        let e = parse(&json!({"cniVersion":"0.2.0","name":"n","type":"t"})).expect_err("old");
        assert_eq!(e.code, CniError::INCOMPATIBLE_VERSION);
        assert!(e.msg.contains("0.2.0"));
    }

    #[test]
    fn valid_attachments_and_alias() {
        let list =
            json!([{"containerID":"c1","ifname":"eth0"},{"containerID":"c2","ifname":"net1"}]);
        let want = vec![
            Attachment {
                container_id: "c1".into(),
                ifname: "eth0".into(),
            },
            Attachment {
                container_id: "c2".into(),
                ifname: "net1".into(),
            },
        ];
        for key in [VALID_ATTACHMENTS_KEY, ATTACHMENTS_KEY_ALIAS] {
            let mut v = json!({"cniVersion":"1.1.0","name":"n","type":"t"});
            v[key] = list.clone();
            assert_eq!(
                parse(&v).expect("valid").valid_attachments,
                Some(want.clone())
            );
        }
        let c = parse(&json!({"cniVersion":"1.1.0","name":"n","type":"t",
            "cni.dev/valid-attachments": []}))
        .expect("valid");
        assert_eq!(c.valid_attachments, Some(vec![]));
    }

    #[test]
    fn sniffs_version() {
        assert_eq!(
            sniff_version(br#"{"cniVersion":"0.4.0","name":5}"#),
            Some(CniVersion::V0_4_0)
        );
        assert_eq!(sniff_version(br#"{"cniVersion":"9.9.9"}"#), None);
        assert_eq!(sniff_version(b"garbage"), None);
    }

    #[test]
    fn wrong_types_are_code_7_naming_field_and_type() {
        for (config, field, got) in [
            (
                json!({"cniVersion":"1.0.0","name": 7,"type":"t"}),
                "\"name\" must be a string",
                "got a number",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","prevResult": [1]}),
                "\"prevResult\" must be an object",
                "got an array",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":"t","runtimeConfig": true}),
                "\"runtimeConfig\" must be an object",
                "got a boolean",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","type":{}}),
                "\"type\" must be a string",
                "got an object",
            ),
        ] {
            let e = parse(&config).expect_err("wrong type");
            assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{}", e.msg);
            assert!(e.msg.contains(field) && e.msg.contains(got), "{}", e.msg);
        }
    }
}
